//! Transport benchmarks (DESIGN §3): what the daemon spends per session message before the
//! actor core sees it — decoding the envelope's payload and verifying its Ed25519
//! signature (strict) — and what a node spends signing one. These bound the heartbeat
//! capacity per core; `hanzod bench load` measures the whole daemon.

use criterion::{criterion_group, criterion_main, Criterion};
use hanzod::identity::{verify, verifying_key, Identity};
use hanzod_proto::v1 as pb;
use prost::Message;

fn signed_heartbeat(id: &Identity, seq: u64) -> pb::SignedNodeMessage {
    let payload = pb::NodeMessage {
        session: vec![7; 16],
        seq,
        timestamp_ms: 1_800_000_000_000,
        body: Some(pb::node_message::Body::Heartbeat(pb::Heartbeat {
            gpu_utilization: 0.93,
            memory_used: 70 << 30,
            current_step: 123_456,
        })),
    }
    .encode_to_vec();
    let signature = id.sign(hanzod_proto::domain::SESSION, &[&payload]).to_vec();
    pb::SignedNodeMessage { payload, signature }
}

fn session_message(c: &mut Criterion) {
    let id = Identity::from_seed([9; 32]);
    let key = verifying_key(&id.node_id()).expect("key");
    let env = signed_heartbeat(&id, 1);
    let wire = env.encode_to_vec();
    c.bench_function("session_message_sign", |b| {
        let mut seq = 0;
        b.iter(|| {
            seq += 1;
            signed_heartbeat(&id, seq)
        })
    });
    c.bench_function("session_message_decode_and_verify", |b| {
        b.iter(|| {
            let env = pb::SignedNodeMessage::decode(wire.as_slice()).expect("envelope");
            let msg = pb::NodeMessage::decode(env.payload.as_slice()).expect("payload");
            verify(
                &key,
                hanzod_proto::domain::SESSION,
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
