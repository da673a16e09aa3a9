"""`NEURONISH_CC_FLAGS`: compiler flags from the environment, appended to every
`neuronish-cc compile` the compile driver starts (the `NEURON_CC_FLAGS` of
tensorflow-neuron), e.g.

    NEURONISH_CC_FLAGS="--auto-cast matmult --auto-cast-type bf16" python train_and_compile.py

tensorflow-neuron's own `NEURON_CC_FLAGS` is honoured too, so a migrated
job's environment carries over: its flags come first, `NEURONISH_CC_FLAGS`'
after them (so the neuronish variable wins for a flag set in both).

They go after the driver's own arguments and after `compiler_args`, so for a
flag given twice the environment wins (argparse keeps the last). They are
checked the way `compiler_args` are: split like a shell would, the flags the
driver itself owns are refused here, and anything else the compiler does not
accept makes it exit with status 2, which fails the compile (never a silent
fallback to TensorFlow).
"""

from __future__ import annotations

import os
import shlex

from .errors import SavedModelError

ENV_CC_FLAGS = "NEURONISH_CC_FLAGS"
TFN_ENV_CC_FLAGS = "NEURON_CC_FLAGS"  # tensorflow-neuron's name, read first

# Set by the compile driver for each subgraph: a second value would compile another
# graph or write somewhere else.
_DRIVER_FLAGS = ("--framework", "--io-config", "--output", "--workdir")


class CompilerFlagsError(SavedModelError):
    """`NEURONISH_CC_FLAGS` (or `compiler_args`) cannot be passed to the compiler."""


def check_compiler_flags(flags: list[str] | tuple[str, ...], source: str) -> tuple[str, ...]:
    """`flags` as a tuple, or CompilerFlagsError naming `source` and the bad flag."""
    for flag in flags:
        if not isinstance(flag, str):
            raise CompilerFlagsError(f"{source}: {flag!r} is not a string; pass flags as "
                                     "strings, e.g. ['--auto-cast', 'matmult']")
        if _driver_flag(flag):
            raise CompilerFlagsError(f"{source}: {flag!r} is set by neuronish for each "
                                     f"subgraph and cannot be given; remove it (the flags the "
                                     f"driver owns: {', '.join(_DRIVER_FLAGS)})")
    if flags and not flags[0].startswith("-"):
        raise CompilerFlagsError(f"{source}: {flags[0]!r} is not a flag; the compiler takes "
                                 "one graph, which neuronish passes itself. Flags start with "
                                 "'--', e.g. --auto-cast matmult")
    return tuple(flags)


def _driver_flag(flag: str) -> bool:
    """Whether `flag` could reach one of the driver's flags in any spelling: exact,
    `--name=value`, a prefix (`--outp`; the compiler takes no abbreviations, but a
    refusal here names the flag, where the compiler's exit 2 would not say why),
    underscores for dashes, upper case, one dash or three."""
    if not flag.startswith("-"):
        return False
    name = flag.split("=", 1)[0].lstrip("-").lower().replace("_", "-")
    return bool(name) and any(d.lstrip("-").startswith(name) for d in _DRIVER_FLAGS)


def env_compiler_flags() -> tuple[str, ...]:
    """The flags in `$NEURON_CC_FLAGS` then `$NEURONISH_CC_FLAGS`, each split like a shell
    would; () when neither is set."""
    flags: list[str] = []
    for name in (TFN_ENV_CC_FLAGS, ENV_CC_FLAGS):
        text = os.environ.get(name, "")
        try:
            split = shlex.split(text)
        except ValueError as e:  # an unclosed quote
            raise CompilerFlagsError(f"${name}={text!r} cannot be split into flags: {e}. "
                                     "Quote it as a shell would") from None
        flags += check_compiler_flags(split, f"${name}")
    return tuple(flags)
