"""HostCPUs::acquire_either (runtime/capi/device.cc), through a small program built from
device.cc: a program with a one-thread twin takes its team's CPUs when they are free and
nobody waits, else one CPU. On a host wider than the team, a second call's team still
fits beside the first: it must not be sent to one thread while CPUs stay idle (the old
rule, "the whole host idle", ran every concurrent call of a 2-thread program on one CPU
of a 16-CPU host). The 2-vCPU CI host cannot show this through a model (a team there is
the whole host), hence the program.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_MAIN = r"""
#include <cstdio>
#include "device.h"
using nr::HostCPUs;
int main() {
  {  // 4 CPUs, a team of 2 computes: a second team of 2 fits
    HostCPUs host(4, 0);
    host.acquire(2);
    std::printf("room %d\n", host.acquire_either(2, true));
  }
  {  // 2 CPUs, one twin computes: the team does not fit
    HostCPUs host(2, 0);
    host.acquire(1);
    std::printf("busy %d\n", host.acquire_either(2, true));
  }
  {  // the team watch says the team is held up: one CPU however free the host
    HostCPUs host(4, 0);
    std::printf("held_up %d\n", host.acquire_either(2, false));
  }
  {  // an idle host: the team
    HostCPUs host(2, 0);
    std::printf("idle %d\n", host.acquire_either(2, true));
  }
}
"""


@pytest.fixture(scope="module")
def host_cpus_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to build device.cc's HostCPUs")
    d = tmp_path_factory.mktemp("host_cpus")
    (d / "main.cc").write_text(_MAIN)
    capi = ROOT / "runtime" / "capi"
    exe = d / "host_cpus"
    # (only HostCPUs is linked in: sections nothing here uses, and the rest of the runtime
    # they call, are dropped)
    subprocess.run(["g++", "-std=c++17", "-O1", "-pthread", "-ffunction-sections",
                    "-Wl,--gc-sections", f"-I{capi}",
                    f"-I{ROOT / 'runtime' / 'include'}", str(d / "main.cc"),
                    str(capi / "device.cc"), str(capi / "cpu_quota.cc"), "-o", str(exe)],
                   check=True, timeout=300)
    return exe


def test_a_team_that_fits_beside_another_runs_wide(host_cpus_program: Path) -> None:
    r = subprocess.run([str(host_cpus_program)], capture_output=True, text=True, timeout=60,
                       check=True)
    taken = dict(line.split() for line in r.stdout.splitlines())
    assert taken == {"room": "2", "busy": "1", "held_up": "1", "idle": "2"}, r.stdout
