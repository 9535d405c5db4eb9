#!/usr/bin/env python3
"""numpy reference for benches/merge.rs (issue 4 item 7): same shapes, same deterministic
fill kind, prints GB/s over the total input bytes (N x len x 4)."""
import time

import numpy as np


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
    print(f"{name:28s} {secs * 1e3:9.1f} ms  {nbytes / secs / 1e9:6.2f} GB/s")


for n in (8, 64):
    a = fill(n, 10_000_000)
    w = (0.5 + (np.arange(n) % 5) * 0.1).astype(np.float32)
    report(f"average/{n}x10M", a.nbytes, best(lambda: np.average(a, axis=0, weights=w), 3))
    dst = np.empty_like(a)
    report(f"copy/{n}x10M", a.nbytes, best(lambda: np.copyto(dst, a), 3))
    del a, dst

for n, length, label in ((8, 10_000_000, "8x10M"), (64, 1_000_000, "64x1M")):
    a = fill(n, length)
    report(f"median/{label}", a.nbytes, best(lambda: np.median(a, axis=0), 2))
