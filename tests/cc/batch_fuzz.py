"""Differential fuzzer for batch safety: random small graphs with a free batch, compiled at
batch 1 and 2, run at batches 1, 2, 3 and 5 and compared with TensorFlow.

A compiled model splits a call into chunks of its compiled batch; that is right only for
graphs that treat every sample on its own. The ops below include the classes that used
to slip through (the batch size read as a value, ops along the batch axis that keep its
shape, [B, B] products contracted back, gathers across rows, pad-then-stride) next to
per-sample ops, alone and composed. Many graphs share one SavedModel (one output each)
so that a run of thousands stays affordable; each is judged on its own output.

    python -m tests.cc.batch_fuzz --graphs 2000 --seed 0     # the long run
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SHAPE = (4, 6)  # every op maps [b, 4, 6] to [b', 4, 6]
CALL_BATCHES = (1, 2, 3, 5)
COMPILE_BATCHES = (1, 2)

Op = Callable[[object], object]


@dataclass(frozen=True)
class FuzzOp:
    fn: Op
    per_sample: bool  # treats every sample on its own (else it mixes them)
    keeps_batch: bool  # returns as many rows as it takes (may be followed by more ops)


def _ops() -> dict[str, FuzzOp]:
    """Every op the fuzzer composes, by name; built lazily so that importing this module
    does not import TensorFlow."""
    import tensorflow as tf

    w = tf.constant(np.random.default_rng(7).normal(size=(6, 6)).astype(np.float32))

    def bsize(x: object) -> object:
        return tf.cast(tf.shape(x)[0], tf.float32)

    def flat(x: object) -> object:
        return tf.reshape(x, [tf.shape(x)[0], 24])

    def unflat(y: object) -> object:
        return tf.reshape(y, [-1, 4, 6])

    per_sample: dict[str, Op] = {
        "relu": tf.nn.relu,
        "tanh": tf.tanh,
        "affine": lambda x: x * 1.5 - 0.25,
        "square_exp": lambda x: tf.exp(-x * x),
        "softmax_last": lambda x: tf.nn.softmax(x, -1),
        "softmax_axis1": lambda x: tf.nn.softmax(x, 1),
        "mean_axis2": lambda x: x - tf.reduce_mean(x, 2, keepdims=True),
        "max_axis1": lambda x: x + tf.reduce_max(x, 1, keepdims=True),
        "transpose_twice": lambda x: tf.transpose(tf.transpose(x, [0, 2, 1]) * 2.0, [0, 2, 1]),
        "flatten_roundtrip": lambda x: unflat(tf.nn.relu(flat(x))),
        "matmul_weight": lambda x: tf.matmul(x, w),
        "einsum_weight": lambda x: tf.einsum("bij,jk->bik", x, w),
        "cumsum_axis1": lambda x: tf.cumsum(x, 1),
        "reverse_axis2": lambda x: tf.reverse(x, [2]),
        "roll_axis2": lambda x: tf.roll(x, 1, 2),
        "shift_axis1": lambda x: tf.pad(x, [[0, 0], [1, 0], [0, 0]])[:, :-1],
        "gather_axis2": lambda x: tf.gather(x, [5, 4, 3, 2, 1, 0], axis=2),
        "slice_concat": lambda x: tf.concat([x[:, :, 3:], x[:, :, :3]], 2),
        "tile_slice": lambda x: tf.tile(x, [1, 2, 1])[:, 2:6],
        "layer_norm": lambda x: (x - tf.reduce_mean(x, -1, keepdims=True)) * tf.math.rsqrt(
            tf.math.reduce_variance(x, -1, keepdims=True) + 1e-3),
        "zeros_state": lambda x: x + tf.zeros([tf.shape(x)[0], 4, 6]),
        "positions": lambda x: x + tf.cast(tf.range(tf.shape(x)[2]), tf.float32),
        "feature_count": lambda x: x / tf.cast(tf.shape(x)[2], tf.float32),
        "batched_gram": lambda x: tf.matmul(tf.matmul(x, x, transpose_b=True), x) * 0.1,
        "bmm_rows": lambda x: tf.einsum("bij,bkj->bik", x, x)[:, :, :4] @ tf.ones([4, 6]),
        "conv1d": lambda x: tf.nn.conv1d(x, tf.ones([3, 6, 6]) * 0.1, 1, "SAME"),
        "full_slice": lambda x: x[: tf.shape(x)[0]],
        "dilated_conv": lambda x: tf.nn.convolution(x, tf.ones([3, 6, 6]) * 0.1, padding="SAME",
                                                    dilations=[2]),  # via SpaceToBatchND
        "silu": tf.nn.silu,  # a custom gradient: IdentityN with an output nothing reads
        "gelu_approx": lambda x: tf.nn.gelu(x, approximate=True),
        "attention": lambda x: tf.einsum("bqk,bkd->bqd", tf.nn.softmax(
            tf.einsum("bqd,bkd->bqk", x, x) * 0.3, -1), x),
        "top_k_last": lambda x: tf.concat([tf.math.top_k(x, 3).values, x[:, :, 3:]], 2),
        "one_hot_argmax": lambda x: x + tf.one_hot(tf.argmax(x, 2), 6),
        "batch_norm": lambda x: tf.reshape(tf.compat.v1.nn.fused_batch_norm(
            tf.reshape(x, [-1, 4, 6, 1]), tf.ones([1]), tf.zeros([1]), tf.zeros([1]),
            tf.ones([1]), is_training=False)[0], [-1, 4, 6]),
    }
    mixing: dict[str, Op] = {
        "times_batch": lambda x: tf.tanh(x) * bsize(x),
        "size_value": lambda x: x / tf.cast(tf.size(x), tf.float32),
        "gather_shape0": lambda x: x * tf.cast(tf.gather(tf.shape(x), 0), tf.float32),
        "range_offsets": lambda x: x + tf.cast(tf.range(tf.shape(x)[0]) * 4, tf.float32)[
            :, None, None],
        "cumsum_batch": lambda x: tf.cumsum(x, 0),
        "cumprod_batch": lambda x: tf.math.cumprod(x * 0.5, 0),
        "sort_batch": lambda x: tf.sort(x, 0),
        "reverse_batch": lambda x: tf.reverse(x, [0]),
        "slice_reverse": lambda x: x[::-1],
        "roll_batch": lambda x: tf.roll(x, 1, 0),
        "softmax_batch": lambda x: tf.nn.softmax(x, 0),
        "softmax_batch_t": lambda x: tf.transpose(tf.nn.softmax(tf.transpose(x, [1, 0, 2]),
                                                                 1), [1, 0, 2]),
        "shift_pad": lambda x: tf.pad(x, [[1, 0], [0, 0], [0, 0]])[:-1],
        "shift_concat": lambda x: tf.concat([tf.zeros_like(x[:1]), x[:-1]], 0),
        "batch_as_space": lambda x: tf.nn.conv1d(tf.transpose(x, [1, 0, 2]),
                                                 tf.ones([3, 6, 6]) * 0.1, 1, "SAME")[
            :, :, :] * 1.0 + tf.transpose(tf.zeros_like(x), [1, 0, 2]),
        "gram_sum": lambda x: x + tf.reduce_sum(tf.matmul(flat(x), flat(x), transpose_b=True),
                                                0)[:, None, None] * 0.01,
        "gram_matmul": lambda x: unflat(tf.matmul(tf.matmul(flat(x), flat(x),
                                                            transpose_b=True), flat(x)) * 0.01),
        "gram_argmax": lambda x: tf.gather(x, tf.argmax(tf.matmul(flat(x), flat(x),
                                                                  transpose_b=True), 1)),
        "outer_diff": lambda x: x + tf.reduce_sum(
            tf.reduce_mean(x, [1, 2])[:, None] - tf.reduce_mean(x, [1, 2])[None, :], 1)[
            :, None, None],
        "gather_rows": lambda x: tf.gather(x, tf.zeros([tf.shape(x)[0]], tf.int32)),
        "gather_nd_rows": lambda x: tf.gather_nd(x, tf.zeros([tf.shape(x)[0], 1], tf.int32)),
        "mean_batch": lambda x: x - tf.reduce_mean(x, 0, keepdims=True),
        "first_sample": lambda x: x + x[:1],
        "take_two": lambda x: x[:2],
        "pad_stride": lambda x: tf.pad(x, [[0, 2], [0, 0], [0, 0]])[::2],
    }
    ops = {k: FuzzOp(v, True, True) for k, v in per_sample.items()}
    ops.update({k: FuzzOp(v, False, k not in ("take_two", "pad_stride"))
                for k, v in mixing.items()})
    return ops


@dataclass
class Case:
    name: str
    chain: list[str]


def cases(count: int, seed: int) -> list[Case]:
    """Every op alone first, then random chains of 2-4 ops (a batch-changing op only
    last)."""
    ops = _ops()
    names = sorted(ops)
    rng = random.Random(seed)
    out = [Case(f"single:{n}", [n]) for n in names][:count]
    while len(out) < count:
        keep = [n for n in names if ops[n].keeps_batch]
        chain = [rng.choice(keep) for _ in range(rng.randint(1, 3))]
        chain.append(rng.choice(names))
        if _tensorflow_runs(chain, ops):
            out.append(Case("chain:" + "+".join(chain), chain))
    return out


def _tensorflow_runs(chain: list[str], ops: dict[str, FuzzOp]) -> bool:
    """Whether TensorFlow itself runs the chain at every call batch (a few compositions
    break shapes, e.g. a strided batch fed to an op expecting [b, 4, 6])."""
    import tensorflow as tf

    try:
        for b in CALL_BATCHES:
            y = tf.zeros([b, *SHAPE])
            for op in chain:
                y = ops[op].fn(y)
    except (tf.errors.OpError, ValueError):
        return False
    return True


@dataclass
class Report:
    graphs: int = 0
    silent: list[str] = field(default_factory=list)  # wrong numbers or shapes, no error
    errors: list[str] = field(default_factory=list)  # a call TensorFlow runs that we refused
    placement: Counter = field(default_factory=Counter)  # chunked / partly on TensorFlow
    # case -> the compile batches at which some of its nodes stayed on TensorFlow
    on_tensorflow: dict[str, list[int]] = field(default_factory=dict)

    def summary(self) -> str:
        return (f"{self.graphs} graphs x {len(COMPILE_BATCHES)} compile batches: "
                f"{len(self.silent)} silent mismatches, {len(self.errors)} refused calls; "
                + ", ".join(f"{k} {v}" for k, v in sorted(self.placement.items())))


def run(graph_cases: list[Case], workdir: Path, report: Report, per_model: int = 25) -> None:
    """Compile and compare every case; results accumulate in `report`."""
    for start in range(0, len(graph_cases), per_model):
        _run_model(graph_cases[start:start + per_model], workdir / f"m{start}", report)


def _run_model(group: list[Case], workdir: Path, report: Report) -> None:
    import tensorflow as tf

    import neuronish

    ops = _ops()

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, *SHAPE], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict:
            outs = {}
            for i, case in enumerate(group):
                with tf.name_scope(f"g{i}"):
                    y = x
                    for op in case.chain:
                        y = ops[op].fn(y)
                    outs[f"g{i}"] = tf.identity(y)
            return outs

    src = workdir / "model"
    model = Model()
    tf.saved_model.save(model, str(src), signatures={"serving_default": model.serve})
    reference = tf.saved_model.load(str(src)).signatures["serving_default"]
    rng = np.random.default_rng(len(report.silent) + report.graphs)
    feeds = {b: rng.normal(size=(b, *SHAPE)).astype(np.float32) for b in CALL_BATCHES}
    expected = {b: reference(x=tf.constant(v)) for b, v in feeds.items()}
    report.graphs += len(group)
    for cb in COMPILE_BATCHES:
        dst = workdir / f"compiled{cb}"
        rep = neuronish.saved_model.compile(str(src), str(dst), batch_size=cb)
        left = {n.split("/")[0] for n in rep.get("OnTensorFlowNodes", {})}
        compiled = tf.saved_model.load(str(dst)).signatures["serving_default"]
        for i, case in enumerate(group):
            report.placement["partly on TensorFlow" if f"g{i}" in left else "on device"] += 1
            if f"g{i}" in left:
                report.on_tensorflow.setdefault(case.name, []).append(cb)
        for b, x in feeds.items():
            try:
                got = compiled(x=tf.constant(x))
            except Exception as e:  # noqa: BLE001 (a refused call is counted, not raised)
                report.errors.append(f"compiled at {cb}, called at {b}: "
                                     f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            for i, case in enumerate(group):
                want, have = expected[b][f"g{i}"].numpy(), got[f"g{i}"].numpy()
                if want.shape != have.shape or not np.allclose(want, have, rtol=1e-4,
                                                               atol=1e-4):
                    diff = (float(np.max(np.abs(want - have))) if want.shape == have.shape
                            else f"shape {list(have.shape)} for {list(want.shape)}")
                    report.silent.append(f"{case.name}: compiled at {cb}, called at {b}: "
                                         f"{diff}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-model", type=int, default=25)
    args = p.parse_args(argv)
    report = Report()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="batch-fuzz-") as d:
        run(cases(args.graphs, args.seed), Path(d), report, args.per_model)
    print(report.summary(), f"({time.perf_counter() - began:.0f} s)")
    print(json.dumps({"silent": report.silent[:50], "errors": report.errors[:50]}, indent=1))
    return 1 if report.silent else 0


if __name__ == "__main__":
    sys.exit(main())
