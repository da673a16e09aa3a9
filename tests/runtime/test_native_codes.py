"""The spec codes runtime/native/spec.py writes are the ones engine.cc reads.

spec.py encodes each instruction as int64 codes (op, dtype, function) that engine.cc's
enums decode; the two files are kept apart (Python and C++), so this test reads every
enum of engine.cc and holds each Python table to it, entry by entry. A code changed on
one side only, or an entry added to one side only, fails here instead of running the
wrong kernel.
"""

from __future__ import annotations

import re

from neuronish.runtime import isa
from neuronish.runtime.kernels import elementwise
from neuronish.runtime.native import spec, spec_int8
from neuronish.runtime.native.library import SOURCES


def _enums() -> dict[str, int]:
    """Every enumerator of the `enum Name : int64_t { ... }` declarations of engine.cc's
    unit (engine.cc and the files it includes)."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", "", "\n".join(p.read_text() for p in SOURCES),
                  flags=re.S)
    out: dict[str, int] = {}
    for body in re.findall(r"enum\s+\w+\s*:\s*int64_t\s*\{(.*?)\}", text, flags=re.S):
        for name, value in re.findall(r"(\w+)\s*=\s*(-?\d+)", body):
            assert name not in out, f"engine.cc declares {name} twice"
            out[name] = int(value)
    return out


ENUMS = _enums()
_SHORT = {"maximum": "MAX", "minimum": "MIN", "greater": "GT", "greater_equal": "GE",
          "less": "LT", "less_equal": "LE", "equal": "EQ", "not_equal": "NE",
          "logical_and": "AND", "logical_or": "OR"}
_DTYPE = {"float32": "F32", "bfloat16": "BF16", "uint8": "U8", "int32": "S32", "int8": "S8",
          "float16": "F16", "int64": "S64", "float64": "F64", "int16": "S16", "bool": "BOOL"}


def _check(table: dict[str, int], name_of: object) -> None:
    for key, code in table.items():
        name = name_of(key)  # type: ignore[operator]
        assert name in ENUMS, f"spec.py's {key!r} has no engine.cc enumerator {name}"
        assert ENUMS[name] == code, f"{name}: spec.py says {code}, engine.cc {ENUMS[name]}"


def test_op_codes_match() -> None:
    ops = {n: v for m in (spec, spec_int8) for n, v in vars(m).items()
           if re.fullmatch(r"OP_[A-Z0-9_]+", n) and isinstance(v, int)}
    assert len(ops) > 30
    _check(ops, lambda n: n)
    assert {n for n in ENUMS if n.startswith("OP_")} == set(ops), "an op on one side only"


def test_dtype_codes_match() -> None:
    _check(spec.DTYPES, lambda d: "D_" + _DTYPE[d])
    assert set(spec.DTYPES) == isa.DTYPES, "every device dtype has an engine code"


def test_function_codes_match() -> None:
    _check(spec.LOOP, lambda f: "F_" + _SHORT.get(f, f.upper()))
    _check(spec.BINARY, lambda f: "B_" + _SHORT.get(f, f.upper()))
    _check(spec.REDUCE, lambda f: "R_" + {"prod": "MUL"}.get(f, f.upper()))
    _check(spec.REDUCE_LOGICAL, lambda f: "R_" + f.upper())
    _check(spec.G_UNARY, lambda f: "G_" + f.upper())
    eltwise = {n: v for n, v in vars(spec).items() if re.fullmatch(r"E_[A-Z_]+", n)}
    _check(eltwise, lambda n: n)


def test_function_tables_name_declared_functions() -> None:
    """Each engine's function tables name only what isa.py declares, and the reference
    engine defines every declared function."""
    assert set(elementwise.UNARY) == set(isa.UNARY_FNS)
    assert set(elementwise.BINARY) == set(isa.BINARY_FNS)
    assert set(spec.G_UNARY) == set(isa.UNARY_FNS)
    assert set(spec.ELTWISE) <= set(isa.UNARY_FNS)
    for table in (spec.LOOP, spec.BINARY, isa.SWAPPED):
        assert set(table) <= set(isa.BINARY_FNS)
    assert set(isa.UNARY_DOMAIN) == set(isa.UNARY_FNS)
    assert set(isa.BINARY_DOMAIN) == set(isa.BINARY_FNS)


def _encode_op(kind: str, attrs: dict, types: list[isa.Type]) -> int | None:
    ins = [spec.Ref(i + 1, 0, t.dtype, t.shape) for i, t in enumerate(types)]
    outs = [spec.Ref(0, 0, t.dtype, t.shape) for t in isa.check(kind, types, attrs)]
    encoded = spec.encode(kind, attrs, ins, outs, [False] * len(ins))
    return None if encoded is None else encoded[0][0]


def test_each_kind_has_one_loop() -> None:
    """unary, binary, cast, softmax (and log-softmax) and reduce run on a oneDNN primitive
    or on the one loop of their kind (OP_G_*), for every admitted function and dtype: the
    float32/int32-only loops that once duplicated those (MAP, BINARY_LOOP, CAST_LOOP,
    LOG_SOFTMAX, LOG_SOFTMAX_AXIS, REDUCE_INT) are gone, and no second loop comes back
    unnoticed. Log-softmax is never oneDNN's (its log is off by up to 3e-6)."""
    from neuronish.runtime.native import coverage

    allowed = {"unary": {spec.OP_ELTWISE, spec.OP_G_UNARY},
               "binary": {spec.OP_BINARY, spec.OP_G_BINARY},
               "cast": {spec.OP_REORDER, spec.OP_G_CAST},
               "softmax": {spec.OP_SOFTMAX, spec.OP_G_SOFTMAX},
               "reduce": {spec.OP_REDUCE, spec.OP_G_REDUCE}}
    seen: dict[str, set[int]] = {kind: set() for kind in allowed}
    for sample in coverage.sample_instructions():
        if sample.kind not in allowed:
            continue
        types = [isa.Type(shape, dtype) for shape, dtype in sample.types]
        op = _encode_op(sample.kind, dict(sample.attrs), types)
        assert op is not None, f"{sample.label()} is left to numpy"
        assert op in allowed[sample.kind], f"{sample.label()} runs on op {op}"
        if sample.kind == "softmax" and sample.attrs["log"]:
            assert op == spec.OP_G_SOFTMAX, f"{sample.label()} runs on op {op}"
        seen[sample.kind].add(op)
    assert seen == allowed, "each kind's primitive and loop are both exercised"
    # The samples reduce the last axis; log-softmax along another axis had a loop of its own.
    log_axis = _encode_op("softmax", {"axis": 1, "log": True}, [isa.Type((2, 3, 8), "float32")])
    assert log_axis == spec.OP_G_SOFTMAX, f"float32 log-softmax over axis 1 runs on op {log_axis}"
