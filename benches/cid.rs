//! CID throughput (DESIGN §7): [`cid_of`] (hashing in place) and [`dag`] (every block kept:
//! the leaves copied once) on 1 MiB, 45.6 MB (one full layer: 174 chunks), 64 MiB and
//! 1 GiB. Throughput is over the file's bytes (criterion's MiB/s and GiB/s are binary).
//!
//! The bytes: xorshift32 with shifts 13, 17, 5 from the state 0x9E3779B9, each step's new
//! state being the next 4 bytes, little-endian — the generator of
//! `tools/js-ipfs/cid-bench.mjs`, which times the independent JavaScript importer
//! (`ipfs-unixfs-importer`, as bundled by js-ipfs 0.66.1) on the same 1 GiB for the ratio
//! and prints its CID; this bench prints ours before timing (`node cid-bench.mjs 1024`
//! must print the same).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hanzod::publish::cid::{CHUNK_SIZE, MAX_LINKS};
use hanzod::publish::{cid_of, dag};

/// `len` bytes (a multiple of 4) of xorshift32 (see the module docs).
fn xorshift_bytes(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut x: u32 = 0x9E37_79B9;
    for _ in 0..len / 4 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

fn cids(c: &mut Criterion) {
    const GIB: usize = 1 << 30;
    let data = xorshift_bytes(GIB);
    eprintln!("cid_of of the 1 GiB bench file: {}", cid_of(&data));

    let mut g = c.benchmark_group("cid");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for (len, label) in [
        (1 << 20, "1MiB"),
        (MAX_LINKS * CHUNK_SIZE, "45.6MB"),
        (64 << 20, "64MiB"),
        (GIB, "1GiB"),
    ] {
        let bytes = &data[..len];
        if len == GIB {
            // Ten 1 GiB samples of `dag` take ~12 s: let criterion take them without a warning.
            g.measurement_time(Duration::from_secs(25));
        }
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(format!("cid_of/{label}"), |b| {
            b.iter(|| cid_of(black_box(bytes)))
        });
        g.bench_function(format!("dag/{label}"), |b| b.iter(|| dag(black_box(bytes))));
    }
    g.finish();
}

criterion_group!(benches, cids);
criterion_main!(benches);
