// One loaded copy of an executable on the native engine: per core of its group (pipeline
// stage) an engine program built from the instructions' specs (engine_spec.h), with
// runtime/program.py's placement: slot 0.. the constants, then per call the arena, the
// inputs and the outputs; values the compiler marked channel-blocked stay blocked only
// where the engine took their producer and every reader with a real kernel.
#pragma once
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine_api.h"
#include "engine_spec.h"
#include "executable.h"

namespace nr {

// Constants placed in (simulated) device memory: 64-byte aligned copies, shared by a
// model's copies, read-only. One of at least kShareConstantBytes is kept once per process
// by content (SHA-256), whichever executables hold it: a NeuronOp with free dimensions
// loads an executable per shape, a model server two versions of one model while it swaps
// them, each with the same weights. Loads that share a constant share the weights the
// engine reorders from it too (process_weight_pool keys them by address).
constexpr size_t kShareConstantBytes = size_t(64) << 10;
struct DeviceConstants {
  std::vector<uint64_t> ids;        // sorted value ids: constant k is engine slot k
  std::vector<void *> data;
  std::vector<uint64_t> bytes;
  std::vector<std::shared_ptr<void>> held;  // the memory `data` points into
};
std::shared_ptr<DeviceConstants> place_constants(const Executable &exe);

struct Stage {
  void *engine = nullptr;   // ne_* program
  int64_t count = 0;        // engine instructions (run [0, count) per call)
  int width = 1;            // its widest team: the host CPUs it takes while it computes
  uint64_t weight_bytes = 0, buffer_bytes = 0;
  std::vector<int64_t> engine_index;  // per instruction of the stage: its engine index, -1 none
  std::set<size_t> weight_instructions;  // (stage-local) whose weights the engine reordered
  ~Stage();
};

// Each instruction's spec, by flat instruction index (for tests: nr_model_instruction_spec).
struct SpecRecord {
  bool taken = false;
  spec::Spec spec;
  int team = 0;  // the threads the engine runs it on (spec::team_size), once taken
};

struct CopyProgram {
  std::vector<std::unique_ptr<Stage>> stages;
  int64_t first_call_slot = 0;
  std::vector<SpecRecord> specs;
};

// A pool of the engine's reordered weights (engine.cc WeightPool): a program built with
// it takes the weights another one reordered from the same constant, instead of
// reordering its own.
class WeightPool {
 public:
  WeightPool() : pool_(ne_pool_create()) {}
  ~WeightPool() { ne_pool_destroy(pool_); }
  WeightPool(const WeightPool &) = delete;
  WeightPool &operator=(const WeightPool &) = delete;
  void *get() const { return pool_; }

 private:
  void *pool_;
};

// The pool the C runtime's loads share: its entries are weak and keyed by a constant's
// address, which holds the same bytes for as long as a program holding the entry's
// weights lives (that program's model holds the constant).
const WeightPool &process_weight_pool();

// Builds the engine programs of one copy, sharing reordered weights through `pool`;
// throws Refused naming the instruction the engine does not take (NR_UNSUPPORTED) or that
// oneDNN refused.
std::unique_ptr<CopyProgram> build_copy(const Executable &exe, const DeviceConstants &constants,
                                        int threads, const WeightPool &pool);

// Bytes each core of the group holds for one copy (runtime/program.py's bytes_per_core).
std::vector<uint64_t> bytes_per_core(const Executable &exe, const CopyProgram &copy, size_t arenas);

}  // namespace nr
