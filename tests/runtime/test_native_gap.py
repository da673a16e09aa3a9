"""Every instruction the device admits, on the native engine: the measured gap and the
kernels that closed it.

`runtime/native/coverage.py` builds one small instruction for every (kind, function,
dtypes) combination `runtime/isa.py` admits. Here (1) the combinations the native engine
leaves to numpy must be exactly the recorded GAP (a kernel gained or lost is a diff to
review, not a silent change), and (2) every combination it does take runs natively and
gives the numpy reference engine's numbers (the reference defines each instruction:
bit for bit for integers, bools and data movement; within the dtype's rounding for float
math, whose libm calls and summation order may differ). TensorFlow comparisons of the new
dtypes are in tests/runtime/test_native_coverage.py.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from neuronish.runtime import isa, load
from neuronish.runtime.executable import Executable, Instruction, to_bytes
from neuronish.runtime.native import library
from neuronish.runtime.native.coverage import Sample, gaps, native, sample_instructions
from neuronish.runtime.signature import TensorSignature
from tests.helpers import run_reporting_numpy

# What the native engine still leaves to numpy (python -m neuronish.runtime.native.coverage).
GAP = """
""".split("\n")

SAMPLES = sample_instructions()


def test_the_native_gap_is_the_recorded_one() -> None:
    left = [s.label() for s in gaps()]
    want = [line for line in GAP if line.strip()]
    assert left == want, "the native engine's gap changed: update GAP (and the report)\n" + \
        "\n".join(left)


def test_every_declared_kind_is_sampled() -> None:
    assert {s.kind for s in SAMPLES} == set(isa.KINDS)


_WEIGHTED = isa.MATMUL_LIKE | {"conv2d_int8", "matmul_int8"}


def _executable(s: Sample, inputs: list[np.ndarray]) -> tuple[bytes, dict]:
    """One instruction as an executable, and its feeds: the weights (input 1) of the
    matrix-unit kinds are constants, as the compiler makes them; the rest inputs in0..."""
    constants = {1: inputs[1]} if s.kind in _WEIGHTED else {}
    in_ids = [i for i in range(len(s.types)) if i not in constants]
    ins = [TensorSignature(f"in{i}", s.types[i][1], tuple(s.types[i][0])) for i in in_ids]
    out_types = isa.check(s.kind, [isa.Type(shape, d) for shape, d in s.types], s.attrs)
    out_ids = [len(s.types) + j for j in range(len(out_types))]
    outs = [TensorSignature(f"out{j}", t.dtype, t.shape) for j, t in enumerate(out_types)]
    scratch = isa.scratch_bytes(s.kind, [shape for shape, _ in s.types],
                                [d for _, d in s.types], s.attrs)
    instr = Instruction(s.kind, tuple(range(len(s.types))), tuple(out_ids),
                        dict(s.attrs), (0, scratch) if scratch else None, ("sample",))
    exe = to_bytes(Executable(
        {"name": "test", "version": "0", "options": {}, "command": ""}, ins, outs, in_ids,
        out_ids, constants,
        {v: (sig.shape, sig.dtype) for v, sig in zip(in_ids + out_ids, ins + outs)}, scratch,
        {}, [[instr]]))
    return exe, {sig.name: inputs[v] for v, sig in zip(in_ids, ins)}


_POSITIVE = {"log", "sqrt", "rsqrt", "log1p"}


def _inputs(s: Sample, rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for i, (shape, dtype) in enumerate(s.types):
        fn = s.attrs.get("fn")
        if dtype == "bool":
            x = rng.uniform(size=shape) < 0.5
        elif dtype in isa.INTEGERS:
            info = np.iinfo(dtype)
            if (s.kind, i) == ("gather", 1):
                x = rng.integers(0, s.types[0][0][s.attrs["axis"]], shape)
            elif (s.kind, i) == ("one_hot", 0):
                x = rng.integers(-1, 5, shape)
            elif s.kind == "binary" and fn == "pow":
                x = rng.integers(0 if i else info.min // 2 if info.min else 0, 9 if i else 9,
                                 shape)
            elif s.kind == "binary" and i == 1 and fn in ("div", "floor_div", "floor_mod"):
                x = rng.integers(max(info.min, -4), 5, shape)  # zeros too: defined as 0
            elif s.kind in ("pool", "pool3d") and s.fn == "avg" and dtype == "int64":
                # (an integer mean sums in float64: exact, in any order, below 2**53)
                x = rng.integers(-2**40, 2**40, shape)
            else:
                x = rng.integers(info.min, int(info.max) + 1, shape, dtype=np.int64)
                x[..., 0] = info.min  # the edges: wrapping, INT_MIN / -1, abs(INT_MIN)
            x = np.asarray(x).astype(dtype)
        elif s.fn.startswith("activation="):
            # Small integers: the products are exact in any summation order, so what is
            # compared is the epilogue's function (whose slope may be steep: tan, exp).
            act = s.attrs["activation"]
            x = rng.integers(0 if act in _POSITIVE else -3, 4, shape).astype(dtype)
        else:
            lo, hi = (0.05, 6.0) if fn in _POSITIVE or (fn == "pow" and i == 0) else (-6.0, 6.0)
            x = rng.uniform(lo, hi, shape).astype(np.float32)
            if s.kind == "cast" and s.attrs["to"] in isa.INTEGERS:
                x = x * 40.0
            x = x.astype(dtype)
        out.append(x)
    return out


def _tolerance(dtype: str) -> float:
    return {"float64": 1e-12, "float32": 2e-6, "float16": 2e-3, "bfloat16": 1.6e-2}[dtype]


@pytest.fixture
def native_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONISH_ENGINE", "native")
    assert library.load() is not None, f"native engine unavailable: {library.why_not()}"


NATIVE = [s for s in SAMPLES if native(s)]


@pytest.mark.parametrize("sample", NATIVE, ids=[s.label() for s in NATIVE])
def test_native_matches_the_reference(native_engine: None, monkeypatch: pytest.MonkeyPatch,
                                      sample: Sample) -> None:
    # Seeded by the label's CRC, not hash(): str hashes change per process, and a
    # failure must come back when the test is re-run.
    rng = np.random.default_rng(zlib.crc32(sample.label().encode()))
    exe, feeds = _executable(sample, _inputs(sample, rng))
    assert_native_matches_reference(sample, exe, feeds, monkeypatch)


def assert_native_matches_reference(sample: Sample, exe: bytes, feeds: dict,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One call of `exe` on the native engine (every instruction native) gives the numpy
    reference engine's outputs: bit for bit, or within the dtype's rounding for float math."""
    got, left = run_reporting_numpy(exe, feeds)
    assert left == [], f"left to numpy: {left}"
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    with load(exe) as model:
        want = model.run(feeds)
    for key, ref in want.items():
        have = got[key]
        assert have.dtype == ref.dtype and have.shape == ref.shape, key
        if ref.dtype.name in isa.FLOATS and not (sample.kind in isa.MOVEMENT
                                                 or sample.kind == "select"):
            tol = _tolerance(sample.dtypes[0] if sample.dtypes[0] in isa.FLOATS
                             else ref.dtype.name)
            if sample.kind in _WEIGHTED | {"conv3d"}:
                tol = max(tol, 2e-5)  # sums of products in another order
            a, b = have.astype(np.float64), ref.astype(np.float64)
            scale = float(np.max(np.abs(b[np.isfinite(b)]), initial=1.0))
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale,
                                       err_msg=sample.label())
        else:
            np.testing.assert_array_equal(have.view(np.uint8), ref.view(np.uint8),
                                          err_msg=sample.label())


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64"])
def test_integer_division_by_zero_is_defined(native_engine: None,
                                             monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """An integer division or remainder by zero gives 0 (numpy's answer; TF's CPU kernels
    raise), and MIN / -1 wraps to MIN, on both engines: never a crash or undefined
    behaviour (docs/isa.md, binary)."""
    info = np.iinfo(dtype)
    a = np.array([7, -7 if info.min else 9, 0, info.min, info.max, info.min], dtype)
    b = np.array([0, 0, 0, 0, 0, -1 if info.min else 1], dtype)
    signed = info.min < 0
    for fn in ("div", "floor_div", "floor_mod"):
        s = Sample("binary", fn, (dtype, dtype), dtype, {"fn": fn}, ((a.shape, dtype),) * 2)
        exe, feeds = _executable(s, [a, b])
        results = {}
        for engine in ("native", "numpy"):
            monkeypatch.setenv("NEURONISH_ENGINE", engine)
            got, left = run_reporting_numpy(exe, feeds)
            assert left == []
            results[engine] = got["out0"]
        np.testing.assert_array_equal(results["native"], results["numpy"], err_msg=fn)
        assert (results["native"][:5] == 0).all(), (fn, results["native"])
        if signed:  # MIN / -1 wraps to MIN; its remainder is 0
            assert results["native"][5] == (0 if fn == "floor_mod" else info.min)
