"""Errors the device reports. One base class; messages name the tensor or TF node."""

from __future__ import annotations


class DeviceError(Exception):
    """Base class of every error raised by neuronish.runtime."""


class ExecutableError(DeviceError):
    """The executable file is corrupt, truncated, or from a newer format."""


class OutOfDeviceMemory(DeviceError):
    """A load does not fit in the free memory of the cores it needs."""


class InvalidInput(DeviceError):
    """A call's inputs do not match the compiled signature."""


class OutputBufferError(DeviceError):
    """Arrays passed to receive a call's outputs do not fit them."""


class ExecutionError(DeviceError):
    """An instruction failed while running (e.g. an index out of range)."""


class DeadlineExceeded(DeviceError):
    """A call did not finish before its deadline; what was left of it was abandoned."""


class Cancelled(DeviceError):
    """The call's caller gave up on it (e.g. TensorFlow cancelled the step); what was left
    of it was abandoned."""
