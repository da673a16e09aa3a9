"""numpy kernels of the simulated device, one module per family.

Importing this package registers every kernel in `KERNELS`.
"""

from . import (  # noqa: F401 (registers)
    array,
    conv,
    elementwise,
    image,
    linalg,
    pool,
    quantized,
    reduce,
    sequence,
    volume,
)
from .registry import KERNELS, Kernel, check_complete, evaluate, kernel

check_complete()

__all__ = ["KERNELS", "Kernel", "evaluate", "kernel"]
