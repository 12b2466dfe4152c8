"""Launching a kernel on torch tensors: `kernel[grid](*args, **constants)`.

Arguments are checked before anything reaches the GPU (a bad one is a ValueError/TypeError naming it); each
tensor's alignment (of its address, strides and row length) picks a compiled variant; variants are found in
memory, then in the disk cache, then compiled; the launch goes on torch's current stream.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tkc.errors import KernelArgumentError, KernelTypeError
from tkc.runtime import cache
from tkc.runtime.tensor_maps import tensor_map
from tkc.runtime.driver import (
    Device,
    LoadedKernel,
    TkcRuntimeError,
    device,
    launch,
    load_ptx,
    make_current,
)
from tkc.runtime.driver import resident_blocks as resident_blocks_on
from tkc.targets import TARGETS, get_target

if TYPE_CHECKING:
    from tkc.frontend.kernel import Kernel

INT32 = (-(2**31), 2**31 - 1)
GRID_LIMITS = (2**31 - 1, 65535, 65535)
_loaded: dict[tuple[Any, ...], LoadedKernel] = {}


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise TkcRuntimeError("launching kernels needs torch (pip install torch)") from None
    return torch


def normalize_grid(grid: Any) -> tuple[int, int, int]:
    if type(grid) is tuple:  # the common cases, on every launch: (x,) and an already normal (x, y, z)
        if len(grid) == 1 and type(grid[0]) is int and 0 < grid[0] <= GRID_LIMITS[0]:
            return (grid[0], 1, 1)
        if len(grid) == 3:
            x, y, z = grid
            if (type(x) is int and type(y) is int and type(z) is int and 0 < x <= GRID_LIMITS[0]
                    and 0 < y <= GRID_LIMITS[1] and 0 < z <= GRID_LIMITS[2]):
                return grid
    dims = (grid,) if isinstance(grid, int) else tuple(grid) if isinstance(grid, tuple | list) else None
    if dims is None or not 1 <= len(dims) <= 3:
        raise KernelArgumentError(f"grid must be an int or a tuple of 1 to 3 ints, got {grid!r}")
    out = []
    for i, (d, limit) in enumerate(zip(dims, GRID_LIMITS)):
        if isinstance(d, bool) or not isinstance(d, int) and not hasattr(d, "__index__"):
            raise KernelArgumentError(f"grid dimension {'xyz'[i]} must be an int, got {d!r}")
        d = int(d)
        if not 1 <= d <= limit:
            raise KernelArgumentError(f"grid dimension {'xyz'[i]} must be between 1 and {limit}, got {d}")
        out.append(d)
    return tuple(out + [1] * (3 - len(out)))  # type: ignore[return-value]


def alignment(tensor: Any) -> int:
    """The largest of 16, 8, 4, 2, 1 bytes dividing the tensor's address, its strides (but the last) in bytes, and
    the bytes of its last dimension: the widest access that stays aligned and inside rows."""
    return _alignment(tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.element_size())


@dataclass
class _Checked:
    values: list[Any]  # per runtime parameter: tensor or number
    device: Any  # torch.device or None


def check_arguments(kernel: Kernel, args: Sequence[Any], constants: dict[str, Any]) -> _Checked:
    """The arguments against the kernel's parameters (`constants`: its resolved constants, which may give dtypes)."""
    torch = _torch()
    params = kernel.runtime_params
    if len(args) != len(params):
        names = ", ".join(p.name for p in params)
        raise KernelTypeError(f"kernel `{kernel.name}` takes {len(params)} arguments ({names}), got {len(args)}")
    dev = None
    for p, value in zip(params, args):
        if p.kind == "tensor":
            spec = p.resolved_spec(constants)
            assert spec is not None
            if not isinstance(value, torch.Tensor):
                raise KernelTypeError(f"argument `{p.name}` must be a torch tensor ({spec}), got {type(value).__name__}")
            if value.device.type != "cuda":
                raise KernelArgumentError(f"argument `{p.name}` is on {value.device}; kernels run on CUDA tensors")
            want = getattr(torch, spec.dtype.torch_name)  # type: ignore[union-attr]
            if value.dtype != want:
                raise KernelArgumentError(f"argument `{p.name}` must be {want} ({spec}), got {value.dtype}")
            if value.dim() != spec.rank:
                raise KernelArgumentError(f"argument `{p.name}` must have {spec.rank} dimensions ({spec}), "
                                          f"got shape {tuple(value.shape)}")
            if value.dim() and value.stride(-1) != 1 and value.shape[-1] > 1:
                raise KernelArgumentError(f"argument `{p.name}`: its last dimension must be contiguous (stride 1), "
                                          f"got strides {tuple(value.stride())}")
            if any(s < 0 for s in value.stride()):
                raise KernelArgumentError(f"argument `{p.name}` has a negative stride")
            if any(n >= 2**31 for n in value.shape):
                raise KernelArgumentError(f"argument `{p.name}`: sizes must be below 2**31, got {tuple(value.shape)}")
            if dev is None:
                dev = value.device
            elif value.device != dev:
                raise KernelArgumentError(f"argument `{p.name}` is on {value.device} but earlier tensors are on {dev}")
        elif p.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise KernelTypeError(f"argument `{p.name}` must be an int, got {type(value).__name__}")
            if not INT32[0] <= value <= INT32[1]:
                raise KernelArgumentError(f"argument `{p.name}` must fit in 32 bits, got {value}")
        else:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise KernelTypeError(f"argument `{p.name}` must be a float, got {type(value).__name__}")
    return _Checked(list(args), dev)


def best_target(kernel: Kernel, dev: Device) -> str:
    if dev.sm < 80:
        raise TkcRuntimeError(f"{dev.name} (sm_{dev.sm}) is not supported: tkc kernels need sm_80 or newer")
    if dev.capability == (9, 0) and get_target("sm_90a").sm >= kernel.min_target.sm:
        return "sm_90a"
    return "sm_80"


def _compiled(kernel: Kernel, target: str, constants: dict[str, Any], aligns: dict[str, int], dev: Device,
              pipeline: str | None) -> LoadedKernel:
    memo = (id(kernel), target, tuple(sorted(constants.items(), key=lambda kv: kv[0])), tuple(sorted(aligns.items())),
            dev.ordinal, pipeline)
    if memo in _loaded:
        return _loaded[memo]
    key = cache.make_key({
        "kernel": kernel.name,
        "source": cache.source_fingerprint(kernel.source.filename),
        "file": kernel.source.filename,  # the PTX's line info names it
        # the parameters' types: a kernel made per dtype in a closure has one name and one source
        "params": [f"{p.name}: {p.resolved_spec(constants) or p.kind}" for p in kernel.runtime_params],
        "constants": {k: repr(v) for k, v in constants.items()},
        "target": target,
        "aligns": aligns,
        "pipeline": pipeline,
        "arch": dev.capability,
    })
    hit = cache.get(key)
    if hit is not None:
        meta, files = hit
        ptx = files["kernel.ptx"].decode()
    else:
        from tkc.compiler import compile_for_launch

        compiled = compile_for_launch(kernel, target, constants, aligns, pipeline)
        meta, ptx = compiled.meta(), compiled.ptx
    make_current(dev)
    loaded = load_ptx(ptx, meta["name"], meta["threads"], meta["shared_bytes"], meta.get("dependent_launch", False),
                      meta.get("cluster", 1))
    if hit is None:  # stored once the driver took it: a PTX it rejects is not cached
        cache.put(key, meta, {"kernel.ptx": ptx.encode()})
    loaded.params = [tuple(p) for p in meta["params"]]  # type: ignore[attr-defined]
    loaded.prefers_dependent_launch = kernel.dependent_launch  # a launch choice, not in the cache key
    _loaded[memo] = loaded
    return loaded


def prepare(kernel: Kernel, args: Sequence[Any], constants: dict[str, Any], target: str | None = None,
            pipeline: str | None = None) -> tuple[LoadedKernel, _Checked, Device]:
    """Check the arguments and get a launchable function (compiling or loading it from the cache)."""
    torch = _torch()
    values = kernel.resolve_constants(constants)
    checked = check_arguments(kernel, args, values)
    ordinal = checked.device.index if checked.device is not None and checked.device.index is not None else torch.cuda.current_device()
    dev = device(ordinal)
    if target is None:
        target = best_target(kernel, dev)
    elif target not in TARGETS:
        raise KernelArgumentError(f"target must be one of {', '.join(TARGETS)} or None, got {target!r}")
    if get_target(target).sm > dev.sm:
        raise TkcRuntimeError(f"target {target} does not run on {dev.name} (sm_{dev.sm})")
    kernel.check_target(get_target(target))
    aligns = {p.name: alignment(v) for p, v in zip(kernel.runtime_params, checked.values) if p.kind == "tensor"}
    return _compiled(kernel, target, values, aligns, dev, pipeline), checked, dev


# kind: (struct code, size, alignment); a tensor map is 128 opaque bytes passed by value
_FIELD = {"u64": ("Q", 8, 8), "s64": ("q", 8, 8), "s32": ("i", 4, 4), "u32": ("I", 4, 4), "f32": ("f", 4, 4),
          "tensormap": ("128s", 128, 64)}


class ParamBuffer:
    """The kernel parameters of one compiled kernel as the driver reads them (`kernelParams`, a `void**` table
    pointing into one packed buffer). Launches with the same parameter values (a training loop's, on tensors the
    caching allocator hands out again) reuse their packed bytes, tensor maps included: a launch is then one dict
    lookup, one `memmove` into this thread's buffer and one `cuLaunchKernel`. The driver copies the values during
    the call, so the buffer is free again when the call returns."""

    SAVED = 1024  # packed parameter sets kept per compiled kernel (under 1 KB each with their keys); all dropped when full

    def __init__(self, params: Sequence[tuple[str, str]]):
        fmt, offsets, offset = "<", [], 0
        for _, kind in params:
            code, size, align = _FIELD[kind]
            pad = -offset % align
            fmt += "x" * pad + code
            offset += pad
            offsets.append(offset)
            offset += size
        self.struct = struct.Struct(fmt)
        self.offsets = offsets
        self.local = threading.local()
        self.saved: dict[tuple[Any, ...], bytes] = {}

    def pack(self, values: Sequence[Any]) -> bytes:
        """The packed bytes of `values` (struct.error for a value no parameter holds)."""
        return self.struct.pack(*values)

    def address(self, packed: bytes) -> int:
        """Copy `packed` into this thread's buffer; the address of its pointer table."""
        local = self.local
        table = getattr(local, "table", None)
        if table is None:
            size = max(self.struct.size, 1)
            storage = ctypes.create_string_buffer(size + 64)
            skip = -ctypes.addressof(storage) % 64  # tensor maps want 64-byte alignment
            local.storage = storage
            local.base = ctypes.addressof(storage) + skip
            local.pointers = (ctypes.c_void_p * max(len(self.offsets), 1))(*(local.base + o for o in self.offsets))
            table = local.table = ctypes.addressof(local.pointers)
        ctypes.memmove(local.base, packed, len(packed))
        return table


@dataclass
class _Fast:
    """A compiled, loaded variant of a kernel and what its repeated launches need."""

    loaded: LoadedKernel
    params: ParamBuffer
    device: Device
    resident: int | None = None  # blocks the GPU holds at once, once asked for
    tensor_maps: tuple[tuple[int, str, int, int, int, bool], ...] = ()  # (argument, its label, box rows, cols, swizzle, stacked)
    constants: dict[str, Any] = field(default_factory=dict)  # the kernel's, resolved (for the full check's error)

    @classmethod
    def make(cls, kernel: Kernel, prepared: tuple[LoadedKernel, Any, Device], constants: dict[str, Any]) -> _Fast:
        loaded, _, dev = prepared
        return cls(loaded, ParamBuffer(loaded.params), dev, tensor_maps=_tensor_map_params(kernel, loaded.params),  # type: ignore[attr-defined]
                   constants=constants)

    def parameters(self, kernel: Kernel, args: Sequence[Any], values: list[Any]) -> int:
        """The address of the parameter table for these arguments (`values`: what the reader read off them)."""
        saved = self.params.saved
        key = tuple(values)
        packed = saved.get(key)
        if packed is None:
            if self.tensor_maps:
                values.extend(tensor_map(args[i], rows, cols, swizzle, label, stack)
                              for i, label, rows, cols, swizzle, stack in self.tensor_maps)
            try:
                packed = self.params.pack(values)
            except struct.error:  # a size the reader let through that no 32-bit parameter holds: the check says which
                check_arguments(kernel, args, self.constants)
                raise
            if len(saved) >= ParamBuffer.SAVED:
                saved.clear()
            saved[key] = packed
        return self.params.address(packed)


_current = threading.local()


class Specialized:
    """A kernel with its constants, target and pipeline fixed (`kernel.specialize(D=128)`): its launches skip
    reading and hashing them. `spec[grid](*args)` launches; each compiled variant (per device and the arguments'
    alignments) is found by what the kernel's argument reader returns."""

    def __init__(self, kernel: Kernel, constants: dict[str, Any], target: str | None, pipeline: str | None):
        self.kernel, self.constants, self.target, self.pipeline = kernel, constants, target, pipeline
        self.values = kernel.resolve_constants(constants)
        self.variants: dict[Any, _Fast] = {}
        self.read = _reader(kernel, tuple(p.resolved_spec(self.values) for p in kernel.runtime_params))

    def __getitem__(self, grid: Any) -> _BoundSpecialized:
        return _BoundSpecialized(self, normalize_grid(grid))

    def __repr__(self) -> str:
        settings = [f"{k}={v!r}" for k, v in self.constants.items()]
        settings += [f"{k}={v!r}" for k, v in (("target", self.target), ("pipeline", self.pipeline)) if v is not None]
        return f"<{self.kernel.name} specialized {', '.join(settings)}>"

    def variant(self, args: Sequence[Any], values: list[Any], common_only: bool = False) -> _Fast | None:
        """The launchable variant for `args`, its parameter values appended to `values`. Arguments outside the
        reader's common case (the right number; CUDA tensors of the right dtype and rank on one device, last
        dimension contiguous; numbers where numbers go) take the full check and its error, or with `common_only`
        give None."""
        got = self.read(args, values)
        if got is not None:
            fast = self.variants.get(got)
            if fast is None:
                fast = self.variants[got] = _Fast.make(self.kernel, prepare(self.kernel, args, self.constants,
                                                                            self.target, self.pipeline), self.values)
            return fast
        if common_only:
            return None
        fast = _Fast.make(self.kernel, prepare(self.kernel, args, self.constants, self.target, self.pipeline),
                          self.values)
        values[:] = _param_values(self.kernel, args)
        return fast

    def launch(self, grid: Any, args: Sequence[Any], common_only: bool = False) -> bool:
        """Launch on `grid`; True once launched. With `common_only`, arguments outside the reader's common case
        launch nothing and give False (the caller's own checks then say what is wrong, in its own words)."""
        return self.launch_on(normalize_grid(grid), args, common_only)

    def launch_on(self, grid3: tuple[int, int, int], args: Sequence[Any], common_only: bool = False) -> bool:
        """As launch, on a grid already normalized (spec[grid] keeps it so)."""
        values: list[Any] = []
        fast = self.variant(args, values, common_only)
        if fast is None:
            return False
        params = fast.parameters(self.kernel, args, values)
        if getattr(_current, "ordinal", None) != fast.device.ordinal:
            make_current(fast.device)  # torch keeps its primary context current afterwards; set it once per thread
            _current.ordinal = fast.device.ordinal
        launch(fast.loaded, grid3, current_stream_handle(fast.device.ordinal), params)
        return True

    def resident_blocks(self, *args: Any) -> int:
        """How many blocks of this variant the GPU holds at once (multiprocessors × blocks per multiprocessor):
        the grid of a persistent kernel that loops over its work."""
        fast = self.variant(args, [])
        if fast.resident is None:
            fast.resident = resident_blocks_on(fast.loaded, fast.device.multiprocessors)
        return fast.resident


class _BoundSpecialized:
    """`spec[grid]`: call it with the kernel's run-time arguments."""

    def __init__(self, spec: Specialized, grid: tuple[int, int, int]):
        self.spec, self.grid = spec, grid

    def __call__(self, *args: Any) -> None:
        self.spec.launch_on(self.grid, args)

    def common(self, *args: Any) -> bool:
        """As `kernel[grid].common`: launch only the common case, and say whether it did."""
        return self.spec.launch_on(self.grid, args, common_only=True)


_specialized: dict[tuple[Any, ...], Specialized] = {}


def specialize(kernel: Kernel, constants: dict[str, Any], target: str | None = None,
               pipeline: str | None = None) -> Specialized:
    """The kernel with these constants, target and pipeline (one object per distinct set; constants checked)."""
    key = (kernel, tuple(constants.items()), target, pipeline)
    try:
        spec = _specialized.get(key)
    except TypeError:  # a constant no compile key can hold (a list, a tensor): name it
        name, value = next((k, v) for k, v in constants.items() if not _hashable(v))
        raise KernelTypeError(f"kernel `{kernel.name}`: constant `{name}` must be a number or a bool, got "
                              f"{type(value).__name__}") from None
    if spec is None:
        kernel.resolve_constants(constants)  # an unknown or missing constant: its error now, not at the launch
        spec = _specialized[key] = Specialized(kernel, dict(constants), target, pipeline)
    return spec


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def resident_blocks(kernel: Kernel, args: Sequence[Any], constants: dict[str, Any], target: str | None = None,
                    pipeline: str | None = None) -> int:
    """How many blocks of this kernel variant the GPU holds at once (see Specialized.resident_blocks)."""
    return specialize(kernel, constants, target, pipeline).resident_blocks(*args)


def _reader(kernel: Kernel, specs: tuple[Any, ...]) -> Any:
    """The argument reader for the kernel's parameters of types `specs` (their dtypes resolved)."""
    reader = _readers.get((kernel, specs))
    if reader is None:
        reader = _readers[(kernel, specs)] = _make_reader(kernel, specs)
    return reader


_readers: dict[Any, Any] = {}


def _make_reader(kernel: Kernel, specs: tuple[Any, ...]) -> Any:
    """`read(args, out)`: for the common case (the right number of arguments; CUDA tensors of the right dtype and
    rank on one device, last dimension contiguous; ints and floats where they go) append the parameter values
    (pointer, sizes, strides per tensor; numbers) to `out` and return (device, alignment per tensor), else None.
    Generated per kernel as straight-line code: a loop over a plan costs twice as much per launch."""
    torch = _torch()
    params = kernel.runtime_params
    names = [f"a{i}" for i in range(len(params))]
    lines = ["def read(args, out):", f"    if len(args) != {len(params)}:", "        return None"]
    if params:
        lines.append(f"    {', '.join(names)}{',' if len(params) == 1 else ''} = args")
    env: dict[str, Any] = {"Tensor": torch.Tensor, "current_device": torch.cuda.current_device}
    aligns, device, values = [], None, []
    for i, (p, spec, a) in enumerate(zip(params, specs, names)):
        if p.kind == "tensor":
            dtype = getattr(torch, spec.dtype.torch_name)
            env[f"dtype{i}"], rank, item = dtype, spec.rank, dtype.itemsize
            lines.append(f"    if not isinstance({a}, Tensor) or {a}.dtype is not dtype{i}:")
            lines.append("        return None")
            if device is None:
                device = "device"
                lines += [f"    device = {a}.get_device()", "    if device < 0:", "        return None"]
            else:
                lines += [f"    if {a}.get_device() != device:", "        return None"]
            s, t = f"s{i}", f"t{i}"
            lines += [f"    {s}, {t}, p{i} = {a}.shape, {a}.stride(), {a}.data_ptr()", f"    if len({s}) != {rank}:",
                      "        return None"]
            if rank:
                lines += [f"    if {t}[{rank - 1}] != 1 and {s}[{rank - 1}] > 1:", "        return None"]
                strides = "".join(f" | {t}[{d}] * {item}" for d in range(rank - 1))
                lines.append(f"    b{i} = p{i} | 16 | {s}[{rank - 1}] * {item}{strides}")  # `alignment`
            else:
                lines.append(f"    b{i} = p{i} | 16 | {item}")
            values += [f"p{i}", f"*{s}", f"*{t}"]
            aligns.append(f"b{i} & -b{i}")
        elif p.kind == "int":
            lines += [f"    if type({a}) is not int:", "        return None"]
            values.append(a)
        else:
            lines += [f"    if type({a}) is not float and type({a}) is not int:", "        return None"]
            values.append(a)
    if values:  # one tuple for all of them rather than three list operations a tensor
        lines.append(f"    out += ({', '.join(values)},)")
    lines.append(f"    return {device or 'current_device()'}, ({''.join(x + ', ' for x in aligns)})")
    exec(compile("\n".join(lines), f"<tkc launch reader of {kernel.name}>", "exec"), env)
    return env["read"]


def _alignment(ptr: int, shape: Sequence[int], strides: Sequence[int], item: int) -> int:
    """`alignment` from values already read off the tensor: the lowest set bit of all of them, at most 16."""
    bits = ptr | 16 | (shape[-1] * item if shape else item)
    for s in strides[:-1]:
        bits |= s * item
    return bits & -bits


def _tensor_map_params(kernel: Kernel, params: Sequence[tuple[str, str]]) -> tuple[tuple[int, str, int, int, int, bool], ...]:
    """What each tensor-map parameter of a compiled kernel (they come last) is built from."""
    from tkc.ir.tma_ops import tensor_map_param  # (not the lowering's modules: a launch imports no compiler)

    index = {p.name: i for i, p in enumerate(kernel.runtime_params)}
    maps = []
    for name, kind in params:
        if kind == "tensormap":
            described = tensor_map_param(name)
            if described is None or described[0] not in index:
                raise TkcRuntimeError(f"internal: kernel parameter {name} is a tensor map of no argument")
            tensor, rows, cols, swizzle, stack = described
            maps.append((index[tensor], f"argument `{tensor}`", rows, cols, swizzle, stack))  # the label errors use
    return tuple(maps)


def _param_values(kernel: Kernel, args: Sequence[Any]) -> list[Any]:
    values: list[Any] = []
    for p, value in zip(kernel.runtime_params, args):
        if p.kind == "tensor":
            values.append(value.data_ptr())
            values.extend(value.shape)
            values.extend(value.stride())
        else:
            values.append(value)
    return values


def current_stream_handle(ordinal: int) -> int:
    """The CUDA stream handle of device `ordinal`'s current torch stream (what kernels launch on)."""
    torch = _torch()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what Triton uses: no Stream object per launch
    return raw(ordinal) if raw is not None else torch.cuda.current_stream(ordinal).cuda_stream


def run(kernel: Kernel, grid3: tuple[int, int, int], args: Sequence[Any], constants: dict[str, Any],
        target: str | None = None, pipeline: str | None = None, common_only: bool = False) -> bool:
    """Launch on a grid already checked by `normalize_grid`; True once launched (see Specialized.launch)."""
    return specialize(kernel, constants, target, pipeline).launch(grid3, args, common_only)


class BoundLaunch:
    """`kernel[grid]`: call it with the kernel's run-time arguments and, as keywords, its constants (and `target`)."""

    def __init__(self, kernel: Kernel, grid: Any):
        self.kernel = kernel
        self.grid = normalize_grid(grid)

    def __call__(self, *args: Any, target: str | None = None, pipeline: str | None = None, **constants: Any) -> None:
        run(self.kernel, self.grid, args, constants, target, pipeline)

    def common(self, *args: Any, target: str | None = None, pipeline: str | None = None, **constants: Any) -> bool:
        """Launch only if the arguments are the common case the launch path reads without the full check (CUDA
        tensors of the right dtype and rank on one device, last dimension contiguous; numbers where numbers go),
        and say whether it did. For entry points whose own checks cost more host time than the kernel's launch:
        they check only what the launch cannot know, and run their full checks (for their error) on False."""
        return run(self.kernel, self.grid, args, constants, target, pipeline, common_only=True)
