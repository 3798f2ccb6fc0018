"""Any GPU array a user passes, seen as one thing: pointer, shape, strides in elements, dtype.

Accepted: kgen's DeviceBuffer, PyTorch tensors (read directly: their __cuda_array_interface__
refuses bfloat16), anything with __cuda_array_interface__ (CuPy, Numba), and anything with
__dlpack__ (JAX, ...). Conversion never copies and never synchronizes; the caller keeps the
original object alive (DeviceArray.owner holds it) while the kernel runs.
"""
from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..enums import DType
from ..errors import ArgumentError


@dataclass(frozen=True, slots=True)
class DeviceArray:
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: DType | None  # None: an element type kgen does not take (see dtype_name)
    device_id: int | None  # None: unknown (no driver to ask)
    dtype_name: str = ""  # the producer's own name for the element type, for messages
    kind: str = "array"  # "torch", "cuda_array_interface", "dlpack", "kgen"
    owner: Any = field(default=None, compare=False, repr=False)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def describe_dtype(self) -> str:
        return self.dtype.dsl_name if self.dtype is not None else self.dtype_name


# numpy typestr / dtype names -> kgen dtypes
_NUMPY_NAMES = {"float16": DType.F16, "bfloat16": DType.BF16, "float32": DType.F32,
                "float8_e4m3fn": DType.F8E4M3, "float8_e5m2": DType.F8E5M2}
_TORCH_NAMES = {
    "torch.float16": DType.F16,
    "torch.bfloat16": DType.BF16,
    "torch.float32": DType.F32,
    "torch.float8_e4m3fn": DType.F8E4M3,
    "torch.float8_e5m2": DType.F8E5M2,
}
# kgen dtypes -> torch's dtype names (outputs and workspace allocated by torch: the one table)
TORCH_DTYPES = {dtype: name.removeprefix("torch.") for name, dtype in _TORCH_NAMES.items()}


def numpy_dtype(dtype: DType) -> np.dtype:
    """The host dtype of a kgen dtype (bf16 and FP8 are ml_dtypes': kgen.reference's)."""
    from ..reference import host_dtype

    return host_dtype(dtype)


def dtype_of_numpy(dtype: np.dtype) -> DType | None:
    return _NUMPY_NAMES.get(np.dtype(dtype).name)


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def as_device_array(
    obj: Any, name: str, *, device_of: Callable[[int], int | None] | None = None
) -> DeviceArray:
    """View `obj` (argument `name`) as a DeviceArray, or raise ArgumentError naming it.
    `device_of(ptr)` finds the device of a raw pointer (default: ask the driver)."""
    device_of = device_of or pointer_device
    from .buffers import DeviceBuffer

    if isinstance(obj, DeviceArray):
        return obj
    if isinstance(obj, DeviceBuffer):
        return obj.as_array()
    if _is_torch_tensor(obj):
        return _from_torch(obj, name)
    if isinstance(obj, np.ndarray):
        raise ArgumentError(
            f"{name} is a host (NumPy) array; pass a GPU tensor, or copy it to the GPU with "
            f"kgen.DeviceBuffer.from_host({name})"
        )
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is not None:
        return from_cuda_array_interface(interface, name, obj, device_of)
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, name)
    raise ArgumentError(
        f"{name} must be a GPU tensor (torch, cupy, DLPack or __cuda_array_interface__), "
        f"got {type(obj).__name__}"
    )


def _from_torch(tensor: Any, name: str) -> DeviceArray:
    if tensor.device.type != "cuda":
        raise ArgumentError(f"{name} is on the {tensor.device.type.upper()}; pass a CUDA tensor")
    dtype_name = str(tensor.dtype)
    return DeviceArray(
        ptr=int(tensor.data_ptr()),
        shape=tuple(int(s) for s in tensor.shape),
        strides=tuple(int(s) for s in tensor.stride()),
        dtype=_TORCH_NAMES.get(dtype_name),
        device_id=tensor.device.index if tensor.device.index is not None else 0,
        dtype_name=dtype_name.removeprefix("torch."),
        kind="torch",
        owner=tensor,
    )


def from_cuda_array_interface(
    interface: dict, name: str, owner: Any = None,
    device_of: Callable[[int], int | None] | None = None,
) -> DeviceArray:
    """Read a __cuda_array_interface__ dict (version 2 or 3); strides there are in bytes."""
    try:
        shape = tuple(int(s) for s in interface["shape"])
        typestr = interface["typestr"]
        ptr = int(interface["data"][0] or 0)
    except (KeyError, TypeError, ValueError, IndexError):
        raise ArgumentError(f"{name} has a malformed __cuda_array_interface__") from None
    try:
        np_dtype = np.dtype(typestr)
    except TypeError:
        np_dtype = None
    dtype = dtype_of_numpy(np_dtype) if np_dtype is not None else None
    itemsize = np_dtype.itemsize if np_dtype is not None else 1
    byte_strides = interface.get("strides")
    if byte_strides is None:  # C-contiguous
        strides = contiguous_strides(shape)
    else:
        if any(int(s) % itemsize for s in byte_strides):
            raise ArgumentError(f"{name} has strides not a multiple of its element size")
        strides = tuple(int(s) // itemsize for s in byte_strides)
    device_id = (device_of or pointer_device)(ptr) if ptr else None
    return DeviceArray(
        ptr=ptr, shape=shape, strides=strides, dtype=dtype, device_id=device_id,
        dtype_name=np_dtype.name if np_dtype is not None else str(typestr),
        kind="cuda_array_interface", owner=owner,
    )


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


# -- DLPack ----------------------------------------------------------------------------------
# struct DLTensor { void* data; DLDevice device; int32_t ndim; DLDataType dtype;
#                   int64_t* shape; int64_t* strides; uint64_t byte_offset; }


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DL_CUDA = 2
_DL_CUDA_MANAGED = 13
_DL_FLOAT = 2
_DL_BFLOAT = 4
_DL_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 13: "CUDA managed"}

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj: Any, name: str) -> DeviceArray:
    device_type, device_id = obj.__dlpack_device__()
    if int(device_type) not in (_DL_CUDA, _DL_CUDA_MANAGED):
        where = _DL_DEVICE_NAMES.get(int(device_type), f"DLPack device {device_type}")
        raise ArgumentError(f"{name} is on the {where}; pass a CUDA array")
    try:
        capsule = obj.__dlpack__(stream=None)
    except TypeError:
        capsule = obj.__dlpack__()
    # Without max_version the producer hands an unversioned "dltensor" capsule, whose first
    # member is the DLTensor. It is not consumed here: its destructor releases the producer's
    # reference while `obj` itself keeps the memory alive.
    address = _capsule_pointer(capsule, b"dltensor")
    tensor = _DLTensor.from_address(address)
    ndim = int(tensor.ndim)
    shape = tuple(int(tensor.shape[i]) for i in range(ndim))
    if tensor.strides:
        strides = tuple(int(tensor.strides[i]) for i in range(ndim))
    else:
        strides = contiguous_strides(shape)
    code, bits, lanes = int(tensor.dtype.code), int(tensor.dtype.bits), int(tensor.dtype.lanes)
    dtype = None
    if lanes == 1 and code == _DL_FLOAT and bits in (16, 32):
        dtype = DType.F16 if bits == 16 else DType.F32
    elif lanes == 1 and code == _DL_BFLOAT and bits == 16:
        dtype = DType.BF16
    dtype_name = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex"}.get(code, "type")
    ptr = int(tensor.data or 0) + int(tensor.byte_offset)
    return DeviceArray(
        ptr=ptr, shape=shape, strides=strides, dtype=dtype, device_id=int(device_id),
        dtype_name=f"{dtype_name}{bits}", kind="dlpack", owner=obj,
    )


def pointer_device(ptr: int) -> int | None:
    """The device ordinal a device pointer belongs to, or None when the driver cannot tell."""
    from .device import gpu_available

    if not gpu_available():
        return None
    from cuda.bindings import driver

    err, ordinal = driver.cuPointerGetAttribute(
        driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr
    )
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    return int(ordinal)
