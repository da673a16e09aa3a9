// The simulated device in C++: its configuration from the NEURONISH_* environment (as
// runtime/config.py reads it), its cores' memory (runtime/device.py's accounting: a
// model charges each core of each core group it lands on), its failed cores
// (runtime/device.py's fail_core), and the host's CPUs shared by the programs computing
// at once (runtime/host.py).
#pragma once
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace nr {

class Model;  // model.h

struct DeviceConfig {
  int num_cores = 4;
  uint64_t core_memory = uint64_t(4) << 30;
  std::vector<int> visible_cores;
  std::vector<std::vector<int>> core_groups;
  int host_parallelism = 1;
  int core_threads = 1;       // OpenMP threads one program's instructions may use
  bool share_by_width = true; // false when NEURONISH_HOST_PARALLELISM fixes programs at once
  // NEURONISH_NARROW_TWIN: when a wide program runs its one-thread twin (model.h).
  enum class Twin { off, queued, automatic } narrow_twin = Twin::automatic;
  // NEURONISH_FAILED_CORES: cores failed from the start, each with why, in the order named.
  std::vector<std::pair<int, std::string>> failed_cores;
};

// From the environment; throws Refused{NR_INVALID_CONFIG} naming the variable.
DeviceConfig config_from_env();

// runtime/host.py's HostCPUs: `cpus` shared by programs, each taking its team's width
// while it computes; waiters are served in arrival order.
class HostCPUs {
 public:
  HostCPUs(int cpus, int fixed_width);  // fixed_width <= 0: programs take their own width
  int width(int team) const;            // what a program of `team` threads holds
  // Waits in line; with `give_up`, looks at it every `poll` and returns false (leaving the
  // line) once it says so.
  bool acquire(int n, const std::function<bool()> &give_up = nullptr,
               std::chrono::milliseconds poll = std::chrono::milliseconds(20));
  // For a program that can also run on one thread: n CPUs when `wide_if_idle`, n are free
  // and nobody waits (the team makes no one wait and leaves no CPU idle), else acquire(1).
  // The CPUs taken; 0 when given up.
  int acquire_either(int n, bool wide_if_idle, const std::function<bool()> &give_up = nullptr);
  void release(int n);

 private:
  int cpus_, fixed_, free_;
  uint64_t next_ticket_ = 0;
  std::deque<uint64_t> waiting_;
  std::mutex mu_;
  std::condition_variable cv_;
};

struct Reservation {
  std::vector<int> cores;
  std::vector<uint64_t> bytes_per_core;
};

class Device {
 public:
  explicit Device(DeviceConfig config);
  const DeviceConfig &config() const { return config_; }
  HostCPUs &host() { return host_; }
  // `copies` core groups of `group_size` cores, core k of each holding bytes_per_core[k];
  // all or nothing (Refused: NR_DEVICE_ERROR, NR_OUT_OF_DEVICE_MEMORY).
  std::vector<Reservation> reserve(size_t group_size, const std::vector<uint64_t> &bytes_per_core,
                                   size_t copies);
  void resize(Reservation &r, const std::vector<uint64_t> &bytes_per_core);
  void release(const Reservation &r);
  // Memory held on this device's cores by something other than its models (the Python
  // runtime's models, so a process has one budget): deltas[k] bytes more (or fewer) on
  // cores[k]; all or nothing (Refused: NR_OUT_OF_DEVICE_MEMORY, NR_INVALID_ARGUMENT).
  void charge(const std::vector<int> &cores, const std::vector<int64_t> &deltas);
  uint64_t used(int core);

  // Core `core` fails (simulated, as runtime/device.py's fail_core): loads avoid it from
  // now on, and every model with a copy on it retires that copy (Model::lose_core). Its
  // message is "core <core> failed (<why>)"; failing it again keeps the first. Refused
  // (NR_INVALID_ARGUMENT) for a core that is not visible.
  void fail_core(int core, const std::string &why);
  // "core <core> failed (<why>)", or "" for a working core; Refused for one not visible.
  std::string failure(int core);
  // Models loaded on this device, so that a core failing reaches them: a model tracks
  // itself once loaded (losing at once any of its cores that failed while it loaded) and
  // untracks itself before it is destroyed.
  void track(Model *model);
  void untrack(Model *model);

 private:
  std::vector<std::vector<int>> candidate_groups(size_t size) const;  // (under mu_)
  uint64_t free_bytes(int core) const { return config_.core_memory - used_.at(core); }
  bool failed(int core) const;  // (under mu_)
  DeviceConfig config_;
  std::map<int, uint64_t> used_;
  std::vector<std::pair<int, std::string>> failed_;  // core, message; in failure order
  std::mutex mu_;  // used_ and failed_ (taken last: never held while taking another)
  std::set<Model *> models_;
  std::mutex models_mu_;  // models_; held while a failure reaches them (then idle_mu_, mu_)
  HostCPUs host_;
};

}  // namespace nr
