"""`binary_quantize` is quantize(binary(a, b [, c], activation)) bit for bit, on every engine
(runtime/isa.py).

The compiler fuses an add/sub/mul read only by a `quantize` into one `binary_quantize`
(cc/passes/binary_quantize.py), so the fused instruction must give exactly the 8-bit
values the pair gave: the binary's result rounded to bfloat16 when its operands are
(the value the pair stored), then quantize's round-half-even and saturation, NaN
giving 0. Each case runs the pair (the product also an output, so no memory plan is
needed) and the fused instruction on the numpy reference engine, the native engine
under the Python host and the C runtime, on values that hit quantize's ties, its
saturation, NaN and infinities, and bfloat16 products that round.
"""

from __future__ import annotations

import shutil

import ml_dtypes
import numpy as np
import pytest

from neuronish.runtime import isa, load
from neuronish.runtime.capi import binding
from neuronish.runtime.executable import Executable, Instruction, to_bytes
from neuronish.runtime.kernels import evaluate
from neuronish.runtime.signature import TensorSignature
from tests.helpers import run_reporting_numpy

# (a's shape, b's shape): the squeeze-excite product, either operand broadcast, a scalar,
# one broadcast dim in the middle, and one large enough for several threads' tasks.
SHAPES = {
    "squeeze_excite": ((2, 5, 7, 40), (2, 1, 1, 40)),
    "first_broadcast": ((40,), (2, 5, 7, 40)),
    "scalar": ((), (3, 17)),
    "middle": ((4, 1, 6), (4, 5, 6)),
    "rows_of_one": ((3, 5, 1), (3, 5, 9)),
    "large": ((3, 40011), (3, 40011)),
    # rows of a few channels, regrouped into long rows with the vector tiled (engine_int8.cc
    # regroup_short_rows): either operand the vector; 13 rows have no divisor to regroup by
    "rgb_vector": ((2, 16, 16, 3), (3,)),
    "rgb_vector_first": ((5,), (3, 7, 7, 5)),
    "rgb_no_divisor": ((1, 13, 1, 3), (3,)),
}
SCALE = 0.5  # float32(1/scale) = 2 exactly: a product on the quarter grid lands on ties


def _operand(shape: tuple, dtype: str, rng: np.random.Generator) -> np.ndarray:
    """Values on a quarter grid (products hit quantize's ties), ordinary floats, and
    some that saturate, are infinite or NaN."""
    n = int(np.prod(shape))
    grid = rng.integers(-300, 300, n) / 4.0
    normal = rng.standard_normal(n) * 40
    x = np.where(rng.uniform(size=n) < 0.5, grid, normal).astype(np.float32)
    special = rng.uniform(size=n)
    x[special < 0.02] = np.nan
    x[(special >= 0.02) & (special < 0.03)] = np.inf
    x[(special >= 0.03) & (special < 0.04)] = -1e30
    return x.reshape(shape).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)


def _executable(fused: bool, fn: str, operands: list[np.ndarray], to: str,
                activation: str = "none") -> bytes:
    """in0, in1 [, in2 the addend c] -> the fused instruction (output: y), or binary then
    quantize (outputs: the binary's value, y)."""
    dtype = operands[0].dtype.name
    n = len(operands)
    y_shape = isa.broadcast_shapes(*(x.shape for x in operands))
    values = {k: (x.shape, dtype) for k, x in enumerate(operands)}
    values.update({n: (y_shape, dtype), n + 1: (y_shape, to)})
    attrs = {"fn": fn, "activation": activation}
    if fused:  # (value ids are dense: y is %n)
        values[n] = values.pop(n + 1)
        program = [Instruction("binary_quantize", tuple(range(n)), (n,),
                               {**attrs, "scale": SCALE, "to": to}, None, ("test/mul",))]
        outputs = [n]
    else:
        program = [Instruction("binary", tuple(range(n)), (n,), attrs, None, ("test/mul",)),
                   Instruction("quantize", (n,), (n + 1,), {"scale": SCALE, "to": to}, None,
                               ("test/q",))]
        outputs = [n, n + 1]
    return to_bytes(Executable(
        compiler={"name": "test"},
        inputs=[TensorSignature(f"in{k}:0", dtype, values[k][0]) for k in range(n)],
        outputs=[TensorSignature(f"out{v}:0", values[v][1], values[v][0]) for v in outputs],
        input_values=list(range(n)), output_values=outputs, constants={},
        values={v: values[v] for v in (*range(n), *outputs)}, arena_bytes=0, offsets={},
        programs=[program]))


@pytest.fixture(scope="module")
def c_device() -> binding.Device:
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the C runtime library")
    device = binding.Device(binding.load_library())
    yield device
    device.close()


def _run_everywhere(data: bytes, feeds: list[np.ndarray], device: binding.Device,
                    monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:
    """The last output (the 8-bit y) on each engine."""
    named = {f"in{k}:0": x for k, x in enumerate(feeds)}
    out = {}
    monkeypatch.setenv("NEURONISH_ENGINE", "numpy")
    with load(data, runtime="python") as model:
        out["numpy"] = list(model.run(named).values())[-1]
    monkeypatch.setenv("NEURONISH_ENGINE", "native")
    got, left = run_reporting_numpy(data, named)
    assert left == [], f"left to numpy: {left}"
    out["native"] = list(got.values())[-1]
    model = binding.Model(device, data)
    out["c_runtime"] = model.run(feeds)[-1]
    model.unload()
    return out


@pytest.mark.parametrize("shapes", SHAPES, ids=list(SHAPES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fn", isa.QUANTIZED_BINARY_FNS)
@pytest.mark.parametrize("to", ["int8", "uint8"])
def test_fused_equals_the_pair_bit_for_bit(shapes: str, dtype: str, fn: str, to: str,
                                           c_device: binding.Device,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(abs(hash((shapes, dtype, fn, to))) % 2**32)
    a, b = (_operand(s, dtype, rng) for s in SHAPES[shapes])
    pair = _run_everywhere(_executable(False, fn, [a, b], to), [a, b], c_device, monkeypatch)
    fused = _run_everywhere(_executable(True, fn, [a, b], to), [a, b], c_device, monkeypatch)
    want = pair["numpy"]
    assert want.dtype == np.dtype(to) and want.shape == isa.broadcast_shapes(a.shape, b.shape)
    for engine in ("numpy", "native", "c_runtime"):
        np.testing.assert_array_equal(pair[engine], want, err_msg=f"pair on {engine}")
        np.testing.assert_array_equal(fused[engine], want, err_msg=f"fused on {engine}")


# A BatchNorm's scale, shift and ReLU (cc/passes/fuse.py's fuse_shift, then the fusion
# with the quantize after it): (a's, b's and c's shapes) with a of y's shape, as `binary`
# takes an addend; c a channel vector, one value, a full tensor, one broadcast in the
# middle, rows long enough for several threads' tasks, and rows of a few channels.
ADDENDS = {
    "channel": ((2, 5, 7, 40), (40,), (40,)),
    "one_value": ((2, 5, 7, 40), (2, 1, 1, 40), ()),
    "full": ((3, 5, 9), (9,), (3, 5, 9)),
    "middle": ((4, 5, 6), (4, 1, 6), (5, 1)),
    "large": ((3, 40011), (40011,), (3, 40011)),
    # an RGB image's Rescaling and Normalization before an int8 stem: x * s[3] + o[3]
    "rgb_normalization": ((2, 16, 16, 3), (3,), (3,)),
    "rgb_one_scale": ((2, 30, 30, 3), (), (3,)),
    "twelve_channels_full_addend": ((4, 12, 5, 12), (12,), (4, 12, 5, 12)),
}


@pytest.mark.parametrize("shapes", ADDENDS, ids=list(ADDENDS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fn", isa.QUANTIZED_BINARY_FNS)
@pytest.mark.parametrize("activation", ["none", "relu"])
@pytest.mark.parametrize("to", ["int8", "uint8"])
def test_with_an_addend_and_relu_the_fused_equals_the_pair(
        shapes: str, dtype: str, fn: str, activation: str, to: str,
        c_device: binding.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """y = quantize(relu(fn(a, b) + c)): the addend and the ReLU in float32 before the
    bfloat16 rounding, as `binary` defines them, through NaN, infinities and ties."""
    rng = np.random.default_rng(abs(hash((shapes, dtype, fn, activation, to))) % 2**32)
    operands = [_operand(s, dtype, rng) for s in ADDENDS[shapes]]
    pair = _run_everywhere(_executable(False, fn, operands, to, activation), operands,
                           c_device, monkeypatch)
    fused = _run_everywhere(_executable(True, fn, operands, to, activation), operands,
                            c_device, monkeypatch)
    want = pair["numpy"]
    if activation == "relu":  # (so the ReLU is not an accident of uint8's saturation)
        assert want.min() >= 0
    for engine in ("numpy", "native", "c_runtime"):
        np.testing.assert_array_equal(pair[engine], want, err_msg=f"pair on {engine}")
        np.testing.assert_array_equal(fused[engine], want, err_msg=f"fused on {engine}")


def test_a_bfloat16_product_is_rounded_before_it_is_quantized() -> None:
    """The definition on numbers: with bfloat16 operands the product is rounded to
    bfloat16 first (as the pair stored it), which moves ~5% of these 8-bit results by one
    from quantizing the float32 product."""
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((64, 64)).astype(ml_dtypes.bfloat16) for _ in range(2))
    inv = np.float32(1 / 0.03)
    product = a.astype(np.float32) * b.astype(np.float32)

    def quantized(v: np.ndarray) -> np.ndarray:
        return np.clip(np.rint(v.astype(np.float32) * inv), -128, 127).astype(np.int8)

    want = quantized(product.astype(ml_dtypes.bfloat16))
    assert 0.01 < np.mean(want != quantized(product)) < 0.2
    got = evaluate("binary_quantize", [a, b], {"fn": "mul", "scale": 0.03, "to": "int8"},
                   [(a.shape, "int8")])[0]
    np.testing.assert_array_equal(got, want)


def test_isa_refuses_what_it_does_not_define() -> None:
    ok = isa.check("binary_quantize", [isa.Type((2, 3), "bfloat16"), isa.Type((3,), "bfloat16")],
                   {"fn": "mul", "scale": 0.1, "to": "uint8"})
    assert ok == [isa.Type((2, 3), "uint8")]
    with_c = isa.check("binary_quantize", [isa.Type((2, 3), "float32")] * 2 +
                       [isa.Type((2, 1), "float32")],
                       {"fn": "mul", "activation": "relu", "scale": 0.1, "to": "int8"})
    assert with_c == [isa.Type((2, 3), "int8")]
    bad = [
        ([isa.Type((2,), "float32"), isa.Type((2,), "bfloat16")], {"fn": "mul"}, "in"),
        ([isa.Type((2,), "int32"), isa.Type((2,), "int32")], {"fn": "add"}, "in"),
        ([isa.Type((2,), "float32"), isa.Type((3,), "float32")], {"fn": "add"}, "in"),
        ([isa.Type((2,), "float32")] * 2, {"fn": "div"}, "fn"),
        ([isa.Type((2,), "float32")] * 2, {"fn": "mul", "scale": 0.0}, "scale"),
        ([isa.Type((2,), "float32")] * 2, {"fn": "mul", "to": "int32"}, "to"),
        ([isa.Type((2,), "float32")] * 2, {"fn": "mul", "activation": "sigmoid"},
         "activation"),
        # the addend: a's dtype, broadcasting to y
        ([isa.Type((2, 3), "float32")] * 2 + [isa.Type((3,), "bfloat16")], {"fn": "add"},
         "in"),
        ([isa.Type((2, 3), "float32")] * 2 + [isa.Type((2,), "float32")], {"fn": "add"},
         "in"),
        ([isa.Type((2, 3), "float32")] * 2 + [isa.Type((4, 2, 3), "float32")],
         {"fn": "mul"}, "in"),
    ]
    for types, attrs, field in bad:
        with pytest.raises(isa.IsaError) as e:
            isa.check("binary_quantize", types, {"scale": 0.1, "to": "int8", **attrs})
        assert e.value.field == field, (attrs, e.value)
