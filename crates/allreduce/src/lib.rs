//! # hanzod-allreduce
//!
//! The ring all-reduce (DESIGN §4b, paper §4.3): the members of a ring (an ordered list of
//! node ids; member `k` sends to member `(k + 1) mod n`) compute the epoch's weighted sum
//! `Σ w_i · δ_i` between themselves over TCP, reduce-scatter then all-gather, without the
//! orchestrator on the data path.
//!
//! * [`schedule`] (pure): chunks, pieces, who sends what at which step, the summation order
//!   and the reference sum.
//! * [`wire`]: the authenticated handshake and the signed piece and abort frames.
//! * [`links`]: a member's two TCP links and a loopback ring for tests and benches.
//! * [`round`]: one member's round ([`round::all_reduce`]), pipelined, memory-bounded,
//!   aborting with a typed error that names the suspected peer.
//! * [`audit`] (pure): after a failed round, which member sent a wrong partial sum, proved
//!   from the signed pieces the members received and their uploaded deltas.
//!
//! Every member ends with the same bytes: each chunk's sum is computed once, by its owner,
//! and copied by the all-gather. The signature domains ([`wire::HANDSHAKE_DOMAIN`],
//! [`wire::PIECE_DOMAIN`], [`wire::ABORT_DOMAIN`]) live in `hanzod_actors::domain` with
//! every other domain.
#![warn(missing_docs)]

pub mod audit;
pub mod links;
pub mod round;
pub mod schedule;
pub mod wire;

pub use links::{connect_links, loopback_ring, RingLinks};
pub use round::{all_reduce, deadline_for, RoundConfig, RoundError, RoundOutcome};
pub use schedule::{reference_sum, weight_in_place, Phase, Schedule};
