"""The memory plan: one arena per loaded model, reused by values whose lifetimes
do not overlap.

Graph inputs and outputs live outside the arena (the caller's arrays are read in
place; outputs are written straight into the arrays handed back), constants
live in the constant table. Every other value, and every instruction's scratch
memory, gets an offset. Placement is greedy by size, largest first, each at the
lowest offset that does not collide with an already-placed buffer alive at the
same time (the strategy TFLite's arena planner uses).

An exception to docs/contracts.md's import rule, like `cc/interpret.py`: this module
imports `neuronish.runtime.kernels` to ask each kernel how much scratch memory it
needs (`Kernel.scratch_bytes`). The kernel that uses the scratch is the only
place that knows its layout (im2col columns, padded input); the plan reads that
same function, so it can never reserve less than the device will write.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuronish.runtime.kernels import KERNELS

from .ir import Graph

ALIGN = 64  # cache line; also what numpy's SIMD loops like


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


def lifetimes(graph: Graph) -> list[Buffer]:
    external = {v.id for v in graph.inputs} | {v.id for v in graph.outputs}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    size: dict[int, int] = {}
    buffers = []
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v.id in first:
                last[v.id] = i
        for o in node.outputs:
            if o.id not in external:
                first[o.id], last[o.id], size[o.id] = i, i, o.type.nbytes
        k = KERNELS[node.kind]
        nbytes = k.scratch_bytes([v.shape for v in node.inputs], [v.dtype for v in node.inputs],
                                 node.attrs)
        if nbytes:
            buffers.append(Buffer(("scratch", i), _align(nbytes), i, i))
    buffers += [Buffer(("value", vid), _align(max(size[vid], 1)), first[vid], last[vid])
                for vid in first]
    return buffers


def plan_memory(graph: Graph) -> MemoryPlan:
    buffers = sorted(lifetimes(graph), key=lambda b: (-b.nbytes, b.first))
    placed: list[tuple[int, Buffer]] = []
    offsets: dict[tuple[str, int], int] = {}
    end = 0
    for buf in buffers:
        live = sorted(((off, other) for off, other in placed
                       if other.first <= buf.last and buf.first <= other.last),
                      key=lambda item: item[0])
        offset = 0
        for off, other in live:
            if offset + buf.nbytes <= off:
                break
            offset = max(offset, off + other.nbytes)
        placed.append((offset, buf))
        offsets[buf.key] = offset
        end = max(end, offset + buf.nbytes)
    return MemoryPlan(
        arena_bytes=end,
        value_offsets={k[1]: off for k, off in offsets.items() if k[0] == "value"},
        scratch={k[1]: (off, b.nbytes) for (off, b) in placed
                 for k in [b.key] if k[0] == "scratch"},
        unshared_bytes=sum(b.nbytes for b in buffers),
    )
