// What a process without Python gets of runtime/profiler.py and runtime/telemetry.py:
// with NEURONISH_PROFILE=DIR, the spans of every call (call, queue, execute and each
// engine instruction, measured) written at exit to DIR/neuronish-<pid>.json in the
// profiler's trace format, which `neuronish profile --read` prints; and the device
// counters (`neuronish ls/top`) published to <run dir>/<pid>.json every 0.5 s under
// telemetry.py's trust rules (its own directory 0700, temp file + rename, removed at
// exit). A host that does both itself (the Python runtime) calls nr_host_observes()
// before it opens a device, and this library then does neither, unless the host asks it
// to record a profile for it (nr_profile_start): it then takes the spans as JSON
// (nr_profile_stop) into its own trace.
//
// Cost when off: one relaxed atomic load per call and per chunk.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace nr {

class Device;
class Model;
struct Executable;

namespace observe {

// A model as the profile names it: per copy its device track, per stage and
// instruction its engine index, kind and TF nodes (as the trace's args JSON).
struct About {
  std::string name;
  uint64_t model_id = 0;  // Model::id: what tells two models of one label apart
  int64_t batch = -1;
  std::vector<std::string> copy_tracks;           // "device cores [0]: name"
  std::vector<std::vector<int64_t>> engine_index; // [stage][instruction] -> engine index or -1
  std::vector<std::vector<std::string>> kind;     // [stage][instruction]
  std::vector<std::vector<std::string>> args;     // [stage][instruction] JSON
};

extern std::atomic<bool> g_profiling;
inline bool profiling() { return g_profiling.load(std::memory_order_relaxed); }
// NEURONISH_PROFILE names a directory: every call of this process is timed, from the first
// device's opening to exit (recorded by this library, or by a host that observes).
extern std::atomic<bool> g_env_profile;
inline bool profiling_always() { return g_env_profile.load(std::memory_order_relaxed); }
double now();  // steady-clock seconds: the engine's instruction times use the same clock

void host_observes();                          // nr_host_observes
// On demand, for a host that observes (nr_profile_start / nr_profile_stop): start throws
// Refused while NEURONISH_PROFILE records; take_spans stops and returns the spans as JSON.
void start_recording();
std::string take_spans();
void device_opened();                          // reads NEURONISH_PROFILE once per process
void model_loaded(const Model *model);         // telemetry: publish it
void model_unloaded(const Model *model);       // (before its copies go)
void relabel(const Model *model, const std::function<void()> &set);  // set, under the publisher's lock
// A model's name: its output tensor names (a host has no label for it).
std::string model_name(const Executable &exe);
std::shared_ptr<const About> about(const Model &model);

void record_call(const std::shared_ptr<const About> &about, double start, double end);
// One chunk: waited from `queued`, ran on copy `copy` from `start` to `end`; `times[s]`
// the engine's [start, end] per engine instruction of stage s (empty: not timed).
void record_chunk(const std::shared_ptr<const About> &about, size_t copy, double queued, double start, double end,
                  const std::vector<std::vector<double>> &times);

}  // namespace observe
}  // namespace nr
