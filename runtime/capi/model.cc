// runtime/model.py in C++ (model.h).
#include "model.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include <sys/mman.h>

#include "engine_api.h"
#include "engine_threads.h"
#include "isa_table.h"
#include "utf8.h"

namespace nr {
namespace {

uint64_t itemsize(int dtype) { return uint64_t(isa::kDTypes[dtype].itemsize); }

// A copy's arena, on 2 MB pages where the kernel has them: a call streams through every
// byte of it (MobileNetV2 bf16 batch 8: 69 MB, 17,000 4 KB pages), and transparent huge
// pages in the usual "madvise" mode back only memory that asks. A hint: refused or out
// of huge pages, the arena is on 4 KB pages as before.
void *new_arena(uint64_t bytes) {
  constexpr uint64_t kHuge = uint64_t(2) << 20;
  if (bytes < kHuge) return std::aligned_alloc(64, std::max<uint64_t>((bytes + 63) / 64 * 64, 64));
  const uint64_t size = (bytes + kHuge - 1) / kHuge * kHuge;
  void *arena = std::aligned_alloc(kHuge, size);
  if (arena) madvise(arena, size, MADV_HUGEPAGE);
  return arena;
}

uint64_t count(const std::vector<int64_t> &shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

std::string shape_text(const std::vector<int64_t> &shape, int64_t star = -1) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "," : "") + (int64_t(i) == star ? std::string("*") : std::to_string(shape[i]));
  return s + "]";
}

std::string type_text(const Signature &s, bool batched) {
  return std::string(isa::kDTypes[s.type.dtype].name) + shape_text(s.type.shape, batched ? s.batch_axis : -1);
}

[[noreturn]] void invalid(const std::string &what) { throw Refused{NR_INVALID_INPUT, what}; }

// A caller's dtype's name, or nullptr for an int that is no dtype (never made an nr_dtype).
const char *dtype_name(int32_t dtype) {
  return dtype >= NR_BOOL && dtype <= NR_FLOAT64 ? nr_dtype_name(nr_dtype(dtype)) : nullptr;
}

// The bytes of a C-contiguous tensor of `dtype` and `shape` (every dim >= 0); false when
// that overflows 64 bits (a client's shape is untrusted: a wrapped product would let a
// small buffer pass for a huge tensor).
bool bytes_of(int dtype, const int64_t *shape, size_t rank, uint64_t &bytes) {
  bytes = 0;
  for (size_t d = 0; d < rank; ++d)
    if (shape[d] == 0) return true;  // (empty, whatever the other dims)
  bytes = itemsize(dtype);
  for (size_t d = 0; d < rank; ++d)
    if (__builtin_mul_overflow(bytes, uint64_t(shape[d]), &bytes)) return false;
  return true;
}

// How a caller's tensor's shape reads in a message: its dims, or what makes them unreadable
// (a NULL shape, a rank beyond any tensor's: the shape is not read then).
std::string seen_shape(const nr_tensor &t) {
  if (t.rank > size_t(isa::kMaxRank)) return "rank " + std::to_string(t.rank) + " (at most " +
                                              std::to_string(isa::kMaxRank) + ")";
  if (!t.shape && t.rank) return "shape NULL with rank " + std::to_string(t.rank);
  return "shape " + shape_text(std::vector<int64_t>(t.shape, t.shape + t.rank));
}

// A tensor seen as [outer, batch, inner bytes] around its batch axis.
struct Rows {
  uint64_t outer, inner;
};
Rows rows_of(const std::vector<int64_t> &shape, int64_t axis, int dtype) {
  Rows r{1, itemsize(dtype)};
  for (size_t i = 0; i < shape.size(); ++i) {
    if (int64_t(i) < axis) r.outer *= uint64_t(shape[i]);
    if (int64_t(i) > axis) r.inner *= uint64_t(shape[i]);
  }
  return r;
}

// Copy rows [lo, lo + n) of `src` (batch `from` on the axis) into rows [at, at + n) of
// `dst` (batch `to`).
void copy_rows(const uint8_t *src, uint64_t from, uint8_t *dst, uint64_t to, Rows r, uint64_t lo,
               uint64_t at, uint64_t n) {
  for (uint64_t o = 0; o < r.outer; ++o)
    std::memcpy(dst + (o * to + at) * r.inner, src + (o * from + lo) * r.inner, n * r.inner);
}

struct Buffer {  // a 64-byte aligned temporary
  void *p = nullptr;
  explicit Buffer(uint64_t bytes) {
    p = std::aligned_alloc(64, std::max<uint64_t>((bytes + 63) / 64 * 64, 64));
    if (!p) throw std::bad_alloc();
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer &) = delete;
  Buffer(Buffer &&o) noexcept : p(o.p) { o.p = nullptr; }
};

}  // namespace

Copy::~Copy() {
  cores.clear();    // the host threads end first (idle: a model unloads with no call in flight)
  program.reset();  // then the engine programs: they point into the arenas
  narrow.reset();
  for (void *a : all_arenas) std::free(a);
}

Model::Model(std::shared_ptr<Device> device, std::shared_ptr<const Executable> exe, size_t duplicates)
    : device_(std::move(device)), exe_(std::move(exe)), compiled_call_(*exe_, itemsize) {
  if (duplicates < 1) throw Refused{NR_INVALID_ARGUMENT, "duplicates must be >= 1, got 0"};
  for (size_t i = 0; i < exe_->outputs.size(); ++i) {
    auto c = exe_->constants.find(exe_->outputs[i].value);
    if (c != exe_->constants.end()) constant_outputs_.push_back({i, c->second.data_offset, c->second.data_bytes});
  }
  std::set<int64_t> batches;
  for (auto &s : exe_->inputs)
    if (s.batch_axis >= 0) batches.insert(s.type.shape[size_t(s.batch_axis)]);
  // Splitting needs one compiled batch size shared by every batched input.
  batch_size_ = batches.size() == 1 ? *batches.begin() : -1;
  size_t stages = exe_->programs.size();
  std::vector<uint64_t> estimate;  // model.py's _bytes_per_core, before the engine is built
  for (auto &program : exe_->programs) {
    std::set<uint64_t> used;
    for (auto &ins : program)
      for (uint64_t v : ins.inputs)
        if (exe_->constants.count(v)) used.insert(v);
    uint64_t total = exe_->arena_bytes;
    for (uint64_t v : used) total += exe_->constants.at(v).data_bytes;
    estimate.push_back(total);
  }
  auto reservations = device_->reserve(stages, estimate, duplicates);
  try {
    constants_ = place_constants(*exe_);
    const WeightPool &pool = process_weight_pool();  // (each reordered weight once in host memory)
    for (auto &r : reservations) {
      auto copy = std::make_unique<Copy>();
      copy->reservation = r;
      // (on the engine threads: building reorders the weights, in parallel regions)
      EngineThreads::run([&] {
        copy->program = build_copy(*exe_, *constants_, device_->config().core_threads, pool);
        if (wants_narrow_twin(*copy->program)) copy->narrow = build_copy(*exe_, *constants_, 1, pool);
      });
      // (both read a call's tensors from the same slots; a twin that placed them elsewhere
      // could not take the same calls)
      if (copy->narrow && copy->narrow->first_call_slot != copy->program->first_call_slot) copy->narrow.reset();
      for (size_t k = 0; k < std::max<size_t>(stages, 1); ++k) {
        void *arena = new_arena(exe_->arena_bytes);
        if (!arena) throw std::bad_alloc();
        copy->all_arenas.push_back(arena);
      }
      for (size_t k = 0; k < stages; ++k) copy->cores.push_back(std::make_unique<CoreThread>());
      copy->ran_on = std::make_unique<std::atomic<int64_t>[]>(stages);
      for (size_t k = 0; k < stages; ++k) copy->ran_on[k] = 0;
      copies_.push_back(std::move(copy));
    }
    for (auto &copy : copies_) {
      // The engine's reordered weights and buffers are known only now. A twin holds its
      // own; where they do not fit the copy does without it (the model loaded before it).
      std::vector<uint64_t> bytes = bytes_per_core(*exe_, *copy->program, copy->all_arenas.size());
      if (copy->narrow) {
        std::vector<uint64_t> with_twin = bytes;
        with_twin[0] += copy->narrow->stages[0]->weight_bytes + copy->narrow->stages[0]->buffer_bytes;
        try {
          device_->resize(copy->reservation, with_twin);
          continue;
        } catch (const Refused &e) {
          if (e.status != NR_OUT_OF_DEVICE_MEMORY) throw;
          copy->narrow.reset();
        }
      }
      device_->resize(copy->reservation, bytes);
    }
  } catch (...) {
    for (size_t k = 0; k < reservations.size(); ++k)  // a failed load keeps no device memory
      device_->release(k < copies_.size() ? copies_[k]->reservation : reservations[k]);
    throw;
  }
  for (size_t k = 0; k < copies_.size(); ++k)
    for (void *arena : copies_[k]->all_arenas) idle_.push_back(Slot{k, arena});
  label_ = observe::model_name(*exe_);
  for (auto &copy : copies_) copy->timing.resize(copy->program->stages.size());
  observe::model_loaded(this);
  device_->track(this);  // (last: from here on a core failing reaches the model)
}

void Model::set_label(const std::string &label) {
  observe::relabel(this, [&] {
    std::lock_guard<std::mutex> lock(about_mu_);
    label_ = utf8_prefix(label, 200);  // (never half a character)
    about_.reset();                    // (the next timed call names the model anew)
  });
}

std::shared_ptr<const observe::About> Model::profiled() {
  std::lock_guard<std::mutex> lock(about_mu_);
  if (!about_) about_ = observe::about(*this);
  return about_;
}

Model::~Model() {
  device_->untrack(this);         // (first: a core failing reaches it no more)
  observe::model_unloaded(this);  // (a counters snapshot reads its copies no more)
  for (auto &copy : copies_)
    if (!copy->retired) device_->release(copy->reservation);  // (a retired copy gave it back)
}

void Model::lose_core(int core, const std::string &message) {
  std::vector<const Reservation *> freed;
  {
    std::lock_guard<std::mutex> lock(idle_mu_);
    for (auto &copy : copies_) {
      const std::vector<int> &cores = copy->reservation.cores;
      if (copy->retired || std::find(cores.begin(), cores.end(), core) == cores.end()) continue;
      copy->retired = true;
      ++retired_;
      lost_ += (lost_.empty() ? "" : "; ") + message;
      freed.push_back(&copy->reservation);
    }
    if (freed.empty()) return;
    idle_.erase(std::remove_if(idle_.begin(), idle_.end(), [&](const Slot &s) { return copies_[s.copy]->retired; }),
                idle_.end());
  }
  idle_cv_.notify_all();  // (calls waiting for a copy may have none left to wait for)
  for (const Reservation *r : freed) device_->release(*r);
}

int64_t Model::check_call(const nr_tensor *inputs, size_t num_inputs, const nr_tensor *outputs, size_t num_outputs) {
  const Executable &exe = *exe_;
  auto names = [](const std::vector<Signature> &sigs) {
    std::string s;
    for (auto &x : sigs) s += (s.empty() ? "'" : ", '") + x.name + "'";
    return s;
  };
  if (num_inputs && !inputs) invalid("inputs is NULL but num_inputs is " + std::to_string(num_inputs));
  if (num_outputs && !outputs) invalid("outputs is NULL but num_outputs is " + std::to_string(num_outputs));
  if (num_inputs != exe.inputs.size())
    invalid("the call has " + std::to_string(num_inputs) + " input(s); the model's inputs are " +
            names(exe.inputs) + " (" + std::to_string(exe.inputs.size()) + ", in this order)");
  if (num_outputs != exe.outputs.size())
    invalid("the call has " + std::to_string(num_outputs) + " output buffer(s); the model's outputs are " +
            names(exe.outputs) + " (" + std::to_string(exe.outputs.size()) + ", in this order)");
  // (Messages are built only for a call refused: a good call allocates nothing here.)
  int64_t batch = -1;
  size_t first = 0;  // the first batched input
  for (size_t i = 0; i < num_inputs; ++i) {
    const Signature &sig = exe.inputs[i];
    const nr_tensor &t = inputs[i];
    auto who = [&] { return "input " + std::to_string(i) + " '" + sig.name + "'"; };
    if (t.name && sig.name != t.name)
      invalid(who() + " is named '" + std::string(t.name) + "' in the call; pass the inputs in the model's order: " +
              names(exe.inputs));
    if (dtype_of(t) != sig.type.dtype) {
      const char *got = dtype_name(dtype_of(t));
      invalid(who() + " has dtype " + (got ? got : "<not a dtype: " + std::to_string(dtype_of(t)) + ">") +
              "; the model was compiled for " + isa::kDTypes[sig.type.dtype].name + ". Pass a " +
              isa::kDTypes[sig.type.dtype].name + " tensor (convert it yourself if changing the values is intended)");
    }
    bool splittable = sig.batch_axis >= 0 && batch_size_ >= 0;
    auto shape = [&] { return std::vector<int64_t>(t.shape, t.shape + (t.shape ? t.rank : 0)); };
    bool ok = t.rank == sig.type.shape.size() && (t.shape || t.rank == 0);
    for (size_t d = 0; ok && d < t.rank; ++d)
      ok = t.shape[d] >= 0 && (t.shape[d] == sig.type.shape[d] || (splittable && int64_t(d) == sig.batch_axis));
    if (!ok)
      invalid(who() + " has " + seen_shape(t) + "; expected " + type_text(sig, splittable) +
              (splittable ? " (any size on batch axis " + std::to_string(sig.batch_axis) + ")" : ""));
    uint64_t need;
    if (!bytes_of(sig.type.dtype, t.shape, t.rank, need))
      invalid(who() + " has shape " + shape_text(shape()) + ": more than 2^64 bytes, which no buffer holds");
    if (need && !t.data)
      invalid(who() + " has data NULL; its shape " + shape_text(shape()) + " needs " + std::to_string(need) +
              " bytes");
    if (t.bytes < need)
      invalid(who() + " holds " + std::to_string(t.bytes) + " bytes; its shape " + shape_text(shape()) + " needs " +
              std::to_string(need));
    if (splittable) {
      int64_t b = t.shape[size_t(sig.batch_axis)];
      if (batch >= 0 && b != batch)
        invalid("inputs disagree on the batch size: '" + exe.inputs[first].name + "' has " + std::to_string(batch) +
                ", '" + sig.name + "' has " + std::to_string(b));
      if (batch < 0) first = i;
      batch = b;
    }
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    const Signature &sig = exe.outputs[i];
    const nr_tensor &t = outputs[i];
    auto want_dim = [&](size_t d) {
      return sig.batch_axis >= 0 && batch >= 0 && int64_t(d) == sig.batch_axis ? batch : sig.type.shape[d];
    };
    auto want = [&] {  // (built for messages only: a good call allocates nothing)
      std::vector<int64_t> dims(sig.type.shape.size());
      for (size_t d = 0; d < dims.size(); ++d) dims[d] = want_dim(d);
      return dims;
    };
    uint64_t need = itemsize(sig.type.dtype);
    bool overflow = false, empty = false;  // (an output's rows may be wider than the inputs')
    for (size_t d = 0; d < sig.type.shape.size(); ++d) {
      overflow |= __builtin_mul_overflow(need, uint64_t(want_dim(d)), &need);
      empty |= want_dim(d) == 0;
    }
    if (overflow && !empty)
      invalid("output '" + sig.name + "' at batch " + std::to_string(batch) + " would be " +
              isa::kDTypes[sig.type.dtype].name + shape_text(want()) +
              ": more than 2^64 bytes, which no buffer holds; call with a smaller batch");
    bool same = t.rank == sig.type.shape.size() && (t.shape || t.rank == 0);
    for (size_t d = 0; same && d < t.rank; ++d) same = t.shape[d] == want_dim(d);
    bool ok = dtype_of(t) == sig.type.dtype && same && t.bytes >= need && (t.data || !need) &&
              (!t.name || sig.name == t.name);
    if (!ok) {
      const char *got = dtype_name(dtype_of(t));
      invalid("output buffer " + std::to_string(i) + " for output '" + sig.name + "' is " +
              (t.name && sig.name != t.name ? "named '" + std::string(t.name) + "', " : "") + (got ? got : "?") +
              (t.rank > size_t(isa::kMaxRank) || (!t.shape && t.rank) ? " of " + seen_shape(t) : shape_text(
                   std::vector<int64_t>(t.shape, t.shape + t.rank))) +
              (t.data ? " with " + std::to_string(t.bytes) + " bytes" : " with data NULL") +
              "; expected a writable " + isa::kDTypes[sig.type.dtype].name + shape_text(want()) + " buffer of " +
              std::to_string(need) + " bytes");
    }
  }
  return batch;
}

Model::Slot Model::take_copy(const Cutoff *cutoff) {
  if (cutoff) cutoff->check("before it started");
  std::unique_lock<std::mutex> lock(idle_mu_);
  // A copy whose core failed is not taken again: its slots, given back by calls that were
  // computing on it when it retired (lose_core), are dropped here. With no copy left the
  // call is refused.
  // (Looked at only once a copy has retired: a call's path reads no more than before.)
  auto idle = [&] {
    if (retired_)
      while (!idle_.empty() && copies_[idle_.back().copy]->retired) idle_.pop_back();
    return !idle_.empty() || retired_ == copies_.size();
  };
  // (An idle copy is taken without a timed wait: wait_for reads the clock before it
  // looks, and a clock read costs ~80 ns on a VM, a tenth of a tiny model's call.)
  if (!idle()) {
    struct Waiting {  // (counted under the lock, so a copy given back wakes only a waiter)
      size_t &waiters;
      explicit Waiting(size_t &w) : waiters(w) { ++waiters; }
      ~Waiting() { --waiters; }
    } waiting{idle_waiters_};
    if (!cutoff) {
      idle_cv_.wait(lock, idle);
    } else {
      while (!idle_cv_.wait_for(lock, cutoff->slice(), idle))
        cutoff->check("while it waited for the model's cores (all busy with other calls)");
    }
  }
  if (idle_.empty()) throw Refused{NR_DEVICE_ERROR, "the model has no copy left on a working core: " + lost_};
  // The copy given back last: its arena and weights are the likeliest still in the CPU's
  // caches. Taken first in, first out, back-to-back calls went round every copy, each
  // finding its bytes evicted (MobileNetV2 bf16 batch 8 through a NeuronOp's 4 copies).
  Slot slot = idle_.back();
  idle_.pop_back();
  return slot;
}

// One call on copy `k`, stage after stage. Handed to a core (CoreThread), `run` computes
// the stage there and hands the call to the next stage's core, or wakes the caller after
// the last stage or an error.
struct Model::Call final : CoreJob {
  Model &model;
  Copy &copy;
  void *const *ptrs;  // the engine's per-call slots: the arena, the inputs, the outputs
  int64_t n_ptrs;
  const Cutoff *cutoff;
  bool timed;
  std::vector<std::vector<double>> times;  // per stage, its instructions' [start, end]
  std::atomic<size_t> stage{0};           // the stage queued or running
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  Call(Model &m, Copy &c, void *const *p, int64_t n, const Cutoff *cut, bool t)
      : model(m), copy(c), ptrs(p), n_ptrs(n), cutoff(cut), timed(t) {}

  void run() noexcept override {
    size_t s = stage.load(std::memory_order_relaxed);
    try {
      model.run_stage(*this, s);
      if (s + 1 < copy.cores.size()) {
        stage.store(s + 1, std::memory_order_relaxed);
        copy.cores[s + 1]->submit(this);  // (the next core's now: not touched here after)
        return;
      }
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_one();  // (under the lock: `cv` lives in the caller's frame, which may return after)
  }
};

namespace {
// A team whose recent runs take this many times its best is being held up: beside two busy
// loops a small CNN's two-thread call went from 0.34 ms to 8-12 ms (its barriers waiting for
// a preempted thread) while one thread took 0.45 ms, MobileNetV2's from 41 to 234-395 ms.
// Same-process noise (TensorFlow's or a neighbour library's spinning threads) slows a run
// by tens of percent; a lone outlier must be 9x the best to move the average past 3x.
constexpr int64_t kHeldUp = 3;
// The team's first runs set its best (the very first pays for cold caches and pages); then
// the twin runs twice, so that its best is known too: the price, on an idle host, of two
// calls on one thread.
constexpr uint32_t kWarmRuns = 3, kTwinProbes = 2;
// Later probes of the twin while the team is preferred: after 8 wide runs, then twice as
// many each time, at most 1024 (on an idle host a call in ~1000 runs on one thread).
constexpr uint32_t kFirstTwinGap = 8, kLastTwinGap = 1024;
constexpr uint32_t kProbeEvery = 8;
}  // namespace

bool TeamHealth::wide_if_idle() {
  if (wide_runs.load(std::memory_order_relaxed) < kWarmRuns) return true;
  if (twin_runs.load(std::memory_order_relaxed) < kTwinProbes) return false;
  int64_t best = best_ns.load(std::memory_order_relaxed), recent = recent_ns.load(std::memory_order_relaxed);
  if (recent <= kHeldUp * best && best <= twin_best_ns.load(std::memory_order_relaxed)) {
    uint32_t gap = twin_gap.load(std::memory_order_relaxed);
    if (wide_streak.load(std::memory_order_relaxed) < std::max(gap, kFirstTwinGap)) return true;
    twin_gap.store(std::min(std::max(gap, kFirstTwinGap) * 2, kLastTwinGap), std::memory_order_relaxed);
    return false;  // (the twin's probe)
  }
  return twin_streak.load(std::memory_order_relaxed) >= kProbeEvery;  // (the team's probe)
}

void TeamHealth::wide_ran(int64_t ns) {
  wide_runs.fetch_add(1, std::memory_order_relaxed);
  wide_streak.fetch_add(1, std::memory_order_relaxed);
  twin_streak.store(0, std::memory_order_relaxed);
  int64_t best = best_ns.load(std::memory_order_relaxed);
  if (ns < best) best_ns.store(best = ns, std::memory_order_relaxed);
  int64_t recent = recent_ns.load(std::memory_order_relaxed);
  // A fast run ends a slow spell at once; slow runs raise the average a quarter at a time.
  recent_ns.store(recent == 0 || ns <= kHeldUp * best ? ns : recent + (ns - recent) / 4, std::memory_order_relaxed);
}

void TeamHealth::twin_ran(int64_t ns) {
  twin_runs.fetch_add(1, std::memory_order_relaxed);
  twin_streak.fetch_add(1, std::memory_order_relaxed);
  wide_streak.store(0, std::memory_order_relaxed);
  if (ns < twin_best_ns.load(std::memory_order_relaxed)) twin_best_ns.store(ns, std::memory_order_relaxed);
}

bool Model::wants_narrow_twin(const CopyProgram &program) const {
  const DeviceConfig &config = device_->config();
  if (program.stages.size() != 1 || config.core_threads < 2 || !config.share_by_width ||
      config.narrow_twin == DeviceConfig::Twin::off || observe::profiling_always())
    return false;
  const Stage &stage = *program.stages[0];
  return stage.width > 1 && stage.weight_bytes <= kNarrowTwinWeightBytes;
}

void Model::run_stage(Call &call, size_t s) {
  const Cutoff *cutoff = call.cutoff;
  if (cutoff) cutoff->check("before its next stage could start");
  HostCPUs &host = device_->host();
  const Stage &wide = *call.copy.program->stages[s];
  // (a timed call runs the program the profile describes, not its twin)
  const Stage *narrow = call.copy.narrow && !call.timed ? call.copy.narrow->stages[s].get() : nullptr;
  int width = host.width(wide.width);
  std::function<bool()> give_up;
  if (cutoff) give_up = [&] { return cutoff->stopped(); };
  bool watch = narrow && device_->config().narrow_twin == DeviceConfig::Twin::automatic;
  int taken = narrow && width > 1 ? host.acquire_either(width, !watch || call.copy.team.wide_if_idle(), give_up)
              : host.acquire(width, give_up) ? width : 0;
  if (taken == 0) {  // (given up: it holds no CPUs, so it must not run)
    cutoff->check("while it waited for the host's CPUs (busy with other calls)");
    throw Refused{NR_CANCELLED, "the call was cancelled by its caller while it waited for the host's CPUs (busy "
                                "with other calls); the rest of it was abandoned"};  // (cancel byte reset since)
  }
  const Stage &stage = taken < width ? *narrow : wide;
  if (&stage == narrow) call.copy.narrow_runs.fetch_add(1, std::memory_order_relaxed);
  // (the clock is read only for the held-up rule: ~22 ns a read on this VM's clock)
  auto started = watch ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  call.copy.ran_on[s].store(this_thread_tid(), std::memory_order_relaxed);
  Copy::StageTiming &timing = call.copy.timing[s];
  if (call.timed != timing.armed) {  // (this thread holds the stage's core: nobody runs it)
    if (call.timed) timing.times.resize(size_t(2 * std::max<int64_t>(wide.count, 1)));
    ne_set_timing(wide.engine, call.timed ? timing.times.data() : nullptr);
    timing.armed = call.timed;
  }
  char err[2048];
  auto run = [&]() -> int64_t {
    return ne_run(stage.engine, 0, stage.count, call.copy.program->first_call_slot, const_cast<void **>(call.ptrs),
                  call.n_ptrs,
                  cutoff ? reinterpret_cast<const char *>(const_cast<const uint8_t *>(cutoff->cancel)) : nullptr,
                  cutoff ? cutoff->deadline : 0.0, err, sizeof err);
  };
  // (a stage of one-thread instructions opens no parallel region: no hand-over)
  int64_t rc = stage.width > 1 ? EngineThreads::call(run) : run();
  host.release(taken);
  if (watch && rc == 0) {
    int64_t ns = (std::chrono::steady_clock::now() - started).count();
    if (&stage == narrow) call.copy.team.twin_ran(ns);
    else call.copy.team.wide_ran(ns);
  }
  if (call.timed && rc == 0) call.times.push_back(timing.times);
  if (rc > 0) {
    cutoff->check("while its instructions ran");  // (throws: the engine saw it)
    // The engine saw the cancel byte, which its caller has cleared since (a deadline
    // cannot un-pass): the call stopped all the same, so it reports being cancelled.
    if (rc == kNeStopCancelled)
      throw Refused{NR_CANCELLED, "the call was cancelled by its caller while its instructions ran; the rest of it "
                                  "was abandoned"};
    throw Refused{NR_INTERNAL, "native engine stopped (" + std::to_string(rc) + ") with no reason to"};
  }
  if (rc < 0) {
    std::string names;
    size_t shown = 0;
    for (auto &program : exe_->programs)
      for (auto &ins : program)
        for (auto &src : ins.source)
          if (shown++ < 8) names += (names.empty() ? "" : ", ") + src;
    throw Refused{NR_EXECUTION_ERROR, std::string("native engine: ") + err + " (in the instructions from TF node(s) " +
                  (names.empty() ? "?" : names) + ")"};
  }
}

// The caller's side of a call handed to the cores: until its last stage is done. Past its
// cutoff, a call still queued for a core is taken out of the queue and abandoned; one
// computing stops at the engine's next instruction (or before its next stage).
void Model::wait(Call &call) {
  std::unique_lock<std::mutex> lock(call.mu);
  auto done = [&] { return call.done; };
  if (!call.cutoff) {
    call.cv.wait(lock, done);
  } else {
    bool stopped = false;
    while (!call.cv.wait_for(lock, stopped ? Cutoff::kPoll : call.cutoff->slice(), done)) {
      if (!(stopped = call.cutoff->stopped())) continue;
      lock.unlock();
      bool withdrawn = call.copy.cores[call.stage.load(std::memory_order_relaxed)]->withdraw(&call);
      lock.lock();
      if (withdrawn) {
        call.cutoff->check("while it waited for a core (busy with other calls)");
        throw Refused{NR_CANCELLED, "the call was cancelled by its caller while it waited for a core (busy with "
                                    "other calls); the rest of it was abandoned"};  // (cancel byte reset since)
      }
    }
  }
  if (call.error) std::rethrow_exception(call.error);
}

void Model::run_one(const void *const *ins, size_t num_inputs, void *const *outs, size_t num_outputs,
                    const Cutoff *cutoff, const Profiled &about) {
  bool timed = about != nullptr;
  double queued = timed ? observe::now() : 0.0;
  const Slot slot = take_copy(cutoff);
  const size_t k = slot.copy;
  double started = timed ? observe::now() : 0.0;
  struct GiveBack {
    Model *m; Slot slot;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    ~GiveBack() {
      Copy &c = *m->copies_[slot.copy];  // (counted whether the run succeeded or not, as in Python)
      c.runs.fetch_add(1, std::memory_order_relaxed);
      c.busy_ns.fetch_add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now() - start).count()),
                          std::memory_order_relaxed);
      bool waiters;
      {
        std::lock_guard<std::mutex> lock(m->idle_mu_);
        m->idle_.push_back(slot);
        waiters = m->idle_waiters_ > 0;
      }
      if (waiters) m->idle_cv_.notify_one();
    }
  } give_back{this, slot};
  Copy &copy = *copies_[k];
  const Executable &exe = *exe_;
  for (const ConstantOutput &c : constant_outputs_) std::memcpy(outs[c.index], exe.body.data() + c.offset, c.bytes);
  // The engine's per-call slots: the arena, the inputs, the outputs (on the stack for up
  // to 31 tensors: no allocation on a call's path).
  void *on_stack[32];
  std::vector<void *> on_heap;
  size_t n_ptrs = 1 + num_inputs + num_outputs;
  void **ptrs = n_ptrs <= 32 ? on_stack : (on_heap.resize(n_ptrs), on_heap.data());
  ptrs[0] = slot.arena;
  for (size_t i = 0; i < num_inputs; ++i) ptrs[1 + i] = const_cast<void *>(ins[i]);  // (the engine only reads inputs)
  for (size_t i = 0; i < num_outputs; ++i) ptrs[1 + num_inputs + i] = outs[i];
  Call call(*this, copy, ptrs, int64_t(n_ptrs), cutoff, timed);
  if (copy.cores.size() == 1 && copy.cores[0]->try_enter()) {  // an idle core: no hand-off
    struct Leave {
      CoreThread &core;
      ~Leave() { core.leave(); }
    } leave{*copy.cores[0]};
    run_stage(call, 0);
  } else if (!copy.cores.empty()) {
    copy.cores[0]->submit(&call);
    wait(call);
  }
  if (timed) observe::record_chunk(about, k, queued, started, observe::now(), call.times);
}

void Model::execute(const nr_tensor *inputs, size_t num_inputs, const nr_tensor *outputs, size_t num_outputs,
                    const Cutoff *cutoff) {
  if (!observe::profiling()) return execute_calls(inputs, num_inputs, outputs, num_outputs, cutoff, nullptr);
  struct CallSpan {  // (recorded whether the call succeeds or not, as profiler.py does)
    std::shared_ptr<const observe::About> about;
    double start = observe::now();
    ~CallSpan() { observe::record_call(about, start, observe::now()); }
  } span{profiled()};
  execute_calls(inputs, num_inputs, outputs, num_outputs, cutoff, span.about);
}

void Model::execute_calls(const nr_tensor *inputs, size_t num_inputs, const nr_tensor *outputs,
                          size_t num_outputs, const Cutoff *cutoff, const Profiled &about) {
  const Executable &exe = *exe_;
  int64_t batch = compiled_call_.matches(inputs, num_inputs, outputs, num_outputs)
                      ? -1
                      : check_call(inputs, num_inputs, outputs, num_outputs);
  if (batch < 0 || batch == batch_size_) {
    const void *ins_on_stack[16];
    void *outs_on_stack[16];
    std::vector<const void *> ins_on_heap;
    std::vector<void *> outs_on_heap;
    const void **ins = num_inputs <= 16 ? ins_on_stack : (ins_on_heap.resize(num_inputs), ins_on_heap.data());
    void **outs = num_outputs <= 16 ? outs_on_stack : (outs_on_heap.resize(num_outputs), outs_on_heap.data());
    for (size_t i = 0; i < num_inputs; ++i) ins[i] = inputs[i].data;
    for (size_t i = 0; i < num_outputs; ++i) outs[i] = outputs[i].data;
    run_one(ins, num_inputs, outs, num_outputs, cutoff, about);
    return;
  }
  if (batch == 0) return;  // empty outputs: nothing to compute
  uint64_t size = uint64_t(batch_size_), total = uint64_t(batch);
  uint64_t chunks = (total + size - 1) / size;
  // Each chunk's buffers: a batched input's rows lo..hi (padded by repeating its last
  // row); an output on batch axis 0 of a whole chunk is written in place.
  auto job = [&](uint64_t c, std::vector<Buffer> &keep, std::vector<const void *> &ins, std::vector<void *> &outs) {
    uint64_t lo = c * size, n = std::min(size, total - lo);
    for (size_t i = 0; i < num_inputs; ++i) {
      const Signature &sig = exe.inputs[i];
      if (sig.batch_axis < 0) { ins.push_back(inputs[i].data); continue; }
      Rows r = rows_of(sig.type.shape, sig.batch_axis, sig.type.dtype);
      const uint8_t *src = static_cast<const uint8_t *>(inputs[i].data);
      if (n == size && sig.batch_axis == 0) { ins.push_back(src + lo * r.inner); continue; }
      keep.emplace_back(r.outer * size * r.inner);
      uint8_t *dst = static_cast<uint8_t *>(keep.back().p);
      copy_rows(src, total, dst, size, r, lo, 0, n);
      for (uint64_t pad = n; pad < size; ++pad) copy_rows(src, total, dst, size, r, lo + n - 1, pad, 1);
      ins.push_back(dst);
    }
    for (size_t i = 0; i < num_outputs; ++i) {
      const Signature &sig = exe.outputs[i];
      uint8_t *dst = static_cast<uint8_t *>(outputs[i].data);
      if (sig.batch_axis == 0 && n == size) {
        outs.push_back(dst + lo * rows_of(sig.type.shape, 0, sig.type.dtype).inner);
      } else if (sig.batch_axis < 0 && c == 0) {
        outs.push_back(dst);
      } else {
        keep.emplace_back(count(sig.type.shape) * itemsize(sig.type.dtype));
        outs.push_back(keep.back().p);
      }
    }
  };
  auto finish = [&](uint64_t c, const std::vector<void *> &outs) {
    uint64_t lo = c * size, n = std::min(size, total - lo);
    for (size_t i = 0; i < num_outputs; ++i) {
      const Signature &sig = exe.outputs[i];
      if (sig.batch_axis < 0 || (sig.batch_axis == 0 && n == size)) continue;
      Rows r = rows_of(sig.type.shape, sig.batch_axis, sig.type.dtype);
      copy_rows(static_cast<const uint8_t *>(outs[i]), size, static_cast<uint8_t *>(outputs[i].data), total, r, 0, lo, n);
    }
  };
  auto run_chunk = [&](uint64_t c) {
    std::vector<Buffer> keep;
    keep.reserve(num_inputs + num_outputs);  // (Buffers never move: pointers stay valid)
    std::vector<const void *> ins;
    std::vector<void *> outs;
    job(c, keep, ins, outs);
    run_one(ins.data(), ins.size(), outs.data(), outs.size(), cutoff, about);
    finish(c, outs);
  };
  size_t workers = std::min<size_t>(copies_.size(), size_t(chunks));
  if (workers <= 1) {
    for (uint64_t c = 0; c < chunks; ++c) run_chunk(c);
    return;
  }
  // Chunks in parallel on the duplicates: one thread per copy pulls chunks in order; the
  // first error stops the rest and is the call's.
  std::atomic<uint64_t> next{0};
  std::mutex error_mu;
  std::exception_ptr error;
  auto worker = [&] {
    for (uint64_t c; (c = next++) < chunks;) {
      try {
        run_chunk(c);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (!error) error = std::current_exception();
        next = chunks;
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) threads.emplace_back(worker);
  worker();
  for (auto &t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace nr
