"""The memory plan: one arena per loaded model, reused by values whose lifetimes
do not overlap.

Graph inputs and outputs live outside the arena (the caller's arrays are read in
place; outputs are written straight into the arrays handed back), constants
live in the constant table. Every other value, and every instruction's scratch
memory, gets an offset. Placement is greedy in order of first use (ties: larger
first), each at the lowest offset that does not collide with an already-placed buffer
alive at the same time. So a value lands on the lowest bytes free when it is made, and
the low bytes are the ones the call keeps reusing: likelier still in the CPU's caches
when it is written. Largest first (TFLite's arena planner; what this did before) packs
tighter but put MobileNetV2 bf16's largest activation (18.4 MB, the 16->96 1x1 at
112x112) at 41.7 MB of its 64.6 MB arena, on bytes nothing had touched since the
previous call; in order of first use it lands at 9.2 MB (arena 69.2 MB) and the model
runs 6-7% faster, EfficientNetB0 5%; MobileNetV2 int8, whose 11.5 MB arena stays in
the caches either way, loses ~2% (docs/performance.md, "MobileNetV2 through
TensorFlow").

Each instruction's scratch is what runtime/isa.py's rule grants its kind
(`isa.scratch_bytes`); the reference kernels block their work by the same layouts, so
the plan can never reserve less than the device will write.

A reshape whose input is in the arena (and whose output is no graph output) gets no
buffer: its output is placed on its input's bytes, and that buffer lives until the last
reader of either (`aliases`); the engine then has nothing to copy (runtime/validate.py
accepts exactly this sharing).

Cost: a buffer is compared only with the placed buffers alive at the same time
(found through two small indexes over instruction positions), so a chain of
100,000 instructions plans in about a second; scanning every placed buffer for
each new one was quadratic (20,000 Relus: 35 s). A buffer that overlaps more than
`MAX_NEIGHBOURS` placed buffers (hundreds of values alive at once) is put above
everything placed so far instead of searched for a gap: still correct, never worse
than no reuse, and it keeps the plan near-linear on adversarial graphs. The bound
caps the searching at about MAX_NEIGHBOURS²/2 comparisons when values pile up (an
AddN of 20,000 inputs planned in 13.4 s with 4096, 1.9 s with 512, under cProfile);
real models keep tens of values alive at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuronish.runtime import isa

from .ir import Graph, Node
from .signature import Memo, signature_key

ALIGN = 64  # cache line; also what numpy's SIMD loops like
MAX_NEIGHBOURS = 512  # overlapping placed buffers searched for a gap, per buffer


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Buffer:
    key: tuple[str, int]  # ("value", id) or ("scratch", node index)
    nbytes: int
    first: int  # first instruction index that needs it
    last: int   # last instruction index that needs it


@dataclass(frozen=True)
class MemoryPlan:
    arena_bytes: int
    value_offsets: dict[int, int]
    scratch: dict[int, tuple[int, int]]  # node index -> (offset, bytes)
    unshared_bytes: int  # what the buffers would take without reuse

    def summary(self) -> dict:
        return {"arena_bytes": self.arena_bytes, "unshared_bytes": self.unshared_bytes}


def aliases(graph: Graph) -> dict[int, int]:
    """Values that need no bytes of their own: output value id -> the id of the value
    whose buffer it shares. Both must live in the arena: a graph input or output is the
    caller's array, a constant is in the constant table.

    - a reshape's output (the same bytes read with other dims);
    - a convolution's output written over its residual (`in_place_residual`), where the
      residual is read by nothing after it: the engine then adds the residual as oneDNN's
      `sum` post-op, which reads each output element's old value where it writes the new
      one, instead of a `binary_add` reading a second tensor (ResNet50 bf16 batch 8: 9%
      less time per call; its 16 conv + add + relu blocks are memory-bound)."""
    external = {v.id for v in graph.inputs} | {v.id for v in graph.outputs}
    produced = {o.id for n in graph.nodes for o in n.outputs}
    last: dict[int, int] = {}  # value id -> index of its last reader
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v.id] = i
    root: dict[int, int] = {}
    members: dict[int, list[int]] = {}  # a shared buffer's root -> the values on it

    def share(y: int, x: int) -> None:
        r = root.get(x, x)
        root[y] = r
        members.setdefault(r, [r]).append(y)

    for i, node in enumerate(graph.nodes):
        if node.kind == "reshape":
            x, y = node.inputs[0], node.outputs[0]
            if x.id in produced and x.id not in external and y.id not in external \
                    and x.type.nbytes == y.type.nbytes:
                share(y.id, x.id)
        elif in_place_residual(node):
            res, y = node.inputs[-1], node.outputs[0]
            r = root.get(res.id, res.id)
            if res.id in produced and res.id not in external and y.id not in external \
                    and all(last.get(m, -1) <= i for m in members.get(r, [r])) \
                    and all(root.get(v.id, v.id) != r for v in node.inputs[:-1]):
                share(y.id, res.id)
    return root


def in_place_residual(node: Node) -> bool:
    """Whether `node` may write its output over its residual's bytes: a conv2d or
    conv2d_int8 adding a residual of its output's shape and byte size (int8's 8-bit
    residual may be signed where the output is unsigned). The memory plan does so where
    the residual is read by nothing after it (`aliases`); runtime/validate.py accepts
    exactly this sharing, and both engines read each residual element before writing the
    output element at its place."""
    if node.kind not in ("conv2d", "conv2d_int8") or not node.attrs.get("residual") \
            or len(node.inputs) < 3 or len(node.outputs) != 1:
        return False
    res, y = node.inputs[-1], node.outputs[0]
    same = res.dtype == y.dtype or {res.dtype, y.dtype} <= {"uint8", "int8"}
    return same and res.shape == y.shape


# The kinds runtime/isa.py has a scratch rule for (read, not copied: one source of truth).
_SCRATCH_RULES = isa._SCRATCH
# signature -> scratch bytes (a pure function of it; a large graph repeats a few)
_SCRATCH: Memo[int] = Memo()


def scratch_bytes(node: Node) -> int:
    """The scratch bytes runtime/isa.py's rule grants the instruction."""
    if node.kind not in _SCRATCH_RULES:
        return 0  # (most kinds: isa.scratch_bytes gives 0 without a rule)
    key = signature_key(node.kind, node.inputs, node.attrs)
    nbytes = _SCRATCH.get(key)
    if nbytes is None:
        nbytes = _SCRATCH.put(key, isa.scratch_bytes(
            node.kind, [v.shape for v in node.inputs], [v.dtype for v in node.inputs],
            node.attrs))
    return nbytes


def lifetimes(graph: Graph, alias: dict[int, int] | None = None) -> list[Buffer]:
    """Each arena buffer's life; a reshape's output in `alias` is no buffer of its own, it
    extends the life of the buffer it shares (until its own last reader)."""
    alias = aliases(graph) if alias is None else alias
    external = {v.id for v in graph.inputs} | {v.id for v in graph.outputs}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    size: dict[int, int] = {}
    buffers = []
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            vid = alias.get(v.id, v.id)
            if vid in first:
                last[vid] = i
        for o in node.outputs:
            if o.id not in external and o.id not in alias:
                first[o.id], last[o.id], size[o.id] = i, i, o.type.nbytes
        nbytes = scratch_bytes(node)
        if nbytes:
            buffers.append(Buffer(("scratch", i), _align(nbytes), i, i))
    buffers += [Buffer(("value", vid), _align(max(size[vid], 1)), first[vid], last[vid])
                for vid in first]
    return buffers


# Ranges of positions shorter than this are read leaf by leaf, not through the tree.
_SHORT = 4


class _TimeIndex:
    """Placed buffers by instruction position: which are alive at one position
    (each buffer stored at the O(log n) segment-tree nodes covering its lifetime),
    and which start inside a range (stored at the leaf of its first position, with
    counts so empty subtrees are skipped). Both answer in O(log n + found)."""

    def __init__(self, positions: int):
        self.size = 1
        while self.size < max(positions, 1):
            self.size *= 2
        # Flat lists by tree node, not dicts (a 100k-value plan updates them millions of
        # times): the buffers stored there, and how many.
        self.covering: list[list[int] | None] = [None] * (2 * self.size)
        self.cover_count = [0] * (2 * self.size)
        self.starting: dict[int, list[int]] = {}  # leaf position -> buffer indexes
        self.start_count = [0] * (2 * self.size)

    def add(self, index: int, first: int, last: int) -> None:
        covering, cover_count = self.covering, self.cover_count
        lo, hi = first + self.size, last + self.size + 1
        while lo < hi:  # the canonical nodes of [first, last]
            if lo & 1:
                if covering[lo] is None:
                    covering[lo] = [index]
                else:
                    covering[lo].append(index)  # type: ignore[union-attr]
                cover_count[lo] += 1
                lo += 1
            if hi & 1:
                hi -= 1
                if covering[hi] is None:
                    covering[hi] = [index]
                else:
                    covering[hi].append(index)  # type: ignore[union-attr]
                cover_count[hi] += 1
            lo //= 2
            hi //= 2
        self.starting.setdefault(first, []).append(index)
        node = first + self.size
        start_count = self.start_count
        while node:
            start_count[node] += 1
            node //= 2

    def alive_at_count(self, position: int) -> int:
        node, count, cover_count = position + self.size, 0, self.cover_count
        while node:
            count += cover_count[node]
            node //= 2
        return count

    def alive_at(self, position: int) -> list[int]:
        node, found = position + self.size, []
        while node:
            here = self.covering[node]
            if here:
                found += here
            node //= 2
        return found

    def starting_count(self, lo: int, hi: int) -> int:
        """How many start in [lo, hi]."""
        if hi - lo < _SHORT:  # (the leaves themselves: most lives are short)
            start_count, size = self.start_count, self.size
            return sum([start_count[size + p] for p in range(lo, hi + 1)])
        count, lo, hi = 0, lo + self.size, hi + self.size + 1
        while lo < hi:
            if lo & 1:
                count += self.start_count[lo]
                lo += 1
            if hi & 1:
                hi -= 1
                count += self.start_count[hi]
            lo //= 2
            hi //= 2
        return count

    def starting_in(self, lo: int, hi: int) -> list[int]:
        found: list[int] = []
        if hi - lo < _SHORT:
            starting = self.starting
            for p in range(lo, hi + 1):
                here = starting.get(p)
                if here:
                    found += here
            return found
        stack = [(1, 0, self.size - 1)]
        while stack:
            node, a, b = stack.pop()
            if b < lo or hi < a or not self.start_count[node]:
                continue
            if a == b:
                found += self.starting[a]
                continue
            mid = (a + b) // 2
            stack += [(2 * node, a, mid), (2 * node + 1, mid + 1, b)]
        return found


def plan_memory(graph: Graph) -> MemoryPlan:
    alias = aliases(graph)
    # In order of first use: each buffer lands on the lowest bytes free at its time, which
    # are the bytes the call's last instructions used (still in cache), not on bytes no
    # instruction touched for tens of MB (largest first did that: module docstring).
    buffers = sorted(lifetimes(graph, alias), key=lambda b: (b.first, -b.nbytes))
    index = _TimeIndex(len(graph.nodes))
    placed: list[tuple[int, Buffer]] = []
    offsets: dict[tuple[str, int], int] = {}
    end = 0
    for buf in buffers:
        # Overlapping in time = alive where buf starts, or starting inside its life.
        neighbours = (index.alive_at_count(buf.first)
                      + index.starting_count(buf.first + 1, buf.last))
        if neighbours > MAX_NEIGHBOURS:
            offset = end
        else:
            found = index.alive_at(buf.first)
            if buf.last > buf.first:
                found += index.starting_in(buf.first + 1, buf.last)
            offset = 0
            for off, other in sorted((placed[i] for i in found), key=lambda item: item[0]):
                if offset + buf.nbytes <= off:
                    break
                offset = max(offset, off + other.nbytes)
        index.add(len(placed), buf.first, buf.last)
        placed.append((offset, buf))
        offsets[buf.key] = offset
        end = max(end, offset + buf.nbytes)
    value_offsets = {k[1]: off for k, off in offsets.items() if k[0] == "value"}
    for vid, root in alias.items():
        value_offsets[vid] = value_offsets[root]
    return MemoryPlan(
        arena_bytes=end,
        value_offsets=value_offsets,
        scratch={k[1]: (off, b.nbytes) for (off, b) in placed
                 for k in [b.key] if k[0] == "scratch"},
        unshared_bytes=sum(b.nbytes for b in buffers),
    )
