"""The instruction schema of runtime/isa.py as a C++ header the C runtime includes.

The facts (kinds, arity, attributes with their types, ranges, lengths and choices,
dtypes and size limits) stay in isa.py; this writes them out at build time
(runtime/capi/library.py), so the C loader checks exactly what validate.py checks
and cannot drift from it. The shape rules are Python functions: shape_rules.cc ports them
by hand (NATIVE_RULES lists which), and tests/runtime/test_c_api.py compares the two.
"""

from __future__ import annotations

import json

from .. import isa

# The kinds whose shape rule runtime/capi/shape_rules.cc ports (all of them, checked by
# tests/runtime/test_c_api.py); a kind added to isa.py without a port is checked for arity and
# attributes only until it gets one (docs/c-api.md).
NATIVE_RULES = frozenset({"unary", "copy", "binary", "select", "cast", "matmul", "conv2d",
                          "depthwise_conv2d", "pool", "reduce", "softmax", "argminmax",
                          "reshape", "transpose", "concat", "strided_slice", "masked_softmax",
                          "layer_norm",
                          "pad", "tile", "broadcast_to", "gather", "conv3d", "pool3d",
                          "cumulative", "top_k", "one_hot", "resize", "quantize",
                          "binary_quantize", "conv2d_int8", "matmul_int8"})


def _c_string(s: str) -> str:
    return json.dumps(s)  # a JSON string literal of ASCII text is a valid C literal


def _name_list(name: str, names: list[str] | tuple[str, ...]) -> list[str]:
    """A set of names from isa.py as a C array and its length."""
    return [f"constexpr const char *{name}[] = {{{', '.join(map(_c_string, names))}}};",
            f"constexpr int {name}Count = {len(names)};"]


def header() -> str:
    """The C++ header text: constexpr tables in namespace nr::isa."""
    lines = ["// Generated from runtime/isa.py by runtime/capi/isa_table.py: do not edit.",
             "#pragma once", "#include <cstdint>", "namespace nr::isa {",
             f"constexpr int64_t kMaxRank = {isa.MAX_RANK};",
             f"constexpr int64_t kMaxDim = {isa.MAX_DIM};",
             f"constexpr int64_t kMaxValueBytes = {isa.MAX_VALUE_BYTES}LL;",
             "struct DType { const char *name; int itemsize; };",
             "constexpr DType kDTypes[] = {"]
    order = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16",
             "float32", "float64"]  # the nr_dtype enum's order (neuronish_runtime.h)
    if set(order) != set(isa.ITEMSIZE):
        raise RuntimeError(f"isa.ITEMSIZE {sorted(isa.ITEMSIZE)} no longer matches nr_dtype")
    lines += [f"  {{{_c_string(d)}, {isa.ITEMSIZE[d]}}}," for d in order]
    lines += ["};",
              "enum class Spec : uint8_t { Int, Num, Bool, Choice, Ints, OptInts, IntPairs, "
              "Scalar };",
              "struct Attr { const char *name; Spec spec; int64_t lo, hi; int length; "
              "bool required; const char *const *choices; int num_choices; "
              "const char *describe; };",
              "struct Kind { const char *name; int inputs, optional; bool variadic; "
              "const Attr *attrs; int num_attrs; bool native_rule; };"]
    specs = {"int": "Int", "num": "Num", "bool": "Bool", "choice": "Choice", "dtype": "Choice",
             "ints": "Ints", "opt_ints": "OptInts", "int_pairs": "IntPairs",
             "scalar": "Scalar"}
    kinds = []
    for k, kind in enumerate(isa.KINDS.values()):
        attrs = []
        for a, attr in enumerate(kind.attrs):
            s = attr.spec
            choices = "nullptr"
            if s.choices:
                choices = f"kChoices{k}_{a}"
                lines.append(f"constexpr const char *{choices}[] = "
                             f"{{{', '.join(map(_c_string, s.choices))}}};")
            lo = -isa.MAX_DIM if s.lo is None else s.lo
            hi = isa.MAX_DIM if s.hi is None else s.hi
            attrs.append(f"{{{_c_string(attr.name)}, Spec::{specs[s.kind]}, {lo}, {hi}, "
                         f"{-1 if s.length is None else s.length}, "
                         f"{'true' if attr.required else 'false'}, {choices}, "
                         f"{len(s.choices)}, {_c_string(s.describe())}}}")
        table = "nullptr"
        if attrs:
            table = f"kAttrs{k}"
            lines.append(f"constexpr Attr {table}[] = {{\n  " + ",\n  ".join(attrs) + "};")
        kinds.append(f"{{{_c_string(kind.name)}, {len(kind.inputs)}, {len(kind.optional)}, "
                     f"{'true' if kind.variadic else 'false'}, {table}, {len(attrs)}, "
                     f"{'true' if kind.name in NATIVE_RULES else 'false'}}}")
    lines.append("constexpr Kind kKinds[] = {\n  " + ",\n  ".join(kinds) + "};")
    lines += _name_list("kEpilogueBinaryFns", isa.EPILOGUE_BINARY_FNS)
    lines += _name_list("kOnePassSwappable",  # (isa.one_pass_binary: b may be y-shaped)
                        [f for f in isa.EPILOGUE_BINARY_FNS if f in isa.SWAPPED])
    lines += ["}  // namespace nr::isa", ""]
    return "\n".join(lines)
