#!/usr/bin/env bash
# Builds the hanzod contracts and writes the committed artefacts that the Rust bindings read.
#
#   contracts/build.sh            build src/ and (re)write artifacts/*.json
#   contracts/build.sh --check    rebuild in a temporary folder; fail if artifacts/ differs
#   contracts/build.sh --test     run the forge tests (extra arguments go to `forge test`,
#                                 e.g. --test -vv --match-path test/Gas.t.sol)
#
# Needs Node.js and npm only: forge, anvil, solc (solcjs) and OpenZeppelin come from npm at
# the versions pinned in package-lock.json; forge compiles through solc-wrap.js, offline.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

CONTRACTS=(GYMToken MiningPool)
FORGE=node_modules/@foundry-rs/forge-linux-amd64/bin/forge
SOLC="$PWD/solc-wrap.js"

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
}

mode=build
case "${1:-}" in
  "") ;;
  --check) mode=check; shift ;;
  --test) mode=test; shift ;;
  -h | --help) usage; exit 0 ;;
  *) echo "build.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac
if [ "$mode" != test ] && [ $# -gt 0 ]; then
  echo "build.sh: unexpected arguments: $*" >&2
  exit 2
fi

# Install the pinned toolchain when node_modules is missing or older than package-lock.json.
if [ ! -x "$FORGE" ] || [ ! -f node_modules/.package-lock.json ] \
  || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "build.sh: npm not found; install Node.js (>= 18) and npm" >&2
    exit 1
  fi
  echo "build.sh: installing the pinned toolchain (npm ci)" >&2
  npm ci --no-audit --no-fund >&2
fi

# forge build of src/ into $1 (out) with cache $2.
forge_build() {
  "$FORGE" build src --use "$SOLC" --offline --out "$1" --cache-path "$2"
}

# Writes the Foundry-artefact subset that alloy's `sol!` macro reads, for each contract, from
# forge's out folder $1 into folder $2: {"abi", "bytecode": {"object"}, "deployedBytecode": {"object"}}.
extract() {
  node - "$1" "$2" "${CONTRACTS[@]}" <<'JS'
const fs = require('fs');
const path = require('path');
const [out, dest, ...names] = process.argv.slice(2);
fs.mkdirSync(dest, { recursive: true });
for (const name of names) {
  const src = path.join(out, `${name}.sol`, `${name}.json`);
  const a = JSON.parse(fs.readFileSync(src, 'utf8'));
  for (const part of ['bytecode', 'deployedBytecode']) {
    const o = a[part] && a[part].object;
    if (typeof o !== 'string' || !/^0x([0-9a-f]{2})+$/.test(o)) {
      throw new Error(`${src}: ${part}.object is not plain hex bytecode`);
    }
    if (a[part].linkReferences && Object.keys(a[part].linkReferences).length) {
      throw new Error(`${src}: ${part} needs library linking`);
    }
  }
  const subset = {
    abi: a.abi,
    bytecode: { object: a.bytecode.object },
    deployedBytecode: { object: a.deployedBytecode.object },
  };
  fs.writeFileSync(path.join(dest, `${name}.json`), JSON.stringify(subset, null, 2) + '\n');
}
JS
}

case "$mode" in
  build)
    forge_build out cache
    extract out artifacts
    for c in "${CONTRACTS[@]}"; do echo "wrote contracts/artifacts/$c.json"; done
    ;;
  check)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    forge_build "$tmp/out" "$tmp/cache" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; exit 1; }
    extract "$tmp/out" "$tmp/artifacts"
    stale=0
    for c in "${CONTRACTS[@]}"; do
      if [ ! -f "artifacts/$c.json" ]; then
        echo "build.sh --check: contracts/artifacts/$c.json is missing" >&2
        stale=1
      elif ! cmp -s "artifacts/$c.json" "$tmp/artifacts/$c.json"; then
        echo "build.sh --check: contracts/artifacts/$c.json differs from what contracts/src builds to:" >&2
        node -e '
          const fs = require("fs");
          const read = (f) => { try { return JSON.parse(fs.readFileSync(f, "utf8")); } catch (e) { return null; } };
          const [a, b] = [read(process.argv[1]), read(process.argv[2])];
          if (a === null) { console.error("  (the committed file is not valid JSON)"); process.exit(0); }
          const parts = ["abi", "bytecode", "deployedBytecode"]
            .filter((k) => JSON.stringify(a[k]) !== JSON.stringify(b[k]));
          console.error("  differing: " + (parts.length ? parts.join(", ") : "formatting only"));
        ' "artifacts/$c.json" "$tmp/artifacts/$c.json" || true
        stale=1
      fi
    done
    for f in artifacts/*.json; do
      [ -e "$f" ] || continue
      n=$(basename "$f" .json)
      if [[ " ${CONTRACTS[*]} " != *" $n "* ]]; then
        echo "build.sh --check: contracts/$f is not built by build.sh (remove it or add it to CONTRACTS)" >&2
        stale=1
      fi
    done
    if [ "$stale" -ne 0 ]; then
      echo "build.sh --check: FAILED: run contracts/build.sh and commit contracts/artifacts/" >&2
      exit 1
    fi
    echo "build.sh --check: contracts/artifacts/ matches contracts/src"
    ;;
  test)
    exec "$FORGE" test --use "$SOLC" --offline "$@"
    ;;
esac
