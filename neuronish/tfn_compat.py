"""tensorflow-neuron's `saved_model.compile` arguments, taken as neuronish means them.

A user coming from tensorflow-neuron keeps their call: its positional order
(`model_dir, new_model_dir, tags, model_feed_dict, minimum_segment_size,
op_whitelist, no_fuse_ops, force_fuse_ops`), its `None` defaults, a
`compiler_args` string (split as a shell would), and its other keyword
arguments, each either given a meaning here (with a warning saying what it
does) or refused with what to use instead. docs/saved-model-compile.md has the
migration table; this module is its one implementation.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .errors import CompileWarning, SavedModelError

# tensorflow-neuron 1.x's positional arguments after (model_dir, new_model_dir).
TFN_POSITIONAL = ("tags", "model_feed_dict", "minimum_segment_size", "op_whitelist",
                  "no_fuse_ops", "force_fuse_ops")


class ArgumentError(SavedModelError, TypeError):
    """An argument of tensorflow-neuron's that neuronish cannot honour, or a bad value.

    A TypeError too, so code catching Python's own "unexpected keyword" still does."""


def compiler_args_tuple(value: object, source: str = "compiler_args") -> tuple[str, ...]:
    """`compiler_args` as flags: None -> none, a string split as a shell would (as
    tensorflow-neuron's docs write it: "--auto-cast none"), a list or tuple as given."""
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as e:  # an unclosed quote
            raise ArgumentError(f"{source}={value!r} cannot be split into flags: {e}; quote it "
                                "as a shell would, or pass a list of strings") from None
    if isinstance(value, (list, tuple)):
        return tuple(value)
    raise ArgumentError(f"{source} must be a string of flags or a list of them, got "
                        f"{type(value).__name__}")


def names_tuple(value: object, argument: str) -> tuple[str, ...]:
    """A list of node names or op types: None -> (), one string -> that one name (not its
    characters), an iterable -> its items."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Iterable):
        return tuple(value)
    raise ArgumentError(f"{argument} must be a list of node names or op types, got "
                        f"{type(value).__name__}")


def tags_list(value: object) -> list[str] | None:
    """tensorflow-neuron's `tags`: None, one tag, or a sequence of tags."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    return list(value)  # type: ignore[call-overload]


@dataclass
class TfnExtras:
    """What tensorflow-neuron-only keyword arguments add to neuronish's own."""

    op_whitelist: frozenset[str] | None = None  # op types the device may run (None: all)
    no_fuse_ops: tuple[str, ...] = ()
    compiler_args: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)


# Accepted, and do nothing here: why, in the warning.
_NO_EFFECT = {
    "convert_constants_to_variables": "large constants and executables are already stored as "
                                      "files under the new model's assets/ "
                                      "(NEURONISH_EXTERNAL_THRESHOLD), never in the graph proto",
    "grappler": "the graph is frozen and folded by neuronish itself; TensorFlow's grappler "
                "still runs when the compiled model loads",
    "subgraph_builder_function": "subgraphs are chosen by the partitioner; use no_fuse_ops / "
                                 "force_fuse_ops to steer it",
}
# Refused: what to use instead.
_REFUSED = {
    "amp_pass": "mixed precision is the compiler's --auto-cast: compiler_args='--auto-cast all "
                "--auto-cast-type bf16' (docs/auto-cast.md)",
    "feed_dict": "use model_feed_dict (example inputs keyed by signature input key)",
    "sess": "neuronish compiles SavedModels: save the session's graph with "
            "tf.compat.v1.saved_model.simple_save and compile that directory",
}


def translate(kwargs: Mapping[str, object], op_whitelist: object = None) -> TfnExtras:
    """The meaning here of tensorflow-neuron's extra keyword arguments `kwargs` (and of its
    positional `op_whitelist`). Warns for each one that is accepted with a changed meaning;
    raises ArgumentError for one that cannot be honoured or is unknown."""
    extras = TfnExtras()
    whitelist = op_whitelist
    for name, value in kwargs.items():
        if name == "supported_op_types":  # tensorflow-neuron 2.x's name for op_whitelist
            whitelist = value if whitelist is None else whitelist
        elif name == "compiler_verbose":
            if value:
                extras.compiler_args += ("--verbose", str(int(value)))
        elif name == "protected_op_names":
            names = names_tuple(value, name)
            extras.no_fuse_ops += names
            if names:
                extras.notes.append(f"protected_op_names: the {len(names)} named node(s) stay "
                                    "on TensorFlow (as no_fuse_ops), so they keep existing "
                                    "in the compiled graph")
        elif name in _NO_EFFECT:
            if value not in (None, False):
                extras.notes.append(f"{name} has no effect in neuronish: {_NO_EFFECT[name]}")
        elif name in _REFUSED:
            if value not in (None, False):
                raise ArgumentError(f"{name} is a tensorflow-neuron argument neuronish does not "
                                    f"take: {_REFUSED[name]}")
        else:
            known = sorted({*TFN_POSITIONAL, "supported_op_types", "compiler_verbose",
                            "protected_op_names", *_NO_EFFECT, *_REFUSED})
            raise ArgumentError(f"compile() got an unexpected keyword argument {name!r}; "
                                "besides neuronish's own it takes these tensorflow-neuron "
                                f"arguments: {', '.join(known)}")
    if whitelist is not None:
        extras.op_whitelist = frozenset(names_tuple(whitelist, "op_whitelist"))
        extras.notes.append("op_whitelist: only these op types may run on the device; every "
                            "other op stays on TensorFlow (ops the compiler does not list "
                            "stay there anyway)")
    for note in extras.notes:
        warnings.warn(note, CompileWarning, stacklevel=3)
    return extras


def import_modules(modules: Iterable[str]) -> None:
    """Import each module named (`--import`), so the custom Keras layers and objects it
    registers (keras.saving.register_keras_serializable) exist before a model loads. The
    current directory is searched too, as `python -c` would."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 (any error while importing user code)
            raise SavedModelError(f"cannot import {name!r} (to register custom objects): "
                                  f"{type(e).__name__}: {e}. Is its directory on PYTHONPATH? "
                                  "(the current directory is, for a file ./NAME.py)") from None


__all__ = ["TFN_POSITIONAL", "ArgumentError", "TfnExtras", "compiler_args_tuple",
           "import_modules", "names_tuple", "tags_list", "translate"]
