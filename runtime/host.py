"""The host's CPUs, shared by the programs computing at once.

Each running program (one stage of one call) takes as many CPUs as its widest OpenMP
team and gives them back when it stops computing; a program that cannot get them
waits. So programs whose instructions all run on one thread (a small model, the
BERT-style encoder's small matmuls) compute side by side, one per CPU, while a program
that spreads its convolutions over every CPU runs alone: concurrent calls never put
more threads to work than there are CPUs. Waiters are served in arrival order, so a
wide program is not starved by a stream of narrow ones.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

GIVE_UP_POLL = 0.02  # seconds between a waiter's give_up() checks


class HostCPUs:
    def __init__(self, cpus: int, fixed_width: int | None = None):
        """`fixed_width`: every program takes that many CPUs whatever its teams (what an
        explicit NEURONISH_HOST_PARALLELISM asks: exactly that many programs at once)."""
        self.cpus = max(1, cpus)
        self.fixed_width = fixed_width
        self._free = self.cpus
        self._waiting: collections.deque[object] = collections.deque()
        self._cond = threading.Condition(threading.Lock())

    def take(self, width: int) -> Slot:
        """What a program `width` threads wide holds while it computes (a lock-like
        object: `with`, or acquire/release with a timeout)."""
        if self.fixed_width is not None:
            width = self.fixed_width
        return Slot(self, min(max(1, width), self.cpus))

    def acquire(self, n: int, timeout: float | None = None,
                give_up: Callable[[], bool] | None = None) -> bool:
        """Take `n` CPUs, waiting in line; False after `timeout` seconds, or as soon as
        `give_up()` says so (asked every GIVE_UP_POLL seconds, keeping the place)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            if not self._waiting and self._free >= n:  # (the common, uncontended case)
                self._free -= n
                return True
            ticket = object()
            self._waiting.append(ticket)
            try:
                while True:
                    left = None if end is None else max(0.0, end - time.monotonic())
                    wait = left if give_up is None else \
                        GIVE_UP_POLL if left is None else min(left, GIVE_UP_POLL)
                    if self._cond.wait_for(
                            lambda: self._waiting[0] is ticket and self._free >= n, wait):
                        self._free -= n
                        return True
                    if (give_up is not None and give_up()) or left == 0.0:
                        return False
            finally:
                self._waiting.remove(ticket)
                self._cond.notify_all()  # the next in line may now be first

    def release(self, n: int) -> None:
        with self._cond:
            self._free += n
            self._cond.notify_all()

    @property
    def free(self) -> int:
        return self._free


class Slot:
    """`width` of the host's CPUs, taken and given back like a lock."""

    def __init__(self, host: HostCPUs, width: int):
        self.host, self.width = host, width

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if not blocking:
            timeout = 0
        return self.host.acquire(self.width, None if timeout < 0 else timeout)

    def release(self) -> None:
        self.host.release(self.width)

    def __enter__(self) -> Slot:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
