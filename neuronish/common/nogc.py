"""Keep Python's cyclic garbage collector off the compiler's large, long-lived graphs.

Parsing and lowering a 100k-node graph allocate millions of long-lived objects and
almost no garbage; the collector's generational passes over them took about half the
time (a 100k-node Relu chain: lowering 15 s with it, 8 s without). Reference counting
still frees everything acyclic meanwhile, and the collector resumes (and catches up)
when the outermost pause ends.

After lowering, the passes do make cyclic garbage (a removed node and its outputs
point at each other), so the collector stays on there, but the graph built so far is
frozen out of its sight (`frozen_gc`): its full collections, each a walk over every
live object, came back every few thousand allocations and cost a 100,000-node AddN
about 10 of its 33 s (benchmarks/compiler_scale.py).

Inside a `frozen_gc` block, what a paused block made is frozen too when the pause ends
(the parsed or lowered graph, the executable): re-enabling the collector would otherwise
start by walking all of it, once per generation it passes through (about 1 s of a
100,000-node compile). It is all collectable again when the `frozen_gc` block ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Disable the cyclic collector for the block, then restore it as it was (a nested
    pause, or a caller that disabled it, is left alone)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if _freezing:
                gc.freeze()
            gc.enable()


_freezing = 0  # how many `frozen_gc` blocks (that froze) are open


@contextmanager
def frozen_gc() -> Iterator[None]:
    """Every object alive now is left out of the collector's walks for the block (its
    own garbage is still collected); afterwards they are collectable again. A caller
    that froze objects itself is left alone (unfreezing would release its objects too)."""
    if gc.get_freeze_count():
        yield
        return
    global _freezing
    gc.freeze()
    _freezing += 1
    try:
        yield
    finally:
        _freezing -= 1
        gc.unfreeze()
