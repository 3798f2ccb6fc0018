"""kgen: fused GPU kernels from a short description, emitted as standalone CUDA C++."""
__version__ = "0.1.0"
