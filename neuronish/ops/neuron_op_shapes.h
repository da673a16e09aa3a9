// Free dimensions in a host without Python: the native NeuronOp's side of
// neuronish/shape_specialize.py. An op whose `dynamic_shapes` attr is set holds the
// executable compiled at its probe shape and `graph_def` with the free dimensions (and the
// batch) unknown; each call's shape is served by an executable compiled for it:
//
// - the shape at `BatchFor` the call's batch if loaded; else the same shape at another
//   batch if loaded (the runtime splits or pads exactly: the compiler proved the subgraph
//   keeps samples apart);
// - else the shape is queued for the op's compile thread, which runs the compiler
//   (`$NEURONISH_CC`, else `neuronish-cc` on PATH) as a subprocess on `graph_def` with an
//   io-config at that shape, in a process group of its own (killed past kCompileTimeoutS
//   or when the op goes), and loads what it wrote. Meanwhile the call runs on TensorFlow
//   (the kernel's choice, with the runtime fallback on) or waits, honouring its deadline
//   and cancellation;
// - a shape compiled ahead (`shape_buckets`) has its executable in the SavedModel's assets,
//   listed in the attr's `stored`: its first call loads it from there (other calls at that
//   shape wait for the load, fallback or not), so no compiler is needed for it;
// - a shape whose compile or load failed is remembered and not compiled again;
// - at most NEURONISH_MAX_SHAPES (default 8) executables stay loaded per op, the least
//   recently used one not running unloaded first, and calls that do not wait queue at most
//   that many shapes.
//
// - a compile goes through the compile cache (neuron_op_compile_cache.h), the Python host's
//   too: a shape any process compiled before is read from there, not compiled again.
// Included by neuron_op_native.cc only.
#ifndef NEURONISH_OPS_NEURON_OP_SHAPES_H_
#define NEURONISH_OPS_NEURON_OP_SHAPES_H_

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "neuron_op_compile_cache.h"
#include "neuron_op_compiler.h"
#include "neuron_op_dynamic_spec.h"
#include "neuronish_runtime.h"
#include "tensorflow/core/platform/logging.h"

namespace neuronish {
namespace {

// -- the op's executables by shape --------------------------------------------------------

constexpr int64_t kMaxRuntimeBatch = 64;  // as shape_specialize.MAX_RUNTIME_BATCH

// The batch a shape is compiled at for a call of `calls` rows: the op's compiled batch for
// a call of that batch, else the next power of two, at most kMaxRuntimeBatch (as
// shape_specialize.batch_for: powers of two bound the executables per shape).
inline int64_t BatchFor(int64_t calls, int64_t compiled) {
  if (calls == compiled) return compiled;
  int64_t b = 1;
  while (b < calls && b < kMaxRuntimeBatch) b *= 2;
  return b;
}

// NEURONISH_MAX_SHAPES as shape_specialize.max_shapes reads it: at least 1, 8 if unset or
// not a number.
inline size_t MaxShapes() {
  const char* env = std::getenv("NEURONISH_MAX_SHAPES");
  char* end = nullptr;
  const long n = env ? std::strtol(env, &end, 10) : 8;
  if (!env || end == env || *end != '\0') return 8;
  return static_cast<size_t>(std::max(1L, n));
}

using Shapes = std::vector<std::vector<int64_t>>;

class ShapeTable {
 public:
  // One executable loaded, with its outputs' signature (valid until it is unloaded).
  struct Entry {
    // (atomic: LoadAgain replaces it while calls read it without the lock)
    std::atomic<nr_model*> model{nullptr};
    bool reload_failed = false;  // LoadAgain found no working core for it (under reload_mu_)
    std::vector<nr_tensor_info> outputs;
    int running = 0;
    uint64_t used = 0;
  };
  // Loads `bytes` on the device, labelled `label` (the kernel's loader: its duplicates).
  using Loader = std::function<absl::Status(const std::string& bytes, const std::string& label,
                                            nr_model** out)>;
  // Reads spec.stored[index]'s file, checked against its reference.
  using StoredReader = std::function<absl::Status(size_t index, std::string* bytes)>;

  // `probe`: the op's loaded executable (owned from now on); `graph`: its subgraph
  // (borrowed: it outlives the table).
  ShapeTable(std::string where, const std::string& node, DynamicSpec spec, nr_model* probe,
             const std::string* graph, Loader load, StoredReader read_stored)
      : where_(std::move(where)), spec_(std::move(spec)), graph_(graph),
        load_(std::move(load)), read_stored_(std::move(read_stored)) {
    name_ = node.substr(node.rfind('/') == std::string::npos ? 0 : node.rfind('/') + 1);
    const nr_executable* exe = nr_model_executable(probe);
    std::set<int64_t> batches;
    Shapes shapes;
    for (size_t i = 0; i < nr_executable_num_tensors(exe, NR_INPUT); ++i) {
      nr_tensor_info info;
      nr_executable_tensor(exe, NR_INPUT, i, &info);
      inputs_.push_back(Input{info.name, info.dtype_name, {info.shape, info.shape + info.rank},
                              info.batch_axis});
      shapes.emplace_back(info.shape, info.shape + info.rank);
      if (info.batch_axis >= 0) batches.insert(info.shape[info.batch_axis]);
    }
    for (size_t i = 0; i < nr_executable_num_tensors(exe, NR_OUTPUT); ++i) {
      nr_tensor_info info;
      nr_executable_tensor(exe, NR_OUTPUT, i, &info);
      output_axes_.emplace_back(info.name, info.batch_axis);
    }
    // (an op without batch axes compiles and runs every shape at its fixed sizes)
    compiled_batch_ = batches.size() == 1 ? *batches.begin() : -1;
    for (size_t k = 0; k < spec_.stored.size(); ++k) {
      stored_[MakeKey(spec_.stored[k].shapes, compiled_batch_)] = k;
    }
    Key key = MakeKey(shapes, compiled_batch_);
    nr_model_set_label(probe, Label(key).c_str());
    Insert(key, probe);
  }

  ~ShapeTable() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      queue_.clear();
    }
    stop_.store(true);
    if (worker_.joinable()) worker_.join();
    for (auto& [key, entry] : entries_) nr_model_unload(entry->model.load());
    for (nr_model* m : retired_) nr_model_unload(m);
  }

  // Why a call at `shapes` is outside the op's bounds; empty if it is within.
  std::string OutOfBounds(const Shapes& shapes) const {
    for (size_t i = 0; i < spec_.free.size() && i < shapes.size(); ++i) {
      for (const FreeDim& f : spec_.free[i]) {
        const int64_t size = shapes[i][f.axis];
        if (size >= f.low && size <= f.high) continue;
        return absl::StrCat(where_, spec_.labels[i], " has size ", size, " in dimension ",
                            f.axis, "; the model accepts ", f.low, " to ", f.high,
                            " there (bound from ", f.why, "). Recompile with shape_bounds="
                            "{KEY: {AXIS: (LOW, HIGH)}} (neuronish compile --shape-bounds "
                            "KEY:AXIS=LOW:HIGH) to serve other sizes");
      }
    }
    return "";
  }

  // The executable to run a call at `shapes` on, marked running until Done (module doc).
  // With `wait` false, null when none is loaded yet: the caller computes the call
  // elsewhere. Waiting gives up at `deadline_ns` (0: none) or once `*cancel` is set.
  absl::Status Take(const Shapes& shapes, bool wait, const volatile uint8_t* cancel,
                    int64_t deadline_ns, Entry** out) {
    const Key want = KeyFor(shapes);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (closed_) return absl::InternalError(where_ + "was unloaded");
      auto found = entries_.find(want);
      Entry* entry = found == entries_.end() ? nullptr : found->second.get();
      const Key* stored = entry ? nullptr : StoredFor(want);
      if (stored && loading_.insert(*stored).second) {  // this call loads it
        LoadStored(*stored, lock);
        continue;
      }
      if (!entry && !stored) {
        // A caller that does not wait queues no more than MaxShapes() compiles.
        if (!failed_.count(want) && (wait || pending_.count(want) || queue_.size() < MaxShapes())) {
          Request(want);
        }
        entry = OtherBatch(want);
      }
      if (entry) {
        ++entry->running;
        entry->used = ++clock_;
        *out = entry;
        return absl::OkStatus();
      }
      auto failed = failed_.find(want);
      if (!stored && failed != failed_.end()) return failed->second;
      if (!wait && !stored) {  // (another call is loading the stored one: a short wait)
        *out = nullptr;
        return absl::OkStatus();
      }
      const char* what = stored ? "load" : "compile";
      const int64_t now = NowNs();
      if (cancel && *cancel) {
        return absl::CancelledError(absl::StrCat(
            where_, "the call was cancelled by its caller while it waited for its new shape ",
            Label(want), " to ", what, "; the ", what, " goes on for later calls"));
      }
      if (deadline_ns && now >= deadline_ns) {
        return absl::DeadlineExceededError(absl::StrCat(
            where_, "the call's deadline passed while it waited for its new shape ",
            Label(want), " to ", what, "; the ", what, " goes on for later calls"));
      }
      changed_.wait_for(lock, std::chrono::milliseconds(10));
    }
  }

  void Done(Entry* entry) {
    std::vector<nr_model*> gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --entry->running;
      gone = EvictLocked();
    }
    for (nr_model* m : gone) nr_model_unload(m);
  }

  // `lost`, `entry`'s model, refused a call with a device error: `again` (the kernel's)
  // loads its executable anew onto the cores that still work if failed cores took every
  // copy, or returns null. The entry's model now (another caller's reload, or this one), or
  // null. `lost` stays loaded (calls may be inside it) until the table goes.
  // A failed reload is not tried again (cores do not come back): the entry's calls then get
  // the lost model's cheap refusal. The device load runs outside the table's lock, so
  // other shapes' calls and compiles go on meanwhile (the caller's `running` keeps the
  // entry from eviction).
  nr_model* LoadAgain(Entry* entry, nr_model* lost,
                      const std::function<nr_model*(nr_model*)>& again) {
    std::lock_guard<std::mutex> reloading(reload_mu_);
    nr_model* now = entry->model.load();
    if (now != lost) return now;
    if (entry->reload_failed) return nullptr;
    nr_model* fresh = again(lost);
    if (!fresh) {
      entry->reload_failed = true;
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, held] : entries_) {
      if (held.get() == entry) nr_model_set_label(fresh, Label(key).c_str());
    }
    retired_.push_back(lost);
    entry->model.store(fresh);
    return fresh;
  }

  // The label of the executable a call at `shapes` wants (`neuron_op_0@4x128;4x128`).
  std::string LabelFor(const Shapes& shapes) const { return Label(KeyFor(shapes)); }

 private:
  // (the batch compiled at, or -1 without batch axes; the shapes, batch axes as -1)
  using Key = std::pair<int64_t, Shapes>;

  static int64_t NowNs() {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
  }

  Key MakeKey(const Shapes& shapes, int64_t batch) const {
    Key key{batch, shapes};
    for (size_t i = 0; i < inputs_.size() && i < shapes.size(); ++i) {
      if (inputs_[i].batch_axis >= 0) key.second[i][inputs_[i].batch_axis] = -1;
    }
    return key;
  }

  Key KeyFor(const Shapes& shapes) const {
    int64_t calls = -1;
    for (size_t i = 0; i < inputs_.size() && i < shapes.size(); ++i) {
      if (inputs_[i].batch_axis >= 0) calls = shapes[i][inputs_[i].batch_axis];
    }
    const int64_t batch = calls < 0 || compiled_batch_ < 0 ? -1 : BatchFor(calls, compiled_batch_);
    return MakeKey(shapes, batch);
  }

  std::string Label(const Key& key) const {
    std::string out = name_ + "@";
    for (size_t i = 0; i < key.second.size(); ++i) {
      if (i) out += ";";
      for (size_t d = 0; d < key.second[i].size(); ++d) {
        const int64_t n = key.second[i][d];
        out += absl::StrCat(d ? "x" : "", n < 0 ? key.first : n);
      }
    }
    return out;
  }

  void Insert(const Key& key, nr_model* model) {
    auto entry = std::make_unique<Entry>();
    entry->model.store(model);
    const nr_executable* exe = nr_model_executable(model);
    for (size_t i = 0; i < nr_executable_num_tensors(exe, NR_OUTPUT); ++i) {
      nr_tensor_info info;
      nr_executable_tensor(exe, NR_OUTPUT, i, &info);
      entry->outputs.push_back(info);
    }
    entry->used = ++clock_;
    entries_[key] = std::move(entry);
  }

  // The key of the stored executable of `want`'s shape (at the op's compiled batch) if it is
  // to be loaded: not loaded, not failed (under the lock); null otherwise.
  const Key* StoredFor(const Key& want) const {
    auto found = stored_.find(Key{compiled_batch_, want.second});
    if (found == stored_.end() || entries_.count(found->first) || failed_.count(found->first)) {
      return nullptr;
    }
    return &found->first;
  }

  // Loads the stored executable of `key` into the table, or remembers why not; the lock is
  // released meanwhile (`key` is in loading_: other calls at that shape wait).
  void LoadStored(const Key key, std::unique_lock<std::mutex>& lock) {
    lock.unlock();
    nr_model* model = nullptr;
    absl::Status s = ReadStored(key, &model);
    lock.lock();
    loading_.erase(key);
    if (s.ok() && !closed_) {
      Insert(key, model);
      model = nullptr;
    } else if (!s.ok()) {
      failed_[key] = s;
    }
    std::vector<nr_model*> gone = EvictLocked();
    if (model) gone.push_back(model);
    changed_.notify_all();
    lock.unlock();
    for (nr_model* m : gone) nr_model_unload(m);
    lock.lock();
  }

  // The stored executable of `key`, read from the SavedModel and loaded (not under the lock).
  absl::Status ReadStored(const Key& key, nr_model** out) {
    const std::string label = Label(key);
    const size_t index = stored_.at(key);
    std::string bytes;
    absl::Status s = read_stored_(index, &bytes);
    if (s.ok()) s = load_(bytes, label, out);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(where_, "loading its stored shape ", label,
                                                 " failed: ", s.message()));
    }
    const nr_executable* exe = nr_model_executable(*out);
    const Shapes& want = spec_.stored[index].shapes;
    for (size_t i = 0; i < want.size(); ++i) {
      nr_tensor_info info;
      nr_executable_tensor(exe, NR_INPUT, i, &info);
      if (std::vector<int64_t>(info.shape, info.shape + info.rank) != want[i]) {
        nr_model_unload(*out);
        *out = nullptr;
        return absl::InvalidArgumentError(absl::StrCat(
            where_, "the executable stored for its shape ", label, " is compiled at other "
            "shapes than its dynamic_shapes attr lists (input ", i, "); recompile the model"));
      }
    }
    return absl::OkStatus();
  }

  // A loaded executable of `want`'s shape at another batch (under the lock): the smallest
  // batch at least `want`'s (one program), else the largest.
  Entry* OtherBatch(const Key& want) const {
    Entry* best = nullptr;
    int64_t best_batch = 0;
    for (const auto& [key, entry] : entries_) {
      if (key.second != want.second) continue;
      const bool fits = key.first >= want.first, best_fits = best && best_batch >= want.first;
      if (!best || (fits && (!best_fits || key.first < best_batch)) ||
          (!fits && !best_fits && key.first > best_batch)) {
        best = entry.get();
        best_batch = key.first;
      }
    }
    return best;
  }

  void Request(const Key& key) {  // (under the lock)
    if (!pending_.insert(key).second) return;
    queue_.push_back(key);
    if (working_) return;
    // (a worker that found the queue empty has left, or is leaving: it takes no lock again)
    if (worker_.joinable()) worker_.join();
    working_ = true;
    worker_ = std::thread([this] { CompileQueued(); });
  }

  void CompileQueued() {
    while (true) {
      Key key;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty() || closed_) {
          pending_.clear();
          changed_.notify_all();
          working_ = false;
          return;
        }
        key = queue_.front();
        queue_.pop_front();
      }
      nr_model* model = nullptr;
      absl::Status s = CompileOne(key, &model);
      std::vector<nr_model*> gone;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (s.ok() && !closed_) {
          Insert(key, model);
          model = nullptr;
        } else if (!s.ok()) {
          failed_[key] = s;
        }
        pending_.erase(key);
        gone = EvictLocked();
      }
      changed_.notify_all();
      if (model) nr_model_unload(model);
      for (nr_model* m : gone) nr_model_unload(m);
    }
  }

  // The io-config at that shape and batch (neuronish.contracts.io_config): the inputs in
  // the signature's order for the compiler, or with every object's keys sorted, as
  // json.dumps(sort_keys=True) writes it for the compile cache's key.
  enum class IoOrder { kSignature, kSortedKeys };
  std::string IoConfig(const Key& key, IoOrder order) const {
    const bool sorted = order == IoOrder::kSortedKeys;
    std::vector<size_t> ins(inputs_.size()), outs(output_axes_.size());
    for (size_t i = 0; i < ins.size(); ++i) ins[i] = i;
    for (size_t i = 0; i < outs.size(); ++i) outs[i] = i;
    if (sorted) {
      std::sort(ins.begin(), ins.end(), [this](size_t a, size_t b) {
        return inputs_[a].name < inputs_[b].name;
      });
      std::sort(outs.begin(), outs.end(), [this](size_t a, size_t b) {
        return output_axes_[a].first < output_axes_[b].first;
      });
    }
    std::string io = "{\"inputs\": {";
    for (size_t k = 0; k < ins.size(); ++k) {
      const size_t i = ins[k];
      io += absl::StrCat(k ? ", " : "", PyJsonString(inputs_[i].name, false), ": [[");
      for (size_t d = 0; d < key.second[i].size(); ++d) {
        const int64_t n = key.second[i][d];
        io += absl::StrCat(d ? ", " : "", n < 0 ? (key.first > 0 ? key.first : inputs_[i].shape[d]) : n);
      }
      io += absl::StrCat("], ", PyJsonString(inputs_[i].dtype_name, false), ", ",
                         inputs_[i].batch_axis, "]");
    }
    io += "}, \"outputs\": {";
    for (size_t k = 0; k < outs.size(); ++k) {
      io += absl::StrCat(k ? ", " : "", PyJsonString(output_axes_[outs[k]].first, false), ": ",
                         output_axes_[outs[k]].second);
    }
    return io + "}}";
  }

  // The executable of `key`'s shape: from the compile cache, else compiled (and stored
  // there), then loaded.
  absl::Status CompileOne(const Key& key, nr_model** out) {
    const std::string label = Label(key);
    const std::string what = absl::StrCat(where_, "compiling it for the new shape ", label);
    std::string executable, cache_key, why;
    std::unique_ptr<DiskCompileCache> cache = DiskCompileCache::FromEnv(&why);
    if (!why.empty()) LOG(WARNING) << where_ << "compile cache not used: " << why;
    if (cache) {
      const std::string identity = CompilerIdentity(CompilerCommand(), stop_);
      if (!identity.empty()) {
        std::vector<std::string> flags = spec_.compiler_args;
        for (std::string& f : EnvironmentFlags()) flags.push_back(std::move(f));
        const std::string graph = StableGraphBytes(*graph_), io = IoConfig(key, IoOrder::kSortedKeys),
                          args = PyJsonList(FlagsForKey(flags), true);
        cache_key = CacheKey({&graph, &io, &args, &identity});
      }
    }
    std::string warning;
    const bool hit = !cache_key.empty() && cache->Get(cache_key, &executable, &warning);
    if (!warning.empty()) LOG(WARNING) << where_ << warning;
    if (!hit) {
      absl::Status compiled = RunCompiler(what, *graph_, IoConfig(key, IoOrder::kSignature) + "\n",
                                          spec_.compiler_args, stop_, &executable);
      if (!compiled.ok()) return compiled;
      if (!cache_key.empty()) {
        cache->Put(cache_key, executable, &warning);
        if (!warning.empty()) LOG(WARNING) << where_ << warning;
      }
    }
    absl::Status loaded = load_(executable, label, out);
    if (!loaded.ok()) {
      return absl::Status(loaded.code(), absl::StrCat(where_, "loading its new shape ", label,
                                                      " failed: ", loaded.message()));
    }
    return absl::OkStatus();
  }

  // Unloads (by returning them) the least recently used executables not running, down to
  // MaxShapes() (under the lock).
  std::vector<nr_model*> EvictLocked() {
    std::vector<nr_model*> gone;
    const size_t limit = MaxShapes();
    while (entries_.size() > limit) {
      auto oldest = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->second->running == 0 &&
            (oldest == entries_.end() || it->second->used < oldest->second->used)) {
          oldest = it;
        }
      }
      if (oldest == entries_.end()) break;
      gone.push_back(oldest->second->model.load());
      entries_.erase(oldest);
    }
    return gone;
  }

  const std::string where_;
  std::string name_;  // the node's name without its scope (labels)
  const DynamicSpec spec_;
  const std::string* const graph_;
  const Loader load_;
  const StoredReader read_stored_;
  std::map<Key, size_t> stored_;  // the shapes compiled ahead: their index in spec_.stored
  // The probe's inputs, copied: the probe may be unloaded (least recently used).
  struct Input {
    std::string name, dtype_name;
    std::vector<int64_t> shape;
    int64_t batch_axis;
  };
  std::vector<Input> inputs_;
  std::vector<std::pair<std::string, int64_t>> output_axes_;  // (name, batch axis)
  int64_t compiled_batch_ = -1;

  std::mutex reload_mu_;  // one LoadAgain at a time; taken before mu_, never after
  std::mutex mu_;
  std::condition_variable changed_;  // an entry loaded, a compile failed, the queue drained
  std::map<Key, std::unique_ptr<Entry>> entries_;
  std::set<Key> pending_;  // queued or compiling
  std::set<Key> loading_;  // stored executables being loaded
  std::deque<Key> queue_;
  std::map<Key, absl::Status> failed_;  // not compiled again
  std::vector<nr_model*> retired_;  // replaced by LoadAgain; unloaded with the table
  uint64_t clock_ = 0;
  bool closed_ = false;
  bool working_ = false;
  std::thread worker_;
  std::atomic<bool> stop_{false};  // the compiler in flight is killed
};

}  // namespace
}  // namespace neuronish

#endif  // NEURONISH_OPS_NEURON_OP_SHAPES_H_
