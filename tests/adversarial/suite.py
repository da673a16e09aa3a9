"""The adversarial suite: generated cases of each class of attack on the bounds of requests,
graphs, cache entries and files, each judged "held" (refused with the project's own error,
or served correctly) or not. A class is a generator of cases from a seeded random source, so
a failure is reproducible from (class, seed, index); `tests/adversarial/test_adversarial.py`
runs a bounded sample in CI and `scripts/adversarial.py` a longer run that prints the table.

Classes (what each case tries, and what "held" means):

  driver_flags    a driver-owned compiler flag in a random spelling (prefix, case,
                  underscores, dashes, `=value`): refused by the flag check, and the
                  compiler's own parser takes only exact spellings
  json_bodies     a REST body: random nesting (to 3000 deep), numbers of up to 5000
                  digits, non-finite, surrogates, wrong types: decoded, or a
                  ServingError (400-class), never another exception
  tensor_protos   a gRPC TensorProto with random dtype, rank (to 300), dims (negative,
                  2^62) and content: decoded within the element limit, or a
                  ServingError, never another exception nor an allocation by shape
  run_dir_files   a run directory holding a random malformed counters file (wrong
                  types, deep nesting, huge numbers, binary, a FIFO, a /dev/zero link):
                  `neuronish ls`'s reader skips it, in bounded time
  int_division    an integer FloorDiv/FloorMod whose constant divisor holds a zero at a
                  random place: the compiler refuses it naming the node (in-process)
  fold_bounds     a few-hundred-byte graph whose fold would be GiBs (Fill, Tile,
                  OneHot, ZerosLike, Range of random sizes): the compiler, capped at a
                  2 GiB address space in a subprocess, compiles it unfolded or refuses
                  it naming the node; never MemoryError or a traceback
  slow_clients    slow-loris REST clients reaped by the server: no traceback in the
                  output, at most a line per class in the log, good requests served
  cache_entries   a compile-cache directory tampered with (another key's record,
                  a resealed other executable, a symlinked or FIFO entry, a /dev/zero
                  record, a truncated entry, a group- or world-writable directory):
                  a miss or a refusal, never bytes that were not put under the key
                  (and nothing from a directory others can write)
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import resource
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

Case = tuple[str, Callable[[], str | None]]  # (description, run -> None if held, else why)


@dataclass
class ClassResult:
    tried: int = 0
    held: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


# --------------------------------------------------------------------- driver flags

_DRIVER = ("framework", "io-config", "output", "workdir")
_OTHER = ("auto-cast", "auto-cast-type", "neuroncore-pipeline-cores", "quantize",
          "calibration", "max-error", "verbose", "disable-pass", "device-model")


def _spelling(rng: random.Random, name: str) -> str:
    cut = name[:rng.randint(1, len(name))]
    if rng.random() < 0.3:
        cut = cut.replace("-", "_")
    if rng.random() < 0.2:
        cut = cut.upper() if rng.random() < 0.5 else cut.capitalize()
    dashes = rng.choice(["--", "--", "--", "-", "---"])
    value = rng.choice(["", "=/tmp/elsewhere", "=x"])
    return dashes + cut + value


def driver_flags(rng: random.Random, n: int, tmp: Path) -> Iterator[Case]:
    from neuronish.cc.cli import build_parser
    from neuronish.cc_flags import CompilerFlagsError, check_compiler_flags

    base = ["compile", "g.pb", "--framework", "TENSORFLOW", "--io-config", "{}",
            "--output", "o.neff"]

    def refused(flag: str) -> str | None:
        try:
            check_compiler_flags([flag, "/tmp/elsewhere"], "compiler_args")
        except CompilerFlagsError:
            pass
        else:
            return f"{flag!r} passed the driver-flag check"
        exact = flag.split("=", 1)[0] in {f"--{d}" for d in _DRIVER}
        with contextlib.redirect_stderr(io.StringIO()):
            try:
                name = flag.split("=", 1)[0]
                build_parser().parse_args([*base, name, "TENSORFLOW" if exact else "v"])
            except SystemExit:
                return None if not exact else f"the compiler refused the exact {flag!r}"
        return None if exact else f"the compiler's parser took {flag!r}"

    def passes(flag: str) -> str | None:
        try:
            check_compiler_flags([flag, "1"], "compiler_args")
        except CompilerFlagsError as e:
            return f"{flag!r} refused: {e}"
        return None

    for _ in range(n):
        if rng.random() < 0.8:
            flag = _spelling(rng, rng.choice(_DRIVER))
            yield f"driver flag {flag}", lambda f=flag: refused(f)
        else:
            flag = "--" + rng.choice(_OTHER)
            yield f"other flag {flag}", lambda f=flag: passes(f)


# --------------------------------------------------------------------- JSON bodies

def _json_value(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice(["1", "-0.5", "1e999", "-1e999", "NaN", "Infinity", "true", "null",
                           '"s"', '"\\ud800"', '{"b64": "!!"}', '{"b64": "YQ=="}',
                           "9" * rng.choice([20, 400, 4301, 5000]), "[]", "{}"])
    if r < 0.5:
        d = rng.choice([2, 63, 64, 65, 200, 900, 3000])
        return "[" * d + rng.choice(["1", "", "[1]"]) + "]" * d
    if r < 0.8:
        return "[" + ",".join(_json_value(rng, depth + 1) for _ in range(rng.randint(0, 4))) + "]"
    return "{" + ",".join(f'"{k}": {_json_value(rng, depth + 1)}' for k in
                          rng.sample(["x", "instances", "inputs", "signature_name", "y"],
                                     rng.randint(0, 3))) + "}"


def json_bodies(rng: random.Random, n: int, tmp: Path) -> Iterator[Case]:
    from neuronish.runtime.signature import TensorSignature
    from neuronish.serving import json_codec
    from neuronish.serving.status import ServingError

    inputs = {"x": TensorSignature("x", "float32", (-1, 4))}

    def run(body: bytes) -> str | None:
        try:
            doc = json_codec.parse_body(body)
            json_codec.decode_predict(doc, inputs)
        except ServingError:
            return None
        except Exception as e:  # anything else would reach the client as a 500
            return f"{type(e).__name__}: {str(e)[:200]}"
        return None

    for _ in range(n):
        key = rng.choice(["instances", "inputs"])
        body = rng.choice([
            f'{{"{key}": {_json_value(rng)}}}',
            f'{{"{key}": {{"x": {_json_value(rng)}}}}}',
            f'{{"{key}": [{{"x": {_json_value(rng)}}}, {{"x": {_json_value(rng)}}}]}}',
            _json_value(rng),
        ]).encode()
        if rng.random() < 0.05:
            body = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        yield f"body {body[:60]!r}... ({len(body)} bytes)", lambda b=body: run(b)


# --------------------------------------------------------------------- tensor protos

def tensor_protos(rng: random.Random, n: int, tmp: Path) -> Iterator[Case]:
    from tensorflow.core.framework import tensor_pb2, types_pb2

    from neuronish.serving.codec import check_request_size, to_ndarray
    from neuronish.serving.status import ServingError

    dtypes = [types_pb2.DT_FLOAT, types_pb2.DT_INT32, types_pb2.DT_STRING, types_pb2.DT_HALF,
              types_pb2.DT_BOOL, types_pb2.DT_INT64, types_pb2.DT_COMPLEX64, 0, 77,
              types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT, types_pb2.DT_BFLOAT16]

    def run(proto: tensor_pb2.TensorProto) -> str | None:
        try:
            check_request_size({"x": proto}, 1 << 20)
            array = to_ndarray("x", proto)
            if array.size > 1 << 20:
                return f"decoded {array.size} elements past the limit"
        except ServingError:
            return None
        except Exception as e:
            return f"{type(e).__name__}: {str(e)[:200]}"
        return None

    for _ in range(n):
        p = tensor_pb2.TensorProto(dtype=rng.choice(dtypes))
        rank = rng.choice([0, 1, 2, 4, 64, 65, 254, 300])
        for _ in range(rank):
            p.tensor_shape.dim.add(size=rng.choice([0, 1, 1, 1, 2, 3, -1, 2**31, 2**62]))
        what = rng.random()
        if what < 0.4:
            p.tensor_content = bytes(rng.randrange(256) for _ in range(rng.choice([0, 3, 4, 64])))
        elif what < 0.7:
            p.float_val.extend([rng.random()] * rng.choice([0, 1, 5]))
        elif what < 0.85:
            p.int_val.extend([rng.randrange(-9, 9)] * rng.choice([1, 6]))
        else:
            p.string_val.extend([b"a" * rng.choice([0, 5])] * rng.choice([1, 2]))
        dims = [d.size for d in p.tensor_shape.dim][:4]
        yield f"TensorProto dtype={p.dtype} rank={rank} dims={dims}", lambda p=p: run(p)


# --------------------------------------------------------------------- run-dir files

def _record_text(rng: random.Random) -> bytes:
    good = {"format": 1, "pid": os.getpid(), "time": time.time(), "device": {},
            "cores": {}, "models": []}
    doc: object = dict(good)
    r = rng.random()
    if r < 0.3:
        doc[rng.choice(list(good))] = rng.choice([None, "x", -1, 1e308, [], {}, 2**80, True])
    elif r < 0.45:
        del doc[rng.choice(list(good))]
    elif r < 0.6:
        doc["models"] = [{"name": rng.choice([1, None, "m"]), "cores": rng.choice(["x", [1e9]]),
                          "inferences": rng.choice([-1, "x", 1e308])}]
    elif r < 0.7:
        return ("[" * rng.choice([10, 100, 5000]) + "]" * 10).encode()
    elif r < 0.8:
        return bytes(rng.randrange(256) for _ in range(64))
    elif r < 0.9:
        return b"9" * rng.choice([10, 5000])
    else:
        doc = rng.choice([[], "s", 1, None])
    return json.dumps(doc).encode()


def run_dir_files(rng: random.Random, n: int, tmp: Path) -> Iterator[Case]:
    from neuronish.runtime.telemetry import read_all

    def run(i: int) -> str | None:
        d = tmp / f"run{i}"
        d.mkdir(mode=0o700)
        kind = rng.random()
        target = d / f"{os.getpid()}.json"
        if kind < 0.1:
            target.symlink_to("/dev/zero")
        elif kind < 0.2:
            os.mkfifo(target)
        else:
            target.write_bytes(_record_text(rng))
        skipped: list[str] = []
        start = time.monotonic()
        try:
            read_all(d, skipped)
        except Exception as e:
            return f"{type(e).__name__}: {str(e)[:200]}"
        if time.monotonic() - start > 10:
            return "reading the run dir took more than 10 s"
        return None

    for i in range(n):
        yield f"run dir {i}", lambda i=i: run(i)


# --------------------------------------------------------------------- integer division

def int_division(rng: random.Random, n: int, tmp: Path) -> Iterator[Case]:
    from neuronish.cc import cli
    from neuronish.cc.proto import tf_graph_pb2 as pb
    from tests.cc.test_cc_hostile import _node, _tensor

    def run(i: int, op: str, dtype: int, divisor: list[int]) -> str | None:
        g = pb.GraphDef()
        t = ("type", dtype)
        _node(g, "x", "Placeholder", dtype=t)
        field_name = "int_val" if dtype == pb.DT_INT32 else "int64_val"
        _node(g, "d", "Const", dtype=t, value=_tensor([len(divisor)], dtype,
                                                      **{field_name: divisor}))
        _node(g, f"div_{i}", op, ("x", "d"), T=t)
        src = tmp / f"div{i}.pb"
        src.write_bytes(g.SerializeToString())
        name = "int32" if dtype == pb.DT_INT32 else "int64"
        io_config = json.dumps({"inputs": {"x:0": [[2, len(divisor)], name]},
                                "outputs": [f"div_{i}:0"]})
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(["compile", str(src), "--framework", "TENSORFLOW", "--io-config",
                             io_config, "--output", str(tmp / f"div{i}.neff")])
        text = err.getvalue()
        if code != 1 or f"div_{i} ({op}): integer division by zero" not in text:
            return f"exit {code}: {text[-300:]}"
        return None

    for i in range(n):
        size = rng.randint(1, 8)
        divisor = [rng.choice([-3, -1, 1, 2, 7]) for _ in range(size)]
        divisor[rng.randrange(size)] = 0
        op = rng.choice(["FloorDiv", "FloorMod"])
        dtype = rng.choice([pb.DT_INT32, pb.DT_INT64])
        yield f"{op} by {divisor}", lambda a=(i, op, dtype, divisor): run(*a)


# --------------------------------------------------------------------- fold bounds

def fold_bounds(rng: random.Random, n: int, tmp: Path) -> Iterator[Case]:
    from neuronish.cc.proto import tf_graph_pb2 as pb
    from tests.cc.test_cc_hostile import CC, _node, _tensor

    i32, i64, f32 = ("type", pb.DT_INT32), ("type", pb.DT_INT64), ("type", pb.DT_FLOAT)

    def graph(kind: str) -> bytes:
        g = pb.GraphDef()
        _node(g, "x", "Placeholder", dtype=f32)
        big = 2 ** rng.randint(26, 31)
        if kind == "Fill":
            _node(g, "dims", "Const", dtype=i32,
                  value=_tensor([2], pb.DT_INT32, int_val=[big, rng.choice([1, 4, 16])]))
            _node(g, "v", "Const", dtype=f32, value=_tensor([], float_val=[1.0]))
            _node(g, "y", "Fill", ("dims", "v"), T=f32, index_type=i32)
        elif kind == "Tile":
            _node(g, "c", "Const", dtype=f32, value=_tensor([2, 4], float_val=[1.0]))
            _node(g, "m", "Const", dtype=i32, value=_tensor([2], pb.DT_INT32,
                                                            int_val=[big // 8, 2]))
            _node(g, "y", "Tile", ("c", "m"), T=f32, Tmultiples=i32)
        elif kind == "OneHot":
            k = 2 ** rng.randint(14, 16)
            _node(g, "i", "Const", dtype=i32, value=_tensor([k], pb.DT_INT32, int_val=[1]))
            _node(g, "d", "Const", dtype=i32, value=_tensor([], pb.DT_INT32, int_val=[k]))
            _node(g, "on", "Const", dtype=f32, value=_tensor([], float_val=[1.0]))
            _node(g, "off", "Const", dtype=f32, value=_tensor([], float_val=[0.0]))
            _node(g, "y", "OneHot", ("i", "d", "on", "off"), T=f32, TI=i32, axis=-1)
        else:  # Range
            for name, v in (("s", 0), ("l", big * 4), ("d", 1)):
                _node(g, name, "Const", dtype=i64, value=_tensor([], pb.DT_INT64, int64_val=[v]))
            _node(g, "y", "Range", ("s", "l", "d"), Tidx=i64)
        return g.SerializeToString()

    def run(i: int, kind: str) -> str | None:
        src = tmp / f"fold{i}.pb"
        src.write_bytes(graph(kind))
        io_config = json.dumps({"inputs": {"x:0": [[2, 4], "float32"]}, "outputs": ["y:0"]})

        def cap() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

        done = subprocess.run([CC, "compile", str(src), "--framework", "TENSORFLOW",
                               "--io-config", io_config, "--output", str(tmp / f"f{i}.neff")],
                              capture_output=True, text=True, timeout=300, preexec_fn=cap)
        if done.returncode not in (0, 1) or "Traceback" in done.stderr \
                or "MemoryError" in done.stderr or "internal compiler error" in done.stderr:
            return f"exit {done.returncode}: {done.stderr[-300:]}"
        if done.returncode == 1 and " (" + kind + ")" not in done.stderr:
            return f"refused without naming the node: {done.stderr[-300:]}"
        return None

    for i in range(n):
        kind = rng.choice(["Fill", "Tile", "OneHot", "Range"])
        yield f"{kind} fold {i}", lambda a=(i, kind): run(*a)


# --------------------------------------------------------------------- slow clients

def slow_clients(rng: random.Random, n: int, tmp: Path) -> Iterator[Case]:
    from neuronish.serving.rest import RestServer

    class Api:
        def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, str]:
            return 200, "{}", "application/json"

    def run(clients: int, prefix: bytes) -> str | None:
        server = RestServer(0, Api(), 1 << 20, 4, idle_timeout_s=0.4)  # type: ignore[arg-type]
        log = logging.getLogger("neuronish.serving")
        lines: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = lines.append  # type: ignore[method-assign]
        log.addHandler(handler)
        err = io.StringIO()
        server.start()
        port = server.server_address[1]

        def slow() -> None:
            try:
                with socket.create_connection(("127.0.0.1", port)) as s:
                    s.sendall(prefix)
                    for _ in range(12):
                        s.sendall(b"a")
                        time.sleep(0.15)
            except OSError:
                pass

        try:
            with contextlib.redirect_stderr(err):
                threads = [threading.Thread(target=slow) for _ in range(clients)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(30)
                with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                    s.sendall(b"GET /v1/x HTTP/1.1\r\nHost: x\r\n\r\n")
                    answer = s.recv(100)
        finally:
            server.stop(1)
            log.removeHandler(handler)
        if not answer.startswith(b"HTTP/1.1 200"):
            return f"a good request got {answer[:40]!r}"
        if "Traceback" in err.getvalue():
            return "a traceback on stderr"
        if len([r for r in lines if r.levelno >= logging.WARNING]) > 3:
            return f"{len(lines)} log lines for {clients} clients"
        return None

    prefixes = [b"POST /v1/m:predict HTTP/1.1\r\nX-Slow: ",
                b"POST /v1/m:predict HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n",
                b"GET /v1/", b"POST /v1/m HTTP/1.1\r\nContent-Length: 100\r\n\r\n"]
    for _ in range(n):
        clients, prefix = rng.choice([5, 20, 60]), rng.choice(prefixes)
        yield f"{clients} slow clients, {prefix[:30]!r}", lambda a=(clients, prefix): run(*a)


# --------------------------------------------------------------------- cache entries

def cache_entries(rng: random.Random, n: int, tmp: Path) -> Iterator[Case]:
    import warnings

    from neuronish.compile_cache import CacheStats, CompileCache, UntrustedCache

    def run(i: int, attack: str) -> str | None:
        root = tmp / f"cache{i}"
        cache, stats = CompileCache(root), CacheStats()
        key, other = f"{i:064x}", f"{i + 1:064x}"
        good, evil = b"good executable %d" % i * 64, b"evil executable" * 64
        cache.put(key, good, stats)
        cache.put(other, evil, stats)
        entry, record = root / f"{key}.neff", root / f"{key}.sum"
        if attack == "other record":
            entry.write_bytes(evil)
            os.replace(root / f"{other}.sum", record)
        elif attack == "resealed":
            entry.write_bytes(evil)
            record.write_bytes(CompileCache(tmp / f"mine{i}")._seal(key, evil))
        elif attack == "symlinked entry":
            entry.unlink()
            entry.symlink_to(root / f"{other}.neff")
        elif attack == "fifo entry":
            entry.unlink()
            os.mkfifo(entry)
        elif attack == "dev-zero record":
            record.unlink()
            record.symlink_to("/dev/zero")
        elif attack == "truncated":
            entry.write_bytes(good[:rng.randrange(len(good))])
        elif attack in ("mode 0777", "mode 0770"):
            os.chmod(root, 0o777 if attack == "mode 0777" else 0o770)
        start = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                found = CompileCache(root).get(key, CacheStats())
            except UntrustedCache:
                return None if attack.startswith("mode") else "refused an untouched directory"
        if time.monotonic() - start > 10:
            return "the lookup took more than 10 s"
        if attack.startswith("mode") and found is not None:
            return "an entry of a directory others can write was used"
        if found is not None and found != good:
            return f"a hit with bytes that were not put under the key ({found[:20]!r})"
        return None

    attacks = ["other record", "resealed", "symlinked entry", "fifo entry", "dev-zero record",
               "truncated", "mode 0777", "mode 0770"]
    for i in range(n):
        attack = rng.choice(attacks)
        yield f"cache {attack}", lambda a=(i, attack): run(*a)


CLASSES: dict[str, Callable[[random.Random, int, Path], Iterator[Case]]] = {
    "driver_flags": driver_flags,
    "json_bodies": json_bodies,
    "tensor_protos": tensor_protos,
    "run_dir_files": run_dir_files,
    "int_division": int_division,
    "fold_bounds": fold_bounds,
    "slow_clients": slow_clients,
    "cache_entries": cache_entries,
}


def run(counts: dict[str, int], seed: int = 23) -> dict[str, ClassResult]:
    """Run `counts[name]` cases of each class; a case that raises is not held."""
    results: dict[str, ClassResult] = {}
    with tempfile.TemporaryDirectory(prefix="adversarial-") as tmp:
        for name, count in counts.items():
            result = results[name] = ClassResult()
            rng = random.Random(f"{seed}:{name}")
            start = time.perf_counter()
            directory = Path(tmp) / name
            directory.mkdir()
            for description, case in CLASSES[name](rng, count, directory):
                result.tried += 1
                try:
                    why = case()
                except Exception as e:  # the case's own machinery failed: not held
                    why = f"{type(e).__name__}: {str(e)[:200]}"
                if why is None:
                    result.held += 1
                else:
                    result.failures.append(f"{description}: {why}")
            result.seconds = time.perf_counter() - start
    return results


def table(results: dict[str, ClassResult]) -> str:
    lines = [f"{'class':<14} {'tried':>6} {'held':>6} {'seconds':>8}"]
    for name, r in results.items():
        lines.append(f"{name:<14} {r.tried:>6} {r.held:>6} {r.seconds:>8.1f}")
    return "\n".join(lines)

