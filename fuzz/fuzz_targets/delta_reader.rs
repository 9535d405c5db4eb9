//! Fuzzes the delta reader (DESIGN §6): any bytes must give a typed error or a view, never
//! a panic, an out-of-bounds read or an allocation of a declared-but-absent size; a view
//! must then survive the finite check, the norms and the format check against a model.
#![no_main]

use hanzod::delta::format::DeltaView;
use hanzod::delta::model::check_against;
use hanzod::delta::model::ModelSpec;
use libfuzzer_sys::fuzz_target;

const CONFIG: &str = r#"{"model_type":"llama","hidden_size":8,"num_hidden_layers":1,
"num_attention_heads":2,"num_key_value_heads":1,"intermediate_size":16,"vocab_size":32,
"tie_word_embeddings":true}"#;

fuzz_target!(|data: &[u8]| {
    if let Ok(view) = DeltaView::parse(data) {
        let _ = view.check_finite();
        let _ = view.total_l2_norm();
        if let Ok(spec) = ModelSpec::from_hf_config(CONFIG) {
            let _ = check_against(&view, &spec);
        }
    }
});
