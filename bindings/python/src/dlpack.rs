//! Tensors handed to torch without a copy: DLPack capsules over memory
//! this module owns (a private, copy-on-write map of the file, one aligned
//! copy of it, or a storage ptload-device uploaded to a GPU), kept alive
//! by every tensor made from it.
//!
//! The capsule protocol: a `PyCapsule` named `dltensor` holding a
//! `DLManagedTensor*`. A consumer (`torch._C._from_dlpack`) renames it
//! `used_dltensor` and calls the tensor's `deleter` when its tensor dies,
//! from whichever thread frees it; a capsule never consumed calls the
//! deleter from its own destructor. The deleter only drops Rust values
//! (an `Arc` of the memory and two boxed arrays), so it needs no GIL.
//!
//! Device memory: every copy into it has completed when the upload
//! returns (its streams are synchronized), so a consumer may read it on
//! any stream without waiting. Storages of one device share one
//! allocation, freed when the last tensor viewing any of them dies, after
//! all work queued in the device's context has finished.
#![allow(unsafe_code)]

use std::ffi::{c_void, CStr};
use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use ptload_reader::DType;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::{ffi, Bound, PyAny, PyResult, Python};

const DLTENSOR: &CStr = c"dltensor";
/// `kDLCPU`.
const CPU: i32 = 1;
/// `kDLCUDA`.
const CUDA: i32 = 2;
/// The `manager_ctx` of every managed tensor this module makes: tells its
/// capsules from others' (a static has one address).
static MARK: [u8; 1] = [0];

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack's element type: a type code, bits per lane, lanes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// The managed tensor and what its pointers point into; `managed` first,
/// so a `*mut DlManagedTensor` is a `*mut Owned`.
#[repr(C)]
struct Owned {
    managed: DlManagedTensor,
    _shape: Box<[i64]>,
    _strides: Box<[i64]>,
    keep: Region,
}

/// Bytes a capsule may view: host memory this module owns, or a storage
/// on a GPU.
#[derive(Clone)]
pub enum Region {
    Host(Arc<Memory>),
    Cuda(Arc<ptload_device::CudaStorage>),
}

impl Region {
    /// The first byte's address, its length, and DLPack's device.
    fn span(&self) -> (*mut u8, usize, DlDevice) {
        match self {
            Region::Host(m) => (
                m.ptr,
                m.len,
                DlDevice {
                    device_type: CPU,
                    device_id: 0,
                },
            ),
            Region::Cuda(c) => (
                // A device address, only ever handed on, never dereferenced.
                c.device_ptr() as usize as *mut u8,
                c.len(),
                DlDevice {
                    device_type: CUDA,
                    device_id: c.ordinal() as i32,
                },
            ),
        }
    }
}

/// The DLPack type of `dtype`, for the types torch reads from DLPack
/// exactly as it saves them.
pub fn dl_dtype(dtype: DType) -> Option<DlDataType> {
    let (code, bits) = match dtype {
        DType::F64 => (2, 64),
        DType::F32 => (2, 32),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::C64 => (5, 64),
        DType::C128 => (5, 128),
        DType::I8 => (0, 8),
        DType::I16 => (0, 16),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
        DType::U8 => (1, 8),
        DType::Bool => (6, 8),
        _ => return None,
    };
    Some(DlDataType {
        code,
        bits,
        lanes: 1,
    })
}

/// Aligned heap bytes: storages of a zip file are 64-byte aligned in it.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Block([u8; 64]);

/// Memory torch's tensors view: writable, private to this process.
pub struct Memory {
    ptr: *mut u8,
    len: usize,
    _keep: Keep,
}

enum Keep {
    Map(#[allow(dead_code)] memmap2::MmapMut),
    Heap(#[allow(dead_code)] Vec<Block>),
}

// SAFETY: `ptr` points into the map or the heap blocks `_keep` owns, which
// live as long as `Memory`. Rust never reads or writes through it after
// construction; only the tensors made from it do, as torch's own memory.
unsafe impl Send for Memory {}
// SAFETY: as above; `Memory` has no methods that touch the bytes.
unsafe impl Sync for Memory {}

impl Memory {
    /// A private, copy-on-write map of `path`: tensors may be written, the
    /// file never is.
    pub fn map_private(path: &Path) -> std::io::Result<Memory> {
        let file = File::open(path)?;
        // SAFETY: a MAP_PRIVATE map: writes stay in this process's pages.
        // The file changing underneath changes the bytes tensors see (as
        // with torch's own map) but never the map's length or validity;
        // every view is checked against `len` before it is made.
        let map = unsafe { memmap2::MmapOptions::new().map_copy(&file)? };
        Ok(Memory::of_map(map))
    }

    /// A shared, writable map of `path` (torch's `MAP_SHARED` mmap
    /// option): writes to tensors reach the file.
    pub fn map_shared(path: &Path) -> std::io::Result<Memory> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        // SAFETY: a MAP_SHARED map the caller asked for by choosing torch's
        // shared mmap option: writes go to the file, as torch's do. The
        // length is fixed at map time and every view is checked against it.
        let map = unsafe { memmap2::MmapOptions::new().map_mut(&file)? };
        Ok(Memory::of_map(map))
    }

    fn of_map(mut map: memmap2::MmapMut) -> Memory {
        let ptr = map.as_mut_ptr();
        let len = map.len();
        Memory {
            ptr,
            len,
            _keep: Keep::Map(map),
        }
    }

    /// `path` read once into aligned memory, in pieces: each one's length
    /// is added to `done`, and the read stops when `cancel` is set.
    pub fn read(path: &Path, work: &crate::Work) -> std::io::Result<Memory> {
        const PIECE: usize = 64 << 20;
        let mut file = File::open(path)?;
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("the file does not fit in memory"))?;
        let mut memory = Memory::zeroed(len);
        let bytes = memory.bytes_mut();
        let mut done = 0;
        while done < len {
            if work.cancelled() {
                return Err(std::io::Error::other("the read was cancelled"));
            }
            let end = len.min(done.saturating_add(PIECE));
            let Some(piece) = bytes.get_mut(done..end) else {
                return Err(std::io::Error::other("a read past its buffer"));
            };
            match file.read(piece)? {
                0 => return Err(std::io::Error::other("the file shrank while it was read")),
                n => {
                    done += n;
                    work.add(n as u64);
                }
            }
        }
        Ok(memory)
    }

    /// A copy of `data` in aligned memory.
    pub fn copy(data: &[u8]) -> Memory {
        let mut memory = Memory::zeroed(data.len());
        memory.bytes_mut().copy_from_slice(data);
        memory
    }

    fn zeroed(len: usize) -> Memory {
        let mut blocks = vec![Block([0; 64]); len.div_ceil(64)];
        let ptr = blocks.as_mut_ptr().cast::<u8>();
        Memory {
            ptr,
            len,
            _keep: Keep::Heap(blocks),
        }
    }

    /// The bytes, while this `Memory` is still unshared.
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` and `len` describe the blocks `_keep` owns
        // (`len` <= 64 * blocks); `&mut self` means no tensor views them yet.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// Bytes a strided view spans from its first element (0 when empty);
/// `None` on overflow.
pub fn extent(shape: &[u64], stride: &[u64], itemsize: u64) -> Option<u64> {
    if shape.contains(&0) {
        return Some(0);
    }
    let mut last = 0u64;
    for (&size, &step) in shape.iter().zip(stride) {
        last = last.checked_add((size - 1).checked_mul(step)?)?;
    }
    last.checked_add(1)?.checked_mul(itemsize)
}

/// A DLPack capsule for the strided view of `region` that starts `offset`
/// bytes in, with element type `dtype` (of `itemsize` bytes).
pub fn capsule<'py>(
    py: Python<'py>,
    region: &Region,
    offset: u64,
    dtype: DlDataType,
    itemsize: u64,
    shape: &[u64],
    stride: &[u64],
) -> PyResult<Bound<'py, PyAny>> {
    let (base, len, device) = region.span();
    let span = extent(shape, stride, itemsize)
        .and_then(|n| n.checked_add(offset))
        .filter(|&end| end <= len as u64);
    if span.is_none() || shape.len() != stride.len() {
        return Err(PyValueError::new_err(format!(
            "a view of {shape:?} elements at byte {offset} does not fit the {len} bytes it views"
        )));
    }
    let to_i64 = |v: &[u64]| -> PyResult<Box<[i64]>> {
        v.iter()
            .map(|&x| i64::try_from(x).map_err(|_| PyValueError::new_err("size out of range")))
            .collect()
    };
    let mut shape = to_i64(shape)?;
    let mut strides = to_i64(stride)?;
    let ndim = i32::try_from(shape.len()).map_err(|_| PyValueError::new_err("too many dims"))?;
    let owned = Box::new(Owned {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                // Address arithmetic only (a device address is never
                // dereferenced here): offset + extent <= len, checked above.
                data: base.wrapping_add(offset as usize).cast(),
                device,
                ndim,
                dtype,
                shape: shape.as_mut_ptr(),
                strides: strides.as_mut_ptr(),
                byte_offset: 0,
            },
            manager_ctx: MARK.as_ptr().cast_mut().cast(),
            deleter: Some(delete),
        },
        _shape: shape,
        _strides: strides,
        keep: region.clone(),
    });
    let raw = Box::into_raw(owned).cast::<c_void>();
    // SAFETY: `raw` is a live `Owned` whose first field is the managed
    // tensor; the capsule takes it over (its destructor or the consumer
    // calls `delete` once). On failure we free it ourselves.
    unsafe {
        let capsule = ffi::PyCapsule_New(raw, DLTENSOR.as_ptr(), Some(capsule_destructor));
        if capsule.is_null() {
            delete(raw.cast());
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, capsule))
    }
}

/// Frees a managed tensor made by [`capsule`].
unsafe extern "C" fn delete(managed: *mut DlManagedTensor) {
    if !managed.is_null() {
        // SAFETY: made by `Box::into_raw` of an `Owned` in `capsule`, and
        // called once: by the consumer, or by the capsule it never consumed.
        drop(unsafe { Box::from_raw(managed.cast::<Owned>()) });
    }
}

/// A capsule's destructor: frees the tensor when nobody consumed it (a
/// consumer renames the capsule `used_dltensor` and owns it from then on).
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with the capsule being destroyed;
    // `PyCapsule_IsValid` does not fail, and its pointer is ours when the
    // name is still `dltensor`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr());
            delete(managed.cast());
        }
    }
}

/// What a capsule made by [`capsule`] views, for tests: DLPack's device
/// (type, id), dtype (code, bits, lanes), shape, strides, and the bytes
/// its view spans from its first element (read back from the device for
/// a GPU's). The capsule is left as it was.
#[allow(clippy::type_complexity)]
pub fn describe(
    capsule: &Bound<'_, PyAny>,
) -> PyResult<((i32, i32), (u8, u8, u16), Vec<i64>, Vec<i64>, Vec<u8>)> {
    // SAFETY: a capsule named `dltensor` made by this module holds a live
    // `Owned` (checked by name, then by its `manager_ctx` mark) until its
    // destructor runs, which cannot happen while `capsule` is borrowed.
    let owned = unsafe {
        let ptr = ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr());
        if ptr.is_null() {
            return Err(PyErr::fetch(capsule.py()));
        }
        let managed = &*ptr.cast::<DlManagedTensor>();
        if managed.manager_ctx != MARK.as_ptr().cast_mut().cast() {
            return Err(PyValueError::new_err("not a capsule ptload made"));
        }
        &*ptr.cast::<Owned>()
    };
    let t = &owned.managed.dl_tensor;
    let (base, len, _) = owned.keep.span();
    let start = (t.data as usize).wrapping_sub(base as usize);
    let shape = owned._shape.to_vec();
    let strides = owned._strides.to_vec();
    let as_u64 = |v: &[i64]| v.iter().map(|&x| x as u64).collect::<Vec<_>>();
    let itemsize = u64::from(t.dtype.bits).div_ceil(8) * u64::from(t.dtype.lanes);
    let n = extent(&as_u64(&shape), &as_u64(&strides), itemsize).unwrap_or(0) as usize;
    if start.checked_add(n).is_none_or(|end| end > len) {
        return Err(PyValueError::new_err("the view is outside its memory"));
    }
    let bytes = match &owned.keep {
        // SAFETY: `start + n <= len` bytes of the memory `keep` holds alive.
        Region::Host(m) => unsafe { std::slice::from_raw_parts(m.ptr.add(start), n) }.to_vec(),
        Region::Cuda(c) => c
            .read_range(start, n)
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
    };
    Ok((
        (t.device.device_type, t.device.device_id),
        (t.dtype.code, t.dtype.bits, t.dtype.lanes),
        shape,
        strides,
        bytes,
    ))
}
