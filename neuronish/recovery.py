"""Recovery: what to do with subgraphs the compiler did not compile.

A rejection that names nodes excludes those nodes and the graph is partitioned again
without them; any other failure (a crash, a timeout, a failure naming nothing) leaves
the subgraph's nodes on TensorFlow. Either is recorded in the compile report's
`compile_failures` and warned about. With the compiler's attribute checks asked before
partitioning (`partition.compiler_support`), this is the rare path.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence

from .compile_driver import CompileResult
from .errors import CompileWarning, SubgraphCompileError
from .partition import Partition, Subgraph

# Re-partitioning after a rejection converges fast (each round removes nodes);
# the bound only guards against a compiler that keeps naming new nodes.
MAX_RECOVERY_ROUNDS = 8


def digest(sg: Subgraph, compiler_args: Sequence[str]) -> str:
    """What a compile result is keyed by within one compile: the subgraph's members, its
    io-config and the flags. Within one outer graph the members decide the subgraph's
    bytes, so they are hashed instead of the bytes (VGG16's 528 MB took 2.6 s)."""
    return hashlib.sha256(repr((sg.node_names, sorted(sg.io_config["inputs"].items()),
                                sg.io_config["outputs"], list(compiler_args))).encode()
                          ).hexdigest()


BATCH_MIXING = "mixes samples across the batch"  # how the compiler's batch check begins


def recover(part: Partition, results: dict[str, CompileResult], digests: dict[str, str],
            excluded: dict[str, str], failures: list[dict], recovery: bool,
            mixing: dict[str, str] | None = None) -> bool:
    """Decide what to do with the subgraphs that did not compile; True if the graph must be
    partitioned again (some nodes are now excluded). Nodes the compiler's batch check
    names (`cc/batch.py`) go to `mixing` instead: keeping them on TensorFlow is how a
    dynamic batch stays right, not a failure, so it is neither warned about nor listed
    in `failures`."""
    changed = False
    for sg in part.subgraphs:
        result = results[digests[sg.name]]
        if result.ok:
            continue
        members = set(sg.node_names)
        named = [n for n in result.rejected_nodes if n.get("node") in members]
        mixers = {n["node"]: n.get("reason", "") for n in named
                  if str(n.get("reason", "")).startswith(BATCH_MIXING)}
        if mixing is not None and mixers and len(mixers) == len(named) and recovery \
                and result.outcome == "rejected":
            mixing.update({node: why.removeprefix(BATCH_MIXING).lstrip(": ")
                           for node, why in mixers.items()})
            changed = True
            continue
        where = (f"subgraph {sg.name} ({len(sg.node_names)} nodes): {result.outcome}. "
                 f"Command line: {' '.join(result.command_line)}" +
                 (f"; log: {result.log_path}" if result.log_path else
                  "; pass compiler_workdir=DIR to keep its log"))
        if not recovery or result.outcome == "bad_usage":
            # A command line the compiler refuses fails every subgraph alike: recovering
            # would quietly leave the whole model on TensorFlow.
            raise SubgraphCompileError(f"{where}\n{result.error}")
        if result.outcome == "rejected" and named:
            for n in named:
                excluded[n["node"]] = f"neuronish-cc rejected it: {n.get('reason', '')}".strip()
        else:
            reason = f"its subgraph failed to compile ({result.outcome}); see the compile report"
            for name in sg.node_names:
                excluded[name] = reason
        left = [n["node"] for n in named] or sorted(members)
        failures.append({"subgraph": sg.name, "outcome": result.outcome,
                         "error": result.error.strip(), "log": result.log_path,
                         "command_line": " ".join(result.command_line),
                         "nodes_left_on_tensorflow": left})
        what = ("partitioning again without " + ", ".join(left[:5]) +
                (f" and {len(left) - 5} more" if len(left) > 5 else "")
                if named else f"its {len(left)} nodes stay on TensorFlow")
        warnings.warn(f"subgraph {sg.name} ({len(sg.node_names)} nodes): {result.outcome}; "
                      f"{what} (the compile report's compile_failures say why" +
                      (f"; log: {result.log_path})" if result.log_path else ")"),
                      CompileWarning, stacklevel=3)
        changed = True
    return changed
