"""Work and memory bounded by what the input declares: the memory
planner is near-linear in the node count, and constant folding has a size bound.

Bounds are proven without timing asserts: a planner run that would take minutes
when quadratic gets a generous subprocess timeout, and an oversized fold is
checked by what the compiler answers, under a memory limit in a subprocess."""

from __future__ import annotations

import itertools
import json
import random
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from neuronish.cc import memory
from neuronish.cc.memory import Buffer, plan_memory
from neuronish.cc.proto import tf_graph_pb2 as pb
from tests.cc.test_cc_hostile import CC, _node, _tensor


def _reference_plan(buffers: list[Buffer]) -> dict[tuple[str, int], int]:
    """The planner's rule written the obvious (quadratic) way: in order of first use
    (ties: larger first), each at the lowest offset clear of every placed buffer alive at
    the same time."""
    placed: list[tuple[int, Buffer]] = []
    for buf in sorted(buffers, key=lambda b: (b.first, -b.nbytes)):
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
    """A graph as the planner reads it once `lifetimes` and `aliases` are given: only
    its positions."""

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
        monkeypatch.setattr(memory, "lifetimes", lambda _g, _alias=None, b=buffers: list(b))
        monkeypatch.setattr(memory, "aliases", lambda _g: {})
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
    monkeypatch.setattr(memory, "lifetimes", lambda _g, _alias=None: list(buffers))
    monkeypatch.setattr(memory, "aliases", lambda _g: {})
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
        memory.lifetimes = lambda _g, _alias=None: chain
        memory.aliases = lambda _g: {}
        plan = memory.plan_memory(Positions())
        assert plan.arena_bytes == 512, plan.arena_bytes
        print("planned")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "planned" in done.stdout, done.stderr


# --------------------------------------------------------------------- constant folding

def _fold_graph(kind: str) -> bytes:
    """A GraphDef of a few hundred bytes whose one node, folded, would be GiBs."""
    g = pb.GraphDef()
    i32, i64, f32 = ("type", pb.DT_INT32), ("type", pb.DT_INT64), ("type", pb.DT_FLOAT)
    _node(g, "x", "Placeholder", dtype=f32)
    if kind == "Fill":  # 4 GiB of float32 from a 4-byte scalar
        _node(g, "dims", "Const", dtype=i32, value=_tensor([2], pb.DT_INT32, int_val=[2**28, 4]))
        _node(g, "v", "Const", dtype=f32, value=_tensor([], float_val=[1.0]))
        _node(g, "y", "Fill", ("dims", "v"), T=f32, index_type=i32)
    elif kind == "Tile":  # 8 GiB
        _node(g, "c", "Const", dtype=f32, value=_tensor([2, 4], float_val=[1.0]))
        _node(g, "m", "Const", dtype=i32, value=_tensor([2], pb.DT_INT32, int_val=[2**27, 2]))
        _node(g, "y", "Tile", ("c", "m"), T=f32, Tmultiples=i32)
    elif kind == "OneHot":  # 4 GiB
        _node(g, "i", "Const", dtype=i32, value=_tensor([2**15], pb.DT_INT32, int_val=[1]))
        _node(g, "d", "Const", dtype=i32, value=_tensor([], pb.DT_INT32, int_val=[2**15]))
        _node(g, "on", "Const", dtype=f32, value=_tensor([], float_val=[1.0]))
        _node(g, "off", "Const", dtype=f32, value=_tensor([], float_val=[0.0]))
        _node(g, "y", "OneHot", ("i", "d", "on", "off"), T=f32, TI=i32, axis=-1)
    elif kind == "ZerosLike":  # of a 4 GiB value computed on the device
        _node(g, "c", "Const", dtype=f32, value=_tensor([2, 4], float_val=[1.0]))
        _node(g, "m", "Const", dtype=i32, value=_tensor([2], pb.DT_INT32, int_val=[2**27, 1]))
        _node(g, "t", "Tile", ("c", "m"), T=f32, Tmultiples=i32)
        _node(g, "y", "ZerosLike", ("t",), T=f32)
    elif kind == "Range":  # 32 GiB of int64; there is no device instruction for it
        for name, v in (("s", 0), ("l", 2**32), ("d", 1)):
            _node(g, name, "Const", dtype=i64, value=_tensor([], pb.DT_INT64, int64_val=[v]))
        _node(g, "y", "Range", ("s", "l", "d"), Tidx=i64)
    return g.SerializeToString()


def _compile_limited(tmp_path: Path, graph: bytes, limit: int = 2 << 30) -> tuple[int, str]:
    """neuronish-cc as a subprocess whose address space is capped at `limit`."""
    src = tmp_path / "g.pb"
    src.write_bytes(graph)
    io = json.dumps({"inputs": {"x:0": [[2, 4], "float32"]}, "outputs": ["y:0"]})

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    done = subprocess.run([CC, "compile", str(src), "--framework", "TENSORFLOW", "--io-config",
                           io, "--output", str(tmp_path / "out.neff")],
                          capture_output=True, text=True, timeout=120, preexec_fn=cap)
    return done.returncode, done.stderr


@pytest.mark.parametrize("kind", ["Fill", "Tile", "OneHot", "ZerosLike"])
def test_a_fold_larger_than_the_bound_stays_on_the_device(kind: str, tmp_path: Path) -> None:
    """Folded, each would allocate GiBs at compile time (4 GiB for Fill: past the 2 GiB
    cap, an internal MemoryError); left unfolded it compiles in the cap, the device
    computing the tensor at run time."""
    code, stderr = _compile_limited(tmp_path, _fold_graph(kind))
    assert code == 0, stderr
    assert (tmp_path / "out.neff").stat().st_size < 1 << 20  # no GiB constant inside


def test_a_range_larger_than_the_bound_is_refused_naming_it(tmp_path: Path) -> None:
    code, stderr = _compile_limited(tmp_path, _fold_graph("Range"))
    assert code == 1, stderr
    assert "y (Range): Range(0, 4294967296, 1) would be a int64[4294967296] constant" in stderr
    assert "64 MiB" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "out.neff").exists()


def test_an_output_larger_than_the_device_holds_is_refused_at_compile_time(
        tmp_path: Path) -> None:
    """A Tile to [2^31, 16]: the compiler wrote it and its own validator refused it."""
    g = pb.GraphDef()
    i32, f32 = ("type", pb.DT_INT32), ("type", pb.DT_FLOAT)
    _node(g, "x", "Placeholder", dtype=f32)
    _node(g, "m", "Const", dtype=i32, value=_tensor([2], pb.DT_INT32, int_val=[2**30, 4]))
    _node(g, "y", "Tile", ("x", "m"), T=f32, Tmultiples=i32)
    code, stderr = _compile_limited(tmp_path, g.SerializeToString())
    assert code == 1 and "y (Tile): tile output: shape [2147483648, 16]" in stderr, stderr
    assert not (tmp_path / "out.neff").exists()


def test_small_folds_still_fold(tmp_path: Path) -> None:
    g = pb.GraphDef()
    i32, f32 = ("type", pb.DT_INT32), ("type", pb.DT_FLOAT)
    _node(g, "x", "Placeholder", dtype=f32)
    _node(g, "dims", "Const", dtype=i32, value=_tensor([2], pb.DT_INT32, int_val=[2, 4]))
    _node(g, "v", "Const", dtype=f32, value=_tensor([], float_val=[3.0]))
    _node(g, "f", "Fill", ("dims", "v"), T=f32, index_type=i32)
    _node(g, "y", "AddV2", ("x", "f"), T=f32)
    code, stderr = _compile_limited(tmp_path, g.SerializeToString())
    assert code == 0, stderr
    out = subprocess.run([CC, "inspect", str(tmp_path / "out.neff")], capture_output=True,
                         text=True, timeout=60).stdout
    assert "broadcast_to" not in out and "binary x1" in out, out
