"""Device arrays for a run: PyTorch's when PyTorch and a GPU are there, kgen's DeviceBuffers
otherwise. Both sides offer the same few operations: upload, empty (poisoned with NaN),
poison, download, copy, and the stream to launch on."""
from __future__ import annotations

import numpy as np

from .. import ir
from ..reference import host_dtype
from ..runtime.device import check as check_cuda



def torch_usable() -> bool:
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


class TorchArrays:
    name = "torch"

    def __init__(self, device_id: int):
        import torch

        self.torch = torch
        self.device = torch.device("cuda", device_id)

    def _dtype(self, dtype: ir.DType):
        from .torch_eval import torch_dtype

        return torch_dtype(dtype)

    def upload(self, host: np.ndarray, param: ir.Param):
        torch = self.torch
        if param.dtype is ir.DType.BF16 or param.dtype.fp8:  # ml_dtypes: through their bits
            bits = np.uint16 if param.dtype is ir.DType.BF16 else np.uint8
            cpu = torch.from_numpy(np.ascontiguousarray(host).view(bits)).view(
                self._dtype(param.dtype))
        else:
            cpu = torch.from_numpy(np.ascontiguousarray(host))
        if param.kind is ir.ParamKind.TENSOR and param.layout is ir.Layout.COL:
            return cpu.transpose(-1, -2).contiguous().to(self.device).transpose(-1, -2)
        return cpu.to(self.device)

    def empty(self, shape: tuple[int, ...], param: ir.Param):
        torch = self.torch
        dtype = self._dtype(param.dtype)
        if param.kind is ir.ParamKind.TENSOR and param.layout is ir.Layout.COL:
            swapped = (*shape[:-2], shape[-1], shape[-2])  # each matrix column-major
            out = torch.empty(swapped, dtype=dtype, device=self.device).transpose(-1, -2)
        else:
            out = torch.empty(shape, dtype=dtype, device=self.device)
        out.fill_(float("nan"))
        return out

    def poison(self, array) -> None:
        array.fill_(float("nan"))

    def download(self, array, param: ir.Param) -> np.ndarray:
        host = array.float().cpu().numpy()
        return host.astype(host_dtype(param.dtype))

    def copy(self, array):
        return array.clone()

    def stream(self) -> int:
        return int(self.torch.cuda.current_stream(self.device).cuda_stream)


class BufferArrays:
    name = "kgen"

    def __init__(self, device_id: int):
        self.device_id = device_id

    def upload(self, host: np.ndarray, param: ir.Param):
        from ..runtime.buffers import DeviceBuffer

        return DeviceBuffer.from_host(host, layout=param.layout, device_id=self.device_id)

    def empty(self, shape: tuple[int, ...], param: ir.Param):
        from ..runtime.buffers import DeviceBuffer

        strides = None
        if param.kind is ir.ParamKind.TENSOR and param.layout is ir.Layout.COL:
            rows, cols = shape[-2:]
            strides = (1, rows) if len(shape) == 2 else (rows * cols, 1, rows)
        out = DeviceBuffer(shape, param.dtype, strides=strides, device_id=self.device_id)
        self.poison(out)
        return out

    def poison(self, array) -> None:
        array.fill_bytes(0xFF)  # all-ones bytes are a NaN in f16, bf16 and f32

    def download(self, array, param: ir.Param) -> np.ndarray:
        return array.to_host()

    def copy(self, array):
        from ..runtime.buffers import DeviceBuffer

        copy = DeviceBuffer(array.shape, array.dtype, strides=array.strides,
                            device_id=array.device_id)
        from cuda.bindings import driver

        check_cuda(driver.cuMemcpyDtoD(copy.ptr, array.ptr, array.nbytes), "cuMemcpyDtoD")
        return copy

    def stream(self) -> int:
        return 0


def sync(stream: int, what: str) -> None:
    from cuda.bindings import driver

    check_cuda(driver.cuStreamSynchronize(driver.CUstream(stream)), what)
