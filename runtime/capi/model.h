// A model on the device (runtime/model.py in C++): loaded onto `duplicates` core groups,
// each copy with its engine programs (engine_program.h) and one arena per call in
// flight; `execute` checks a call's tensors against the signature and splits a batch
// other than the compiled one into chunks of the compiled size (the last padded by
// repeating its last row), runs them on the copies, and assembles the outputs.
//
// Thread safety: `execute` may be called from any number of threads. A call waits for an
// idle copy; its stages then run on their cores' host threads (core_thread.h: a core runs
// one stage at a time, in arrival order), each holding its share of the host's CPUs while
// it computes, the call handed from core to core and its caller waiting for the last. A
// single-stage call runs on its caller's thread when its core is idle and nobody waits.
#pragma once
#include <atomic>
#include <climits>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "compiled_call.h"
#include "core_thread.h"
#include "cutoff.h"
#include "device.h"
#include "engine_program.h"
#include "executable.h"
#include "observe.h"

namespace nr {

// Two calls on two CPUs compute more than one call on both: a team of two threads gave
// 1.29x one thread on a small CNN (batch 1, 0.34 vs 0.44 ms) and 1.52x on MobileNetV2
// (batch 8) on 2 vCPUs. So while the host is busy a copy runs its one-thread twin on one
// CPU, and a lone call still gets the whole team. The twin reorders the weights again,
// hence this bound.
constexpr uint64_t kNarrowTwinWeightBytes = uint64_t(32) << 20;

// Whether a copy's team is being held up by processes the host cannot see in its own
// accounting: its wide runs' wall time against the best it has shown, and its best against
// the twin's. Relaxed atomics: callers race on it, and a stale reading only costs one run
// on the other program.
struct TeamHealth {
  std::atomic<int64_t> best_ns{INT64_MAX};       // fastest wide run so far
  std::atomic<int64_t> recent_ns{0};             // recent wide runs (moving average)
  std::atomic<int64_t> twin_best_ns{INT64_MAX};  // fastest twin run so far
  std::atomic<uint32_t> wide_runs{0}, twin_runs{0};
  std::atomic<uint32_t> twin_streak{0};  // twin runs since the last wide one
  std::atomic<uint32_t> wide_streak{0};  // wide runs since the last twin one
  std::atomic<uint32_t> twin_gap{0};     // wide runs before the twin's next probe
  // A lone call on an idle host takes the team, once the twin's best is known too (its
  // runs 4 and 5 are the twin's, then one after 8, 16, 32 ... 1024 wide runs: a probe
  // that found the twin's CPU shared must not decide for good), unless the team is held
  // up: its recent runs slow against its best, or even its best slower than the twin's
  // (other processes on the CPUs from the first call). Then the twin, with one run in
  // kProbeEvery back on the team to see whether the load has gone.
  bool wide_if_idle();
  void wide_ran(int64_t ns);
  void twin_ran(int64_t ns);
};

struct Copy {
  std::unique_ptr<CopyProgram> program;
  // The same program built for one thread, run when the host is not idle (model.cc,
  // narrow_twin); null when the copy has none.
  std::unique_ptr<CopyProgram> narrow;
  std::atomic<uint64_t> narrow_runs{0};  // (nr_model_narrow_runs, for tests)
  TeamHealth team;  // how the wide program's recent runs compare with its best (model.cc)
  Reservation reservation;
  std::vector<void *> all_arenas;  // one per stage: calls in flight on the copy at once
  std::vector<std::unique_ptr<CoreThread>> cores;  // per stage: its core's host thread
  // Per stage, the thread that last ran it (nr_model_stage_thread, for tests).
  std::unique_ptr<std::atomic<int64_t>[]> ran_on;
  // Telemetry (nr_model_copy): runs of its program and their wall time.
  std::atomic<uint64_t> runs{0};
  std::atomic<uint64_t> busy_ns{0};
  // Per stage, where its engine writes each instruction's [start, end] while a profile
  // records (observe.h): set on the engine by the stage's first timed run, taken off by
  // the next run that is not, so a model loaded before recording started is timed too,
  // and one recorded once costs no clock reads after (written and read only by whichever
  // thread holds the stage's core).
  struct StageTiming {
    std::vector<double> times;
    bool armed = false;  // the engine writes into `times`
  };
  std::vector<StageTiming> timing;
  // One of its cores failed (Model::lose_core): no call takes it again, its device memory
  // was given back. (Under Model::idle_mu_.)
  bool retired = false;
  ~Copy();
};

class Model {
 public:
  Model(std::shared_ptr<Device> device, std::shared_ptr<const Executable> exe, size_t duplicates);
  ~Model();
  // The call: inputs and outputs in signature order (nr_tensor as the header defines).
  // `cutoff` (may be null): where to give up (cutoff.h).
  void execute(const nr_tensor *inputs, size_t num_inputs, const nr_tensor *outputs, size_t num_outputs,
               const Cutoff *cutoff);
  const Executable &exe() const { return *exe_; }
  int64_t batch_size() const { return batch_size_; }  // -1: no split (compiled shapes only)
  size_t duplicates() const { return copies_.size(); }
  const Copy &copy(size_t k) const { return *copies_[k]; }
  std::shared_ptr<Device> device() const { return device_; }
  // The name profiles and `neuronish ls` show (nr_model_set_label; its outputs' names by
  // default). Read by the telemetry publisher under its lock (observe::relabel) and by
  // observe::about under about_mu_; set under both, so a label may change while calls run.
  const std::string &label() const { return label_; }
  void set_label(const std::string &label);
  // A number no other model of this process has had (nr_model_id): profile spans carry
  // it, since two models may share a label (every compiled SavedModel has a neuron_op_0).
  uint64_t id() const { return id_; }
  // Core `core` failed (Device::fail_core; `message` says so): the copies on it retire
  // (a call computing on one finishes; none starts there again; their memory is given
  // back). With no copy left, calls fail with NR_DEVICE_ERROR naming the failed cores.
  void lose_core(int core, const std::string &message);

 private:
  // One run at the compiled shapes: `ins`/`outs` are buffers of exactly those shapes.
  struct Call;  // one call on one copy, stage after stage (model.cc)
  void run_stage(Call &call, size_t stage);
  void wait(Call &call);
  // `about`: the call's profile description (execute takes it once, so a relabel during
  // the call cannot name its chunks apart from the call), null when not timed.
  using Profiled = std::shared_ptr<const observe::About>;
  void run_one(const void *const *ins, size_t num_inputs, void *const *outs, size_t num_outputs,
               const Cutoff *cutoff, const Profiled &about);
  void execute_calls(const nr_tensor *inputs, size_t num_inputs, const nr_tensor *outputs, size_t num_outputs,
                     const Cutoff *cutoff, const Profiled &about);
  struct Slot {  // a copy free to take a call, with an arena of its own for the call
    size_t copy;
    void *arena;
  };
  Slot take_copy(const Cutoff *cutoff);
  // Whether a copy of this program also gets a one-thread twin: a single stage whose team
  // is wide, reordered weights small enough to hold twice, and no NEURONISH_PROFILE (a
  // timed call runs the program the profile describes, never the twin: under
  // NEURONISH_PROFILE every call is timed, and a twin would only hold memory). A recording
  // on demand does not withhold it: it ends, and the model's calls use the twin after it.
  bool wants_narrow_twin(const CopyProgram &program) const;
  int64_t check_call(const nr_tensor *inputs, size_t num_inputs, const nr_tensor *outputs, size_t num_outputs);
  std::shared_ptr<Device> device_;
  std::shared_ptr<const Executable> exe_;
  const uint64_t id_ = next_id();
  static uint64_t next_id() {
    static std::atomic<uint64_t> last{0};
    return ++last;
  }
  CompiledCall compiled_call_;  // (a call at the compiled shapes, recognised at once)
  // The outputs that are constants of the executable, copied out by every run: (index,
  // offset in the executable's body, bytes). Found once here, not per call.
  struct ConstantOutput {
    size_t index;
    uint64_t offset, bytes;
  };
  std::vector<ConstantOutput> constant_outputs_;
  std::shared_ptr<DeviceConstants> constants_;
  std::vector<std::unique_ptr<Copy>> copies_;
  int64_t batch_size_ = -1;
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
  std::deque<Slot> idle_;  // each copy once per stage, with one of its arenas
  size_t idle_waiters_ = 0;  // calls waiting for a slot (under idle_mu_)
  size_t retired_ = 0;     // copies retired by a failed core (under idle_mu_)
  std::string lost_;       // the failures that retired copies, for a call left with none
  // What the profile says of the model (observe.h), made by its first call while a profile
  // records and made again after a new label. Calls hold their own reference.
  std::shared_ptr<const observe::About> profiled();
  std::string label_;
  std::mutex about_mu_;
  std::shared_ptr<const observe::About> about_;  // (under about_mu_)
};

}  // namespace nr
