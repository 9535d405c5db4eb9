//! The colluders' side channel (fault injection, issue 19): a directory shared by the
//! processes of colluding Byzantine nodes (`hanzod node --collude <DIR> --colluders <N>`;
//! one host, or a shared mount), through which they read each other's honest deltas before
//! forging their uploads ([`crate::attack::Attack::colludes`]).
//!
//! # Layout
//!
//! `<dir>/job-<job>-epoch-<epoch>/<node id, 64 lowercase hex>.f32`: the node's honest delta
//! for that epoch, flat, little-endian `f32` (the trainer's delta layout). Each file is
//! written to a temporary name in the same folder (`.<node id>.<pid>.tmp`) and renamed into
//! place, so a reader sees a whole file or none. A node removes the folder of its job's
//! epoch − 2 when it publishes (its colluders are past it), so the folder does not grow
//! with the job.
//!
//! # Reading
//!
//! [`exchange`] publishes this node's delta, then polls the folder (every
//! [`POLL_INTERVAL`]) until `colluders` deltas of the expected size are there or its wait
//! passes, and returns what it found in node-id order, its own included. Only plain files
//! named as above whose size is exactly `4 × len` are read, and no more bytes than that;
//! anything else in the folder is ignored. At most `colluders` deltas are returned.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The colluders' side channel of a node (`hanzod node --collude`, `--colluders`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collusion {
    /// The folder shared by the colluding node processes.
    pub dir: PathBuf,
    /// How many colluders, this node included, to wait for (1..=[`MAX_COLLUDERS`]).
    pub colluders: usize,
}

/// The most colluders a side channel serves (the demo runs at most 64 nodes).
pub const MAX_COLLUDERS: usize = 1024;

/// The longest a node waits for its colluders' deltas (the agent waits the smaller of this
/// and the time left before the assignment's deadline).
pub const MAX_WAIT: Duration = Duration::from_secs(5);

/// How often the folder is listed while waiting.
pub const POLL_INTERVAL: Duration = Duration::from_millis(25);

/// Why the side channel failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollusionError {
    /// `colluders` is 0 or above [`MAX_COLLUDERS`].
    #[error("--colluders {0} must be within 1..={MAX_COLLUDERS}")]
    Colluders(usize),
    /// Writing this node's delta failed.
    #[error("publishing the delta at {path}: {reason}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Listing the epoch's folder failed.
    #[error("listing {path}: {reason}")]
    List {
        /// The folder.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl Collusion {
    /// The side channel in `dir` for `colluders` colluders.
    ///
    /// Errors: [`CollusionError::Colluders`] when `colluders` is 0 or above
    /// [`MAX_COLLUDERS`].
    pub fn new(dir: impl Into<PathBuf>, colluders: usize) -> Result<Collusion, CollusionError> {
        if !(1..=MAX_COLLUDERS).contains(&colluders) {
            return Err(CollusionError::Colluders(colluders));
        }
        Ok(Collusion {
            dir: dir.into(),
            colluders,
        })
    }

    /// The folder of `job`'s `epoch`.
    pub fn epoch_dir(&self, job: u64, epoch: u32) -> PathBuf {
        self.dir.join(format!("job-{job}-epoch-{epoch}"))
    }
}

/// What [`exchange`] found: the colluders' deltas, in node-id order, this node's included.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// `(node id, delta)`, sorted by node id.
    pub deltas: Vec<([u8; 32], Vec<f32>)>,
    /// How long it waited, ms.
    pub waited_ms: u64,
}

/// Publishes `own` (this node's honest delta for `job`'s `epoch`, node id `node`) in the
/// side channel and waits up to `wait` for the other colluders' (module docs); blocking (run
/// it off the async runtime).
///
/// Errors: [`CollusionError::Write`] when its own delta cannot be published,
/// [`CollusionError::List`] when the folder cannot be listed. Unreadable or malformed
/// files of others are skipped, not errors.
pub fn exchange(
    c: &Collusion,
    job: u64,
    epoch: u32,
    node: &[u8; 32],
    own: &[f32],
    wait: Duration,
) -> Result<Found, CollusionError> {
    if !(1..=MAX_COLLUDERS).contains(&c.colluders) {
        return Err(CollusionError::Colluders(c.colluders));
    }
    let folder = c.epoch_dir(job, epoch);
    publish(&folder, node, own)?;
    if let Some(old) = epoch.checked_sub(2) {
        // Best effort: a colluder still behind may have removed it already.
        let _ = std::fs::remove_dir_all(c.epoch_dir(job, old));
    }
    let started = Instant::now();
    let expected = own.len() * 4;
    loop {
        let others = list(&folder, node, expected)?;
        let elapsed = started.elapsed();
        if others.len() + 1 >= c.colluders || elapsed >= wait {
            let mut deltas = vec![(*node, own.to_vec())];
            for (id, path) in others {
                if deltas.len() >= c.colluders {
                    break;
                }
                if let Some(d) = read_delta(&path, own.len()) {
                    deltas.push((id, d));
                }
            }
            deltas.sort_by_key(|d| d.0);
            return Ok(Found {
                deltas,
                waited_ms: elapsed.as_millis() as u64,
            });
        }
        std::thread::sleep(POLL_INTERVAL.min(wait - elapsed));
    }
}

/// Writes `own` to `<folder>/<node>.f32` through a temporary file and a rename.
fn publish(folder: &Path, node: &[u8; 32], own: &[f32]) -> Result<(), CollusionError> {
    let name = hex::encode(node);
    let path = folder.join(format!("{name}.f32"));
    let write = |e: std::io::Error| CollusionError::Write {
        path: path.clone(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(folder).map_err(write)?;
    let tmp = folder.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut bytes = Vec::with_capacity(own.len() * 4);
    for x in own {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|_| f.sync_all()))
        .and_then(|_| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(write(e));
    }
    Ok(())
}

/// The other nodes' delta files in `folder` of exactly `expected` bytes, sorted by node id.
fn list(
    folder: &Path,
    node: &[u8; 32],
    expected: usize,
) -> Result<Vec<([u8; 32], PathBuf)>, CollusionError> {
    let entries = match std::fs::read_dir(folder) {
        Ok(entries) => entries,
        // Removed under us (a colluder two epochs ahead cleans up): nobody else's delta.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(CollusionError::List {
                path: folder.to_path_buf(),
                reason: e.to_string(),
            })
        }
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(node_of_file) else {
            continue;
        };
        if &id == node {
            continue;
        }
        // symlink_metadata: a link is not a plain file, and is not followed.
        let path = entry.path();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() && m.len() == expected as u64 => found.push((id, path)),
            _ => {}
        }
    }
    found.sort();
    Ok(found)
}

/// The node id of a delta file's name (`<64 lowercase hex>.f32`).
fn node_of_file(name: &str) -> Option<[u8; 32]> {
    let hex_id = name.strip_suffix(".f32")?;
    if hex_id.len() != 64
        || !hex_id
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let mut id = [0u8; 32];
    hex::decode_to_slice(hex_id, &mut id).ok()?;
    Some(id)
}

/// Opens `path` for reading only if it is a plain file, judged on the opened file itself:
/// on Unix without following a link (`O_NOFOLLOW`) and without blocking (`O_NONBLOCK`: a
/// FIFO swapped in after [`list`] looked at the name opens at once and is then refused),
/// so what was checked is what is read.
fn open_plain(path: &Path) -> Option<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let file = options.open(path).ok()?;
    file.metadata().ok()?.is_file().then_some(file)
}

/// Reads a delta of `len` values from `path`: `None` unless it is a plain file
/// ([`open_plain`]) holding exactly `4 × len` bytes (no more are read) of finite values.
fn read_delta(path: &Path, len: usize) -> Option<Vec<f32>> {
    let expected = len * 4;
    let mut bytes = Vec::with_capacity(expected);
    open_plain(path)?
        .take(expected as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() != expected {
        return None;
    }
    let values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    values.iter().all(|v| v.is_finite()).then_some(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh folder under the system's temporary folder, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let p = std::env::temp_dir()
                .join(format!("hanzod-collude-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            TempDir(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn colluders_see_each_other_in_node_id_order() {
        let tmp = TempDir::new("order");
        let c = Collusion::new(&tmp.0, 3).unwrap();
        let ids = [[9u8; 32], [2u8; 32], [5u8; 32]];
        let deltas = [vec![1.0f32, 2.0], vec![3.0, 4.0], vec![5.0, 6.0]];
        let found: Vec<Found> = std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .iter()
                .zip(&deltas)
                .map(|(id, d)| s.spawn(|| exchange(&c, 7, 3, id, d, Duration::from_secs(5))))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        for f in &found {
            let ids_seen: Vec<[u8; 32]> = f.deltas.iter().map(|d| d.0).collect();
            assert_eq!(ids_seen, [[2u8; 32], [5u8; 32], [9u8; 32]]);
            assert_eq!(f.deltas[0].1, deltas[1]);
            assert_eq!(f.deltas[2].1, deltas[0]);
        }
        // No temporary file is left behind.
        let names: Vec<String> = std::fs::read_dir(c.epoch_dir(7, 3))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names.iter().all(|n| n.ends_with(".f32")));
    }

    #[test]
    fn the_wait_is_bounded_and_bad_files_are_skipped() {
        let tmp = TempDir::new("bounded");
        let c = Collusion::new(&tmp.0, 4).unwrap();
        let folder = c.epoch_dir(1, 2);
        std::fs::create_dir_all(&folder).unwrap();
        // Wrong size, wrong name, a non-finite value, a folder with a delta's name.
        std::fs::write(
            folder.join(format!("{}.f32", hex::encode([1u8; 32]))),
            [0u8; 12],
        )
        .unwrap();
        std::fs::write(folder.join("notes.f32"), [0u8; 8]).unwrap();
        std::fs::write(
            folder.join(format!("{}.f32", hex::encode([3u8; 32]))),
            [f32::NAN.to_le_bytes(), 1.0f32.to_le_bytes()].concat(),
        )
        .unwrap();
        std::fs::create_dir(folder.join(format!("{}.f32", hex::encode([4u8; 32])))).unwrap();
        // A good one.
        std::fs::write(
            folder.join(format!("{}.f32", hex::encode([0u8; 32]))),
            [0.5f32.to_le_bytes(), 0.25f32.to_le_bytes()].concat(),
        )
        .unwrap();
        let started = Instant::now();
        let found = exchange(
            &c,
            1,
            2,
            &[8u8; 32],
            &[1.0, -1.0],
            Duration::from_millis(200),
        )
        .unwrap();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert_eq!(
            found.deltas,
            vec![([0u8; 32], vec![0.5, 0.25]), ([8u8; 32], vec![1.0, -1.0])]
        );
    }

    /// A name that [`list`] saw as a plain file but that is a FIFO or a link by the time
    /// it is opened is refused at once: no read blocks on a FIFO nobody writes, and no
    /// link is followed.
    #[cfg(unix)]
    #[test]
    fn a_fifo_or_a_link_swapped_in_is_refused_without_blocking() {
        let tmp = TempDir::new("swap");
        std::fs::create_dir_all(&tmp.0).unwrap();
        let good = tmp.0.join("good.f32");
        std::fs::write(
            &good,
            [0.5f32.to_le_bytes(), 0.25f32.to_le_bytes()].concat(),
        )
        .unwrap();
        assert_eq!(read_delta(&good, 2), Some(vec![0.5, 0.25]));
        let fifo = tmp.0.join("fifo.f32");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let started = Instant::now();
        assert_eq!(read_delta(&fifo, 2), None);
        assert!(started.elapsed() < Duration::from_secs(2));
        let link = tmp.0.join("link.f32");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert_eq!(read_delta(&link, 2), None);
        // A folder removed under a reader is nobody's delta, not an error.
        assert_eq!(
            list(&tmp.0.join("gone"), &[0u8; 32], 8).unwrap(),
            Vec::new()
        );
    }

    #[test]
    fn old_epochs_are_removed_and_bad_counts_refused() {
        let tmp = TempDir::new("cleanup");
        let c = Collusion::new(&tmp.0, 1).unwrap();
        exchange(&c, 1, 0, &[1u8; 32], &[1.0], Duration::ZERO).unwrap();
        exchange(&c, 1, 1, &[1u8; 32], &[1.0], Duration::ZERO).unwrap();
        assert!(c.epoch_dir(1, 0).exists());
        let found = exchange(&c, 1, 2, &[1u8; 32], &[2.0], Duration::ZERO).unwrap();
        assert_eq!(found.deltas, vec![([1u8; 32], vec![2.0])]);
        assert!(!c.epoch_dir(1, 0).exists());
        assert!(c.epoch_dir(1, 1).exists());
        assert_eq!(Collusion::new(&tmp.0, 0), Err(CollusionError::Colluders(0)));
        assert!(Collusion::new(&tmp.0, MAX_COLLUDERS + 1).is_err());
        // An unwritable folder is an error, not a panic.
        let file = tmp.0.join("a-file");
        std::fs::write(&file, b"x").unwrap();
        let bad = Collusion::new(&file, 2).unwrap();
        assert!(matches!(
            exchange(&bad, 1, 0, &[1u8; 32], &[1.0], Duration::ZERO),
            Err(CollusionError::Write { .. })
        ));
    }
}
