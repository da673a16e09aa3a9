"""Device configuration from the environment (documented in the README)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .cgroup import usable_cpus

DEFAULT_NUM_CORES = 4
DEFAULT_CORE_MEMORY = 4 << 30  # 4 GiB per core


class ConfigError(ValueError):
    """An environment variable has a value we cannot use."""


def parse_bytes(text: str, var: str) -> int:
    """A byte count as users write it in `var` (`4096`, `512KiB`, `64MiB`, `4GiB`);
    ConfigError naming the variable otherwise. Every size variable reads through this."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ConfigError(f"{var}={text!r}: expected a byte count such as 4096, 512MiB or "
                          "4GiB")
    unit = (m.group(2) or "B").upper()[0]
    return int(m.group(1)) * {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit]


def _parse_cores(text: str, num_cores: int) -> list[int]:
    cores: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise ConfigError(f"NEURONISH_VISIBLE_CORES={text!r}: expected e.g. '0-1', '2' or "
                              "'0,2'")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        cores.extend(range(lo, hi + 1))
    bad = [c for c in cores if c >= num_cores]
    if bad or len(set(cores)) != len(cores) or not cores:
        raise ConfigError(f"NEURONISH_VISIBLE_CORES={text!r}: cores must be distinct and in "
                          f"0..{num_cores - 1} (NEURONISH_NUM_CORES={num_cores})")
    return cores


def _parse_groups(text: str, visible: list[int]) -> list[list[int]]:
    sizes: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:x\s*(\d+)\s*)?", part)
        if not m or int(m.group(2) or m.group(1)) == 0:
            raise ConfigError(f"NEURONISH_CORE_GROUP_SIZES={text!r}: expected e.g. '2,2' or "
                              "'4x1'")
        count, size = (int(m.group(1)), int(m.group(2))) if m.group(2) else (1, int(m.group(1)))
        sizes.extend([size] * count)
    if sum(sizes) > len(visible):
        raise ConfigError(f"NEURONISH_CORE_GROUP_SIZES={text!r} needs {sum(sizes)} cores, only "
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
        text = env.get(var, "").strip()
        if text.isdigit() and int(text) > 0:
            blas = int(text)
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
        try:
            num_cores = int(env.get("NEURONISH_NUM_CORES", DEFAULT_NUM_CORES))
        except ValueError:
            raise ConfigError("NEURONISH_NUM_CORES must be a positive integer, got "
                              f"{env['NEURONISH_NUM_CORES']!r}") from None
        if num_cores < 1:
            raise ConfigError(f"NEURONISH_NUM_CORES must be >= 1, got {num_cores}")
        memory = env.get("NEURONISH_CORE_MEMORY")
        core_memory = parse_bytes(memory, "NEURONISH_CORE_MEMORY") if memory else \
            DEFAULT_CORE_MEMORY
        visible = env.get("NEURONISH_VISIBLE_CORES")
        cores = _parse_cores(visible, num_cores) if visible else list(range(num_cores))
        groups_text = env.get("NEURONISH_CORE_GROUP_SIZES")
        groups = _parse_groups(groups_text, cores) if groups_text else [[c] for c in cores]
        core_threads_text = env.get("NEURONISH_CORE_THREADS")
        if core_threads_text is not None and not (
                core_threads_text.strip().isdigit() and int(core_threads_text) > 0):
            raise ConfigError("NEURONISH_CORE_THREADS must be a positive integer, got "
                              f"{core_threads_text!r}")
        parallelism = env.get("NEURONISH_HOST_PARALLELISM")
        if parallelism is None and core_threads_text is not None:
            # Each running program takes its core's threads; as many run as fit the host.
            host_parallelism = max(1, _host_cpus() // int(core_threads_text))
        elif parallelism is None:
            host_parallelism = default_host_parallelism(env, _host_cpus())
        elif parallelism.strip().isdigit() and int(parallelism) > 0:
            host_parallelism = int(parallelism)
        else:
            raise ConfigError("NEURONISH_HOST_PARALLELISM must be a positive integer, got "
                              f"{parallelism!r}")
        threads = env.get("NEURONISH_KERNEL_THREADS")
        if threads is None:
            kernel_threads = max(1, _host_cpus() // host_parallelism)
        elif threads.strip().isdigit() and int(threads) > 0:
            kernel_threads = int(threads)
        else:
            raise ConfigError("NEURONISH_KERNEL_THREADS must be a positive integer, got "
                              f"{threads!r}")
        core_threads = int(core_threads_text) if core_threads_text is not None else \
            max(1, _host_cpus() // host_parallelism)
        twin = env.get("NEURONISH_NARROW_TWIN", "").strip() or "auto"
        if twin not in ("auto", "queued", "off"):
            raise ConfigError("NEURONISH_NARROW_TWIN must be auto, queued or off, got "
                              f"{env['NEURONISH_NARROW_TWIN']!r}")
        return DeviceConfig(num_cores, core_memory, tuple(cores),
                            tuple(tuple(g) for g in groups), host_parallelism, kernel_threads,
                            core_threads, share_by_width=parallelism is None,
                            narrow_twin=twin)
