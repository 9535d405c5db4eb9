// A js-ipfs node serving the Kubo HTTP RPC API on loopback, for hanzod's tests
// (src/publish/ipfs_node.rs starts it; tests/ipfs.rs runs the Kubo adapter against it).
//
//   node daemon.mjs <repo-dir> <api-port>
//
// - the repo (keys, datastore, blocks) lives in <repo-dir>, created empty (no init docs);
// - the RPC API listens on http://127.0.0.1:<api-port>/api/v0/…; no gateway, no gRPC;
// - offline: libp2p neither listens nor dials (no swarm address, no bootstrap peers, no MDNS, no
//   preload); the API port is the only socket. js-ipfs still waits for a block its repo
//   lacks (its "want" never ends, `offline=true` is ignored): callers bound lookups with the
//   RPC API's `timeout=` argument;
// - prints `… API server listening on /ip4/127.0.0.1/tcp/<port>/http` once ready and exits
//   on SIGINT/SIGTERM or when its stdin closes (the parent died).
//
// js-ipfs 0.66.1 is the last release (the project moved to Helia). On Node 20 it needs
// `Promise.withResolvers` (Node 22+; it-queue, under mortice 3.3, calls it while libp2p
// is set up), polyfilled below; package.json pins @multiformats/mafmt to 11.0.3 through
// `overrides`, and maps `headless` (an optional dependency of electron-eval, under the
// optional electron-webrtc, given as a GitHub tarball) to its npm release, so that the lock
// file is complete and `npm ci` accepts it. Install with
// `npm ci --omit=optional --ignore-scripts`: no optional dependency or install script is
// needed (classic-level ships prebuilt binaries).

if (typeof Promise.withResolvers !== 'function') {
  Promise.withResolvers = function withResolvers () {
    let resolve
    let reject
    const promise = new this((res, rej) => {
      resolve = res
      reject = rej
    })
    return { promise, resolve, reject }
  }
}

const [repo, portArg] = process.argv.slice(2)
const port = Number.parseInt(portArg ?? '', 10)
if (!repo || !Number.isInteger(port) || port <= 0 || port > 65535) {
  console.error('usage: node daemon.mjs <repo-dir> <api-port>')
  process.exit(2)
}

const { create } = await import('ipfs-core')
const { HttpApi } = await import('ipfs-http-server')

const ipfs = await create({
  repo,
  offline: true,
  start: true,
  silent: true,
  preload: { enabled: false },
  init: { emptyRepo: true, algorithm: 'Ed25519' },
  config: {
    Addresses: {
      API: `/ip4/127.0.0.1/tcp/${port}`,
      Gateway: [],
      RPC: [],
      Swarm: [],
      Announce: [],
      NoAnnounce: [],
      Delegates: []
    },
    Bootstrap: [],
    Discovery: { MDNS: { Enabled: false }, webRTCStar: { Enabled: false } },
    Routing: { Type: 'none' }
  }
})
const api = new HttpApi(ipfs)
await api.start()
const { version } = await ipfs.version()
console.log(`js-ipfs ${version}: API server listening on /ip4/127.0.0.1/tcp/${port}/http`)

let stopping = false
async function stop (why) {
  if (stopping) return
  stopping = true
  console.log(`stopping (${why})`)
  const force = setTimeout(() => process.exit(0), 3000)
  force.unref()
  try {
    await api.stop()
    await ipfs.stop()
  } finally {
    process.exit(0)
  }
}
process.on('SIGINT', () => stop('SIGINT'))
process.on('SIGTERM', () => stop('SIGTERM'))
process.stdin.on('end', () => stop('stdin closed'))
process.stdin.on('error', () => stop('stdin error'))
process.stdin.resume()
