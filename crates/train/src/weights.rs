//! Flat model weights (DESIGN §6 "merge math runs on contiguous f32 buffers"): every tensor
//! of a [`ModelSpec`] in name order (the spec's `BTreeMap` order) in one `Vec<f32>`, each
//! tensor row-major in the exported (PyTorch, `[out, in]`) shape. Conversions to and from
//! HZDL full-parameter deltas (DESIGN §6) and plain safetensors checkpoint files.

use std::collections::BTreeMap;
use std::sync::Arc;

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::TrainError;
use hanzod_protocol::hzdl::{write_delta, DeltaDtype, DeltaError, DeltaKind, DeltaView};
use hanzod_protocol::model::{check_against, LoraConfig, ModelSpec};

/// One tensor's place in a [`Layout`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutEntry {
    /// Tensor name (e.g. `fc1.weight`).
    pub name: String,
    /// Shape, row-major, in elements (`[out, in]` for linear weights).
    pub shape: Vec<usize>,
    /// Index of the tensor's first element in [`Weights::data`].
    pub offset: usize,
    /// Number of elements (product of `shape`).
    pub len: usize,
}

/// Where each tensor of a model lives in a flat buffer: the tensors of a [`ModelSpec`] in
/// name order, packed without gaps. Built once per model and shared (`Arc`) by every
/// [`Weights`] of that model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    name: String,
    entries: Vec<LayoutEntry>,
    len: usize,
    /// The LoRA configuration of an adapter layout ([`ModelSpec::lora_spec`]); `None` for a
    /// model's own tensors.
    lora: Option<LoraConfig>,
}

impl Layout {
    /// The layout of `spec`'s tensors (name order). Fails with
    /// [`TrainError::LayoutMismatch`] when the total element count overflows `usize`.
    pub fn new(spec: &ModelSpec) -> Result<Layout, TrainError> {
        let mut entries = Vec::with_capacity(spec.params.len());
        let mut offset = 0usize;
        for (name, shape) in &spec.params {
            let len = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .ok_or_else(|| TrainError::LayoutMismatch(format!("{name}: size overflows")))?;
            entries.push(LayoutEntry {
                name: name.clone(),
                shape: shape.clone(),
                offset,
                len,
            });
            offset = offset
                .checked_add(len)
                .ok_or_else(|| TrainError::LayoutMismatch("model size overflows".into()))?;
        }
        Ok(Layout {
            name: spec.name.clone(),
            entries,
            len: offset,
            lora: spec.lora.clone(),
        })
    }

    /// The model name (from the spec).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tensors, in name order (increasing offsets).
    pub fn entries(&self) -> &[LayoutEntry] {
        &self.entries
    }

    /// The tensor called `name`, if present.
    pub fn entry(&self, name: &str) -> Option<&LayoutEntry> {
        self.entries
            .binary_search_by(|e| e.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.entries[i])
    }

    /// Total number of elements (the length of a [`Weights::data`] of this layout).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the model has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The spec this layout was built from (names, shapes, and the LoRA configuration of
    /// an adapter layout).
    pub fn spec(&self) -> ModelSpec {
        ModelSpec {
            name: self.name.clone(),
            params: self
                .entries
                .iter()
                .map(|e| (e.name.clone(), e.shape.clone()))
                .collect::<BTreeMap<_, _>>(),
            lora: self.lora.clone(),
        }
    }

    /// What a delta of this layout holds: [`DeltaKind::Lora`] for an adapter layout (built
    /// from a [`ModelSpec::lora_spec`]), [`DeltaKind::Full`] otherwise.
    pub fn delta_kind(&self) -> DeltaKind {
        if self.lora.is_some() {
            DeltaKind::Lora
        } else {
            DeltaKind::Full
        }
    }
}

/// A model's weights (or a delta of them): one contiguous f32 buffer described by a shared
/// [`Layout`]. Invariant checked by every method: `data.len() == layout.len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    /// Where each tensor lives in `data`.
    pub layout: Arc<Layout>,
    /// Every tensor, in layout order, row-major.
    pub data: Vec<f32>,
}

impl Weights {
    /// All zeros.
    pub fn zeros(layout: Arc<Layout>) -> Weights {
        let data = vec![0.0; layout.len()];
        Weights { layout, data }
    }

    /// Wraps `data`; fails with [`TrainError::LayoutMismatch`] unless its length is the
    /// layout's.
    pub fn from_vec(layout: Arc<Layout>, data: Vec<f32>) -> Result<Weights, TrainError> {
        let w = Weights { layout, data };
        w.check_len()?;
        Ok(w)
    }

    fn check_len(&self) -> Result<(), TrainError> {
        if self.data.len() != self.layout.len() {
            return Err(TrainError::LayoutMismatch(format!(
                "{} values for a layout of {}",
                self.data.len(),
                self.layout.len()
            )));
        }
        Ok(())
    }

    /// The values of tensor `name` (row-major), if the layout has it.
    pub fn tensor(&self, name: &str) -> Option<&[f32]> {
        let e = self.layout.entry(name)?;
        self.data.get(e.offset..e.offset + e.len)
    }

    /// The values of tensor `name`, mutable.
    pub fn tensor_mut(&mut self, name: &str) -> Option<&mut [f32]> {
        let e = self.layout.entry(name)?;
        self.data.get_mut(e.offset..e.offset + e.len)
    }

    /// The model's names and shapes.
    pub fn spec(&self) -> ModelSpec {
        self.layout.spec()
    }

    /// [`TrainError::NonFinite`] naming the first NaN or ±Inf (tensor and element index).
    pub fn check_finite(&self) -> Result<(), TrainError> {
        self.check_len()?;
        match self.data.iter().position(|v| !v.is_finite()) {
            None => Ok(()),
            Some(i) => Err(TrainError::NonFinite(self.describe(i))),
        }
    }

    /// `tensor[index]` for a flat index.
    fn describe(&self, flat: usize) -> String {
        match self
            .layout
            .entries()
            .iter()
            .find(|e| flat >= e.offset && flat < e.offset + e.len)
        {
            Some(e) => format!("{}[{}]", e.name, flat - e.offset),
            None => format!("element {flat}"),
        }
    }

    /// The delta `self − base`, element-wise in f32 (what a node uploads after local
    /// training). Both must have equal layouts.
    pub fn sub(&self, base: &Weights) -> Result<Weights, TrainError> {
        self.same_layout(base)?;
        let data = self
            .data
            .iter()
            .zip(&base.data)
            .map(|(a, b)| a - b)
            .collect();
        Ok(Weights {
            layout: self.layout.clone(),
            data,
        })
    }

    fn same_layout(&self, other: &Weights) -> Result<(), TrainError> {
        self.check_len()?;
        other.check_len()?;
        if !Arc::ptr_eq(&self.layout, &other.layout) && self.layout != other.layout {
            return Err(TrainError::LayoutMismatch(format!(
                "model {:?} ({} values) vs {:?} ({} values), or different tensors",
                self.layout.name(),
                self.layout.len(),
                other.layout.name(),
                other.layout.len()
            )));
        }
        Ok(())
    }

    /// The outer step `self ← self + scale · delta` (element-wise, f32:
    /// `w[i] + scale * d[i]`, no fused multiply-add). `delta` is a flat buffer in this
    /// layout (e.g. a merged delta). Refuses (unchanged) a wrong length, a non-finite
    /// `scale` or a non-finite delta value; [`TrainError::NonFinite`] after the update means
    /// a value overflowed (the weights are then left updated).
    pub fn add_scaled(&mut self, delta: &[f32], scale: f32) -> Result<(), TrainError> {
        self.check_len()?;
        if delta.len() != self.data.len() {
            return Err(TrainError::LayoutMismatch(format!(
                "delta of {} values for a layout of {}",
                delta.len(),
                self.data.len()
            )));
        }
        if !scale.is_finite() {
            return Err(TrainError::NonFinite(format!("scale {scale}")));
        }
        if let Some(i) = delta.iter().position(|v| !v.is_finite()) {
            return Err(TrainError::NonFinite(format!("delta {}", self.describe(i))));
        }
        for (w, d) in self.data.iter_mut().zip(delta) {
            *w += scale * d;
        }
        self.check_finite()
    }

    /// `(name, shape, values)` for every tensor, in layout order.
    fn parts(&self) -> Vec<(&str, &[usize], &[f32])> {
        self.layout
            .entries()
            .iter()
            .map(|e| {
                (
                    e.name.as_str(),
                    e.shape.as_slice(),
                    &self.data[e.offset..e.offset + e.len],
                )
            })
            .collect()
    }

    /// This buffer as an HZDL delta in f32 (DESIGN §6; of kind [`Layout::delta_kind`]: full
    /// for a model's tensors, LoRA for an adapter's) against checkpoint `base_version`; read back with [`DeltaView::parse`] and [`Weights::from_delta_view`].
    pub fn to_delta_bytes(&self, base_version: u64) -> Result<Vec<u8>, DeltaError> {
        self.to_delta_bytes_as(base_version, DeltaDtype::F32)
    }

    /// [`Weights::to_delta_bytes`] with the values stored as `dtype` (f16 and bf16 round
    /// to nearest even, as [`write_delta`] does).
    pub fn to_delta_bytes_as(
        &self,
        base_version: u64,
        dtype: DeltaDtype,
    ) -> Result<Vec<u8>, DeltaError> {
        if self.data.len() != self.layout.len() {
            return Err(DeltaError::WrongShape {
                tensor: String::new(),
                expected: vec![self.layout.len()],
                found: vec![self.data.len()],
            });
        }
        write_delta(self.layout.delta_kind(), base_version, dtype, &self.parts())
    }

    /// Reads a parsed delta (any dtype, converted to f32) into `layout`, of the layout's
    /// [`Layout::delta_kind`]: runs
    /// the DESIGN §6 format check ([`check_against`]: kind, every name and shape, nothing
    /// missing, all values finite) and then copies the values.
    pub fn from_delta_view(
        view: &DeltaView<'_>,
        layout: Arc<Layout>,
    ) -> Result<Weights, TrainError> {
        check_against(view, &layout.spec())?;
        let mut data = Vec::with_capacity(layout.len());
        for e in layout.entries() {
            let t = view
                .tensor(&e.name)
                .ok_or_else(|| DeltaError::MissingTensor {
                    tensor: e.name.clone(),
                })?;
            data.extend(view.to_f32(t));
        }
        Weights::from_vec(layout, data)
    }

    /// The weights as a plain safetensors file (F32, little endian, PyTorch names and
    /// `[out, in]` shapes: loadable with `safetensors.torch.load_file`), for checkpoints.
    pub fn to_safetensors(&self) -> Vec<u8> {
        let bytes: Vec<Vec<u8>> = self
            .parts()
            .iter()
            .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
            .collect();
        let views: Vec<(&str, TensorView<'_>)> = self
            .parts()
            .into_iter()
            .zip(&bytes)
            .map(|((name, shape, _), b)| {
                // The layout makes every shape's element count equal the bytes given.
                let view = TensorView::new(Dtype::F32, shape.to_vec(), b)
                    .expect("layout shapes match their data");
                (name, view)
            })
            .collect();
        safetensors::serialize(views, None).expect("in-memory safetensors serialization")
    }

    /// Reads a safetensors checkpoint into `layout`: every tensor of the layout present
    /// with its shape and dtype F32, no other tensor, all values finite.
    pub fn from_safetensors(bytes: &[u8], layout: Arc<Layout>) -> Result<Weights, TrainError> {
        let st =
            SafeTensors::deserialize(bytes).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        if let Some(extra) = st.names().into_iter().find(|n| layout.entry(n).is_none()) {
            return Err(TrainError::Checkpoint(format!(
                "unknown tensor {extra:?} for model {:?}",
                layout.name()
            )));
        }
        let mut data = Vec::with_capacity(layout.len());
        for e in layout.entries() {
            let t = st
                .tensor(&e.name)
                .map_err(|_| TrainError::Checkpoint(format!("tensor {:?} missing", e.name)))?;
            if t.dtype() != Dtype::F32 {
                return Err(TrainError::Checkpoint(format!(
                    "tensor {:?} is {:?}, want F32",
                    e.name,
                    t.dtype()
                )));
            }
            if t.shape() != e.shape.as_slice() {
                return Err(TrainError::Checkpoint(format!(
                    "tensor {:?} has shape {:?}, the model wants {:?}",
                    e.name,
                    t.shape(),
                    e.shape
                )));
            }
            data.extend(
                t.data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
        }
        let w = Weights::from_vec(layout, data)?;
        w.check_finite()?;
        Ok(w)
    }
}
