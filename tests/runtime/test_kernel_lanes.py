"""Kernels that split their blocks over host threads ("lanes", runtime/kernels/parallel.py).

The scheduler must run every block exactly once, never give two blocks to one
lane at the same time (lanes own their scratch), and return only after every
lane has stopped, raising the first error. The depthwise convolution, which
uses it, must give TensorFlow's result whatever the lane count.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

from neuronish.runtime import isa
from neuronish.runtime.kernels import parallel
from neuronish.runtime.kernels.common import lane_slices
from tests.runtime.test_kernels import DEPTHWISE_CASES, close, explicit_pads, randn, run, tf_conv


@pytest.fixture
def lanes(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """`request.param` lanes for the test, on a pool of exactly `request.param - 1`
    helpers of its own (the process-wide pool only ever grows)."""
    pool = ThreadPoolExecutor(max_workers=request.param - 1)
    monkeypatch.setattr(parallel, "_pool", pool)
    monkeypatch.setattr(parallel, "_lanes", request.param)
    yield request.param
    pool.shutdown(wait=True)


@pytest.fixture
def lanes_used(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lane count of every `for_each_block` call a kernel makes."""
    calls: list[int] = []
    real = parallel.for_each_block

    def spy(work, blocks, lanes_used: int) -> None:
        calls.append(min(lanes_used, len(blocks)))
        real(work, blocks, lanes_used)

    monkeypatch.setattr(parallel, "for_each_block", spy)
    return calls


@pytest.mark.parametrize("lanes", [2, 3], indirect=True)
def test_every_block_runs_once_and_a_lane_runs_one_block_at_a_time(lanes: int) -> None:
    ran: Counter = Counter()
    busy = [threading.Lock() for _ in range(lanes)]
    guard = threading.Lock()

    def work(lane: int, block: int) -> None:
        assert 0 <= lane < lanes
        assert busy[lane].acquire(blocking=False), f"lane {lane} given two blocks at once"
        try:
            np.dot(np.ones((64, 64)), np.ones((64, 64)))  # releases the GIL for a moment
            with guard:
                ran[block] += 1
        finally:
            busy[lane].release()

    parallel.for_each_block(work, list(range(200)), lanes)
    assert ran == Counter(range(200))


@pytest.mark.parametrize("lanes", [3], indirect=True)
def test_an_error_in_any_lane_is_raised_after_every_lane_stopped(lanes: int) -> None:
    guard = threading.Lock()
    started, finished = [], []

    def work(lane: int, block: int) -> None:
        with guard:
            started.append(block)
        if block == 5:
            raise ValueError("block 5 failed")
        threading.Event().wait(0.001)
        with guard:
            finished.append(block)

    with pytest.raises(ValueError, match="block 5 failed"):
        parallel.for_each_block(work, list(range(100)), lanes)
    # Nothing still runs after the return: every block that started, but the failed
    # one, has finished; and the lanes stopped taking new blocks.
    assert sorted(started) == sorted([*finished, 5])
    assert len(started) < 100


@pytest.mark.parametrize("lanes", [2], indirect=True)
def test_a_busy_pool_does_not_hold_up_the_caller(lanes: int) -> None:
    # Another program's kernel holds the only helper; the caller does every block
    # itself and returns without waiting for that kernel.
    helper_busy, release = threading.Event(), threading.Event()

    def hold(lane: int, block: int) -> None:
        if lane == 1:
            helper_busy.set()
        release.wait()

    holder = threading.Thread(target=parallel.for_each_block, args=(hold, [0, 1], 2))
    holder.start()
    try:
        assert helper_busy.wait(10), "the pool's helper never started"
        done: list = []
        caller = threading.Thread(target=parallel.for_each_block, args=(
            lambda lane, b: done.append((lane, b)), list(range(10)), 2))
        caller.start()
        caller.join(10)
        assert not caller.is_alive(), "the caller waited for the busy helper"
        assert sorted(b for _, b in done) == list(range(10))
        assert {lane for lane, _ in done} == {0}
    finally:
        release.set()
        holder.join()


@pytest.mark.parametrize("lanes", [2, 3], indirect=True)
@pytest.mark.parametrize("xs,ws,strides,dilations,padding", DEPTHWISE_CASES)
def test_depthwise_on_lanes_matches_tf(lanes: int, xs: tuple, ws: tuple, strides: list,
                                      dilations: list, padding: str, lanes_used: list[int],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isa, "TAP_BLOCK_BYTES", 4096)  # several blocks for every lane
    x, w, b = randn(*xs), randn(*ws), randn(ws[2] * ws[3])
    attrs = {"strides": strides, "dilations": dilations, "activation": "relu6",
             "pads": explicit_pads(padding, x, w, strides, dilations)}
    want = tf.nn.relu6(tf.nn.bias_add(tf_conv(x, w, strides, dilations, padding,
                                              depthwise=True), b))
    close(run("depthwise_conv2d", [x, w, b], attrs), want, rtol=1e-4, atol=1e-5)
    assert max(lanes_used) > 1, "the kernel ran on one lane only"


@pytest.mark.parametrize("lanes", [2], indirect=True)
def test_depthwise_on_lanes_in_float16(lanes: int, lanes_used: list[int],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # float16 accumulates in float32 scratch: the lanes' accumulators must not overlap.
    monkeypatch.setattr(isa, "TAP_BLOCK_BYTES", 4096)
    x, w = randn(2, 9, 8, 4, dtype=np.float16), randn(3, 3, 4, 1, dtype=np.float16)
    attrs = {"strides": [2, 2], "dilations": [1, 1], "activation": "none",
             "pads": explicit_pads("SAME", x, w, [2, 2], [1, 1])}
    want = tf.nn.depthwise_conv2d(x, w, [1, 2, 2, 1], "SAME")
    close(run("depthwise_conv2d", [x, w], attrs), want, rtol=1e-2, atol=1e-2)
    assert lanes_used == [2]


@pytest.mark.parametrize("region_size, lanes_used, size", [(1000, 3, 300), (96, 2, 48),
                                                             (64, 4, 16), (50, 1, 50)])
def test_lane_slices_are_disjoint_pieces_of_the_region(region_size: int, lanes_used: int,
                                                       size: int) -> None:
    region = np.zeros(region_size, np.float32)
    pieces = lane_slices(region, lanes_used, size)
    assert len(pieces) == lanes_used
    for i, piece in enumerate(pieces):
        assert piece.size == size and np.shares_memory(piece, region)
        for other in pieces[i + 1:]:
            assert not np.shares_memory(piece, other)


def test_each_running_program_gets_its_own_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("_pool", "_pool_size", "_lanes"):  # restored after the test
        monkeypatch.setattr(parallel, name, getattr(parallel, name))
    monkeypatch.setattr(parallel, "_pool", None)
    monkeypatch.setattr(parallel, "_pool_size", 0)
    parallel.configure(2, programs=3)
    assert parallel.lanes() == 2 and parallel._pool._max_workers == 3  # noqa: SLF001
    parallel.configure(1)
    assert parallel.lanes() == 1 and parallel._pool._max_workers == 3  # never shrinks
    parallel._pool.shutdown()  # noqa: SLF001
