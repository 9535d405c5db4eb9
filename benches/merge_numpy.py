#!/usr/bin/env python3
"""numpy reference for benches/merge.rs (issue 4 item 7, issue 19 item 2): same shapes, same
deterministic fill kind, prints GB/s over the total input bytes (N x len x 4).

Usage: python3 benches/merge_numpy.py [FILTER ...]   (substring match on the entry names,
e.g. `median/256 krum`; no filter runs everything, which needs ~6 GB and minutes).
numpy runs its kernels on one thread (BLAS, used by the Gram-matrix Krum, may use more)."""
import sys
import time

import numpy as np

FILTERS = sys.argv[1:]


def wanted(name):
    return not FILTERS or any(f in name for f in FILTERS)


def fill(n, length):
    rng = np.random.default_rng(7)
    return rng.uniform(-1.0, 1.0, size=(n, length)).astype(np.float32)


def best(fn, reps):
    t = float("inf")
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - s)
    return t


def report(name, nbytes, secs):
    print(f"{name:32s} {secs * 1e3:9.1f} ms  {nbytes / secs / 1e9:6.2f} GB/s", flush=True)


def trimmed_mean(a, trim):
    """scipy.stats.trim_mean's algorithm (np.partition at both cut points) without scipy."""
    n = a.shape[0]
    k = int(trim * n)
    if k == 0:
        return a.mean(axis=0)
    p = np.partition(a, (k, n - k - 1), axis=0)
    return p[k : n - k].mean(axis=0)


def krum_scores(d2, f):
    n = d2.shape[0]
    k = min(max(n - f - 2, 1), n - 1)
    off = d2 + np.diag(np.full(n, np.inf))
    return np.sort(off, axis=1)[:, :k].sum(axis=1)


def pairwise_gram(a):
    """Squared distances via the Gram matrix (BLAS): ||x||^2 + ||y||^2 - 2 x.y."""
    g = (a @ a.T).astype(np.float64)
    sq = np.diag(g)
    return np.maximum(sq[:, None] + sq[None, :] - 2.0 * g, 0.0)


def pairwise_blocked(a, block=16384):
    """Squared distances from differences, blocked over coordinates."""
    n, length = a.shape
    d2 = np.zeros((n, n), np.float64)
    for s in range(0, length, block):
        c = a[:, s : s + block]
        d2 += ((c[:, None, :] - c[None, :, :]) ** 2).sum(-1, dtype=np.float64)
    return d2


def multi_krum(a, f, m, pairwise):
    sel = np.argsort(krum_scores(pairwise(a), f), kind="stable")[:m]
    return a[sel].mean(axis=0)


def centered_clipping(a, iterations=3):
    v = np.median(a, axis=0)
    r = np.sqrt(((a - v) ** 2).sum(axis=1, dtype=np.float64))
    tau = np.median(r)
    for it in range(iterations):
        if it:
            r = np.sqrt(((a - v) ** 2).sum(axis=1, dtype=np.float64))
        c = np.minimum(1.0, tau / np.maximum(r, 1e-300)).astype(np.float32)
        v = v + (c[:, None] * (a - v)).mean(axis=0)
    return v


for n in (8, 64):
    names = (f"average/{n}x10M", f"copy/{n}x10M")
    if not any(wanted(x) for x in names):
        continue
    a = fill(n, 10_000_000)
    w = (0.5 + (np.arange(n) % 5) * 0.1).astype(np.float32)
    report(names[0], a.nbytes, best(lambda: np.average(a, axis=0, weights=w), 3))
    dst = np.empty_like(a)
    report(names[1], a.nbytes, best(lambda: np.copyto(dst, a), 3))
    del a, dst

for n, length, label in ((8, 10_000_000, "8x10M"), (64, 1_000_000, "64x1M"), (256, 1_000_000, "256x1M")):
    names = (f"median/{label}", f"trimmed_mean/{label}")
    if not any(wanted(x) for x in names):
        continue
    a = fill(n, length)
    if wanted(names[0]):
        report(names[0], a.nbytes, best(lambda: np.median(a, axis=0), 2))
    if n > 8 and wanted(names[1]):
        report(names[1], a.nbytes, best(lambda: trimmed_mean(a, 0.2), 2))
    del a

for n in (8, 64):
    length = 1_000_000
    f = n // 4
    names = (
        f"krum_gram/{n}x1M",
        f"krum_blocked/{n}x1M",
        f"multi_krum_gram/{n}x1M",
        f"centered_clipping/{n}x1M",
    )
    if not any(wanted(x) for x in names):
        continue
    a = fill(n, length)
    if wanted(names[0]):
        report(names[0], a.nbytes, best(lambda: multi_krum(a, f, 1, pairwise_gram), 2))
    if wanted(names[1]):
        report(names[1], a.nbytes, best(lambda: multi_krum(a, f, 1, pairwise_blocked), 1))
    if wanted(names[2]):
        report(names[2], a.nbytes, best(lambda: multi_krum(a, f, n - f, pairwise_gram), 2))
    if wanted(names[3]):
        report(names[3], a.nbytes, best(lambda: centered_clipping(a), 2))
    del a
