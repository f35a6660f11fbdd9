//! DLPack in and out: how tensors cross between Python and rafter.
//!
//! In: any object with `__dlpack__` (numpy arrays, torch tensors, JAX, CuPy on the CPU...)
//! hands over a `DLManagedTensor`; its bytes are read in place and copied once, straight
//! into the runtime tensor the call takes (the runtime owns its inputs while a call runs).
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
const USED_CAPSULE: &CStr = c"used_dltensor";
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

/// Reads `obj` (anything with `__dlpack__`) into a runtime tensor: one copy of its bytes.
/// `what` names the input in errors.
pub fn tensor_from(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<RtTensor> {
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
    // producer's DLManagedTensor, alive until we call its deleter.
    let managed =
        unsafe { ffi::PyCapsule_GetPointer(cap, CAPSULE.as_ptr()) } as *mut DLManagedTensor;
    // SAFETY: as above; we read it, then take ownership by renaming the capsule (so its
    // destructor will not free it) and call the deleter exactly once.
    let result = unsafe { read_managed(&*managed, what) };
    unsafe {
        ffi::PyCapsule_SetName(cap, USED_CAPSULE.as_ptr());
        if let Some(deleter) = (*managed).deleter {
            deleter(managed);
        }
    }
    result
}

/// The runtime tensor holding a copy of `m`'s elements.
///
/// # Safety
/// `m` must be a live DLManagedTensor whose `shape`/`strides` arrays hold `ndim` entries
/// and whose data holds the elements they describe (DLPack's contract).
unsafe fn read_managed(m: &DLManagedTensor, what: &str) -> PyResult<RtTensor> {
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
    let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    if !t.strides.is_null() && ndim > 0 {
        // SAFETY: non-null strides have `ndim` entries.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut want = 1i64;
        for k in (0..ndim).rev() {
            if shape[k] > 1 && strides[k] != want {
                return Err(to::<InputError>(format!(
                    "{what}: the tensor is not contiguous (shape {shape:?}, strides \
                     {strides:?} in elements): pass a row-major copy (numpy: \
                     `np.ascontiguousarray`, torch: `.contiguous()`)"
                )));
            }
            want *= shape[k].max(1);
        }
    }
    let elements: usize = dims.iter().product();
    let len = elements * dtype.size_of();
    let bytes: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: a compact CPU tensor's `len` bytes start at data + byte_offset.
        unsafe {
            std::slice::from_raw_parts((t.data as *const u8).add(t.byte_offset as usize), len)
        }
    };
    RtTensor::from_le_bytes(dtype, &dims, bytes)
        .map_err(|e| to::<InputError>(format!("{what}: {e}")))
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
