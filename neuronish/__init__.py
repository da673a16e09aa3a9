"""neuronish: package TensorFlow models for a (simulated) multi-core accelerator.

Importing `neuronish` stays cheap (no TensorFlow) so that the compiler and the
runtime, which live in `neuronish.cc` and `neuronish.runtime`, start fast: this
file runs in every compiler subprocess too.

It still makes the `NeuronOp` available wherever TensorFlow is used: if
TensorFlow is already imported, the op library (neuronish/op_library.py) is
loaded now; otherwise a small finder on `sys.meta_path` waits for
`import tensorflow` and loads it right after TensorFlow finishes importing. So
`import neuronish` before or after `import tensorflow` both work, and a process
that never imports TensorFlow never pays for it.

`neuronish.saved_model` is imported on first use.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs ms here
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

__version__ = "0.1.0"

_LAZY_SUBMODULES = ("saved_model",)


def _load_op_library() -> None:
    """Load the NeuronOp library; on failure warn instead of breaking `import tensorflow`
    (the error comes back, in full, from any later `neuronish.op_library.load()`)."""
    from neuronish import op_library

    try:
        op_library.load()
    except Exception as e:  # a missing compiler must not make TensorFlow unimportable
        import warnings

        warnings.warn(f"neuronish: NeuronOp is not available, so compiled SavedModels will not "
                      f"load in this process: {type(e).__name__}: {e}", RuntimeWarning,
                      stacklevel=2)


class _LoadAfterTensorFlow:
    """Wraps the loader of the `tensorflow` module so that `_load_op_library` runs
    once TensorFlow's own `__init__` has finished."""

    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # TensorFlow sees its real loader; only this call went through us.
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _uninstall_hook()
        _load_op_library()

    def __getattr__(self, name: str) -> Any:  # e.g. get_resource_reader
        return getattr(self.loader, name)


class _TensorFlowImportHook:
    """A `sys.meta_path` finder that only answers for `tensorflow`, by asking the
    other finders and wrapping the loader they return."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> ModuleSpec | None:
        if fullname != "tensorflow":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoadAfterTensorFlow(spec.loader)
                return spec
        return None


def _uninstall_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _TensorFlowImportHook)]


def __getattr__(name: str) -> Any:
    if name == "trace":  # neuronish.trace(fn_or_keras_model, example_inputs): tracing.py
        from neuronish.tracing import trace

        return trace
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if "tensorflow" in sys.modules:
    _load_op_library()
elif not any(isinstance(f, _TensorFlowImportHook) for f in sys.meta_path):
    # Ahead of the path finders, which would otherwise find tensorflow first.
    sys.meta_path.insert(0, _TensorFlowImportHook())
