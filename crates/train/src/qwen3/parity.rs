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

/// The batch size and the token ids of the fixture's `input_ids` (I64 `[batch, seq]`).
fn input_ids(st: &SafeTensors<'_>) -> (usize, Vec<u32>) {
    let ids = st.tensor("input_ids").unwrap();
    assert_eq!(ids.dtype(), Dtype::I64);
    let tokens = ids
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    (ids.shape()[0], tokens)
}

/// `max |a − b|` over the pairs of `a` and `b`.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (g, r)| m.max((g - r).abs()))
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

    let (batch, tokens) = input_ids(&st);
    let b = Batch {
        tokens: &tokens,
        batch,
    };

    let (shape, want) = f32s(&st, "logits");
    assert_eq!(shape, [batch, tokens.len() / batch, cfg.vocab_size]);
    let got = model.logits(&w, b).unwrap();
    let err = max_diff(&got, &want);
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
        let err = max_diff(got, &want);
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

/// Parity of the LoRA forward and its adapter gradients with PEFT (`tests/fixtures/qwen3/lora`,
/// written by `tools/lm/qwen3_reference.py lora`, PEFT version in `versions.json`): PEFT's
/// own `adapter_model.safetensors` (r 4, lora_alpha 8 on q_proj, v_proj, down_proj) on the
/// `tied` base loads by its PEFT names into [`Qwen3::lora`]'s layout; the logits within 1e-4,
/// the loss within 1e-5 relative, every factor's gradient within 1e-3 relative, and the
/// merged weights `W + (alpha/r)·B·A` of `merge_and_unload()` within 1e-6 of the same sum in
/// f32 here.
#[test]
fn matches_peft_lora() {
    let dir = fixture("tied");
    let cfg =
        Qwen3Config::from_json(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let model = Qwen3::new(cfg.clone()).unwrap();
    let w = Weights::from_safetensors(
        &std::fs::read(dir.join("model.safetensors")).unwrap(),
        model.layout().clone(),
    )
    .unwrap();
    let lora_dir = fixture("lora");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(lora_dir.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    let targets: Vec<String> = config["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let rank = config["r"].as_u64().unwrap() as usize;
    let alpha = config["lora_alpha"].as_f64().unwrap();
    let lora = model.lora(rank, alpha, &targets).unwrap();
    assert_eq!(lora.scaling(), 2.0);
    // PEFT's file holds exactly the adapter's tensors, by name and shape.
    let adapter = Weights::from_safetensors(
        &std::fs::read(lora_dir.join("adapter_model.safetensors")).unwrap(),
        lora.layout().clone(),
    )
    .unwrap();
    assert_eq!(lora.layout().entries().len(), 12);

    let expected = std::fs::read(lora_dir.join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&expected).unwrap();
    let (batch, tokens) = input_ids(&st);
    let b = Batch {
        tokens: &tokens,
        batch,
    };
    let (_, want) = f32s(&st, "logits");
    let got = model.lora_logits(&w, &lora, &adapter, b).unwrap();
    let err = max_diff(&got, &want);
    assert!(err <= 1e-4, "lora: logits differ by {err}");
    // The adapter matters: the base alone is far from PEFT's logits.
    let plain = model.logits(&w, b).unwrap();
    let moved = max_diff(&plain, &want);
    assert!(
        moved > 0.1,
        "the fixture's adapter barely changes the logits ({moved})"
    );

    let (_, loss) = f32s(&st, "loss");
    let ours = model.lora_nll(&w, &lora, &adapter, b).unwrap().mean();
    let rel = (ours - f64::from(loss[0])).abs() / f64::from(loss[0]);
    assert!(rel <= 1e-5, "lora: loss {ours} vs {} ({rel:e})", loss[0]);

    let (_, grads) = model.lora_loss_and_grads(&w, &lora, &adapter, b).unwrap();
    let mut worst = 0.0f32;
    for e in lora.layout().entries() {
        let (shape, want) = f32s(&st, &format!("grad.{}", e.name));
        assert_eq!(shape, e.shape, "{}", e.name);
        let got = grads.tensor(&e.name).unwrap();
        let err = max_diff(got, &want);
        let scale = max_abs(&want);
        assert!(scale > 0.0, "{}: the reference gradient is zero", e.name);
        assert!(
            err <= 1e-3 * scale,
            "lora: gradient of {} differs by {err} (max |grad| {scale})",
            e.name
        );
        worst = worst.max(err / scale);
    }

    // merge_and_unload: W + s·B·A per adapted module.
    let merged = std::fs::read(lora_dir.join("merged.safetensors")).unwrap();
    let merged = SafeTensors::deserialize(&merged).unwrap();
    let s = lora.scaling() as f32;
    let mut checked = 0;
    for name in merged.names() {
        let module = name.strip_suffix(".weight").unwrap();
        let (shape, want) = f32s(&merged, name);
        let [out, inp] = shape[..] else {
            panic!("{name} is not a matrix")
        };
        let a = adapter
            .tensor(&format!("base_model.model.{module}.lora_A.weight"))
            .unwrap();
        let bm = adapter
            .tensor(&format!("base_model.model.{module}.lora_B.weight"))
            .unwrap();
        let base = w.tensor(name).unwrap();
        for o in 0..out {
            for i in 0..inp {
                let dw: f32 = (0..rank).map(|k| bm[o * rank + k] * a[k * inp + i]).sum();
                let ours = base[o * inp + i] + s * dw;
                let theirs = want[o * inp + i];
                assert!(
                    (ours - theirs).abs() <= 1e-6,
                    "{name}[{o},{i}]: {ours} vs {theirs}"
                );
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 6);
    eprintln!(
        "lora: logits max |Δ| {err:.2e}, loss relative {rel:.2e}, worst gradient relative {worst:.2e}"
    );
}
