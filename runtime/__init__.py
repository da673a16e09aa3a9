"""neuronish.runtime: the simulated multi-core device. Never imports TensorFlow.

    import neuronish.runtime as rt
    model = rt.load("model.neff")          # path or bytes
    outputs = model.run({"x:0": x})        # dict name -> np.ndarray

`Device`, `Model`, `load` and `get_device` are imported on first use: they bring
in the kernels, and reading or checking an executable (`runtime/executable.py`,
`runtime/isa.py`) must stay cheap without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    Cancelled,
    DeadlineExceeded,
    DeviceError,
    ExecutableError,
    ExecutionError,
    InvalidInput,
    OutOfDeviceMemory,
    OutputBufferError,
)

if TYPE_CHECKING:
    from .device import Device, get_device
    from .model import Model, load

_LAZY = {"Device": "device", "get_device": "device", "Model": "model", "load": "model"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Cancelled", "DeadlineExceeded", "Device", "DeviceError", "ExecutableError",
           "ExecutionError", "InvalidInput", "Model", "OutOfDeviceMemory", "OutputBufferError",
           "get_device", "load"]
