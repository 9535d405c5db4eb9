//! The `wine-mlp` model on burn (flex CPU backend): `11 → hidden → hidden → 1`, ReLU.
//!
//! Exported (PyTorch) convention, as in [`Weights`]: `fcK.weight [out, in]`, `fcK.bias
//! [out]`, `y = x·Wᵀ + b`. burn's `linear` (and `burn::nn::Linear`) stores the weight
//! `[in, out]` and computes `y = x·W + b`. [`to_burn`] and [`from_burn`] transpose
//! explicitly on the host; the forward pass only ever sees burn's layout.

use burn::tensor::activation::relu;
use burn::tensor::module::linear;
use burn::tensor::{DType, Device, Tensor, TensorData};

use super::data::FEATURES;
use super::weights::{Layout, Weights};
use super::TrainError;

/// The three linear layers, in order.
pub(crate) const LAYERS: [&str; 3] = ["fc1", "fc2", "fc3"];

/// One linear layer's parameters in burn's layout: `weight` `[d_in, d_out]` row-major,
/// `bias` `[d_out]`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BurnLinear {
    pub d_in: usize,
    pub d_out: usize,
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

/// Row-major `[rows, cols]` → row-major `[cols, rows]`.
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    debug_assert_eq!(src.len(), rows * cols);
    let mut out = vec![0.0; src.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = src[r * cols + c];
        }
    }
    out
}

/// The layers of `w` in burn's layout (`fcK.weight [out, in]` transposed to `[in, out]`).
/// Fails with [`TrainError::LayoutMismatch`] unless `w` has the `wine-mlp` tensors with
/// consistent shapes (11 inputs, one output).
pub(crate) fn to_burn(w: &Weights) -> Result<[BurnLinear; 3], TrainError> {
    if w.data.len() != w.layout.len() || w.layout.entries().len() != 6 {
        return Err(TrainError::LayoutMismatch(format!(
            "model {:?} is not a wine-mlp (fc1..fc3 weight and bias)",
            w.layout.name()
        )));
    }
    let mut prev_out = FEATURES;
    let layer = |name: &str, prev_out: usize| -> Result<BurnLinear, TrainError> {
        let wn = format!("{name}.weight");
        let bn = format!("{name}.bias");
        let (we, be) = match (w.layout.entry(&wn), w.layout.entry(&bn)) {
            (Some(we), Some(be)) => (we, be),
            _ => {
                return Err(TrainError::LayoutMismatch(format!(
                    "model {:?} lacks {wn} or {bn}",
                    w.layout.name()
                )))
            }
        };
        let ok = we.shape.len() == 2
            && we.shape[1] == prev_out
            && we.shape[0] >= 1
            && be.shape == [we.shape[0]];
        if !ok {
            return Err(TrainError::LayoutMismatch(format!(
                "{wn} {:?} / {bn} {:?} do not follow a layer of {prev_out} outputs",
                we.shape, be.shape
            )));
        }
        let (d_out, d_in) = (we.shape[0], we.shape[1]);
        Ok(BurnLinear {
            d_in,
            d_out,
            weight: transpose(&w.data[we.offset..we.offset + we.len], d_out, d_in),
            bias: w.data[be.offset..be.offset + be.len].to_vec(),
        })
    };
    let l1 = layer(LAYERS[0], prev_out)?;
    prev_out = l1.d_out;
    let l2 = layer(LAYERS[1], prev_out)?;
    if l2.d_out != l1.d_out {
        return Err(TrainError::LayoutMismatch(
            "fc2 must keep the hidden width".into(),
        ));
    }
    prev_out = l2.d_out;
    let l3 = layer(LAYERS[2], prev_out)?;
    if l3.d_out != 1 {
        return Err(TrainError::LayoutMismatch(
            "fc3 must have one output".into(),
        ));
    }
    Ok([l1, l2, l3])
}

/// Writes burn-layout layers back into `out` (weights transposed to `[out, in]`). `out`'s
/// layout must be the one [`to_burn`] accepted for these layers.
pub(crate) fn from_burn(layers: &[BurnLinear; 3], out: &mut Weights) -> Result<(), TrainError> {
    let layout: &Layout = &out.layout.clone();
    for (name, l) in LAYERS.iter().zip(layers) {
        let we = layout.entry(&format!("{name}.weight"));
        let be = layout.entry(&format!("{name}.bias"));
        match (we, be) {
            (Some(we), Some(be)) if we.shape == [l.d_out, l.d_in] && be.shape == [l.d_out] => {
                out.data[we.offset..we.offset + we.len]
                    .copy_from_slice(&transpose(&l.weight, l.d_in, l.d_out));
                out.data[be.offset..be.offset + be.len].copy_from_slice(&l.bias);
            }
            _ => {
                return Err(TrainError::LayoutMismatch(format!(
                    "{name}: layout does not match a {}→{} layer",
                    l.d_in, l.d_out
                )))
            }
        }
    }
    Ok(())
}

/// An f32 tensor of `shape` holding `data`, on `device`.
pub(crate) fn tensor<const D: usize>(
    data: Vec<f32>,
    shape: [usize; D],
    device: &Device,
) -> Tensor<D> {
    Tensor::<D>::from_data(TensorData::new(data, shape), (device, DType::F32))
}

/// A layer's parameters as burn tensors: weight `[in, out]`, bias `[out]`.
pub(crate) struct LayerTensors {
    pub weight: Tensor<2>,
    pub bias: Tensor<1>,
}

impl LayerTensors {
    /// Uploads `l` to `device`; with `grad`, as autodiff leaves that keep their gradient
    /// (`device` must then be an autodiff device).
    pub(crate) fn new(l: &BurnLinear, device: &Device, grad: bool) -> LayerTensors {
        let weight = tensor(l.weight.clone(), [l.d_in, l.d_out], device);
        let bias = tensor(l.bias.clone(), [l.d_out], device);
        if grad {
            LayerTensors {
                weight: weight.require_grad(),
                bias: bias.require_grad(),
            }
        } else {
            LayerTensors { weight, bias }
        }
    }
}

/// The forward pass: `x [B, 11]` → predictions `[B, 1]`:
/// `relu(relu(x·W1 + b1)·W2 + b2)·W3 + b3` (burn layout).
pub(crate) fn forward(layers: &[LayerTensors; 3], x: Tensor<2>) -> Tensor<2> {
    let lin = |x: Tensor<2>, l: &LayerTensors| linear(x, l.weight.clone(), Some(l.bias.clone()));
    let h1 = relu(lin(x, &layers[0]));
    let h2 = relu(lin(h1, &layers[1]));
    lin(h2, &layers[2])
}

/// Reads a float tensor back as `Vec<f32>`.
pub(crate) fn read(t: Tensor<2>) -> Result<Vec<f32>, TrainError> {
    read_any(t)
}

/// Reads any-rank float tensor back as `Vec<f32>` (row-major).
pub(crate) fn read_any<const D: usize>(t: Tensor<D>) -> Result<Vec<f32>, TrainError> {
    t.try_into_data()
        .map_err(|e| TrainError::Backend(format!("{e:?}")))?
        .try_into_vec::<f32>()
        .map_err(|e| TrainError::Backend(format!("{e:?}")))
}

/// `(1/B) Σ (p_i − y_i)²`, accumulated in f64 in sample order from the f32 predictions `p`
/// and targets `y` (host-side, so the reported loss does not depend on a backend's
/// reduction order).
pub(crate) fn mse(pred: &[f32], y: &[f32]) -> f64 {
    debug_assert_eq!(pred.len(), y.len());
    let s: f64 = pred
        .iter()
        .zip(y)
        .map(|(&p, &t)| (f64::from(p) - f64::from(t)).powi(2))
        .sum();
    s / pred.len() as f64
}
