//! Borrowed inputs ([`Tensor::borrowed`]) on the CPU backend: an f32 input only CPU kernels
//! read is bound in place (never copied, its memory held until the call's work completes,
//! even when the caller drops the handle), an i32 input is written into its buffer once,
//! and both give the reference executor's results.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{lower_per_node, LONG};
use rafter_ir::{BinaryOp, ConstData, DType, Dim, Graph, Op, TensorType};
use rafter_runtime::{Session, SessionOptions, Tensor};

/// `y = x @ w + cast(k)`: x f32 [n, 3], w a constant [3, 2], k i32 [n, 2].
fn graph() -> Graph {
    let mut g = Graph::new("borrowed");
    let n = Dim::symbol("n");
    let x = g.add_input(
        "x",
        TensorType::new(DType::F32, vec![n.clone(), Dim::known(3)]),
    );
    let k = g.add_input(
        "k",
        TensorType::new(DType::I32, vec![n.clone(), Dim::known(2)]),
    );
    let w: Vec<u8> = [0.5f32, -1.0, 2.0, 0.25, -0.75, 1.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let w = g.add_const(
        "w",
        ConstData::new(DType::F32, vec![3, 2], Bytes::from(w)).unwrap(),
    );
    let f32_2 = |name: &str| {
        Some((
            name.to_string(),
            TensorType::new(DType::F32, vec![n.clone(), Dim::known(2)]),
        ))
    };
    let xw = g.add_node("mm", Op::MatMul, vec![Some(x), Some(w)], vec![f32_2("xw")])[0].unwrap();
    let kf = g.add_node(
        "cast",
        Op::Cast { to: DType::F32 },
        vec![Some(k)],
        vec![f32_2("kf")],
    )[0]
    .unwrap();
    let y = g.add_node(
        "add",
        Op::Binary { op: BinaryOp::Add },
        vec![Some(xw), Some(kf)],
        vec![f32_2("y")],
    )[0]
    .unwrap();
    g.outputs.push(y);
    g
}

/// The caller's memory: a vector the tensor owns through its owner box (moving a `Vec`
/// does not move its elements), and a flag set when the runtime lets go of it.
struct Owned {
    _data: Vec<f32>,
    released: Arc<AtomicBool>,
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.released.store(true, Ordering::SeqCst);
    }
}

/// A borrowed f32 tensor over `data`, and the address and release flag to check.
fn borrowed(data: Vec<f32>, dims: &[usize]) -> (Tensor, usize, Arc<AtomicBool>) {
    let released = Arc::new(AtomicBool::new(false));
    let (ptr, len) = (data.as_ptr(), std::mem::size_of_val(data.as_slice()));
    let owner = Owned {
        _data: data,
        released: released.clone(),
    };
    // SAFETY: `ptr` points at the `len` bytes of `owner`'s vector, which nothing writes
    // and which lives (at the same address) until `owner` is dropped.
    let t = unsafe { Tensor::borrowed(DType::F32, dims, ptr.cast(), len, Box::new(owner)) };
    (t.unwrap(), ptr as usize, released)
}

#[test]
fn cpu_inputs_are_read_in_place_and_held_until_the_call_completes() {
    let g = graph();
    let rows = 64;
    let xs: Vec<f32> = (0..rows * 3).map(|i| (i as f32 * 0.31).sin()).collect();
    let ks: Vec<i32> = (0..rows * 2).map(|i| i as i32 % 7 - 3).collect();
    let k = Tensor::from_slice(&[rows, 2], &ks).unwrap();
    let want = common::reference_run(&g, &[Tensor::f32s(&[rows, 3], xs.clone()), k.clone()]);
    let devices = rafter_runtime_cpu::devices().unwrap();
    let session = Session::with_options(
        lower_per_node(&g),
        &devices,
        SessionOptions::new().kernel_threads(1),
    )
    .unwrap();
    // x only meets CPU kernels: bound in place. k is i32: written into its buffer.
    assert_eq!(session.input_in_place(), vec![true, false]);

    for call in 0..3u64 {
        let (x, addr, released) = borrowed(xs.clone(), &[rows, 3]);
        assert_eq!(x.as_slice::<f32>().unwrap().as_ptr() as usize, addr);
        let handle = session.submit(vec![x, k.clone()]).unwrap();
        assert_eq!(session.inputs_written(), call + 1, "only k is copied");
        if call == 2 {
            // A handle dropped before the work ends: the call still holds the memory, and
            // lets go of it once its work has completed.
            drop(handle);
            let start = Instant::now();
            while !released.load(Ordering::SeqCst) {
                assert!(start.elapsed() < LONG, "the input was never released");
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        }
        let got = handle.wait(LONG).unwrap();
        assert!(released.load(Ordering::SeqCst), "released with the handle");
        assert_eq!(got[0].shape(), &[rows, 2]);
        for (a, b) in got[0].to_f64_vec().iter().zip(want[0].to_f64_vec()) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }
    let s = session.native_stats();
    assert_eq!(s.misaligned_copies, 0, "{s:?}");
    assert_eq!(s.fallbacks, 0, "{s:?}");
}
