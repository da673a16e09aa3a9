"""Both cgroup readers (runtime/cgroup.py, runtime/capi/cpu_quota.cc) agree on odd and
broken files and never raise from them: a mount point whose name is not UTF-8, a backslash
that starts no octal escape, numbers with trailing garbage, tabs, one field where cpu.max
has two, zero and negative quotas and periods. The well-formed cases are in test_cgroup.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from neuronish.runtime.cgroup import cgroup_cpu_limit, cgroup_memory_available
from tests.runtime.test_cgroup import (
    _group,
    _proc,
    _v1,
    _v1_mount,
    _v2_mount,
    cpp_reader,  # noqa: F401 - a fixture
)


def _cpp_limit(reader: Path, proc: Path) -> float | None:
    r = subprocess.run([str(reader), str(proc)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"the C++ reader failed on {proc}: {r.returncode} {r.stderr}"
    text = r.stdout.strip()
    return None if text == "none" else float(text)


def _both_find(reader: Path, proc: Path, want: float | None, what: str) -> None:
    assert cgroup_cpu_limit(proc) == (pytest.approx(want) if want else None), f"Python: {what}"
    assert _cpp_limit(reader, proc) == (pytest.approx(want) if want else None), f"C++: {what}"


@pytest.mark.parametrize("what, files, want", [
    ("trailing garbage", {"cpu.max": "150000abc 100000"}, None),
    ("a tab between the fields", {"cpu.max": "150000\t100000"}, 1.5),
    ("one field", {"cpu.max": "150000"}, None),
    ("three fields", {"cpu.max": "150000 100000 7"}, None),
    ("empty", {"cpu.max": ""}, None),
    ("quota 0", {"cpu.max": "0 100000"}, None),
    ("negative quota", {"cpu.max": "-5 100000"}, None),
    ("period 0", {"cpu.max": "150000 0"}, None),
    ("negative period", {"cpu.max": "150000 -100000"}, None),
    ("an underscore (Python's int takes it)", {"cpu.max": "1_50000 100000"}, None),
    ("more digits than an int64", {"cpu.max": "99999999999999999999999 100000"}, None),
    ("a plus sign", {"cpu.max": "+150000 100000"}, 1.5),
    ("a separator Python's str.split takes for a space", {"cpu.max": "150000\x1c100000"}, None),
    ("a no-break space", {"cpu.max": "150000\xa0 100000"}, None),
    ("binary", {"cpu.max": "\x00\x01 \x02"}, None),
])
def test_v2_cpu_max_garbage(tmp_path: Path, cpp_reader: Path,  # noqa: F811
                            what: str, files: dict[str, str], want: float | None) -> None:
    _group(tmp_path / "fs", "a", files)
    proc = _proc(tmp_path, "0::/a\n", [_v2_mount(tmp_path / "fs")])
    _both_find(cpp_reader, proc, want, what)


@pytest.mark.parametrize("what, quota, period, want", [
    ("trailing garbage", "150000x", "100000", None),
    ("garbage period", "150000", "1e5", None),
    ("no limit", "-1", "100000", None),
    ("spaces around", "  150000  ", " 100000 ", 1.5),
])
def test_v1_cpu_garbage(tmp_path: Path, cpp_reader: Path,  # noqa: F811
                        what: str, quota: str, period: str, want: float | None) -> None:
    _group(tmp_path / "fs", "a", {"cpu.cfs_quota_us": quota, "cpu.cfs_period_us": period})
    proc = _proc(tmp_path, "2:cpu,cpuacct:/a\n", [_v1_mount(tmp_path / "fs")])
    _both_find(cpp_reader, proc, want, what)


def test_a_mount_point_not_in_utf8(tmp_path: Path, cpp_reader: Path) -> None:  # noqa: F811
    """Mount points are bytes; one named in Latin-1 anywhere in mountinfo must not stop
    the readers (Python's read_text raised UnicodeDecodeError), and a quota under it counts."""
    point = os.fsencode(tmp_path) + b"/caf\xe9"
    os.makedirs(point + b"/g")
    for name, text in _v1(50000).items():
        with open(point + b"/g/" + name.encode(), "w") as f:
            f.write(text + "\n")
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("2:cpu:/g\n")
    (proc / "mountinfo").write_bytes(
        b"20 1 0:5 / /mnt/d\xe9j\xe0 rw - ext4 /dev/sda1 rw\n"
        b"30 25 0:27 / " + point + b" rw - cgroup cgroup rw,cpu\n")
    _both_find(cpp_reader, proc, 0.5, "a Latin-1 mount point")
    assert cgroup_memory_available(proc) is None


@pytest.mark.parametrize("name, escaped", [
    ("a\\9bc", "a\\9bc"),      # not octal: kept (C++'s std::stoi threw and killed the process)
    ("a\\08", "a\\08"),        # two octal digits then not: kept
    ("ends\\", "ends\\"),      # a backslash at the end
    ("my cpu", "my\\040cpu"),  # the kernel's escapes
    ("x\\y", "x\\134y"),
])
def test_backslashes_in_a_mount_point(tmp_path: Path, cpp_reader: Path,  # noqa: F811
                                      name: str, escaped: str) -> None:
    _group(tmp_path / name, "g", _v1(75000))
    mount = f"30 25 0:27 / {tmp_path}/{escaped} rw - cgroup cgroup rw,cpu"
    proc = _proc(tmp_path, "2:cpu:/g\n", [mount])
    _both_find(cpp_reader, proc, 0.75, f"mount point {escaped!r}")


def test_memory_garbage_is_no_limit(tmp_path: Path) -> None:
    _group(tmp_path / "fs", "a", {"memory.max": "4294967296x", "memory.current": "1"})
    _group(tmp_path / "fs", "b", {"memory.max": "4294967296", "memory.current": "1_0"})
    for group in ("a", "b"):
        d = tmp_path / group
        d.mkdir()
        proc = _proc(d, f"0::/{group}\n",
                     [f"31 25 0:28 / {tmp_path / 'fs'} rw - cgroup2 cgroup2 rw"])
        assert cgroup_memory_available(proc) is None, group


@pytest.mark.parametrize("cgroup", ["0::/../other\n", "0::/a/../../b\n"])
def test_a_group_outside_the_namespace_is_not_the_mounts(
        tmp_path: Path, cpp_reader: Path, cgroup: str) -> None:  # noqa: F811
    """A process in a group outside its cgroup namespace (/proc/self/cgroup "/../other")
    is not under the namespace's root, the mount: that root's quota is a sibling's."""
    _group(tmp_path / "fs", "", {"cpu.max": "50000 100000"})
    _group(tmp_path, "other", {"cpu.max": "25000 100000"})  # (where "fs/.." leads)
    proc = _proc(tmp_path, cgroup, [_v2_mount(tmp_path / "fs")])
    _both_find(cpp_reader, proc, None, cgroup.strip())
