"""The pass pipeline: a flat list of named `graph -> graph` functions, read top to
bottom. Every pass is followed by the verifier; with `NEURONISH_DUMP_DIR` (or
`--workdir`) set, the graph after each pass is written as `NNN_<pass>.txt`."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .ir import Graph, format_graph
from .passes.autocast import auto_cast
from .passes.fuse import fold_scale_shift, fuse_activation, fuse_residual_add
from .passes.simplify import eliminate_dead_code, eliminate_identities, fold_constants
from .verify import verify


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Graph], Graph]


def build_pipeline(auto_cast_mode: str = "none", auto_cast_type: str = "bf16") -> list[Pass]:
    return [
        Pass("fold_constants", fold_constants),
        Pass("eliminate_identities", eliminate_identities),
        Pass("eliminate_dead_code", eliminate_dead_code),
        # BatchNorm-style x*a+b after conv/matmul goes into the weights and bias...
        Pass("fold_scale_shift", fold_scale_shift),
        # ...which leaves conv directly followed by its residual add (if any) and
        # conv/matmul by its activation.
        Pass("fuse_residual_add", fuse_residual_add),
        Pass("fuse_activation", fuse_activation),
        # Rounding comes after folding so folded weights are rounded once, as the
        # device would store them.
        Pass("auto_cast", functools.partial(auto_cast, mode=auto_cast_mode,
                                            cast_type=auto_cast_type)),
        Pass("eliminate_dead_code", eliminate_dead_code),
    ]


class Dumper:
    """Writes `NNN_<name>.txt` files into a directory, if one is configured."""

    def __init__(self, directory: str | Path | None):
        self.directory = Path(directory) if directory else None
        self.count = 0
        if self.directory:
            self.directory.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, text: str) -> None:
        if self.directory:
            (self.directory / f"{self.count:03d}_{name}.txt").write_text(text)
        self.count += 1


def run_pipeline(graph: Graph, passes: list[Pass], dumper: Dumper,
                 timings: dict[str, float] | None = None) -> Graph:
    verify(graph)
    dumper.write("lowered", format_graph(graph))
    for p in passes:
        start = time.perf_counter()
        graph = p.run(graph)
        if timings is not None:
            timings[p.name] = timings.get(p.name, 0.0) + time.perf_counter() - start
        verify(graph)
        dumper.write(p.name, format_graph(graph))
    return graph


def dump_dir_from_env(stem: str) -> Path | None:
    root = os.environ.get("NEURONISH_DUMP_DIR")
    return Path(root) / stem if root else None
