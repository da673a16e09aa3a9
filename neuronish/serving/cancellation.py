"""Calls of TensorFlow functions that another thread can cancel.

A request past its deadline is answered DEADLINE_EXCEEDED at once; its call must
also stop, or it keeps a core (and the device) busy for nobody. TensorFlow cancels
a running function through a CancellationManager: its kernels stop at their next
cancellation check, and the `NeuronOp` kernel forwards the cancellation to the
device, which abandons the call before its next instruction.

TensorFlow 2.21 takes the manager for a call from a process-wide global that its
CancellationManagerContext sets (`tensorflow.python.eager.cancellation`), so two
threads calling at once would share one. Here each thread has its own: the lookup
TensorFlow makes when a function is called (on the calling thread) is answered
from a thread-local first, and from TensorFlow's global otherwise, so code using
TensorFlow's own context keeps working.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from tensorflow.python.eager import cancellation as _tf_cancellation

T = TypeVar("T")

_local = threading.local()
_tf_context = _tf_cancellation.context


def _context() -> _tf_cancellation.CancellationManager | None:
    manager = getattr(_local, "manager", None)
    return manager if manager is not None else _tf_context()


_tf_cancellation.context = _context


class Cancellation:
    """One call's cancellation: `run(fn)` on one thread, `cancel()` from another."""

    def __init__(self) -> None:
        self._manager = _tf_cancellation.CancellationManager()

    def run(self, fn: Callable[[], T]) -> T:
        """Call `fn` (which calls TensorFlow functions) cancellably on this thread. A
        cancelled call raises tf.errors.CancelledError (or the error of the kernel it
        stopped)."""
        with self._active():
            return fn()

    def cancel(self) -> None:
        """Stop the call: TensorFlow's kernels and the device abandon what is left."""
        self._manager.start_cancel()

    @property
    def cancelled(self) -> bool:
        return self._manager.is_cancelled

    @contextlib.contextmanager
    def _active(self) -> Iterator[None]:
        previous = getattr(_local, "manager", None)
        _local.manager = self._manager
        try:
            yield
        finally:
            _local.manager = previous
