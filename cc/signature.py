"""Keys for memoizing what an instruction's signature alone decides.

A large graph repeats a few signatures (kind, input shapes and dtypes, attributes) many
times, and what follows from one (its output types, its scratch bytes, its flops, its
modelled cost) costs tens of microseconds to work out: the lowering, the verifier, the
memory plan and the device model each compute it once per signature and look it up
for the rest (benchmarks/compiler_scale.py: 100,000-node graphs).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Generic, Protocol, TypeVar

from .ir import TensorType

V = TypeVar("V")


class _Typed(Protocol):
    shape: tuple[int, ...]
    dtype: str


def signature_key(kind: str, types: Sequence[_Typed], attrs: object) -> tuple | None:
    """A key that equals another only when the kind, the input shapes and dtypes and the
    attributes are the same values of the same Python types (1, 1.0 and True differ, so
    do 0.0 and -0.0); None when an attribute is of a type not worth keying (arrays)."""
    shapes = []
    for t in types:
        tt = t if type(t) is TensorType else getattr(t, "_type", None)  # (a Value's type)
        if type(tt) is TensorType:
            # A TensorType is immutable: its part of the key is worked out once and kept
            # on it (each of the lowering, verifier, memory plan and flops asks again).
            k = tt.__dict__.get("_signature")
            if k is None:
                k = _type_key(tt.shape, tt.dtype)
                object.__setattr__(tt, "_signature", k)
        else:
            k = _type_key(t.shape, t.dtype)
        if k is False:
            return None
        shapes.append(k)
    attr_key = attrs_key(attrs)
    return None if attr_key is None else (kind, tuple(shapes), attr_key)


# id(attrs) -> (attrs, its key) inside an `attrs_fixed` block, else None
_fixed: dict[int, tuple[object, object]] | None = None


@contextmanager
def attrs_fixed() -> Iterator[None]:
    """A block in which no attribute dict is edited (the final graph's, while its
    executable is made): each dict's `value_key` is worked out once, however many of the
    flops, the memory plan, the device model and the numpy report ask (a 100,000-node
    graph's dicts were keyed about five times each). Each dict is held by the cache, so
    its id is not reused by another while the block runs."""
    global _fixed
    outer = _fixed
    if outer is None:
        _fixed = {}
    try:
        yield
    finally:
        _fixed = outer


def attrs_key(attrs: object) -> object:
    """`value_key(attrs)`, remembered by identity inside an `attrs_fixed` block."""
    fixed = _fixed
    if fixed is None:
        return value_key(attrs)
    hit = fixed.get(id(attrs))
    if hit is not None:
        return hit[1]
    key = value_key(attrs)
    fixed[id(attrs)] = (attrs, key)
    return key


def _type_key(shape: object, dtype: object) -> tuple | bool:
    """(shape, dtype), or False if either is of a type not keyed exactly."""
    if type(shape) is not tuple or type(dtype) is not str:
        return False
    for d in shape:  # (a loop: `any` over a generator cost twice as much here)
        if type(d) is not int:
            return False
    return (shape, dtype)


def value_key(value: object) -> object:
    """`value` as a hashable key tagged with its exact types, or None (see `signature_key`)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return (kind, value)
    if kind is float:
        return (kind, value.hex())  # tells -0.0 from 0.0, and NaN equals itself
    if kind is list or kind is tuple:
        items = []
        for item in value:
            t = type(item)  # (scalars inline: this runs for every instruction)
            k = (t, item) if t is str or t is int or t is bool else value_key(item)
            if k is None:
                return None
            items.append(k)
        return (kind, tuple(items))
    if kind is dict:
        items = []
        for name, item in value.items():
            t = type(item)
            k = (t, item) if t is str or t is int or t is bool else value_key(item)
            if type(name) is not str or k is None:
                return None
            items.append((name, k))
        return (kind, tuple(sorted(items)))
    return None


class Memo(Generic[V]):
    """key -> value, emptied when it holds `limit` entries: a cache, never a leak (the
    compiler may run in a long-lived process). A None key is never stored."""

    def __init__(self, limit: int = 1 << 16):
        self.limit = limit
        self.entries: dict[object, V] = {}

    def get(self, key: object) -> V | None:
        return None if key is None else self.entries.get(key)

    def put(self, key: object, value: V) -> V:
        if key is not None:
            if len(self.entries) >= self.limit:
                self.entries.clear()
            self.entries[key] = value
        return value
