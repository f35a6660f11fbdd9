//! DLPack in and out: how tensors cross between Python and rafter.
//!
//! In: any object with `__dlpack__` (numpy arrays, torch tensors, JAX, CuPy on the CPU...)
//! hands over a `DLManagedTensor`. Row-major memory aligned for its dtype becomes a
//! borrowed runtime tensor ([`rafter_runtime::borrowed`]) that holds the capsule, and with
//! it the producer's array, until the call's work has completed: an input that only CPU
//! kernels read is then never copied. Strided (Fortran-order, sliced), misaligned and bool
//! tensors are copied once into a packed tensor.
//! Out: an output stays in the runtime's own storage, and [`Tensor`] lends that memory to
//! `numpy.from_dlpack` / `torch.from_dlpack` without a copy.
//!
//! The structs are DLPack's C ABI (dlpack.h, version 0.8, the legacy unversioned capsule
//! every consumer still accepts).

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use rafter_ir::DType;
use rafter_runtime::Tensor as RtTensor;

use crate::errors::{to, InputError};

const CAPSULE: &CStr = c"dltensor";
/// `kDLCPU`.
const DEVICE_CPU: i32 = 1;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// DLPack's type codes.
const INT: u8 = 0;
const UINT: u8 = 1;
const FLOAT: u8 = 2;
const BFLOAT: u8 = 4;
const BOOL: u8 = 6;

/// The DLPack type of a rafter dtype.
fn dl_dtype(d: DType) -> Option<DLDataType> {
    let (code, bits) = match d {
        DType::F32 => (FLOAT, 32),
        DType::F64 => (FLOAT, 64),
        DType::F16 => (FLOAT, 16),
        DType::BF16 => (BFLOAT, 16),
        DType::I8 => (INT, 8),
        DType::I16 => (INT, 16),
        DType::I32 => (INT, 32),
        DType::I64 => (INT, 64),
        DType::U8 => (UINT, 8),
        DType::U16 => (UINT, 16),
        DType::U32 => (UINT, 32),
        DType::U64 => (UINT, 64),
        DType::Bool => (BOOL, 8),
    };
    Some(DLDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// The rafter dtype of a DLPack type.
fn rafter_dtype(t: DLDataType) -> Option<DType> {
    if t.lanes != 1 {
        return None;
    }
    [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
    ]
    .into_iter()
    .find(|&d| dl_dtype(d).is_some_and(|x| x.code == t.code && x.bits == t.bits))
}

/// An input read from a DLPack tensor.
pub struct Input {
    /// The runtime tensor: the caller's memory itself when [`Input::copied`] is false.
    pub tensor: RtTensor,
    /// Whether the elements were copied (strided, misaligned or bool data).
    pub copied: bool,
}

/// What keeps a borrowed input's memory alive: the producer's DLPack capsule, left
/// unconsumed, so that freeing it (when the last runtime tensor over the memory goes, after
/// the call's work has completed) runs the producer's deleter, which releases the array.
/// Dropped without the GIL, PyO3 defers the decref to the next time a thread holds it.
struct CapsuleOwner(#[allow(dead_code)] Py<PyAny>);

/// Reads `obj` (anything with `__dlpack__`) as a runtime tensor: in place when its memory
/// is row-major, aligned for its dtype and not bool (the tensor then holds the capsule, and
/// with it the producer's array), else one copy of its elements. `what` names the input in
/// errors.
pub fn tensor_from(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Input> {
    if !obj.hasattr("__dlpack__")? {
        return Err(to::<InputError>(format!(
            "{what}: a {} is not a tensor (pass a numpy array or a DLPack tensor such as a \
             torch tensor)",
            obj.get_type().name()?
        )));
    }
    let capsule = obj.call_method0("__dlpack__")?;
    let cap = capsule.as_ptr();
    // SAFETY: `cap` is a live object (held by `capsule`); PyCapsule_IsValid only reads it
    // and sets no error.
    if unsafe { ffi::PyCapsule_IsValid(cap, CAPSULE.as_ptr()) } != 1 {
        return Err(to::<InputError>(format!(
            "{what}: __dlpack__ returned no unused `dltensor` capsule"
        )));
    }
    // SAFETY: the capsule is valid with this name (checked above), so its pointer is the
    // producer's DLManagedTensor, alive as long as the capsule is (we never consume it: its
    // destructor calls the producer's deleter).
    let managed =
        unsafe { ffi::PyCapsule_GetPointer(cap, CAPSULE.as_ptr()) } as *const DLManagedTensor;
    // SAFETY: as above; `capsule` lives through this call, and a borrowed tensor takes it
    // along, keeping the memory alive as long as the tensor.
    unsafe { read_managed(&*managed, capsule.unbind(), what) }
}

/// `m`'s elements as a runtime tensor, borrowed when its layout allows, else copied.
///
/// # Safety
/// `m` must be a live DLManagedTensor whose `shape`/`strides` arrays hold `ndim` entries
/// and whose data holds the elements they describe (DLPack's contract), kept alive (and
/// its data unwritten by rafter's callers while a call runs) as long as `capsule` lives.
unsafe fn read_managed(m: &DLManagedTensor, capsule: Py<PyAny>, what: &str) -> PyResult<Input> {
    let t = &m.dl_tensor;
    if t.device.device_type != DEVICE_CPU {
        return Err(to::<InputError>(format!(
            "{what}: the tensor is on DLPack device type {} (not the CPU): move it to the \
             CPU first (torch: `.cpu()`)",
            t.device.device_type
        )));
    }
    let dtype = rafter_dtype(t.dtype).ok_or_else(|| {
        to::<InputError>(format!(
            "{what}: DLPack type (code {}, bits {}, lanes {}) has no rafter dtype",
            t.dtype.code, t.dtype.bits, t.dtype.lanes
        ))
    })?;
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: DLPack guarantees `shape` has `ndim` entries.
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(to::<InputError>(format!(
            "{what}: DLPack shape {shape:?} has a negative dim {d}"
        )));
    }
    let dims: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
    let strides: Option<&[i64]> = if t.strides.is_null() || ndim == 0 {
        None
    } else {
        // SAFETY: non-null strides have `ndim` entries.
        Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) })
    };
    let elements: usize = dims.iter().product();
    let size = dtype.size_of();
    let len = elements * size;
    let data = if elements == 0 {
        std::ptr::null()
    } else {
        // SAFETY: DLPack's data pointer plus its byte offset is the first element.
        unsafe { (t.data as *const u8).add(t.byte_offset as usize) }
    };
    let failed = |e: &dyn std::fmt::Display| to::<InputError>(format!("{what}: {e}"));
    if strides.is_none_or(|s| row_major(shape, s)) {
        // SAFETY: a compact CPU tensor's `len` bytes start at `data`; the capsule keeps the
        // producer's memory alive, and the caller leaves it unwritten while calls run.
        let borrowed =
            unsafe { RtTensor::borrowed(dtype, &dims, data, len, Box::new(CapsuleOwner(capsule))) };
        if let Ok(tensor) = borrowed {
            return Ok(Input {
                tensor,
                copied: false,
            });
        }
        // Misaligned or bool: one copy (normalising bools).
        let bytes: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(data, len) }
        };
        let tensor = RtTensor::from_le_bytes(dtype, &dims, bytes).map_err(|e| failed(&e))?;
        return Ok(Input {
            tensor,
            copied: true,
        });
    }
    let strides = strides.expect("row-major when there are no strides");
    let mut packed = vec![0u8; len];
    if elements > 0 {
        // SAFETY: DLPack's contract: every index within `shape` at these element strides
        // is an element of the tensor's memory, starting at `data`.
        unsafe { gather(data, shape, strides, size, &mut packed) };
    }
    let tensor = RtTensor::from_le_bytes(dtype, &dims, &packed).map_err(|e| failed(&e))?;
    Ok(Input {
        tensor,
        copied: true,
    })
}

/// Whether `strides` (in elements) lay `shape` out packed and row-major (dims of 1 may
/// have any stride).
fn row_major(shape: &[i64], strides: &[i64]) -> bool {
    let mut want = 1i64;
    for k in (0..shape.len()).rev() {
        if shape[k] > 1 && strides[k] != want {
            return false;
        }
        want = want.saturating_mul(shape[k].max(1));
    }
    true
}

/// Copies the elements of a strided tensor at `src` into `out`, row-major: `size` bytes
/// per element, `strides` in elements (any sign, 0 for a broadcast dim).
///
/// # Safety
/// For every index within `shape`, `src + sum(index * stride) * size` must be `size`
/// readable bytes; `out` must hold the product of `shape` times `size` bytes.
unsafe fn gather(src: *const u8, shape: &[i64], strides: &[i64], size: usize, out: &mut [u8]) {
    let Some((&n, inner_shape)) = shape.split_first() else {
        // SAFETY: the caller's contract covers the one element a 0-d tensor has.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), size) };
        return;
    };
    let step = strides[0] as isize * size as isize;
    let chunk = out.len() / n as usize;
    for (i, dst) in out
        .chunks_exact_mut(chunk.max(1))
        .enumerate()
        .take(n as usize)
    {
        // SAFETY: index `i` along this dim is within `shape`, so the caller's contract
        // covers the sub-tensor it starts.
        unsafe {
            gather(
                src.offset(i as isize * step),
                inner_shape,
                &strides[1..],
                size,
                dst,
            )
        };
    }
}

/// A rafter output tensor. Its memory is the runtime's; `numpy.from_dlpack(t)` and
/// `torch.from_dlpack(t)` view it without a copy (the view keeps it alive).
#[pyclass(frozen, module = "rafter")]
pub struct Tensor {
    inner: Arc<RtTensor>,
}

impl Tensor {
    pub fn new(t: RtTensor) -> Tensor {
        Tensor { inner: Arc::new(t) }
    }
}

/// What a DLPack consumer's view keeps alive: the tensor and the shape array it points at.
struct Lent {
    _tensor: Arc<RtTensor>,
    shape: Vec<i64>,
}

unsafe extern "C" fn delete_lent(m: *mut DLManagedTensor) {
    // SAFETY: `m` and its context were made by `Box::into_raw` in `__dlpack__`, and
    // DLPack calls the deleter once.
    unsafe {
        drop(Box::from_raw((*m).manager_ctx as *mut Lent));
        drop(Box::from_raw(m));
    }
}

unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: a capsule still named `dltensor` was never consumed, so we still own its
    // DLManagedTensor; a consumer renames it (`used_dltensor`) when it takes ownership.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, CAPSULE.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(cap, CAPSULE.as_ptr()) as *mut DLManagedTensor;
            delete_lent(m);
        }
    }
}

#[pymethods]
impl Tensor {
    /// The dims.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.inner.shape().to_vec()
    }

    /// The element type, as rafter names it (`f32`, `i64`, `bf16`...).
    #[getter]
    fn dtype(&self) -> String {
        self.inner.dtype().to_string()
    }

    /// The address of the first element (to check that views share this memory).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.inner.le_bytes().as_ptr() as usize
    }

    /// DLPack: a capsule lending this tensor's memory (CPU, row-major).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<Bound<'_, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version);
        if dl_device.is_some_and(|d| d.0 != DEVICE_CPU) || copy == Some(true) {
            return Err(PyBufferError::new_err(
                "rafter tensors are lent on the CPU without a copy only",
            ));
        }
        let dtype = dl_dtype(self.inner.dtype()).ok_or_else(|| {
            PyBufferError::new_err(format!("{} has no DLPack type", self.inner.dtype()))
        })?;
        let mut lent = Box::new(Lent {
            _tensor: self.inner.clone(),
            shape: self.inner.shape().iter().map(|&d| d as i64).collect(),
        });
        let managed = Box::new(DLManagedTensor {
            dl_tensor: DLTensor {
                // The consumer may write through it (torch tensors are mutable): the memory
                // is this tensor's alone, and rafter never reads it again.
                data: self.inner.le_bytes().as_ptr() as *mut c_void,
                device: DLDevice {
                    device_type: DEVICE_CPU,
                    device_id: 0,
                },
                ndim: lent.shape.len() as i32,
                dtype,
                shape: lent.shape.as_mut_ptr(),
                // Null strides: compact row-major.
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_lent),
        });
        let managed = Box::into_raw(managed);
        // SAFETY: `managed` is ours until the capsule hands it on; the context box moves
        // into it (freed by `delete_lent`), and the shape Vec's buffer does not move.
        unsafe {
            (*managed).manager_ctx = Box::into_raw(lent) as *mut c_void;
            let cap = ffi::PyCapsule_New(
                managed as *mut c_void,
                CAPSULE.as_ptr(),
                Some(capsule_destructor),
            );
            if cap.is_null() {
                delete_lent(managed);
                return Err(PyErr::fetch(py));
            }
            Ok(Bound::from_owned_ptr(py, cap).unbind())
        }
    }

    /// DLPack: `(kDLCPU, 0)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (DEVICE_CPU, 0)
    }

    fn __repr__(&self) -> String {
        format!(
            "rafter.Tensor({}{:?})",
            self.inner.dtype(),
            self.inner.shape()
        )
    }
}
