"""The device instruction set: every instruction kind declared once (docs/isa.md).

A `Kind` holds everything the toolchain knows about an instruction besides its
kernels: its inputs (arity, optional trailing ones), its attribute schema (types,
allowed values, ranges, defaults), its traits, and its shape/dtype rule. The
compiler (`cc/kinds.py`, the passes), the numpy and native kernel registries, the
executable validator and the ISA table in docs/isa.md all read these records, so
they cannot drift apart (tinygrad's `Ops`/`GroupOp`, JAX's primitives with their
abstract-eval rules).

`check(kind, input_types, attrs)` is the one entry point: it checks the arity and
every attribute (unknown ones included), then runs the shape rule, which checks
what depends on the input types (axes in range, a perm that is a permutation, a
window that fits the padded input...) and returns the output types. Anything wrong
raises `IsaError` naming the field. Pure Python: no numpy, no kernels, so reading an
executable stays cheap.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import NamedTuple, Protocol


class IsaError(ValueError):
    """An instruction's inputs or attributes break its declaration; `field` names the
    attribute or input at fault ("" when it is the combination)."""

    def __init__(self, reason: str, field: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.field = field


# --- dtypes and limits ------------------------------------------------------------

# numpy dtype names, plus "bfloat16" (stored as raw uint16, 2 bytes).
ITEMSIZE: dict[str, int] = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int64": 8,
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
}
DTYPES = frozenset(ITEMSIZE)
FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
INTEGERS = frozenset({"int8", "uint8", "int16", "int32", "int64"})
INDEX_DTYPES = frozenset({"int32", "int64"})
NUMBERS = DTYPES - {"bool"}
SIGNED = FLOATS | {"int8", "int16", "int32", "int64"}

MAX_RANK = 32                 # numpy's own limit is 64; no model comes near
MAX_DIM = 2**31 - 1           # one dimension, and any integer attribute's magnitude
MAX_VALUE_BYTES = 1 << 34     # one tensor (16 GiB): a file declaring more is refused
MAX_WINDOW = 1 << 16          # a (dilated) window's extent: the kernels loop over taps


class Type(NamedTuple):
    shape: tuple[int, ...]
    dtype: str


class HasType(Protocol):
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...


def elements(shape: Sequence[int]) -> int:
    return math.prod(shape)


def nbytes(shape: Sequence[int], dtype: str) -> int:
    """Bytes of one dense value (exact Python ints: no overflow)."""
    return elements(shape) * ITEMSIZE[dtype]


def check_type(shape: object, dtype: object) -> Type:
    """A value's declared type within the limits above, or IsaError."""
    if dtype not in DTYPES:
        raise IsaError(f"dtype {dtype!r} is not a device dtype ({', '.join(sorted(DTYPES))})",
                       "dtype")
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_RANK or not all(
            _is_int(d) and 0 <= d <= MAX_DIM for d in shape):
        raise IsaError(f"shape {shape!r} is not a list of at most {MAX_RANK} dims in "
                       f"[0, {MAX_DIM}]", "shape")
    shape = tuple(int(d) for d in shape)
    if nbytes(shape, dtype) > MAX_VALUE_BYTES:
        raise IsaError(f"a {dtype}{list(shape)} tensor is larger than the "
                       f"{MAX_VALUE_BYTES >> 30} GiB one value may hold", "shape")
    return Type(shape, dtype)


# --- attribute schema -------------------------------------------------------------

def _is_int(x: object) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool)


def _is_num(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class Spec:
    """The type and range of one attribute's value."""

    kind: str  # int, num, bool, choice, dtype, ints, opt_ints, int_pairs, scalar
    lo: int | None = None
    hi: int | None = None
    length: int | None = None  # fixed list length
    choices: tuple[str, ...] = ()

    def check(self, name: str, v: object) -> None:
        # One method per kind, looked up by name: the compiler checks every emitted
        # instruction's attributes, so this runs hundreds of thousands of times.
        if not getattr(self, f"_{self.kind}_ok")(v):
            raise IsaError(f"attribute {name}={v!r} is not {self.describe()}", name)

    def _num_ok(self, v: object) -> bool:
        return _is_num(v) and (not _is_int(v) or abs(v) <= MAX_DIM)

    def _bool_ok(self, v: object) -> bool:
        return isinstance(v, bool)

    def _choice_ok(self, v: object) -> bool:
        return isinstance(v, str) and v in self.choices

    _dtype_ok = _choice_ok

    def _ints_ok(self, v: object) -> bool:
        return self._list_ok(v, self._int_ok)

    def _opt_ints_ok(self, v: object) -> bool:
        return self._list_ok(v, lambda x: x is None or self._int_ok(x))

    def _int_pairs_ok(self, v: object) -> bool:
        return self._list_ok(v, lambda p: isinstance(p, (list, tuple)) and len(p) == 2
                             and all(map(self._int_ok, p)))

    def _scalar_ok(self, v: object) -> bool:
        return isinstance(v, bool) or self._num_ok(v)

    def _int_ok(self, x: object) -> bool:
        lo = -MAX_DIM if self.lo is None else self.lo
        hi = MAX_DIM if self.hi is None else self.hi
        return _is_int(x) and lo <= x <= hi

    def _list_ok(self, v: object, item_ok: Callable[[object], bool]) -> bool:
        return isinstance(v, (list, tuple)) and len(v) <= MAX_RANK and (
            self.length is None or len(v) == self.length) and all(item_ok(x) for x in v)

    def describe(self) -> str:
        rng = ""
        if self.lo is not None and self.hi is not None:
            rng = f" in [{self.lo}, {self.hi}]"
        elif self.lo is not None:
            rng = f" >= {self.lo}"
        n = f"{self.length} " if self.length else ""
        return {
            "int": f"an int{rng}",
            "num": "a number",
            "bool": "a bool",
            "choice": "one of " + ", ".join(self.choices),
            "dtype": "a dtype name: " + ", ".join(self.choices),
            "ints": f"a list of {n}ints{rng}",
            "opt_ints": f"a list of {n}ints or nulls",
            "int_pairs": f"a list of [before, after] int pairs{rng}",
            "scalar": "a number or a bool",
        }[self.kind]


def Int(lo: int | None = None, hi: int | None = None) -> Spec:  # noqa: N802 (a constructor)
    return Spec("int", lo, hi)


def Ints(length: int | None = None, lo: int | None = None) -> Spec:  # noqa: N802
    return Spec("ints", lo, None, length)


def Choice(*values: str) -> Spec:  # noqa: N802
    return Spec("choice", choices=values)


def DType(values: frozenset[str] | Sequence[str] = DTYPES) -> Spec:  # noqa: N802
    return Spec("dtype", choices=tuple(sorted(values)))


NUM, BOOL, SCALAR = Spec("num"), Spec("bool"), Spec("scalar")

REQUIRED = object()


@dataclass(frozen=True)
class Attr:
    name: str
    spec: Spec
    default: object = REQUIRED
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


# --- the declaration -----------------------------------------------------------------

class Trait(str, enum.Enum):
    """What the passes and engines ask of a kind (named sets, as tinygrad's GroupOp)."""

    MATMUL_LIKE = "matmul_like"      # a matrix unit's work (operands 0 and 1); fused bias/act
    ELEMENTWISE = "elementwise"      # each output element from same-index inputs (broadcast)
    MOVEMENT = "movement"            # moves or copies elements, never computes with them
    REDUCTION = "reduction"          # folds elements along axes or windows
    WINDOWED = "windowed"            # an NHWC window sweep (strides, pads, ...)
    NO_FLOAT_MATH = "no_float_math"  # no floating-point arithmetic (auto-cast never rounds it)
    SAME_TYPE_IS_IDENTITY = "same_type_is_identity"  # y = x when the output type equals x's

    def __str__(self) -> str:
        return self.value


Rule = Callable[[Sequence[HasType], dict], list[Type]]


@dataclass(frozen=True)
class Kind:
    name: str
    inputs: tuple[str, ...]            # always present, in order
    optional: tuple[str, ...] = ()     # trailing inputs that may be left out (in order)
    variadic: bool = False             # `inputs` is one name repeated one or more times
    outputs: tuple[str, ...] = ("y",)
    attrs: tuple[Attr, ...] = ()
    traits: frozenset[Trait] = frozenset()
    rule: Rule | None = None
    doc: str = ""
    attr_index: dict[str, Attr] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.attr_index.update({a.name: a for a in self.attrs})

    def arity_ok(self, n: int) -> bool:
        if self.variadic:
            return n >= 1
        return len(self.inputs) <= n <= len(self.inputs) + len(self.optional)

    def with_defaults(self, attrs: Mapping) -> dict:
        """`attrs` checked against the schema (unknown, missing, ill-typed), defaults
        filled in."""
        if not isinstance(attrs, Mapping):
            raise IsaError(f"attrs {attrs!r} is not a map", "attrs")
        for key in attrs:
            if key not in self.attr_index:
                raise IsaError(f"{self.name} has no attribute {key!r} (it has: "
                               f"{', '.join(self.attr_index) or 'none'})", str(key))
        full = {}
        for a in self.attrs:
            if a.name in attrs:
                a.spec.check(a.name, attrs[a.name])
                full[a.name] = attrs[a.name]
            elif a.required:
                raise IsaError(f"{self.name} needs attribute {a.name!r} "
                               f"({a.spec.describe()})", a.name)
            else:
                full[a.name] = a.default
        return full


KINDS: dict[str, Kind] = {}


def declare(kind: Kind) -> Kind:
    if kind.name in KINDS:
        raise RuntimeError(f"instruction kind {kind.name!r} declared twice")
    KINDS[kind.name] = kind
    return kind


def check(name: str, types: Sequence[HasType], attrs: Mapping) -> list[Type]:
    """The output types of instruction `name` on inputs of `types` with `attrs`; raises
    IsaError naming the field when the declaration does not allow them."""
    kind = KINDS.get(name)
    if kind is None:
        raise IsaError(f"no device instruction {name!r}", "kind")
    if not kind.arity_ok(len(types)):
        want = ("one or more" if kind.variadic else
                f"{len(kind.inputs)}" + (f" to {len(kind.inputs) + len(kind.optional)}"
                                         if kind.optional else ""))
        raise IsaError(f"{name} takes {want} inputs ({signature(kind)}), got {len(types)}",
                       "in")
    full = kind.with_defaults(attrs)
    assert kind.rule is not None
    return kind.rule(types, full)


def kinds_with(trait: Trait | str) -> frozenset[str]:
    trait = Trait(trait)  # a misspelt trait is a ValueError, not an empty set
    return frozenset(k.name for k in KINDS.values() if trait in k.traits)


def signature(kind: Kind) -> str:
    if kind.variadic:
        ins = f"{kind.inputs[0]}1..{kind.inputs[0]}n"
    else:
        ins = ", ".join(kind.inputs) + "".join(f" [, {o}]" for o in kind.optional)
    return f"{ins} → {', '.join(kind.outputs)}"


# --- helpers of the shape rules ---------------------------------------------------------

def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy/TF broadcasting of static shapes."""
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        dims = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise IsaError(f"shapes {' and '.join(str(list(s)) for s in shapes)} do not "
                           "broadcast", "in")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _fmt(t: HasType) -> str:
    return f"{t.dtype}{list(t.shape)}"


def _same(a: HasType, b: HasType) -> bool:
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype


def _rank(t: HasType, want: int, what: str) -> None:
    if len(t.shape) != want:
        raise IsaError(f"{what} must have rank {want}, got {_fmt(t)}", "in")


def _axis(axis: int, rank: int, name: str) -> int:
    if not 0 <= axis < rank:
        raise IsaError(f"{name} {axis} is out of range for rank {rank} (valid: [0, {rank}))",
                       name)
    return axis


def _per_dim(values: Sequence, rank: int, name: str) -> None:
    if len(values) != rank:
        raise IsaError(f"{name} has {len(values)} entries for a rank-{rank} input; it needs "
                       "one per dim", name)


def window_out(size: int, k: int, stride: int, dilation: int, before: int, after: int,
               name: str) -> int:
    """Output extent of a window sweep; the (dilated) window must fit the padded input."""
    effective = (k - 1) * dilation + 1
    if effective > MAX_WINDOW:
        raise IsaError(f"window extent {effective} (dilated) is above the device's limit "
                       f"{MAX_WINDOW}", name)
    if effective > size + before + after:
        raise IsaError(f"window {effective} (dilated) is larger than the padded input "
                       f"{size} + {before} + {after}", name)
    return (size + before + after - effective) // stride + 1


# --- the declarations ---------------------------------------------------------------------

# unary functions; ACTIVATIONS are the ones the compiler fuses into a producer's epilogue.
UNARY_FNS = ("relu", "relu6", "leaky_relu", "elu", "selu", "sigmoid", "tanh", "softplus",
             "gelu", "gelu_tanh", "erf", "erfc", "exp", "log", "sqrt", "rsqrt", "square", "abs",
             "neg", "reciprocal", "floor", "sign", "logical_not", "round_bf16", "round_fp16",
             "sin", "cos", "tan", "atan", "log1p", "expm1", "round", "swish", "hard_sigmoid",
             "hard_swish")
# (Not softplus, though an epilogue may hold one: the native engine's epilogues are oneDNN
# post-ops, whose soft_relu loses TF's relative accuracy for large |x|, so a fused
# softplus left its whole conv or matmul to the numpy engine. Alone it runs natively.)
ACTIVATIONS = frozenset({"relu", "relu6", "leaky_relu", "elu", "selu", "sigmoid", "tanh",
                         "gelu", "gelu_tanh", "swish", "hard_sigmoid", "hard_swish"})
COMPARISONS = ("greater", "greater_equal", "less", "less_equal", "equal", "not_equal")
# The dtypes each unary function takes (TF's own: its float-only ops take floats only).
UNARY_DOMAIN: dict[str, frozenset[str]] = {
    **{fn: FLOATS for fn in UNARY_FNS},
    "relu": NUMBERS, "relu6": NUMBERS, "square": NUMBERS,
    "abs": SIGNED, "neg": SIGNED, "sign": SIGNED, "logical_not": frozenset({"bool"})}
BINARY_FNS = ("add", "sub", "mul", "div", "maximum", "minimum", "squared_difference", "pow",
              *COMPARISONS, "logical_and", "logical_or", "floor_div", "floor_mod")
# The binary functions that may carry an `activation` (one pass: oneDNN's binary with an
# eltwise post-op), with the operands whose shape must be the output's.
EPILOGUE_BINARY_FNS = ("add", "sub", "mul", "div", "maximum", "minimum")
BINARY_DOMAIN: dict[str, frozenset[str]] = {
    **{fn: NUMBERS for fn in BINARY_FNS},
    "equal": DTYPES, "not_equal": DTYPES,
    "logical_and": frozenset({"bool"}), "logical_or": frozenset({"bool"})}
# a (fn) b == b (fn') a: the operand order an engine may swap (to put the full-shaped
# operand first).
SWAPPED = {"add": "add", "mul": "mul", "maximum": "maximum", "minimum": "minimum",
           "equal": "equal", "not_equal": "not_equal", "greater": "less", "less": "greater",
           "greater_equal": "less_equal", "less_equal": "greater_equal"}

_ALPHA = Attr("alpha", NUM, 0.2, "leaky_relu's slope")
_ACTIVATION = (Attr("activation", Choice("none", *UNARY_FNS), "none",
                    "fused epilogue: none or any `unary` fn"),
               Attr("alpha", NUM, 0.2, "its leaky_relu slope"),
               Attr("compute", Choice("float32", "bfloat16", "float16"), "float32",
                    "the precision both operands are read in (`--auto-cast`); float32 "
                    "accumulation"))
_LAYOUT = Attr("layout", Choice("nhwc", "nChw16c"), "nhwc",
               "where an engine may keep y between windowed instructions (a physical hint: "
               "every reader still sees NHWC values)")
_WINDOW = (Attr("strides", Ints(2, lo=1), doc="[sh, sw]"),
           Attr("dilations", Ints(2, lo=1), doc="[dh, dw]"),
           Attr("pads", Ints(4, lo=0), doc="[top, bottom, left, right]"), _LAYOUT)

# Traits: see `Trait` above.


def _one(t: Sequence[HasType], a: dict) -> list[Type]:
    return [Type(tuple(t[0].shape), t[0].dtype)]


def _in_domain(fn: str, dtype: str, domain: frozenset[str]) -> None:
    if dtype not in domain:
        raise IsaError(f"{fn} takes {', '.join(sorted(domain))}, got {dtype}", "in")


def _unary(t: Sequence[HasType], a: dict) -> list[Type]:
    _in_domain(a["fn"], t[0].dtype, UNARY_DOMAIN[a["fn"]])
    return _one(t, a)


def one_pass_binary(fn: str, a: Sequence[int], b: Sequence[int], y: Sequence[int]) -> bool:
    """Whether binary `fn` of operands shaped `a` and `b` into `y` is one pass over an operand
    of y's shape, the other broadcasting along (oneDNN's binary primitive): such a binary
    may carry an `activation`, and read and write bfloat16."""
    y = tuple(y)
    return fn in EPILOGUE_BINARY_FNS and (tuple(a) == y or (tuple(b) == y and fn in SWAPPED))


def _needs_one_pass(what: str, field: str, fn: str, t: Sequence[HasType],
                    shape: tuple[int, ...], dtype: str) -> None:
    """A binary's activation or addend is one oneDNN binary primitive's post-op: the
    conditions under which one pass computes it (`one_pass_binary`)."""
    if dtype not in ("float32", "bfloat16"):
        raise IsaError(f"{what} needs a float32 or bfloat16 output, got {dtype}", field)
    if fn not in EPILOGUE_BINARY_FNS:
        raise IsaError(f"{what} needs fn one of {', '.join(EPILOGUE_BINARY_FNS)}, got {fn}",
                       field)
    if not one_pass_binary(fn, t[0].shape, t[1].shape, shape) or len(shape) > 6:
        raise IsaError(f"{what} needs y of rank <= 6 and a (or b, for add, mul, maximum, "
                       f"minimum) of y's shape {list(shape)}, got {list(t[0].shape)} and "
                       f"{list(t[1].shape)}", field)


def _binary(t: Sequence[HasType], a: dict) -> list[Type]:
    if t[0].dtype != t[1].dtype:
        raise IsaError(f"operands have dtypes {t[0].dtype} and {t[1].dtype}; they must match",
                       "in")
    fn = a["fn"]
    _in_domain(fn, t[0].dtype, BINARY_DOMAIN[fn])
    shape = broadcast_shapes(t[0].shape, t[1].shape)
    dtype = "bool" if fn in COMPARISONS else t[0].dtype
    act = a.get("activation", "none")
    if act != "none":
        _needs_one_pass(f"activation {act}", "activation", fn, t, shape, dtype)
    if len(t) == 3:
        _needs_one_pass("an addend c", "in", fn, t, shape, dtype)
        _addend_fits(t, shape)
    return [Type(shape, dtype)]


def _addend_fits(t: Sequence[HasType], shape: tuple[int, ...]) -> None:
    """The addend c (t[2]) of `binary` or `binary_quantize`: a's dtype, broadcasting to y."""
    try:
        fits = t[2].dtype == t[0].dtype and broadcast_shapes(shape, t[2].shape) == shape
    except IsaError:
        fits = False
    if not fits:
        raise IsaError(f"c must be {t[0].dtype} and broadcast to y {list(shape)}, got "
                       f"{_fmt(t[2])}", "in")


def _select(t: Sequence[HasType], a: dict) -> list[Type]:
    if t[0].dtype != "bool" or t[1].dtype != t[2].dtype:
        raise IsaError(f"select wants a bool condition and equal branch dtypes, got "
                       f"{t[0].dtype}, {t[1].dtype}, {t[2].dtype}", "in")
    return [Type(broadcast_shapes(t[0].shape, t[1].shape, t[2].shape), t[1].dtype)]


def _cast(t: Sequence[HasType], a: dict) -> list[Type]:
    return [Type(tuple(t[0].shape), a["to"])]


def _permuted(t: HasType, perm: Sequence[int], name: str) -> Type:
    """`t` read through numpy `transpose(perm)` (an empty perm: as it is)."""
    if not perm:
        return Type(tuple(t.shape), t.dtype)
    if sorted(perm) != list(range(len(t.shape))):
        raise IsaError(f"{name} {list(perm)} is not a permutation of the {len(t.shape)} dims "
                       f"of {_fmt(t)}", name)
    return Type(tuple(t.shape[p] for p in perm), t.dtype)


def _matmul(t: Sequence[HasType], a: dict) -> list[Type]:
    out = _matmul_logical([_permuted(t[0], a.get("perm_a", ()), "perm_a"),
                           _permuted(t[1], a.get("perm_b", ()), "perm_b"), *t[2:]], a)[0]
    if a.get("perm_y"):
        if a.get("residual"):
            raise IsaError("perm_y and residual do not go together", "perm_y")
        out = _permuted(out, a["perm_y"], "perm_y")
    return [out]


def _matmul_logical(t: Sequence[HasType], a: dict) -> list[Type]:
    x, w = t[0], t[1]
    _in_domain("matmul", x.dtype, NUMBERS)
    if len(x.shape) < 2 or len(w.shape) < 2:
        raise IsaError(f"matmul operands must have rank >= 2, got {_fmt(x)} and {_fmt(w)}",
                       "in")
    m, k = x.shape[-2:][::-1] if a["transpose_a"] else x.shape[-2:]
    k2, n = w.shape[-2:][::-1] if a["transpose_b"] else w.shape[-2:]
    if k != k2:
        raise IsaError(f"matmul inner dimensions differ: {_fmt(x)} and {_fmt(w)}", "in")
    batch = broadcast_shapes(x.shape[:-2], w.shape[:-2])
    out = Type(tuple(batch) + (m, n), x.dtype)
    rest = list(t[2:])
    if a.get("residual") and rest and x.dtype == "bfloat16" and rest[-1].dtype == "float32":
        # A bfloat16 product adding a float32 residual writes float32: the residual
        # stream it continues keeps its precision (cc/passes/dtypes.py).
        out = Type(out.shape, "float32")
    _check_bias_residual("matmul", "a, b", t, a, out, n, "columns")
    return [out]


def _check_bias_residual(kind: str, operands: str, t: Sequence[HasType], a: dict, out: Type,
                         width: int, unit: str) -> None:
    """The optional bias ([width]) and residual (the output's type) that follow a matmul's
    or a convolution's two operands."""
    rest = list(t[2:])
    if a.get("residual"):
        if not rest or not _same(rest[-1], out):
            got = _fmt(rest[-1]) if rest else "nothing"
            raise IsaError(f"residual must have the output's type {_fmt(out)}, got {got}",
                           "residual")
        rest = rest[:-1]
    if len(rest) > 1:
        raise IsaError(f"{kind} takes {operands} [, bias] [, residual]; got {len(t)} inputs "
                       f"with residual={bool(a.get('residual'))}", "in")
    if rest and tuple(rest[0].shape) != (width,):
        raise IsaError(f"bias {_fmt(rest[0])} does not match the {width} output {unit}", "in")


def _conv_like(t: Sequence[HasType], a: dict, depthwise: bool) -> list[Type]:
    x, w = t[0], t[1]
    _in_domain("conv", x.dtype, NUMBERS)
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise IsaError(f"conv wants NHWC input and a 4-D filter, got {_fmt(x)} and {_fmt(w)}",
                       "in")
    n, h, wd, c = x.shape
    kh, kw, ci, co = w.shape
    groups = a.get("groups", 1)
    if depthwise and ci != c:
        raise IsaError(f"depthwise filter {_fmt(w)} expects {ci} input channels, the input "
                       f"{_fmt(x)} has {c}", "in")
    if ci * groups != c or co % groups:
        raise IsaError(f"filter {_fmt(w)} in {groups} group(s) expects {ci * groups} input "
                       f"channels and a multiple of {groups} output channels; the input "
                       f"{_fmt(x)} has {c}", "groups")
    if min(kh, kw) < 1:
        raise IsaError(f"filter {_fmt(w)} has an empty window", "in")
    out_c = c * co if depthwise else co
    (sh, sw), (dh, dw), (pt, pb, pl, pr) = a["strides"], a["dilations"], a["pads"]
    oh = window_out(h, kh, sh, dh, pt, pb, "dilations")
    ow = window_out(wd, kw, sw, dw, pl, pr, "dilations")
    out = Type((n, oh, ow, out_c), x.dtype)
    _check_bias_residual("conv", "x, w", t, a, out, out_c, "channels")
    return [out]


def _pool(t: Sequence[HasType], a: dict) -> list[Type]:
    _rank(t[0], 4, "pool's input (NHWC)")
    _in_domain("pool", t[0].dtype, NUMBERS)
    n, h, w, c = t[0].shape
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = a["ksize"], a["strides"], a["pads"]
    # A pad as large as the window would make windows of padding alone (TF never does).
    if max(pt, pb) >= kh or max(pl, pr) >= kw:
        raise IsaError(f"pads {a['pads']} must each be smaller than the window {a['ksize']}",
                       "pads")
    oh = window_out(h, kh, sh, 1, pt, pb, "ksize")
    ow = window_out(w, kw, sw, 1, pl, pr, "ksize")
    return [Type((n, oh, ow, c), t[0].dtype)]


def _reduce(t: Sequence[HasType], a: dict) -> list[Type]:
    _in_domain(a["fn"], t[0].dtype,
               frozenset({"bool"}) if a["fn"] in ("any", "all") else NUMBERS)
    rank = len(t[0].shape)
    axes = list(a["axes"])
    for ax in axes:
        _axis(ax, rank, "axes")
    if len(set(axes)) != len(axes):
        raise IsaError(f"axes {axes} repeat an axis", "axes")
    shape = tuple((1 if i in axes else d) for i, d in enumerate(t[0].shape)
                  if a["keepdims"] or i not in axes)
    return [Type(shape, t[0].dtype)]


def _softmax(t: Sequence[HasType], a: dict) -> list[Type]:
    _in_domain("softmax", t[0].dtype, FLOATS)
    _axis(a["axis"], len(t[0].shape), "axis")
    return _one(t, a)


def _masked_softmax(t: Sequence[HasType], a: dict) -> list[Type]:
    x, mask = t
    if x.dtype not in ("float32", "bfloat16") or not x.shape:
        raise IsaError(f"x must be a float32 or bfloat16 tensor of rank >= 1, got {_fmt(x)}",
                       "in")
    if mask.dtype != "bool":
        raise IsaError(f"mask must be bool, got {_fmt(mask)}", "in")
    if len(mask.shape) > len(x.shape) or broadcast_shapes(x.shape, mask.shape) != x.shape:
        raise IsaError(f"mask {_fmt(mask)} must broadcast to x {_fmt(x)} without growing it",
                       "in")
    return _one(t, a)


def _layer_norm(t: Sequence[HasType], a: dict) -> list[Type]:
    x, scale, shift = t
    if x.dtype not in ("float32", "float16", "float64") or not x.shape:
        raise IsaError(f"x must be a float tensor of rank >= 1, got {_fmt(x)}", "in")
    if a["epsilon"] < 0:
        raise IsaError(f"epsilon must be >= 0, got {a['epsilon']}", "epsilon")
    for name, v in (("scale", scale), ("shift", shift)):
        if tuple(v.shape) != (x.shape[-1],) or v.dtype != x.dtype:
            raise IsaError(f"{name} must be {x.dtype}[{x.shape[-1]}] (x's last axis), got "
                           f"{_fmt(v)}", "in")
    return _one(t, a)


def _argminmax(t: Sequence[HasType], a: dict) -> list[Type]:
    _axis(a["axis"], len(t[0].shape), "axis")
    shape = tuple(d for i, d in enumerate(t[0].shape) if i != a["axis"])
    return [Type(shape, a["to"])]


def _reshape(t: Sequence[HasType], a: dict) -> list[Type]:
    shape = tuple(a["shape"])
    if elements(shape) != elements(t[0].shape):
        raise IsaError(f"cannot reshape {_fmt(t[0])} ({elements(t[0].shape)} elements) to "
                       f"{list(shape)}", "shape")
    return [Type(shape, t[0].dtype)]


def _transpose(t: Sequence[HasType], a: dict) -> list[Type]:
    perm = list(a["perm"])
    if sorted(perm) != list(range(len(t[0].shape))):
        raise IsaError(f"perm {perm} is not a permutation of the {len(t[0].shape)} dims of "
                       f"{_fmt(t[0])}", "perm")
    return [Type(tuple(t[0].shape[p] for p in perm), t[0].dtype)]


def _concat(t: Sequence[HasType], a: dict) -> list[Type]:
    first = t[0]
    axis = _axis(a["axis"], len(first.shape), "axis")
    for other in t[1:]:
        if other.dtype != first.dtype or len(other.shape) != len(first.shape) or any(
                x != y for i, (x, y) in enumerate(zip(first.shape, other.shape)) if i != axis):
            raise IsaError(f"cannot concatenate {_fmt(first)} and {_fmt(other)} on axis "
                           f"{axis}", "in")
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in t)
    return [Type(tuple(shape), first.dtype)]


def _strided_slice(t: Sequence[HasType], a: dict) -> list[Type]:
    rank = len(t[0].shape)
    for name in ("begin", "end", "strides"):
        _per_dim(a[name], rank, name)
    if any(b is None for b in a["begin"]):
        raise IsaError(f"begin {a['begin']} must be ints", "begin")
    if 0 in a["strides"]:
        raise IsaError(f"strides {a['strides']} must not be 0", "strides")
    shape = tuple(len(range(*slice(b, e, s).indices(d)))
                  for d, b, e, s in zip(t[0].shape, a["begin"], a["end"], a["strides"]))
    return [Type(shape, t[0].dtype)]


def _pad(t: Sequence[HasType], a: dict) -> list[Type]:
    x = t[0]
    _per_dim(a["paddings"], len(x.shape), "paddings")
    if a["mode"] != "constant":
        # TF MirrorPad: REFLECT pads less than the dim, SYMMETRIC at most the dim.
        room = 1 if a["mode"] == "reflect" else 0
        for d, (b, e) in zip(x.shape, a["paddings"]):
            if max(b, e) > d - room:
                raise IsaError(f"{a['mode']} paddings {a['paddings']} are too large for "
                               f"{_fmt(x)}", "paddings")
    shape = tuple(d + b + e for d, (b, e) in zip(x.shape, a["paddings"]))
    return [Type(shape, x.dtype)]


def _tile(t: Sequence[HasType], a: dict) -> list[Type]:
    _per_dim(a["multiples"], len(t[0].shape), "multiples")
    return [Type(tuple(d * m for d, m in zip(t[0].shape, a["multiples"])), t[0].dtype)]


def _broadcast_to(t: Sequence[HasType], a: dict) -> list[Type]:
    shape = tuple(a["shape"])
    try:
        fits = len(shape) >= len(t[0].shape) and broadcast_shapes(t[0].shape, shape) == shape
    except IsaError:
        fits = False
    if not fits:
        raise IsaError(f"{_fmt(t[0])} does not broadcast to {list(shape)}", "shape")
    return [Type(shape, t[0].dtype)]


def _gather(t: Sequence[HasType], a: dict) -> list[Type]:
    params, indices = t
    axis = _axis(a["axis"], len(params.shape), "axis")
    bd = a["batch_dims"]
    if indices.dtype not in INDEX_DTYPES:
        raise IsaError(f"gather indices must be int32 or int64, got {indices.dtype}", "in")
    if not bd <= min(axis, len(indices.shape)):
        raise IsaError(f"batch_dims {bd} must be at most min(axis {axis}, rank of indices "
                       f"{len(indices.shape)})", "batch_dims")
    if tuple(params.shape[:bd]) != tuple(indices.shape[:bd]):
        raise IsaError(f"the {bd} batch dims of params {_fmt(params)} and indices "
                       f"{_fmt(indices)} differ", "batch_dims")
    shape = tuple(params.shape[:axis]) + tuple(indices.shape[bd:]) + tuple(
        params.shape[axis + 1:])
    return [Type(shape, params.dtype)]


def _conv3d(t: Sequence[HasType], a: dict) -> list[Type]:
    _rank(t[0], 5, "conv3d's input (NDHWC)")
    _rank(t[1], 5, "conv3d's filter [KD, KH, KW, C, O]")
    _in_domain("conv3d", t[0].dtype, NUMBERS)
    if t[0].dtype != t[1].dtype:
        raise IsaError(f"input {_fmt(t[0])} and filter {_fmt(t[1])} dtypes differ", "in")
    n, *spatial, c = t[0].shape
    *kernel, fc, o = t[1].shape
    if fc != c:
        raise IsaError(f"filter {_fmt(t[1])} reads {fc} channels, the input has {c}", "in")
    out = [window_out(size, k, s, d, a["pads"][2 * i], a["pads"][2 * i + 1], "filter")
           for i, (size, k, s, d) in enumerate(zip(spatial, kernel, a["strides"],
                                                   a["dilations"]))]
    return [Type((n, *out, o), t[0].dtype)]


def _pool3d(t: Sequence[HasType], a: dict) -> list[Type]:
    _rank(t[0], 5, "pool3d's input (NDHWC)")
    _in_domain("pool3d", t[0].dtype, NUMBERS)
    n, *spatial, c = t[0].shape
    pads = a["pads"]
    if any(max(pads[2 * i], pads[2 * i + 1]) >= k for i, k in enumerate(a["ksize"])):
        raise IsaError(f"pads {pads} must each be smaller than the window {a['ksize']}", "pads")
    out = [window_out(size, k, s, 1, pads[2 * i], pads[2 * i + 1], "ksize")
           for i, (size, k, s) in enumerate(zip(spatial, a["ksize"], a["strides"]))]
    return [Type((n, *out, c), t[0].dtype)]


def _cumulative(t: Sequence[HasType], a: dict) -> list[Type]:
    _axis(a["axis"], len(t[0].shape), "axis")
    if t[0].dtype == "bool":
        raise IsaError("cumulative takes numbers, got bool", "in")
    return [Type(tuple(t[0].shape), t[0].dtype)]


def _top_k(t: Sequence[HasType], a: dict) -> list[Type]:
    shape = tuple(t[0].shape)
    if not shape or a["k"] > shape[-1]:
        raise IsaError(f"k {a['k']} must be at most the last dim of {_fmt(t[0])}", "k")
    if t[0].dtype == "bool":
        raise IsaError("top_k takes numbers, got bool", "in")
    return [Type(shape[:-1] + (a["k"],), a["to"] if a["indices"] else t[0].dtype)]


def _one_hot(t: Sequence[HasType], a: dict) -> list[Type]:
    if t[0].dtype not in INTEGERS:
        raise IsaError(f"one_hot indices must be integers, got {t[0].dtype}", "in")
    shape = list(t[0].shape)
    axis = a["axis"] if a["axis"] >= 0 else len(shape)
    if axis > len(shape):
        raise IsaError(f"axis {a['axis']} must be -1 or in [0, {len(shape)}]", "axis")
    shape.insert(axis, a["depth"])
    return [Type(tuple(shape), a["to"])]


def _resize(t: Sequence[HasType], a: dict) -> list[Type]:
    _rank(t[0], 4, "resize's input (NHWC)")
    _in_domain("resize", t[0].dtype, NUMBERS)
    n, h, w, c = t[0].shape
    if min(h, w) < 1:
        raise IsaError(f"cannot resize the empty image {_fmt(t[0])}", "in")
    dtype = "float32" if a["mode"] == "bilinear" else t[0].dtype
    return [Type((n, a["size"][0], a["size"][1], c), dtype)]


def _t(*names: str) -> frozenset[Trait]:
    return frozenset(Trait(n) for n in names)  # a misspelt trait fails at import


declare(Kind("unary", ("x",), attrs=(Attr("fn", Choice(*UNARY_FNS)), _ALPHA),
             traits=_t("elementwise"), rule=_unary, doc=(
                 "y = fn(x), same dtype. `gelu` is TF's exact GELU, x·erfc(−x/√2)/2; "
                 "`gelu_tanh` its approximate one, x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³))). "
                 "`swish` is x·sigmoid(x) (Keras' swish / silu). `hard_sigmoid` is "
                 "relu6(x + 3)/6 and `hard_swish` x·hard_sigmoid(x) (Keras' and MobileNetV3's; "
                 "TF's order of operations). "
                 "`round_bf16`/`round_fp16` round to that precision "
                 "and back (round-to-nearest-even; used by `--auto-cast`). `round` rounds "
                 "half to even (TF's Round). Dtypes (`UNARY_DOMAIN`): relu, relu6, square any "
                 "number; abs, neg, sign signed numbers; logical_not bool; the rest floats.")))
declare(Kind("binary", ("a", "b"), ("c",), attrs=(
    Attr("fn", Choice(*BINARY_FNS)),
    Attr("activation", Choice("none", *sorted(ACTIVATIONS)), "none",
         "fused epilogue: none or an activation (`ACTIVATIONS`)"), _ACTIVATION[1]),
             traits=_t("elementwise"), rule=_binary, doc=(
                 "y = act(fn(a, b) [+ c]): numpy broadcasting; a and b share a dtype. "
                 "Comparisons give bool, the rest the input dtype. The optional c (a's dtype, "
                 "broadcasting to y) is added to fn's result and `activation` applied to that, "
                 "in float32, before a bfloat16 y is rounded: one pass for a BatchNorm's scale, "
                 "shift and ReLU after a concat or a pool (DenseNet, ResNetV2). Either needs "
                 "float32 or bfloat16, fn one of `EPILOGUE_BINARY_FNS`, y of rank ≤ 6 and a "
                 "(or b, for add, mul, maximum, minimum) of y's shape. "
                 "`floor_div`/`floor_mod` round the quotient toward −∞ "
                 "(TF FloorDiv/FloorMod: the remainder takes the divisor's sign). Integers wrap "
                 "in their width; integer `div` truncates toward zero; an integer division or "
                 "remainder by zero gives 0 (numpy's answer: TF's CPU kernels raise), and "
                 "INT_MIN / −1 wraps to INT_MIN. Dtypes (`BINARY_DOMAIN`): logical_and/or "
                 "bool; equal, not_equal any; the rest numbers.")))
declare(Kind("select", ("cond", "a", "b"), traits=_t("elementwise", "no_float_math"),
             rule=_select, doc="numpy `where` with broadcasting (TF SelectV2)."))
declare(Kind("cast", ("x",), attrs=(Attr("to", DType(), doc="the output dtype"),),
             traits=_t("elementwise", "no_float_math", "same_type_is_identity"), rule=_cast,
             doc="C-style conversion as TF's Cast: float→int truncates toward zero; "
                 "anything→bool is `x != 0`."))
declare(Kind("matmul", ("a", "b"), ("bias", "residual"), attrs=(
    Attr("transpose_a", BOOL, False), Attr("transpose_b", BOOL, False), *_ACTIVATION,
    Attr("residual", BOOL, False, "the last input is added after the bias"),
    Attr("perm_a", Ints(lo=0), [], "a is read as transpose(a, perm_a); []: as it is"),
    Attr("perm_b", Ints(lo=0), [], "b is read as transpose(b, perm_b); []: as it is"),
    Attr("perm_y", Ints(lo=0), [], "y is stored as transpose(result, perm_y); not with "
                                   "residual")),
    traits=_t("matmul_like"), rule=_matmul, doc=(
        "y = act(op(a) @ op(b) + bias + residual); rank ≥ 2, leading (batch) dims broadcast "
        "as numpy `matmul`; op transposes the last two axes (after perm_a/perm_b, which "
        "read an operand through numpy `transpose`: attention's head split as strides, no "
        "copy). `bias` is rank 1, y's last dim before perm_y; with `residual`, the last "
        "input (y's type) is added after the bias, before the activation; a bfloat16 `a` "
        "with a float32 residual gives a float32 y.")))
declare(Kind("conv2d", ("x", "w"), ("bias", "residual"), attrs=(
    *_WINDOW, *_ACTIVATION,
    Attr("residual", BOOL, False, "the last input is added after the bias"),
    Attr("groups", Int(lo=1), 1, "divides C and O")),
    traits=_t("matmul_like", "windowed"),
    rule=lambda t, a: _conv_like(t, a, depthwise=False), doc=(
        "NHWC x [N,H,W,C], w [KH,KW,C/groups,O] (TF layout), y [N,OH,OW,O]; output channels "
        "[k·O/groups, (k+1)·O/groups) read input channels [k·C/groups, (k+1)·C/groups); "
        "OH = (H+top+bottom − ((KH−1)·dh+1)) // sh + 1. Zero padding. With `residual`, the "
        "last input (y's type) is added after the bias, before the activation.")))
declare(Kind("depthwise_conv2d", ("x", "w"), ("bias",), attrs=(*_WINDOW, *_ACTIVATION),
             traits=_t("matmul_like", "windowed"),
             rule=lambda t, a: _conv_like(t, a, depthwise=True), doc=(
                 "w [KH,KW,C,M], y [N,OH,OW,C·M]; output channel c·M+m uses input channel c "
                 "and w[..., c, m]. Windows as conv2d.")))
declare(Kind("pool", ("x",), attrs=(
    Attr("mode", Choice("max", "avg")), Attr("ksize", Ints(2, lo=1), doc="[kh, kw]"),
    Attr("strides", Ints(2, lo=1), doc="[sh, sw]"),
    Attr("pads", Ints(4, lo=0), doc="[t, b, l, r], each smaller than the window"), _LAYOUT),
    traits=_t("reduction", "windowed"), rule=_pool, doc=(
        "NHWC. max ignores padding; avg divides by the count of non-padded elements in "
        "each window (TF semantics).")))
declare(Kind("reduce", ("x",), attrs=(
    Attr("fn", Choice("sum", "mean", "max", "min", "prod", "any", "all")),
    Attr("axes", Ints(lo=0), doc="distinct, each < rank"), Attr("keepdims", BOOL, False)),
    traits=_t("reduction"), rule=_reduce,
    doc="numpy reduction over `axes` (empty axes = copy)."))
declare(Kind("softmax", ("x",), attrs=(Attr("axis", Int(lo=0)), Attr("log", BOOL, False)),
             traits=_t("reduction"), rule=_softmax, doc=(
                 "softmax (or log-softmax) along `axis`, numerically stable (subtract max).")))
declare(Kind("masked_softmax", ("x", "mask"), attrs=(
    Attr("fill", NUM, doc="what a masked-out x counts as in the softmax"),
    Attr("masked", NUM, doc="what a masked-out output is")),
    traits=_t("reduction"), rule=_masked_softmax, doc=(
        "attention's masked softmax over the last axis, one pass for three TF ops: "
        "y = where(mask, softmax(where(mask, x, fill)), masked), mask broadcasting to x. "
        "Computed in float32 (a bfloat16 x is widened, y rounded once).")))
declare(Kind("layer_norm", ("x", "scale", "shift"), attrs=(
    Attr("epsilon", NUM, doc=">= 0, added to the variance"),),
    traits=_t("reduction"), rule=_layer_norm, doc=(
        "over the last axis: y = (x − mean) / √(var + epsilon) · scale + shift, var the "
        "mean of (x − mean)²; scale and shift [C]. What Keras' LayerNormalization and "
        "tf.nn.moments + batch_normalization over the last axis compute.")))
declare(Kind("argminmax", ("x",), attrs=(
    Attr("fn", Choice("argmax", "argmin")), Attr("axis", Int(lo=0)),
    Attr("to", DType(INDEX_DTYPES))),
    traits=_t("reduction"), rule=_argminmax,
    doc="index of the first extreme value along `axis`, axis removed."))
declare(Kind("reshape", ("x",), attrs=(Attr("shape", Ints(lo=0)),),
             traits=_t("movement", "no_float_math", "same_type_is_identity"), rule=_reshape,
             doc="row-major reshape."))
declare(Kind("transpose", ("x",), attrs=(Attr("perm", Ints(lo=0), doc="a permutation"),),
             traits=_t("movement", "no_float_math"), rule=_transpose,
             doc="numpy transpose."))
declare(Kind("concat", ("x",), variadic=True, attrs=(Attr("axis", Int(lo=0)),),
             traits=_t("movement", "no_float_math"), rule=_concat,
             doc="numpy concatenate."))
declare(Kind("strided_slice", ("x",), attrs=(
    Attr("begin", Ints()), Attr("end", Spec("opt_ints"), doc="null: to the edge"),
    Attr("strides", Ints(), doc="non-zero")),
    traits=_t("movement", "no_float_math"), rule=_strided_slice, doc=(
        "y = x[tuple(slice(b, e, s))], one entry per dim; no axis is added or removed "
        "(the lowering reshapes).")))
declare(Kind("pad", ("x",), attrs=(
    Attr("paddings", Spec("int_pairs", lo=0), doc="[[before, after], ...]"),
    Attr("mode", Choice("constant", "reflect", "symmetric"), "constant"),
    Attr("value", SCALAR, 0, "constant mode's fill")),
    traits=_t("movement", "no_float_math"), rule=_pad, doc=(
        "numpy `pad`; reflect pads less than the dim, symmetric at most the dim.")))
declare(Kind("tile", ("x",), attrs=(Attr("multiples", Ints(lo=0)),),
             traits=_t("movement", "no_float_math"), rule=_tile,
             doc="numpy `tile` with one multiple per dim."))
declare(Kind("broadcast_to", ("x",), attrs=(Attr("shape", Ints(lo=0)),),
             traits=_t("movement", "no_float_math", "same_type_is_identity"),
             rule=_broadcast_to, doc="numpy `broadcast_to`, materialized."))
declare(Kind("gather", ("params", "indices"), attrs=(
    Attr("axis", Int(lo=0)), Attr("batch_dims", Int(lo=0), 0)),
    traits=_t("movement", "no_float_math"), rule=_gather, doc=(
        "TF GatherV2. An index outside [0, dim) is a run-time error naming the "
        "instruction's TF node.")))
declare(Kind("one_hot", ("indices",), attrs=(
    Attr("depth", Int(lo=0)), Attr("on_value", SCALAR), Attr("off_value", SCALAR),
    Attr("axis", Int(lo=-1), doc="-1: last"), Attr("to", DType())),
    traits=frozenset(), rule=_one_hot,
    doc="TF OneHot; indices outside [0, depth) give an all-off row."))
declare(Kind("conv3d", ("x", "w"), attrs=(
    Attr("strides", Ints(3, lo=1), doc="[sd, sh, sw]"),
    Attr("dilations", Ints(3, lo=1), doc="[dd, dh, dw]"),
    Attr("pads", Ints(6, lo=0), doc="[front, back, top, bottom, left, right]")),
    traits=frozenset(), rule=_conv3d, doc=(
        "NDHWC x [N,D,H,W,C], w [KD,KH,KW,C,O] (TF layout), y [N,OD,OH,OW,O]; windows per "
        "spatial dim as conv2d's. Zero padding.")))
declare(Kind("pool3d", ("x",), attrs=(
    Attr("mode", Choice("max", "avg")), Attr("ksize", Ints(3, lo=1), doc="[kd, kh, kw]"),
    Attr("strides", Ints(3, lo=1), doc="[sd, sh, sw]"),
    Attr("pads", Ints(6, lo=0), doc="[front, back, top, bottom, left, right], each smaller "
                                    "than the window")),
    traits=frozenset(), rule=_pool3d, doc=(
        "NDHWC pooling as `pool`: max ignores padding; avg divides by the count of "
        "non-padded elements in each window.")))
declare(Kind("cumulative", ("x",), attrs=(
    Attr("fn", Choice("sum", "prod")), Attr("axis", Int(lo=0)),
    Attr("exclusive", BOOL, False, "each element leaves itself out"),
    Attr("reverse", BOOL, False, "run from the end of the axis")),
    traits=frozenset(), rule=_cumulative, doc=(
        "TF Cumsum / Cumprod: running sum (product) along `axis`, same shape and dtype; "
        "exclusive starts from 0 (1), reverse runs from the last element.")))
declare(Kind("top_k", ("x",), attrs=(
    Attr("k", Int(lo=0)), Attr("indices", BOOL, False, "give the indices, not the values"),
    Attr("to", DType(INDEX_DTYPES), "int32", "the indices' dtype")),
    traits=frozenset(), rule=_top_k, doc=(
        "TF TopKV2 (sorted) over the last axis: the k largest values in descending order, "
        "equal values in index order; or, with `indices`, where they are. Last dim k.")))
declare(Kind("resize", ("x",), attrs=(
    Attr("mode", Choice("bilinear", "nearest")), Attr("size", Ints(2, lo=1), doc="[h, w]"),
    Attr("align_corners", BOOL, False), Attr("half_pixel_centers", BOOL, False)),
    traits=frozenset(), rule=_resize, doc=(
        "TF ResizeBilinear / ResizeNearestNeighbor on NHWC; bilinear outputs float32.")))
declare(Kind("copy", ("x",), traits=_t("movement", "elementwise", "no_float_math",
                                       "same_type_is_identity"),
             rule=_one, doc="y = x (a graph output that is an input or another output)."))


# --- trait sets (what the passes and engines ask) ------------------------------------------

MATMUL_LIKE = kinds_with("matmul_like")
ELEMENTWISE = kinds_with("elementwise")
MOVEMENT = kinds_with("movement")
REDUCTION = kinds_with("reduction")
WINDOWED = kinds_with("windowed")
NO_FLOAT_MATH = kinds_with("no_float_math")
SAME_TYPE_IS_IDENTITY = kinds_with("same_type_is_identity")


# --- arithmetic per instruction (the compiler's stats, the device model, thread counts) ---

def flops(kind: str, in_shapes: Sequence[Sequence[int]], out_shapes: Sequence[Sequence[int]],
          attrs: Mapping) -> int:
    """Arithmetic of one instruction, a multiply-add counting two: matrix-unit kinds by
    their products, windows by their taps, reductions by the elements they fold, anything
    else one per output element. (attrs: with defaults, as `Kind.with_defaults` gives.)"""
    out = elements(out_shapes[0]) if out_shapes else 0
    if kind == "conv2d" or (kind == "conv2d_int8" and not attrs.get("depthwise")):
        kh, kw, cin, _ = in_shapes[1]
        return 2 * out * kh * kw * cin
    if kind in ("depthwise_conv2d", "conv2d_int8"):
        kh, kw = in_shapes[1][:2]
        return 2 * out * kh * kw
    if kind == "conv3d":
        kd, kh, kw, cin, _ = in_shapes[1]
        return 2 * out * kd * kh * kw * cin
    if kind == "matmul_int8":
        return 2 * out * in_shapes[1][0]
    if kind == "matmul":
        a = in_shapes[0]
        a = [a[p] for p in attrs.get("perm_a") or range(len(a))]  # (a read permuted)
        return 2 * out * (a[-2] if attrs.get("transpose_a") else a[-1])
    if kind in ("pool", "pool3d"):
        return out * elements(attrs.get("ksize", ()))
    if kind in ("reduce", "softmax", "masked_softmax", "layer_norm", "argminmax"):
        return elements(in_shapes[0]) if in_shapes else out
    return out


# --- scratch: the working memory an instruction may use -----------------------------------
# The compiler places each instruction's scratch in the arena (cc/memory.py) by these rules;
# the numpy reference kernels block their work to fit it (runtime/kernels/conv.py, pool.py),
# reading the same layouts. Only the windowed kinds use any. Sizes are cache-sized blocks,
# measured on the reference kernels (runtime/kernels/conv.py says why).

SCRATCH_ALIGN = 64          # every carved region starts on a cache line
GEMM_BLOCK_BYTES = 4 << 20  # conv2d: columns + outputs of one GEMM block
GEMM_MIN_ROWS = 2048        # conv2d: never smaller GEMMs than this (BLAS efficiency)
TAP_BLOCK_BYTES = 2 << 20   # depthwise_conv2d: accumulator block of the per-tap loop
POOL_BLOCK_BYTES = 1 << 20  # pool: H-folded intermediate per block

Region = tuple[tuple[int, ...], str]  # (shape, dtype) of one carved piece


def region_bytes(regions: Sequence[Region]) -> int:
    """Scratch bytes for regions carved in order, each losing up to SCRATCH_ALIGN bytes to
    alignment."""
    return sum(elements(shape) * ITEMSIZE[dtype] + SCRATCH_ALIGN for shape, dtype in regions)


def compute_dtype(dtype: str) -> str:
    """What a window kernel computes a dtype in: 16-bit floats in float32 (a matrix unit
    reading 16 bits accumulates in float32), anything else as itself."""
    return "float32" if dtype in ("float16", "bfloat16") else dtype


@dataclass(frozen=True)
class Geometry:
    """A window sweep over an NHWC input: sizes, strides, dilations, pads, output extent."""

    n: int
    h: int
    w: int
    c: int
    kh: int
    kw: int
    oc: int  # filter's last dim: O for conv2d, M for depthwise
    sh: int
    sw: int
    dh: int
    dw: int
    pads: tuple[int, int, int, int]
    oh: int
    ow: int

    @staticmethod
    def of(x_shape: Sequence[int], w_shape: Sequence[int], attrs: Mapping) -> Geometry:
        n, h, w, c = x_shape
        kh, kw, _, oc = w_shape
        (sh, sw), (dh, dw) = attrs["strides"], attrs["dilations"]
        pads = tuple(attrs["pads"])
        return Geometry(n, h, w, c, kh, kw, oc, sh, sw, dh, dw, pads,  # type: ignore[arg-type]
                        (h + pads[0] + pads[1] - ((kh - 1) * dh + 1)) // sh + 1,
                        (w + pads[2] + pads[3] - ((kw - 1) * dw + 1)) // sw + 1)

    @property
    def padded(self) -> bool:
        return any(self.pads)

    @property
    def padded_shape(self) -> tuple[int, int, int, int]:
        top, bottom, left, right = self.pads
        return (self.n, self.h + top + bottom, self.w + left + right, self.c)

    @property
    def direct(self) -> bool:
        """1x1, stride 1, unpadded: the input already is the column matrix."""
        return (self.kh, self.kw, self.sh, self.sw) == (1, 1, 1, 1) and not self.padded

    def rows_per_block(self, pixel_bytes: int, target: int, min_pixels: int) -> int:
        """Output rows (one (n, oh) pair = OW pixels) per block: about `target` bytes
        at `pixel_bytes` per output pixel, and at least `min_pixels` pixels."""
        pixels = max(target // max(pixel_bytes, 1), min_pixels)
        return max(1, min(pixels // self.ow, self.n * self.oh))


Layout = tuple[Geometry, str, int, list[Region]]  # geometry, compute dtype, rows, regions


def conv2d_layout(in_shapes: Sequence[Sequence[int]], in_dtypes: Sequence[str],
                  attrs: Mapping) -> Layout:
    """One group's conv2d as im2col blocks: the padded input, a block's columns, its
    unrounded result (16-bit outputs) and its tiled bias."""
    g = Geometry.of(in_shapes[0], in_shapes[1], attrs)
    cd = compute_dtype(in_dtypes[0])
    k = g.kh * g.kw * g.c
    rows = g.rows_per_block((k + g.oc) * ITEMSIZE[cd], GEMM_BLOCK_BYTES, GEMM_MIN_ROWS)
    regions: list[Region] = []
    if not g.direct:
        if g.padded:
            regions.append((g.padded_shape, cd))
        regions.append(((rows * g.ow, k), cd))
    if cd != in_dtypes[0]:
        regions.append(((rows * g.ow, g.oc), cd))  # GEMM result before rounding
    if len(in_shapes) - bool(attrs.get("residual")) == 3:  # a bias, tiled over a block
        regions.append(((rows * g.ow, g.oc), in_dtypes[0]))
    return g, cd, rows, regions


def conv2d_group(in_shapes: Sequence[Sequence[int]], attrs: Mapping
                 ) -> tuple[Geometry, tuple[int, ...], tuple[int, ...], dict]:
    """A grouped conv2d's geometry, one group's x and w shapes, and its plain attrs."""
    groups = attrs["groups"]
    g = Geometry.of(in_shapes[0], in_shapes[1], attrs)
    kh, kw, cg, o = in_shapes[1]
    plain = {k: v for k, v in attrs.items() if k not in ("groups", "residual", "activation")}
    return g, (g.n, g.h, g.w, cg), (kh, kw, cg, o // groups), plain


def _conv2d_scratch(in_shapes: Sequence[Sequence[int]], in_dtypes: Sequence[str],
                    attrs: Mapping) -> int:
    if attrs.get("groups", 1) > 1:  # each group copied out, convolved, copied back
        g, x_shape, w_shape, plain = conv2d_group(in_shapes, attrs)
        inner = _conv2d_scratch([x_shape, w_shape], in_dtypes[:1], plain)
        return region_bytes([(x_shape, in_dtypes[0]),
                             ((g.n, g.oh, g.ow, w_shape[3]), in_dtypes[0]),
                             (w_shape, in_dtypes[0]), ((inner,), "uint8")])
    return region_bytes(conv2d_layout(in_shapes, in_dtypes, attrs)[3])


def depthwise_layout(in_shapes: Sequence[Sequence[int]], in_dtypes: Sequence[str],
                     attrs: Mapping) -> Layout:
    """The per-tap loop's padded copy (grouped by column stride), one tap's products and
    the accumulator."""
    g = Geometry.of(in_shapes[0], in_shapes[1], attrs)
    cd = compute_dtype(in_dtypes[0])
    rows = g.rows_per_block(g.sw * g.c * g.oc * ITEMSIZE[cd], TAP_BLOCK_BYTES, 1)
    regions: list[Region] = []
    n, hp, wp, c = g.padded_shape
    if depthwise_needs_copy(g, cd, in_dtypes[0]):
        regions.append(((n, hp, -(-wp // g.sw) * g.sw, c), cd))
    block = (rows * g.ow * g.sw * g.c * g.oc,)
    regions.append((block, cd))  # one tap's products
    if g.sw > 1 or cd != in_dtypes[0]:
        regions.append((block, cd))  # accumulator (slots not yet summed, or unrounded)
    return g, cd, rows, regions


def depthwise_needs_copy(g: Geometry, cd: str, dtype: str) -> bool:
    return g.padded or g.padded_shape[2] % g.sw != 0 or cd != dtype


def pool_layout(in_shapes: Sequence[Sequence[int]], in_dtypes: Sequence[str],
                attrs: Mapping) -> Layout:
    """The H-folded block [n, rows, W, C] and, when it computes wider, the unrounded
    result. avg of 16-bit floats accumulates in float32, of integers in float64
    (truncated at the end); max is exact in any dtype."""
    kh, kw = attrs["ksize"]
    g = Geometry.of(in_shapes[0], (kh, kw, in_shapes[0][3], 1),
                    {"strides": attrs["strides"], "dilations": (1, 1), "pads": attrs["pads"]})
    cd = in_dtypes[0]
    if attrs["mode"] == "avg":
        cd = "float64" if cd in INTEGERS or cd == "bool" else compute_dtype(cd)
    rows = g.rows_per_block(-(-g.w // g.ow) * g.c * ITEMSIZE[cd], POOL_BLOCK_BYTES, 1)
    regions: list[Region] = [((rows * g.w * g.c,), cd)]
    if cd != in_dtypes[0]:
        regions.append(((rows * g.ow * g.c,), cd))
    return g, cd, rows, regions


_SCRATCH: dict[str, Callable[[Sequence[Sequence[int]], Sequence[str], Mapping], int]] = {
    "conv2d": _conv2d_scratch,
    "depthwise_conv2d": lambda s, d, a: region_bytes(depthwise_layout(s, d, a)[3]),
    "pool": lambda s, d, a: region_bytes(pool_layout(s, d, a)[3]),
}


def scratch_bytes(kind: str, in_shapes: Sequence[Sequence[int]], in_dtypes: Sequence[str],
                  attrs: Mapping) -> int:
    """The scratch bytes one instruction may use (0 for most kinds); attrs with defaults."""
    rule = _SCRATCH.get(kind)
    return int(rule(in_shapes, in_dtypes, attrs)) if rule else 0


# --- the ISA table of docs/isa.md ----------------------------------------------------------

def _attr_doc(a: Attr) -> str:
    text = f"`{a.name}`: {a.spec.describe()}"
    if not a.required:
        text += f" (default `{a.default!r}`)" if not isinstance(a.default, str) else \
            f" (default `{a.default}`)"
    return text + (f"; {a.doc}" if a.doc else "")


def markdown_table() -> str:
    """The table docs/isa.md carries between its GENERATED markers."""
    lines = ["| kind | inputs → outputs | attrs | traits | semantics |",
             "|---|---|---|---|---|"]
    for k in KINDS.values():
        attrs = "<br>".join(_attr_doc(a) for a in k.attrs) or "—"
        traits = ", ".join(sorted(k.traits)) or "—"
        lines.append(f"| `{k.name}` | {signature(k)} | {attrs} | {traits} | {k.doc} |")
    return "\n".join(lines) + "\n"


# --- int8 (post-training quantization, docs/int8.md) ---------------------------------------
# Declared after the trait sets on purpose: these kinds carry none of the traits (auto-cast,
# layout assignment and the windowed/matmul-like paths of the engines leave them alone).

QUANTIZED = frozenset({"uint8", "int8"})
_QOUT = (Attr("out", Choice("float32", "bfloat16", "uint8", "int8"), "float32",
              "y's dtype: float32 or bfloat16 (dequantized), or requantized to 8 bits"),
         Attr("y_scale", NUM, 1.0, "with an 8-bit `out`: y's quantization step"))


def _quantize(t: Sequence[HasType], a: dict) -> list[Type]:
    if t[0].dtype not in ("float32", "bfloat16"):
        raise IsaError(f"quantize takes float32 or bfloat16, got {_fmt(t[0])}", "in")
    _positive(a, "scale")
    return [Type(tuple(t[0].shape), a["to"])]


def _binary_quantize(t: Sequence[HasType], a: dict) -> list[Type]:
    if t[0].dtype != t[1].dtype or t[0].dtype not in ("float32", "bfloat16"):
        raise IsaError(f"binary_quantize takes two float32 or two bfloat16 operands, got "
                       f"{_fmt(t[0])} and {_fmt(t[1])}", "in")
    _positive(a, "scale")
    shape = broadcast_shapes(t[0].shape, t[1].shape)
    if len(t) == 3:
        _addend_fits(t, shape)
    return [Type(shape, a["to"])]


def _positive(a: dict, name: str) -> None:
    if not (math.isfinite(a[name]) and a[name] > 0):
        raise IsaError(f"{name} {a[name]!r} must be a finite number > 0", name)


def _int8_operands(t: Sequence[HasType], a: dict, x_scale: str, out_ch: int) -> None:
    x, w, ws = t[0], t[1], t[2]
    if x.dtype not in QUANTIZED or w.dtype != "int8":
        raise IsaError(f"int8 operands must be uint8/int8 and int8, got {_fmt(x)} and "
                       f"{_fmt(w)}", "in")
    if ws.dtype != "float32" or tuple(ws.shape) != (out_ch,):
        raise IsaError(f"w_scale must be float32[{out_ch}] (one step per output channel), "
                       f"got {_fmt(ws)}", "in")
    _positive(a, x_scale)
    _positive(a, "y_scale")


def _float_extras(extras: Sequence[HasType], bias_n: int, out: Type, residual: bool) -> None:
    rest = list(extras)
    if residual:
        if not rest or tuple(rest[-1].shape) != out.shape or \
                rest[-1].dtype not in QUANTIZED | {"float32"}:
            raise IsaError(f"residual must be float32, uint8 or int8 {list(out.shape)}",
                           "residual")
        rest = rest[:-1]
    if len(rest) > 1:
        raise IsaError("too many inputs for the residual flag", "in")
    if rest and (tuple(rest[0].shape) != (bias_n,) or rest[0].dtype != "float32"):
        raise IsaError(f"bias must be float32[{bias_n}], got {_fmt(rest[0])}", "in")


def _conv2d_int8(t: Sequence[HasType], a: dict) -> list[Type]:
    if len(t[1].shape) != 4:
        raise IsaError(f"conv2d_int8's filter must be 4-D, got {_fmt(t[1])}", "in")
    kh, kw, c, o = t[1].shape
    _int8_operands(t, a, "x_scale", c * o if a["depthwise"] else o)
    y = _conv_like([t[0], t[1]], {**a, "groups": 1, "residual": False},
                   depthwise=a["depthwise"])[0]
    y = Type(y.shape, a["out"])
    _float_extras(t[3:], y.shape[3], Type(y.shape, "float32"), a["residual"])
    return [y]


def _matmul_int8(t: Sequence[HasType], a: dict) -> list[Type]:
    if len(t[1].shape) != 2:
        raise IsaError(f"matmul_int8's b must be 2-D [K, N], got {_fmt(t[1])}", "in")
    _int8_operands(t, a, "a_scale", t[1].shape[1])
    if len(t[0].shape) < 2 or t[0].shape[-1] != t[1].shape[0]:
        raise IsaError(f"matmul_int8 inner dimensions differ: {_fmt(t[0])} and {_fmt(t[1])}",
                       "in")
    y = Type(tuple(t[0].shape[:-1]) + (t[1].shape[1],), a["out"])
    _float_extras(t[3:], y.shape[-1], y, a["residual"])
    if a["residual"] and t[-1].dtype != "float32":
        raise IsaError(f"matmul_int8's residual must be float32, got {_fmt(t[-1])}", "residual")
    return [y]


_INT8_DOC = (" The 8-bit operands are multiplied and summed exactly (int32); the sum times "
             "`{s}`·w_scale[o] (one float32 product), plus bias (plus residual), then the "
             "activation, all in float32; with an 8-bit `out`, y = saturate(round-half-even("
             "v · (1/y_scale))).")
declare(Kind("quantize", ("x",), attrs=(
    Attr("scale", NUM, doc="the step: y ≈ x / scale"),
    Attr("to", DType(QUANTIZED), doc="uint8 (non-negative ranges) or int8 (symmetric)")),
    rule=_quantize, doc=(
        "y = saturate(round-half-even(x · float32(1/scale))) to uint8 [0, 255] or int8 "
        "[−128, 127]; NaN gives 0. The edge of an int8 region (docs/int8.md).")))
# The binary functions whose result, quantized, `binary_quantize` writes in one pass.
QUANTIZED_BINARY_FNS = ("add", "sub", "mul")
declare(Kind("binary_quantize", ("a", "b"), ("c",), attrs=(
    Attr("fn", Choice(*QUANTIZED_BINARY_FNS), doc="the `binary` function"),
    Attr("activation", Choice("none", "relu"), "none", "applied before quantizing"),
    Attr("scale", NUM, doc="y's step: y ≈ act(fn(a, b) [+ c]) / scale"),
    Attr("to", DType(QUANTIZED), doc="uint8 or int8")),
    rule=_binary_quantize, doc=(
        "y = quantize(binary(a, b [, c], activation)), bit for bit: fn(a, b) in float32 "
        "with numpy broadcasting, plus c (a's dtype, broadcasting to y) when given, "
        "rounded once to nearest even when a and b are bfloat16 (the value `binary` would "
        "store), the activation, then `quantize`'s saturate(round-half-even(v · "
        "float32(1/scale))), NaN giving 0. An element-wise result read only by a "
        "quantize, written in 8 bits without storing the float one: EfficientNet's "
        "squeeze-excite product before its int8 project convolution; a trained "
        "BatchNorm's scale, shift and ReLU after a concat (DenseNet) before the int8 "
        "convolution that reads it.")))
declare(Kind("conv2d_int8", ("x", "w", "w_scale"), ("bias", "residual"), attrs=(
    *_WINDOW[:3], Attr("x_scale", NUM, doc="x's quantization step"),
    Attr("depthwise", BOOL, False, "w is [KH,KW,C,M]: each input channel c convolved "
         "with w[..., c, m] gives output channel c·M+m (as depthwise_conv2d)"),
    Attr("residual", BOOL, False, "the last input (y's shape) is added after bias"),
    Attr("residual_scale", NUM, 1.0, "an 8-bit residual's step: it adds residual·"
         "float32(residual_scale)"),
    *_ACTIVATION[:2], *_QOUT),
    rule=_conv2d_int8, doc=(
        "conv2d (NHWC, one group; or depthwise) on a quantized x (uint8/int8) and w (int8 "
        "[KH,KW,C,O], per-output-channel steps w_scale)." + _INT8_DOC.format(s="x_scale") +
        " A uint8/int8 residual (a quantized shortcut) adds float32(residual)·"
        "float32(residual_scale).")))
declare(Kind("matmul_int8", ("a", "b", "w_scale"), ("bias", "residual"), attrs=(
    Attr("a_scale", NUM, doc="a's quantization step"),
    Attr("residual", BOOL, False, "the last input (y's shape, float32) is added after bias"),
    *_ACTIVATION[:2], *_QOUT),
    rule=_matmul_int8, doc=(
        "a [..., M, K] (uint8/int8) @ b [K, N] (int8, per-column steps w_scale)."
        + _INT8_DOC.format(s="a_scale"))))
