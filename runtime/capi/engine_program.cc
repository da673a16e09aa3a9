// runtime/program.py's native half in C++ (engine_program.h).
#include "engine_program.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "engine_api.h"
#include "engine_spec_parts.h"
#include "sha256.h"

namespace nr {
namespace {

constexpr int64_t kErr = 2048;

uint64_t nbytes(const TensorType &t) {
  static const int size[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};
  uint64_t n = uint64_t(size[t.dtype]);
  for (int64_t d : t.shape) n *= uint64_t(d);
  return n;
}

const TensorType &type_of(const Executable &exe, uint64_t vid) {
  auto it = exe.values.find(vid);
  return it != exe.values.end() ? it->second : exe.constants.at(vid).type;
}

std::string where(const Executable &exe, size_t index, const Instruction &ins) {
  (void)exe;
  std::string names;
  for (auto &s : ins.source) names += (names.empty() ? "" : ", ") + s;
  return "instruction " + std::to_string(index) + " (" + ins.kind + ", from TF node(s) " +
         (names.empty() ? "?" : names) + ")";
}

// program.py's _blockable: values marked for a channel-blocked layout whose producer and
// readers are all windowed instructions.
std::set<uint64_t> blockable(const Executable &exe) {
  std::map<uint64_t, const Instruction *> marked;
  std::map<uint64_t, std::vector<const Instruction *>> readers;
  for (auto &p : exe.programs)
    for (auto &ins : p) {
      const mp::Node *layout = ins.attrs ? ins.attrs->get("layout") : nullptr;
      if (layout && !layout->is_str("nhwc") && ins.outputs.size() == 1) marked[ins.outputs[0]] = &ins;
    }
  for (auto &p : exe.programs)
    for (auto &ins : p)
      for (uint64_t v : ins.inputs)
        if (marked.count(v)) readers[v].push_back(&ins);
  std::set<uint64_t> external;
  for (auto &s : exe.inputs) external.insert(s.value);
  for (auto &s : exe.outputs) external.insert(s.value);
  std::set<uint64_t> out;
  for (auto &[v, producer] : marked) {
    auto r = readers.find(v);
    if (external.count(v) || r == readers.end() || !spec::windowed(producer->kind)) continue;
    if (std::all_of(r->second.begin(), r->second.end(), [](auto *i) { return spec::windowed(i->kind); }))
      out.insert(v);
  }
  return out;
}

struct Built {
  std::unique_ptr<CopyProgram> copy;
  std::map<size_t, std::string> rejected;  // flat index -> why
  std::set<size_t> slow;                   // flat indices on oneDNN's reference kernels
};

// program.py's _widenable: the bfloat16 values in the arena of a one-stage program, which
// the engine may keep in float32 (engine.cc widened_slot).
std::set<uint64_t> widenable(const Executable &exe) {
  std::set<uint64_t> out;
  if (exe.programs.size() != 1) return out;
  std::set<uint64_t> external;
  for (auto &s : exe.inputs) external.insert(s.value);
  for (auto &s : exe.outputs) external.insert(s.value);
  for (auto &[vid, offset] : exe.offsets) {
    auto t = exe.values.find(vid);
    if (!external.count(vid) && t != exe.values.end() && t->second.dtype == spec::detail::BF16)
      out.insert(vid);
  }
  return out;
}

Built build_once(const Executable &exe, const DeviceConstants &constants, int threads,
                 const std::set<uint64_t> &blocked, const std::set<uint64_t> &widened,
                 const WeightPool &pool) {
  Built b;
  b.copy = std::make_unique<CopyProgram>();
  CopyProgram &copy = *b.copy;
  int64_t first_call = int64_t(constants.ids.size());
  copy.first_call_slot = first_call;
  std::vector<uint64_t> call_ids;
  for (auto &s : exe.inputs) call_ids.push_back(s.value);
  for (auto &s : exe.outputs) call_ids.push_back(s.value);
  std::map<uint64_t, std::pair<int64_t, int64_t>> place;
  for (auto &[vid, off] : exe.offsets) place[vid] = {first_call, int64_t(off)};
  for (size_t k = 0; k < constants.ids.size(); ++k) place[constants.ids[k]] = {int64_t(k), 0};
  for (size_t k = 0; k < call_ids.size(); ++k) place.emplace(call_ids[k], std::make_pair(first_call + 1 + int64_t(k), int64_t(0)));
  auto ref = [&](uint64_t vid) {
    spec::Ref r;
    std::tie(r.slot, r.offset) = place.at(vid);
    const TensorType &t = type_of(exe, vid);
    r.dtype = t.dtype;
    r.shape = t.shape;
    r.blocked = blocked.count(vid) > 0;
    r.widenable = widened.count(vid) > 0;
    return r;
  };
  char err[kErr];
  size_t index = 0;
  for (auto &program : exe.programs) {
    auto stage = std::make_unique<Stage>();
    stage->engine = ne_create(first_call + 1 + int64_t(call_ids.size()), threads, err, kErr);
    if (!stage->engine) throw Refused{NR_INTERNAL, std::string("native engine: ") + err};
    ne_use_pool(stage->engine, pool.get());
    for (size_t k = 0; k < constants.ids.size(); ++k)
      if (ne_bind(stage->engine, int64_t(k), constants.data[k], err, kErr) < 0)
        throw Refused{NR_INTERNAL, std::string("native engine: ") + err};
    int widest = 0;
    // Each instruction's operands placed once; then whether the program is wide, which
    // decides every instruction's team (spec::team_size), before any is added.
    struct Placed {
      std::vector<spec::Ref> in, out;
      std::vector<bool> constant;
      int64_t work = 0;
    };
    std::vector<Placed> placed(program.size());
    std::vector<int64_t> works;
    for (size_t local = 0; local < program.size(); ++local) {
      const Instruction &ins = program[local];
      Placed &p = placed[local];
      for (uint64_t v : ins.inputs) {
        p.in.push_back(ref(v));
        p.constant.push_back(exe.constants.count(v) > 0);
      }
      for (uint64_t v : ins.outputs) p.out.push_back(ref(v));
      try {
        p.work = spec::work(ins.kind, *ins.attrs, p.in, p.out);
      } catch (...) {  // (a malformed instruction: encode, below, says why)
      }
      works.push_back(p.work);
    }
    const bool wide = spec::is_wide(works);
    for (size_t local = 0; local < program.size(); ++local, ++index) {
      const Instruction &ins = program[local];
      const std::vector<spec::Ref> &in = placed[local].in, &out = placed[local].out;
      SpecRecord record;
      try {
        record.taken = spec::encode(ins.kind, *ins.attrs, in, out, placed[local].constant, record.spec);
      } catch (const spec::MissingAttr &m) {
        throw Refused{NR_INVALID_EXECUTABLE, where(exe, index, ins) + " lacks attribute '" + m.name +
                      "', which the native engine needs (field 'attrs." + m.name + "')"};
      }
      stage->engine_index.push_back(-1);
      if (!record.taken) {
        bool empty = false;
        for (auto *refs : {&in, &out})
          for (auto &r : *refs) empty = empty || std::count(r.shape.begin(), r.shape.end(), 0) > 0;
        bool nothing = true;  // every output empty: nothing to compute
        for (auto &r : out) nothing = nothing && std::count(r.shape.begin(), r.shape.end(), 0) > 0;
        if (!(empty && nothing))
          b.rejected[index] = empty ? "an empty operand with a non-empty result (the C runtime has no "
                                      "kernel for it yet)"
                                    : "no native kernel for these dtypes and attributes";
        copy.specs.push_back(std::move(record));
        continue;
      }
      int team = spec::team_size(placed[local].work, wide, threads);
      ne_set_threads(stage->engine, team);
      std::vector<float> floats(record.spec.floats.begin(), record.spec.floats.end());
      if (floats.empty()) floats.push_back(0);
      int64_t held = ne_bytes(stage->engine);
      int64_t k = ne_add(stage->engine, record.spec.ints.data(), int64_t(record.spec.ints.size()), floats.data(),
                         int64_t(record.spec.floats.size()), err, kErr);
      if (k < 0) {
        b.rejected[index] = std::string("the engine refused it: ") + err;
        copy.specs.push_back(std::move(record));
        continue;
      }
      int64_t weights = ne_bytes(stage->engine) - held;
      stage->weight_bytes += uint64_t(weights);
      if (weights) stage->weight_instructions.insert(local);
      widest = std::max(widest, team);
      stage->engine_index.back() = k;
      record.team = team;
      stage->count = k + 1;
      char impl[256];
      if (ne_impl(stage->engine, k, impl, sizeof impl) >= 0 && std::string(impl).rfind("ref", 0) == 0)
        b.slow.insert(index);
      copy.specs.push_back(std::move(record));
    }
    stage->width = std::max(widest, 1);
    copy.stages.push_back(std::move(stage));
  }
  return b;
}

}  // namespace

namespace {

// The process's shared constants, by (SHA-256, size); expired entries are dropped as new
// ones come.
std::mutex shared_constants_mu;
std::map<std::pair<std::string, size_t>, std::weak_ptr<void>> shared_constants;

std::shared_ptr<void> new_block(const uint8_t *bytes, size_t size) {
  void *p = std::aligned_alloc(64, (std::max<size_t>(size, 1) + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  std::memcpy(p, bytes, size);
  return std::shared_ptr<void>(p, std::free);
}

std::shared_ptr<void> shared_block(const uint8_t *bytes, size_t size) {
  uint8_t digest[32];
  sha256(bytes, size, digest);
  const auto key = std::make_pair(std::string(reinterpret_cast<char *>(digest), 32), size);
  std::lock_guard<std::mutex> hold(shared_constants_mu);
  auto it = shared_constants.find(key);
  if (it != shared_constants.end())
    if (std::shared_ptr<void> block = it->second.lock()) return block;
  for (auto e = shared_constants.begin(); e != shared_constants.end();)
    e = e->second.expired() ? shared_constants.erase(e) : std::next(e);
  std::shared_ptr<void> block = new_block(bytes, size);
  shared_constants[key] = block;
  return block;
}

}  // namespace

std::shared_ptr<DeviceConstants> place_constants(const Executable &exe) {
  auto out = std::make_shared<DeviceConstants>();
  for (auto &[vid, c] : exe.constants) {  // std::map: sorted ids, as program.py sorts them
    const uint8_t *bytes = exe.body.data() + c.data_offset;
    std::shared_ptr<void> block = c.data_bytes >= kShareConstantBytes ? shared_block(bytes, c.data_bytes)
                                                                       : new_block(bytes, c.data_bytes);
    out->ids.push_back(vid);
    out->data.push_back(block.get());
    out->bytes.push_back(c.data_bytes);
    out->held.push_back(std::move(block));
  }
  return out;
}

const WeightPool &process_weight_pool() {
  static const WeightPool *pool = new WeightPool();  // (never destroyed: no exit-order question)
  return *pool;
}

Stage::~Stage() {
  if (engine) ne_destroy(engine);
}

std::unique_ptr<CopyProgram> build_copy(const Executable &exe, const DeviceConstants &constants, int threads,
                                        const WeightPool &pool) {
  std::set<uint64_t> blocked = blockable(exe), widened = widenable(exe);
  std::vector<const Instruction *> flat;
  for (auto &p : exe.programs)
    for (auto &ins : p) flat.push_back(&ins);
  while (true) {
    Built b = build_once(exe, constants, threads, blocked, widened, pool);
    if (!b.rejected.empty() && !widened.empty()) {  // refused for want of a mixed-dtype kernel?
      widened.clear();
      continue;
    }
    std::set<uint64_t> refused;
    std::set<size_t> bad = b.slow;
    for (auto &[i, why] : b.rejected) bad.insert(i);
    for (size_t i : bad)
      for (auto *ids : {&flat[i]->inputs, &flat[i]->outputs})
        for (uint64_t v : *ids)
          if (blocked.count(v)) refused.insert(v);
    if (!refused.empty()) {
      for (uint64_t v : refused) blocked.erase(v);
      continue;
    }
    if (!b.rejected.empty()) {
      auto &[i, why] = *b.rejected.begin();
      throw Refused{NR_UNSUPPORTED, where(exe, i, *flat[i]) + " cannot run on the native engine: " + why +
                    " (" + std::to_string(b.rejected.size()) + " such instruction(s)). The Python runtime "
                    "runs it on its numpy reference kernel; the C runtime has only the native engine"};
    }
    char err[kErr];
    for (auto &stage : b.copy->stages)
      if (ne_finalize(stage->engine, err, kErr) < 0)
        throw Refused{NR_INTERNAL, std::string("native engine: ") + err};
    for (auto &stage : b.copy->stages) {
      int64_t held = ne_bytes(stage->engine);
      stage->buffer_bytes = uint64_t(held) - stage->weight_bytes;
    }
    return std::move(b.copy);
  }
}

std::vector<uint64_t> bytes_per_core(const Executable &exe, const CopyProgram &copy, size_t arenas) {
  std::vector<uint64_t> out;
  for (size_t s = 0; s < exe.programs.size(); ++s) {
    const Stage &stage = *copy.stages[s];
    std::set<uint64_t> consts;
    for (size_t local = 0; local < exe.programs[s].size(); ++local) {
      auto &ins = exe.programs[s][local];
      for (size_t k = 0; k < ins.inputs.size(); ++k)
        if (exe.constants.count(ins.inputs[k]) && !(stage.weight_instructions.count(local) && k == 1))
          consts.insert(ins.inputs[k]);
    }
    uint64_t total = stage.weight_bytes + stage.buffer_bytes + exe.arena_bytes * arenas;
    for (uint64_t v : consts) total += nbytes(exe.constants.at(v).type);
    out.push_back(total);
  }
  return out;
}

}  // namespace nr
