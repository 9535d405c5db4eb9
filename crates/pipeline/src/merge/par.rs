//! Splitting one merge over scoped threads (no thread pool: a merge is one call per epoch,
//! milliseconds to seconds long, so spawning costs nothing measurable).

use std::ops::Range;

use super::PAR_MIN_FLOATS;

/// How many threads a merge over `len` coordinates of `n` deltas uses: one per
/// [`PAR_MIN_FLOATS`] input floats, at most [`std::thread::available_parallelism`] (which
/// honours the process's CPU affinity), at least one.
pub(super) fn threads_for(n: usize, len: usize) -> usize {
    let avail = std::thread::available_parallelism().map_or(1, |t| t.get());
    let by_size = n.saturating_mul(len) / PAR_MIN_FLOATS;
    avail.min(by_size).min(len).max(1)
}

/// Length of each of `threads` parts of `len`, rounded up to a multiple of `align`.
fn part_len(len: usize, threads: usize, align: usize) -> usize {
    len.div_ceil(threads).div_ceil(align).max(1) * align
}

/// Runs `work` on every item of `items` on up to `threads` threads (the calling thread
/// included) that take items from a shared queue; a thread that cannot be spawned only means
/// fewer workers. A panic in `work` propagates to the caller.
fn drain<I: Send>(items: Vec<I>, threads: usize, work: impl Fn(I) + Sync) {
    let queue = std::sync::Mutex::new(items);
    let next = || queue.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let worker = || {
        while let Some(item) = next() {
            work(item);
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            if let Err(e) = std::thread::Builder::new()
                .name("hanzod-merge".into())
                .spawn_scoped(s, worker)
            {
                tracing::debug!(error = %e, "merge thread not spawned, fewer workers");
                break;
            }
        }
        worker();
    });
}

/// Runs `f(offset, chunk)` over disjoint chunks of `out` (each a multiple of `align` long
/// but the last) on `threads` threads.
pub(super) fn for_each_chunk(
    out: &mut [f32],
    threads: usize,
    align: usize,
    f: impl Fn(usize, &mut [f32]) + Sync,
) {
    if threads <= 1 || out.len() <= align {
        f(0, out);
        return;
    }
    let per = part_len(out.len(), threads, align);
    let chunks: Vec<(usize, &mut [f32])> = out
        .chunks_mut(per)
        .enumerate()
        .map(|(k, c)| (k * per, c))
        .collect();
    drain(chunks, threads, |(off, chunk)| f(off, chunk));
}

/// Maps `f` over disjoint ranges covering `0..len` (each a multiple of `align` long but the
/// last) on `threads` threads; the results come back in range order.
pub(super) fn map_ranges<T: Send>(
    len: usize,
    threads: usize,
    align: usize,
    f: impl Fn(Range<usize>) -> T + Sync,
) -> Vec<T> {
    if threads <= 1 || len <= align {
        return vec![f(0..len)];
    }
    let per = part_len(len, threads, align);
    let ranges: Vec<(usize, Range<usize>)> = (0..len)
        .step_by(per)
        .map(|s| s..(s + per).min(len))
        .enumerate()
        .collect();
    let results: Vec<std::sync::Mutex<Option<T>>> =
        ranges.iter().map(|_| std::sync::Mutex::new(None)).collect();
    drain(ranges, threads, |(k, r)| {
        let res = f(r);
        *results[k].lock().unwrap_or_else(|p| p.into_inner()) = Some(res);
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every range is drained")
        })
        .collect()
}
