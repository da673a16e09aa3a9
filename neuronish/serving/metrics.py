"""Prometheus text exposition (format 0.0.4) of the server's counters.

Names and labels follow TF Serving's (servables/tensorflow/util.cc and its
batching session), exported the way its exporter turns `/tensorflow/serving/x`
into `:tensorflow:serving:x`, so dashboards built for TF Serving find them:

    :tensorflow:serving:request_count{model_name,status}                     counter
    :tensorflow:serving:request_latency{model_name,API,entrypoint}           histogram, µs
    :tensorflow:serving:batching_session:batch_size{model_name}              histogram
    :tensorflow:serving:batching_session:padding_size{model_name}            histogram
    :tensorflow:serving:batching_session:queue_full_count{model_name}        counter
    :neuronish:serving:batching_session:enqueued_tasks{model_name}           gauge

`status` is the TF status code name (`OK`, `NOT_FOUND`, ...); `API` is
`predict`, `classify`, `regress`, `get_model_metadata` or `get_model_status`;
`entrypoint` is `GRPC` or `REST`. A request for a model name the server has
never been configured with is counted under `model_name="<unknown>"`: clients
choose request names, and a series per name would let anyone grow this page
(and the server's memory) without bound. Two differences: latency buckets double from
100 µs (TF Serving's grow ×1.8 from 10 µs), and the last metric is this
server's own: tasks waiting in batch queues (TF's NumEnqueuedTasks). A task is
a request, or with large batch splitting one part of one, so a request split
over N batches counts N.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Sequence

LabelValues = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class _Scalar:
    """A value per label set, rendered as one Prometheus sample each."""

    kind = ""

    def __init__(self, name: str, help_text: str, label_names: Sequence[str]):
        self.name, self.help, self.label_names = name, help_text, tuple(label_names)
        self._values: dict[LabelValues, float] = {}
        self._lock = threading.Lock()

    def _add(self, amount: float, labels: LabelValues) -> None:
        with self._lock:
            self._values[labels] = self._values.get(labels, 0) + amount

    def value(self, *labels: str) -> float:
        with self._lock:
            return self._values.get(labels, 0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        lines += [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]
        return lines


class Counter(_Scalar):
    kind = "counter"

    def inc(self, *labels: str, amount: float = 1) -> None:
        self._add(amount, labels)


class Gauge(_Scalar):
    kind = "gauge"

    def add(self, amount: float, *labels: str) -> None:
        self._add(amount, labels)


class Histogram:
    def __init__(self, name: str, help_text: str, label_names: Sequence[str],
                 buckets: Sequence[float]):
        self.name, self.help, self.label_names = name, help_text, tuple(label_names)
        self.buckets = tuple(sorted(buckets))
        # labels -> (per-bucket counts (last = +Inf), sum)
        self._series: dict[LabelValues, tuple[list[int], list[float]]] = {}
        self._lock = threading.Lock()

    def observe(self, value: float, *labels: str) -> None:
        index = bisect.bisect_left(self.buckets, value)
        with self._lock:
            counts, total = self._series.setdefault(
                labels, ([0] * (len(self.buckets) + 1), [0.0]))
            counts[index] += 1
            total[0] += value

    def count(self, *labels: str) -> int:
        with self._lock:
            series = self._series.get(labels)
            return sum(series[0]) if series else 0

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, (list(c), s[0])) for k, (c, s) in self._series.items())
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for labels, (counts, total) in items:
            cumulative = 0
            bounds = [*(_number(b) for b in self.buckets), "+Inf"]
            for bound, n in zip(bounds, counts):
                cumulative += n
                le = 'le="' + bound + '"'
                lines.append(f"{self.name}_bucket{_labels(self.label_names, labels, le)} "
                             f"{cumulative}")
            lines.append(f"{self.name}_sum{_labels(self.label_names, labels)} {_number(total)}")
            lines.append(f"{self.name}_count{_labels(self.label_names, labels)} {cumulative}")
        return lines


# Latency buckets in µs: 100 µs .. ~100 s, ×2 (TF Serving's are exponential too).
_LATENCY_BUCKETS = [100 * 2 ** i for i in range(21)]
_BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]


UNKNOWN_MODEL = "<unknown>"


class Metrics:
    """Everything the server counts; one instance per process."""

    def __init__(self, known_model: Callable[[str], bool] = lambda name: True) -> None:
        self.known_model = known_model
        self.request_count = Counter(
            ":tensorflow:serving:request_count", "The total number of requests.",
            ("model_name", "status"))
        self.request_latency = Histogram(
            ":tensorflow:serving:request_latency",
            "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
            ("model_name", "API", "entrypoint"), _LATENCY_BUCKETS)
        self.batch_size = Histogram(
            ":tensorflow:serving:batching_session:batch_size",
            "Rows per merged batch handed to the model (after padding).",
            ("model_name",), _BATCH_BUCKETS)
        self.padding_size = Histogram(
            ":tensorflow:serving:batching_session:padding_size",
            "Padding rows added to reach an allowed batch size.",
            ("model_name",), [0, *_BATCH_BUCKETS])
        self.queue_full = Counter(
            ":tensorflow:serving:batching_session:queue_full_count",
            "Requests refused because the batch queue was full.", ("model_name",))
        self.enqueued_tasks = Gauge(
            ":neuronish:serving:batching_session:enqueued_tasks",
            "Tasks (requests, or parts of split requests) waiting in batch queues, not yet "
            "taken by a batch thread.", ("model_name",))

    def record_request(self, model: str, api: str, entrypoint: str, status: str,
                       micros: float) -> None:
        if not self.known_model(model):
            model = UNKNOWN_MODEL
        self.request_count.inc(model, status)
        self.request_latency.observe(micros, model, api, entrypoint)

    def render(self) -> str:
        lines: list[str] = []
        for metric in (self.request_count, self.request_latency, self.batch_size,
                       self.padding_size, self.queue_full, self.enqueued_tasks):
            lines += metric.render()
        from neuronish import fallback  # NeuronOps running on TensorFlow, if any

        if fallback.fallback_counts():
            lines += fallback.prometheus_lines()
        from neuronish import device_tools  # per-core utilisation and device memory

        lines += device_tools.prometheus_lines()
        return "\n".join(lines) + "\n"
