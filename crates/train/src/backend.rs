//! Where the training math runs: burn's flex CPU backend (the default, in every build), or
//! a GPU backend compiled in with the crate feature `cuda` (NVIDIA, through CubeCL and the
//! CUDA driver API) or `wgpu` (Vulkan / Metal / DX12 through wgpu).
//!
//! One backend per process, chosen once at start-up ([`select`]) by the node agent
//! (`hanzod node --device`) and the daemon's validator (`[validation] device`), before any
//! training, validation or evaluation runs; until then, and in a process that never
//! chooses, it is [`Backend::Cpu`]. Every model in this crate takes its device from here,
//! so the same code that trains `qwen3-tiny` on two CPU cores trains a Qwen3-0.6B on a GPU.
//!
//! Determinism across backends: a GPU's kernels reduce in another order than the CPU's (and
//! CubeCL's matmuls may pick a tiling by autotuning), so a node on a GPU and a validator on
//! a CPU agree to float tolerance, not bit for bit. That is what validation assumes anyway:
//! the spot-check compares losses with a relative 5 % and re-executed deltas by distance
//! (DESIGN §6).

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use burn::tensor::Device;

/// A training backend ([module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// burn's flex CPU backend, single-threaded (deterministic: [`crate`] docs).
    Cpu,
    /// An NVIDIA GPU by CUDA device index (feature `cuda`).
    Cuda {
        /// The device index, as `nvidia-smi` numbers them.
        index: usize,
    },
    /// The default wgpu adapter (feature `wgpu`).
    Wgpu,
}

/// Why a backend cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The text names no backend. Carries it, cut to 40 characters.
    #[error("unknown device {0:?}: expected cpu, cuda, cuda:N or wgpu")]
    Unknown(String),
    /// The backend exists but this build does not include it.
    #[error("this build has no {backend} backend: rebuild with `--features {feature}`")]
    NotBuilt {
        /// The backend asked for.
        backend: &'static str,
        /// The cargo feature that adds it.
        feature: &'static str,
    },
    /// Another backend was selected before in this process (the choice is made once).
    #[error("the {held} backend is already in use in this process; cannot switch to {asked}")]
    AlreadySelected {
        /// The backend in use.
        held: Backend,
        /// The backend asked for.
        asked: Backend,
    },
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backend::Cpu => f.write_str("cpu"),
            Backend::Cuda { index } => write!(f, "cuda:{index}"),
            Backend::Wgpu => f.write_str("wgpu"),
        }
    }
}

impl FromStr for Backend {
    type Err = BackendError;

    /// `cpu` (or `flex`), `cuda` (device 0), `cuda:N`, `wgpu`; case-insensitive. Parses
    /// names whether or not this build includes the backend ([`Backend::check_built`]).
    fn from_str(text: &str) -> Result<Backend, BackendError> {
        let lower = text.trim().to_ascii_lowercase();
        let unknown = || BackendError::Unknown(text.chars().take(40).collect());
        match lower.as_str() {
            "cpu" | "flex" => Ok(Backend::Cpu),
            "cuda" => Ok(Backend::Cuda { index: 0 }),
            "wgpu" => Ok(Backend::Wgpu),
            other => match other.strip_prefix("cuda:") {
                Some(n)
                    if !n.is_empty() && n.len() <= 4 && n.bytes().all(|b| b.is_ascii_digit()) =>
                {
                    Ok(Backend::Cuda {
                        index: n.parse().map_err(|_| unknown())?,
                    })
                }
                _ => Err(unknown()),
            },
        }
    }
}

impl Backend {
    /// Whether this build includes the backend.
    ///
    /// Errors: [`BackendError::NotBuilt`] naming the cargo feature that adds it.
    pub fn check_built(self) -> Result<Backend, BackendError> {
        match self {
            Backend::Cpu => Ok(self),
            Backend::Cuda { .. } if cfg!(feature = "cuda") => Ok(self),
            Backend::Cuda { .. } => Err(BackendError::NotBuilt {
                backend: "cuda",
                feature: "cuda",
            }),
            Backend::Wgpu if cfg!(feature = "wgpu") => Ok(self),
            Backend::Wgpu => Err(BackendError::NotBuilt {
                backend: "wgpu",
                feature: "wgpu",
            }),
        }
    }
}

/// The backends this build includes, by name (`cpu` first).
pub fn built() -> Vec<&'static str> {
    let mut names = vec!["cpu"];
    if cfg!(feature = "cuda") {
        names.push("cuda");
    }
    if cfg!(feature = "wgpu") {
        names.push("wgpu");
    }
    names
}

static SELECTED: OnceLock<Backend> = OnceLock::new();

/// Makes `backend` this process's backend. Selecting the one already in use is a no-op.
///
/// Errors: [`BackendError::NotBuilt`] when this build lacks it;
/// [`BackendError::AlreadySelected`] when another backend was selected (or the CPU was used
/// by default) before.
pub fn select(backend: Backend) -> Result<(), BackendError> {
    backend.check_built()?;
    let held = *SELECTED.get_or_init(|| backend);
    if held == backend {
        Ok(())
    } else {
        Err(BackendError::AlreadySelected {
            held,
            asked: backend,
        })
    }
}

/// This process's backend: the one [`select`]ed, else [`Backend::Cpu`] (which it then
/// stays).
pub fn selected() -> Backend {
    *SELECTED.get_or_init(|| Backend::Cpu)
}

/// The burn device of this process's backend (plain; `.autodiff()` for gradients).
pub(crate) fn device() -> Device {
    device_of(selected())
}

/// The burn device of `backend`; a backend this build lacks (which [`select`] refuses)
/// falls back to the CPU.
fn device_of(backend: Backend) -> Device {
    match backend {
        #[cfg(feature = "cuda")]
        Backend::Cuda { index } => Device::cuda(index),
        #[cfg(feature = "wgpu")]
        Backend::Wgpu => Device::wgpu(Default::default()),
        _ => Device::flex(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_parse_and_print_back() {
        for (text, backend) in [
            ("cpu", Backend::Cpu),
            ("FLEX", Backend::Cpu),
            ("cuda", Backend::Cuda { index: 0 }),
            ("cuda:3", Backend::Cuda { index: 3 }),
            (" wgpu ", Backend::Wgpu),
        ] {
            assert_eq!(text.parse::<Backend>(), Ok(backend), "{text}");
        }
        for bad in [
            "",
            "gpu",
            "cuda:",
            "cuda:-1",
            "cuda:x",
            "cuda:12345",
            "metal",
        ] {
            assert!(
                matches!(bad.parse::<Backend>(), Err(BackendError::Unknown(_))),
                "{bad:?}"
            );
        }
        let long = "x".repeat(10_000);
        match long.parse::<Backend>() {
            Err(e) => assert!(e.to_string().len() < 120, "{e}"),
            Ok(b) => panic!("{b}"),
        }
    }

    #[test]
    fn a_backend_this_build_lacks_names_its_feature() {
        assert_eq!(Backend::Cpu.check_built(), Ok(Backend::Cpu));
        let cuda = Backend::Cuda { index: 0 }.check_built();
        assert_eq!(cuda.is_ok(), cfg!(feature = "cuda"));
        if let Err(e) = cuda {
            assert!(e.to_string().contains("--features cuda"), "{e}");
        }
        assert_eq!(Backend::Wgpu.check_built().is_ok(), cfg!(feature = "wgpu"));
        assert_eq!(built()[0], "cpu");
    }

    #[test]
    fn the_process_keeps_one_backend() {
        // Tests share the process: the CPU is what every other test uses.
        assert_eq!(select(Backend::Cpu), Ok(()));
        assert_eq!(selected(), Backend::Cpu);
        assert_eq!(select(Backend::Cpu), Ok(()));
        if cfg!(feature = "wgpu") {
            assert_eq!(
                select(Backend::Wgpu),
                Err(BackendError::AlreadySelected {
                    held: Backend::Cpu,
                    asked: Backend::Wgpu
                })
            );
        }
    }

    proptest! {
        #[test]
        fn display_round_trips(index in 0usize..10_000, pick in 0u8..3) {
            let b = match pick {
                0 => Backend::Cpu,
                1 => Backend::Cuda { index },
                _ => Backend::Wgpu,
            };
            prop_assert_eq!(b.to_string().parse::<Backend>(), Ok(b));
        }
    }
}
