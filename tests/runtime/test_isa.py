"""One declaration per instruction kind (runtime/isa.py): its schema refuses what the
kernels must never see, the kernel registry and the ISA doc follow it, and reading an
executable does not need the kernels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from neuronish.runtime import isa
from neuronish.runtime.isa import IsaError, Type

ROOT = Path(__file__).resolve().parents[2]
F32 = "float32"


def t(*shape: int, dtype: str = F32) -> Type:
    return Type(tuple(shape), dtype)


CONV = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0]}
POOL = {"mode": "max", "ksize": [2, 2], "strides": [1, 1], "pads": [0, 0, 0, 0]}

# (kind, input types, attrs, the field the error must name)
REFUSED = [
    ("conv2d", [t(1, 5, 5, 3), t(3, 3, 3, 4)], {**CONV, "strides": [-1, 1]}, "strides"),
    ("conv2d", [t(1, 5, 5, 3), t(3, 3, 3, 4)], {**CONV, "dilations": [1, 0]}, "dilations"),
    ("conv2d", [t(1, 5, 5, 3), t(3, 3, 3, 4)], {**CONV, "pads": [0, -1, 0, 0]}, "pads"),
    ("conv2d", [t(1, 5, 5, 3), t(3, 3, 3, 4)], {**CONV, "dilations": [3, 1]}, "dilations"),
    ("conv2d", [t(1, 5, 5, 4), t(1, 1, 2, 3)], {**CONV, "groups": 2}, "groups"),
    ("conv2d", [t(1, 5, 5, 3), t(1, 1, 3, 4)], {**CONV, "groups": 0}, "groups"),
    ("conv2d", [t(1, 5, 5, 3), t(1, 1, 3, 4)], {**CONV, "residual": True}, "residual"),
    ("conv2d", [t(1, 5, 5, 3), t(1, 1, 3, 4)], {**CONV, "activation": "fft"}, "activation"),
    ("conv2d", [t(1, 5, 5, 3), t(1, 1, 3, 4)], {**CONV, "layout": "nchw"}, "layout"),
    ("conv2d", [t(1, 5, 5, 3), t(1, 1, 3, 4)], {"strides": [1, 1], "pads": [0] * 4},
     "dilations"),
    ("conv2d", [t(1, 5, 5, 3), t(1, 1, 3, 4)], {**CONV, "strides": [True, 1]}, "strides"),
    ("depthwise_conv2d", [t(1, 5, 5, 3), t(3, 3, 2, 1)], CONV, "in"),
    ("pool", [t(1, 4, 4, 2)], {**POOL, "ksize": [0, 2]}, "ksize"),
    ("pool", [t(1, 4, 4, 2)], {**POOL, "ksize": [5, 2]}, "ksize"),
    ("pool", [t(1, 4, 4, 2)], {**POOL, "ksize": [10**9, 2], "pads": [10**9 - 1] * 2 + [0, 0]},
     "ksize"),
    ("pool", [t(1, 4, 4, 2)], {**POOL, "pads": [2, 0, 0, 0]}, "pads"),
    ("pool", [t(1, 4, 4, 2)], {**POOL, "mode": "min"}, "mode"),
    ("pool", [t(4, 4, 2)], POOL, "in"),
    ("reduce", [t(2, 3)], {"fn": "sum", "axes": [2], "keepdims": False}, "axes"),
    ("reduce", [t(2, 3)], {"fn": "sum", "axes": [1, 1], "keepdims": False}, "axes"),
    ("softmax", [t(2, 3)], {"axis": 2}, "axis"),
    ("argminmax", [t(2, 3)], {"fn": "argmax", "axis": 0, "to": "float32"}, "to"),
    ("transpose", [t(2, 3, 4)], {"perm": [0, 0, 1]}, "perm"),
    ("transpose", [t(2, 3, 4)], {"perm": [0, 1]}, "perm"),
    ("reshape", [t(2, 3)], {"shape": [7]}, "shape"),
    ("concat", [t(2, 3), t(2, 4)], {"axis": 0}, "in"),
    ("concat", [t(2, 3), t(2, 4)], {"axis": 2}, "axis"),
    ("strided_slice", [t(5)], {"begin": [0], "end": [5], "strides": [0]}, "strides"),
    ("strided_slice", [t(5, 2)], {"begin": [0], "end": [5], "strides": [1]}, "begin"),
    ("pad", [t(3)], {"paddings": [[3, 0]], "mode": "reflect"}, "paddings"),
    ("pad", [t(3)], {"paddings": [[-1, 0]]}, "paddings"),
    ("tile", [t(3)], {"multiples": [1, 2]}, "multiples"),
    ("broadcast_to", [t(3)], {"shape": [2, 4]}, "shape"),
    ("gather", [t(4, 3), t(2, dtype="int32")], {"axis": 2}, "axis"),
    ("gather", [t(4, 3), t(2, dtype="float32")], {"axis": 0}, "in"),
    ("one_hot", [t(3, dtype="int32")], {"depth": 4, "on_value": 1, "off_value": 0, "axis": 3,
                                        "to": "float32"}, "axis"),
    ("unary", [t(3)], {"fn": "relu", "alpha": "big"}, "alpha"),
    ("binary", [t(3), t(3, dtype="int32")], {"fn": "add"}, "in"),
    ("cast", [t(3)], {"to": "complex64"}, "to"),
    ("matmul", [t(2, 3)], {}, "in"),
    ("resize", [t(1, 2, 2, 1)], {"mode": "bilinear", "size": [0, 4]}, "size"),
]


@pytest.mark.parametrize("kind,types,attrs,field", REFUSED,
                         ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(REFUSED)])
def test_schema_refuses_with_the_field(kind: str, types: list, attrs: dict, field: str) -> None:
    with pytest.raises(IsaError) as e:
        isa.check(kind, types, attrs)
    assert e.value.field == field, e.value


def test_defaults_fill_in_and_rules_give_the_output_type() -> None:
    # Attributes with defaults may be left out (older executables lack `groups`).
    assert isa.check("conv2d", [t(1, 9, 7, 4), t(3, 3, 2, 6), t(6)],
                     {**CONV, "strides": [2, 1], "pads": [1, 1, 1, 1], "groups": 2}) == \
        [t(1, 5, 7, 6)]
    assert isa.check("pool", [t(1, 4, 4, 2)], {**POOL, "ksize": [3, 3], "pads": [1, 1, 1, 1],
                                                  "strides": [2, 2]}) == [t(1, 2, 2, 2)]
    assert isa.check("strided_slice", [t(6, 5)], {"begin": [5, 0], "end": [None, 5],
                                                  "strides": [-2, 2]}) == [t(3, 3)]


def test_value_types_are_bounded() -> None:
    assert isa.check_type([2, 3], "bfloat16") == t(2, 3, dtype="bfloat16")
    for shape, dtype, field in [([2, -1], F32, "shape"), ([2**31], F32, "shape"),
                                ([2**20, 2**20, 2**20], "int8", "shape"), ([2], "object", "dtype"),
                                ([1] * 40, F32, "shape"), ("abc", F32, "shape")]:
        with pytest.raises(IsaError) as e:
            isa.check_type(shape, dtype)
        assert e.value.field == field


def test_passes_read_the_trait_sets() -> None:
    from neuronish.cc.passes import autocast, fuse, simplify

    assert fuse._PRODUCERS is isa.MATMUL_LIKE and fuse._ACTIVATIONS is isa.ACTIVATIONS
    assert autocast._MATMULS is isa.MATMUL_LIKE and autocast._NO_ROUND is isa.NO_FLOAT_MATH
    assert "isa.SAME_TYPE_IS_IDENTITY" in Path(simplify.__file__).read_text()
    # Every fusable activation is a unary fn the `activation` attribute accepts.
    assert isa.ACTIVATIONS <= set(isa.KINDS["conv2d"].attr_index["activation"].spec.choices)


def test_kernel_registry_follows_the_declarations(monkeypatch: pytest.MonkeyPatch) -> None:
    from neuronish.runtime.kernels import KERNELS, registry

    assert set(KERNELS) == set(isa.KINDS)
    with pytest.raises(RuntimeError, match="does not declare"):
        registry.kernel("fft")(lambda ins, outs, attrs, scratch: None)
    monkeypatch.setitem(isa.KINDS, "fft", isa.Kind("fft", ("x",), rule=isa.KINDS["copy"].rule))
    with pytest.raises(RuntimeError, match="fft have no numpy kernel"):
        registry.check_complete()


def test_isa_doc_is_generated_from_the_declarations() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "isa_doc.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = (ROOT / "docs" / "isa.md").read_text()
    for kind in isa.KINDS:
        assert f"| `{kind}` |" in doc


def test_reading_an_executable_imports_no_kernel() -> None:
    code = ("import sys; from neuronish.runtime.executable import from_bytes; "
            f"from_bytes(open({str(ROOT / 'tests/golden/conv_bn.neff')!r}, 'rb').read()); "
            "print(sorted(m for m in sys.modules if 'kernels' in m or m == 'scipy'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# --- executables: every instruction checked against its declaration --------------------

GOLDEN = ROOT / "tests" / "golden" / "conv_bn.neff"


def _resealed(edit: object) -> bytes:
    """The golden executable with `edit(body)` applied and the checksum re-sealed."""
    import hashlib
    import struct

    import msgpack

    from neuronish.runtime.executable import FORMAT_VERSION, HEADER_SIZE, MAGIC

    data = GOLDEN.read_bytes()
    body = msgpack.unpackb(data[HEADER_SIZE:], strict_map_key=False)
    edit(body)  # type: ignore[operator]
    payload = msgpack.packb(body, use_bin_type=True)
    return struct.pack("<8sIIQ32s", MAGIC, FORMAT_VERSION, 0, len(payload),
                       hashlib.sha256(payload).digest()) + payload


def _conv_attr(key: str, value: object) -> object:
    return lambda b: b["programs"][0][0]["attrs"].__setitem__(key, value)


# The golden file's instruction 0 is the conv2d (TF nodes Conv2D, mul, add, Relu) on
# core 0, instruction 1 the mean on core 1.
BAD_INSTRUCTIONS = {
    "negative-stride": (_conv_attr("strides", [-1, 1]), "instruction 0 ", "'attrs.strides'"),
    "zero-dilation": (_conv_attr("dilations", [0, 1]), "instruction 0 ", "'attrs.dilations'"),
    "dilation-past-input": (_conv_attr("dilations", [5, 1]), "larger than the padded input",
                      "'attrs.dilations'"),
    "negative-pad": (_conv_attr("pads", [1, 1, -3, 1]), "'conv2d'", "'attrs.pads'"),
    "stride-changes-shape": (_conv_attr("strides", [2, 2]), "declares outputs", "'out'"),
    "groups-not-dividing": (_conv_attr("groups", 2), "group", "'attrs.groups'"),
    "unknown-activation": (_conv_attr("activation", "mish"), "mish", "'attrs.activation'"),
    "unknown-attr": (_conv_attr("tiling", "8x8"), "no attribute 'tiling'", "'tiling'"),
    "missing-attr": (lambda b: b["programs"][0][0]["attrs"].pop("pads"), "needs attribute",
                     "'attrs.pads'"),
    "axis-out-of-range": (lambda b: b["programs"][1][0]["attrs"].__setitem__("axes", [1, 7]),
                          "instruction 1 (#0 of core 1, 'reduce', from TF node(s) Mean)",
                          "'attrs.axes'"),
    "keepdims-changes-shape": (lambda b: b["programs"][1][0]["attrs"].__setitem__(
        "keepdims", True), "declares outputs", "'out'"),
    "tf-not-strings": (lambda b: b["programs"][1][0].__setitem__("tf", [3]), "instruction 1 ",
                       "'tf'"),
    "wrong-arity": (lambda b: b["programs"][0][0].__setitem__("in", [0]), "takes 2 to 4",
                    "'in'"),
    "dtype-of-output": (lambda b: b["values"][1].__setitem__(2, "int32"), "declares outputs",
                        "'out'"),
    "bfloat16-is-a-dtype-but-not-here": (lambda b: b["values"][1].__setitem__(2, "bfloat16"),
                                         "declares outputs", "'out'"),
}


@pytest.mark.parametrize("case", BAD_INSTRUCTIONS)
def test_instructions_are_checked_against_their_declaration(case: str) -> None:
    from neuronish.runtime.errors import ExecutableError
    from neuronish.runtime.executable import from_bytes

    edit, *wanted = BAD_INSTRUCTIONS[case]
    with pytest.raises(ExecutableError) as e:
        from_bytes(_resealed(edit))
    message = str(e.value)
    for text in wanted:
        assert text in message, message
    if "instruction 0 " in message:
        assert "from TF node(s) Conv2D, mul, add, Relu" in message, message


def test_an_executable_that_passes_runs() -> None:
    """The checks refuse the bad, not the good: the golden file with an extra, harmless
    default spelled out still loads and runs."""
    import numpy as np

    from neuronish.runtime import load

    model = load(_resealed(_conv_attr("groups", 1)))
    out = model.run({"x:0": np.ones((2, 8, 8, 3), np.float32)})
    assert out["Identity:0"].shape == (2, 8)
    model.unload()


@pytest.mark.parametrize("field,value", [("compiler", [1, 2]), ("stats", {"flops": b"\x00"}),
                                         ("compiler", {"options": "fast"}),
                                         ("compiler", {"options": {"auto_cast_type": ["bf16"]}}),
                                         ("compiler", {"version": 2})])
def test_described_fields_must_be_plain_maps(field: str, value: object) -> None:
    from neuronish.runtime.errors import ExecutableError
    from neuronish.runtime.executable import from_bytes

    with pytest.raises(ExecutableError, match=field if field == "stats" else "compiler"):
        from_bytes(_resealed(lambda b: b.__setitem__(field, value)))


def test_buffers_in_use_together_may_not_share_arena_bytes() -> None:
    """The conv's output %3 placed over its own scratch: the kernel would overwrite its
    im2col columns with results (garbage, silently), so the file is refused."""
    from neuronish.runtime.errors import ExecutableError
    from neuronish.runtime.executable import from_bytes

    with pytest.raises(ExecutableError, match=r"puts .* over .*while both are in use"):
        from_bytes(_resealed(lambda b: b["memory"]["offsets"][0].__setitem__(1, 64)))
