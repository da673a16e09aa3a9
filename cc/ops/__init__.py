"""TF op lowerings, one module per op family. Importing this package fills
`registry.LOWERINGS`."""

from . import (  # noqa: F401  (importing registers lowerings)
    array,
    basic,
    blocks,
    image,
    linalg,
    math,
    nn,
    registry,
    sequence,
    volume,
)

__all__ = ["registry"]
