"""Kernels with one mistake in their body each, for test_errors.py (bad_declarations.py has the rest).

Every case is a function that defines (and returns) its kernel, so that mistakes Python itself evaluates when the
kernel is defined (annotations, decorator arguments) surface when the test calls it, not when this module is
imported. The line that tkc must point at ends with the marker `# ERROR`.
"""

# No `from __future__ import annotations`: annotations are evaluated when a kernel is defined, as in most users' files.
# ruff: noqa: F403, F405, F821, E731
import math

import tkc
from tkc.lang import *


@tkc.func
def plus_one(x):
    return x + 1


@tkc.func
def bad_helper(x):
    return exp3(x)  # ERROR


@tkc.func
def helper_returns_in_branch(x):
    if x > 0:
        return x  # ERROR
    return 0


@tkc.func
def recursive_helper(x):
    return recursive_helper(x)  # ERROR


# --------------------------------------------------------------------------------------------------------------
# Shapes


def mma_k_mismatch():
    @tkc.kernel
    def k(A: gl[bf16, 2], C: gl[f32, 2]):
        a = load(A, (0, 0), rt[bf16, 16, 32])
        b = load(A, (0, 0), rt[bf16, 64, 16])
        c = mma_AB(a, b, zeros(rt[f32, 16, 16]))  # ERROR
        store(C, c, (0, 0))

    return k


def mma_accumulator_shape():
    @tkc.kernel
    def k(A: gl[bf16, 2], C: gl[f32, 2]):
        q = load(A, (0, 0), rt[bf16, 16, 64])
        kk = load(A, (0, 0), rt[bf16, 32, 64])
        s = mma_ABt(q, kk, zeros(rt[f32, 16, 64]))  # ERROR
        store(C, s, (0, 0))

    return k


def mm_k_mismatch():
    @tkc.kernel
    def k(A: gl[bf16, 2], C: gl[f32, 2]):
        a = load(A, (0, 0), rt[bf16, 32, 16])
        b = load(A, (0, 0), rt[bf16, 32, 16])
        store(C, mm_AtB(a, b.T), (0, 0))  # ERROR

    return k


def elementwise_shape():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 32])
        b = load(A, (0, 0), rt[f32, 32, 32])
        c = a * b  # ERROR

    return k


def row_vector_length():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 32])
        m = sub_row(a, zeros(rv[f32, 32]))  # ERROR

    return k


def tile_minus_vector():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 32])
        p = a - row_max(a)  # ERROR

    return k


# --------------------------------------------------------------------------------------------------------------
# Dtypes


def mma_ab_dtypes():
    @tkc.kernel
    def k(A: gl[bf16, 2], B: gl[f16, 2], C: gl[f32, 2]):
        a = load(A, (0, 0), rt[bf16, 16, 32])
        b = load(B, (0, 0), rt[f16, 32, 16])
        store(C, mma_AB(a, b, zeros(rt[f32, 16, 16])), (0, 0))  # ERROR

    return k


def mma_f32_inputs():
    @tkc.kernel
    def k(A: gl[f32, 2], C: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 32])
        store(C, mma_ABt(a, a, zeros(rt[f32, 16, 16])), (0, 0))  # ERROR

    return k


def fp8_mma_ab():
    @tkc.kernel(warps=4)
    def k(A: gl[fp8e4m3, 2], B: gl[fp8e4m3, 2], C: gl[f32, 2]):
        a = load(A, (0, 0), st[fp8e4m3, 64, 64])
        b = load(B, (0, 0), st[fp8e4m3, 64, 64])
        store(C, mma_AB(a, b, zeros(rt[f32, 16, 64])), (warp_id(), 0))  # ERROR

    return k


def multicast_into_registers():
    @tkc.kernel(cluster=2, min_target="sm_90a")
    def k(A: gl[bf16, 2], C: gl[bf16, 2]):
        a = load(A, (0, 0), rt[bf16, 16, 64], multicast=True)  # ERROR
        store(C, a, (0, 0))

    return k


def multicast_not_a_constant():
    @tkc.kernel(cluster=2, min_target="sm_90a")
    def k(A: gl[bf16, 2], C: gl[bf16, 2]):
        s = load(A, (0, 0), st[bf16, 64, 64], multicast=block_idx()[0] > 0)  # ERROR
        store(C, load(s), (0, 0))

    return k


def multicast_group_outside_the_cluster():
    @tkc.kernel(cluster=4, min_target="sm_90a")
    def k(A: gl[bf16, 2], C: gl[f32, 2]):
        s = load(A, (0, 0), st[bf16, 64, 64], multicast=(3, 1))  # ERROR
        store(C, load(s, (0, 0), rt[bf16, 16, 64]).to(f32), (0, 0))

    return k


def multicast_slice_of_partial_swizzle_rows():
    @tkc.kernel(cluster=4, min_target="sm_90a")
    def k(A: gl[bf16, 2], C: gl[f32, 2]):
        acc = zeros(rt[f32, 16, 16])
        for j in range(cdiv(A.shape[1], 64)):
            b = load(A, (0, j), st[bf16, 16, 64], multicast=True)  # ERROR
            acc = mma_ABt(load(b, (0, 0), rt[bf16, 16, 64]), load(b, (0, 0), rt[bf16, 16, 64]), acc)
        store(C, acc, (0, 0))

    return k


def cluster_load_before_sync():
    @tkc.kernel(cluster=2, min_target="sm_90a")
    def k(C: gl[f32, 2]):
        s = store(empty(st[f32, 16, 64]), zeros(rt[f32, 16, 64]))
        store(C, load(s, (0, 0), rt[f32, 16, 64], rank=1), (0, 0))  # ERROR

    return k


def cluster_load_rank_outside():
    @tkc.kernel(cluster=2, min_target="sm_90a")
    def k(C: gl[f32, 2]):
        s = store(empty(st[f32, 16, 64]), zeros(rt[f32, 16, 64]))
        cluster_sync()
        store(C, load(s, (0, 0), rt[f32, 16, 64], rank=2), (0, 0))  # ERROR

    return k


def cluster_load_of_global():
    @tkc.kernel(cluster=2, min_target="sm_90a")
    def k(A: gl[f32, 2], C: gl[f32, 2]):
        store(C, load(A, (0, 0), rt[f32, 16, 64], rank=1), (0, 0))  # ERROR

    return k


def cluster_store_while_peers_read():
    @tkc.kernel(cluster=2, min_target="sm_90a")
    def k(C: gl[f32, 2]):
        s = store(empty(st[f32, 16, 64]), zeros(rt[f32, 16, 64]))
        cluster_sync()
        a = load(s, (0, 0), rt[f32, 16, 64], rank=1)
        s = store(s, a + 1.0)  # ERROR
        store(C, load(s), (0, 0))

    return k


def cluster_loop_without_second_sync():
    @tkc.kernel(cluster=2, min_target="sm_90a")
    def k(X: gl[f32, 3], C: gl[f32, 2]):
        s = empty(st[f32, 16, 64])
        total = zeros(rt[f32, 16, 64])
        for i in range(X.shape[0]):
            s = store(s, load(X, (i, 0, 0), rt[f32, 16, 64]))
            cluster_sync()
            total = total + load(s, (0, 0), rt[f32, 16, 64], rank=1)  # ERROR
        store(C, total, (0, 0))

    return k


def cluster_sync_in_branch():
    @tkc.kernel(cluster=2, min_target="sm_90a")
    def k(C: gl[f32, 2]):
        if block_idx()[0] > 0:
            cluster_sync()  # ERROR
        store(C, zeros(rt[f32, 16, 64]), (0, 0))

    return k


def arrive_last_in_branch():
    @tkc.kernel()
    def k(C: gl[i32, 1], O: gl[f32, 2]):
        if block_idx()[0] > 0:
            if arrive_last(C, 0, num_blocks()[0]):  # ERROR
                store(O, zeros(rt[f32, 16, 64]), (0, 0))

    return k


def arrive_last_on_floats():
    @tkc.kernel()
    def k(C: gl[f32, 1], O: gl[f32, 2]):
        if arrive_last(C, 0, num_blocks()[0]):  # ERROR
            store(O, zeros(rt[f32, 16, 64]), (0, 0))

    return k


def load_from_counters():
    @tkc.kernel()
    def k(C: gl[i32, 2], O: gl[f32, 2]):
        store(O, load(C, (0, 0), rt[f32, 16, 64]), (0, 0))  # ERROR

    return k


def fp8_register_tile():
    @tkc.kernel
    def k(A: gl[fp8e4m3, 2], C: gl[f32, 2]):
        a = load(A, (0, 0), rt[fp8e4m3, 16, 32])  # ERROR
        store(C, a.to(f32), (0, 0))

    return k


def fp8_convert_in_registers():
    @tkc.kernel(warps=4)
    def k(A: gl[f32, 2], C: gl[fp8e4m3, 2]):
        store(C, load(A, (0, 0), rt[f32, 16, 64]).to(fp8e4m3), (0, 0))  # ERROR

    return k


def fp8_k_step():
    @tkc.kernel(warps=4)
    def k(A: gl[fp8e4m3, 2], C: gl[f32, 2]):
        a = load(A, (0, 0), st[fp8e4m3, 64, 48])
        store(C, mma_ABt(a, a, zeros(rt[f32, 16, 64])), (warp_id(), 0))  # ERROR

    return k


def elementwise_dtypes():
    @tkc.kernel
    def k(A: gl[bf16, 2], C: gl[f32, 2]):
        a = load(A, (0, 0), rt[bf16, 16, 32])
        b = load(A, (0, 0), rt[f32, 16, 32])
        store(C, a + b, (0, 0))  # ERROR

    return k


def shared_copy_converts():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        s = load(A, (0, 0), st[f32, 64, 64])  # ERROR

    return k


# --------------------------------------------------------------------------------------------------------------
# Tile sizes


def tile_not_multiple_of_16():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = load(A, (0, 0), rt[bf16, 16, 24])  # ERROR

    return k


def vector_size_from_constant():
    @tkc.kernel
    def k(A: gl[bf16, 2], N: const = 20):
        v = zeros(rv[f32, N])  # ERROR

    return k


def spec_outside_kernel():
    T = st[bf16, 64, 100]  # ERROR

    @tkc.kernel
    def k(A: gl[bf16, 2]):
        s = load(A, (0, 0), T)

    return k


# --------------------------------------------------------------------------------------------------------------
# Shared memory: 128 KB + 64 KB fits sm_90a's 227 KB but not sm_80's 163 KB; another 64 KB fits neither.


def shared_192kb():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = load(A, (0, 0), st[bf16, 256, 256])
        b = load(A, (0, 0), st[bf16, 128, 256])  # ERROR

    return k


def shared_163kb_unaligned():
    # 128 KB + 35 KB: the buffers fill sm_80's 163 KB exactly, but a launch also asks for the 1 KB that aligns them
    @tkc.kernel
    def k(A: gl[bf16, 2], B: gl[f32, 2]):
        a = load(A, (0, 0), st[bf16, 256, 256])
        b = load(A, (0, 0), st[bf16, 16, 1120])  # ERROR
        store(B, load(a, (0, 0), rt[f32, 16, 16]) + load(b, (0, 0), rt[f32, 16, 16]), (0, 0))

    return k


def views_of_128kb():
    @tkc.kernel
    def k(A: gl[bf16, 2], B: gl[f32, 2]):
        a = load(A, (0, 0), st[bf16, 256, 256])
        left, right = load(a, (0, 0), st[bf16, 256, 128]), load(a, (0, 1), st[bf16, 256, 128])
        top = load(a, (1, 0), st[bf16, 128, 256])
        x = load(left, (0, 0), rt[f32, 16, 16]) + load(right, (0, 0), rt[f32, 16, 16])
        store(B, x + load(top, (0, 0), rt[f32, 16, 16]), (0, 0))

    return k


def shared_256kb():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = load(A, (0, 0), st[bf16, 256, 256])
        b = load(A, (0, 0), st[bf16, 128, 256])
        c = empty(st[bf16, 128, 256])  # ERROR

    return k


def three_buffers():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        for j in range(A.shape[0]):
            s = empty(st[bf16, 64, 64], buffers=3)  # ERROR

    return k


def double_buffer_outside_a_loop():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        s = empty(st[bf16, 64, 64], buffers=2)  # ERROR

    return k


# --------------------------------------------------------------------------------------------------------------
# Unknown names and ops


def unknown_name():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 16])
        b = exp3(a)  # ERROR

    return k


def unknown_name_no_match():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        b = qqqqqq + 1  # ERROR

    return k


def unknown_tile_method():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 16])
        b = a.sum()  # ERROR

    return k


def unknown_module_attribute():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 16])
        b = tkc.exp3(a)  # ERROR

    return k


def matmul_operator():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = load(A, (0, 0), rt[bf16, 16, 16])
        b = a @ a  # ERROR

    return k


def operator_not_on_tiles():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 16])
        b = a // 2  # ERROR

    return k


def python_function_on_runtime_value():
    @tkc.kernel
    def k(A: gl[f32, 2], x: float):
        y = math.sqrt(x)  # ERROR

    return k


def error_inside_helper():
    @tkc.kernel
    def k(A: gl[f32, 2], n: int):
        y = bad_helper(n)

    return k


# --------------------------------------------------------------------------------------------------------------
# Values that change type across a loop or a branch


def loop_tile_changes_dtype():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        acc = zeros(rt[f32, 16, 16])
        for i in range(n):
            acc = load(A, (i, 0), rt[bf16, 16, 16])  # ERROR

    return k


def loop_int_becomes_float():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        total = 0
        for i in range(n):
            total = total + 0.5  # ERROR

    return k


def loop_changes_compile_time_value():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        spec = rt[f32, 16, 16]
        for i in range(n):
            spec = rt[f32, 32, 32]  # ERROR

    return k


def branch_types_differ():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        y = zeros(rt[f32, 16, 16])
        if n > 0:
            y = zeros(rt[bf16, 16, 16])  # ERROR

    return k


def branch_changes_tuple():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        t = (1, 2)
        if n > 0:
            t = (3, 4)  # ERROR

    return k


def assigned_in_one_branch():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        if n > 0:
            y = 1
        z = y + 1  # ERROR

    return k


def assigned_only_in_loop():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        for i in range(n):
            t = i
        u = t  # ERROR

    return k


# --------------------------------------------------------------------------------------------------------------
# Python constructs a kernel does not support


def while_loop():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        while n > 0:  # ERROR
            n = n - 1

    return k


def lambda_():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        f = lambda x: x  # ERROR

    return k


def break_():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        for i in range(n):
            break  # ERROR

    return k


def continue_():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        for i in range(4):
            continue  # ERROR

    return k


def list_comprehension():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        xs = [i for i in range(4)]  # ERROR

    return k


def with_block():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        with open("x"):  # ERROR
            pass

    return k


def try_block():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        try:  # ERROR
            pass
        except Exception:
            pass

    return k


def nested_def():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        def f(x):  # ERROR
            return x

    return k


def walrus():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        if (y := 3) > 2:  # ERROR
            pass

    return k


def for_else():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        for i in range(n):  # ERROR
            pass
        else:
            pass

    return k


def raise_():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        raise ValueError("no")  # ERROR

    return k


def import_in_kernel():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        import os  # ERROR

    return k


def dict_literal():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        d = {"a": 1}  # ERROR

    return k


def starred_assignment():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        x, *rest = block_idx()  # ERROR

    return k


def assign_into_tile():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 16])
        a[0] = 1.0  # ERROR

    return k


def assign_attribute():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 16])
        a.dtype = bf16  # ERROR

    return k


def kernel_returns_value():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        return 1  # ERROR

    return k


def kernel_returns_in_runtime_branch():
    @tkc.kernel
    def k(A: gl[f32, 2], n: int):
        if n > 0:
            return  # ERROR
        store(A, zeros(rt[f32, 16, 16]), (0, 0))

    return k


def kernel_returns_in_runtime_loop():
    @tkc.kernel
    def k(A: gl[f32, 2], n: int):
        for i in range(n):
            store(A, zeros(rt[f32, 16, 16]), (i, 0))
            return  # ERROR

    return k


def return_in_runtime_branch():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        y = helper_returns_in_branch(n)

    return k


def recursion():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        y = recursive_helper(n)

    return k


def async_kernel():
    @tkc.kernel
    async def k(A: gl[bf16, 2]):  # ERROR
        pass

    return k


def kernel_calls_kernel():
    @tkc.kernel
    def inner(A: gl[bf16, 2]):
        pass

    @tkc.kernel
    def k(A: gl[bf16, 2]):
        inner(A)  # ERROR

    return k


# --------------------------------------------------------------------------------------------------------------
# Argument counts


def too_many_arguments():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 16])
        b = exp(a, a)  # ERROR

    return k


def missing_accumulator():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = load(A, (0, 0), rt[bf16, 16, 16])
        b = mma_AB(a, a)  # ERROR

    return k


def unknown_keyword():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = zeros(rt[f32, 16, 16], fill=3)  # ERROR

    return k


def helper_missing_argument():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        u = plus_one()  # ERROR

    return k


def range_four_arguments():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        for i in range(0, 4, 1, 1):  # ERROR
            pass

    return k


def load_index_count():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = load(A, (0, 0, 0), rt[bf16, 16, 16])  # ERROR

    return k


def load_without_type():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = load(A, (0, 0))  # ERROR

    return k


def unpack_count():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        x, y = block_idx()  # ERROR

    return k


# --------------------------------------------------------------------------------------------------------------
# store(dst, src, index) with the arguments swapped, or `conflicts` (of store or load) misused


def store_swapped_global():
    @tkc.kernel
    def k(A: gl[bf16, 2], C: gl[bf16, 2]):
        a = load(A, (0, 0), rt[bf16, 16, 16])
        store(a, C, (0, 0))  # ERROR

    return k


def store_swapped_shared():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = load(A, (0, 0), rt[bf16, 64, 64])
        s = empty(st[bf16, 64, 64])
        store(a, s)  # ERROR

    return k


def store_shared_into_shared():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        s = load(A, (0, 0), st[bf16, 64, 64])
        u = empty(st[bf16, 64, 64])
        store(u, s)  # ERROR

    return k


def store_conflicts_into_global():
    @tkc.kernel
    def k(A: gl[bf16, 2], C: gl[bf16, 2]):
        a = load(A, (0, 0), rt[bf16, 16, 16])
        store(C, a, (0, 0), conflicts=2)  # ERROR

    return k


def load_conflicts_from_global():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 16], conflicts=2)  # ERROR

    return k


def store_conflicts_zero():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        s = store(empty(sv[f32, 64]), load(A, (0, 0), rv[f32, 64]), conflicts=0)  # ERROR

    return k


# --------------------------------------------------------------------------------------------------------------
# Run-time values where compile-time ones are needed


def runtime_tile_size():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        a = zeros(rt[f32, 16, n])  # ERROR

    return k


def runtime_fill_value():
    @tkc.kernel
    def k(A: gl[bf16, 2], x: float):
        a = full(rt[f32, 16, 16], x)  # ERROR

    return k


def runtime_assert():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        assert n > 0  # ERROR

    return k


def runtime_static_assert():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        static_assert(n > 0, "n must be positive")  # ERROR

    return k


def runtime_loop_step():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        for i in range(n, 0, -2):  # ERROR
            pass

    return k


def runtime_index_into_tuple():
    @tkc.kernel
    def k(A: gl[bf16, 2], n: int):
        t = (1, 2)
        x = t[n]  # ERROR

    return k


# --------------------------------------------------------------------------------------------------------------
# Other misuse


def shared_tile_in_mma():
    @tkc.kernel
    def k(A: gl[bf16, 2]):
        a = load(A, (0, 0), st[bf16, 16, 16])
        c = mma_AB(a, a, zeros(rt[f32, 16, 16]))  # ERROR

    return k


def compare_tiles():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        a = load(A, (0, 0), rt[f32, 16, 16])
        if a > 0:  # ERROR
            pass

    return k


def float_condition():
    @tkc.kernel
    def k(A: gl[f32, 2], x: float):
        y = 1 if x else 2  # ERROR

    return k


def shape_dimension_out_of_range():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        n = A.shape[2]  # ERROR

    return k


def failed_static_assert():
    @tkc.kernel
    def k(A: gl[f32, 2], D: const = 96):
        static_assert(D in (64, 128), f"D must be 64 or 128, got {D}")  # ERROR

    return k


def constant_does_not_fit_int32():
    @tkc.kernel
    def k(A: gl[f32, 2], n: int):
        x = n + 2**40  # ERROR

    return k


def compile_time_division_by_zero():
    @tkc.kernel
    def k(A: gl[f32, 2], D: const = 0):
        x = 64 // D  # ERROR

    return k


def cdiv_by_zero():
    @tkc.kernel
    def k(A: gl[f32, 2], D: const = 0):
        x = cdiv(64, D)  # ERROR

    return k


def runtime_cdiv_by_zero():
    @tkc.kernel
    def k(A: gl[f32, 2], D: const = 0):
        x = cdiv(A.shape[0], D)  # ERROR

    return k


def comparing_a_language_function():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        static_assert(warp_id > 0, "never")  # ERROR

    return k


def negating_a_language_function():
    @tkc.kernel
    def k(A: gl[f32, 2]):
        x = -warp_id  # ERROR

    return k


def rows_index_in_the_column_place():
    @tkc.kernel
    def k(X: gl[bf16, 2], Y: gl[bf16, 2]):
        store(Y, load(X, (0, rows(3)), rt[bf16, 16, 16]), (0, 0))  # ERROR

    return k


def shared_version_read_after_store():
    @tkc.kernel(warps=2)
    def k(X: gl[f32, 1], Y: gl[f32, 2]):
        s = zeros(sv[f32, 32])
        a = store(s, load(X, (warp_id(),), rv[f32, 16]), (warp_id(),))
        store(s, load(X, (warp_id(),), rv[f32, 16]) * 2.0, (warp_id(),))  # overwrites a's buffer in place
        store(Y, load(a, (0,), rv[f32, 32]), (0, 0))  # ERROR

    return k


def atomic_add_of_bf16():
    @tkc.kernel
    def k(X: gl[bf16, 2], Y: gl[bf16, 2]):
        atomic_add(Y, load(X, (0, 0), rt[bf16, 16, 16]), (0, 0))  # ERROR

    return k


def atomic_add_into_shared():
    @tkc.kernel
    def k(X: gl[f32, 2]):
        s = zeros(st[f32, 16, 16])
        atomic_add(s, load(X, (0, 0), rt[f32, 16, 16]), (0, 0))  # ERROR

    return k


def rotate_pairs_of_bf16():
    @tkc.kernel
    def k(X: gl[bf16, 2], Y: gl[bf16, 2]):
        store(Y, rotate_pairs(load(X, (0, 0), rt[bf16, 16, 32])), (0, 0))  # ERROR

    return k


def repeat_into_bf16():
    @tkc.kernel
    def k(X: gl[f32, 2], Y: gl[bf16, 2]):
        store(Y, load(X, (0, 0), rt[bf16, 16, 32], repeat=2), (0, 0))  # ERROR

    return k


def repeat_of_three():
    @tkc.kernel
    def k(X: gl[f32, 2], Y: gl[f32, 2]):
        store(Y, load(X, (0, 0), rt[f32, 16, 96], repeat=3), (0, 0))  # ERROR

    return k


def repeat_leaving_too_few_columns():
    @tkc.kernel
    def k(X: gl[f32, 2], Y: gl[f32, 2]):
        store(Y, load(X, (0, 0), rt[f32, 16, 16], repeat=2), (0, 0))  # ERROR

    return k


def rotate_pairs_of_an_mma_b_operand():
    @tkc.kernel
    def k(X: gl[f32, 2], Y: gl[f32, 2]):
        a = load(X, (0, 0), rt[f32, 16, 16]).to(bf16)
        b = load(X, (1, 0), rt[f32, 16, 16])
        r = rotate_pairs(b)  # ERROR
        c = mma_AB(a, b.to(bf16), zeros(rt[f32, 16, 16]))
        store(Y, r, (0, 0))
        store(Y, mma_AB(a, b.to(bf16), c), (1, 0))

    return k


def rows_at_in_a_store_from_shared():
    @tkc.kernel
    def k(X: gl[bf16, 2], P: gl[i32, 1], Y: gl[bf16, 2]):
        s = load(X, (0, 0), st[bf16, 64, 64])
        store(Y, s, (rows_at(P, 0), 0))  # ERROR

    return k


def rows_at_into_a_multicast_load():
    @tkc.kernel(cluster=2)
    def k(X: gl[bf16, 2], P: gl[i32, 1], Y: gl[bf16, 2]):
        store(Y, load(X, (rows_at(P, 0), 0), st[bf16, 64, 64], multicast=True), (0, 0))  # ERROR

    return k


def rows_at_by_floats():
    @tkc.kernel
    def k(X: gl[f32, 2], P: gl[f32, 1], Y: gl[f32, 2]):
        store(Y, load(X, (rows_at(P, 0), 0), rt[f32, 16, 32]), (0, 0))  # ERROR

    return k


def rows_at_in_the_column_place():
    @tkc.kernel
    def k(X: gl[f32, 2], P: gl[i64, 1], Y: gl[f32, 2]):
        store(Y, load(X, (0, rows_at(P, 0)), rt[f32, 16, 32]), (0, 0))  # ERROR

    return k


def tile_of_row_numbers():
    @tkc.kernel
    def k(P: gl[i64, 2], Y: gl[f32, 2]):
        store(Y, load(P, (0, 0), rt[f32, 16, 32]), (0, 0))  # ERROR

    return k


def vector_of_ints():
    @tkc.kernel
    def k(P: gl[i32, 1], Y: gl[f32, 2]):
        v = zeros(rv[i32, 16])  # ERROR
        store(Y, add_row(zeros(rt[f32, 16, 32]), v), (0, 0))

    return k
