"""Device configuration from the environment (documented in the README)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .cgroup import usable_cpus

DEFAULT_NUM_CORES = 4
DEFAULT_CORE_MEMORY = 4 << 30  # 4 GiB per core
# The largest device accepted (runtime/capi/device.cc has the same): more is a typo, and
# a device of a billion cores would be built core by core before anything refused it.
MAX_CORES = 1024
MAX_CORE_MEMORY = 1 << 50  # 1 PiB per core
_SPACE = " \t\n\r\f\v"  # what the C reader trims (str.strip() would take Unicode spaces too)


class ConfigError(ValueError):
    """An environment variable has a value we cannot use."""


def parse_bytes(text: str, var: str) -> int:
    """A byte count as users write it in `var` (`4096`, `512KiB`, `64MiB`, `4GiB`);
    ConfigError naming the variable otherwise. Every size variable reads through this."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B?|B)?\s*", text, re.IGNORECASE | re.ASCII)
    if not m:
        raise ConfigError(f"{var}={text!r}: expected a byte count such as 4096, 512MiB or "
                          "4GiB")
    unit = (m.group(2) or "B").upper()[0]
    return int(m.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit]


def _count(text: str) -> int | None:
    """A count as both runtimes read one: ASCII digits only (no sign, `_` or other
    scripts' digits, which Python's int() would take), at most 9 of them; None otherwise."""
    text = text.strip(_SPACE)
    return int(text) if re.fullmatch(r"[0-9]{1,9}", text) else None


def _positive(var: str, text: str) -> int:
    count = _count(text)
    if count is None or count <= 0:
        raise ConfigError(f"{var} must be a positive integer, got {text!r}")
    return count


def _parse_cores(text: str, num_cores: int) -> list[int]:
    cores: list[int] = []
    out_of_range = False
    for part in text.split(","):
        lo_text, dash, hi_text = part.partition("-")
        lo, hi = _count(lo_text), _count(hi_text if dash else lo_text)
        if lo is None or hi is None:
            raise ConfigError(f"NEURONISH_VISIBLE_CORES={text!r}: expected e.g. '0-1', '2' or "
                              "'0,2'")
        # (a range past the last core is refused without being listed: 0-999999999)
        out_of_range |= lo <= hi and hi >= num_cores
        if not out_of_range:
            cores.extend(range(lo, hi + 1))
    if out_of_range or len(set(cores)) != len(cores) or not cores:
        raise ConfigError(f"NEURONISH_VISIBLE_CORES={text!r}: cores must be distinct and in "
                          f"0..{num_cores - 1} (NEURONISH_NUM_CORES={num_cores})")
    return cores


def _parse_groups(text: str, visible: list[int]) -> list[list[int]]:
    sizes: list[int] = []
    total = 0
    for part in text.split(","):
        a, x, b = part.partition("x")
        count, size = (_count(a), _count(b)) if x else (1, _count(a))
        if count is None or not size:
            raise ConfigError(f"NEURONISH_CORE_GROUP_SIZES={text!r}: expected e.g. '2,2' or "
                              "'4x1'")
        total += count * size
        if total <= len(visible):  # (listed only while they fit: 999999999x1 is refused)
            sizes.extend([size] * count)
    if total > len(visible):
        raise ConfigError(f"NEURONISH_CORE_GROUP_SIZES={text!r} needs {total} cores, only "
                          f"{len(visible)} are visible")
    groups, start = [], 0
    for size in sizes:
        groups.append(visible[start:start + size])
        start += size
    return groups


def _host_cpus() -> int:
    return usable_cpus()  # the affinity mask, capped by a container's CPU quota


def default_host_parallelism(env: dict[str, str], cpus: int) -> int:
    """How many programs the host can execute at once without oversubscribing it.

    The kernels' GEMMs run in numpy's BLAS, which already spreads each one over
    its threads: by default one per CPU, so a second program running at the same
    time only makes the two fight (ResNet50 at 4 concurrent calls on 2 CPUs loses
    ~15% throughput). BLAS threads are read the way OpenBLAS reads them."""
    blas = cpus
    for var in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        count = _count(env.get(var, ""))
        if count:
            blas = count
            break
    return max(1, cpus // blas)


@dataclass(frozen=True)
class DeviceConfig:
    num_cores: int
    core_memory: int
    visible_cores: tuple[int, ...]
    core_groups: tuple[tuple[int, ...], ...]
    # Programs executing at once on the host (the rest wait their turn); the
    # simulated cores' state and memory are unaffected.
    host_parallelism: int = 1
    # Host threads one program's element-wise kernels may split their blocks over
    # (kernels/parallel.py); by default each running program gets its share of
    # the CPUs, like BLAS gives each GEMM.
    kernel_threads: int = 1
    # Host threads the native engine runs one program's primitives on (OpenMP).
    core_threads: int = 1
    # Programs share the host's CPUs by the width of their teams (runtime/host.py);
    # False when NEURONISH_HOST_PARALLELISM fixes the number of programs at once.
    share_by_width: bool = True
    # NEURONISH_NARROW_TWIN (auto, queued, off): when the C runtime runs a wide program's
    # one-thread twin (runtime/capi/model.h). The Python runtime has no twins; it reads
    # the variable only so that both runtimes accept and refuse the same values.
    narrow_twin: str = "auto"

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> DeviceConfig:
        env = dict(os.environ if env is None else env)
        num_cores = DEFAULT_NUM_CORES
        if "NEURONISH_NUM_CORES" in env:
            text = env["NEURONISH_NUM_CORES"].strip(_SPACE)
            m = re.fullmatch(r"(-?)([0-9]{1,9})", text)
            if not m:
                raise ConfigError("NEURONISH_NUM_CORES must be a positive integer, got "
                                  f"{env['NEURONISH_NUM_CORES']!r}")
            count = int(m[2])
            if m[1] or count < 1:
                raise ConfigError(f"NEURONISH_NUM_CORES must be >= 1, got {text}")
            if count > MAX_CORES:
                raise ConfigError(f"NEURONISH_NUM_CORES must be at most {MAX_CORES}, got {text}")
            num_cores = count
        memory = env.get("NEURONISH_CORE_MEMORY")
        core_memory = parse_bytes(memory, "NEURONISH_CORE_MEMORY") if memory else \
            DEFAULT_CORE_MEMORY
        if core_memory > MAX_CORE_MEMORY:
            raise ConfigError(f"NEURONISH_CORE_MEMORY={memory!r}: at most 1PiB "
                              f"({MAX_CORE_MEMORY} bytes) per core")
        visible = env.get("NEURONISH_VISIBLE_CORES")
        cores = _parse_cores(visible, num_cores) if visible else list(range(num_cores))
        groups_text = env.get("NEURONISH_CORE_GROUP_SIZES")
        groups = _parse_groups(groups_text, cores) if groups_text else [[c] for c in cores]
        core_threads_text = env.get("NEURONISH_CORE_THREADS")
        given_threads = None if core_threads_text is None else \
            _positive("NEURONISH_CORE_THREADS", core_threads_text)
        parallelism = env.get("NEURONISH_HOST_PARALLELISM")
        cpus = _host_cpus()  # (read once: the affinity mask and the cgroup's quota)
        if parallelism is not None:
            host_parallelism = _positive("NEURONISH_HOST_PARALLELISM", parallelism)
        elif given_threads is not None:
            # Each running program takes its core's threads; as many run as fit the host.
            host_parallelism = max(1, cpus // given_threads)
        else:
            host_parallelism = default_host_parallelism(env, cpus)
        threads = env.get("NEURONISH_KERNEL_THREADS")
        kernel_threads = max(1, cpus // host_parallelism) if threads is None else \
            _positive("NEURONISH_KERNEL_THREADS", threads)
        core_threads = given_threads if given_threads is not None else \
            max(1, cpus // host_parallelism)
        twin = env.get("NEURONISH_NARROW_TWIN", "").strip(_SPACE) or "auto"
        if twin not in ("auto", "queued", "off"):
            raise ConfigError("NEURONISH_NARROW_TWIN must be auto, queued or off, got "
                              f"{env['NEURONISH_NARROW_TWIN']!r}")
        return DeviceConfig(num_cores, core_memory, tuple(cores),
                            tuple(tuple(g) for g in groups), host_parallelism, kernel_threads,
                            core_threads, share_by_width=parallelism is None,
                            narrow_twin=twin)
