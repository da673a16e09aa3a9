"""Per-call time of a compiled model in a cgroup with a CPU quota, with the team the
quota allows (the default now) against a team of every CPU in the affinity mask (the old
default), settings alternating in fresh processes. Needs root and a cgroup filesystem
with the cpu controller (v1 `cpu`, or v2 with `cpu` in the root's subtree_control), and
not under `chrt`: a real-time task may not join a group with a CFS quota.

    python benchmarks/cpu_quota.py COMPILED_SAVED_MODEL [--quota 1.5] [--seconds 8]
                                   [--rounds 2] [--batch 8]

Prints median, p90 and p99 per call for each setting and round, and the load average.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import statistics, sys, time
import numpy as np
from neuronish.cc.saved_model_executables import neuron_op_executables
from neuronish.runtime import load
from neuronish.runtime.config import DeviceConfig
m = load(max(neuron_op_executables(sys.argv[1]), key=lambda o: len(o.executable)).executable)
rng = np.random.default_rng(0)
feeds = {s.name: rng.uniform(0, 255, s.shape).astype(s.dtype) for s in m.inputs}
for _ in range(3):
    m.run(feeds)
t, end = [], time.perf_counter() + float(sys.argv[2])
while time.perf_counter() < end:
    s = time.perf_counter(); m.run(feeds); t.append(time.perf_counter() - s)
t.sort()
print(f"threads {DeviceConfig.from_env().core_threads}: {len(t)} calls, median "
      f"{statistics.median(t) * 1e3:.2f} ms, p90 {t[int(len(t) * .9)] * 1e3:.2f}, "
      f"p99 {t[int(len(t) * .99)] * 1e3:.2f}")
"""


def make_group(quota: float) -> Path:
    name = f"neuronish-bench-{uuid.uuid4().hex[:8]}"
    v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
    if (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(quota * 100000)))
    else:
        group = v2 / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{int(quota * 100000)} 100000")
    return group


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a neuronish.saved_model.compile output directory")
    p.add_argument("--quota", type=float, default=1.5, help="CPUs per period")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    group = make_group(args.quota)
    cpus = len(os.sched_getaffinity(0))
    from neuronish.cc.host import cpu_flags

    print(f"quota {args.quota} CPUs in {group}; affinity {cpus} CPUs; flags "
          f"{sorted(cpu_flags() & {'amx_bf16', 'avx512_bf16'})}")
    try:
        for _ in range(args.rounds):
            for threads in (None, str(cpus)):  # the quota's team, then the mask's
                env = {k: v for k, v in os.environ.items()
                       if not k.startswith(("NEURONISH_CORE", "NEURONISH_HOST"))}
                if threads:
                    env["NEURONISH_CORE_THREADS"] = threads
                cmd = ["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "sh",
                       sys.executable, "-c", _PROBE, args.model, str(args.seconds)]
                r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
                print((r.stdout.strip() or r.stderr[-2000:]) +
                      ("  (old default)" if threads else "  (quota's team)"))
    finally:
        group.rmdir()
    print(f"load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
