// The CPUs this process can really use: runtime/cgroup.py in C++ (its docstring says
// why a cgroup CPU quota caps the affinity mask, rounded down, and what it measured).
#pragma once

#include <optional>
#include <string>

namespace nr {

// CPUs in the affinity mask, at most the cgroup CPU quota rounded down, at least 1.
int usable_cpus();

// The tightest CPU quota (quota / period, in CPUs) over the cgroups of the process whose
// /proc directory is `proc`, v1 and v2, each group up to its hierarchy's mount; nullopt
// when none limits CPU time or the files cannot be read.
std::optional<double> cgroup_cpu_limit(const std::string &proc = "/proc/self");

}  // namespace nr
