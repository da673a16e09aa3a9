"""Work and memory bounded by what the input declares (issue 23): the memory
planner is near-linear in the node count, and constant folding has a size bound.

Bounds are proven without timing asserts: a planner run that would take minutes
when quadratic gets a generous subprocess timeout, and an oversized fold is
checked by what the compiler answers, under a memory limit in a subprocess."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
import textwrap

from neuronish.cc import memory
from neuronish.cc.memory import Buffer, plan_memory


def _reference_plan(buffers: list[Buffer]) -> dict[tuple[str, int], int]:
    """The planner's rule written the obvious (quadratic) way: largest first, each at
    the lowest offset clear of every placed buffer alive at the same time."""
    placed: list[tuple[int, Buffer]] = []
    for buf in sorted(buffers, key=lambda b: (-b.nbytes, b.first)):
        live = sorted((item for item in placed if item[1].first <= buf.last
                       and buf.first <= item[1].last), key=lambda item: item[0])
        offset = 0
        for off, other in live:
            if offset + buf.nbytes <= off:
                break
            offset = max(offset, off + other.nbytes)
        placed.append((offset, buf))
    return {b.key: off for off, b in placed}


class _Positions:
    def __init__(self, n: int):
        self.nodes = [None] * n


def test_memory_plan_is_the_greedy_rule(monkeypatch) -> None:
    """The indexed planner places every buffer exactly where the plain rule does."""
    rng = random.Random(23)
    for _ in range(200):
        n = rng.randint(1, 50)
        buffers = []
        for i in range(rng.randint(1, 60)):
            first = rng.randrange(n)
            last = min(n - 1, first + rng.choice([0, 1, 2, 7, rng.randrange(n)]))
            buffers.append(Buffer(("value", i), 64 * rng.randint(1, 40), first, last))
        monkeypatch.setattr(memory, "lifetimes", lambda _g, b=buffers: list(b))
        plan = plan_memory(_Positions(n))
        assert {("value", k): v for k, v in plan.value_offsets.items()} == \
            _reference_plan(buffers)


def test_memory_plan_with_many_live_buffers_stays_correct(monkeypatch) -> None:
    """Past MAX_NEIGHBOURS overlapping buffers the planner stops searching for gaps;
    the plan must still never overlap two live buffers."""
    monkeypatch.setattr(memory, "MAX_NEIGHBOURS", 8)
    rng = random.Random(5)
    buffers = [Buffer(("value", i), 64 * rng.randint(1, 9), f, min(39, f + rng.randint(0, 30)))
               for i, f in enumerate(rng.randrange(40) for _ in range(120))]
    monkeypatch.setattr(memory, "lifetimes", lambda _g: list(buffers))
    plan = plan_memory(_Positions(40))
    where = {("value", k): v for k, v in plan.value_offsets.items()}
    for a, b in itertools.combinations(buffers, 2):
        if a.first <= b.last and b.first <= a.last:
            lo, hi = sorted([(where[a.key], a), (where[b.key], b)], key=lambda t: t[0])
            assert lo[0] + lo[1].nbytes <= hi[0], (a, b)
    assert max(where[b.key] + b.nbytes for b in buffers) == plan.arena_bytes


def test_memory_plan_of_a_long_chain_is_near_linear() -> None:
    """60,000 buffers in a chain: about a second when each buffer meets only its
    neighbours; quadratic (each scanned against every placed one) it took minutes
    (20,000: 35 s), past the timeout."""
    script = textwrap.dedent("""
        from neuronish.cc import memory
        from neuronish.cc.memory import Buffer
        n = 60_000
        chain = [Buffer(("value", i), 256, i, i + 1) for i in range(n)]
        class Positions:
            nodes = [None] * (n + 1)
        memory.lifetimes = lambda _g: chain
        plan = memory.plan_memory(Positions())
        assert plan.arena_bytes == 512, plan.arena_bytes
        print("planned")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "planned" in done.stdout, done.stderr
