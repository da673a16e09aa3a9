"""When a call is abandoned: at its deadline, or as soon as its caller cancels it.

A call that nobody waits for any more should stop computing: a server that
answered DEADLINE_EXCEEDED must not keep a core busy for the rest of the
request. A `Cutoff` is checked while the call waits for cores, before every
numpy step and, inside the native engine, before every instruction; an
instruction already computing finishes.

The cancel flag is a one-byte writable buffer (a `bytearray(1)`): non-zero means
cancelled. Another thread sets it without the GIL — the `NeuronOp` kernel's
TensorFlow cancellation callback does — so reading it is one byte load in
Python and in C++ alike.
"""

from __future__ import annotations

import ctypes
import time

from .errors import Cancelled, DeadlineExceeded

# How often a call that waits for a core looks at its cancel flag (a queue or a
# lock cannot wake on a byte changing).
POLL_SECONDS = 0.02


class Cutoff:
    __slots__ = ("deadline", "flag", "_view")

    def __init__(self, deadline: float | None = None, flag: bytearray | None = None):
        """`deadline` in time.monotonic() seconds; `flag` as in the module doc."""
        if flag is not None and (not isinstance(flag, (bytearray, memoryview))
                                 or len(flag) < 1 or getattr(flag, "readonly", False)):
            raise TypeError("cancel flag must be a writable one-byte buffer (bytearray(1)), "
                            f"got {type(flag).__name__}")
        self.deadline = deadline
        self.flag = flag
        self._view: ctypes.c_char | None = None

    @staticmethod
    def of(timeout: float | None, cancel: bytearray | None) -> Cutoff | None:
        """A call's cutoff from a timeout in seconds and a cancel flag; None if neither."""
        if timeout is None and cancel is None:
            return None
        return Cutoff(None if timeout is None else time.monotonic() + timeout, cancel)

    def check(self, what: str) -> None:
        """Raise Cancelled or DeadlineExceeded if the call is to stop; `what` says where
        it was ("before its next stage could start")."""
        if self.flag is not None and self.flag[0]:
            raise Cancelled(f"the call was cancelled by its caller {what}; the rest of it "
                            "was abandoned")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise DeadlineExceeded(f"the call's deadline passed {what}; the rest of it was "
                                   "abandoned")

    def stopped(self) -> bool:
        """Whether the call is to stop now (`check` would raise)."""
        return bool((self.flag is not None and self.flag[0]) or
                    (self.deadline is not None and time.monotonic() >= self.deadline))

    def wait_slice(self) -> float | None:
        """How long to block at most before looking again: until the deadline, and no
        more than POLL_SECONDS while a cancel flag can change; None: no limit."""
        left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        if self.flag is None:
            return left
        return POLL_SECONDS if left is None else min(left, POLL_SECONDS)

    def flag_address(self) -> int:
        """The flag byte's address for the native engine (0: no flag). The view taken
        of it is kept: while it lives, the buffer cannot be resized (moved) under the
        engine."""
        if self.flag is None:
            return 0
        if self._view is None:
            self._view = ctypes.c_char.from_buffer(self.flag)
        return ctypes.addressof(self._view)
