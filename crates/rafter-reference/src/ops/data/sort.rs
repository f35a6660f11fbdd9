//! Sorting ops: TopK and Unique.

use super::layout::take_axis;
use super::{norm_axis, owned, Elem};
use crate::ops::{invalid, OpError};
use crate::{with_array, Tensor};
use ndarray::{ArrayD, Axis, IxDyn};
use std::cmp::Ordering;

/// Builds an array whose `axis` holds `k` entries per lane, from lanes listed in row-major
/// order of the other axes (`rest` is the shape without `axis`).
fn from_lanes<T: Clone>(rest: &[usize], axis: usize, k: usize, data: Vec<T>) -> ArrayD<T> {
    let mut shape = rest.to_vec();
    shape.push(k);
    let a = ArrayD::from_shape_vec(IxDyn(&shape), data).expect("sizes agree");
    let r = shape.len();
    let perm: Vec<usize> = (0..axis).chain([r - 1]).chain(axis..r - 1).collect();
    owned(a.view().permuted_axes(IxDyn(&perm)))
}

/// Values and i64 indices of the `k` largest (or smallest) entries along `axis`, sorted;
/// equal values keep the lower index first, and NaN counts as the largest value.
pub fn top_k(x: &Tensor, k: i64, axis: i64, largest: bool) -> Result<(Tensor, Tensor), OpError> {
    let shape = x.shape().to_vec();
    let axis = norm_axis(axis, shape.len())?;
    if k < 0 || k as usize > shape[axis] {
        return invalid(format!("top_k: k = {k} for a dim of size {}", shape[axis]));
    }
    let k = k as usize;
    let mut rest = shape.clone();
    rest.remove(axis);
    with_array!(x, a => {
        let mut vals = Vec::new();
        let mut idxs = Vec::new();
        for lane in a.lanes(Axis(axis)) {
            let mut order: Vec<usize> = (0..lane.len()).collect();
            order.sort_by(|&i, &j| {
                let c = lane[i].cmp_total(&lane[j]);
                (if largest { c.reverse() } else { c }).then(i.cmp(&j))
            });
            for &i in &order[..k] {
                vals.push(lane[i]);
                idxs.push(i as i64);
            }
        }
        Ok((
            Elem::wrap(from_lanes(&rest, axis, k, vals)),
            Tensor::I64(from_lanes(&rest, axis, k, idxs)),
        ))
    })
}

fn cmp_slices<T: Elem>(a: &[T], b: &[T]) -> Ordering {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.cmp_total(y))
        .find(|c| c.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// ONNX Unique: `(y, indices, inverse_indices, counts)`. Without an axis the input is
/// flattened; with one, whole slices along it are compared.
pub fn unique(
    x: &Tensor,
    axis: Option<i64>,
    sorted: bool,
) -> Result<(Tensor, Tensor, Tensor, Tensor), OpError> {
    let axis = axis.map(|a| norm_axis(a, x.shape().len())).transpose()?;
    with_array!(x, a => {
        let a = match axis {
            Some(_) => owned(a.view()),
            None => super::reshaped(a, &[a.len()]),
        };
        let ax = axis.unwrap_or(0);
        let slices: Vec<Vec<_>> = a.axis_iter(Axis(ax)).map(|s| s.iter().copied().collect()).collect();
        let n = slices.len();
        // Stable sort: the first index of each run of equal slices is its first occurrence.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&i, &j| cmp_slices(&slices[i], &slices[j]));
        let mut first = Vec::new();
        let mut counts = Vec::new();
        let mut inverse = vec![0i64; n];
        for (p, &i) in order.iter().enumerate() {
            if p == 0 || cmp_slices(&slices[order[p - 1]], &slices[i]).is_ne() {
                first.push(i);
                counts.push(0i64);
            }
            *counts.last_mut().unwrap() += 1;
            inverse[i] = first.len() as i64 - 1;
        }
        if !sorted {
            // Order the uniques by first occurrence.
            let mut by_first: Vec<usize> = (0..first.len()).collect();
            by_first.sort_by_key(|&u| first[u]);
            let mut new_pos = vec![0i64; first.len()];
            for (p, &u) in by_first.iter().enumerate() {
                new_pos[u] = p as i64;
            }
            first = by_first.iter().map(|&u| first[u]).collect();
            counts = by_first.iter().map(|&u| counts[u]).collect();
            for v in &mut inverse {
                *v = new_pos[*v as usize];
            }
        }
        let u = first.len();
        let y = take_axis(&a, ax, &first);
        Ok((
            Elem::wrap(y),
            Tensor::i64s(&[u], first.iter().map(|&i| i as i64).collect()),
            Tensor::i64s(&[n], inverse),
            Tensor::i64s(&[u], counts),
        ))
    })
}
