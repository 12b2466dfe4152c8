"""Running kernels on the GPU: the CUDA driver through cuda-python, the compile cache, and launches on torch
tensors (`kernel[grid](*args)`)."""

from tkc.runtime.driver import TkcRuntimeError

__all__ = ["TkcRuntimeError"]
