"""Server-side batching: merge concurrent requests into one model call.

The policy is TF Serving's SharedBatchScheduler, which its users tune for:

* Each queue holds batches; a task joins the last (open) batch if it fits in
  `max_batch_size` rows, else opens a new one. A queue may hold at most
  `max_enqueued_batches`; a task that would need one more is refused at once
  with UNAVAILABLE (HTTP 503) instead of waiting without bound.
* `num_batch_threads` threads run batches, shared by all queues. A thread
  takes a queue's first batch once it is closed (a later batch exists), full,
  or its oldest task has waited `batch_timeout_micros`. With the default
  timeout of 0 a lone request runs at once and batches form only while the
  threads are busy: batching adapts to load instead of adding fixed latency.
* A batch is padded up to the smallest `allowed_batch_sizes` entry by
  repeating its first row (real data, so padding never feeds the model values
  it could trip on), and outputs are split back by row ranges.
* With `enable_large_batch_splitting`, batches hold up to
  `max_execution_batch_size` rows and a request (up to `max_batch_size` rows)
  that does not fit is split: its first rows fill the open batch, the rest
  open new batches; its outputs are concatenated back in order. The options
  guarantee that an idle queue can hold a request of `max_batch_size` rows,
  and when one part fails, the parts not yet run are dropped from their
  batches.

One queue exists per (servable version, signature, outputs, input dtypes and
per-row shapes): only requests that can be concatenated along dimension 0 meet
in a queue, so a request is never padded or refused for its neighbours' shapes
(TF Serving's `pad_variable_length_inputs` is therefore not needed).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from .cancellation import Cancellation
from .config import BatchingOptions
from .metrics import Metrics
from .status import DEADLINE_EXCEEDED, INTERNAL, ServingError, invalid_argument, unavailable

# run(merged inputs, the batch's cancellation) -> outputs
RunFn = Callable[[Mapping[str, np.ndarray], Cancellation], Mapping[str, np.ndarray]]


@dataclass(eq=False)
class _Task:
    inputs: Mapping[str, np.ndarray]
    size: int
    enqueued: float
    done: threading.Event = field(default_factory=threading.Event)
    result: dict[str, np.ndarray] | None = None
    error: BaseException | None = None
    cancelled: bool = False
    batch: _Running | None = None  # the batch that computes (or computed) this task


@dataclass(eq=False)
class _Running:
    """A batch being computed: once every request in it has given up, it is cancelled."""

    tasks: list[_Task]
    cancellation: Cancellation = field(default_factory=Cancellation)


@dataclass(eq=False)
class _Queue:
    model_name: str
    run: RunFn
    batches: collections.deque[list[_Task]] = field(default_factory=collections.deque)
    sizes: collections.deque[int] = field(default_factory=collections.deque)


def batch_size_of(inputs: Mapping[str, np.ndarray]) -> int:
    """Rows in a request: dimension 0, which every input must share."""
    sizes = set()
    for key, array in inputs.items():
        if array.ndim == 0:
            raise invalid_argument(f"Batching Run() input tensors must have at least one "
                                   f"dimension; input '{key}' is a scalar")
        sizes.add(array.shape[0])
    if len(sizes) > 1:
        raise invalid_argument("Batching Run() input tensors must have equal 0th-dimension "
                               "size; got " + ", ".join(
                                   f"'{k}': {a.shape[0]}" for k, a in inputs.items()))
    return sizes.pop() if sizes else 0


class BatchScheduler:
    def __init__(self, options: BatchingOptions, metrics: Metrics):
        self.options = options
        self.metrics = metrics
        self._timeout = options.batch_timeout_micros / 1e6
        self._cond = threading.Condition()
        self._queues: dict[Hashable, _Queue] = {}
        self._closing = False
        self._threads = [threading.Thread(target=self._worker, name=f"batch-{i}", daemon=True)
                         for i in range(options.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    # -- callers -----------------------------------------------------------------
    def run(self, key: Hashable, model_name: str, run: RunFn,
            inputs: Mapping[str, np.ndarray], deadline: float | None) -> dict[str, np.ndarray]:
        """Run `inputs` as part of a merged batch and return this request's rows.

        `key` must identify everything that makes requests mergeable (see the
        module doc); `run` is called with the merged inputs."""
        size = batch_size_of(inputs)
        if size > self.options.max_batch_size:
            raise invalid_argument(f"Task size {size} is larger than maximum input batch size "
                                   f"{self.options.max_batch_size}")
        with self._cond:
            if self._closing:
                raise unavailable("the server is shutting down")
            tasks = self._enqueue(key, model_name, run, inputs, size)
            self.metrics.enqueued_tasks.add(len(tasks), model_name)
            self._cond.notify_all()
        for task in tasks:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not task.done.wait(timeout):
                self._cancel(tasks)
                if not task.done.is_set():
                    raise ServingError(DEADLINE_EXCEEDED, "Deadline exceeded while the request "
                                                          "waited for or ran in a batch")
            if task.error is not None:
                # The request has failed: its other parts must not run, nor hold
                # rows of batches that other requests are waiting in.
                self._cancel(tasks)
                raise task.error
        results = [t.result for t in tasks]
        assert all(r is not None for r in results)
        if len(results) == 1:
            return results[0]  # type: ignore[return-value]
        return {k: np.concatenate([r[k] for r in results]) for k in results[0]}  # type: ignore

    def _cancel(self, tasks: list[_Task]) -> None:
        """Leave `tasks` out of the batches not yet taken; a batch already computing is
        cancelled once none of its requests waits for it any more (else it runs on and
        their rows are dropped)."""
        stop = []
        with self._cond:
            for task in tasks:
                task.cancelled = True
                running = task.batch
                if running is not None and all(t.cancelled for t in running.tasks):
                    stop.append(running.cancellation)
        for cancellation in stop:
            cancellation.cancel()

    def _enqueue(self, key: Hashable, model_name: str, run: RunFn,
                 inputs: Mapping[str, np.ndarray], size: int) -> list[_Task]:
        """Under the lock: put a request into the queue of `key` as one task, or as
        several with large batch splitting; refuse it if that needs too many
        batches. The queue is created only once the request is in it: a refused
        request must not leave an empty queue behind (one per key, for good)."""
        queue = self._queues.get(key)
        batches = len(queue.batches) if queue is not None else 0
        limit = self.options.batch_limit
        room = limit - queue.sizes[-1] if queue is not None and batches else 0
        if size <= room or not self.options.enable_large_batch_splitting:
            parts = [size]
        else:
            rest = size - room
            parts = [room] if room else []
            parts += [limit] * (rest // limit) + ([rest % limit] if rest % limit else [])
        joins_open = batches > 0 and parts[0] <= room
        new_batches = len(parts) - joins_open
        if batches + new_batches > self.options.max_enqueued_batches:
            self.metrics.queue_full.inc(model_name)
            raise unavailable("The batch scheduling queue to which this task was submitted "
                              f"is full: {batches} batch(es) of up to {limit} rows are "
                              f"waiting, the task needs {new_batches} more, and "
                              f"max_enqueued_batches is {self.options.max_enqueued_batches}")
        if queue is None:
            queue = self._queues[key] = _Queue(model_name, run)
        now, offset, tasks = time.monotonic(), 0, []
        for n in parts:
            part = inputs if len(parts) == 1 else {
                k: a[offset:offset + n] for k, a in inputs.items()}
            task = _Task(part, n, now)
            if joins_open and not tasks:
                queue.batches[-1].append(task)
                queue.sizes[-1] += n
            else:
                queue.batches.append([task])
                queue.sizes.append(n)
            tasks.append(task)
            offset += n
        return tasks

    def stop(self) -> None:
        """Run what is queued, then stop the threads."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    # -- batch threads -------------------------------------------------------------
    def _next_batch(self) -> tuple[_Queue, list[_Task]] | None:
        """Under the lock: wait for a ready batch and take it; None once stopped."""
        while True:
            now = time.monotonic()
            ready: tuple[float, Hashable] | None = None
            wake = None
            for key, queue in self._queues.items():
                if not queue.batches:
                    continue
                first = queue.batches[0]
                oldest = first[0].enqueued
                due = oldest + self._timeout
                if (len(queue.batches) > 1 or queue.sizes[0] >= self.options.batch_limit
                        or due <= now or self._closing):
                    if ready is None or oldest < ready[0]:
                        ready = (oldest, key)
                else:
                    wake = due if wake is None else min(wake, due)
            if ready is not None:
                queue = self._queues[ready[1]]
                batch = queue.batches.popleft()
                queue.sizes.popleft()
                self.metrics.enqueued_tasks.add(-len(batch), queue.model_name)
                if not queue.batches:  # versions come and go: do not keep dead queues
                    del self._queues[ready[1]]
                return queue, [t for t in batch if not t.cancelled]
            if self._closing:
                return None
            self._cond.wait(None if wake is None else max(0.0, wake - now))

    def _worker(self) -> None:
        while True:
            with self._cond:
                item = self._next_batch()
            if item is None:
                return
            queue, tasks = item
            if tasks:
                self._process(queue, tasks)

    def _process(self, queue: _Queue, tasks: list[_Task]) -> None:
        total = sum(t.size for t in tasks)
        padded = next((b for b in self.options.allowed_batch_sizes if b >= total), total)
        running = _Running(tasks)
        with self._cond:
            for task in tasks:
                task.batch = running
            given_up = all(t.cancelled for t in tasks)  # (all of them since being taken)
        if given_up:
            running.cancellation.cancel()
        try:
            merged = {}
            for key in tasks[0].inputs:
                parts = [t.inputs[key] for t in tasks]
                if padded > total:
                    parts.append(np.repeat(parts[0][:1], padded - total, axis=0))
                merged[key] = parts[0] if len(parts) == 1 else np.concatenate(parts)
            self.metrics.batch_size.observe(padded, queue.model_name)
            self.metrics.padding_size.observe(padded - total, queue.model_name)
            outputs = queue.run(merged, running.cancellation)
            for key, array in outputs.items():
                if np.ndim(array) == 0 or array.shape[0] != padded:
                    raise ServingError(INTERNAL, f"Batched output tensor '{key}' has 0th "
                                                 f"dimension {np.shape(array)[:1]}; expected "
                                                 f"{padded} (the batch size)")
        except BaseException as e:  # every task of the batch gets the model's error
            for task in tasks:
                task.error = e
                task.done.set()
            return
        offset = 0
        for task in tasks:
            task.result = {k: v[offset:offset + task.size] for k, v in outputs.items()}
            offset += task.size
            task.done.set()
