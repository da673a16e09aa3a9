"""Issue 25's figures in one run: the NeuronOp on the C runtime (no GIL) against the same
op through the Python runtime and against TensorFlow, in one Python process.

    python benchmarks/capi_binding.py [--rounds 5] [--chain 100] [--short-chain 10]
                                      [--skip-c-host] [--latency-only]

1. Latency. A 16x16 MatMul + Relu at batch 1 (weights scaled so values stay finite),
   compiled at batch 1; a tf.function chains `--chain` calls (y feeds the next x), so
   TensorFlow's executor, not Python, makes the calls: per-call time = chain time /
   chain. That figure carries each chain's fixed cost (the tf.function call from Python
   and the executor's step: about 200 us on 2 vCPUs, so 2 us of every "call" in a chain
   of 100), so the marginal cost of one call is printed as well: the slope between
   chains of `--short-chain` and `--chain` calls, (T(chain) - T(short)) / (chain - short).
   Three setups of one graph: the compiled SavedModel with its NeuronOp on the
   C runtime (the default), the same loaded with NEURONISH_KERNEL=python (every call
   takes the GIL and goes through kernel_bridge.py), and TensorFlow on the original.
   Then examples/c/latency.py (TensorFlow's C API host, native op library), unless
   --skip-c-host (printed last, as 4). `--latency-only` stops after this figure.
2. Concurrency. The same chained tiny model and a small CNN (two 3x3 convolutions,
   pooling, a dense layer) called by 1 and by 8 Python threads of this process:
   throughput ratio 8 callers / 1. The CNN twice: one call per tf.function (a caller
   waits for each result) and 8 independent calls per tf.function (TensorFlow's executor
   may run them side by side, so "1 caller" is already 8 calls in flight).
   2b (unless --skip-c-host): the tiny model and the small CNN in a host without Python,
   examples/c/tf_saved_model.c -T 8 (one session, TF_SessionRun from 1 and 8 threads).
3. Pipelining, at the runtime level: four chained 64x1024 @ 1024x1024 matmuls compiled
   with pipeline_cores=2 on a 2-core device (one host thread per core, group size 2)
   against the same graph compiled for one core on a 1-core group (groups `1,1`, one
   copy), 8 caller threads: throughput ratio, on the C runtime (ctypes releases the GIL
   for each call; the stages hand off in C++) and on the Python runtime.

5. `neuronish.runtime.load` (a binding over the C runtime): per `run` call on the C
   runtime against the same executable loaded with runtime="python", at batch 1 and at a
   split batch 9, and 8 caller threads / 1.

Every figure is the median over rounds, the setups alternating round by round; outputs
are checked first. Prints the load average before and after and the CPU flags that
matter: on a shared machine the ratios are indicative only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _median_rate(fns: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Each fn runs one round and returns its figure; alternated, medians."""
    got: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for key in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            got[key].append(fns[key]())
    return {k: statistics.median(v) for k, v in got.items()}


def _threads_rate(call: Callable[[], None], callers: int, seconds: float) -> float:
    """Calls per second of `callers` threads calling `call` back to back for `seconds`."""
    stop = time.perf_counter() + seconds
    counts = [0] * callers

    def work(i: int) -> None:
        while time.perf_counter() < stop:
            call()
            counts[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in range(callers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def _save_and_compile(tf, module, tmp: Path, name: str, batch: int) -> tuple[str, str]:  # noqa: ANN001
    import neuronish.saved_model

    src, out = tmp / f"{name}-src", tmp / f"{name}-compiled"
    tf.saved_model.save(module, str(src), signatures=module.__call__)
    neuronish.saved_model.compile(str(src), str(out), batch_size=batch, minimum_segment_size=1)
    return str(src), str(out)


_KEEP: list = []


def _signature(tf, path: str):  # noqa: ANN001, ANN202
    """The SavedModel's serving signature."""
    loaded = tf.saved_model.load(path)
    _KEEP.append(loaded)  # (its variables must outlive the signature)
    return loaded.signatures["serving_default"]


_KERNEL = {"C runtime": "native", "Python runtime": "python", "TensorFlow": "native"}


def _first_call(setup: str, fn: Callable, arg: object) -> object:
    """`fn(arg)` with NEURONISH_KERNEL set for `setup`: each function's NeuronOps load at
    its first call and read the variable then (until 2026-11-27 it was set only while the
    SavedModels loaded, so the "Python runtime" rows of figures 1 and 2 ran on the C
    runtime as well)."""
    os.environ["NEURONISH_KERNEL"] = _KERNEL[setup]
    try:
        return fn(arg)
    finally:
        os.environ.pop("NEURONISH_KERNEL")


def tiny_and_cnn(args: argparse.Namespace, tmp: Path) -> None:
    import tensorflow as tf

    import neuronish  # noqa: F401 - registers the NeuronOp

    rng = np.random.default_rng(0)

    class Tiny(tf.Module):
        def __init__(self) -> None:
            self.w = tf.Variable((rng.standard_normal((16, 16)) * 0.35).astype(np.float32))
            self.__call__ = tf.function(
                lambda x: {"y": tf.nn.relu(tf.matmul(x, self.w))},
                input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])

    class Cnn(tf.Module):
        def __init__(self) -> None:
            def var(*shape: int) -> tf.Variable:
                return tf.Variable((rng.standard_normal(shape) * 0.1).astype(np.float32))
            self.k1, self.k2, self.w = var(3, 3, 3, 32), var(3, 3, 32, 64), var(16 * 16 * 64, 10)

            def f(x):  # noqa: ANN001, ANN202
                h = tf.nn.relu(tf.nn.conv2d(x, self.k1, 1, "SAME"))
                h = tf.nn.max_pool2d(h, 2, 2, "VALID")
                h = tf.nn.relu(tf.nn.conv2d(h, self.k2, 1, "SAME"))
                h = tf.nn.max_pool2d(h, 2, 2, "VALID")
                return {"y": tf.matmul(tf.reshape(h, [-1, 16 * 16 * 64]), self.w)}
            self.__call__ = tf.function(
                f, input_signature=[tf.TensorSpec([None, 64, 64, 3], tf.float32, name="x")])

    tiny_src, tiny_out = _save_and_compile(tf, Tiny(), tmp, "tiny", 1)
    cnn_src, cnn_out = _save_and_compile(tf, Cnn(), tmp, "cnn", 1)
    x = tf.constant(rng.standard_normal((1, 16)).astype(np.float32))
    img = tf.constant(rng.standard_normal((1, 64, 64, 3)).astype(np.float32))

    def chained(sig, n: int):  # noqa: ANN001, ANN202
        @tf.function(autograph=False)
        def run(v):  # noqa: ANN001, ANN202
            for _ in range(n):
                v = sig(x=v)["y"]
            return v
        return run

    def fanned(sig, n: int):  # noqa: ANN001, ANN202
        @tf.function(autograph=False)
        def run(v):  # noqa: ANN001, ANN202
            return tf.add_n([sig(x=v)["y"] for _ in range(n)])
        return run

    tiny = {"C runtime": _signature(tf, tiny_out), "Python runtime": _signature(tf, tiny_out),
            "TensorFlow": _signature(tf, tiny_src)}
    cnn = {"C runtime": _signature(tf, cnn_out), "Python runtime": _signature(tf, cnn_out),
           "TensorFlow": _signature(tf, cnn_src)}
    tiny_fns = {k: chained(s, args.chain) for k, s in tiny.items()}
    short_fns = {k: chained(s, args.short_chain) for k, s in tiny.items()}
    cnn_fns = {k: fanned(s, 8) for k, s in cnn.items()}
    cnn_one = {k: fanned(s, 1) for k, s in cnn.items()}
    want_t, want_c = tiny_fns["TensorFlow"](x).numpy(), cnn_fns["TensorFlow"](img).numpy()
    import gc

    from neuronish import kernel_bridge

    for k in tiny:
        before = {id(h) for h in gc.get_objects() if isinstance(h, kernel_bridge.Handle)}
        np.testing.assert_allclose(_first_call(k, tiny_fns[k], x).numpy(), want_t, rtol=1e-4,
                                   atol=1e-5)
        _first_call(k, short_fns[k], x)  # (its own NeuronOps, loaded on the same runtime)
        np.testing.assert_allclose(_first_call(k, cnn_fns[k], img).numpy(), want_c, rtol=1e-3,
                                   atol=1e-3)
        ran = sorted({("C" if h.native_entry else "Python") for h in gc.get_objects()
                      if isinstance(h, kernel_bridge.Handle) and id(h) not in before})
        print(f"{k}: outputs match TensorFlow (chain of {args.chain}: within 1e-4); its "
              f"NeuronOps loaded on: {', '.join(ran) or 'none (TensorFlow)'} runtime")

    def per_chain(fn) -> Callable[[], float]:  # noqa: ANN001
        def one() -> float:
            fn(x)
            t = time.perf_counter()
            for _ in range(args.calls):
                fn(x)
            return (time.perf_counter() - t) / args.calls * 1e6
        return one

    chains = _median_rate({f"{k}|{n}": per_chain(f) for n, fns in ((args.chain, tiny_fns),
                                                                   (args.short_chain, short_fns))
                           for k, f in fns.items()}, args.rounds)
    lat = {k: chains[f"{k}|{args.chain}"] / args.chain for k in tiny_fns}
    slope = {k: (chains[f"{k}|{args.chain}"] - chains[f"{k}|{args.short_chain}"])
             / (args.chain - args.short_chain) for k in tiny_fns}
    print(f"\n1. tiny model (16x16 matmul + relu, batch 1), per NeuronOp call in a chain of "
          f"{args.chain}, {args.calls} chains x {args.rounds} rounds; and the marginal call "
          f"(chains of {args.short_chain} and {args.chain}):")
    for k, us in lat.items():
        print(f"   {k:<15} {us:7.2f} us  ({us / lat['TensorFlow']:.2f}x TensorFlow); marginal "
              f"{slope[k]:6.2f} us ({slope[k] / slope['TensorFlow']:.2f}x); a chain's fixed "
              f"cost {chains[f'{k}|{args.chain}'] - args.chain * slope[k]:6.1f} us")

    if args.latency_only:
        return

    print(f"\n2. concurrency: throughput of 8 caller threads / 1, {args.seconds} s per round")
    for label, fns, arg, per in (("tiny (chain)", tiny_fns, x, args.chain),
                                 ("small CNN (1 call)", cnn_one, img, 1),
                                 ("small CNN (8 calls)", cnn_fns, img, 8)):
        rates = _median_rate({f"{k}|{n}": (lambda f=f, n=n, a=arg, p=per: _threads_rate(
            lambda: f(a), n, args.seconds) * p) for k, f in fns.items() for n in (1, 8)},
            args.rounds)
        for k in fns:
            one, eight = rates[f"{k}|1"], rates[f"{k}|8"]
            print(f"   {label:<20} {k:<15} 1 caller {one:9.0f} calls/s, 8 callers {eight:9.0f}"
                  f" calls/s: {eight / one:.2f}x")
    if not args.skip_c_host:
        c_host_concurrency(args, tmp, {"tiny": (tiny_out, tiny_src),
                                       "small CNN": (cnn_out, cnn_src)})


def c_host_concurrency(args: argparse.Namespace, tmp: Path,
                       models: dict[str, tuple[str, str]]) -> None:
    """Figure 2 in a host without Python: examples/c/tf_saved_model.c -T 8, one session
    called by 1 and by 8 threads (TF_SessionRun), the compiled model alternating with the
    original, each model's rounds' ratios' median. No GIL and no tf.function call between
    the callers and the NeuronOp: what is left is TensorFlow's session and our runtime."""
    from neuronish import native_op_library
    from tests.neuronish.test_op_library_c import _build_program, _run
    from tests.neuronish.test_op_library_c import _signature as graph_names

    program, library = _build_program(tmp / "tf_saved_model"), str(native_op_library.build())
    print(f"\n2b. the same in a host without Python (examples/c/tf_saved_model.c -T 8: one "
          f"session, TF_SessionRun from 1 and from 8 threads, {args.seconds} s per round, "
          f"5 rounds, compiled and original alternating):")
    for label, (compiled, original) in models.items():
        ins, outs = graph_names(Path(compiled))
        base_ins, base_outs = graph_names(Path(original))
        assert ins == base_ins, (ins, base_ins)
        [(key, x)] = ins.items()
        shape = "1,16" if label == "tiny" else "1,64,64,3"
        r = _run(program, "-l", library, "-T", "8", "-S", str(args.seconds), "-B", original,
                 compiled, f"{x}=float32:{shape}", "--", *outs.values(), "--",
                 *base_outs.values())
        if r.returncode != 0:
            print(f"   {label}: failed: {r.stderr[-1500:]}")
            continue
        rows = {line.split()[1]: line.split() for line in r.stdout.splitlines()
                if line.startswith("calls_per_s ")}
        for who, path in (("C runtime", compiled), ("TensorFlow", original)):
            _, _, _, one, _, many, _, ratio = rows[path]
            print(f"   {label:<20} {who:<15} 1 thread {float(one):9.0f} calls/s, 8 threads "
                  f"{float(many):9.0f} calls/s: {float(ratio):.2f}x")


def pipeline(args: argparse.Namespace) -> None:
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    from neuronish.cc.compiler import compile_graph
    from neuronish.runtime import Device, load
    from neuronish.runtime.capi import binding
    from neuronish.runtime.config import DeviceConfig

    rng = np.random.default_rng(0)
    ws = [tf.constant((rng.standard_normal((1024, 1024)) / 32).astype(np.float32))
          for _ in range(4)]

    @tf.function(input_signature=[tf.TensorSpec([64, 1024], tf.float32, name="x")])
    def chain(x):  # noqa: ANN001, ANN202
        for w in ws:
            x = tf.matmul(x, w)
        return tf.identity(x, name="y")

    graph = convert_variables_to_constants_v2(chain.get_concrete_function()).graph
    io = {"inputs": {"x:0": [[64, 1024], "float32"]}, "outputs": ["y:0"]}
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    want = chain(x).numpy()
    lib = binding.load_library()
    setups: dict[str, Callable[[], None]] = {}
    for label, cores, groups in (("1 core", 1, "1,1"), ("pipelined 2", 2, "2")):
        exe = compile_graph(graph.as_graph_def().SerializeToString(), io, pipeline_cores=cores)
        env = {"NEURONISH_NUM_CORES": "2", "NEURONISH_CORE_GROUP_SIZES": groups,
               "NEURONISH_CORE_THREADS": "1"}
        os.environ.update(env)  # the C device reads them when it opens
        cmodel = binding.Model(binding.Device(lib), exe)
        pymodel = load(exe, device=Device(DeviceConfig.from_env(env)))
        for m in (cmodel.run([x])[0], pymodel.run({"x:0": x})["y:0"]):
            np.testing.assert_allclose(m, want, rtol=1e-3, atol=1e-3)
        setups[f"C runtime|{label}"] = lambda m=cmodel: m.run([x])
        setups[f"Python runtime|{label}"] = lambda m=pymodel: m.run({"x:0": x})
    rates = _median_rate({k: (lambda f=f: _threads_rate(f, 8, args.seconds))
                          for k, f in setups.items()}, args.rounds)
    print("\n3. four 64x1024 @ 1024x1024 matmuls, 2-core device, 1 host thread per core, "
          "8 callers (outputs match TensorFlow):")
    for rt in ("C runtime", "Python runtime"):
        one, two = rates[f"{rt}|1 core"], rates[f"{rt}|pipelined 2"]
        print(f"   {rt:<15} 1 core {one:8.1f} calls/s, pipelined on 2 {two:8.1f} calls/s: "
              f"{two / one:.2f}x")


def runtime_binding(args: argparse.Namespace) -> None:
    """`neuronish.runtime.load`'s model on the C runtime (the default now) against the same
    executable on the Python runtime: per `run` call, a tiny model at batch 1 and a split
    call (batch 9 of a batch-1 model), and 8 caller threads / 1."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    from neuronish.cc.compiler import compile_graph
    from neuronish.runtime import load
    from neuronish.runtime.capi.native_model import NativeModel

    rng = np.random.default_rng(0)
    w = tf.constant((rng.standard_normal((16, 16)) / 4).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([1, 16], tf.float32, name="x")])
    def tiny(x):  # noqa: ANN001, ANN202
        return tf.identity(tf.nn.relu(tf.matmul(x, w)), name="y")

    graph = convert_variables_to_constants_v2(tiny.get_concrete_function()).graph
    exe = compile_graph(graph.as_graph_def().SerializeToString(),
                        {"inputs": {"x:0": [[1, 16], "float32"]}, "outputs": ["y:0"]})
    models = {"C runtime": load(exe), "Python runtime": load(exe, runtime="python")}
    assert isinstance(models["C runtime"], NativeModel), models["C runtime"].runtime_note
    calls = 2000

    def per_call(model, x: np.ndarray) -> Callable[[], float]:  # noqa: ANN001
        def round_() -> float:
            start = time.perf_counter()
            for _ in range(calls):
                model.run({"x:0": x})
            return (time.perf_counter() - start) / calls * 1e6
        return round_

    print("\n5. neuronish.runtime.load's model, per run() call (us), and 8 callers / 1:")
    for batch in (1, 9):
        x = rng.standard_normal((batch, 16)).astype(np.float32)
        want = tiny(x[:1]).numpy()
        for model in models.values():
            np.testing.assert_allclose(model.run({"x:0": x})["y:0"][:1], want, rtol=1e-4,
                                       atol=1e-5)
        us = _median_rate({k: per_call(m, x) for k, m in models.items()}, args.rounds)
        print(f"   batch {batch}: " + ", ".join(f"{k} {v:.1f} us" for k, v in us.items()))
    x = rng.standard_normal((1, 16)).astype(np.float32)
    rates = _median_rate({f"{k}|{n}": (lambda m=m, n=n: _threads_rate(
        lambda: m.run({"x:0": x}), n, args.seconds)) for k, m in models.items()
        for n in (1, 8)}, args.rounds)
    for k in models:
        print(f"   {k:<15} 8 callers / 1: {rates[f'{k}|8'] / rates[f'{k}|1']:.2f}x "
              f"({rates[f'{k}|1']:.0f} -> {rates[f'{k}|8']:.0f} calls/s)")
    for model in models.values():
        model.unload()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--chain", type=int, default=100)
    p.add_argument("--short-chain", type=int, default=10,
                   help="the shorter chain of figure 1's marginal per-call cost")
    p.add_argument("--calls", type=int, default=30, help="chains per latency round")
    p.add_argument("--seconds", type=float, default=2.0, help="per throughput round")
    p.add_argument("--skip-c-host", action="store_true")
    p.add_argument("--latency-only", action="store_true", help="figure 1 alone")
    p.add_argument("--pipeline-only", action="store_true",
                   help="figure 3 alone (after figures 1-2 in the same process it measured "
                        "1.52x where alone it measures 1.85x: see docs/c-api.md)")
    args = p.parse_args()
    if not 0 < args.short_chain < args.chain:
        p.error(f"--short-chain must be in [1, --chain), got {args.short_chain} with --chain "
                f"{args.chain}")
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    from neuronish.cc.host import cpu_flags

    flags = cpu_flags()
    print("cpu flags:", " ".join(sorted(f for f in flags if f.startswith(("avx512f", "amx",
                                                                            "avx512_")))))
    print("cpus:", os.cpu_count(), " load average before:", os.getloadavg())
    if args.pipeline_only:
        pipeline(args)
        print("\nload average after:", os.getloadavg())
        return 0
    with tempfile.TemporaryDirectory(prefix="neuronish-capi-binding-") as tmp:
        tiny_and_cnn(args, Path(tmp))
    if not args.latency_only:
        pipeline(args)
        runtime_binding(args)
    if not args.skip_c_host and not args.latency_only:
        print("\n4. the C host (examples/c/latency.py: TF C API, native op library):")
        r = subprocess.run([sys.executable, str(ROOT / "examples" / "c" / "latency.py"),
                            "--runs", "3"], capture_output=True, text=True)
        print("   " + "\n   ".join(line for line in r.stdout.splitlines()
                                   if "us" in line) if r.returncode == 0 else r.stderr[-2000:])
    print("\nload average after:", os.getloadavg())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
