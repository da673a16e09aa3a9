"""A cgroup CPU quota caps the CPUs both runtimes size their thread teams by
(runtime/cgroup.py, runtime/capi/cpu_quota.cc): a container limited to one CPU runs
one-thread programs instead of a team the kernel throttles; and a cgroup memory limit caps
the memory the compile driver sizes its parallel compilers by.

The readers are checked on made-up /proc and cgroup trees (Python directly, C++ through a
small program built from cpu_quota.cc), and, where this process may create a cgroup with
a CPU quota (root and a writable cgroup filesystem), for real: a process placed in a
group limited to one CPU gets one-thread teams from the C runtime and `core_threads=1`
from the Python runtime's configuration, and the same process outside it two.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from neuronish.runtime.cgroup import cgroup_cpu_limit, cgroup_memory_available, usable_cpus

ROOT = Path(__file__).resolve().parents[2]


def _proc(tmp: Path, cgroup: str, mounts: list[str]) -> Path:
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("".join(line + "\n" for line in mounts))
    return proc


def _group(base: Path, rel: str, files: dict[str, str]) -> None:
    d = base / rel
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")


def _v1_mount(point: Path, root: str = "/") -> str:
    return f"30 25 0:27 {root} {point} rw,nosuid - cgroup cgroup rw,cpu,cpuacct"


def _v2_mount(point: Path, root: str = "/") -> str:
    return f"31 25 0:28 {root} {point} rw,nosuid - cgroup2 cgroup2 rw"


def _v1(quota: int, period: int = 100000) -> dict[str, str]:
    return {"cpu.cfs_quota_us": str(quota), "cpu.cfs_period_us": str(period)}


def _cases(tmp: Path) -> list[tuple[str, Path, float | None]]:
    """(what, fake /proc dir, the limit the readers must find)."""
    out = []

    def case(name: str, cgroup: str, mounts: list[str], want: float | None,
             groups: list[tuple[Path, str, dict[str, str]]]) -> None:
        d = tmp / name
        d.mkdir()
        for base, rel, files in groups:
            _group(d / base, rel, files)
        mounts = [m.replace("@", str(d)) for m in mounts]
        out.append((name, _proc(d, cgroup, mounts), want))

    v1, v2 = Path("@/fs/cpu"), Path("@/fs/unified")
    case("v1_own_quota", "2:cpu,cpuacct:/pod/ctr\n1:memory:/pod\n", [_v1_mount(v1)], 1.5,
         [(Path("fs/cpu"), "", _v1(-1)), (Path("fs/cpu"), "pod", _v1(-1)),
          (Path("fs/cpu"), "pod/ctr", _v1(150000))])
    case("v1_parent_tighter", "2:cpu,cpuacct:/pod/ctr\n", [_v1_mount(v1)], 0.5,
         [(Path("fs/cpu"), "", _v1(-1)), (Path("fs/cpu"), "pod", _v1(50000)),
          (Path("fs/cpu"), "pod/ctr", _v1(300000))])
    case("v1_no_quota", "2:cpu,cpuacct:/a\n", [_v1_mount(v1)], None,
         [(Path("fs/cpu"), "", _v1(-1)), (Path("fs/cpu"), "a", _v1(-1))])
    # A container's namespace: its group is the mount's root, /proc/self/cgroup says "/".
    case("v1_container_root", "2:cpu,cpuacct:/\n", [_v1_mount(v1, "/kubepods/pod1/ctr")],
         2.0, [(Path("fs/cpu"), "", _v1(400000, 200000))])
    # Without a cgroup namespace: the host path is not under the mount's root.
    case("v1_foreign_root", "2:cpu,cpuacct:/kubepods/pod1/ctr\n",
         [_v1_mount(v1, "/docker/abc")], 1.0, [(Path("fs/cpu"), "", _v1(100000))])
    case("v2_own_quota", "0::/user.slice/job\n", [_v2_mount(v2)], 1.25,
         [(Path("fs/unified"), "user.slice", {"cpu.max": "max 100000"}),
          (Path("fs/unified"), "user.slice/job", {"cpu.max": "125000 100000"})])
    # v2 enables the controller per subtree: a group without cpu.max sets nothing.
    case("v2_parent_only", "0::/a/b\n", [_v2_mount(v2)], 3.0,
         [(Path("fs/unified"), "a", {"cpu.max": "300000 100000"}), (Path("fs/unified"), "a/b", {})])
    case("v2_max", "0::/a\n", [_v2_mount(v2)], None,
         [(Path("fs/unified"), "a", {"cpu.max": "max 100000"})])
    # Hybrid: both hierarchies mounted, the tighter one wins.
    case("hybrid", "2:cpu:/a\n0::/b\n", [_v1_mount(v1), _v2_mount(v2)], 0.75,
         [(Path("fs/cpu"), "a", _v1(200000)),
          (Path("fs/unified"), "b", {"cpu.max": "75000 100000"})])
    # mountinfo escapes a space in a mount point as \040.
    case("escaped_mount_point", "2:cpu:/g\n",
         ["30 25 0:27 / @/fs/my\\040cpu rw - cgroup cgroup rw,cpu"], 1.0,
         [(Path("fs/my cpu"), "g", _v1(100000))])
    # A v1 hierarchy without the cpu controller (cpuset) is not read.
    case("v1_cpuset_only", "3:cpuset:/g\n",
         ["32 25 0:29 / @/fs/cpuset rw - cgroup cgroup rw,cpuset"], None,
         [(Path("fs/cpuset"), "g", _v1(100000))])
    return out


@pytest.fixture(scope="module")
def cpp_reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A program printing runtime/capi/cpu_quota.cc's cgroup_cpu_limit(argv[1])."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the C runtime's quota reader")
    d = tmp_path_factory.mktemp("cpu_quota")
    main = d / "main.cc"
    main.write_text('#include <cstdio>\n#include "cpu_quota.h"\n'
                    "int main(int, char **argv) {\n"
                    "  auto limit = nr::cgroup_cpu_limit(argv[1]);\n"
                    '  if (limit) std::printf("%.6f\\n", *limit); else std::printf("none\\n");\n'
                    "}\n")
    exe = d / "reader"
    capi = ROOT / "runtime" / "capi"
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{capi}", str(main),
                    str(capi / "cpu_quota.cc"), "-o", str(exe)], check=True, timeout=300)
    return exe


def test_readers_find_the_tightest_quota(tmp_path: Path, cpp_reader: Path) -> None:
    for what, proc, want in _cases(tmp_path):
        assert cgroup_cpu_limit(proc) == (pytest.approx(want) if want else None), what
        text = subprocess.run([str(cpp_reader), str(proc)], capture_output=True, text=True,
                              check=True).stdout.strip()
        assert (None if text == "none" else float(text)) == (
            pytest.approx(want) if want else None), f"C++: {what}"


def test_unreadable_proc_means_no_limit(tmp_path: Path, cpp_reader: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "missing") is None
    out = subprocess.run([str(cpp_reader), str(tmp_path / "missing")], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "none"


def test_memory_room_is_the_tightest_limit_less_usage(tmp_path: Path) -> None:
    gib = 1 << 30
    v1 = "30 25 0:27 / @ rw - cgroup cgroup rw,memory"
    v2 = "31 25 0:28 / @ rw - cgroup2 cgroup2 rw"
    none_v1 = str(9223372036854771712)
    for name, cgroup, mount, groups, want in (
        ("v1", "4:memory:/pod/ctr\n", v1,
         {"": {"memory.limit_in_bytes": none_v1, "memory.usage_in_bytes": str(5 * gib)},
          "pod": {"memory.limit_in_bytes": str(4 * gib), "memory.usage_in_bytes": str(gib)},
          "pod/ctr": {"memory.limit_in_bytes": str(8 * gib),
                      "memory.usage_in_bytes": str(gib // 2)}}, 3 * gib),
        ("v1_unlimited", "4:memory:/a\n", v1,
         {"a": {"memory.limit_in_bytes": none_v1, "memory.usage_in_bytes": "1"}}, None),
        ("v2", "0::/a/b\n", v2,
         {"a": {"memory.max": "max", "memory.current": str(gib)},
          "a/b": {"memory.max": str(2 * gib), "memory.current": str(gib // 4)}},
         2 * gib - gib // 4),
        ("v2_over", "0::/a\n", v2, {"a": {"memory.max": str(gib),
                                          "memory.current": str(2 * gib)}}, 0),
    ):
        d = tmp_path / name
        for rel, files in groups.items():
            _group(d / "fs", rel, files)
        proc = _proc(d, cgroup, [mount.replace("@", str(d / "fs"))])
        assert cgroup_memory_available(proc) == want, name


# --- for real: a process in a cgroup limited to one CPU ---------------------------------

_PROBE = """
import json, sys
from neuronish.runtime.config import DeviceConfig
from neuronish.runtime.cgroup import usable_cpus
from neuronish.runtime.capi import binding
from neuronish.device_tools import format_ls
dev = binding.Device(binding.load_library())
model = binding.Model(dev, open(sys.argv[1], "rb").read())
team = model.team(0)  # the convolution
model.unload(); dev.close()
print(json.dumps({"usable": usable_cpus(), "core_threads": DeviceConfig.from_env().core_threads,
                  "c_team": team, "ls": format_ls([]).splitlines()[1]}))
"""


def _new_group(controller: str, v1_files: dict[str, str], v2_files: dict[str, str]) -> Path:
    """A new cgroup with `controller`'s files written (v1's hierarchy of that controller,
    else v2 with the controller enabled); skips, saying why, where this process may not
    make one."""
    if os.geteuid() != 0:
        pytest.skip(f"making a cgroup with a {controller} limit needs root")
    name = f"neuronish-test-{uuid.uuid4().hex[:8]}"
    v1, v2 = Path("/sys/fs/cgroup") / controller, Path("/sys/fs/cgroup")
    try:
        if (v1 / next(iter(v1_files))).exists():
            files, group = v1_files, v1 / name
        elif controller in (v2 / "cgroup.subtree_control").read_text().split():
            files, group = v2_files, v2 / name
        else:
            pytest.skip(f"no cgroup filesystem with the {controller} controller is mounted")
        group.mkdir()
        for file, text in files.items():
            (group / file).write_text(text)
        return group
    except OSError as e:
        pytest.skip(f"cannot make a cgroup with a {controller} limit here: {e}")


def _quota_group() -> Path:
    """A new cgroup limited to one CPU per period."""
    return _new_group("cpu", {"cpu.cfs_quota_us": "100000", "cpu.cfs_period_us": "100000"},
                      {"cpu.max": "100000 100000"})


def _in_group(group: Path, cmd: list[str]) -> list[str]:
    """`cmd` run by a shell that first joins `group`."""
    return ["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "sh", *cmd]


def _probe(executable: Path, group: Path | None) -> dict:
    import json

    cmd = [sys.executable, "-c", _PROBE, str(executable)]
    if group is not None:
        cmd = _in_group(group, cmd)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURONISH_CORE",
                                                                    "NEURONISH_HOST", "OMP_"))}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_one_cpu_quota_gives_one_thread_teams(tmp_path: Path) -> None:
    if usable_cpus() < 2:  # (a CI container's own quota caps the "outside" probe too)
        pytest.skip(f"needs 2 or more usable CPUs to tell a capped team from an uncapped one; "
                    f"this process has {usable_cpus()}")
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build the C runtime library")
    import tensorflow as tf

    from tests.graphs import trace
    from tests.runtime.test_capi_execute import compile_graph

    w = tf.constant(tf.random.stateless_normal((3, 3, 64, 64), seed=(1, 2)))
    wide = trace(lambda x: tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME")),  # 600 MFLOP
                 tf.TensorSpec([4, 32, 32, 64], tf.float32, name="x"))
    executable = tmp_path / "wide.neff"
    executable.write_bytes(compile_graph(tmp_path, "wide", wide.graph_def, wide.io_config))
    group = _quota_group()
    try:
        inside = _probe(executable, group)
    finally:
        group.rmdir()
    outside = _probe(executable, None)
    assert inside["ls"] == "host: 1 CPU(s) for the engine's threads (cgroup CPU quota 1 of " \
        f"{len(os.sched_getaffinity(0))} in the affinity mask)", inside
    del inside["ls"]
    assert inside == {"usable": 1, "core_threads": 1, "c_team": 1}, inside
    assert outside["usable"] >= 2 and outside["core_threads"] >= 2, outside
    assert outside["c_team"] >= 2, outside


def _memory_group(limit: int) -> Path:
    """A new cgroup whose memory limit is `limit` bytes."""
    return _new_group("memory", {"memory.limit_in_bytes": str(limit)},
                      {"memory.max": str(limit)})


def test_a_memory_limit_bounds_the_parallel_compilers() -> None:
    """In a group limited to 1 GiB the driver sees at most 1 GiB (not the host's
    MemAvailable) and runs one 600 MiB compiler at a time, not one per CPU."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 or more CPUs to tell a memory-bound count from a CPU-bound one")
    probe = ("from neuronish import compile_driver as d; "
             "print(d._available_memory(), d.default_max_num_compilers(600 << 20))")
    group = _memory_group(1 << 30)
    try:
        r = subprocess.run(_in_group(group, [sys.executable, "-c", probe]),
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
    finally:
        group.rmdir()
    assert r.returncode == 0, r.stderr[-2000:]
    available, compilers = (int(v) for v in r.stdout.split())
    assert 0 < available <= 1 << 30, available
    assert compilers == 1, r.stdout
