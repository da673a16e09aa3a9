"""neuronish.runtime: the simulated multi-core device. Never imports TensorFlow.

    import neuronish.runtime as rt
    model = rt.load("model.neff")          # path or bytes
    outputs = model.run({"x:0": x})        # dict name -> np.ndarray
"""

from .device import Device, get_device
from .errors import (
    DeviceError,
    ExecutableError,
    ExecutionError,
    InvalidInput,
    OutOfDeviceMemory,
    OutputBufferError,
)
from .model import Model, load

__all__ = ["Device", "DeviceError", "ExecutableError", "ExecutionError", "InvalidInput", "Model",
           "OutOfDeviceMemory", "OutputBufferError", "get_device", "load"]
