// Times the independent JavaScript UnixFS importer (ipfs-unixfs-importer 12, as bundled by
// js-ipfs 0.66.1) on the bytes benches/cid.rs hashes, for comparison with hanzod's
// `cid_of`/`dag`:
//
//   node cid-bench.mjs [MiB]      (default 1024: 1 GiB)
//
// Importer options: cidVersion 1, rawLeaves true, everything else default (fixed
// 262,144-byte chunks, balanced layout with 174 links a node, sha2-256) — Kubo's
// `ipfs add --cid-version=1`. The blockstore discards the blocks (only the importer's
// chunking, hashing and dag-pb encoding are timed; generating the bytes is not).
//
// The bytes (same generator as benches/cid.rs): xorshift32 with shifts 13, 17, 5 from the
// state 0x9E3779B9; each step's new state is the next 4 bytes, little-endian.
//
// Prints the CID and the throughput in MiB/s (2^20 bytes a second).

import { importer } from 'ipfs-unixfs-importer'

const mib = Number.parseInt(process.argv[2] ?? '1024', 10)
if (!Number.isInteger(mib) || mib < 0) {
  console.error('usage: node cid-bench.mjs [MiB]')
  process.exit(2)
}
const len = mib * 1024 * 1024

/** The benchmark bytes: `len` (a multiple of 4) bytes of xorshift32. */
function xorshiftBytes (len) {
  const bytes = new Uint8Array(len)
  const view = new DataView(bytes.buffer)
  let x = 0x9E3779B9
  for (let i = 0; i + 4 <= len; i += 4) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    view.setUint32(i, x >>> 0, true)
  }
  return bytes
}

/** Accepts every block and keeps none. */
const discard = {
  async put (cid) { return cid },
  async has () { return false },
  async get () { throw new Error('the benchmark blockstore keeps no blocks') }
}

const data = xorshiftBytes(len)
let cid
const start = process.hrtime.bigint()
for await (const entry of importer([{ content: data }], discard, { cidVersion: 1, rawLeaves: true })) {
  cid = entry.cid
}
const seconds = Number(process.hrtime.bigint() - start) / 1e9
const mibps = len / (1024 * 1024) / seconds
console.log(`ipfs-unixfs-importer: ${len} bytes -> ${cid}`)
console.log(`${seconds.toFixed(3)} s, ${mibps.toFixed(1)} MiB/s`)
