// Instruction -> native engine spec: the C++ twin of runtime/native/spec.py and
// spec_int8.py, which stay the definition. One validated instruction becomes the flat
// int64 list (and the few floats) that engine.cc's `ne_add` reads, or nothing when the
// engine has no kernel for those dtypes and attributes (Python would run numpy there;
// the C runtime refuses such a program at load). tests/runtime/test_capi_spec.py holds
// the two encoders to each other, list for list.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "msgpack_reader.h"

namespace nr::spec {

// Where a value lives for the engine: slot, byte offset, dtype (nr_dtype), shape.
struct Ref {
  int64_t slot = 0, offset = 0;
  int dtype = 0;
  std::vector<int64_t> shape;
  bool blocked = false;  // kept channel-blocked (nChw16c) between windowed instructions
  bool widenable = false;  // bfloat16 the engine may keep in float32 (spec.py Ref)
};

struct Spec {
  std::vector<int64_t> ints;
  std::vector<double> floats;  // handed to the engine as float32, as ctypes does
};

// A required attribute the encoder reads is missing (Python: a KeyError).
struct MissingAttr {
  std::string name;
};

// The spec of one instruction; false when the engine does not take it.
bool encode(const std::string &kind, const mp::Node &attrs, const std::vector<Ref> &ins,
            const std::vector<Ref> &outs, const std::vector<bool> &constant, Spec &out);

// spec.py's `work`: a rough size of the instruction's work, to choose its team.
int64_t work(const std::string &kind, const mp::Node &attrs, const std::vector<Ref> &ins,
             const std::vector<Ref> &outs);
constexpr int64_t kSmallWork = int64_t(12) << 20;  // spec.py's SMALL_WORK
constexpr int64_t kTinyWork = int64_t(1) << 20;    // spec.py's TINY_WORK (`wide` programs)

// spec.py's is_wide: a program with an instruction of kSmallWork or more holds all its
// threads while it computes.
inline bool is_wide(const std::vector<int64_t> &work_sizes) {
  for (int64_t w : work_sizes)
    if (w >= kSmallWork) return true;
  return false;
}

// spec.py's team_size: the threads an instruction of `work_size` runs on, in a program
// that is `wide` (is_wide) or not.
constexpr int team_size(int64_t work_size, bool wide, int threads) {
  return work_size >= (wide ? kTinyWork : kSmallWork) ? threads : 1;
}

// isa.WINDOWED: the kinds that may share channel-blocked values.
bool windowed(const std::string &kind);

}  // namespace nr::spec
