"""Run `neuronish-cc` once per subgraph, several at a time, and collect the results.

    results = compile_all([CompileJob("neuron_op_0", graph_def, io_config), ...],
                          max_num_compilers=4, timeout=600, workdir="build/")

Every job gets a folder `<dir>/<name>/` holding what is needed to rerun it by hand:

    graph.pb            the subgraph (a hard link when the job names a file)
    io-config.json      its io-config
    command_line.txt    the exact command (copy-paste to rerun)
    compiler.log        the compiler's stdout and stderr
    <name>.neff         the executable, on success
    errors.json         on rejection: every offending node (written by neuronish-cc)

With `workdir` the folders are kept (an existing `<workdir>/<name>/` is replaced);
without it they live in a temporary directory that is removed afterwards, so
error messages then carry the end of the log instead of its path.

Large graphs cost more to copy than to compile (ConvNeXtXLarge's 1.4 GB), so a job
may name a file already holding its subgraph instead of carrying the bytes, and
with `executables_dir` each executable is hard-linked there and mapped into memory
(`mmap`) instead of read back: the caller can link it onward (into a SavedModel's
assets/) without anyone copying the weights.

Each compiler is its own session and process group (`start_new_session=True`):
Ctrl-C in the terminal then reaches only us, and on a timeout or an interrupt we
kill the whole group, helpers the compiler may have started included.

Which compiler runs: the `compiler` argument (an argv list), else `$NEURONISH_CC`
(split like a shell would, e.g. `NEURONISH_CC="python -m neuronish.cc.cli"`),
else the `neuronish-cc` script next to the running Python, else
`python -m neuronish.cc.cli`.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

from .cc_flags import ENV_CC_FLAGS, TFN_ENV_CC_FLAGS, env_compiler_flags
from .contracts import ENV_COMPILER, default_compiler
from .runtime.cgroup import cgroup_memory_available, usable_cpus

# Measured peak RSS of `neuronish-cc compile`: ~60 MiB for a tiny graph, 264 MiB for
# ResNet50 (a 98 MiB GraphDef), 2.1 GB for ConvNeXtXLarge (1.4 GB): about 60 MiB + 2x
# the graph at most (it maps the graph, pages counted as it reads them, and writes the
# weights from there). The estimate below keeps ~1.5x headroom over that.
_BASE_MEMORY = 128 * 2**20
_MEMORY_PER_GRAPH_BYTE = 3
DEFAULT_MEMORY_PER_COMPILER = 2**30  # when the graphs are not known: a ResNet50-sized one

OUTCOMES = ("compiled", "rejected", "timeout", "crashed", "bad_usage", "failed")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_LOG_TAIL_LINES = 20


@dataclass
class CompileJob:
    """One subgraph to compile. `name` names its folder and executable file;
    `graph_def` is the serialized GraphDef, or the path of a file holding it (linked
    into the job's folder, copied where the filesystem refuses links)."""

    name: str
    graph_def: bytes | os.PathLike[str]
    io_config: dict
    compiler_args: tuple[str, ...] = ()  # extra flags, e.g. ("--auto-cast", "matmult")


@dataclass
class CompileResult:
    """What happened to one job. `outcome` is one of OUTCOMES:

    compiled  exit 0 and an executable was written (`executable` holds its bytes; with
              `executables_dir` a read-only memory map of `executable_file`)
    rejected  exit 1 with errors.json: the compiler refused the graph; `error_class`,
              `error` and `rejected_nodes` (node, op, reason, hint) say why
    timeout   still running after `timeout` seconds; its process group was killed
    crashed   died from a signal (segfault, abort, out-of-memory killer)
    bad_usage exit 2: the compiler refused its command line (check `compiler_args`)
    failed    anything else: could not start, exit 2 over a malformed io-config
              (written by the partitioner, so a neuronish bug), exit 1 without
              errors.json (an uncaught exception), exit 0 without an executable
    """

    name: str
    ok: bool
    executable: bytes | mmap.mmap | None = field(repr=False)
    seconds: float
    outcome: str
    error: str = ""
    error_class: str = ""
    rejected_nodes: list[dict] = field(default_factory=list)
    command_line: list[str] = field(default_factory=list)
    log_path: str | None = None  # None when the job folder was temporary
    workdir: str | None = None  # the job's folder, None when it was temporary
    cached: bool = False  # taken from the compile cache (compile_cache.py), not compiled
    executable_file: str | None = None  # its file (in `executables_dir`, or a cache entry)


ProgressCallback = Callable[[int, int, CompileResult], None]


def estimate_compiler_memory(graph_bytes: int) -> int:
    """Peak memory, in bytes, that one `neuronish-cc` needs for a graph of this size."""
    return _BASE_MEMORY + _MEMORY_PER_GRAPH_BYTE * graph_bytes


def graph_size(job: CompileJob) -> int:
    """The bytes of the job's GraphDef."""
    if isinstance(job.graph_def, (bytes, bytearray, memoryview)):
        return len(job.graph_def)
    return os.path.getsize(job.graph_def)


def _available_memory() -> int | None:
    """MemAvailable from /proc/meminfo in bytes, at most what the process's cgroups still
    allow (a container's limit; the host's MemAvailable does not see it); None where
    neither is known."""
    host = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    host = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    group = cgroup_memory_available()
    known = [m for m in (host, group) if m is not None]
    return min(known) if known else None


def default_max_num_compilers(memory_per_compiler: int = DEFAULT_MEMORY_PER_COMPILER) -> int:
    """How many compilers to run at once: one per usable CPU, as many as fit in memory.

    The rule: `max(1, min(usable CPUs, MemAvailable // memory_per_compiler))`.
    Usable CPUs: the CPU affinity mask capped by a cgroup CPU quota (runtime/cgroup.py);
    MemAvailable from /proc/meminfo, at most a cgroup memory limit less its usage
    (where neither is known, memory is not limiting).
    `compile_all` passes the estimate for its largest graph
    (`estimate_compiler_memory`); the default assumes a ResNet50-sized graph.
    """
    limit = usable_cpus()
    available = _available_memory()
    if available is not None and memory_per_compiler > 0:
        limit = min(limit, available // memory_per_compiler)
    return max(1, limit)


def compile_all(
    jobs: Sequence[CompileJob],
    *,
    max_num_compilers: int | None = None,
    timeout: float | None = None,
    workdir: str | os.PathLike[str] | None = None,
    compiler: Sequence[str] | None = None,
    progress: ProgressCallback | None = None,
    executables_dir: str | os.PathLike[str] | None = None,
) -> list[CompileResult]:
    """Compile every job with its own `neuronish-cc` process; results in job order.

    At most `max_num_compilers` compilers run at once (default:
    `default_max_num_compilers` for the largest graph). A compiler still running
    after `timeout` seconds is killed with its process group. `progress(done,
    total, result)` is called from this thread as each job finishes. A failing
    job never raises: look at each result's `outcome`. KeyboardInterrupt (or an
    exception from `progress`) kills the running compilers, then propagates.
    With `executables_dir` (an existing directory the caller owns and removes), each
    executable is also linked there (`executable_file`), and `executable` maps it.
    """
    jobs = list(jobs)
    _check_jobs(jobs)
    env_flags = env_compiler_flags()  # $NEURONISH_CC_FLAGS, after each job's own flags
    jobs = [replace(j, compiler_args=(*j.compiler_args, *env_flags)) for j in jobs]
    if max_num_compilers is not None and max_num_compilers < 1:
        raise ValueError(f"max_num_compilers must be >= 1, got {max_num_compilers}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds (or None for no limit), got {timeout}")
    if not jobs:
        return []
    if max_num_compilers is None:
        largest = max(graph_size(j) for j in jobs)
        max_num_compilers = default_max_num_compilers(estimate_compiler_memory(largest))
    command = list(compiler) if compiler is not None else default_compiler()
    if not command:
        raise ValueError(f"empty compiler command: check the `compiler` argument or "
                         f"${ENV_COMPILER}")

    keep = workdir is not None
    root = Path(workdir) if keep else Path(tempfile.mkdtemp(prefix="neuronish-cc-"))
    cancel = threading.Event()
    results: dict[int, CompileResult] = {}
    try:
        root.mkdir(parents=True, exist_ok=True)
        pool = ThreadPoolExecutor(max_workers=min(max_num_compilers, len(jobs)),
                                  thread_name_prefix="neuronish-cc")
        try:
            pending: dict[Future[CompileResult], int] = {
                pool.submit(_run_job, job, command, root / job.name, timeout, keep, cancel,
                            None if executables_dir is None else Path(executables_dir)): i
                for i, job in enumerate(jobs)
            }
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                # Job order among simultaneous finishers, so progress is deterministic.
                for future in sorted(finished, key=pending.__getitem__):
                    index = pending.pop(future)
                    results[index] = future.result()
                    if progress is not None:
                        progress(len(results), len(jobs), results[index])
        except BaseException:
            # The compilers live in their own sessions, so Ctrl-C did not reach
            # them: tell every worker to kill its process group, then wait for
            # them to reap it (no zombies, no orphans).
            cancel.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return [results[i] for i in range(len(jobs))]


def _check_jobs(jobs: list[CompileJob]) -> None:
    seen: set[str] = set()
    for job in jobs:
        if not isinstance(job.name, str) or not _NAME.fullmatch(job.name):
            raise ValueError(f"compile job name {job.name!r} cannot name a folder: use letters, "
                             "digits, '_', '-' and '.' (not first)")
        if job.name in seen:
            raise ValueError(f"two compile jobs are named {job.name!r}; names must be unique "
                             "(each gets its own folder and executable file)")
        seen.add(job.name)


def _run_job(job: CompileJob, compiler: list[str], job_dir: Path, timeout: float | None,
             keep: bool, cancel: threading.Event, executables_dir: Path | None
             ) -> CompileResult:
    """Worker thread: write the job's inputs, run the compiler, classify what it did."""
    output = job_dir / f"{job.name}.neff"
    log = job_dir / "compiler.log"
    command = [*compiler, "compile", str(job_dir / "graph.pb"), "--framework", "TENSORFLOW",
               "--io-config", str(job_dir / "io-config.json"), "--output", str(output),
               "--workdir", str(job_dir), *job.compiler_args]
    result = CompileResult(job.name, ok=False, executable=None, seconds=0.0, outcome="failed",
                           command_line=command, log_path=str(log) if keep else None,
                           workdir=str(job_dir) if keep else None)
    if cancel.is_set():
        result.error = f"subgraph {job.name!r}: not compiled, the compile was interrupted"
        return result
    try:
        if job_dir.exists():  # a previous run's errors.json or executable would mislead
            shutil.rmtree(job_dir)
        job_dir.mkdir(parents=True)
        if isinstance(job.graph_def, (bytes, bytearray, memoryview)):
            (job_dir / "graph.pb").write_bytes(job.graph_def)
        else:
            link_or_copy(job.graph_def, job_dir / "graph.pb")
        (job_dir / "io-config.json").write_text(json.dumps(job.io_config, indent=1) + "\n")
        (job_dir / "command_line.txt").write_text(shlex.join(command) + "\n")
    except (OSError, TypeError, ValueError) as e:  # TypeError/ValueError: io_config not JSON
        result.error = f"subgraph {job.name!r}: cannot write its compiler inputs to {job_dir}: {e}"
        return result

    start = time.monotonic()
    with open(log, "wb") as log_file:
        try:
            # A fresh session: the compiler and anything it starts share one
            # process group that we can kill as a whole; Ctrl-C does not reach it.
            proc = _popen(command, log_file)
        except OSError as e:
            result.error = (f"subgraph {job.name!r}: cannot start the compiler {command[0]!r}: "
                            f"{e.strerror or e}. Pass `compiler=[...]` or set ${ENV_COMPILER} "
                            "to the neuronish-cc command.")
            return result
        try:
            reason = _wait(proc, None if timeout is None else start + timeout, cancel)
        finally:
            # Still unreaped here, so its id (= the group id) cannot have been
            # reused: kill the group (on timeout/cancel, or helpers it left
            # behind), then reap it. No orphans, no zombies, whatever happened.
            _kill_group(proc.pid)
            proc.wait()
    result.seconds = time.monotonic() - start
    # neuronish-cc writes its own command_line.txt into --workdir; ours is the
    # exact, copy-pasteable one (full compiler path, every flag).
    with contextlib.suppress(OSError):
        (job_dir / "command_line.txt").write_text(shlex.join(command) + "\n")
    _classify(result, proc.returncode, reason, timeout, output, job_dir / "errors.json", log, keep,
              executables_dir)
    return result


def link_or_copy(source: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """`target` becomes `source`'s contents: a hard link (no bytes copied) where the
    filesystem allows, else a copy. `target` must not exist."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _take_executable(output: Path, executables_dir: Path | None, name: str
                     ) -> tuple[bytes | mmap.mmap, str | None]:
    """The executable's bytes, and where they stay for the caller (if asked to keep them).
    Kept: linked into `executables_dir` under a fresh name and mapped read-only; the
    job folder may go, the link keeps the file, and nothing writes to it."""
    if executables_dir is None:
        return output.read_bytes(), None
    fd, kept = tempfile.mkstemp(prefix=f"{name}.", suffix=".neff", dir=executables_dir)
    os.close(fd)
    os.unlink(kept)  # a link needs a free name; the directory is the caller's alone
    try:
        link_or_copy(output, kept)
        with open(kept, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b"", kept
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), kept
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(kept)
        raise


def _popen(command: list[str], log_file: BinaryIO) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait(proc: subprocess.Popen[bytes], deadline: float | None,
          cancel: threading.Event) -> str | None:
    """Wait until `proc` exits, the deadline passes ("timeout") or `cancel` is set
    ("cancelled"); None if it exited by itself.

    It polls with `waitid(WNOWAIT)`, which leaves the process unreaped: its id,
    which is also its group's id, then stays taken until the caller has killed
    the group, so the kill cannot hit an unrelated process that reused the id.
    """
    pause = 0.001
    while not _exited(proc.pid):
        if cancel.is_set():
            return "cancelled"
        if deadline is not None and time.monotonic() >= deadline:
            return "timeout"
        # Sleeping on the event wakes us at once on cancel; the back-off keeps
        # short compiles snappy and long ones cheap.
        wait_s = pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))
        cancel.wait(wait_s)
        pause = min(pause * 2, 0.05)
    return None


def _exited(pid: int) -> bool:
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None and info.si_pid != 0


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _classify(result: CompileResult, status: int, reason: str | None, timeout: float | None,
              output: Path, errors_json: Path, log: Path, keep: bool,
              executables_dir: Path | None) -> None:
    name = result.name
    where = f"see {log}" if keep else ("pass compiler_workdir=DIR (neuronish compile "
                                       "--compiler-workdir DIR) to keep its inputs and full log")
    if reason == "timeout":
        result.outcome = "timeout"
        result.error = (f"subgraph {name!r}: neuronish-cc did not finish within {timeout:g} s and "
                        f"was killed; raise the timeout or leave this subgraph on TensorFlow "
                        f"({where}){_tail(log)}")
        return
    if reason == "cancelled":
        result.error = f"subgraph {name!r}: compiler killed, the compile was interrupted"
        return
    if status < 0:
        result.outcome = "crashed"
        result.error = (f"subgraph {name!r}: neuronish-cc crashed ({_signal_name(-status)}); "
                        f"this is a compiler bug, please report it with the job folder "
                        f"({where}){_tail(log)}")
        return
    if status == 0:
        try:
            data, kept = _take_executable(output, executables_dir, name)
        except OSError:
            data, kept = b"", None
        if data:
            result.outcome, result.ok, result.executable = "compiled", True, data
            result.executable_file = kept
            return
        if kept is not None:
            with contextlib.suppress(OSError):
                os.unlink(kept)
        result.error = (f"subgraph {name!r}: neuronish-cc exited 0 but wrote no executable to "
                        f"{output} ({where}){_tail(log)}")
        return
    if status == 1:
        report = _read_errors_json(errors_json)
        if report is not None:
            result.outcome = "rejected"
            result.error_class = str(report.get("error", ""))
            result.error = f"subgraph {name!r}: {report.get('message', '')}"
            result.rejected_nodes = [dict(n) for n in report.get("nodes", [])]
            return
        result.error = (f"subgraph {name!r}: neuronish-cc failed (exit 1) without an "
                        f"errors.json, probably an uncaught exception ({where}){_tail(log)}")
        return
    usage = ""
    if status == 2:
        report = _read_errors_json(errors_json) or {}
        if report.get("error") == "BadIOConfig":
            # The io-config is written by the partitioner, not the user: a bug of ours
            # in one subgraph, which recovery can route around.
            usage = f" (the io-config neuronish wrote is malformed: {report.get('message')})"
        else:
            result.outcome = "bad_usage"
            usage = (" (bad usage: check the job's compiler_args" +
                     "".join(f" and ${v}" for v in (TFN_ENV_CC_FLAGS, ENV_CC_FLAGS)
                             if os.environ.get(v)) + ")")
    result.error = (f"subgraph {name!r}: neuronish-cc exited with status {status}{usage} "
                    f"({where}){_tail(log)}")


def _read_errors_json(path: Path) -> dict | None:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def _signal_name(number: int) -> str:
    try:
        return f"killed by {signal.Signals(number).name}"
    except ValueError:
        return f"killed by signal {number}"


def _tail(log: Path) -> str:
    """The last lines of the compiler's log, indented, for an error message."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = text.rstrip().splitlines()[-_LOG_TAIL_LINES:]
    if not lines:
        return "; the compiler printed nothing"
    return "; compiler output ends with:\n" + "\n".join("    " + line for line in lines)
