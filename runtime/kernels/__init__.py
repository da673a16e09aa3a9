"""numpy kernels of the simulated device, one module per family.

Importing this package registers every kernel in `KERNELS`.
"""

from . import array, conv, elementwise, image, linalg, pool, reduce, sequence  # noqa: F401,E501 (registers)
from .registry import KERNELS, Kernel, check_complete, evaluate, kernel

check_complete()

__all__ = ["KERNELS", "Kernel", "evaluate", "kernel"]
