"""rotate-tile-loop: start the next tile's step 0 in this tile's tail (kernels with `defer=3` or `4`, sm_90a).

After `peel-deferred-step` a consumer's tile loop runs, per tile: read its queries into registers (wait for the
tile ring's stage, load, release), step 0 (S_0 = Q·K_0ᵀ waited for alone, its softmax), the key loop, the last
P·V, then the epilogue (normalize O, store it). The tensor cores idle from the last P·V to the next tile's S_0:
during the epilogue, the next queries' load and the wait for S_0. Here tile t, once its last P·V is done, reads
tile t+1's queries and issues its S_0 (the producer filled both long before: the queries' stage was released
when tile t read its own, K_0 is the ring step after tile t's last); the epilogue runs while S_0 does, and the
loop carries the queries and S_0 into the next tile, whose step 0 starts at the softmax. The first tile's are read
before the loop. The ring steps do not change (tile t+1's S_0 reads the step its step 0 read), nor does the
producer. Semantics do not change: S_0 is computed from the same registers and stage, only earlier.

With `defer=4` all of the next tile's step 0 runs there, its softmax under this tile's last P·V (`_rotate_step`
shows the IR); the loop then carries step 0's l, m, O and P, and a tile starts at its key loop.

The queries' stage is given back after S_0's wait, not right after their load as at the top of a tile: released
early, D=64 with 128-key steps, three tiles a block, causal answered wrong on the H200 (whole tiles, timing
dependent) while the PTX simulation agreed; released late, right (RESULTS 2026-12-03, branch rotate-tile-loop).

    scf.for %tile = %lb to %ub step %g iter_args(%base = %b0) {
      tile.stage_wait %qbars[%t]   %q = tile.load (tile.ring_read %qring[...])   tile.stage_release %qbars[%t]
      scf.if (0 < %n) { tile.stage_wait %bars[%base]  %s = tile.wgmma_ABt %q, %k_s, %z  tile.wgmma_wait 0  ... }
      scf.for %j = %c1 to %n ... { ...%q... }
      %o_end = scf.if (%n > 0) { tile.wgmma_AB %p_last, %v_s, %o }
      tile.store (%o_end / %l), %O[...]
      scf.yield %base + %n
    }
becomes
    %q0 = scf.if (%lb < %ub) { (tile %lb's queries) }   %s0 = scf.if (... and 0 < %n(%lb)) { S_0 of %lb, waited }
    scf.for %tile = %lb to %ub step %g iter_args(%base = %b0, %q = %q0, %s = %s0) {
      scf.if (0 < %n) { tile.wgmma_wait 0  ...softmax on %s... }
      scf.for %j = %c1 to %n ... { ...%q... }
      %o_end = scf.if (%n > 0) { tile.wgmma_AB %p_last, %v_s, %o }
      %q1 = scf.if (%tile + %g < %ub) { (tile %tile + %g's queries, without the release) } else { %q }
      %s1 = scf.if (%tile + %g < %ub and 0 < %n(%tile + %g)) {
        tile.stage_wait %bars[%base + %n]  %s' = tile.wgmma_ABt %q1, %k_s', %z {tkc.deferred}
        tile.store (%o_end / %l), %O[...]  tile.wgmma_wait 0  scf.yield %s'
      } else { tile.store (%o_end / %l), %O[...]  scf.yield %z }
      scf.if (%tile + %g < %ub) { tile.stage_release %qbars[%t + 1] }
      scf.yield %base + %n, %q1, %s1
    }
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, func, scf
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from tkc.errors import SourceLoc, TkcError
from tkc.ir import async_ops as a
from tkc.ir import ops as t
from tkc.ir import tma_ops as m
from tkc.ir.types import RegTileType
from tkc.passes import register
from tkc.passes.defer_wgmma import DEFERRED
from tkc.passes.peel_deferred_step import PEELED
from tkc.passes.util import clone_into, erase_while, unused, with_one_more_carried

ROTATE_ATTR = "tkc.rotate"  # on a kernel with defer=3 (and 4)
STEP_ATTR = "tkc.rotate_step"  # on a kernel with defer=4: all of step 0 a tile ahead
ROTATED = "tkc.rotated_step"  # on the ifs that read a tile's queries and start its S_0 ahead of it

# what reading a tile's queries into registers may do besides computing: the tile ring's wait, read and release
_QUERY_EFFECTS = (m.StageWaitOp, a.RingReadOp, t.LoadOp, m.StageReleaseOp)


def _fail(message: str, op: Operation) -> TkcError:
    return TkcError(f"rotate-tile-loop: {message}", SourceLoc.from_attr(op.location))


def _computes(op: Operation) -> bool:
    """Whether the op only computes a value (integer division included, which xDSL does not call pure)."""
    return not op.regions and (is_side_effect_free(op) or op.name.startswith("arith."))


def _defined_within(value: SSAValue, op: Operation) -> bool:
    """Whether the value is defined inside the op (by an op nested in it, or as an argument of one of its blocks)."""
    owner = value.owner
    holder = owner.parent_op() if isinstance(owner, Block) else owner
    while holder is not None:
        if holder is op:
            return True
        holder = holder.parent_op()
    return False


def _inside(op: Operation, block: Block) -> bool:
    """Whether the op is in the block or nested in one of its ops."""
    while op is not None:
        if op.parent_block() is block:
            return True
        op = op.parent_op()  # type: ignore[assignment]
    return False


class _Cloner:
    """Clones ops of a tile's body for another tile (`mapping`: the tile loop's arguments to that tile's values)
    into `block`, together with the pure ops of the body that compute their operands."""

    def __init__(self, body: Block, mapping: dict[SSAValue, SSAValue], block: Block) -> None:
        self.body, self.mapping, self.block = body, dict(mapping), block

    def value(self, v: SSAValue) -> SSAValue:
        if v in self.mapping:
            return self.mapping[v]
        owner = v.owner
        if not isinstance(owner, Operation) or not _inside(owner, self.body):
            return v  # defined outside the tile loop (or an argument mapped already)
        if not _computes(owner):
            raise _fail(f"the next tile's {owner.name} would have to run again ahead of its tile", owner)
        self.op(owner)
        return self.mapping[v]

    def op(self, op: Operation) -> Operation:
        for inner in op.walk():  # an if's branches read values of the body too: the other tile's
            for v in inner.operands:
                if not _defined_within(v, op):
                    self.value(v)
        clone = op.clone(value_mapper=self.mapping)
        self.block.add_op(clone)
        self.mapping.update(zip(op.results, clone.results))
        return clone

    def ops(self, ops: Iterable[Operation]) -> None:
        for op in ops:
            self.op(op)


def _step0_or_empty(body: Block, mapping: dict[SSAValue, SSAValue], peeled: scf.IfOp, q_release: list[Operation],
                    empty: list[SSAValue]) -> tuple[Block, Block]:
    """The two arms of a tile's step 0: the peeled step run with `mapping` (a tile's queries and index) and its
    queries' stage released, yielding step 0's state; or the state of no step."""
    run = _Cloner(body, mapping, Block())
    run.op(peeled)
    run.ops(q_release)
    run.block.add_op(scf.YieldOp(*[run.mapping[r] for r in peeled.results]))
    idle = _Cloner(body, {}, Block())
    idle.block.add_op(scf.YieldOp(*[idle.value(v) for v in empty]))
    return run.block, idle.block


def _guarded(cond: SSAValue, then: Block, otherwise: Block, result_types: list, at: InsertPoint) -> scf.IfOp:
    branch = scf.IfOp(cond, result_types, Region(then), Region(otherwise))
    branch.attributes[ROTATED] = UnitAttr()
    Rewriter.insert_op(branch, at)
    return branch


def _queries(body: Block, mapping: dict[SSAValue, SSAValue], runs: SSAValue, reads: list[Operation], q: SSAValue,
             otherwise: SSAValue, at: InsertPoint) -> SSAValue:
    """The queries of the tile `mapping` describes, read into registers where `runs` (else `otherwise`)."""
    reader = _Cloner(body, mapping, Block())
    reader.ops(reads)
    reader.block.add_op(scf.YieldOp(reader.mapping[q]))
    return _guarded(runs, reader.block, Block([scf.YieldOp(otherwise)]), [q.type], at).results[0]


def _read_ahead(body: Block, mapping: dict[SSAValue, SSAValue], runs: SSAValue, query_ops: list[Operation],
                q: SSAValue, q_otherwise: SSAValue, scores_ops: list[Operation], s0: t.WgmmaOp,
                has_keys: SSAValue, epilogue: list[Operation], at: InsertPoint) -> tuple[SSAValue, SSAValue]:
    """The ifs that read the queries of the tile `mapping` describes (when `runs`) and start its S_0 (when it also
    has keys), the epilogue (if any) under it, waited for at the end. Returns the queries and S_0."""
    releases = [op for op in query_ops if isinstance(op, m.StageReleaseOp)]
    queries = _queries(body, mapping, runs, [op for op in query_ops if op not in releases], q, q_otherwise, at)

    both = arith.AndIOp(runs, has_keys)
    Rewriter.insert_op(both, at)
    then = Block()
    starter = _Cloner(body, {**mapping, q: queries}, then)
    starter.ops(scores_ops)
    scores = starter.mapping[s0.results[0]]  # deferred (as S_0 in the loop): the wait is after the epilogue
    clone_into(epilogue, then)
    then.add_op(_wait_for_scores())
    then.add_op(scf.YieldOp(scores))
    otherwise = Block()
    clone_into(epilogue, otherwise)
    zero = t.FillOp(0.0, s0.results[0].type)
    otherwise.add_op(zero)
    otherwise.add_op(scf.YieldOp(zero.result))
    scores_ahead = _guarded(both.result, then, otherwise, [s0.results[0].type], at).results[0]
    if releases:  # the queries' stage given back once S_0 is done (see the module's docstring)
        then = Block()
        _Cloner(body, mapping, then).ops(releases)
        then.add_op(scf.YieldOp())
        _guarded(runs, then, Block([scf.YieldOp()]), [], at)
    return queries, scores_ahead


def _wait_for_scores() -> Operation:
    """After the epilogue: S_0 (the only wgmma running) done before the loop carries its registers on."""
    return t.WgmmaWaitOp(0)


def _wait_for_next_scores() -> Operation:
    """defer=4, after S_0′ and the last P·V: S_0′ done, the P·V runs on under S_0′'s softmax."""
    return t.WgmmaWaitOp(1)


def _ahead(loop: scf.ForOp, next_tile: SSAValue) -> dict[SSAValue, SSAValue]:
    """The next iteration's values of the tile loop's arguments: its tile, and the ring steps this one yields."""
    body = loop.body.block
    return {body.args[0]: next_tile, **dict(zip(body.args[1:], body.last_op.operands))}  # type: ignore[union-attr]


@dataclass
class _Tile:
    """The parts of a consumers' tile loop body after peel-deferred-step."""

    body: Block
    peeled: scf.IfOp  # step 0
    s0: t.WgmmaOp  # its Q·Kᵀ
    q: SSAValue  # the queries in registers
    query_ops: list[Operation]  # the tile ring's wait, read, load, release
    wait_k: Operation  # step 0's wait for its stage
    read_k: Operation
    yield_op: scf.YieldOp
    tail: list[Operation]  # after step 0, before the yield: key loop, last P·V, release, epilogue
    epilogue: list[Operation]


def _tile(loop: scf.ForOp, option: str) -> _Tile | None:
    body = loop.body.block
    peeled = next((op for op in body.ops if isinstance(op, scf.IfOp) and PEELED in op.attributes), None)
    if peeled is None:
        return None
    step0 = peeled.true_region.block
    s0 = next((op for op in step0.ops if isinstance(op, t.WgmmaOp)), None)
    if s0 is None:
        return None
    q = s0.a
    if not isinstance(q.type, RegTileType) or not isinstance(q.owner, Operation) or q.owner.parent_block() is not body:
        raise _fail(f"{option} carries each tile's queries into the tile before it: keep them in registers "
                    "(Q_REGS=1)", loop)
    order = {op: i for i, op in enumerate(body.ops)}
    prefix = [op for op in body.ops if order[op] < order[peeled]]
    query_ops = [op for op in prefix if isinstance(op, _QUERY_EFFECTS)]
    for op in prefix:
        if not (op in query_ops or _computes(op)):
            raise _fail(f"a tile starts with {op.name}, which {option} cannot run a tile ahead", op)
    wait_k = next((op for op in step0.ops if isinstance(op, m.StageWaitOp)), None)
    read_k = s0.b.owner
    if wait_k is None or not isinstance(read_k, a.RingReadOp) or read_k.parent_block() is not step0:
        raise _fail("step 0's Q·Kᵀ does not read a ring stage it waits for", s0)

    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    tail = [op for op in body.ops if order[op] > order[peeled] and op is not yield_op]
    busy = [i for i, op in enumerate(tail)
            if any(isinstance(o, t.WgmmaOp | m.StageReleaseOp | m.StageWaitOp) for o in op.walk())]
    epilogue = tail[busy[-1] + 1:] if busy else tail
    for op in epilogue:
        if any(use.operation is yield_op for r in op.results for use in r.uses):
            raise _fail("the loop carries a value of the epilogue on", op)
    return _Tile(body, peeled, s0, q, query_ops, wait_k, read_k, yield_op, tail, epilogue)


def _condition(body: Block, mapping: dict[SSAValue, SSAValue], value: SSAValue, at: InsertPoint) -> SSAValue:
    """`value` (a pure function of the tile) for the tile `mapping` describes, computed at `at`."""
    cloner = _Cloner(body, mapping, Block())
    result = cloner.value(value)
    for op in list(cloner.block.ops):
        op.detach()
        Rewriter.insert_op(op, at)
    return result


def _next_tile(loop: scf.ForOp, parts: _Tile, at: InsertPoint) -> tuple[arith.CmpiOp, dict[SSAValue, SSAValue],
                                                                           SSAValue]:
    """At `at` in the tile body: whether a next tile follows, the loop arguments' values for it, and whether it has
    keys (runs a step 0)."""
    next_tile = arith.AddiOp(parts.body.args[0], loop.step)
    more = arith.CmpiOp(next_tile.result, loop.ub, "slt")
    Rewriter.insert_op([next_tile, more], at)
    ahead = _ahead(loop, next_tile.result)
    return more, ahead, _condition(parts.body, ahead, parts.peeled.cond, at)


def _rotate(loop: scf.ForOp) -> None:
    parts = _tile(loop, "defer=3")
    if parts is None:
        return
    body, peeled, s0, q, query_ops = parts.body, parts.peeled, parts.s0, parts.q, parts.query_ops
    wait_k, read_k, yield_op, epilogue = parts.wait_k, parts.read_k, parts.yield_op, parts.epilogue

    # tile t reads tile t+1's queries and starts its S_0 after its own last P·V, under its epilogue
    iv, args = body.args[0], body.args[1:]
    at = InsertPoint.before(yield_op)
    more, ahead, has_keys_next = _next_tile(loop, parts, at)
    q_arg = body.insert_arg(q.type, len(body.args))
    s_arg = body.insert_arg(s0.results[0].type, len(body.args))
    q_next, s_next = _read_ahead(body, ahead, more.result, query_ops, q, q_arg, [wait_k, read_k, s0], s0,
                                 has_keys_next, epilogue, at)
    for op in reversed(epilogue):
        op.detach()
        op.erase()
    yield_op.operands = [*yield_op.operands, q_next, s_next]

    # the first tile's, before the loop
    first = {iv: loop.lb, **dict(zip(args, loop.iter_args))}
    before = InsertPoint.before(loop)
    runs = arith.CmpiOp(loop.lb, loop.ub, "slt")
    Rewriter.insert_op(runs, before)
    has_keys_first = _condition(body, first, peeled.cond, before)
    zero_q = t.FillOp(0.0, q.type)
    Rewriter.insert_op(zero_q, before)
    q_first, s_first = _read_ahead(body, first, runs.result, query_ops, q, zero_q.result, [wait_k, read_k, s0], s0,
                                   has_keys_first, [], before)

    # this tile's queries and S_0 are the carried ones
    s0.results[0].replace_all_uses_with(s_arg)
    q.replace_all_uses_with(q_arg)
    for op in [s0, read_k, wait_k, *reversed(query_ops)]:
        op.detach()
        op.erase()
    _drop_dead(body)
    rotated = with_one_more_carried(with_one_more_carried(loop, q_first), s_first)
    rotated.attributes[ROTATE_ATTR] = UnitAttr()


def _rotate_step(loop: scf.ForOp) -> None:
    """defer=4: tile t runs all of tile t+1's step 0 under its own last P·V. After the last key step it issues
    S_0′ (the next queries and first K stage), then its last P·V, waits for S_0′ alone and runs S_0′'s softmax
    while the P·V runs, waits for it, releases its stage and stores O; the loop carries the queries and step 0's
    l, m, O and P into the next tile, which starts at its key loop. One if holds all of it (no running wgmma's
    registers cross a yield); where this tile ran no key step or no tile follows, the same in order, waited.

        %q1 = scf.if (%more) { (the next queries) } else { %q }
        %q2, %l1, %m1, %o1, %p1 = scf.if (%more and 0 < %n(next) and %n > 0) {
          tile.stage_wait %bars[%base + %n]   %s' = tile.wgmma_ABt %q1, %k_s', %z {tkc.deferred}
          %o_end = tile.wgmma_AB %p_last, %v_s, %o {tkc.deferred}   tile.wgmma_wait 1
          ... softmax on %s' ...   tile.wgmma_wait 0   (release)   tile.store (%o_end / %l), %O[...]
          (the next queries again, their stage released)   scf.yield %q', %l', %m', %o', %p'
        } else { (last P·V, release, store, then step 0 of the next tile, in order) }
    """
    parts = _tile(loop, "defer=4")
    if parts is None:
        return
    body, peeled, q, yield_op, epilogue = parts.body, parts.peeled, parts.q, parts.yield_op, parts.epilogue
    last_pv = [op for op in parts.tail if isinstance(op, scf.IfOp) and any(isinstance(o, t.WgmmaOp) for o in op.walk())]
    releases_after = [op for op in parts.tail if isinstance(op, scf.IfOp)
                      and any(isinstance(o, m.StageReleaseOp) for o in op.walk())]
    if len(last_pv) != 1 or len(releases_after) != 1:
        raise _fail("defer=4 expects one last P·V and one release after the key loop", loop)
    last_pv_if, release_if = last_pv[0], releases_after[0]
    pv = next(op for op in last_pv_if.true_region.block.ops if isinstance(op, t.WgmmaOp))
    step0 = peeled.true_region.block
    first_wait = next(op for op in step0.ops if isinstance(op, t.WgmmaWaitOp))
    ops0 = [op for op in step0.ops if not isinstance(op, scf.YieldOp)]
    head, rest = ops0[:ops0.index(first_wait)], ops0[ops0.index(first_wait) + 1:]
    step0_results = list(step0.last_op.operands)  # type: ignore[union-attr]
    empty = list(peeled.false_region.block.last_op.operands)  # type: ignore[union-attr]
    state_types = [r.type for r in peeled.results]
    q_release = [op for op in parts.query_ops if isinstance(op, m.StageReleaseOp)]
    q_read = [op for op in parts.query_ops if op not in q_release]

    iv = body.args[0]
    at = InsertPoint.before(yield_op)
    more, ahead, has_keys_next = _next_tile(loop, parts, at)
    q_arg = body.insert_arg(q.type, len(body.args))
    state_args = [body.insert_arg(ty, len(body.args)) for ty in state_types]

    # the next queries, into registers (their stage is released at the end)
    q_next = _queries(body, ahead, more.result, q_read, q, q_arg, at)

    # fast: S_0′, the last P·V, S_0′'s softmax under it, the epilogue
    both = arith.AndIOp(more.result, has_keys_next)
    fast_cond = arith.AndIOp(both.result, last_pv_if.cond)
    Rewriter.insert_op([both, fast_cond], at)
    fast = _Cloner(body, {**ahead, q: q_next}, Block())
    fast.ops(head)  # S_0′, deferred
    pv_map = clone_into([op for op in last_pv_if.true_region.block.ops if not isinstance(op, scf.YieldOp)], fast.block)
    pv_map[pv.results[0]].owner.attributes[DEFERRED] = UnitAttr()  # type: ignore[union-attr]
    fast.block.add_op(_wait_for_next_scores())
    fast.ops(rest)  # its second wait covers the P·V
    o_end = {last_pv_if.results[0]: pv_map[pv.results[0]]}
    clone_into([release_if, *epilogue], fast.block, o_end)
    # the queries read again for the next tile (their stage is still held): not kept through the softmax, where
    # S_0′, P, O and the P·V's A take the registers
    again = _Cloner(body, ahead, fast.block)
    again.ops(q_read)
    again.ops(q_release)
    fast.block.add_op(scf.YieldOp(again.mapping[q], *[fast.value(v) for v in step0_results]))

    # slow: in order (no key step in this tile, or no next tile / no keys in it)
    slow = Block()
    clone_into([last_pv_if, release_if, *epilogue], slow)
    nxt, idle = _step0_or_empty(body, {**ahead, q: q_next}, peeled, q_release, empty)
    state_slow = scf.IfOp(more.result, state_types, Region(nxt), Region(idle))
    state_slow.attributes[ROTATED] = UnitAttr()
    slow.add_op(state_slow)
    slow.add_op(scf.YieldOp(q_next, *state_slow.results))
    q_and_state = _guarded(fast_cond.result, fast.block, slow, [q.type, *state_types], at).results

    for op in reversed([last_pv_if, release_if, *epilogue]):
        op.detach()
        op.erase()
    yield_op.operands = [*yield_op.operands, *q_and_state]

    # the first tile's queries and step 0, before the loop
    first = {iv: loop.lb, **dict(zip(body.args[1:], loop.iter_args))}
    before = InsertPoint.before(loop)
    runs = arith.CmpiOp(loop.lb, loop.ub, "slt")
    zero_q = t.FillOp(0.0, q.type)
    Rewriter.insert_op([runs, zero_q], before)
    q_first = _queries(body, first, runs.result, q_read, q, zero_q.result, before)
    start, idle = _step0_or_empty(body, {**first, q: q_first}, peeled, q_release, empty)
    state_first = _guarded(runs.result, start, idle, state_types, before).results

    # this tile's queries and step 0 are the carried ones
    for old, new in zip(peeled.results, state_args):
        old.replace_all_uses_with(new)
    q.replace_all_uses_with(q_arg)
    peeled.detach()
    peeled.erase()
    for op in reversed(parts.query_ops):
        op.detach()
        op.erase()
    _drop_dead(body)
    rotated = with_one_more_carried(loop, q_first)
    for init in state_first:
        rotated = with_one_more_carried(rotated, init)
    rotated.attributes[ROTATE_ATTR] = UnitAttr()


def _drop_dead(block: Block) -> None:
    """Remove the pure ops (and reads) whose results nothing uses any more."""
    erase_while(block, lambda op: unused(op) and (_computes(op) or isinstance(op, a.RingReadOp | t.LoadOp)),
                nested=True)


def rotate_tile_loops(module: ModuleOp) -> None:
    for fn in module.walk():
        if not (isinstance(fn, func.FuncOp) and ROTATE_ATTR in fn.attributes):
            continue
        rotate = _rotate_step if STEP_ATTR in fn.attributes else _rotate
        for loop in [op for op in fn.walk() if isinstance(op, scf.ForOp)]:
            if any(isinstance(op, scf.IfOp) and PEELED in op.attributes for op in loop.body.block.ops):
                rotate(loop)


@register("rotate-tile-loop", "start the next tile's first Q·Kᵀ under this tile's epilogue")
class RotateTileLoop(ModulePass):
    name = "rotate-tile-loop"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        rotate_tile_loops(op)
