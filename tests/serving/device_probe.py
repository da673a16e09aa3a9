"""`neuronish-model-server` with a probe on the NeuronOp: what the device received.

    python -m tests.serving.device_probe --port=... (the server's flags)

Wraps `neuronish.kernel_bridge.run`, which the NeuronOp kernel looks up on every
call for this purpose, and appends one line per call to the file named by
$NEURONISH_DEVICE_PROBE: the call's rows and how many of them are distinct.
Batching pads with copies of a request's first row, so a call with more than
one distinct row of single-row requests proves requests were merged before
they reached the device; the scheduler's own metrics cannot show that. Each line
also says how the device's call ended ("ok", or the exception, e.g. Cancelled).

A call whose first input element is HOLD stands for a long computation: the probe
holds it until the call is cancelled, then lets the device run it, so a test sees
whether a request past its deadline really reaches the device as a cancellation.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence

import numpy as np

PROBE_ENV = "NEURONISH_DEVICE_PROBE"
HOLD = 4242.0


def install(path: str) -> None:
    from neuronish import kernel_bridge

    # The probe watches kernel_bridge.run, which the kernel calls only for ops on the
    # Python runtime: a model the C runtime loads is run by the kernel itself.
    os.environ["NEURONISH_KERNEL"] = "python"

    original = kernel_bridge.run
    lock = threading.Lock()

    def run(handle: object, inputs: Sequence[object], outputs: Sequence[object],
            cancel: bytearray | None = None) -> None:
        x = np.asarray(inputs[0])
        distinct = len(np.unique(x.reshape(len(x), -1), axis=0)) if x.ndim else 1
        if x.size and x.flat[0] == HOLD:  # a long computation, until cancelled (60 s at most)
            for _ in range(6000):
                if cancel is not None and cancel[0]:
                    break
                time.sleep(0.01)
        outcome = "ok"
        try:
            original(handle, inputs, outputs, cancel)
        except Exception as e:
            outcome = type(e).__name__
            raise
        finally:
            with lock, open(path, "a") as record:
                record.write(f"{len(x) if x.ndim else 1} {distinct} {outcome}\n")

    kernel_bridge.run = run


def calls(path: str) -> list[tuple[int, int]]:
    """(rows, distinct rows) of every NeuronOp call recorded so far."""
    return [(rows, distinct) for rows, distinct, _ in outcomes(path)]


def outcomes(path: str) -> list[tuple[int, int, str]]:
    """(rows, distinct rows, how the device's call ended: "ok" or the exception's
    class name) of every NeuronOp call recorded so far."""
    if not os.path.exists(path):
        return []
    with open(path) as record:
        return [(int(a), int(b), c) for a, b, c in (line.split() for line in record
                                                    if line.strip())]


if __name__ == "__main__":
    install(os.environ[PROBE_ENV])
    from neuronish.serving.server import main

    sys.exit(main())
