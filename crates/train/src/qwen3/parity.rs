//! Parity with transformers' `Qwen3ForCausalLM` on the committed fixtures
//! (`tests/fixtures/qwen3`, written by `tools/lm/qwen3_reference.py parity` with the torch
//! and transformers versions in `versions.json`): the same `config.json` and
//! `model.safetensors` give the logits within 1e-4 (max abs), the loss within 1e-5
//! (relative) and each listed gradient within 1e-3 relative (max |ours − theirs| ≤
//! 1e-3 · max |theirs|, per tensor).

use std::path::PathBuf;

use safetensors::{Dtype, SafeTensors};

use super::*;

fn fixture(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/qwen3")
        .join(case)
}

fn f32s(st: &SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = st
        .tensor(name)
        .unwrap_or_else(|_| panic!("{name} in expected.safetensors"));
    assert_eq!(t.dtype(), Dtype::F32, "{name}");
    let v = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (t.shape().to_vec(), v)
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

fn check_case(case: &str) {
    let dir = fixture(case);
    let cfg =
        Qwen3Config::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let model = Qwen3::new(cfg.clone()).unwrap();
    let w = Weights::from_safetensors(
        &std::fs::read(dir.join("model.safetensors")).unwrap(),
        model.layout().clone(),
    )
    .unwrap();
    let expected = std::fs::read(dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&expected).unwrap();

    let ids = st.tensor("input_ids").unwrap();
    assert_eq!(ids.dtype(), Dtype::I64);
    let batch = ids.shape()[0];
    let tokens: Vec<u32> = ids
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    let b = Batch {
        tokens: &tokens,
        batch,
    };

    let (shape, want) = f32s(&st, "logits");
    assert_eq!(shape, [batch, tokens.len() / batch, cfg.vocab_size]);
    let got = model.logits(&w, b).unwrap();
    let err = got
        .iter()
        .zip(&want)
        .fold(0.0f32, |m, (g, r)| m.max((g - r).abs()));
    assert!(err <= 1e-4, "{case}: logits differ by {err}");

    let (_, loss) = f32s(&st, "loss");
    let ours = model.nll(&w, b).unwrap().mean();
    let rel = (ours - f64::from(loss[0])).abs() / f64::from(loss[0]);
    assert!(rel <= 1e-5, "{case}: loss {ours} vs {} ({rel:e})", loss[0]);

    let (grad_loss, grads) = model.loss_and_grads(&w, b).unwrap();
    // The autodiff forward decomposes some ops (softmax, log-softmax) differently from the
    // plain one: equal to f32 rounding, not bit for bit.
    assert!(
        (grad_loss - ours).abs() <= 1e-6 * ours,
        "{grad_loss} vs {ours}"
    );
    let mut checked = 0;
    let mut worst = 0.0f32;
    for name in st.names() {
        let Some(param) = name.strip_prefix("grad.") else {
            continue;
        };
        let (shape, want) = f32s(&st, name);
        assert_eq!(shape, model.layout().entry(param).unwrap().shape, "{param}");
        let got = grads.tensor(param).unwrap();
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f32, |m, (g, r)| m.max((g - r).abs()));
        let scale = max_abs(&want);
        assert!(scale > 0.0, "{param}: the reference gradient is zero");
        assert!(
            err <= 1e-3 * scale,
            "{case}: gradient of {param} differs by {err} (max |grad| {scale})"
        );
        worst = worst.max(err / scale);
        checked += 1;
    }
    eprintln!(
        "{case}: logits max |Δ| {err:.2e}, loss relative {rel:.2e}, worst gradient relative {worst:.2e}"
    );
    assert!(
        checked >= 11,
        "{case}: only {checked} gradients in the fixture"
    );
}

#[test]
fn matches_transformers_with_tied_embeddings() {
    check_case("tied");
}

#[test]
fn matches_transformers_with_untied_head_and_wide_heads() {
    check_case("untied");
}

#[test]
fn round_trips_the_hugging_face_checkpoint_bit_for_bit() {
    for case in ["tied", "untied"] {
        let dir = fixture(case);
        let cfg =
            Qwen3Config::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let model = Qwen3::new(cfg).unwrap();
        let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
        let w = Weights::from_safetensors(&bytes, model.layout().clone()).unwrap();
        let again = Weights::from_safetensors(&w.to_safetensors(), model.layout().clone()).unwrap();
        assert_eq!(again, w);
        // Every tensor's bytes are the file's own.
        let st = SafeTensors::deserialize(&bytes).unwrap();
        for e in model.layout().entries() {
            let ours: Vec<u8> = w
                .tensor(&e.name)
                .unwrap()
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            assert_eq!(ours, st.tensor(&e.name).unwrap().data(), "{}", e.name);
        }
    }
}
