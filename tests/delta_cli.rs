//! `hanzod delta inspect|sign|verify` as a user runs them: exit codes and messages.

use std::path::PathBuf;
use std::process::{Command, Output};

fn hanzod(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hanzod"))
        .args(args)
        .env("HANZO_LOG", "warn")
        .output()
        .expect("run hanzod")
}

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/deltas")
        .join(name)
        .display()
        .to_string()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn inspect_reports_valid_and_invalid_files_with_exit_codes() {
    let ok = hanzod(&["delta", "inspect", &fixture("tiny_f32.hzdl")]);
    assert_eq!(ok.status.code(), Some(0), "{}", stdout(&ok));
    let text = stdout(&ok);
    assert!(
        text.contains("a.weight") && text.contains("[2, 3]"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("valid"), "{text}");

    let nan = hanzod(&["delta", "inspect", &fixture("tiny_nan_f32.hzdl"), "--json"]);
    assert_eq!(nan.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&nan.stdout).expect("JSON report");
    assert_eq!(report["valid"], false);
    assert!(
        report["error"].as_str().unwrap().contains("b.bias"),
        "{report}"
    );

    let magic = hanzod(&["delta", "inspect", &fixture("tiny_bad_magic.hzdl")]);
    assert_eq!(magic.status.code(), Some(1));
    assert!(stdout(&magic).contains("INVALID"), "{}", stdout(&magic));

    let missing = hanzod(&["delta", "inspect", "/nonexistent/delta.hzdl"]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn sign_then_verify_and_a_replayed_statement_fails() {
    let dir = std::env::temp_dir().join(format!("hanzod-delta-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("node.key");
    let _ = std::fs::remove_file(&key);
    let keygen = hanzod(&["keygen", "--out", key.to_str().unwrap()]);
    assert!(keygen.status.success());
    let node = stdout(&keygen).trim().to_string();
    let file = fixture("tiny_f32.hzdl");
    let statement = [
        "--job", "3", "--epoch", "1", "--step", "500", "--loss", "2.25",
    ];
    let mut sign_args = vec!["delta", "sign", &file, "--key", key.to_str().unwrap()];
    sign_args.extend(statement);
    let signed = hanzod(&sign_args);
    assert!(signed.status.success(), "{:?}", signed);
    let sig = stdout(&signed).trim().to_string();
    assert_eq!(sig.len(), 128);

    let verify = |job: &str| {
        hanzod(&[
            "delta",
            "verify",
            &file,
            "--node",
            &node,
            "--signature",
            &sig,
            "--job",
            job,
            "--epoch",
            "1",
            "--step",
            "500",
            "--loss",
            "2.25",
        ])
    };
    let good = verify("3");
    assert_eq!(good.status.code(), Some(0), "{}", stdout(&good));
    // The same signature offered for another job: refused.
    let replayed = verify("4");
    assert_eq!(replayed.status.code(), Some(1));
    assert!(stdout(&replayed).contains("INVALID"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: a client command whose output goes to a closed pipe (`hanzod config | head
/// -1`) ends as a Unix tool does, by SIGPIPE or with status 0, never with a panic.
#[test]
fn a_closed_pipe_ends_a_client_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = Command::new(env!("CARGO_BIN_EXE_hanzod"))
        .arg("config")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("hanzod starts");
    // The reader goes away before the command writes.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("hanzod ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // 141 = 128 + SIGPIPE, what a shell reports for a tool a closed pipe ended.
    assert!(
        out.status.success() || out.status.code() == Some(141) || out.status.signal() == Some(13),
        "{:?}: {stderr}",
        out.status
    );
}

/// Regression: `delta inspect --model nosuch` said only that the file was missing; it now
/// names the built-in models too (exit 2, a usage error).
#[test]
fn an_unknown_model_lists_the_built_in_models() {
    let delta = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/deltas/tiny_f32.hzdl");
    let out = hanzod(&[
        "delta",
        "inspect",
        delta.to_str().unwrap(),
        "--model",
        "nosuch",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("not a built-in model (wine-mlp, qwen3-tiny)"),
        "{stderr}"
    );
}

/// Regression: `node --region "EU West"` wrote a key file before refusing the region.
#[test]
fn a_bad_region_is_refused_before_a_key_is_written() {
    let dir = std::env::temp_dir().join(format!("hanzod-region-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("node.key");
    let _ = std::fs::remove_file(&key);
    let out = hanzod(&[
        "node",
        "--key",
        key.to_str().unwrap(),
        "--region",
        "EU West",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--region"), "{stderr}");
    assert!(!key.exists(), "no key was written");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression (issue 16): `node --region` errors exited 2 but other bad arguments exited 1,
/// and only once the daemon refused them; a node without `--vram-gib` declared 80 GiB. Each
/// is now a usage error (exit 2) before a key is written.
#[test]
fn node_usage_errors_exit_2_before_a_key_is_written() {
    let dir = std::env::temp_dir().join(format!("hanzod-node-usage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("node.key");
    let key = key.to_str().unwrap();
    let long = "a".repeat(65);
    for (args, says) in [
        (vec!["--region", "eu-west"], "--vram-gib is required"),
        (
            vec!["--vram-gib", "8", "--advertise", "peer"],
            "--advertise",
        ),
        (vec!["--vram-gib", "8", "--listen", "nowhere"], "--listen"),
        (vec!["--vram-gib", "8", "--up-mbps=-5"], "--up-mbps"),
        (
            vec!["--vram-gib", "8", "--region", long.as_str()],
            "--region",
        ),
    ] {
        let mut argv = vec!["node", "--key", key];
        argv.extend(args.iter().copied());
        let out = hanzod(&argv);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !std::path::Path::new(key).exists(),
            "{args:?}: no key was written"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `delta inspect --adapter-config`: PEFT's own adapter_config.json (the LoRA parity
/// fixture PEFT 0.21.2 wrote, r 4 on q/v/down_proj of the tied test model) gives the
/// adapter spec, which PEFT's own adapter_model.safetensors fills exactly; a delta of it
/// inspects valid, and the same delta against other LoRA flags does not.
#[test]
fn inspect_checks_a_lora_delta_against_peft_adapter_config() {
    use hanzod::delta::model::ModelSpec;
    use hanzod::delta::peft::AdapterConfig;
    use hanzod::train::{Layout, Weights};
    let fixtures =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crates/train/tests/fixtures/qwen3");
    let config = fixtures.join("tied/config.json");
    let adapter_config = fixtures.join("lora/adapter_config.json");
    let read =
        |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let peft = AdapterConfig::from_json(&read(&adapter_config)).expect("PEFT's file");
    let targets: Vec<&str> = peft.target_modules.iter().map(String::as_str).collect();
    let spec = ModelSpec::from_hf_config(&read(&config))
        .unwrap()
        .lora_spec(peft.rank as usize, &targets)
        .unwrap();
    let adapter = std::fs::read(fixtures.join("lora/adapter_model.safetensors")).unwrap();
    let weights =
        Weights::from_safetensors(&adapter, std::sync::Arc::new(Layout::new(&spec).unwrap()))
            .expect("PEFT's adapter tensors are exactly the spec's");
    let dir = std::env::temp_dir().join(format!("hanzod-adapter-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let delta = dir.join("adapter.hzdl");
    std::fs::write(&delta, weights.to_delta_bytes(0).unwrap()).unwrap();
    let (delta, config, adapter_config) = (
        delta.to_str().unwrap(),
        config.to_str().unwrap(),
        adapter_config.to_str().unwrap(),
    );

    let ok = hanzod(&[
        "delta",
        "inspect",
        delta,
        "--model",
        config,
        "--adapter-config",
        adapter_config,
    ]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}{}",
        stdout(&ok),
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        stdout(&ok).contains("valid against qwen3 LoRA r=4"),
        "{}",
        stdout(&ok)
    );
    // The same flags by hand agree; other targets do not.
    let by_hand = hanzod(&[
        "delta",
        "inspect",
        delta,
        "--model",
        config,
        "--lora-rank",
        "4",
        "--lora-targets",
        "q_proj,v_proj,down_proj",
    ]);
    assert_eq!(by_hand.status.code(), Some(0), "{}", stdout(&by_hand));
    let other = hanzod(&[
        "delta",
        "inspect",
        delta,
        "--model",
        config,
        "--lora-rank",
        "4",
    ]);
    assert_eq!(other.status.code(), Some(1), "{}", stdout(&other));

    // Both ways at once is a usage error; so is a refused adapter config.
    let both = hanzod(&[
        "delta",
        "inspect",
        delta,
        "--model",
        config,
        "--adapter-config",
        adapter_config,
        "--lora-rank",
        "4",
    ]);
    assert_eq!(both.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"));
    let regex = dir.join("regex_adapter_config.json");
    std::fs::write(
        &regex,
        r#"{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ".*\\.(q|v)_proj"}"#,
    )
    .unwrap();
    let refused = hanzod(&[
        "delta",
        "inspect",
        delta,
        "--model",
        config,
        "--adapter-config",
        regex.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("regular expression"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
