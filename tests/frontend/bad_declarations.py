"""Kernels whose declaration is wrong, for test_errors.py: parameters and their annotations, constants, the
decorator and the target, and the kernel language used outside a kernel.

As in bad_kernels.py, each case defines its kernel when called, and the line tkc must point at ends with `# ERROR`.
"""

# No `from __future__ import annotations`: annotations are evaluated when a kernel is defined, as in most users' files.
# ruff: noqa: F403, F405
import tkc
from tkc.lang import *


@tkc.func
def identity(x):
    return x


# --------------------------------------------------------------------------------------------------------------
# Parameters and annotations


def annotation_not_a_type():
    @tkc.kernel
    def k(A: gl[bf16, 2], B: list):  # ERROR
        pass

    return k


def annotation_missing():
    @tkc.kernel
    def k(A: gl[bf16, 2], B):  # ERROR
        pass

    return k


def annotation_register_tile():
    @tkc.kernel
    def k(A: rt[bf16, 16, 16]):  # ERROR
        pass

    return k


def annotation_gl_without_rank():
    @tkc.kernel
    def k(A: gl[bf16]):  # ERROR
        pass

    return k


def annotation_gl_rank_too_big():
    @tkc.kernel
    def k(A: gl[bf16, 9]):  # ERROR
        pass

    return k


def annotation_bool():
    @tkc.kernel
    def k(A: gl[bf16, 2], flag: bool):  # ERROR
        pass

    return k


def annotation_unevaluable_string():
    @tkc.kernel
    def k(A: "gl[bf16, 2]", B: "gl[bfloat, 2]"):  # ERROR
        pass

    return k


def dtype_from_unknown_constant():
    @tkc.kernel
    def k(A: gl["DX", 2], DT: const = bf16):  # ERROR
        pass

    return k


def dtype_constant_not_a_dtype():
    @tkc.kernel
    def k(A: gl["DT", 2], DT: const = 16):  # ERROR
        pass

    return k


def default_on_runtime_parameter():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int = 3):  # ERROR
        pass

    return k


def star_args():
    @tkc.kernel
    def k(A: gl[bf16, 2], *rest):  # ERROR
        pass

    return k


def constant_without_default():
    @tkc.kernel
    def k(A: gl[bf16, 2], D: const):  # ERROR
        a = zeros(rt[f32, 16, D])

    return k


def unknown_constant():
    @tkc.kernel
    def k(A: gl[bf16, 2], D: const = 64):  # ERROR
        a = zeros(rt[f32, 16, D])

    return k


def unknown_constant_none_declared():
    @tkc.kernel
    def k(A: gl[bf16, 2]):  # ERROR
        pass

    return k


# --------------------------------------------------------------------------------------------------------------
# Targets and the decorator


def needs_sm90a():
    @tkc.kernel(warps=4, min_target="sm_90a")  # ERROR
    def k(A: gl[bf16, 2]):
        pass

    return k


def unknown_min_target():
    @tkc.kernel(min_target="sm_75")  # ERROR
    def k(A: gl[bf16, 2]):
        pass

    return k


def bad_warps():
    @tkc.kernel(warps=0)  # ERROR
    def k(A: gl[bf16, 2]):
        pass

    return k


def bad_stagger():
    @tkc.kernel(warps=8, stagger=9)  # ERROR
    def k(A: gl[bf16, 2]):
        pass

    return k


def bad_mixed_ring():
    @tkc.kernel(warps=4, mixed_ring=2)  # ERROR
    def k(A: gl[bf16, 2]):
        pass

    return k


def bad_cluster():
    @tkc.kernel(cluster=17)  # ERROR
    def k(A: gl[bf16, 2]):
        pass

    return k


def cluster_on_sm80():
    @tkc.kernel(cluster=2)  # ERROR
    def k(A: gl[bf16, 2]):
        pass

    return k


def bad_late_sums():
    @tkc.kernel(late_sums=2)  # ERROR
    def k(A: gl[bf16, 2]):
        pass

    return k


def unknown_decorator_argument():
    @tkc.kernel(wraps=4)  # ERROR
    def k(A: gl[bf16, 2]):
        pass

    return k


# --------------------------------------------------------------------------------------------------------------
# The language used outside a kernel


def op_outside_kernel():
    x = exp(1.0)  # ERROR


def kernel_called_directly():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        pass

    k(None)  # ERROR


def helper_called_directly():
    identity(1)  # ERROR
