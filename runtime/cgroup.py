"""What this process's cgroups let it use: CPUs (the affinity mask capped by the CPU quota)
and memory (the tightest memory limit less what the group already uses).

A container limited to one CPU (Kubernetes `resources.limits.cpu: 1`, `docker run
--cpus 1`) on a bigger host still has every host CPU in its affinity mask. A team of
threads sized by the mask then spends the period's quota in parallel, the kernel stops
every thread of the group until the next period, and one primitive's barrier waits out
the stop. Measured on 2 vCPUs (AMD EPYC), MobileNetV2 fp32 batch 8 on the runtime under a
quota of 1.5 CPUs: 119-121 ms per call with two threads, 62 ms with one; no quota: 41 ms
with two. So the quota is rounded down, as Go's automaxprocs does: a thread the quota
cannot keep busy costs more than the part of a CPU it leaves unused. Likewise
/proc/meminfo's MemAvailable is the host's: parallel compilers sized by it in a pod
limited to 4 GiB on a 64 GiB node are killed by the group's OOM killer.

Both cgroup versions count: v2's `cpu.max` ("max 100000" or "QUOTA PERIOD") and
`memory.max`/`memory.current`, v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: none)
and `memory.limit_in_bytes`/`memory.usage_in_bytes`, on the process's own group and on
every ancestor up to the hierarchy's mount (a parent's limit binds its children too).
runtime/capi/cpu_quota.cc reads the CPU quota the same way for the C runtime.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from pathlib import Path


def usable_cpus(proc: Path = Path("/proc/self")) -> int:
    """CPUs in the affinity mask, at most the cgroup CPU quota rounded down, at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
    limit = cgroup_cpu_limit(proc)
    if limit is not None:
        cpus = min(cpus, math.floor(limit))
    return max(1, cpus)


def cgroup_cpu_limit(proc: Path = Path("/proc/self")) -> float | None:
    """The tightest CPU quota over this process's cgroups, in CPUs (quota / period); None
    when no cgroup limits CPU time or the cgroup files cannot be read. `proc` is the
    process's /proc directory (`/proc/<pid>` reads another process's)."""
    limits = _limits(proc, "cpu", _cpu_limit)
    return min(limits) if limits else None


def cgroup_memory_available(proc: Path = Path("/proc/self")) -> int | None:
    """Bytes this process's cgroups let it allocate before their OOM killer acts: the
    least, over its groups and their parents, of limit less usage; None when no group
    limits memory or the cgroup files cannot be read."""
    room = _limits(proc, "memory", _memory_room)
    return max(0, int(min(room))) if room else None


def _limits(proc: Path, controller: str,
            read: Callable[[Path, int], float | None]) -> list[float]:
    """`read(directory, version)` of each of the process's groups in a hierarchy that may
    hold `controller`'s files and of each parent up to the hierarchy's mount, where set.
    A group without the files (v2 enables a controller per subtree) sets nothing."""
    try:
        memberships = _read(proc / "cgroup").splitlines()
        mounts = _read(proc / "mountinfo").splitlines()
    except OSError:
        return []
    limits = []
    for directory, mount_point, version in _group_dirs(controller, memberships, mounts):
        for d in (directory, *directory.parents):
            limit = read(d, version)
            if limit is not None:
                limits.append(limit)
            if d == mount_point or mount_point not in d.parents:
                break
    return limits


def _group_dirs(controller: str, memberships: list[str],
                mounts: list[str]) -> list[tuple[Path, Path, int]]:
    """Each (directory of the process's group in a mounted hierarchy that may hold
    `controller`'s files, the hierarchy's mount point, cgroup version), from
    /proc/self/cgroup ("ID:CONTROLLERS:PATH") and mountinfo."""
    v1_path = v2_path = None
    for line in memberships:
        parts = line.split(":", 2)
        # (a group outside this process's cgroup namespace reads "/../x": no mount shows
        # it, and the namespace's root, which the mount shows, is not its ancestor)
        if len(parts) != 3 or ".." in parts[2].split("/"):
            continue
        if parts[0] == "0" and parts[1] == "":
            v2_path = parts[2]
        elif controller in parts[1].split(","):
            v1_path = parts[2]
    found = []
    for line in mounts:
        # ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        root, mount_point, fstype = fields[3], Path(_unescape(fields[4])), tail[0]
        if fstype == "cgroup2" and v2_path is not None:
            found.append((_group_dir(mount_point, root, v2_path), mount_point, 2))
        elif fstype == "cgroup" and v1_path is not None and controller in tail[2].split(","):
            found.append((_group_dir(mount_point, root, v1_path), mount_point, 1))
    return found


def _group_dir(mount_point: Path, mount_root: str, path: str) -> Path:
    """Where the group `path` is under a hierarchy mounted from `mount_root`. Inside a
    container the mount's root is often the container's own group (or, without a cgroup
    namespace, a path the process's one does not start with): its mount point then is
    the group."""
    root = mount_root.rstrip("/")
    if path == root or path.startswith(root + "/"):
        return mount_point / path[len(root):].lstrip("/")
    return mount_point


def _cpu_limit(directory: Path, version: int) -> float | None:
    """A group's CPU limit in CPUs; None when it sets none or its files are unreadable."""
    try:
        if version == 2:
            fields = _fields(_read(directory / "cpu.max"))
            quota, period = fields if len(fields) == 2 else ("", "")
        else:
            quota = _read(directory / "cpu.cfs_quota_us")
            period = _read(directory / "cpu.cfs_period_us")
    except OSError:
        return None
    q, p = _number(quota), _number(period)  # None: "max", no limit
    return q / p if q is not None and p is not None and q > 0 and p > 0 else None


# v1 writes "no limit" as the largest page-aligned int64 (9223372036854771712).
_V1_NO_MEMORY_LIMIT = 1 << 62


def _memory_room(directory: Path, version: int) -> float | None:
    """A group's memory limit less its usage, in bytes; None when it sets no limit."""
    names = ("memory.max", "memory.current") if version == 2 else \
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    try:
        limit, used = (_number(_read(directory / n)) for n in names)
    except OSError:
        return None
    if limit is None or used is None:  # "max": no limit
        return None
    return None if limit >= _V1_NO_MEMORY_LIMIT else limit - used


def _read(path: Path) -> str:
    """A /proc or cgroup file's text. Paths in mountinfo are bytes in no set encoding (a
    mount point named in Latin-1 is not UTF-8): undecodable bytes are kept as the
    surrogates os.fsencode turns back into them, never raised."""
    return path.read_text(encoding="utf-8", errors="surrogateescape")


# C's isspace, which cpu_quota.cc splits on (str.split also splits on "\x1c", "\xa0", ...).
_FIELD = re.compile(r"[^ \t\n\v\f\r]+")
_NUMBER = re.compile(r"[+-]?[0-9]{1,18}")


def _fields(text: str) -> list[str]:
    return _FIELD.findall(text)


def _number(text: str) -> int | None:
    """A file's text as a decimal integer ("-1", "150000\\n"); None for anything else
    ("max", "15x", "1_5", more than 18 digits), as cpu_quota.cc's whole_number."""
    fields = _fields(text)
    return int(fields[0]) if len(fields) == 1 and _NUMBER.fullmatch(fields[0]) else None


_ESCAPE = re.compile(r"\\([01][0-7]{2})")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\ooo,
    ASCII: at most \\177); a backslash followed by anything else is kept as it is."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)
