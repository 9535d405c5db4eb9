//! The deployment files checked against the code they deploy: `compose.yml` (with the files
//! it mounts under `config/compose/`), the `Dockerfile` and `.dockerignore`, and the
//! Kubernetes manifests under `deploy/k8s/`. Nothing is run (no Docker, no cluster): each
//! file is parsed and its settings are fed to the same configuration loader `hanzod serve`
//! uses, so a renamed variable, a moved port or a lost volume fails here rather than at
//! deployment. Every assertion names the file, the service or object, and the key at fault.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use hanzod::config::Config;
use serde::Deserialize;
use serde_yaml_ng::Value;

// ---------------------------------------------------------------------------------------
// Files

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every YAML document of a file, `<<` merge keys applied, empty documents skipped.
fn yaml_docs(rel: &str) -> Vec<Value> {
    let text = read(rel);
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
        let mut v = Value::deserialize(doc)
            .unwrap_or_else(|e| panic!("{rel}: document {i} is not valid YAML: {e}"));
        v.apply_merge()
            .unwrap_or_else(|e| panic!("{rel}: document {i}: merge keys: {e}"));
        if !v.is_null() {
            docs.push(v);
        }
    }
    docs
}

/// A scalar as text (strings, numbers, booleans).
fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_sequence)
        .map(|s| s.iter().filter_map(text).collect())
        .unwrap_or_default()
}

fn port_of(ctx: &str, addr: &str) -> u16 {
    addr.parse::<std::net::SocketAddr>()
        .unwrap_or_else(|e| panic!("{ctx}: {addr:?} is not an address: {e}"))
        .port()
}

/// `scheme://host:port/...` → (host, port).
fn url_host_port(ctx: &str, url: &str) -> (String, u16) {
    let rest = url
        .split_once("://")
        .unwrap_or_else(|| panic!("{ctx}: {url:?} is not a URL"))
        .1;
    let authority = rest.split('/').next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let (host, port) = authority
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{ctx}: {url:?} names no port"));
    let port = port
        .parse()
        .unwrap_or_else(|e| panic!("{ctx}: {url:?}: port {port:?}: {e}"));
    (host.to_string(), port)
}

fn cargo_toml() -> toml::Table {
    toml::from_str(&read("Cargo.toml")).expect("Cargo.toml parses")
}

// ---------------------------------------------------------------------------------------
// The configuration loader

/// A configuration loaded the way `hanzod serve` loads it, and the variables the loader
/// asked for.
struct Loaded {
    cfg: Config,
    asked: BTreeSet<String>,
}

fn load_config(ctx: &str, file: Option<&Path>, env: &BTreeMap<String, String>) -> Loaded {
    Config::check_env_names(env.keys().map(String::as_str))
        .unwrap_or_else(|e| panic!("{ctx}: hanzod refuses the environment: {e}"));
    let asked = RefCell::new(BTreeSet::new());
    let cfg = Config::load(file, |k| {
        asked.borrow_mut().insert(k.to_string());
        env.get(k).cloned()
    })
    .unwrap_or_else(|e| panic!("{ctx}: the configuration does not load: {e}"));
    cfg.check()
        .unwrap_or_else(|e| panic!("{ctx}: Config::check refuses the configuration: {e}"));
    Loaded {
        cfg,
        asked: asked.into_inner(),
    }
}

/// The variables the command line reads (clap `env = "…"` in crates/cli/src): HANZOD_CONFIG,
/// HANZOD_ENDPOINT, HANZOD_ADMIN_TOKEN.
fn cli_env_names() -> BTreeSet<String> {
    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = e.expect("directory entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    sources(&root().join("crates/cli/src"), &mut files);
    files
        .iter()
        .flat_map(|f| {
            let text =
                std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            text.split("env = \"")
                .skip(1)
                .filter_map(|s| s.split('"').next())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every variable set must be one hanzod reads: asked for by the configuration loader, or
/// read by the command line; `helpers` are only referenced by other values.
fn assert_every_variable_is_read(
    ctx: &str,
    env: &BTreeMap<String, String>,
    asked: &BTreeSet<String>,
    helpers: &BTreeSet<String>,
) {
    let cli = cli_env_names();
    for k in env.keys() {
        assert!(
            asked.contains(k) || cli.contains(k) || helpers.contains(k),
            "{ctx}: {k} is set, but hanzod never reads it (neither the configuration loader, \
             crates/daemon/src/config.rs, nor the command line, crates/cli/src)"
        );
    }
}

/// The adapters deployments leave off: the variable, the key, and the value it produced.
/// The chain (`HANZO_RPC`) stays off in compose and k8s until its contracts are deployed
/// and the orchestrator's account staked, which those files cannot do (README, The chain).
fn refused_adapters(cfg: &Config) -> [(&'static str, &'static str, &str); 1] {
    [("HANZO_RPC", "chain.rpc_url", cfg.chain.rpc_url.as_str())]
}

fn assert_refused_adapters_off(ctx: &str, cfg: &Config) {
    for (var, key, value) in refused_adapters(cfg) {
        assert!(
            value.is_empty(),
            "{ctx}: {var} ({key}) is {value:?}, but the deployment cannot deploy the contracts \
             or stake the orchestrator's account: leave it commented out (README, The chain)"
        );
    }
}

/// The directories on disk a replica writes, by key.
fn data_dirs(cfg: &Config) -> [(&'static str, &str); 3] {
    [
        ("deltas.store_dir", cfg.deltas.store_dir.as_str()),
        ("publish.object_dir", cfg.publish.object_dir.as_str()),
        ("publish.registry_dir", cfg.publish.registry_dir.as_str()),
    ]
}

// ---------------------------------------------------------------------------------------
// Valkey configuration

/// `directive args…` lines of a valkey.conf, later lines winning.
fn valkey_directives(ctx: &str, conf: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in conf.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        assert!(
            !k.contains('='),
            "{ctx}: {line:?} is not a valkey.conf directive"
        );
        out.insert(k.to_ascii_lowercase(), v.trim().to_string());
    }
    out
}

/// The settings that make the event log durable, and the data directory.
fn assert_valkey_durable(ctx: &str, d: &BTreeMap<String, String>) {
    assert_eq!(
        d.get("appendonly").map(String::as_str),
        Some("yes"),
        "{ctx}: appendonly must be yes: hanzod refuses a Valkey without an AOF \
         (state.require_aof), and acknowledged events must survive a restart"
    );
    let fsync = d.get("appendfsync").map(String::as_str);
    assert!(
        matches!(fsync, Some("everysec") | Some("always")),
        "{ctx}: appendfsync is {fsync:?}: everysec (hanzod waits for WAITAOF) or always; \
         no would leave fsync to the kernel"
    );
    let policy = d.get("maxmemory-policy").map(String::as_str);
    assert!(
        matches!(policy, None | Some("noeviction")),
        "{ctx}: maxmemory-policy {policy:?} would evict events from the log; use noeviction"
    );
}

// ---------------------------------------------------------------------------------------
// Compose

const COMPOSE: &str = "compose.yml";
const HANZOD: &str = "hanzod";
const STANDBY: &str = "hanzod-standby";

/// The host environment the tests interpolate compose.yml with.
fn test_host_env(k: &str) -> Option<String> {
    match k {
        "ORCH_KEY" => Some("a1".repeat(32)),
        "HF_TOKEN" => Some("hf_test_token".into()),
        _ => None,
    }
}

/// Compose interpolation of one string: `$$`, `$X`, `${X}`, `${X:-d}`, `${X-d}`,
/// `${X:?msg}`, `${X?msg}`, `${X:+v}`, `${X+v}`.
fn interpolate(s: &str, host: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(r) = after.strip_prefix('$') {
            out.push('$');
            rest = r;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
            let (name, op) = body[..end].split_at(body[..end].find(|c| !is_name(c)).unwrap_or(end));
            let value = host(name);
            let set = value.as_deref().is_some_and(|v| !v.is_empty());
            out.push_str(&match op {
                "" => value.unwrap_or_default(),
                _ if op.starts_with(":-") => {
                    if set {
                        value.unwrap_or_default()
                    } else {
                        op[2..].to_string()
                    }
                }
                _ if op.starts_with('-') => value.unwrap_or_else(|| op[1..].to_string()),
                _ if op.starts_with(":?") => {
                    if !set {
                        return Err(format!("{name}: {}", &op[2..]));
                    }
                    value.unwrap_or_default()
                }
                _ if op.starts_with('?') => value.ok_or_else(|| format!("{name}: {}", &op[1..]))?,
                _ if op.starts_with(":+") => {
                    if set {
                        op[2..].to_string()
                    } else {
                        String::new()
                    }
                }
                _ if op.starts_with('+') => {
                    if value.is_some() {
                        op[1..].to_string()
                    } else {
                        String::new()
                    }
                }
                _ => return Err(format!("unsupported interpolation ${{{}}}", &body[..end])),
            });
            rest = &body[end + 1..];
        } else {
            let n = after.find(|c| !is_name(c)).unwrap_or(after.len());
            out.push_str(&host(&after[..n]).unwrap_or_default());
            rest = &after[n..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn interpolate_value(v: &mut Value, host: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    match v {
        Value::String(s) => *s = interpolate(s, host)?,
        Value::Sequence(items) => {
            for item in items {
                interpolate_value(item, host)?;
            }
        }
        Value::Mapping(m) => {
            for (_, item) in m.iter_mut() {
                interpolate_value(item, host)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// compose.yml with merge keys applied, before interpolation.
fn compose_raw() -> Value {
    let mut docs = yaml_docs(COMPOSE);
    assert_eq!(docs.len(), 1, "{COMPOSE}: one YAML document");
    docs.remove(0)
}

/// compose.yml interpolated with [`test_host_env`].
fn compose() -> Value {
    let mut v = compose_raw();
    interpolate_value(&mut v, &test_host_env)
        .unwrap_or_else(|e| panic!("{COMPOSE}: interpolation with ORCH_KEY and HF_TOKEN set: {e}"));
    v
}

fn service<'a>(c: &'a Value, name: &str) -> &'a Value {
    c.get("services")
        .and_then(|s| s.get(name))
        .unwrap_or_else(|| panic!("{COMPOSE}: no service {name:?}"))
}

fn service_names(c: &Value) -> Vec<String> {
    c.get("services")
        .and_then(Value::as_mapping)
        .unwrap_or_else(|| panic!("{COMPOSE}: no services"))
        .keys()
        .filter_map(text)
        .collect()
}

/// The services built from the Dockerfile: the hanzod replicas.
fn hanzod_services(c: &Value) -> Vec<String> {
    service_names(c)
        .into_iter()
        .filter(|n| service(c, n).get("build").is_some())
        .collect()
}

#[derive(Debug, Clone)]
enum Mount {
    /// A host path (relative to compose.yml) at `target`.
    Bind { source: PathBuf, target: String },
    /// A named volume at `target`.
    Volume { name: String, target: String },
    /// Anything else (anonymous volume, tmpfs) at `target`.
    Other { target: String },
}

impl Mount {
    fn target(&self) -> &str {
        match self {
            Mount::Bind { target, .. } | Mount::Volume { target, .. } | Mount::Other { target } => {
                target
            }
        }
    }
}

fn mounts(c: &Value, svc: &str) -> Vec<Mount> {
    let s = service(c, svc);
    let Some(list) = s.get("volumes").and_then(Value::as_sequence) else {
        return Vec::new();
    };
    let mount = |source: &str, target: &str, kind: Option<&str>| {
        let target = target.to_string();
        let bind = kind == Some("bind")
            || (kind.is_none()
                && (source.starts_with('.') || source.starts_with('/') || source.starts_with('~')));
        if bind {
            Mount::Bind {
                source: root().join(source),
                target,
            }
        } else if source.is_empty() || kind.is_some_and(|k| k != "volume") {
            Mount::Other { target }
        } else {
            Mount::Volume {
                name: source.to_string(),
                target,
            }
        }
    };
    list.iter()
        .map(|m| match m {
            Value::String(short) => {
                let parts: Vec<&str> = short.split(':').collect();
                match parts.as_slice() {
                    [target] => mount("", target, None),
                    [source, target, ..] => mount(source, target, None),
                    [] => unreachable!(),
                }
            }
            long => {
                let field = |k: &str| long.get(k).and_then(Value::as_str).unwrap_or_default();
                mount(field("source"), field("target"), Some(field("type")))
            }
        })
        .collect()
}

/// The host file a container path of a service comes from (a bind mount at it or above).
fn host_file(c: &Value, svc: &str, container_path: &str) -> Option<PathBuf> {
    mounts(c, svc).into_iter().find_map(|m| match m {
        Mount::Bind { source, target } => {
            let rest = Path::new(container_path).strip_prefix(&target).ok()?;
            Some(if rest.as_os_str().is_empty() {
                source
            } else {
                source.join(rest)
            })
        }
        _ => None,
    })
}

/// The named volume a container path of a service lies on (the deepest mount above it).
fn volume_at(c: &Value, svc: &str, container_path: &str) -> Option<String> {
    mounts(c, svc)
        .into_iter()
        .filter(|m| Path::new(container_path).starts_with(m.target()))
        .max_by_key(|m| m.target().len())
        .and_then(|m| match m {
            Mount::Volume { name, .. } => Some(name),
            _ => None,
        })
}

fn env_files(c: &Value, svc: &str) -> Vec<String> {
    match service(c, svc).get("env_file") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Sequence(items)) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => s.clone(),
                m => m
                    .get("path")
                    .and_then(Value::as_str)
                    .unwrap_or_else(|| panic!("{COMPOSE}: {svc}: env_file entry without path"))
                    .to_string(),
            })
            .collect(),
        Some(other) => panic!("{COMPOSE}: {svc}: env_file is {other:?}"),
    }
}

/// `KEY=VALUE` lines of an env file (comments, blank lines, `export`, quotes).
fn dotenv(rel: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (n, line) in read(rel).lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{rel}:{}: {line:?} is not KEY=VALUE", n + 1));
        let v = v.trim();
        let v = if v.len() >= 2
            && ((v.starts_with('"') && v.ends_with('"'))
                || (v.starts_with('\'') && v.ends_with('\'')))
        {
            &v[1..v.len() - 1]
        } else {
            v.split(" #").next().unwrap_or_default().trim_end()
        };
        assert!(
            !v.contains('$'),
            "{rel}:{}: {k} refers to a variable; Compose versions differ on interpolating \
             env_file values: put it under environment: in {COMPOSE}",
            n + 1
        );
        out.insert(k.trim().to_string(), v.to_string());
    }
    out
}

/// The `environment:` entries of a service as written (mapping or `K=V` list).
fn environment(svc_value: &Value) -> BTreeMap<String, Option<String>> {
    match svc_value.get("environment") {
        None => BTreeMap::new(),
        Some(Value::Mapping(m)) => m
            .iter()
            .map(|(k, v)| (text(k).unwrap_or_default(), text(v)))
            .collect(),
        Some(Value::Sequence(items)) => items
            .iter()
            .filter_map(text)
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (kv, None),
            })
            .collect(),
        Some(other) => panic!("{COMPOSE}: environment is {other:?}"),
    }
}

/// A service's environment: its env files, then `environment:` (interpolated).
fn service_env(c: &Value, svc: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for f in env_files(c, svc) {
        env.extend(dotenv(&f));
    }
    for (k, v) in environment(service(c, svc)) {
        // `KEY` alone passes the host's value through.
        if let Some(v) = v.or_else(|| test_host_env(&k)) {
            env.insert(k, v);
        }
    }
    env
}

/// A hanzod service's configuration: HANZOD_CONFIG resolved through its bind mounts.
fn compose_hanzod(c: &Value, svc: &str) -> (BTreeMap<String, String>, Loaded) {
    let env = service_env(c, svc);
    let ctx = format!("{COMPOSE}: service {svc}");
    let file = env.get("HANZOD_CONFIG").map(|p| {
        let f = host_file(c, svc, p).unwrap_or_else(|| {
            panic!("{ctx}: HANZOD_CONFIG={p} is not on a bind mount of the service")
        });
        assert!(
            f.is_file(),
            "{ctx}: HANZOD_CONFIG={p} is mounted from {}, which does not exist",
            f.display()
        );
        f
    });
    let loaded = load_config(&ctx, file.as_deref(), &env);
    (env, loaded)
}

fn published_ports(c: &Value, svc: &str) -> Vec<(Option<u16>, u16)> {
    let ctx = format!("{COMPOSE}: service {svc}: ports");
    let num = |s: &str| -> u16 {
        s.parse().unwrap_or_else(|e| {
            panic!("{ctx}: {s:?} is not a port (ranges are not used here): {e}")
        })
    };
    let Some(list) = service(c, svc).get("ports").and_then(Value::as_sequence) else {
        return Vec::new();
    };
    list.iter()
        .map(|p| match p {
            Value::Mapping(_) => (
                p.get("published").and_then(text).map(|s| num(&s)),
                num(&p.get("target").and_then(text).unwrap_or_default()),
            ),
            short => {
                let s = text(short).unwrap_or_default();
                let s = s.split('/').next().unwrap_or_default();
                let parts: Vec<&str> = s.split(':').collect();
                match parts.as_slice() {
                    [container] => (None, num(container)),
                    [.., host, container] => (Some(num(host)), num(container)),
                    [] => unreachable!(),
                }
            }
        })
        .collect()
}

fn command(c: &Value, svc: &str) -> Vec<String> {
    match service(c, svc).get("command") {
        Some(Value::String(s)) => s.split_whitespace().map(str::to_string).collect(),
        other => strings(other),
    }
}

/// The health check's command as words (`CMD` form, or a `CMD-SHELL` line split).
fn healthcheck(c: &Value, svc: &str) -> Vec<String> {
    let test = service(c, svc)
        .get("healthcheck")
        .and_then(|h| h.get("test"))
        .unwrap_or_else(|| panic!("{COMPOSE}: service {svc} has no healthcheck.test"));
    let words = match test {
        Value::String(s) => vec!["CMD-SHELL".to_string(), s.clone()],
        other => strings(Some(other)),
    };
    match words.first().map(String::as_str) {
        Some("CMD") => words[1..].to_vec(),
        Some("CMD-SHELL") => words[1..]
            .join(" ")
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        _ => panic!(
            "{COMPOSE}: service {svc}: healthcheck.test {words:?} is neither CMD nor CMD-SHELL"
        ),
    }
}

fn depends_on(c: &Value, svc: &str) -> BTreeMap<String, Option<String>> {
    match service(c, svc).get("depends_on") {
        None => BTreeMap::new(),
        Some(Value::Sequence(items)) => items.iter().filter_map(text).map(|n| (n, None)).collect(),
        Some(Value::Mapping(m)) => m
            .iter()
            .map(|(k, v)| {
                (
                    text(k).unwrap_or_default(),
                    v.get("condition").and_then(text),
                )
            })
            .collect(),
        Some(other) => panic!("{COMPOSE}: service {svc}: depends_on is {other:?}"),
    }
}

/// `--flag=value` or `--flag value` in a command.
fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&format!("{name}=")) {
            Some(v.to_string())
        } else if a == name {
            args.get(i + 1).cloned()
        } else {
            None
        }
    })
}

/// The hanzod health check of a service or the Dockerfile: `hanzod health`, liveness (not
/// `--ready`: a standby is alive but not ready), on the metrics port.
fn assert_hanzod_health(ctx: &str, words: &[String], metrics_port: u16) {
    let at = words
        .windows(2)
        .position(|w| w[0].rsplit('/').next() == Some("hanzod") && w[1] == "health");
    assert!(
        at.is_some(),
        "{ctx}: the health check {words:?} does not run `hanzod health`"
    );
    assert!(
        !words.iter().any(|w| w == "--ready"),
        "{ctx}: the health check uses --ready: a standby replica is never ready and would \
         be marked unhealthy; liveness (/healthz) is what a container health check needs"
    );
    if let Some(addr) = flag(words, "--addr") {
        assert_eq!(
            port_of(ctx, &addr),
            metrics_port,
            "{ctx}: `hanzod health --addr {addr}` is not server.metrics_addr's port"
        );
    }
}

#[test]
fn compose_services_volumes_files_and_dependencies_are_consistent() {
    let c = compose();
    let names = service_names(&c);
    for required in [HANZOD, STANDBY, "kv", "ipfs", "anvil"] {
        assert!(
            names.iter().any(|n| n == required),
            "{COMPOSE}: service {required:?} is missing (has {names:?})"
        );
    }
    let declared: BTreeSet<String> = c
        .get("volumes")
        .and_then(Value::as_mapping)
        .map(|m| m.keys().filter_map(text).collect())
        .unwrap_or_default();
    let mut used = BTreeSet::new();
    for svc in &names {
        let ctx = format!("{COMPOSE}: service {svc}");
        for m in mounts(&c, svc) {
            match m {
                Mount::Volume { name, target } => {
                    assert!(
                        declared.contains(&name),
                        "{ctx}: volume {name:?} (at {target}) is not declared under the \
                         top-level volumes: ({declared:?})"
                    );
                    used.insert(name);
                }
                Mount::Bind { source, target } => assert!(
                    source.exists(),
                    "{ctx}: the bind mount at {target} comes from {}, which does not exist",
                    source.display()
                ),
                Mount::Other { .. } => {}
            }
        }
        for f in env_files(&c, svc) {
            assert!(
                root().join(&f).is_file(),
                "{ctx}: env_file {f} does not exist"
            );
            assert!(
                f.starts_with("config/compose/"),
                "{ctx}: env_file {f} should live under config/compose/"
            );
        }
        for (dep, condition) in depends_on(&c, svc) {
            assert!(
                names.contains(&dep),
                "{ctx}: depends_on names {dep:?}, which is not a service"
            );
            if condition.as_deref() == Some("service_healthy") {
                assert!(
                    service(&c, &dep).get("healthcheck").is_some(),
                    "{ctx}: waits for {dep} to be healthy, but {dep} has no healthcheck"
                );
            }
        }
        healthcheck(&c, svc);
    }
    for v in &declared {
        assert!(
            used.contains(v),
            "{COMPOSE}: volume {v:?} is declared but no service mounts it"
        );
    }
    for (svc, volume, target) in [
        ("kv", "kv-data", "/data"),
        ("ipfs", "ipfs-data", "/data/ipfs"),
    ] {
        assert_eq!(
            volume_at(&c, svc, target).as_deref(),
            Some(volume),
            "{COMPOSE}: service {svc} must keep its data ({target}) on volume {volume}"
        );
    }
    for svc in hanzod_services(&c) {
        assert_eq!(
            depends_on(&c, &svc).get("kv").cloned().flatten().as_deref(),
            Some("service_healthy"),
            "{COMPOSE}: service {svc} must wait for kv with condition: service_healthy \
             (it refuses to start without its state store)"
        );
    }
}

#[test]
fn compose_hanzod_environment_loads_and_leaves_refused_adapters_off() {
    let c = compose();
    let replicas = hanzod_services(&c);
    assert_eq!(
        replicas,
        [HANZOD, STANDBY],
        "{COMPOSE}: the services built from the Dockerfile are the two hanzod replicas"
    );
    for svc in &replicas {
        let ctx = format!("{COMPOSE}: service {svc}");
        let (env, Loaded { cfg, asked }) = compose_hanzod(&c, svc);
        assert_every_variable_is_read(&ctx, &env, &asked, &BTreeSet::new());
        assert_refused_adapters_off(&ctx, &cfg);
        assert!(
            cfg.state.require_aof && cfg.state.wait_fsync,
            "{ctx}: state.require_aof and state.wait_fsync must stay on in a deployment \
             (the AOF settings of kv rely on them)"
        );
        // The state store is the compose service running Valkey.
        let (host, port) = url_host_port(&format!("{ctx}: VALKEY_URL"), &cfg.state.valkey_url);
        let kv = service(&c, &host);
        assert!(
            kv.get("image")
                .and_then(Value::as_str)
                .is_some_and(|i| i.starts_with("valkey/valkey:")),
            "{ctx}: VALKEY_URL names service {host:?}, which does not run valkey/valkey"
        );
        let conf = valkey_conf(&c);
        assert_eq!(
            conf.get("port").map(String::as_str).unwrap_or("6379"),
            port.to_string(),
            "{ctx}: VALKEY_URL's port is not the port of {host}'s valkey.conf"
        );
        for (key, dir) in data_dirs(&cfg) {
            assert!(
                dir.starts_with('/'),
                "{ctx}: {key} is {dir:?}: it must be an absolute directory on a volume, or a \
                 standby that takes over finds nothing"
            );
        }
    }
    // The env file says how to turn the refused adapters on, pointing at the services that
    // are already there.
    let env_file = env_files(&c, HANZOD)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("{COMPOSE}: service {HANZOD} has no env_file"));
    let text = read(&env_file);
    let anvil_port: u16 = flag(&command(&c, "anvil"), "--port")
        .map(|p| p.parse().expect("anvil --port"))
        .unwrap_or(8545);
    // The Kubo adapter is on: IPFS_URL names the ipfs service's RPC API.
    let ipfs = dotenv(&env_file)
        .get("IPFS_URL")
        .cloned()
        .unwrap_or_else(|| panic!("{env_file}: IPFS_URL is not set"));
    let (host, port) = url_host_port(&format!("{env_file}: IPFS_URL"), &ipfs);
    assert_eq!(
        host, "ipfs",
        "{env_file}: IPFS_URL should name the ipfs service"
    );
    assert_eq!(
        port, 5001,
        "{env_file}: IPFS_URL should be Kubo's RPC port 5001"
    );
    // The chain adapter is still refused: the env file says how to turn it on, pointing at
    // the anvil service.
    let line = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix('#'))
        .map(str::trim)
        .find_map(|l| l.strip_prefix("HANZO_RPC="))
        .unwrap_or_else(|| {
            panic!("{env_file}: no commented-out HANZO_RPC=… line to turn its adapter on")
        });
    let (host, p) = url_host_port(&format!("{env_file}: HANZO_RPC"), line);
    assert_eq!(
        host, "anvil",
        "{env_file}: HANZO_RPC should name the anvil service"
    );
    assert_eq!(
        p, anvil_port,
        "{env_file}: HANZO_RPC's port is not anvil's --port"
    );
}

#[test]
fn compose_secrets_come_from_the_host_and_both_replicas_share_the_key() {
    let raw = compose_raw();
    let mut key_refs = BTreeSet::new();
    for svc in [HANZOD, STANDBY] {
        let ctx = format!("{COMPOSE}: service {svc}");
        let env = environment(service(&raw, svc));
        for secret in ["ORCHESTRATOR_KEY", "HF_TOKEN", "HANZOD_ADMIN_TOKEN"] {
            for f in env_files(&raw, svc) {
                assert!(
                    !dotenv(&f).contains_key(secret),
                    "{f}: sets {secret}; secrets come from the host's environment, never a \
                     committed file"
                );
            }
            if let Some(Some(v)) = env.get(secret) {
                assert!(
                    v.trim_start().starts_with("${") && v.trim_end().ends_with('}'),
                    "{ctx}: {secret} is {v:?}: a secret must be a ${{VAR}} reference to the \
                     host's environment, not a value in the file"
                );
            }
        }
        let key = env
            .get("ORCHESTRATOR_KEY")
            .cloned()
            .flatten()
            .unwrap_or_else(|| panic!("{ctx}: ORCHESTRATOR_KEY is not set"));
        // Without ORCH_KEY on the host, compose must refuse to start rather than let each
        // replica make up its own identity.
        let err = match interpolate(&key, &|k: &str| (k != "ORCH_KEY").then(|| "x".into())) {
            Err(e) => e,
            Ok(v) => panic!(
                "{ctx}: ORCHESTRATOR_KEY is {key:?}, which gives {v:?} without ORCH_KEY on the \
                 host: use ${{ORCH_KEY:?…}} so compose refuses to start instead of each \
                 replica making up its own key"
            ),
        };
        assert!(
            err.starts_with("ORCH_KEY"),
            "{ctx}: ORCHESTRATOR_KEY must come from ORCH_KEY (the paper's name): {err}"
        );
        key_refs.insert(key);
        let (_, loaded) = compose_hanzod(&compose(), svc);
        assert_eq!(
            loaded.cfg.orchestrator.key,
            test_host_env("ORCH_KEY").unwrap(),
            "{ctx}: ORCH_KEY does not reach orchestrator.key"
        );
        assert_eq!(
            loaded.cfg.publish.hf_token,
            test_host_env("HF_TOKEN").unwrap(),
            "{ctx}: HF_TOKEN does not reach publish.hf_token"
        );
    }
    assert_eq!(
        key_refs.len(),
        1,
        "{COMPOSE}: the replicas' ORCHESTRATOR_KEY differ ({key_refs:?}): both must hold the \
         same key (the spot-check secrets derive from it)"
    );
}

#[test]
fn compose_replicas_share_image_configuration_and_data_but_not_identity() {
    let c = compose();
    let (a, b) = (service(&c, HANZOD), service(&c, STANDBY));
    for key in ["build", "image", "env_file"] {
        assert_eq!(
            a.get(key),
            b.get(key),
            "{COMPOSE}: {HANZOD} and {STANDBY} differ in {key}: replicas run the same image \
             with the same configuration"
        );
    }
    let build = a.get("build").expect("build");
    let (context, dockerfile) = match build {
        Value::String(s) => (s.clone(), "Dockerfile".to_string()),
        m => (
            m.get("context")
                .and_then(text)
                .unwrap_or_else(|| ".".into()),
            m.get("dockerfile")
                .and_then(text)
                .unwrap_or_else(|| "Dockerfile".into()),
        ),
    };
    assert!(
        root().join(&context).join(&dockerfile).is_file(),
        "{COMPOSE}: {HANZOD}: build {context}/{dockerfile} does not exist"
    );

    let mut ids = BTreeSet::new();
    let mut advertised = BTreeSet::new();
    let mut volumes = BTreeSet::new();
    for svc in [HANZOD, STANDBY] {
        let ctx = format!("{COMPOSE}: service {svc}");
        let (_, Loaded { cfg, .. }) = compose_hanzod(&c, svc);
        assert!(
            !cfg.state.replica_id.is_empty(),
            "{ctx}: HANZOD_REPLICA_ID is not set (each replica needs its own name in the lease)"
        );
        assert!(
            ids.insert(cfg.state.replica_id.clone()),
            "{ctx}: HANZOD_REPLICA_ID {:?} is the other replica's",
            cfg.state.replica_id
        );
        let (host, port) = url_host_port(&format!("{ctx}: HANZOD_ADVERTISE"), &cfg.state.advertise);
        let hostname = service(&c, svc).get("hostname").and_then(text);
        assert!(
            host == *svc || Some(&host) == hostname.as_ref(),
            "{ctx}: HANZOD_ADVERTISE {:?} does not name this service (the other replica would \
             be advertised as this one)",
            cfg.state.advertise
        );
        assert_eq!(
            port,
            port_of(&ctx, &cfg.server.grpc_addr),
            "{ctx}: HANZOD_ADVERTISE's port is not server.grpc_addr's"
        );
        advertised.insert(cfg.state.advertise.clone());
        for (key, dir) in data_dirs(&cfg) {
            let v = volume_at(&c, svc, dir).unwrap_or_else(|| {
                panic!(
                    "{ctx}: {key} ({dir}) is not on a named volume: it would die with \
                     the container"
                )
            });
            volumes.insert(v);
        }
    }
    assert_eq!(
        advertised.len(),
        2,
        "{COMPOSE}: both replicas advertise the same endpoint"
    );
    assert_eq!(
        volumes.len(),
        1,
        "{COMPOSE}: the replicas' data directories are on different volumes ({volumes:?}): a \
         standby that takes over must read the deltas and checkpoints the leader wrote"
    );
}

#[test]
fn compose_ports_and_health_checks_match_the_configuration() {
    let c = compose();
    let mut host_ports = BTreeMap::new();
    for svc in service_names(&c) {
        for (host, _) in published_ports(&c, &svc) {
            if let Some(h) = host {
                if let Some(other) = host_ports.insert(h, svc.clone()) {
                    panic!("{COMPOSE}: host port {h} is published by both {other} and {svc}");
                }
            }
        }
    }
    for svc in [HANZOD, STANDBY] {
        let ctx = format!("{COMPOSE}: service {svc}");
        let (_, Loaded { cfg, .. }) = compose_hanzod(&c, svc);
        let grpc = port_of(&ctx, &cfg.server.grpc_addr);
        let metrics = port_of(&ctx, &cfg.server.metrics_addr);
        let ports = published_ports(&c, svc);
        let container: BTreeSet<u16> = ports.iter().map(|p| p.1).collect();
        assert_eq!(
            container,
            BTreeSet::from([grpc, metrics]),
            "{ctx}: the published container ports are not server.grpc_addr's ({grpc}) and \
             server.metrics_addr's ({metrics})"
        );
        if svc == HANZOD {
            for (host, c_port) in &ports {
                assert_eq!(
                    *host,
                    Some(*c_port),
                    "{ctx}: the leader candidate publishes {c_port} on host port {host:?}; \
                     nodes expect the paper's ports on the host"
                );
            }
        }
        assert_hanzod_health(&ctx, &healthcheck(&c, svc), metrics);
    }
}

/// kv's effective settings: the config file its command names, then `--directive value`
/// arguments.
fn valkey_conf(c: &Value) -> BTreeMap<String, String> {
    let ctx = format!("{COMPOSE}: service kv");
    let args = command(c, "kv");
    assert!(
        args.first().is_some_and(|a| a == "valkey-server"),
        "{ctx}: command {args:?} does not start valkey-server"
    );
    let mut d = BTreeMap::new();
    let mut rest = &args[1..];
    if let Some(path) = rest.first().filter(|a| !a.starts_with("--")) {
        let file = host_file(c, "kv", path)
            .unwrap_or_else(|| panic!("{ctx}: the config file {path} is not bind-mounted"));
        let conf = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{ctx}: {}: {e}", file.display()));
        d = valkey_directives(&file.display().to_string(), &conf);
        rest = &rest[1..];
    }
    while let Some((k, tail)) = rest.split_first() {
        let k = k
            .strip_prefix("--")
            .unwrap_or_else(|| panic!("{ctx}: argument {k:?} is not a --directive"));
        let n = tail.iter().take_while(|a| !a.starts_with("--")).count();
        d.insert(k.to_ascii_lowercase(), tail[..n].join(" "));
        rest = &tail[n..];
    }
    d
}

#[test]
fn compose_valkey_runs_with_an_aof_on_its_volume() {
    let c = compose();
    let ctx = format!("{COMPOSE}: service kv");
    let image = service(&c, "kv")
        .get("image")
        .and_then(text)
        .unwrap_or_default();
    assert!(
        image.starts_with("valkey/valkey:"),
        "{ctx}: image {image:?} is not valkey/valkey"
    );
    let d = valkey_conf(&c);
    assert_valkey_durable(&ctx, &d);
    let dir = d.get("dir").map(String::as_str).unwrap_or("/data");
    assert!(
        volume_at(&c, "kv", dir).is_some(),
        "{ctx}: the AOF directory {dir} is not on a named volume: it would die with the container"
    );
    let words = healthcheck(&c, "kv");
    assert!(
        words
            .windows(2)
            .any(|w| w[0] == "valkey-cli" && w[1] == "ping"),
        "{ctx}: the health check {words:?} is not `valkey-cli ping`"
    );
}

#[test]
fn compose_chain_and_ipfs_match_the_configuration() {
    let c = compose();
    let (_, Loaded { cfg, .. }) = compose_hanzod(&c, HANZOD);
    let ctx = format!("{COMPOSE}: service anvil");
    let args = command(&c, "anvil");
    let entry = strings(service(&c, "anvil").get("entrypoint"));
    assert!(
        entry
            .iter()
            .chain(&args)
            .any(|a| a == "anvil" || a.starts_with("anvil ")),
        "{ctx}: neither entrypoint nor command runs anvil"
    );
    assert_eq!(
        flag(&args, "--chain-id").and_then(|v| v.parse::<u64>().ok()),
        Some(cfg.chain.chain_id),
        "{ctx}: --chain-id is not hanzod's chain.chain_id (HANZO_CHAIN_ID)"
    );
    assert_eq!(
        flag(&args, "--host").as_deref(),
        Some("0.0.0.0"),
        "{ctx}: anvil must listen on --host 0.0.0.0 to be reachable on the compose network"
    );
    if let Some(state) = flag(&args, "--state") {
        assert!(
            volume_at(&c, "anvil", &state).is_some(),
            "{ctx}: --state {state} is not on a named volume"
        );
    }
    let words = healthcheck(&c, "anvil");
    assert!(
        words
            .iter()
            .any(|w| w.contains(&cfg.chain.chain_id.to_string())),
        "{ctx}: the health check {words:?} does not check the chain id {}",
        cfg.chain.chain_id
    );
    let image = service(&c, "ipfs")
        .get("image")
        .and_then(text)
        .unwrap_or_default();
    assert!(
        image.starts_with("ipfs/kubo:"),
        "{COMPOSE}: service ipfs: image {image:?} is not ipfs/kubo"
    );
    assert!(
        !published_ports(&c, "ipfs").iter().any(|p| p.1 == 5001),
        "{COMPOSE}: service ipfs publishes the Kubo RPC API (5001): it is an admin interface"
    );
}

// ---------------------------------------------------------------------------------------
// Dockerfile

struct Instruction {
    keyword: String,
    args: String,
}

fn dockerfile(rel: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in read(rel).lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(body) = t.strip_suffix('\\') {
            pending.push_str(body);
            pending.push(' ');
            continue;
        }
        pending.push_str(t);
        let full = std::mem::take(&mut pending);
        let (k, a) = full.split_once(char::is_whitespace).unwrap_or((&full, ""));
        out.push(Instruction {
            keyword: k.to_ascii_uppercase(),
            args: a.split_whitespace().collect::<Vec<_>>().join(" "),
        });
    }
    out
}

fn exec_form(ctx: &str, args: &str) -> Vec<String> {
    if args.starts_with('[') {
        serde_json::from_str(args).unwrap_or_else(|e| panic!("{ctx}: {args:?}: {e}"))
    } else {
        args.split_whitespace().map(str::to_string).collect()
    }
}

#[test]
fn dockerfile_matches_the_workspace_and_the_configuration() {
    const F: &str = "Dockerfile";
    let ins = dockerfile(F);
    let defaults = load_config(F, None, &BTreeMap::new()).cfg;
    let grpc = port_of(F, &defaults.server.grpc_addr);
    let metrics = port_of(F, &defaults.server.metrics_addr);

    // Stages: (image, alias, instructions).
    let mut stages: Vec<(String, Option<String>, Vec<&Instruction>)> = Vec::new();
    for i in &ins {
        if i.keyword == "FROM" {
            let words: Vec<&str> = i
                .args
                .split_whitespace()
                .filter(|w| !w.starts_with("--"))
                .collect();
            let alias = match words.as_slice() {
                [_, as_, alias] if as_.eq_ignore_ascii_case("as") => Some(alias.to_string()),
                _ => None,
            };
            stages.push((words[0].to_string(), alias, Vec::new()));
        } else if let Some(s) = stages.last_mut() {
            s.2.push(i);
        }
    }
    assert!(
        stages.len() >= 2,
        "{F}: a multi-stage build (builder, runtime) is expected"
    );
    let builder = stages
        .iter()
        .find(|s| {
            s.2.iter()
                .any(|i| i.keyword == "RUN" && i.args.contains("cargo build"))
        })
        .unwrap_or_else(|| panic!("{F}: no stage runs cargo build"));
    let build = builder
        .2
        .iter()
        .find(|i| i.keyword == "RUN" && i.args.contains("cargo build"))
        .unwrap();
    for arg in ["--release", "--locked", "--bin hanzod"] {
        assert!(
            build.args.contains(arg),
            "{F}: `{}` lacks {arg}",
            build.args
        );
    }
    let cargo = cargo_toml();
    let rust_version = cargo
        .get("workspace")
        .and_then(|w| w.get("package"))
        .or_else(|| cargo.get("package"))
        .and_then(|p| p.get("rust-version"))
        .and_then(|v| v.as_str())
        .expect("Cargo.toml: rust-version");
    let (image, tag) = builder.0.split_once(':').unwrap_or((&builder.0, ""));
    assert!(
        image == "rust" || image.ends_with("/rust"),
        "{F}: the builder image {} is not the Rust image",
        builder.0
    );
    assert!(
        tag == rust_version
            || tag.starts_with(&format!("{rust_version}-"))
            || tag.starts_with(&format!("{rust_version}.")),
        "{F}: the builder is {}, but Cargo.toml's rust-version is {rust_version}",
        builder.0
    );

    let runtime = stages.last().unwrap();
    assert_eq!(
        runtime.0, "debian:bookworm-slim",
        "{F}: the runtime image should be debian:bookworm-slim"
    );
    let codename = runtime
        .0
        .split(':')
        .nth(1)
        .unwrap()
        .split('-')
        .next()
        .unwrap();
    assert!(
        tag.contains(codename),
        "{F}: the builder ({}) is not Debian {codename} like the runtime: the binary would \
         link against another glibc",
        builder.0
    );
    let last = |k: &str| {
        runtime
            .2
            .iter()
            .rev()
            .find(|i| i.keyword == k)
            .map(|i| i.args.clone())
    };
    let user = last("USER")
        .unwrap_or_else(|| panic!("{F}: the runtime stage sets no USER (runs as root)"));
    let user_name = user.split(':').next().unwrap_or_default();
    assert!(
        user_name != "root" && user_name != "0",
        "{F}: the runtime stage runs as {user}; use a non-root user"
    );
    let copy = runtime
        .2
        .iter()
        .find(|i| {
            i.keyword == "COPY"
                && builder
                    .1
                    .as_ref()
                    .is_some_and(|a| i.args.contains(&format!("--from={a}")))
        })
        .unwrap_or_else(|| panic!("{F}: the runtime stage copies nothing from the builder"));
    let dest = copy.args.split_whitespace().last().unwrap_or_default();
    assert!(
        dest == "/usr/local/bin/hanzod" || dest == "/usr/local/bin/",
        "{F}: the binary is copied to {dest}, not /usr/local/bin/hanzod (on PATH for \
         ENTRYPOINT [\"hanzod\"])"
    );
    let exposed: BTreeSet<u16> = runtime
        .2
        .iter()
        .filter(|i| i.keyword == "EXPOSE")
        .flat_map(|i| i.args.split_whitespace())
        .map(|p| p.split('/').next().unwrap().parse().expect("EXPOSE port"))
        .collect();
    assert_eq!(
        exposed,
        BTreeSet::from([grpc, metrics]),
        "{F}: EXPOSE is not the default server.grpc_addr ({grpc}) and server.metrics_addr \
         ({metrics}) ports"
    );
    assert_eq!(
        exec_form(F, &last("ENTRYPOINT").unwrap_or_default()),
        ["hanzod"],
        "{F}: ENTRYPOINT"
    );
    assert_eq!(
        exec_form(F, &last("CMD").unwrap_or_default()),
        ["serve"],
        "{F}: CMD"
    );
    let health = last("HEALTHCHECK").unwrap_or_else(|| panic!("{F}: no HEALTHCHECK"));
    let cmd = health
        .split_once("CMD ")
        .unwrap_or_else(|| panic!("{F}: HEALTHCHECK {health:?} has no CMD"))
        .1;
    assert_hanzod_health(&format!("{F}: HEALTHCHECK"), &exec_form(F, cmd), metrics);
}

/// Whether a `.dockerignore` pattern (`*`, `?`, `**`) matches a path.
fn glob(pattern: &[&str], path: &[&str]) -> bool {
    fn segment(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => segment(&p[1..], s) || (!s.is_empty() && segment(p, &s[1..])),
            (Some(b'?'), Some(_)) => segment(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => segment(&p[1..], &s[1..]),
            _ => false,
        }
    }
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(&"**"), _) => {
            glob(&pattern[1..], path) || (!path.is_empty() && glob(pattern, &path[1..]))
        }
        (Some(p), Some(s)) => {
            segment(p.as_bytes(), s.as_bytes()) && glob(&pattern[1..], &path[1..])
        }
        _ => false,
    }
}

/// Whether `.dockerignore` keeps `path` out of the build context (the path or a folder
/// above it matches; the last matching pattern, `!` negations included, decides).
fn docker_ignored(patterns: &[String], path: &str) -> bool {
    let parts: Vec<&str> = path.split('/').collect();
    let mut ignored = false;
    for p in patterns {
        let (negated, p) = match p.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, p.as_str()),
        };
        let pat: Vec<&str> = p
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        if (1..=parts.len()).any(|n| glob(&pat, &parts[..n])) {
            ignored = !negated;
        }
    }
    ignored
}

#[test]
fn dockerignore_excludes_build_output_but_not_what_the_build_reads() {
    const F: &str = ".dockerignore";
    let patterns: Vec<String> = read(F)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    for out in ["target", "target/release/hanzod", "fuzz", ".git"] {
        assert!(
            docker_ignored(&patterns, out),
            "{F}: {out} is sent to the Docker daemon (build output or history, GBs)"
        );
    }
    // What `cargo build --locked --bin hanzod` reads: the manifests and lock file, every
    // workspace member, the embedded defaults, and every declared bench (cargo checks that
    // their files exist when it reads the manifest).
    let cargo = cargo_toml();
    let mut needed: Vec<String> = vec![
        "Cargo.toml".into(),
        "Cargo.lock".into(),
        "src/main.rs".into(),
        "src/lib.rs".into(),
        "config/default.toml".into(),
    ];
    let members = cargo["workspace"]["members"]
        .as_array()
        .expect("workspace.members");
    // A member may be a glob (`crates/*`): every folder it names.
    let members: Vec<String> = members
        .iter()
        .filter_map(|m| m.as_str())
        .flat_map(|m| match m.strip_suffix("/*") {
            Some(dir) => {
                let mut found: Vec<String> = std::fs::read_dir(root().join(dir))
                    .unwrap_or_else(|e| panic!("{dir}: {e}"))
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().join("Cargo.toml").exists())
                    .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
                    .collect();
                found.sort();
                assert!(!found.is_empty(), "{m} names no crate (test out of date)");
                found
            }
            None => vec![m.to_string()],
        })
        .collect();
    // The declared test targets' files (cargo reads their paths with the manifest).
    needed.push("tests/main.rs".into());
    for m in &members {
        needed.push(format!("{m}/Cargo.toml"));
        needed.push(format!("{m}/src/lib.rs"));
        if root().join(m).join("build.rs").exists() {
            needed.push(format!("{m}/build.rs"));
        }
    }
    for b in cargo
        .get("bench")
        .and_then(|b| b.as_array())
        .into_iter()
        .flatten()
    {
        let name = b["name"].as_str().expect("bench name");
        needed.push(format!("benches/{name}.rs"));
    }
    for path in &needed {
        assert!(
            root().join(path).exists(),
            "{path} does not exist (test out of date)"
        );
        assert!(
            !docker_ignored(&patterns, path),
            "{F}: {path} is excluded from the build context, but the Docker build needs it"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Kubernetes

const K8S: &str = "deploy/k8s";
/// The Secret template: not applied with the rest (re-applying would overwrite the real one).
const SECRET_TEMPLATE: &str = "deploy/k8s/secret.yaml.example";

/// Every object of every manifest, with the file it came from.
fn k8s_docs() -> Vec<(String, Value)> {
    let mut files: Vec<String> = std::fs::read_dir(root().join(K8S))
        .unwrap_or_else(|e| panic!("{K8S}: {e}"))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .map(|n| format!("{K8S}/{n}"))
        .collect();
    files.sort();
    files.push(SECRET_TEMPLATE.to_string());
    let mut out = Vec::new();
    for f in files {
        for d in yaml_docs(&f) {
            out.push((f.clone(), d));
        }
    }
    out
}

fn kind(v: &Value) -> &str {
    v.get("kind").and_then(Value::as_str).unwrap_or_default()
}

fn name(v: &Value) -> &str {
    v.get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn find<'a>(docs: &'a [(String, Value)], k: &str, n: &str) -> Option<&'a Value> {
    docs.iter()
        .map(|d| &d.1)
        .find(|d| kind(d) == k && name(d) == n)
}

fn labels(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_mapping)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
                .collect()
        })
        .unwrap_or_default()
}

fn pod_spec(workload: &Value) -> &Value {
    workload
        .get("spec")
        .and_then(|s| s.get("template"))
        .and_then(|t| t.get("spec"))
        .unwrap_or_else(|| {
            panic!(
                "{} {}: no spec.template.spec",
                kind(workload),
                name(workload)
            )
        })
}

fn pod_labels(workload: &Value) -> BTreeMap<String, String> {
    labels(
        workload
            .get("spec")
            .and_then(|s| s.get("template"))
            .and_then(|t| t.get("metadata"))
            .and_then(|m| m.get("labels")),
    )
}

fn seq(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_sequence)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn workloads(docs: &[(String, Value)]) -> impl Iterator<Item = &(String, Value)> {
    docs.iter()
        .filter(|d| matches!(kind(&d.1), "StatefulSet" | "Deployment" | "DaemonSet"))
}

/// A container port (named or numeric) as a number.
fn container_port(ctx: &str, container: &Value, port: &Value) -> u16 {
    let ports = seq(container.get("ports"));
    match port {
        Value::String(n) => ports
            .iter()
            .find(|p| p.get("name").and_then(Value::as_str) == Some(n))
            .and_then(|p| p.get("containerPort"))
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("{ctx}: no container port named {n:?}"))
            as u16,
        other => other
            .as_u64()
            .unwrap_or_else(|| panic!("{ctx}: port {other:?}")) as u16,
    }
}

/// The text of a file in a container: a ConfigMap key mounted at it (or at a folder above).
fn mounted_file(
    docs: &[(String, Value)],
    pod: &Value,
    container: &Value,
    path: &str,
) -> Option<String> {
    for m in seq(container.get("volumeMounts")) {
        let mount_path = m.get("mountPath").and_then(Value::as_str)?;
        let sub = m.get("subPath").and_then(Value::as_str).unwrap_or_default();
        let key = if !sub.is_empty() {
            (path == mount_path).then(|| sub.to_string())
        } else {
            Path::new(path)
                .strip_prefix(mount_path)
                .ok()
                .map(|r| r.to_string_lossy().into_owned())
                .filter(|r| !r.is_empty())
        };
        let Some(key) = key else { continue };
        let vol_name = m.get("name").and_then(Value::as_str)?;
        let vol = seq(pod.get("volumes"))
            .iter()
            .find(|v| v.get("name").and_then(Value::as_str) == Some(vol_name))?;
        let cm = vol.get("configMap")?;
        let key = seq(cm.get("items"))
            .iter()
            .find(|i| i.get("path").and_then(Value::as_str) == Some(&key))
            .and_then(|i| i.get("key").and_then(text))
            .unwrap_or(key);
        let cm_name = cm.get("name").and_then(Value::as_str)?;
        return find(docs, "ConfigMap", cm_name)?
            .get("data")?
            .get(key.as_str())
            .and_then(text);
    }
    None
}

/// A container's environment as the kubelet builds it for pod `pod_name`: `$(VAR)`
/// expanded, field references, Secret keys (test values, the key must be in the template)
/// and ConfigMap keys resolved. Also returns the variables only referenced by others.
fn k8s_env(
    ctx: &str,
    docs: &[(String, Value)],
    container: &Value,
    pod_name: &str,
    namespace: &str,
) -> (BTreeMap<String, String>, BTreeSet<String>) {
    assert!(
        container.get("envFrom").is_none(),
        "{ctx}: envFrom is not read by tests/deploy.rs; list variables under env"
    );
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let mut referenced = BTreeSet::new();
    for e in seq(container.get("env")) {
        let var = e.get("name").and_then(text).unwrap_or_default();
        let value =
            if let Some(v) = e.get("value") {
                let v = text(v).unwrap_or_default();
                // $(VAR) refers to a variable defined earlier; $$ escapes.
                let mut out = String::new();
                let mut rest = v.as_str();
                while let Some(i) = rest.find('$') {
                    out.push_str(&rest[..i]);
                    let after = &rest[i + 1..];
                    if let Some(r) = after.strip_prefix('$') {
                        out.push('$');
                        rest = r;
                    } else if let Some((name, r)) =
                        after.strip_prefix('(').and_then(|a| a.split_once(')'))
                    {
                        let value = env.get(name).cloned().unwrap_or_else(|| {
                            panic!(
                                "{ctx}: {var} refers to $({name}), which is not defined before it"
                            )
                        });
                        referenced.insert(name.to_string());
                        out.push_str(&value);
                        rest = r;
                    } else {
                        out.push('$');
                        rest = after;
                    }
                }
                out.push_str(rest);
                out
            } else {
                let from = e
                    .get("valueFrom")
                    .unwrap_or_else(|| panic!("{ctx}: env {var} has neither value nor valueFrom"));
                if let Some(f) = from.get("fieldRef") {
                    match f.get("fieldPath").and_then(Value::as_str) {
                        Some("metadata.name") => pod_name.to_string(),
                        Some("metadata.namespace") => namespace.to_string(),
                        other => {
                            panic!("{ctx}: env {var}: fieldRef {other:?} is not read by this test")
                        }
                    }
                } else if let Some(s) = from.get("secretKeyRef") {
                    let (sn, key) = (
                        s.get("name").and_then(text).unwrap_or_default(),
                        s.get("key").and_then(text).unwrap_or_default(),
                    );
                    let secret = find(docs, "Secret", &sn).unwrap_or_else(|| {
                        panic!(
                            "{ctx}: env {var} reads Secret {sn:?}, which {SECRET_TEMPLATE} \
                         does not define"
                        )
                    });
                    assert!(
                    secret.get("stringData").and_then(|d| d.get(key.as_str())).is_some()
                        || secret.get("data").and_then(|d| d.get(key.as_str())).is_some(),
                    "{ctx}: env {var} reads key {key:?} of Secret {sn}, which {SECRET_TEMPLATE} \
                     lacks"
                );
                    match key.as_str() {
                        "ORCHESTRATOR_KEY" => "b2".repeat(32),
                        _ => format!("test-{}", key.to_ascii_lowercase()),
                    }
                } else if let Some(r) = from.get("configMapKeyRef") {
                    let (cn, key) = (
                        r.get("name").and_then(text).unwrap_or_default(),
                        r.get("key").and_then(text).unwrap_or_default(),
                    );
                    find(docs, "ConfigMap", &cn)
                        .and_then(|c| c.get("data"))
                        .and_then(|d| d.get(key.as_str()))
                        .and_then(text)
                        .unwrap_or_else(|| {
                            panic!("{ctx}: env {var}: ConfigMap {cn} has no key {key}")
                        })
                } else {
                    panic!("{ctx}: env {var}: valueFrom {from:?} is not read by this test")
                }
            };
        assert!(
            env.insert(var.clone(), value).is_none(),
            "{ctx}: env {var} is set twice"
        );
    }
    let helpers = referenced
        .into_iter()
        .filter(|r| !r.starts_with("HANZO"))
        .collect();
    (env, helpers)
}

/// The hanzod StatefulSet, its container, and the configuration replica `hanzod-0` loads.
struct K8sHanzod {
    docs: Vec<(String, Value)>,
    sts: Value,
    container: Value,
    env: BTreeMap<String, String>,
    loaded: Loaded,
}

fn k8s_hanzod() -> K8sHanzod {
    let docs = k8s_docs();
    let sts = find(&docs, "StatefulSet", "hanzod")
        .unwrap_or_else(|| panic!("{K8S}: no StatefulSet hanzod"))
        .clone();
    let ctx = format!("{K8S}: StatefulSet hanzod");
    let pod = pod_spec(&sts);
    let container = seq(pod.get("containers"))
        .iter()
        .find(|c| c.get("name").and_then(Value::as_str) == Some("hanzod"))
        .unwrap_or_else(|| panic!("{ctx}: no container named hanzod"))
        .clone();
    let namespace = sts["metadata"]["namespace"].as_str().unwrap_or("default");
    let (env, helpers) = k8s_env(&ctx, &docs, &container, "hanzod-0", namespace);
    // One file per call: the tests run in parallel.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deploy-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = env.get("HANZOD_CONFIG").map(|p| {
        let text = mounted_file(&docs, pod, &container, p).unwrap_or_else(|| {
            panic!("{ctx}: HANZOD_CONFIG={p} is not a ConfigMap key mounted in the container")
        });
        let f = dir.join("hanzod.toml");
        std::fs::write(&f, text).unwrap();
        f
    });
    let loaded = load_config(
        &format!("{ctx} (ConfigMap hanzod.toml and env)"),
        file.as_deref(),
        &env,
    );
    assert_every_variable_is_read(&ctx, &env, &loaded.asked, &helpers);
    K8sHanzod {
        docs,
        sts,
        container,
        env,
        loaded,
    }
}

fn quantity(v: Option<&Value>) -> String {
    v.and_then(text).unwrap_or_default()
}

#[test]
fn k8s_manifests_are_well_formed_and_reference_each_other() {
    let docs = k8s_docs();
    // kustomization.yaml lists every manifest, and no Secret (re-applying must not
    // overwrite the real one).
    let kust = docs
        .iter()
        .find(|d| kind(&d.1) == "Kustomization")
        .unwrap_or_else(|| panic!("{K8S}: no kustomization.yaml"));
    let resources: BTreeSet<String> = strings(kust.1.get("resources")).into_iter().collect();
    let manifests: BTreeSet<String> = docs
        .iter()
        .filter(|d| kind(&d.1) != "Kustomization" && d.0 != SECRET_TEMPLATE)
        .map(|d| d.0.trim_start_matches(&format!("{K8S}/")).to_string())
        .collect();
    assert_eq!(
        resources, manifests,
        "{}: resources are not the manifests of {K8S}",
        kust.0
    );
    for (f, d) in docs.iter().filter(|d| d.0 != SECRET_TEMPLATE) {
        assert_ne!(
            kind(d),
            "Secret",
            "{f}: defines a Secret; applying the manifests would overwrite the real one \
             (keep it in {SECRET_TEMPLATE})"
        );
    }
    let namespace = docs
        .iter()
        .find(|d| kind(&d.1) == "Namespace")
        .map(|d| name(&d.1).to_string())
        .unwrap_or_else(|| panic!("{K8S}: no Namespace"));
    for (f, d) in &docs {
        if matches!(kind(d), "Namespace" | "Kustomization") {
            continue;
        }
        assert!(
            d.get("apiVersion").is_some() && !name(d).is_empty(),
            "{f}: an object without apiVersion or metadata.name"
        );
        assert_eq!(
            d["metadata"]["namespace"].as_str(),
            Some(namespace.as_str()),
            "{f}: {} {} is not in namespace {namespace}",
            kind(d),
            name(d)
        );
    }
    // Services select pods that exist, and their target ports are those pods' ports.
    for (f, svc) in docs.iter().filter(|d| kind(&d.1) == "Service") {
        let ctx = format!("{f}: Service {}", name(svc));
        let selector = labels(svc.get("spec").and_then(|s| s.get("selector")));
        let targets: Vec<&Value> = workloads(&docs)
            .map(|w| &w.1)
            .filter(|w| {
                let l = pod_labels(w);
                !selector.is_empty() && selector.iter().all(|(k, v)| l.get(k) == Some(v))
            })
            .collect();
        assert!(
            !targets.is_empty(),
            "{ctx}: selector {selector:?} matches no workload's pods"
        );
        for w in targets {
            for p in seq(svc["spec"].get("ports")) {
                let target = p.get("targetPort").or_else(|| p.get("port")).unwrap();
                let found = seq(pod_spec(w).get("containers")).iter().any(|c| {
                    seq(c.get("ports")).iter().any(|cp| match target {
                        Value::String(n) => cp.get("name").and_then(Value::as_str) == Some(n),
                        num => cp.get("containerPort") == Some(num),
                    })
                });
                assert!(
                    found,
                    "{ctx}: targetPort {target:?} is not a port of {} {}'s containers",
                    kind(w),
                    name(w)
                );
            }
        }
    }
    for (f, w) in workloads(&docs) {
        let ctx = format!("{f}: {} {}", kind(w), name(w));
        let selector = labels(w["spec"]["selector"].get("matchLabels"));
        let l = pod_labels(w);
        assert!(
            !selector.is_empty() && selector.iter().all(|(k, v)| l.get(k) == Some(v)),
            "{ctx}: selector {selector:?} does not match its pod labels {l:?}"
        );
        if kind(w) == "StatefulSet" {
            let governing = w["spec"]["serviceName"].as_str().unwrap_or_default();
            let svc = find(&docs, "Service", governing)
                .unwrap_or_else(|| panic!("{ctx}: serviceName {governing:?} is not a Service"));
            assert_eq!(
                svc["spec"]["clusterIP"].as_str(),
                Some("None"),
                "{ctx}: its serviceName {governing} must be a headless Service (clusterIP: None)"
            );
        }
        let pod = pod_spec(w);
        let templates: BTreeSet<String> = seq(w["spec"].get("volumeClaimTemplates"))
            .iter()
            .map(|t| name(t).to_string())
            .collect();
        for v in seq(pod.get("volumes")) {
            let vn = v["name"].as_str().unwrap_or_default();
            if let Some(cm) = v.get("configMap") {
                let cm_name = cm["name"].as_str().unwrap_or_default();
                let cm_doc = find(&docs, "ConfigMap", cm_name)
                    .unwrap_or_else(|| panic!("{ctx}: volume {vn}: no ConfigMap {cm_name:?}"));
                for item in seq(cm.get("items")) {
                    let key = item["key"].as_str().unwrap_or_default();
                    assert!(
                        cm_doc["data"].get(key).is_some(),
                        "{ctx}: volume {vn}: ConfigMap {cm_name} has no key {key:?}"
                    );
                }
            }
            if let Some(pvc) = v.get("persistentVolumeClaim") {
                let claim = pvc["claimName"].as_str().unwrap_or_default();
                assert!(
                    find(&docs, "PersistentVolumeClaim", claim).is_some(),
                    "{ctx}: volume {vn}: no PersistentVolumeClaim {claim:?}"
                );
            }
        }
        let volumes: BTreeSet<String> = seq(pod.get("volumes"))
            .iter()
            .filter_map(|v| v["name"].as_str().map(str::to_string))
            .collect();
        for c in seq(pod.get("containers")) {
            for m in seq(c.get("volumeMounts")) {
                let vn = m["name"].as_str().unwrap_or_default().to_string();
                assert!(
                    volumes.contains(&vn) || templates.contains(&vn),
                    "{ctx}: container {}: volumeMount {vn:?} names no volume or \
                     volumeClaimTemplate",
                    c["name"].as_str().unwrap_or_default()
                );
            }
            // Every variable resolves (Secret keys in the template, $(VAR) defined first).
            k8s_env(&ctx, &docs, c, &format!("{}-0", name(w)), &namespace);
        }
    }
}

#[test]
fn k8s_hanzod_statefulset_matches_the_paper_and_the_configuration() {
    let K8sHanzod {
        docs,
        sts,
        container,
        loaded,
        ..
    } = k8s_hanzod();
    let cfg = &loaded.cfg;
    let ctx = format!("{K8S}: StatefulSet hanzod");
    assert_eq!(
        sts["spec"]["replicas"].as_u64(),
        Some(3),
        "{ctx}: spec.replicas must be 3 (paper §9.2: active–passive, three replicas)"
    );
    let requests = &container["resources"]["requests"];
    assert_eq!(
        quantity(requests.get("cpu")),
        "4",
        "{ctx}: resources.requests.cpu must be 4 (paper §9.2)"
    );
    assert_eq!(
        quantity(requests.get("memory")),
        "8Gi",
        "{ctx}: resources.requests.memory must be 8Gi (paper §9.2)"
    );
    assert_eq!(
        sts["spec"]["podManagementPolicy"].as_str(),
        Some("Parallel"),
        "{ctx}: podManagementPolicy must be Parallel: standbys are never ready, and \
         OrderedReady would never start the replicas after the first standby"
    );
    assert_ne!(
        sts["spec"]["updateStrategy"]["type"]
            .as_str()
            .unwrap_or("RollingUpdate"),
        "RollingUpdate",
        "{ctx}: a RollingUpdate waits for each updated pod to turn ready, which a standby \
         never does: the rollout would stall"
    );
    let grpc = port_of(&ctx, &cfg.server.grpc_addr);
    let metrics = port_of(&ctx, &cfg.server.metrics_addr);
    let ports: BTreeSet<u16> = seq(container.get("ports"))
        .iter()
        .filter_map(|p| p["containerPort"].as_u64().map(|p| p as u16))
        .collect();
    assert_eq!(
        ports,
        BTreeSet::from([grpc, metrics]),
        "{ctx}: containerPorts are not server.grpc_addr's ({grpc}) and \
         server.metrics_addr's ({metrics})"
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = container
            .get(probe)
            .and_then(|p| p.get("httpGet"))
            .unwrap_or_else(|| panic!("{ctx}: no {probe}.httpGet"));
        assert_eq!(
            get["path"].as_str(),
            Some(path),
            "{ctx}: {probe} must GET {path}"
        );
        assert_eq!(
            container_port(&format!("{ctx}: {probe}"), &container, &get["port"]),
            metrics,
            "{ctx}: {probe} does not probe server.metrics_addr's port"
        );
    }
    // The Service that clients and the ingress use: the paper's ports, onto the container's.
    let svc =
        find(&docs, "Service", "hanzod").unwrap_or_else(|| panic!("{K8S}: no Service hanzod"));
    let sctx = format!("{K8S}: Service hanzod");
    assert_ne!(
        svc["spec"]["clusterIP"].as_str(),
        Some("None"),
        "{sctx}: must be a ClusterIP Service (routes to ready pods: the leader)"
    );
    let mut targets = BTreeSet::new();
    for p in seq(svc["spec"].get("ports")) {
        let port = p["port"].as_u64().unwrap_or_default() as u16;
        let target = container_port(&sctx, &container, p.get("targetPort").unwrap_or(&p["port"]));
        assert_eq!(
            port, target,
            "{sctx}: port {port} forwards to container port {target}"
        );
        targets.insert(target);
    }
    assert_eq!(
        targets,
        BTreeSet::from([grpc, metrics]),
        "{sctx}: targetPorts are not the gRPC and metrics ports"
    );
    let governing = sts["spec"]["serviceName"].as_str().unwrap_or_default();
    let headless = find(&docs, "Service", governing).unwrap();
    assert_eq!(
        headless["spec"]["publishNotReadyAddresses"].as_bool(),
        Some(true),
        "{K8S}: Service {governing}: publishNotReadyAddresses must be true, or the standbys \
         (never ready) have no DNS name to advertise"
    );
}

#[test]
fn k8s_hanzod_environment_and_configmap_load() {
    let K8sHanzod {
        docs,
        sts,
        container,
        env,
        loaded,
    } = k8s_hanzod();
    let cfg = &loaded.cfg;
    let ctx = format!("{K8S}: StatefulSet hanzod");
    assert_refused_adapters_off(&ctx, cfg);
    assert!(
        cfg.state.require_aof && cfg.state.wait_fsync,
        "{ctx}: state.require_aof and state.wait_fsync must stay on in a deployment"
    );
    assert_eq!(
        cfg.state.replica_id, "hanzod-0",
        "{ctx}: HANZOD_REPLICA_ID must be the pod name (fieldRef metadata.name): stable, and \
         distinct per replica"
    );
    let namespace = sts["metadata"]["namespace"].as_str().unwrap_or_default();
    let governing = sts["spec"]["serviceName"].as_str().unwrap_or_default();
    let (host, port) = url_host_port(&format!("{ctx}: HANZOD_ADVERTISE"), &cfg.state.advertise);
    let expected = format!("hanzod-0.{governing}.{namespace}.svc");
    assert!(
        host == expected || host.starts_with(&format!("{expected}.")),
        "{ctx}: HANZOD_ADVERTISE {:?} is not the pod's DNS name under the headless Service \
         ({expected})",
        cfg.state.advertise
    );
    assert_eq!(
        port,
        port_of(&ctx, &cfg.server.grpc_addr),
        "{ctx}: HANZOD_ADVERTISE's port is not server.grpc_addr's"
    );
    assert_eq!(
        cfg.orchestrator.key,
        "b2".repeat(32),
        "{ctx}: ORCHESTRATOR_KEY does not come from the Secret"
    );
    // VALKEY_URL names a Service in front of Valkey, on its port.
    let (host, port) = url_host_port(&format!("{ctx}: VALKEY_URL"), &cfg.state.valkey_url);
    let svc_name = host.split('.').next().unwrap_or_default();
    let svc = find(&docs, "Service", svc_name).unwrap_or_else(|| {
        panic!("{ctx}: VALKEY_URL names {host}, which is not a Service of {K8S}")
    });
    assert!(
        seq(svc["spec"].get("ports"))
            .iter()
            .any(|p| p["port"].as_u64() == Some(port as u64)),
        "{ctx}: VALKEY_URL's port {port} is not a port of Service {svc_name}"
    );
    let selector = labels(svc["spec"].get("selector"));
    let kv = workloads(&docs)
        .map(|w| &w.1)
        .find(|w| {
            selector
                .iter()
                .all(|(k, v)| pod_labels(w).get(k) == Some(v))
        })
        .unwrap_or_else(|| panic!("{K8S}: Service {svc_name} selects no workload"));
    assert!(
        seq(pod_spec(kv).get("containers"))
            .iter()
            .any(|c| c["image"]
                .as_str()
                .is_some_and(|i| i.starts_with("valkey/valkey:"))),
        "{ctx}: VALKEY_URL's Service {svc_name} does not front a valkey/valkey container"
    );
    // The configuration file is the ConfigMap mounted read-only.
    let path = env
        .get("HANZOD_CONFIG")
        .unwrap_or_else(|| panic!("{ctx}: HANZOD_CONFIG is not set"));
    assert!(
        seq(container.get("volumeMounts"))
            .iter()
            .any(|m| m["readOnly"].as_bool() == Some(true)
                && Path::new(path).starts_with(m["mountPath"].as_str().unwrap_or("?"))),
        "{ctx}: HANZOD_CONFIG={path} is not on a read-only mount"
    );
}

#[test]
fn k8s_delta_cache_is_100gi_shared_and_holds_every_store() {
    let K8sHanzod {
        docs,
        sts,
        container,
        loaded,
        ..
    } = k8s_hanzod();
    let cfg = &loaded.cfg;
    let ctx = format!("{K8S}: StatefulSet hanzod");
    let pod = pod_spec(&sts);
    let mount_of = |key: &str, dir: &str| -> String {
        assert!(
            dir.starts_with('/'),
            "{ctx}: {key} is {dir:?}: not a directory on a volume"
        );
        seq(container.get("volumeMounts"))
            .iter()
            .filter(|m| Path::new(dir).starts_with(m["mountPath"].as_str().unwrap_or("?")))
            .max_by_key(|m| m["mountPath"].as_str().unwrap_or_default().len())
            .and_then(|m| m["name"].as_str())
            .unwrap_or_else(|| panic!("{ctx}: {key} ({dir}) is not on a mounted volume"))
            .to_string()
    };
    let volume = mount_of("deltas.store_dir", &cfg.deltas.store_dir);
    for (key, dir) in data_dirs(cfg) {
        assert_eq!(
            mount_of(key, dir),
            volume,
            "{ctx}: {key} ({dir}) is not on the delta-cache volume with deltas.store_dir"
        );
    }
    let claim = seq(pod.get("volumes"))
        .iter()
        .find(|v| v["name"].as_str() == Some(volume.as_str()))
        .and_then(|v| v.get("persistentVolumeClaim"))
        .and_then(|p| p["claimName"].as_str())
        .and_then(|c| find(&docs, "PersistentVolumeClaim", c));
    let template = seq(sts["spec"].get("volumeClaimTemplates"))
        .iter()
        .find(|t| name(t) == volume);
    let (spec, shared) = match (claim, template) {
        (Some(c), _) => (&c["spec"], true),
        (None, Some(t)) => (&t["spec"], false),
        (None, None) => {
            panic!("{ctx}: volume {volume} (deltas.store_dir) is not a PersistentVolumeClaim")
        }
    };
    assert_eq!(
        quantity(spec["resources"]["requests"].get("storage")),
        "100Gi",
        "{ctx}: the delta cache ({volume}) must request 100Gi (paper §9.2)"
    );
    let modes = strings(spec.get("accessModes"));
    assert!(
        shared && modes.iter().any(|m| m == "ReadWriteMany"),
        "{ctx}: the delta cache ({volume}) is {} with accessModes {modes:?}: a standby that \
         takes over must read the deltas and checkpoints the leader wrote, so all replicas \
         need one ReadWriteMany claim",
        if shared {
            "one claim"
        } else {
            "a claim per pod"
        }
    );
}

#[test]
fn k8s_valkey_runs_with_the_same_aof_settings_as_compose() {
    let docs = k8s_docs();
    let sts =
        find(&docs, "StatefulSet", "kv").unwrap_or_else(|| panic!("{K8S}: no StatefulSet kv"));
    let ctx = format!("{K8S}: StatefulSet kv");
    let pod = pod_spec(sts);
    let container = seq(pod.get("containers"))
        .iter()
        .find(|c| {
            c["image"]
                .as_str()
                .is_some_and(|i| i.starts_with("valkey/valkey:"))
        })
        .unwrap_or_else(|| panic!("{ctx}: no valkey/valkey container"));
    let args: Vec<String> = strings(container.get("command"))
        .into_iter()
        .chain(strings(container.get("args")))
        .collect();
    let path = args
        .iter()
        .skip_while(|a| *a != "valkey-server")
        .nth(1)
        .unwrap_or_else(|| panic!("{ctx}: command {args:?} names no valkey-server config file"));
    let conf = mounted_file(&docs, pod, container, path)
        .unwrap_or_else(|| panic!("{ctx}: {path} is not a mounted ConfigMap key"));
    let d = valkey_directives(&format!("{ctx}: {path}"), &conf);
    assert_valkey_durable(&format!("{ctx}: {path}"), &d);
    let compose_conf = valkey_conf(&compose());
    assert_eq!(
        d, compose_conf,
        "{ctx}: {path} and compose's kv settings (config/compose/valkey.conf) differ"
    );
    let dir = d.get("dir").map(String::as_str).unwrap_or("/data");
    let on_claim = seq(container.get("volumeMounts")).iter().any(|m| {
        m["mountPath"].as_str() == Some(dir)
            && seq(sts["spec"].get("volumeClaimTemplates"))
                .iter()
                .any(|t| Some(name(t)) == m["name"].as_str())
    });
    assert!(
        on_claim,
        "{ctx}: the AOF directory {dir} is not on a volumeClaimTemplate"
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        let cmd = strings(
            container
                .get(probe)
                .and_then(|p| p.get("exec"))
                .and_then(|e| e.get("command")),
        );
        assert_eq!(
            cmd,
            ["valkey-cli", "ping"],
            "{ctx}: {probe} is not `valkey-cli ping`"
        );
    }
}

#[test]
fn k8s_image_is_this_version_and_the_secret_template_holds_no_secret() {
    let K8sHanzod {
        docs, container, ..
    } = k8s_hanzod();
    let image = container["image"].as_str().unwrap_or_default();
    let tag = image.rsplit_once(':').map(|t| t.1).unwrap_or("latest");
    assert_eq!(
        tag,
        env!("CARGO_PKG_VERSION"),
        "{K8S}: StatefulSet hanzod runs {image}, not this release ({}): bump the tag with \
         the version",
        env!("CARGO_PKG_VERSION")
    );
    let secret = find(&docs, "Secret", "hanzod-secrets")
        .unwrap_or_else(|| panic!("{SECRET_TEMPLATE}: no Secret hanzod-secrets"));
    let key = secret["stringData"]["ORCHESTRATOR_KEY"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !(key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit())),
        "{SECRET_TEMPLATE}: ORCHESTRATOR_KEY holds a real-looking key; the template must \
         hold placeholders only"
    );
}
