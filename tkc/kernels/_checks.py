"""Argument checks shared by the kernels' Python entry points: one clear error naming the argument."""

from __future__ import annotations

from typing import Any

from tkc.errors import KernelArgumentError, KernelTypeError


def check_tensor(name: str, t: Any, dtype: Any, rank: int) -> None:
    if not isinstance(t, _tensor_type()):
        raise KernelTypeError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise KernelArgumentError(f"{name} is on {t.device}; tkc kernels run on CUDA tensors")
    if t.dtype is not dtype:
        raise KernelArgumentError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != rank:
        raise KernelArgumentError(f"{name} must have {rank} dimensions, got shape {tuple(t.shape)}")


def check_like(name: str, t: Any, like: Any, like_name: str = "q") -> None:
    """`t`: a tensor of `like`'s dtype and shape (out=, grad_out)."""
    check_tensor(name, t, like.dtype, like.dim())
    if t.shape != like.shape:
        raise KernelArgumentError(f"{name}: expected the shape of {like_name} {tuple(like.shape)}, got {tuple(t.shape)}")


def _tensor_type() -> Any:
    global _TENSOR
    if _TENSOR is None:
        import torch  # on first use: importing tkc.kernels must not import torch

        _TENSOR = torch.Tensor
    return _TENSOR


_TENSOR: Any = None


def dtype_constant(dtype: Any) -> dict[str, Any]:
    """The constant that makes a kernel of `DT: const = bf16` take tensors of torch `dtype`: none for bf16 (the
    default: bf16 launches keep their specializations), DT=f16 for float16."""
    if str(dtype) == "torch.float16":
        from tkc.lang import f16

        return {"DT": f16}
    return {}


def wgmma_path(device: int, target: str | None) -> bool:
    """Does a kernel entry point take its Hopper (wgmma) kernel: asked for with target="sm_90a", or by default on
    an sm_90 GPU."""
    if target is not None:
        return target == "sm_90a"
    hopper = _HOPPER.get(device)
    if hopper is None:
        import torch

        hopper = _HOPPER[device] = torch.cuda.get_device_capability(device) == (9, 0)
    return hopper


_HOPPER: dict[int, bool] = {}  # device index → is it sm_90


def cached_plan(plans: dict, key: tuple, make: Any) -> Any:
    """plans[key], made by make(*key) the first time: a call's launches worked out once per shape. Emptied when it
    holds 256 (many distinct shapes, e.g. row counts: start over rather than grow)."""
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= 256:
            plans.clear()
        plan = plans[key] = make(*key)
    return plan


def current_stream_key(torch: Any, like: Any) -> tuple[int, int] | None:
    """(device, stream handle) of the current stream on like's device, what the launch runs on; None in a CUDA graph
    capture. Asked once a call and handed to stream_scratch / arrival_counters."""
    if torch.cuda.is_current_stream_capturing():
        return None
    from tkc.runtime import launch

    device = like.get_device()
    return device, launch.current_stream_handle(device)


ARRIVAL_COUNTERS: dict[tuple[int, int], Any] = {}  # (device, stream) → its int32 counters, all at zero
# device → [int32 counters at zero made outside any capture, how many of them captures have taken]
CAPTURED_COUNTERS: dict[int, list[Any]] = {}
CAPTURED_COUNTERS_MADE = 1 << 16  # 256 KB a device: a slice for each captured launch


def arrival_counters(torch: Any, like: Any, count: int, stream: tuple[int, int] | None) -> Any:
    """`count` int32 counters at zero on like's device for a kernel whose last block to arrive finishes the work
    (arrive_last): one set for every such kernel on `stream` (current_stream_key: its launches run one after another
    there, each leaving its counters at zero), made once, grown where a launch needs more. In a CUDA graph capture
    (stream None), counters of the captured launch's own (graphs replayed on two streams at once share none): a
    slice never handed out before of counters made at zero outside captures, or where none are left, counters the
    graph zeroes as it replays (a memset node)."""
    device = like.get_device()
    if stream is None:
        made = CAPTURED_COUNTERS.get(device)
        if made is None or made[1] + count > made[0].numel():
            return torch.zeros(count, dtype=torch.int32, device=like.device)
        made[1] += count
        return made[0][made[1] - count:made[1]]
    counters = ARRIVAL_COUNTERS.get(stream)
    if counters is None or counters.numel() < count:
        counters = ARRIVAL_COUNTERS[stream] = torch.zeros(max(count, 1024), dtype=torch.int32, device=like.device)
        if device not in CAPTURED_COUNTERS:  # for captures to come (none can be made inside one without a memset)
            CAPTURED_COUNTERS[device] = [torch.zeros(CAPTURED_COUNTERS_MADE, dtype=torch.int32, device=like.device), 0]
    return counters


STREAM_SCRATCH: dict[tuple[Any, ...], Any] = {}  # (device, stream, shape, dtype) → a workspace of that stream's


def stream_scratch(torch: Any, like: Any, shape: tuple[int, ...], dtype: Any, stream: tuple[int, int] | None) -> Any:
    """A workspace of `shape` and `dtype` on like's device for launches on `stream` (current_stream_key) that write
    it and read it back (partial sums): made once a shape and stream, as a stream's launches run one after another
    (one call's workspace is free again when the next call's kernels start) — a CUDA allocation is ~4 µs of a short
    call's host time. In a CUDA graph capture (stream None), a fresh one (the graph's own). At most 64 kept."""
    if stream is None:
        return torch.empty(shape, dtype=dtype, device=like.device)
    key = (*stream, shape, dtype)
    scratch = STREAM_SCRATCH.get(key)
    if scratch is None:
        if len(STREAM_SCRATCH) >= 64:  # many shapes (e.g. row counts): start over rather than grow
            STREAM_SCRATCH.clear()
        scratch = STREAM_SCRATCH[key] = torch.empty(shape, dtype=dtype, device=like.device)
    return scratch


def multiprocessors(device: int) -> int:
    """The GPU's multiprocessor count (asked once per device)."""
    sms = MULTIPROCESSORS.get(device)
    if sms is None:
        import torch

        sms = MULTIPROCESSORS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return sms


MULTIPROCESSORS: dict[int, int] = {}  # device index → its multiprocessors


def unread_lse(q: Any) -> Any:
    """A 1-element f32 (1, 1, 1) tensor on q's device: the L argument of attention launches that do not ask for the
    log-sum-exp (the kernels built without it never touch it); made once per device."""
    device = q.get_device()
    unread = UNREAD_LSE.get(device)
    if unread is None:
        import torch

        unread = UNREAD_LSE[device] = q.new_empty((1, 1, 1), dtype=torch.float32)
    return unread


def unread_lengths(q: Any) -> Any:
    """A 1-element int32 tensor on q's device: the Lengths argument of decoding launches over all of k's keys (the
    kernels built without LENGTHS never read it); made once per device."""
    device = q.get_device()
    unread = UNREAD_LENGTHS.get(device)
    if unread is None:
        import torch

        unread = UNREAD_LENGTHS[device] = q.new_zeros((1,), dtype=torch.int32)
    return unread


def unread_pages(q: Any) -> Any:
    """A 1×1 int32 tensor on q's device: the Pages argument (a page table) of decoding launches over caches that are
    not paged (the kernels built without PAGED never read it); made once per device."""
    device = q.get_device()
    unread = UNREAD_PAGES.get(device)
    if unread is None:
        import torch

        unread = UNREAD_PAGES[device] = q.new_zeros((1, 1), dtype=torch.int32)
    return unread


UNREAD_LSE: dict[int, Any] = {}  # device → unread_lse's tensor
UNREAD_LENGTHS: dict[int, Any] = {}  # device → unread_lengths' tensor
UNREAD_PAGES: dict[int, Any] = {}  # device → unread_pages' tensor


def shared_memory_limit(device: int) -> int:
    """The most shared memory a block may ask for on the GPU, in bytes (asked once per device): 227 KB on Hopper,
    163 KB on an A100, 99 KB on sm_86 / sm_89 cards (RTX 30x0 / 40x0)."""
    limit = SHARED_MEMORY_LIMITS.get(device)
    if limit is None:
        import torch

        limit = SHARED_MEMORY_LIMITS[device] = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    return limit


SHARED_MEMORY_LIMITS: dict[int, int] = {}  # device index → its shared memory a block (opt-in), bytes


def wants_grad(torch: Any, *tensors: Any) -> bool:
    """Does autograd need to see this call: grad mode on and some input requiring grad."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise KernelArgumentError(message)


def fail(message: str) -> None:
    """Raise the argument error (for checks on a hot path, whose messages are built only when they fail)."""
    raise KernelArgumentError(message)


def resident_blocks(kernel: Any, key: tuple, *args: Any, **constants: Any) -> int:
    """`kernel.resident_blocks(*args, **constants)` (the grid of a persistent launch), asked once per `key` (device
    and configuration): that call reads every argument again, and a launch should cost one launch."""
    blocks = _RESIDENT.get((kernel, *key))
    if blocks is None:
        blocks = _RESIDENT[(kernel, *key)] = kernel.resident_blocks(*args, **constants)
    return blocks


_RESIDENT: dict[tuple, int] = {}  # (kernel, device, configuration) → blocks the GPU holds at once


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
