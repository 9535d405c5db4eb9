//! Transport benchmarks (DESIGN §3): what the daemon spends per session message before the
//! actor core sees it — decoding the envelope's payload and verifying its Ed25519
//! signature (strict) — and what a node spends signing one. These bound the heartbeat
//! capacity per core; `hanzod bench load` measures the whole daemon.

use criterion::{criterion_group, criterion_main, Criterion};
use hanzod::agent::protocol::SessionSigner;
use hanzod::identity::{verify, verifying_key, Identity};
use hanzod_proto::v1 as pb;
use prost::Message;

fn body() -> pb::node_message::Body {
    pb::node_message::Body::Heartbeat(pb::Heartbeat {
        gpu_utilization: 0.93,
        memory_used: 70 << 30,
        current_step: 123_456,
    })
}

fn session_message(c: &mut Criterion) {
    let id = Identity::from_seed([9; 32]);
    let key = verifying_key(&id.node_id()).expect("key");
    let mut signer = SessionSigner::new(id.clone(), vec![7; 16]);
    let wire = signer.sign(1_800_000_000_000, body()).encode_to_vec();
    c.bench_function("session_message_sign", |b| {
        b.iter(|| signer.sign(1_800_000_000_000, body()))
    });
    c.bench_function("session_message_decode_and_verify", |b| {
        b.iter(|| {
            let env = pb::SignedNodeMessage::decode(wire.as_slice()).expect("envelope");
            let msg = pb::NodeMessage::decode(env.payload.as_slice()).expect("payload");
            verify(
                &key,
                hanzod_actors::domain::SESSION,
                &[&env.payload],
                &env.signature,
            )
            .expect("signature");
            msg.seq
        })
    });
}

criterion_group!(benches, session_message);
criterion_main!(benches);
