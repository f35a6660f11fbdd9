//! NumPy multidirectional broadcasting (the ONNX rule): shapes are right-aligned, and each
//! pair of dims must be equal or one of them 1.

use super::OpError;
use ndarray::{ArrayD, ArrayViewD, IxDyn};

/// The broadcast shape of `a` and `b`, or `Invalid` when they are incompatible.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, OpError> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for (i, o) in out.iter_mut().enumerate() {
        // Dim i of the result, counted from the left of the (right-aligned) result.
        let da = (i + a.len()).checked_sub(rank).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(rank).map_or(1, |j| b[j]);
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(OpError::Invalid(format!(
                "shapes {a:?} and {b:?} do not broadcast"
            )));
        };
    }
    Ok(out)
}

/// The broadcast shape of any number of shapes (the identity for one, `[]` for none).
pub fn broadcast_all(shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    shapes
        .iter()
        .try_fold(Vec::new(), |acc, s| broadcast_shapes(&acc, s))
}

/// A view of `a` broadcast to `shape` (no copy), or `Invalid` when `a` does not broadcast
/// to it (unidirectionally: `shape` must be the larger one).
pub fn broadcast_view<'a, T>(
    a: &'a ArrayD<T>,
    shape: &[usize],
) -> Result<ArrayViewD<'a, T>, OpError> {
    a.broadcast(IxDyn(shape)).ok_or_else(|| {
        OpError::Invalid(format!(
            "shape {:?} does not broadcast to {shape:?}",
            a.shape()
        ))
    })
}

/// An owned copy of `a` broadcast to `shape` (row-major).
pub fn broadcast_to<T: Clone>(a: &ArrayD<T>, shape: &[usize]) -> Result<ArrayD<T>, OpError> {
    Ok(broadcast_view(a, shape)?.to_owned())
}

/// `f` applied elementwise to `a` and `b` broadcast together.
pub fn zip_with<A, B, R>(
    a: &ArrayD<A>,
    b: &ArrayD<B>,
    f: impl FnMut(&A, &B) -> R,
) -> Result<ArrayD<R>, OpError> {
    let shape = broadcast_shapes(a.shape(), b.shape())?;
    let av = broadcast_view(a, &shape)?;
    let bv = broadcast_view(b, &shape)?;
    Ok(ndarray::Zip::from(&av).and(&bv).map_collect(f))
}

/// `f` applied elementwise to `a`, `b` and `c` broadcast together.
pub fn zip3_with<A, B, C, R>(
    a: &ArrayD<A>,
    b: &ArrayD<B>,
    c: &ArrayD<C>,
    f: impl FnMut(&A, &B, &C) -> R,
) -> Result<ArrayD<R>, OpError> {
    let shape = broadcast_all(&[a.shape(), b.shape(), c.shape()])?;
    let av = broadcast_view(a, &shape)?;
    let bv = broadcast_view(b, &shape)?;
    let cv = broadcast_view(c, &shape)?;
    Ok(ndarray::Zip::from(&av).and(&bv).and(&cv).map_collect(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        assert_eq!(broadcast_shapes(&[2, 3, 4], &[4]).unwrap(), vec![2, 3, 4]);
        assert_eq!(broadcast_shapes(&[1, 3], &[2, 1]).unwrap(), vec![2, 3]);
        assert_eq!(broadcast_shapes(&[], &[5]).unwrap(), vec![5]);
        assert_eq!(broadcast_shapes(&[0, 1], &[1, 3]).unwrap(), vec![0, 3]);
        assert_eq!(broadcast_shapes(&[1], &[0]).unwrap(), vec![0]);
        assert!(broadcast_shapes(&[2, 3], &[3, 2]).is_err());
        assert_eq!(
            broadcast_all(&[&[3, 1], &[1, 4], &[2, 1, 1]]).unwrap(),
            vec![2, 3, 4]
        );
    }

    #[test]
    fn arrays() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 1]), vec![1, 2]).unwrap();
        let b = ArrayD::from_shape_vec(IxDyn(&[3]), vec![10, 20, 30]).unwrap();
        let c = zip_with(&a, &b, |x, y| x + y).unwrap();
        assert_eq!(c.shape(), &[2, 3]);
        assert_eq!(
            c.iter().copied().collect::<Vec<_>>(),
            [11, 21, 31, 12, 22, 32]
        );
        assert_eq!(broadcast_to(&a, &[2, 2]).unwrap().shape(), &[2, 2]);
        assert!(broadcast_view(&b, &[2]).is_err());
    }
}
