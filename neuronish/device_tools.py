"""`neuronish ls` and `neuronish top`: the device and who uses it, from the counters
every process publishes (runtime/telemetry.py). Never imports TensorFlow."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from neuronish.runtime import telemetry
from neuronish.runtime.cgroup import cgroup_cpu_limit, usable_cpus
from neuronish.runtime.config import ConfigError, DeviceConfig


def size(n: int) -> str:
    """Bytes in the largest unit that keeps the figure at 1 or more: a tiny model's
    12 KiB must not read as "0.0 MiB"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _device_line(processes: list[dict]) -> list[str]:
    """The device as the processes using it see it, else as this environment configures it."""
    if processes:
        d = processes[0]["device"]
        num, visible, groups, memory = (d["num_cores"], d["visible_cores"], d["core_groups"],
                                        d["core_memory"])
        engine = d.get("engine", "default")
    else:
        c = DeviceConfig.from_env()
        num, visible, groups, memory = (c.num_cores, list(c.visible_cores),
                                        [list(g) for g in c.core_groups], c.core_memory)
        engine = "-"
    return [f"device: {num} core(s), visible {visible}, core groups {groups}, "
            f"{size(memory)} per core, engine {engine}"] + ([] if processes else [_host_line()])


def _host_line() -> str:
    """The CPUs this environment's teams are sized by, and why when a quota caps them."""
    cpus, limit = usable_cpus(), cgroup_cpu_limit()
    try:
        mask = len(os.sched_getaffinity(0))
    except AttributeError:
        mask = os.cpu_count() or 1
    why = f" (cgroup CPU quota {limit:g} of {mask} in the affinity mask)" \
        if limit is not None and limit < mask else ""
    return f"host: {cpus} CPU(s) for the engine's threads{why}"


def _memory_by_core(processes: list[dict]) -> dict[int, int]:
    used: dict[int, int] = {}
    for p in processes:
        for core, c in p["cores"].items():
            used[int(core)] = used.get(int(core), 0) + c["used_bytes"]
    return used


def _failed_cores(processes: list[dict]) -> dict[int, str]:
    """core -> why it failed, as any process using the device reports it."""
    return {int(core): c["failed"] for p in processes for core, c in p["cores"].items()
            if c.get("failed")}


def format_ls(processes: list[dict]) -> str:
    lines = _device_line(processes)
    memory = processes[0]["device"]["core_memory"] if processes else DeviceConfig.from_env(
    ).core_memory
    used, failed = _memory_by_core(processes), _failed_cores(processes)
    lines.append("core  memory used")
    for core in sorted(used) or []:
        lines.append(f"{core:>4}  {size(used[core]):>10} of {size(memory)}"
                     + (f"  FAILED: {failed[core]}" if core in failed else ""))
    if not processes:
        lines.append(f"no process is using the device (counters in {telemetry.run_dir()})")
        return "\n".join(lines)
    lines += ["", f"{'pid':>7}  {'model':<40} {'core groups':<16} {'per core':>10} "
                  f"{'calls':>8}  command"]
    for p in processes:
        if not p["models"]:
            lines.append(f"{p['pid']:>7}  {'(no model loaded)':<40} {'':<16} {'':>10} "
                         f"{'':>8}  {p['command']}")
        for m in p["models"]:
            lines.append(f"{p['pid']:>7}  {m['name'][:40]:<40} "
                         f"{str(m['core_groups'])[:16]:<16} "
                         f"{size(max(m['bytes_per_core'])):>10} {m['calls']:>8}  "
                         f"{p['command'][:60]}")
            if isinstance(note := m.get("note"), str) and note:  # (runtime.load's reason)
                note = "".join(ch if ch.isprintable() else "?" for ch in note[:120])
                lines.append(f"{'':>7}    on the Python runtime: {note}")
    return "\n".join(lines)


def rates(before: list[dict], after: list[dict]) -> dict:
    """Per-core utilisation and per-model inferences/s between two readings."""
    old = {p["pid"]: p for p in before}
    cores: dict[int, float] = {}
    models = []
    for p in after:
        q = old.get(p["pid"])
        if q is None:
            continue  # appeared between the readings: no rate yet
        wall = p["time"] - q["time"]
        if wall <= 0:
            continue
        for core, c in p["cores"].items():
            prev = q["cores"].get(core, {"busy_seconds": 0.0})["busy_seconds"]
            cores[int(core)] = cores.get(int(core), 0.0) + (c["busy_seconds"] - prev) / wall
        prev_models = {m["id"]: m for m in q["models"]}
        for m in p["models"]:
            pm = prev_models.get(m["id"])
            if pm is not None:
                models.append({"pid": p["pid"], "name": m["name"],
                               "core_groups": m["core_groups"],
                               "inferences_per_second": (m["inferences"] - pm["inferences"]) / wall,
                               "calls_per_second": (m["calls"] - pm["calls"]) / wall})
    # Utilisation is a share of one core's time; overlapping copies cannot exceed it.
    return {"cores": {c: min(u, 1.0) for c, u in sorted(cores.items())}, "models": models}


def format_top(processes: list[dict], r: dict) -> str:
    lines = _device_line(processes)
    memory = processes[0]["device"]["core_memory"] if processes else 0
    used, failed = _memory_by_core(processes), _failed_cores(processes)
    lines.append("core  util  memory used")
    for core in sorted(set(used) | set(r["cores"])):
        util = r["cores"].get(core, 0.0)
        bar = f"FAILED: {failed[core]}" if core in failed else "#" * round(util * 20)
        lines.append(f"{core:>4}  {util:4.0%}  {size(used.get(core, 0)):>10} of "
                     f"{size(memory)}  {bar}")
    lines += ["", f"{'pid':>7}  {'model':<40} {'core groups':<16} {'inf/s':>9} {'calls/s':>8}"]
    for m in r["models"]:
        lines.append(f"{m['pid']:>7}  {m['name'][:40]:<40} {str(m['core_groups'])[:16]:<16} "
                     f"{m['inferences_per_second']:9.1f} {m['calls_per_second']:8.1f}")
    if not r["models"]:
        lines.append("(no model running)")
    return "\n".join(lines)


def _read(reported: set[str] | None = None) -> list[dict]:
    """Every process's counters; files in the run dir that are not counters are named
    on stderr, one line each (not a traceback: anyone's file can be there), once per
    command (`reported` holds those named already)."""
    skipped: list[str] = []
    processes = telemetry.read_all(skipped=skipped)
    for line in skipped:
        if reported is None or line not in reported:
            print(f"neuronish: skipped {line}", file=sys.stderr)
    if reported is not None:
        reported.update(skipped)
    return processes


# How long a screen waits for processes whose counters were not republished since the
# previous reading: a publisher writes every PUBLISH_INTERVAL seconds, later on a loaded
# host, and two readings of one snapshot give no rate at all.
_REPUBLISH_WAIT = 10 * telemetry.PUBLISH_INTERVAL


def _read_after(before: list[dict], reported: set[str]) -> list[dict]:
    """A reading in which every process of `before` still alive has published anew
    (or `_REPUBLISH_WAIT` seconds have passed)."""
    seen = {p["pid"]: p["time"] for p in before}
    deadline = time.monotonic() + _REPUBLISH_WAIT
    while True:
        after = _read(reported)
        stale = [p for p in after if p["pid"] in seen and p["time"] <= seen[p["pid"]]]
        if not stale or time.monotonic() >= deadline:
            return after
        time.sleep(telemetry.PUBLISH_INTERVAL / 5)


def ls(args: argparse.Namespace) -> int:
    try:
        processes = _read()
        if args.json:
            print(json.dumps({"processes": processes}, indent=1))
        else:
            print(format_ls(processes))
    except (ConfigError, telemetry.UntrustedRunDir) as e:
        print(f"neuronish: error: {e}", file=sys.stderr)
        return 2
    return 0


def top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("neuronish: error: --interval must be > 0", file=sys.stderr)
        return 2
    clear = sys.stdout.isatty() and not args.json
    reported: set[str] = set()
    try:
        before = _read(reported)
    except telemetry.UntrustedRunDir as e:
        print(f"neuronish: error: {e}", file=sys.stderr)
        return 2
    done = 0
    try:
        while args.iterations == 0 or done < args.iterations:
            time.sleep(args.interval)
            after = _read_after(before, reported)
            r = rates(before, after)
            if args.json:
                print(json.dumps({"time": time.time(), **r}), flush=True)
            else:
                text = format_top(after, r)
                print(("\x1b[H\x1b[2J" if clear else "") + text + ("" if clear else "\n"),
                      flush=True)
            before, done = after, done + 1
    except KeyboardInterrupt:
        pass
    except telemetry.UntrustedRunDir as e:
        print(f"neuronish: error: {e}", file=sys.stderr)
        return 2
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ls", help="the device: cores, groups, memory, and the processes and "
                       "models using it")
    p.add_argument("--json", action="store_true", help="every process's raw counters")
    p.set_defaults(handler=ls)
    t = sub.add_parser("top", help="live per-core utilisation, device memory and inferences/s "
                       "per process and model")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between readings")
    t.add_argument("--iterations", "-n", type=int, default=0,
                   help="stop after this many screens (default: until Ctrl-C)")
    t.add_argument("--json", action="store_true", help="one JSON line per reading")
    t.set_defaults(handler=top)


_last_scrape: dict[int, tuple[float, float]] = {}  # core -> (time, busy seconds) last scraped


def prometheus_lines() -> list[str]:
    """This process's device counters in Prometheus' text format (the model server's
    /monitoring/prometheus/metrics): busy seconds (rate() of it is utilisation), the
    utilisation since the previous scrape, and device memory, per core."""
    from neuronish.runtime import get_device

    device = get_device()
    t = telemetry.get_telemetry()
    snap = t.snapshot() if t is not None and t._device is device else None
    busy = {int(c): v["busy_seconds"] for c, v in snap["cores"].items()} if snap else {}
    now = time.monotonic()
    memory = device.memory_report()
    lines = [
        "# HELP :neuronish:device:core_busy_seconds_total Seconds each core spent executing "
        "programs (rate() of it is the core's utilisation).",
        "# TYPE :neuronish:device:core_busy_seconds_total counter",
        *[f':neuronish:device:core_busy_seconds_total{{core="{c}"}} {busy.get(c, 0.0)!r}'
          for c in memory],
        "# HELP :neuronish:device:core_utilization Share of time each core was busy since the "
        "previous scrape (0..1).",
        "# TYPE :neuronish:device:core_utilization gauge",
    ]
    for c in memory:
        then, before = _last_scrape.get(c, (now, busy.get(c, 0.0)))
        util = (busy.get(c, 0.0) - before) / (now - then) if now > then else 0.0
        lines.append(f':neuronish:device:core_utilization{{core="{c}"}} '
                     f'{min(max(util, 0.0), 1.0)!r}')
        _last_scrape[c] = (now, busy.get(c, 0.0))
    lines += [
        "# HELP :neuronish:device:memory_used_bytes Device memory in use per core.",
        "# TYPE :neuronish:device:memory_used_bytes gauge",
        *[f':neuronish:device:memory_used_bytes{{core="{c}"}} {m["used"]}'
          for c, m in memory.items()],
        "# HELP :neuronish:device:memory_total_bytes Device memory per core.",
        "# TYPE :neuronish:device:memory_total_bytes gauge",
        *[f':neuronish:device:memory_total_bytes{{core="{c}"}} {m["used"] + m["free"]}'
          for c, m in memory.items()],
    ]
    return lines
