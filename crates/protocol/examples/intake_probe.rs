//! Temporary probe (not to be kept).
use hanzod_protocol::hzdl::*;
use hanzod_protocol::model::{check_against, ModelSpec};
use sha2::{Digest, Sha256};
use std::time::Instant;

const QWEN: &str = r#"{"model_type":"qwen3","hidden_size":1024,"intermediate_size":3072,"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"vocab_size":151936,"tie_word_embeddings":true}"#;

fn lora() -> (Vec<u8>, ModelSpec) {
    let spec = ModelSpec::from_hf_config(QWEN)
        .unwrap()
        .lora_spec(
            16,
            &[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ],
        )
        .unwrap();
    let mut x = 0x9e3779b97f4a7c15u64;
    let data: Vec<(String, Vec<usize>, Vec<f32>)> = spec
        .params
        .iter()
        .map(|(n, s)| {
            let len = s.iter().product::<usize>();
            let v = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
                })
                .collect();
            (n.clone(), s.clone(), v)
        })
        .collect();
    let parts: Vec<(&str, &[usize], &[f32])> = data
        .iter()
        .map(|(n, s, v)| (n.as_str(), &s[..], &v[..]))
        .collect();
    (
        write_delta(DeltaKind::Lora, 1, DeltaDtype::F32, &parts).unwrap(),
        spec,
    )
}

fn old_finite(v: &DeltaView) -> Result<(), DeltaError> {
    for t in &v.tensors {
        let mut i = 0u64;
        let mut bad = None;
        let mut f = |v: f32| {
            if bad.is_none() && !v.is_finite() {
                bad = Some(i);
            }
            i += 1;
        };
        t.data
            .chunks_exact(4)
            .for_each(|c| f(f32::from_le_bytes(c.try_into().expect("4 bytes"))));
        if let Some(index) = bad {
            return Err(DeltaError::NonFinite {
                tensor: t.name.clone(),
                index,
            });
        }
    }
    Ok(())
}
fn old_intake(bytes: &[u8], spec: &ModelSpec) -> [u8; 32] {
    let v = DeltaView::parse(bytes).unwrap();
    hanzod_protocol::model::check_layout(&v, spec).unwrap();
    old_finite(&v).unwrap();
    payload_hash(bytes)
}

fn time<T>(label: &str, n: usize, reps: usize, mut f: impl FnMut() -> T) {
    let mut rates = vec![];
    for _ in 0..reps {
        let t = Instant::now();
        std::hint::black_box(f());
        rates.push(n as f64 / t.elapsed().as_secs_f64() / (1u64 << 30) as f64);
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "{label:40} GiB/s min {:.3} med {:.3} max {:.3}",
        rates[0],
        rates[reps / 2],
        rates[reps - 1]
    );
}

fn blocked(bytes: &[u8], view: &DeltaView, block: usize) -> ([u8; 32], bool) {
    let base = bytes.as_ptr() as usize;
    let mut spans: Vec<(usize, usize)> = view
        .tensors
        .iter()
        .map(|t| {
            let s = t.data.as_ptr() as usize - base;
            (s, s + t.data.len())
        })
        .collect();
    spans.sort();
    let mut h = Sha256::new();
    let mut at = 0;
    let mut bad = false;
    for (s, e) in spans {
        h.update(&bytes[at..s]);
        for b in bytes[s..e].chunks(block) {
            h.update(b);
            bad |= any_non_finite(DeltaDtype::F32, b);
        }
        at = e;
    }
    h.update(&bytes[at..]);
    (h.finalize().into(), bad)
}

fn sumsq(b: &[u8]) -> f64 {
    let mut acc = [0f64; 8];
    let mut it = b.chunks_exact(32);
    for c in &mut it {
        for (a, w) in acc.iter_mut().zip(c.chunks_exact(4)) {
            let v = f64::from(f32::from_le_bytes(w.try_into().unwrap()));
            *a += v * v;
        }
    }
    acc.iter().sum()
}
fn blocked_norm(bytes: &[u8], view: &DeltaView, block: usize) -> ([u8; 32], bool, f64) {
    let base = bytes.as_ptr() as usize;
    let mut spans: Vec<(usize, usize)> = view
        .tensors
        .iter()
        .map(|t| {
            let s = t.data.as_ptr() as usize - base;
            (s, s + t.data.len())
        })
        .collect();
    spans.sort();
    let mut h = Sha256::new();
    let mut at = 0;
    let mut bad = false;
    let mut ss = 0.0;
    for (s, e) in spans {
        h.update(&bytes[at..s]);
        for b in bytes[s..e].chunks(block) {
            h.update(b);
            bad |= any_non_finite(DeltaDtype::F32, b);
            ss += sumsq(b);
        }
        at = e;
    }
    h.update(&bytes[at..]);
    (h.finalize().into(), bad, ss.sqrt())
}
fn spec_for(v: &DeltaView) -> ModelSpec {
    if v.header.kind == DeltaKind::Lora {
        ModelSpec::from_hf_config(QWEN)
            .unwrap()
            .lora_spec(
                16,
                &[
                    "q_proj",
                    "k_proj",
                    "v_proj",
                    "o_proj",
                    "gate_proj",
                    "up_proj",
                    "down_proj",
                ],
            )
            .unwrap()
    } else {
        ModelSpec {
            name: "x".into(),
            params: v
                .tensors
                .iter()
                .map(|t| (t.name.clone(), t.shape.clone()))
                .collect(),
            lora: None,
        }
    }
}

fn stats(v: &mut Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "min {:.3} med {:.3} max {:.3}",
        v[0],
        v[v.len() / 2],
        v[v.len() - 1]
    )
}

/// Paired rounds: each round times sha2, intake, old intake back to back (GiB/s).
fn paired(path: &str, rounds: usize) {
    use hanzod_protocol::identity::{verifying_key, Identity};
    let bytes = std::fs::read(path).unwrap();
    let n = bytes.len() as f64;
    let v = DeltaView::parse(&bytes).unwrap();
    let spec = spec_for(&v);
    drop(v);
    let id = Identity::from_seed([5; 32]);
    let key = verifying_key(&id.node_id()).unwrap();
    let st = Statement {
        job: 1,
        epoch: 0,
        step: 500,
        claimed_loss: 2.5,
    };
    let sig = sign_statement(&id, &st, &payload_hash(&bytes));
    let g = |t: Instant| n / t.elapsed().as_secs_f64() / (1u64 << 30) as f64;
    let (mut sha, mut new, mut old, mut ratio, mut oldratio) =
        (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let t = Instant::now();
        std::hint::black_box(payload_hash(std::hint::black_box(&bytes)));
        let a = g(t);
        let t = Instant::now();
        let i = intake(std::hint::black_box(&bytes), &spec).unwrap();
        i.verify_statement(&key, &st, &sig).unwrap();
        std::hint::black_box(i.hash);
        let b = g(t);
        drop(i);
        let t = Instant::now();
        let h = old_intake(std::hint::black_box(&bytes), &spec);
        verify_statement(&key, &st, &h, &sig).unwrap();
        let c = g(t);
        sha.push(a);
        new.push(b);
        old.push(c);
        ratio.push(b / a);
        oldratio.push(c / a);
    }
    println!("{path} ({} bytes), {rounds} rounds, GiB/s", bytes.len());
    println!("  sha2 alone      {}", stats(&mut sha));
    println!("  intake (+sig)   {}", stats(&mut new));
    println!("  old multi-pass  {}", stats(&mut old));
    println!("  intake/sha2 same round {}", stats(&mut ratio));
    println!("  old/sha2 same round    {}", stats(&mut oldratio));
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("paired") {
        let path = std::env::args().nth(2).unwrap();
        let rounds = std::env::args()
            .nth(3)
            .map(|s| s.parse().unwrap())
            .unwrap_or(30);
        return paired(&path, rounds);
    }
    let which = std::env::args().nth(1).unwrap_or_default();
    let reps: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(15);
    let (bytes, spec) = lora();
    let n = bytes.len();
    println!("lora delta {} bytes, {} tensors", n, spec.params.len());
    std::fs::write("/tmp/me/lora.hzdl", &bytes).unwrap();
    let view = DeltaView::parse(&bytes).unwrap();
    if which.is_empty() || which == "parts" {
        time("sha2 digest", n, reps, || payload_hash(&bytes));
        time("parse", n, reps, || {
            DeltaView::parse(&bytes).unwrap().tensors.len()
        });
        time("old scalar finite", n, reps, || old_finite(&view));
        time("any_non_finite (all tensors)", n, reps, || {
            view.tensors
                .iter()
                .any(|t| any_non_finite(DeltaDtype::F32, t.data))
        });
        time("check_against (new)", n, reps, || {
            check_against(&view, &spec).unwrap()
        });
        time("two-pass new: hash + check_finite", n, reps, || {
            let h = payload_hash(&bytes);
            view.check_finite().unwrap();
            h
        });
        time("intake()", n, reps, || intake(&bytes, &spec).unwrap().hash);
        time(
            "old intake (parse, check_against old, hash)",
            n,
            reps,
            || old_intake(&bytes, &spec),
        );
        let small = &view.tensors[0].data[..32 << 10];
        time(
            "any_non_finite 32 KiB hot x1000",
            small.len() * 1000,
            reps,
            || {
                (0..1000)
                    .map(|_| any_non_finite(DeltaDtype::F32, std::hint::black_box(small)))
                    .filter(|b| *b)
                    .count()
            },
        );
        time("sha2 32 KiB hot x100", small.len() * 100, reps, || {
            (0..100)
                .map(|_| payload_hash(std::hint::black_box(small))[0])
                .sum::<u8>()
        });
    }
    if which == "norm" {
        for _ in 0..3 {
            time("blocked 64 KiB", n, reps, || {
                blocked(&bytes, &view, 64 << 10)
            });
            time("blocked 64 KiB + f64 sum of squares", n, reps, || {
                blocked_norm(&bytes, &view, 64 << 10)
            });
        }
        time("sum of squares alone", n, reps, || {
            view.tensors.iter().map(|t| sumsq(t.data)).sum::<f64>()
        });
    }
    if which.is_empty() || which == "block" {
        for block in [
            4 << 10,
            16 << 10,
            32 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            8 << 20,
        ] {
            time(&format!("blocked {} KiB", block >> 10), n, reps, || {
                blocked(&bytes, &view, block)
            });
        }
    }
    if which == "big" || which == "bigblock" {
        let per = (1usize << 30) / 4 / 16;
        let data: Vec<f32> = (0..per).map(|i| ((i * 31) % 1000) as f32 * 1e-4).collect();
        let names: Vec<String> = (0..16).map(|t| format!("layer.{t}.weight")).collect();
        let shape = [per];
        let parts: Vec<(&str, &[usize], &[f32])> = names
            .iter()
            .map(|n| (n.as_str(), &shape[..], &data[..]))
            .collect();
        let big = write_delta(DeltaKind::Full, 1, DeltaDtype::F32, &parts).unwrap();
        drop(data);
        let v = DeltaView::parse(&big).unwrap();
        let spec = ModelSpec {
            name: "x".into(),
            params: names.iter().map(|n| (n.clone(), vec![per])).collect(),
            lora: None,
        };
        let n = big.len();
        let reps = reps.min(5);
        if which == "big" {
            time("1GB sha2", n, reps, || payload_hash(&big));
            time("1GB any_non_finite", n, reps, || {
                v.tensors
                    .iter()
                    .any(|t| any_non_finite(DeltaDtype::F32, t.data))
            });
            time("1GB old scalar finite", n, reps, || old_finite(&v));
            time("1GB old intake", n, reps, || old_intake(&big, &spec));
            time("1GB intake()", n, reps, || {
                intake(&big, &spec).unwrap().hash
            });
        } else {
            for block in [
                4 << 10,
                16 << 10,
                32 << 10,
                64 << 10,
                128 << 10,
                256 << 10,
                1 << 20,
                4 << 20,
                64 << 20,
            ] {
                time(&format!("1GB blocked {} KiB", block >> 10), n, reps, || {
                    blocked(&big, &v, block)
                });
            }
        }
    }
}
