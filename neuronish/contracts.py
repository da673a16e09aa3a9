"""What the parts of neuronish agree on, in one place, importing nothing heavy.

The compiler (`neuronish.cc`) and the runtime never import TensorFlow, and the
TensorFlow side never imports the compiler in-process; these few facts are
shared by all of them and documented in `docs/contracts.md`, so they live
here, free of TensorFlow, numpy and the compiler.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

# -- dtypes the device holds (io-config inputs and outputs, and every value inside) --
DEVICE_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                 "bool")

# -- op types with a fixed role ------------------------------------------------------------
# Graph inputs: what the caller feeds. They stay on TensorFlow.
INPUT_OPS = frozenset({"Placeholder", "PlaceholderWithDefault"})
# Ops that move no data worth a device call on their own: a cluster of only these is not
# worth compiling, and they are not counted as operations in OnNeuronRatio.
PASS_THROUGH_OPS = frozenset({"Const", "Identity", "IdentityN", "NoOp", "Snapshot",
                              "StopGradient", "PreventGradient"})

# -- the compiler command -------------------------------------------------------------------
ENV_COMPILER = "NEURONISH_CC"


def default_compiler() -> list[str]:
    """The compiler command (argv prefix): `$NEURONISH_CC` split like a shell would, else
    the `neuronish-cc` next to the Python interpreter, else `python -m neuronish.cc.cli`
    (an install without console scripts, e.g. a bare PYTHONPATH checkout)."""
    env = os.environ.get(ENV_COMPILER, "").strip()
    if env:
        return shlex.split(env)
    script = Path(sys.executable).parent / "neuronish-cc"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "neuronish.cc.cli"]


# -- the io-config the TensorFlow side hands the compiler (cc/ioconfig.py reads it) -------


def io_config(inputs: Iterable[tuple[str, Sequence[int], str, int]],
              outputs: Mapping[str, int | None]) -> dict:
    """The io-config (JSON-ready) for `inputs`, each (name, shape, dtype, batch axis), and
    `outputs`, name -> batch axis. A batch axis of -1 is none; an output's None leaves it
    to the compiler, which decides from the shapes."""
    return {"inputs": {name: [list(shape), dtype, axis] for name, shape, dtype, axis in inputs},
            "outputs": dict(outputs)}


# -- NeuronOp's `model_config` attribute ----------------------------------------------------
# [global_opt_num_cores, this_opt_num_cores, max_num_duplicates, timeout_s,
#  core_group_index]; -1 leaves an entry to the runtime.
MODEL_CONFIG_FIELDS = ("global_opt_num_cores", "this_opt_num_cores", "max_num_duplicates",
                       "timeout_s", "core_group_index")
UNBOUND = -1


def model_config(global_cores: int, this_cores: int, max_duplicates: int = UNBOUND,
                 timeout_s: int = UNBOUND, core_group_index: int = UNBOUND) -> list[int]:
    """A `model_config` list in the order of `MODEL_CONFIG_FIELDS`."""
    return [global_cores, this_cores, max_duplicates, timeout_s, core_group_index]
