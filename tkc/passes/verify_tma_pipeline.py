"""verify-tma-pipeline: check the stage-barrier protocol that `insert-tma-pipeline` wrote, without running it.

For every `tile.stage_barriers` of a kernel:

* its release count is the block's threads (every thread releases every stage it read);
* each producer block announces each step once, and the bytes it announces (`stage_expect`) are the bytes of the
  TMA boxes it starts for that step (whole boxes: TMA counts a box's full size also where it reaches past the
  tensor's end); no TMA load without its announcement;
* a step that may reuse a stage (k ≥ stages) is acquired before it is announced;
* in a pipelined loop with step index k: k is waited for before its stage is read; the loop refills step k + d
  and the steps before the loop are exactly 0 .. d-1, so every step that runs is filled exactly once; every step
  is released (k, or k - 1 one iteration later), after the last read of its stage, and the refill of k + d
  acquires a stage whose previous step the program has released by then (d ≤ the last released step + stages
  - k).

* rotate-tile-loop's reads a tile ahead (a tile loop marked `tkc.rotate`): a wait on a ring of the key loop is
  for the ring step the tile loop carries into its next iteration, a wait on the tile ring for the next tile's
  index; before the loop, for the first tile's.

A violation is a TkcError naming the op: on the GPU it would hang or read a stage before (or while) it is filled.

    scf.for ... { tile.stage_wait %bars[%k] ... scf.if (%k + 3 < trips) { tile.stage_acquire %bars[%k + 3] ... } }
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import IntegerAttr, ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from tkc.errors import SourceLoc, TkcError
from tkc.ir import async_ops as a
from tkc.ir import tma_ops as m
from tkc.passes import register
from tkc.passes.insert_tma_pipeline import stage_readers, step_index, step_start
from tkc.passes.util import constant_int as _constant
from tkc.passes.util import defined_in


def _fail(message: str, op: Operation) -> TkcError:
    return TkcError(f"verify-tma-pipeline: {message}", SourceLoc.from_attr(op.location))


def _offset_from(value: SSAValue, k: SSAValue) -> int | None:
    """d where value = k + d (or k - d) for a constant d, 0 for k itself, else None."""
    if value is k:
        return 0
    owner = value.owner
    if isinstance(owner, arith.AddiOp | arith.SubiOp) and owner.lhs is k:
        d = _constant(owner.rhs)
        if d is not None:
            return d if isinstance(owner, arith.AddiOp) else -d
    return None


@dataclass
class _Fill:
    expect: m.StageExpectOp
    acquired: bool


def _check_producer_block(block: Block, bars: SSAValue, stages: int) -> list[_Fill]:
    """Announcements, loads and acquires of one block: bytes agree, acquires come first where stages repeat."""
    fills: dict[SSAValue, _Fill] = {}
    acquired: set[SSAValue] = set()
    brought: dict[SSAValue, int] = {}
    for op in block.ops:
        if isinstance(op, m.StageAcquireOp) and op.bars is bars:
            acquired.add(op.step)
        elif isinstance(op, m.StageExpectOp) and op.bars is bars:
            if op.step in fills:
                raise _fail("the same step is announced twice", op)
            fills[op.step] = _Fill(op, op.step in acquired)
            const = _constant(op.step)
            if (const is None or const >= stages) and op.step not in acquired:
                raise _fail("a step that may reuse a stage is announced before its stage is acquired", op)
        elif isinstance(op, m.TmaLoadOp) and op.bars is bars:
            if op.step not in fills:
                raise _fail("a TMA load whose bytes no stage_expect before it announces", op)
            brought[op.step] = brought.get(op.step, 0) + op.nbytes
    for step, fill in fills.items():
        if brought.get(step, 0) != fill.expect.nbytes.value.data:
            raise _fail(f"stage_expect announces {fill.expect.nbytes.value.data} bytes but the TMA loads of that step "
                        f"bring {brought.get(step, 0)}", fill.expect)
    return list(fills.values())


def _ring_step(loop: scf.ForOp, value: SSAValue) -> SSAValue | None:
    """The base when `value` is the loop's step index counted after `base` earlier steps (base + k), the
    constant 0 when it is k itself; None otherwise."""
    k = step_index(loop)
    if k is None:
        return None
    if value is k:
        return k  # marker: no base
    owner = value.owner
    if isinstance(owner, arith.AddiOp) and owner.rhs is k and not defined_in(owner.lhs, loop):
        return owner.lhs
    return None


def _before_loop(loop: scf.ForOp, bars: SSAValue, base: SSAValue | None) -> list[int]:
    """The steps (after `base`) that the ifs before the loop, in its block, fill."""
    steps = []
    for op in loop.parent_block().ops:  # type: ignore[union-attr]
        if op is loop:
            break
        for expect in op.walk():
            if isinstance(expect, m.StageExpectOp) and expect.bars is bars:
                offset = _constant(expect.step) if base is None else _offset_from(expect.step, base)
                if offset is None:
                    raise _fail("a step filled before the loop is not the loop's first steps", expect)
                steps.append(offset)
    return steps


def _first_step(loop: scf.ForOp) -> int:
    """The step index of the loop's first iteration: 0, or 1 after peel-deferred-step."""
    start = step_start(loop)
    if loop.lb is start:
        return 0
    owner = loop.lb.owner
    if isinstance(owner, arith.AddiOp) and owner.lhs is start and owner.rhs is loop.step:
        return 1
    raise _fail("a pipelined loop starts neither where its step index counts from nor one step after", loop)


def _peeled(op: Operation) -> bool:
    """Whether the op belongs to a step peel-deferred-step ran before its loop (or rotate-tile-loop a tile ahead)."""
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, func.FuncOp):
        if "tkc.peeled_step" in parent.attributes or "tkc.rotated_step" in parent.attributes:
            return True
        parent = parent.parent_op()
    return False


def _innermost_loop(op: Operation) -> Operation | None:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, scf.ForOp):
        parent = parent.parent_op()
    return parent


def _check_loop(loop: scf.ForOp, bars: SSAValue, stages: int) -> None:
    body = loop.body.block
    k = step_index(loop)
    waits = [op for op in body.walk() if isinstance(op, m.StageWaitOp) and op.bars is bars and not _peeled(op)]
    if not waits or all(_innermost_loop(w) is not loop for w in waits):
        return  # a loop around the pipelined one
    marker = _ring_step(loop, waits[0].step)
    if k is None or marker is None or any(w.step is not waits[0].step or w.parent_block() is not body for w in waits):
        raise _fail("a pipelined loop waits for a step other than its own step index", waits[0])
    base = None if marker is k else marker
    before = _before_loop(loop, bars, base)
    k = waits[0].step  # from here on, "k" is the ring's step
    order = {op: n for n, op in enumerate(body.ops)}
    wait_at = order[waits[0]]
    rings = {use.operation.ring for use in bars.uses if isinstance(use.operation, m.TmaLoadOp)}
    reads = [op for op in body.ops if isinstance(op, a.RingReadOp) and op.ring in rings]
    for read in reads:
        if order[read] < wait_at and not (_first_step(loop) >= 1 and _previous_step_read(read, k)):
            raise _fail("a stage is read before the wait for its step", read)

    refills = [op for op in body.walk() if isinstance(op, m.StageExpectOp) and op.bars is bars]
    if not refills and _check_producer_loop(loop, bars, stages, before):
        _check_releases(loop, bars, k, reads, order, None, stages)
        return
    if len(refills) != 1:
        raise _fail(f"a pipelined loop should refill one step per iteration, found {len(refills)}",
                    refills[0] if refills else loop)
    refill = refills[0]
    d = _offset_from(refill.step, k)
    if d is None or d < 1:
        raise _fail("the loop refills a step that is not its step index plus a constant", refill)
    first = _first_step(loop)  # 1 when peel-deferred-step ran step 0 (and its refill) before the loop
    if sorted(before) != list(range(first + d)):
        raise _fail(f"the loop refills step k + {d} from step {first}, so steps 0..{first + d - 1} must be filled "
                    f"before it, got {sorted(before)}", loop)

    _check_releases(loop, bars, k, reads, order, (refill, d), stages)


def _previous_step_read(read: a.RingReadOp, k: SSAValue) -> bool:
    """Does the read take step k - 1's stage (defer-wgmma's deferred P·V: `(k > 0 ? k - 1 : k) mod stages`), which
    the step before waited for? (Only in a loop that starts at step 1, where k > 0 always holds.)"""
    stage = read.stage.owner
    if not isinstance(stage, arith.RemUIOp) or not isinstance(stage.lhs.owner, arith.SelectOp):
        return False
    back = stage.lhs.owner.lhs.owner
    return isinstance(back, arith.SubiOp) and _same(back.lhs, k) and _constant(back.rhs) == 1


def _same(x: SSAValue, y: SSAValue, depth: int = 0) -> bool:
    """Whether two values are computed the same way: the same value, the same block argument of corresponding
    loops (the producer's copy of the tile loop and the consumers' own), or the same op on such values."""
    if x is y:
        return True
    if depth > 64:
        return False
    ox, oy = x.owner, y.owner
    if isinstance(ox, Block) and isinstance(oy, Block):
        px, py = ox.parent_op(), oy.parent_op()
        return (isinstance(px, scf.ForOp) and isinstance(py, scf.ForOp) and x.index == y.index  # type: ignore[attr-defined]
                and all(_same(a_, b_, depth + 1) for a_, b_ in zip((px.lb, px.ub, px.step), (py.lb, py.ub, py.step))))
    if isinstance(ox, Operation) and isinstance(oy, Operation):
        return (ox.name == oy.name and ox.properties == oy.properties and len(ox.operands) == len(oy.operands)
                and x.index == y.index  # type: ignore[attr-defined]
                and all(_same(a_, b_, depth + 1) for a_, b_ in zip(ox.operands, oy.operands)))
    return False


def _tile_loop(loop: scf.ForOp) -> bool:
    """Whether a loop is nested in it (a tile loop's ring: the consumers release its one stage within the tile,
    needing nothing more from it, and the producer refills it for the next tile)."""
    return any(isinstance(op, scf.ForOp) for op in loop.body.block.ops)


def _check_producer_loop(loop: scf.ForOp, bars: SSAValue, stages: int, before: list[int]) -> bool:
    """A warp-specialized ring: a producer loop over the same steps fills step k at its step k (acquiring
    first); nothing is filled before the loops."""
    fn = loop
    while not isinstance(fn, func.FuncOp):
        fn = fn.parent_op()  # type: ignore[assignment]
    for other in fn.walk():
        if not isinstance(other, scf.ForOp) or other is loop:
            continue
        fills = [op for op in other.body.block.ops if isinstance(op, m.StageExpectOp) and op.bars is bars]
        if not fills:
            continue
        if len(fills) != 1 or _ring_step(other, fills[0].step) is None:
            raise _fail("a producer loop must fill its own step index, once per iteration", fills[0])
        if not all(_same(x, y) for x, y in zip((other.lb, other.ub, other.step),
                                               (step_start(loop), loop.ub, loop.step))):
            raise _fail("the producer loop and the consumer loop run different steps", other)
        if before:
            raise _fail("with a producer loop nothing may be filled before the loops", fills[0])
        if stages < 2 and not _tile_loop(loop):
            raise _fail("a producer ring needs at least two stages (one only on a tile loop)", other)
        return True
    raise _fail("a pipelined loop waits for steps that nothing fills", loop)


def _check_releases(loop: scf.ForOp, bars: SSAValue, k: SSAValue, reads: list[Operation], order: dict[Operation, int],
                    refill: tuple[m.StageExpectOp, int] | None, stages: int) -> None:
    body = loop.body.block
    releases = [op for op in body.walk() if isinstance(op, m.StageReleaseOp) and op.bars is bars]
    if len(releases) != 1:
        raise _fail(f"a pipelined loop should release one step per iteration, found {len(releases)}",
                    releases[0] if releases else loop)
    release = releases[0]
    lag = _offset_from(release.step, k)
    if lag not in (0, -1):
        raise _fail("the loop releases a step other than k or k - 1", release)

    def top(op: Operation) -> Operation:
        while op.parent_block() is not body:
            op = op.parent_op()  # type: ignore[assignment]
        return op

    release_at = order[top(release)]
    if lag == 0:
        last_read = max((order[u] for u in stage_readers(body, [r.result for r in reads])), default=-1)  # type: ignore[attr-defined]
        if release_at < last_read:
            raise _fail("a stage is released before the last read of it", release)
    if refill is None:
        return  # a producer loop of its own: it waits for the releases as long as it needs
    refill_op, d = refill
    # the acquire of step k + d waits for step k + d - stages: released by then?
    released_by_refill = lag if release_at < order[top(refill_op)] else lag - 1
    if d - stages > released_by_refill:
        raise _fail(f"the refill of step k + {d} needs step k + {d - stages} released, but only step "
                    f"k + {released_by_refill} is by then (the ring would deadlock)", refill_op)


def verify_tma_pipeline(module: ModuleOp) -> None:
    for fn in module.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        warps = fn.attributes.get("tkc.consumer_warps", fn.attributes.get("tkc.warps"))
        threads = 32 * (warps.value.data if isinstance(warps, IntegerAttr) else 1)
        for op in list(fn.walk()):
            if not isinstance(op, m.StageBarriersOp):
                continue
            bars, type_ = op.result, op.result.type
            stages = type_.stages.data
            if type_.arrivals.data != threads:
                raise _fail(f"the stages are released by {type_.arrivals.data} threads but the block has {threads} "
                            "(that compute)", op)
            for block in {use.operation.parent_block() for use in bars.uses}:
                if block is not None:
                    _check_producer_block(block, bars, stages)
            for loop in [o for o in fn.walk() if isinstance(o, scf.ForOp)]:
                _check_loop(loop, bars, stages)
        for loop in [o for o in fn.walk() if isinstance(o, scf.ForOp) and "tkc.rotate" in o.attributes]:
            _check_rotated(loop)


def _rotated_waits(ops: list[Operation]) -> list[m.StageWaitOp]:
    return [w for op in ops if isinstance(op, scf.IfOp) and "tkc.rotated_step" in op.attributes
            for w in op.walk() if isinstance(w, m.StageWaitOp)]


def _next_index(step: SSAValue, loop: scf.ForOp, tile: SSAValue) -> bool:
    """Whether `step` is the tile loop's step index of tile `tile`: (tile - lb) / step."""
    owner = step.owner
    if not isinstance(owner, arith.DivUIOp) or owner.rhs is not loop.step:
        return False
    diff = owner.lhs.owner
    return isinstance(diff, arith.SubiOp) and diff.lhs is tile and diff.rhs is loop.lb


def _check_rotated(loop: scf.ForOp) -> None:
    """rotate-tile-loop's reads a tile ahead: in the loop, a wait on a ring of the key loop is for the ring step the
    loop carries into its next iteration, a wait on the tile ring for the next tile's index (tile + step); before
    the loop, for the carried step's start and the first tile's index. (What the waits guard, the simulator runs.)"""
    body = loop.body.block
    yielded = dict(zip(body.args[1:], body.last_op.operands))  # type: ignore[union-attr]
    started = dict(zip(body.args[1:], loop.iter_args))
    key_bases: dict[SSAValue, SSAValue] = {}  # ring barriers of a loop inside -> the tile loop's argument it counts from
    for inner in body.walk():
        if isinstance(inner, scf.ForOp):
            for wait in inner.body.block.walk():
                if isinstance(wait, m.StageWaitOp) and not _peeled(wait):
                    base = _ring_step(inner, wait.step)
                    if base is not None and base in yielded:
                        key_bases[wait.bars] = base
    before = [op for op in loop.parent_block().ops]  # type: ignore[union-attr]
    before = before[:before.index(loop)]
    nxt = next((op for op in body.ops if isinstance(op, arith.AddiOp) and op.lhs is body.args[0]
                and op.rhs is loop.step), None)
    for waits, steps, tile in ((_rotated_waits(list(body.ops)), yielded, nxt.result if nxt else None),
                               (_rotated_waits(before), started, loop.lb)):
        for wait in waits:
            if wait.bars in key_bases:
                if wait.step is not steps[key_bases[wait.bars]]:
                    raise _fail("a read a tile ahead waits for a ring step other than the next tile's first", wait)
            elif tile is None or not _next_index(wait.step, loop, tile):
                raise _fail("a read a tile ahead waits for a stage of the tile ring other than the next tile's", wait)


@register("verify-tma-pipeline", "check the stage-barrier protocol of TMA rings statically (bytes, arrivals, order)")
class VerifyTmaPipeline(ModulePass):
    name = "verify-tma-pipeline"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        verify_tma_pipeline(op)
