"""The pass pipeline: a flat list of named `graph -> graph` functions, read top to
bottom, run under instruments (TVM's pass instruments): hooks around every pass
that verify, dump, time or skip it, so no pass carries that code itself.

    Verify          the verifier after every pass (always on): the structure of the
                    lowered graph and the types of nodes its lowering did not check,
                    between passes what each pass changed, everything after the last
                    pass (cc/verify.py; NEURONISH_VERIFY=full: everything every time)
    Dumper          the graph after each pass as `NNN_<pass>.txt` (`NEURONISH_DUMP_DIR`,
                    `--workdir`)
    Timer           per-pass wall time and node counts (`neuronish-cc --verbose`)
    DisablePasses   skip passes by name, for debugging (`--disable-pass NAME`)
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import VerificationError
from .ir import Graph, format_graph
from .passes.affine import fold_affine_chains
from .passes.autocast import auto_cast
from .passes.binary_quantize import fuse_binary_quantize
from .passes.fuse import absorb_dense_reshapes, fold_scale_shift, fuse_activation, fuse_residual_add
from .passes.idioms import (
    recognize_gelu,
    recognize_gelu_tanh,
    recognize_hard_swish,
    recognize_layer_norm,
    recognize_masked_softmax,
    recognize_swish,
)
from .passes.layout import assign_layouts
from .passes.matmul_transposes import absorb_operand_transposes, fold_output_transposes
from .passes.movement import sink_reshapes
from .passes.powers import expand_constant_powers
from .passes.quantize import assign_dtypes_with_int8
from .passes.simplify import eliminate_dead_code, eliminate_identities, fold_constants
from .passes.strides import propagate_strides
from .passes.window import fold_pad_into_window
from .verify import IncrementalVerifier


@dataclass(frozen=True)
class Pass:
    name: str
    run: Callable[[Graph], Graph]


def build_pipeline(auto_cast_mode: str = "none", auto_cast_type: str = "bf16",
                   quantize: Callable[[Graph], Graph] | None = None) -> list[Pass]:
    """`quantize`: the int8 pass with its calibration bound (cc/passes/quantize.py), or
    None (the pass then leaves the graph as it is)."""
    return [
        Pass("fold_constants", fold_constants),
        # x ** 3 (approximate GELU), x ** 2, x ** -0.5 ... as TF's grappler rewrites them.
        Pass("expand_constant_powers", expand_constant_powers),
        Pass("eliminate_identities", eliminate_identities),
        # TF's exact GELU (five ops) and its approximate one (eight) are one instruction.
        Pass("recognize_gelu", recognize_gelu),
        Pass("recognize_gelu_tanh", recognize_gelu_tanh),
        Pass("recognize_swish", recognize_swish),
        Pass("recognize_hard_swish", recognize_hard_swish),
        Pass("recognize_layer_norm", recognize_layer_norm),
        # Attention's mask, softmax and mask again: one pass over the scores.
        Pass("recognize_masked_softmax", recognize_masked_softmax),
        Pass("eliminate_dead_code", eliminate_dead_code),
        # A Dense on [batch, seq, features] is one matmul, without its two reshapes...
        Pass("absorb_dense_reshapes", absorb_dense_reshapes),
        # ...and attention's transposed scores come out of their matmul the right way.
        Pass("fold_output_transposes", fold_output_transposes),
        # Reshapes move below bias adds and activations, next to their matmul...
        Pass("sink_reshapes", sink_reshapes),
        # BatchNorm-style x*a+b after conv/matmul goes into the weights and bias...
        Pass("fold_scale_shift", fold_scale_shift),
        # ...and what no weights take (an image's Rescaling and Normalization) is one pass.
        Pass("fold_affine_chains", fold_affine_chains),
        # ...which leaves conv directly followed by its residual add (if any) and
        # conv/matmul by its activation.
        Pass("fuse_residual_add", fuse_residual_add),
        Pass("fuse_activation", fuse_activation),
        # Zero padding in front of a conv (or a max pool of relu output) becomes its pads.
        Pass("fold_pad_into_window", fold_pad_into_window),
        # A value only stride-s 1x1 convolutions read is computed at stride s (ResNet's
        # stage ends): its producer skips the pixels nobody reads.
        Pass("propagate_strides", propagate_strides),
        # int8 after every fusion, so each range belongs to a value the device holds;
        # what it keeps in float32 is then auto-cast like the rest.
        Pass("quantize_int8", quantize or (lambda graph: graph)),
        # Rounding comes after folding so folded weights are rounded once, as the
        # device would store them.
        Pass("auto_cast", functools.partial(auto_cast, mode=auto_cast_mode,
                                            cast_type=auto_cast_type)),
        # ...and with bf16, values stay bf16 between the instructions that take it (an
        # int8 instruction next to such a region writes bf16 itself, docs/int8.md).
        Pass("assign_dtypes", functools.partial(assign_dtypes_with_int8, mode=auto_cast_mode,
                                                cast_type=auto_cast_type)),
        # Attention's head split and merge are strides of its matmuls, not copies.
        Pass("absorb_operand_transposes", absorb_operand_transposes),
        Pass("eliminate_dead_code", eliminate_dead_code),
        # An add/sub/mul read only by a quantize writes the 8-bit value itself (int8; after
        # the dead code, as the float32 casts dtype assignment left unread were readers).
        Pass("fuse_binary_quantize", fuse_binary_quantize),
        # Last: which activations may stay channel-blocked between windowed instructions.
        Pass("assign_layouts", assign_layouts),
    ]


class Instrument:
    """Hooks around every pass; subclasses override what they need."""

    def enter_pipeline(self, graph: Graph) -> None:
        """Called once with the lowered graph, before the first pass."""

    def should_run(self, p: Pass) -> bool:
        """False skips the pass (every instrument must agree to run it)."""
        return True

    def before_pass(self, p: Pass, graph: Graph) -> None:
        pass

    def after_pass(self, p: Pass, graph: Graph) -> None:
        pass

    def exit_pipeline(self, graph: Graph) -> None:
        """Called once with the final graph, after the last pass."""


class Verify(Instrument):
    """The verifier on the lowered graph and after every pass, naming the pass it caught;
    the nodes a pass changed between passes, every node after the last."""

    def __init__(self) -> None:
        self.check = IncrementalVerifier()
        self.last: str | None = None

    def enter_pipeline(self, graph: Graph) -> None:
        self.check(graph)  # (a graph not from `lower` has every node new: checked in full)

    def after_pass(self, p: Pass, graph: Graph) -> None:
        self.last = p.name
        try:
            self.check(graph)
        except VerificationError as e:
            raise type(e)(f"after pass {p.name}: {e}") from None

    def exit_pipeline(self, graph: Graph) -> None:
        try:
            self.check(graph, full=True)
        except VerificationError as e:
            raise type(e)(f"after the last pass ({self.last}): {e}") from None


class Dumper(Instrument):
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

    # Formatting is skipped without a directory: it cost as much as the verifier
    # (3 s of a 100,000-node compile) for text nobody reads.
    def enter_pipeline(self, graph: Graph) -> None:
        self.write("lowered", format_graph(graph) if self.directory else "")

    def after_pass(self, p: Pass, graph: Graph) -> None:
        self.write(p.name, format_graph(graph) if self.directory else "")


@dataclass
class PassRecord:
    name: str
    seconds: float  # wall time of the pass alone (not of the other instruments)
    nodes_before: int
    nodes_after: int


@dataclass
class Timer(Instrument):
    """Per-pass wall time and node counts, in the order the passes ran."""

    records: list[PassRecord] = field(default_factory=list)
    _start: float = 0.0
    _nodes: int = 0

    def before_pass(self, p: Pass, graph: Graph) -> None:
        self._nodes = graph.node_count
        self._start = time.perf_counter()

    def after_pass(self, p: Pass, graph: Graph) -> None:
        self.records.append(PassRecord(p.name, time.perf_counter() - self._start, self._nodes,
                                       graph.node_count))

    def totals(self) -> dict[str, float]:
        """pass name -> seconds, summed over the pass's runs."""
        out: dict[str, float] = {}
        for r in self.records:
            out[r.name] = out.get(r.name, 0.0) + r.seconds
        return out


class DisablePasses(Instrument):
    """Skips the passes named (every run of a name), for debugging a miscompile."""

    def __init__(self, names: Collection[str]):
        self.names = frozenset(names)
        self.skipped: list[str] = []

    def should_run(self, p: Pass) -> bool:
        if p.name in self.names:
            self.skipped.append(p.name)
            return False
        return True


def pass_names() -> list[str]:
    """Every pass name, in pipeline order, once each (for `--disable-pass`)."""
    return list(dict.fromkeys(p.name for p in build_pipeline()))


def run_pipeline(graph: Graph, passes: list[Pass],
                 instruments: Instrument | Sequence[Instrument] = (),
                 timings: dict[str, float] | None = None) -> Graph:
    """Run `passes` in order under `instruments` (the verifier always comes first).

    `timings`, if given, receives pass name -> seconds summed over its runs."""
    chosen = [instruments] if isinstance(instruments, Instrument) else list(instruments)
    timer = next((i for i in chosen if isinstance(i, Timer)), None)
    if timings is not None and timer is None:
        timer = Timer()
        chosen.append(timer)
    active: list[Instrument] = [Verify(), *chosen]
    for instrument in active:
        instrument.enter_pipeline(graph)
    for p in passes:
        if not all([i.should_run(p) for i in active]):  # a list: every instrument sees it
            continue
        for instrument in active:
            instrument.before_pass(p, graph)
        graph = p.run(graph)
        for instrument in reversed(active):  # the timer stops before the others run
            instrument.after_pass(p, graph)
    for instrument in active:
        instrument.exit_pipeline(graph)
    if timings is not None and timer is not None:
        for name, seconds in timer.totals().items():
            timings[name] = timings.get(name, 0.0) + seconds
    return graph


def dump_dir_from_env(stem: str) -> Path | None:
    root = os.environ.get("NEURONISH_DUMP_DIR")
    return Path(root) / stem if root else None
