#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
// A stand-in for the native `solc` binary, as forge drives it (`--version`, `--standard-json`),
// running the pinned solcjs (npm `solc`, see package.json) so that no compiler download is needed.
// Use: forge build --use ./solc-wrap.js --offline   (build.sh does this)
'use strict';
const fs = require('fs');
const path = require('path');
const solc = require(path.join(__dirname, 'node_modules', 'solc'));

const args = process.argv.slice(2);

if (args.includes('--version')) {
  // solcjs says e.g. "0.8.30+commit.73712a01.Emscripten.clang"; forge parses the native form.
  const v = solc.version().replace(/\.Emscripten\.clang$/, '');
  process.stdout.write(`solc, the solidity compiler commandline interface\nVersion: ${v}.Linux.g++\n`);
  process.exit(0);
}

if (!args.includes('--standard-json')) {
  process.stderr.write('solc-wrap.js: unsupported arguments: ' + args.join(' ') + '\n');
  process.exit(1);
}

// Roots to resolve imports against: the path as given, --base-path, each --include-path.
const roots = [];
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  const take = (flag) => {
    if (a === flag && i + 1 < args.length) return args[++i];
    if (a.startsWith(flag + '=')) return a.slice(flag.length + 1);
    return null;
  };
  const base = take('--base-path');
  if (base !== null) { roots.push(base); continue; }
  const inc = take('--include-path');
  if (inc !== null) { roots.push(inc); continue; }
}
roots.push(process.cwd());

const chunks = [];
process.stdin.on('data', (c) => chunks.push(c));
process.stdin.on('end', () => {
  const input = Buffer.concat(chunks).toString('utf8');
  // Remapping targets are roots too (solc applies the remappings before asking us, but a
  // target may itself be relative to a root).
  try {
    const parsed = JSON.parse(input);
    for (const r of (parsed.settings && parsed.settings.remappings) || []) {
      const eq = r.indexOf('=');
      if (eq >= 0) roots.push(r.slice(eq + 1));
    }
  } catch (_) { /* solc reports malformed input itself */ }
  const findImports = (p) => {
    const candidates = [p];
    for (const root of roots) candidates.push(path.join(root, p));
    for (const cand of candidates) {
      try { return { contents: fs.readFileSync(cand, 'utf8') }; } catch (_) { /* next */ }
    }
    return { error: 'File not found: ' + p + ' (searched: ' + candidates.join(', ') + ')' };
  };
  process.stdout.write(solc.compile(input, { import: findImports }));
});
