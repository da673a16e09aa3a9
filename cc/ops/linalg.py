"""Matrix products: MatMul, BatchMatMul (V1/V2/V3) and Einsum, all lowered to the
`matmul` kind (plus `transpose`, `reshape` and `reduce` for Einsum).

Einsum is lowered like TF's own CPU kernel does it: sum out the labels only
one operand has, transpose each operand to [batch..., free..., contracted...],
flatten to a (batched) matrix product, and reshape/transpose the result to
the output's labels. Among equivalent layouts the lowering picks the one with
the fewest transposes (using matmul's transpose flags and operand order).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from .. import batch
from ..errors import NodeError
from ..graphdef import TFNode
from ..ir import Value
from .basic import FLOAT, NUMERIC, dtype_check, require_dtype
from .registry import LowerCtx, tf_op

MATMUL_DTYPES = FLOAT + ("int32", "int64")


def _matmul(ctx: LowerCtx, a: Value, b: Value, ta: bool, tb: bool) -> Value:
    return ctx.emit1("matmul", [a, b], {"transpose_a": ta, "transpose_b": tb,
                                       "activation": "none", "alpha": 0.0})


@tf_op("MatMul", supports=dtype_check(MATMUL_DTYPES), batch=batch.matmul)
def matmul(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """a @ b on rank-2 operands; `transpose_a`/`transpose_b` transpose first."""
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    require_dtype(a, MATMUL_DTYPES)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise NodeError(f"MatMul takes matrices, got {a.type} and {b.type}")
    return [_matmul(ctx, a, b, bool(node.get("transpose_a")), bool(node.get("transpose_b")))]


def _bmm_supports(node: TFNode) -> str | None:
    if node.op == "BatchMatMulV3":
        return dtype_check(NUMERIC, "Ta", "Tb")(node) or dtype_check(MATMUL_DTYPES, "Tout")(node)
    return dtype_check(MATMUL_DTYPES)(node)


@tf_op("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", supports=_bmm_supports,
       batch=batch.batch_matmul)
def batch_matmul(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """Batched x @ y over the last two axes (rank >= 2); `adj_x`/`adj_y` transpose
    (the adjoint of a real matrix). BatchMatMul (V1) needs equal batch dims;
    V2/V3 broadcast them like numpy. V3's operand types Ta/Tb (e.g. int8) are cast
    to Tout (e.g. int32) first, which gives the same products."""
    x, y = ctx.input(node, 0), ctx.input(node, 1)
    if node.op == "BatchMatMulV3":
        out = node.get("Tout", x.dtype)
        x, y = (v if v.dtype == out else ctx.emit1("cast", [v], {"to": out}) for v in (x, y))
    require_dtype(x, MATMUL_DTYPES)
    if len(x.shape) < 2 or len(y.shape) < 2:
        raise NodeError(f"batch matmul operands must have rank >= 2, got {x.type}, {y.type}")
    if node.op == "BatchMatMul" and x.shape[:-2] != y.shape[:-2]:
        raise NodeError(f"BatchMatMul needs equal batch dims, got {x.type} and {y.type}")
    return [_matmul(ctx, x, y, bool(node.get("adj_x")), bool(node.get("adj_y")))]


# --- Einsum ------------------------------------------------------------------------

_LABELS = re.compile(r"\.\.\.|[A-Za-z]")


def _parse_equation(eq: str, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """Operand and output label lists; '...' becomes labels '.-k', ..., '.-1'
    aligned to the right (numpy/TF broadcasting of ellipsis dims)."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise NodeError(f"equation {eq!r} names {len(terms)} operands, the node has "
                        f"{len(ranks)}")
    ell_rank = 0
    parsed: list[list[str]] = []
    for term, rank in zip(terms, ranks, strict=True):
        tokens = _LABELS.findall(term)
        if "".join(tokens) != term or tokens.count("...") > 1:
            raise NodeError(f"cannot parse einsum term {term!r} in {eq!r}")
        named = len(tokens) - tokens.count("...")
        if "..." in tokens:
            n = rank - named
            if n < 0:
                raise NodeError(f"term {term!r} has more labels than its operand's rank {rank}")
            ell_rank = max(ell_rank, n)
            i = tokens.index("...")
            tokens[i:i + 1] = ["." + str(-k) for k in range(n, 0, -1)]  # '.-2', '.-1'
        elif named != rank:
            raise NodeError(f"term {term!r} has {named} labels, its operand has rank {rank}")
        parsed.append(tokens)
    ell = ["." + str(-k) for k in range(ell_rank, 0, -1)]
    out = _LABELS.findall(rhs)
    if not arrow or "".join(out) != rhs:
        raise NodeError(f"cannot parse einsum output {rhs!r} in {eq!r} (TF's Einsum op "
                        f"needs exactly one '->')")
    if "..." in out:
        i = out.index("...")
        out[i:i + 1] = ell
    if len(set(out)) != len(out):
        raise NodeError(f"einsum output {rhs!r} repeats a label")
    return parsed, out


@dataclass
class _Operand:
    value: Value
    labels: list[str]

    def size(self, label: str) -> int:
        return self.value.shape[self.labels.index(label)]


def _transpose(ctx: LowerCtx, op: _Operand, order: list[str]) -> _Operand:
    if order == op.labels:
        return op
    perm = [op.labels.index(label) for label in order]
    return _Operand(ctx.emit1("transpose", [op.value], {"perm": perm}), order)


def _reshape(ctx: LowerCtx, v: Value, shape: list[int]) -> Value:
    if tuple(shape) == v.shape:
        return v
    return ctx.emit1("reshape", [v], {"shape": shape})


def _align(ctx: LowerCtx, op: _Operand, out: list[str]) -> Value:
    """`op` laid out for broadcasting against `out`: its labels in `out` order,
    size-1 dims for the labels it lacks."""
    order = [x for x in out if x in op.labels]
    v = _transpose(ctx, op, order).value
    return _reshape(ctx, v, [op.size(x) if x in op.labels else 1 for x in out])


def _sum_out(ctx: LowerCtx, op: _Operand, keep: set[str]) -> _Operand:
    """Sum over the labels not in `keep`; checks for repeated labels (diagonals)."""
    if len(set(op.labels)) != len(op.labels):
        raise NodeError(f"einsum term {''.join(op.labels)!r} repeats a label (a diagonal); "
                        f"the device does not take diagonals", "keep this node on TensorFlow")
    axes = [i for i, label in enumerate(op.labels) if label not in keep]
    if not axes:
        return op
    v = ctx.emit1("reduce", [op.value], {"fn": "sum", "axes": axes, "keepdims": False})
    return _Operand(v, [label for label in op.labels if label in keep])


def _contract(ctx: LowerCtx, a: _Operand, b: _Operand, keep: set[str],
              out: list[str]) -> _Operand:
    """Product of two operands summed over their shared labels not in `keep`;
    `out` is the label order wanted afterwards."""
    a = _sum_out(ctx, a, keep | set(b.labels))
    b = _sum_out(ctx, b, keep | set(a.labels))
    batch = [x for x in a.labels if x in b.labels and x in keep]
    contracted = [x for x in a.labels if x in b.labels and x not in keep]
    a_free = [x for x in a.labels if x not in b.labels]
    b_free = [x for x in b.labels if x not in a.labels]
    for x in contracted:
        if a.size(x) != b.size(x):
            raise NodeError(f"einsum label {x!r} has size {a.size(x)} in one operand and "
                            f"{b.size(x)} in the other")
    if not contracted:  # an elementwise/outer product: broadcasting multiply
        return _Operand(ctx.emit1("binary", [_align(ctx, a, out), _align(ctx, b, out)],
                                  {"fn": "mul"}), [x for x in out if x in keep])
    sizes = {x: max(a.size(x), b.size(x)) for x in batch}  # ellipsis dims may broadcast
    sizes.update({x: a.size(x) for x in a_free})
    sizes.update({x: b.size(x) for x in b_free})

    # Try batch orders (as in a, b or the output) x contracted orders (as in a or
    # b) x operand order; cost = transposes needed.
    best: tuple[int, list] | None = None
    # (dict.fromkeys: distinct candidates in a fixed order, so compiles are repeatable)
    batch_orders = dict.fromkeys([tuple(batch), tuple(x for x in b.labels if x in batch),
                                  tuple(x for x in out if x in batch)])
    contr_orders = dict.fromkeys([tuple(contracted),
                                  tuple(x for x in b.labels if x in contracted)])
    for bo, co, swap in itertools.product(batch_orders, contr_orders, (False, True)):
        first, second = (b, a) if swap else (a, b)
        f_free = [x for x in first.labels if x not in second.labels]
        s_free = [x for x in second.labels if x not in first.labels]
        bo, co = list(bo), list(co)
        # transpose flags only when the plain layout does not already fit
        ta = first.labels == bo + co + f_free != bo + f_free + co
        tb = second.labels == bo + s_free + co != bo + co + s_free
        cost = (not (ta or first.labels == bo + f_free + co)) + (
            not (tb or second.labels == bo + co + s_free))
        cost += bo + f_free + s_free != [x for x in out if x in keep]
        plan = [first, second, bo, co, f_free, s_free, ta, tb]
        if best is None or cost < best[0]:
            best = (cost, plan)
    assert best is not None
    first, second, bo, co, f_free, s_free, ta, tb = best[1]
    lhs = _transpose(ctx, first, bo + co + f_free if ta else bo + f_free + co)
    rhs = _transpose(ctx, second, bo + s_free + co if tb else bo + co + s_free)

    def prod(labels: list[str], op: _Operand) -> int:
        n = 1
        for x in labels:
            n *= op.size(x)
        return n

    lb = [lhs.size(x) for x in bo]
    rb = [rhs.size(x) for x in bo]
    m, k, n = prod(f_free, lhs), prod(co, lhs), prod(s_free, rhs)
    lv = _reshape(ctx, lhs.value, lb + ([k, m] if ta else [m, k]))
    rv = _reshape(ctx, rhs.value, rb + ([n, k] if tb else [k, n]))
    y = _matmul(ctx, lv, rv, ta, tb)
    labels = bo + f_free + s_free
    y = _reshape(ctx, y, [sizes[x] for x in labels])
    return _Operand(y, labels)


def _einsum_supports(node: TFNode) -> str | None:
    return dtype_check(MATMUL_DTYPES)(node)


@tf_op("Einsum", supports=_einsum_supports, batch=batch.einsum)
def einsum(ctx: LowerCtx, node: TFNode) -> list[Value]:
    """TF's Einsum: one or two operands, an explicit output ('ab,bc->ac'), '...'
    broadcasting; labels only one operand has and the output lacks are summed.
    Repeated labels within one term (diagonals/traces) are refused.
    Keras 3 MultiHeadAttention's 'abc,cde->abde', 'abcd,cde->abe',
    'aecd,abcd->acbe' and 'acbe,aecd->abcd' each become one matmul with at most
    two transposes and free reshapes."""
    xs = ctx.inputs(node)
    if len(xs) not in (1, 2):
        raise NodeError(f"Einsum takes one or two operands, the node has {len(xs)}")
    require_dtype(xs[0], MATMUL_DTYPES)
    terms, out = _parse_equation(str(node.get("equation", "")), [len(x.shape) for x in xs])
    ops = [_Operand(x, t) for x, t in zip(xs, terms, strict=True)]
    for label in out:
        if not any(label in op.labels for op in ops):
            raise NodeError(f"einsum output label {label!r} appears in no operand")
    acc = ops[0] if len(ops) == 1 else _contract(ctx, ops[0], ops[1], set(out), out)
    acc = _sum_out(ctx, acc, set(out))
    return [_transpose(ctx, acc, out).value]
