"""A small GPU buffer for when PyTorch is absent: allocate, copy in, copy out, fill.

Memory comes from cuda.core's device memory resource; copies and fills go through the driver
(cuMemcpyHtoD/DtoH, cuMemsetD8), synchronous with respect to the host. A buffer holds one
contiguous block and a logical view of it (shape and strides in elements), so a column-major
[rows, cols] tensor is a block of cols x rows with strides (1, rows).
"""
from __future__ import annotations

import numpy as np

from ..enums import DType, Layout
from ..errors import KgenRuntimeError
from .device import activate, check, current_device_id
from .tensors import DeviceArray, contiguous_strides, dtype_of_numpy, numpy_dtype


class DeviceBuffer:
    def __init__(self, shape: tuple[int, ...], dtype: DType, *,
                 strides: tuple[int, ...] | None = None, device_id: int | None = None):
        from cuda.core import Device

        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.strides = tuple(strides) if strides is not None else contiguous_strides(self.shape)
        self.elements = _span(self.shape, self.strides)
        self.nbytes = self.elements * dtype.nbytes
        self.device_id = current_device_id() if device_id is None else device_id
        activate(self.device_id)
        device = Device(self.device_id)
        # cuda.core allocates only on a Device it has made current itself: activate() returns
        # early when another library (torch) made the same primary context current
        device.set_current()
        self._stream = device.default_stream
        # At least one byte: a zero-size allocation has no address to hand out.
        self._buffer = device.allocate(max(self.nbytes, 1), stream=self._stream)
        self._stream.sync()
        self.ptr = int(self._buffer.handle)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def empty(cls, shape, dtype: DType, **kwargs) -> "DeviceBuffer":
        return cls(tuple(shape), dtype, **kwargs)

    @classmethod
    def from_host(cls, array: np.ndarray, *, layout: Layout = Layout.ROW,
                  device_id: int | None = None) -> "DeviceBuffer":
        """Copy a host array (float16, ml_dtypes.bfloat16 or float32) to the GPU. A 2-D array
        with layout COL is stored column-major: element (r, c) at r + c * rows; a 3-D one (a
        batch of matrices) as one column-major matrix per batch."""
        dtype = dtype_of_numpy(array.dtype)
        if dtype is None:
            raise KgenRuntimeError(f"no kgen dtype for host arrays of {array.dtype}")
        if array.ndim in (2, 3) and layout is Layout.COL:
            rows, cols = array.shape[-2:]
            block = np.ascontiguousarray(np.swapaxes(array, -1, -2))
            strides = (1, rows) if array.ndim == 2 else (rows * cols, 1, rows)
            buffer = cls(array.shape, dtype, strides=strides, device_id=device_id)
        else:
            block = np.ascontiguousarray(array)
            buffer = cls(array.shape, dtype, device_id=device_id)
        buffer.copy_from_host(block)
        return buffer

    # -- transfers ---------------------------------------------------------------------------

    def copy_from_host(self, block: np.ndarray) -> None:
        """Copy a contiguous host block of exactly this buffer's bytes."""
        block = np.ascontiguousarray(block)
        if block.nbytes != self.nbytes:
            raise KgenRuntimeError(f"host block is {block.nbytes} bytes, buffer {self.nbytes}")
        from cuda.bindings import driver

        activate(self.device_id)
        if self.nbytes:
            check(driver.cuMemcpyHtoD(self.ptr, block.ctypes.data, self.nbytes), "cuMemcpyHtoD")

    def to_host(self) -> np.ndarray:
        """The logical array, copied to the host (bf16 as ml_dtypes.bfloat16)."""
        from cuda.bindings import driver

        host_dtype = numpy_dtype(self.dtype)
        raw = np.empty(self.elements, dtype=host_dtype)
        activate(self.device_id)
        if self.nbytes:
            check(driver.cuMemcpyDtoH(raw.ctypes.data, self.ptr, self.nbytes), "cuMemcpyDtoH")
        view = np.lib.stride_tricks.as_strided(
            raw, self.shape, tuple(s * host_dtype.itemsize for s in self.strides)
        )
        return np.array(view)

    def fill_bytes(self, value: int, stream: int = 0) -> None:
        """Set every byte (0xFF makes every f16/bf16/f32 element a NaN), ordered on `stream`."""
        from cuda.bindings import driver

        activate(self.device_id)
        if self.nbytes:
            check(driver.cuMemsetD8Async(self.ptr, value, self.nbytes, stream), "cuMemsetD8Async")

    def as_array(self) -> DeviceArray:
        return DeviceArray(
            ptr=self.ptr, shape=self.shape, strides=self.strides, dtype=self.dtype,
            device_id=self.device_id, dtype_name=self.dtype.dsl_name, kind="kgen", owner=self,
        )

    def close(self) -> None:
        if self._buffer is not None:
            self._buffer.close(self._stream)
            self._buffer = None

    def __repr__(self) -> str:
        return (f"DeviceBuffer({list(self.shape)}, {self.dtype.dsl_name}, strides={self.strides}, "
                f"device={self.device_id})")


def _span(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements from the first to one past the last addressed element."""
    if any(extent == 0 for extent in shape):
        return 0
    return 1 + sum((extent - 1) * stride for extent, stride in zip(shape, strides)) if shape \
        else 1

