// A call at exactly the compiled shapes, recognised from one flat record: the common case of
// Model::check_call (the NeuronOp's calls at its compiled batch), which otherwise walks the
// executable's signatures (names, shape vectors, dtype tables: a dozen scattered cache lines
// that a call from inside TensorFlow finds cold). Anything the record does not recognise goes
// to check_call, which splits the batch or words the error.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>

#include "executable.h"
#include "../include/neuronish_runtime.h"

namespace nr {

// A caller's tensor's dtype as the integer it holds. A C caller may store any int in an
// nr_dtype (C allows it); loading that as the C++ enum is undefined when it is no dtype
// (UBSan: "load of value 99, which is not a valid value for type nr_dtype"), so its bytes
// are read as an int.
inline int32_t dtype_of(const nr_tensor &t) {
  static_assert(sizeof(t.dtype) == sizeof(int32_t), "nr_dtype is an int");
  int32_t dtype;
  std::memcpy(&dtype, &t.dtype, sizeof dtype);
  return dtype;
}

class CompiledCall {
 public:
  explicit CompiledCall(const Executable &exe, uint64_t (*itemsize)(int dtype))
      : n_inputs_(exe.inputs.size()), n_outputs_(exe.outputs.size()),
        tensors_(new Tensor[n_inputs_ + n_outputs_]) {
    size_t k = 0;
    for (const auto *sigs : {&exe.inputs, &exe.outputs}) {
      for (const Signature &sig : *sigs) {
        Tensor &t = tensors_[k++];
        t.dtype = sig.type.dtype;
        t.rank = uint32_t(sig.type.shape.size());
        usable_ = usable_ && t.rank <= kMaxRank;
        t.bytes = itemsize(sig.type.dtype);
        for (size_t d = 0; d < t.rank && d < kMaxRank; ++d) {
          t.dims[d] = sig.type.shape[d];
          t.bytes *= uint64_t(sig.type.shape[d]);
        }
        t.name = sig.name.c_str();  // (the executable outlives the model)
        if (sig.name.size() < sizeof t.short_name) std::memcpy(t.short_name, sig.name.c_str(), sig.name.size() + 1);
      }
    }
  }

  // Whether the call's tensors are exactly the compiled signature (names, when given, too).
  // Reads only: callers on every thread share the record.
  bool matches(const nr_tensor *inputs, size_t num_inputs, const nr_tensor *outputs,
               size_t num_outputs) const {
    if (!usable_ || num_inputs != n_inputs_ || num_outputs != n_outputs_ ||
        (num_inputs && !inputs) || (num_outputs && !outputs))
      return false;
    for (size_t i = 0; i < n_inputs_; ++i)
      if (!same(inputs[i], tensors_[i])) return false;
    for (size_t i = 0; i < n_outputs_; ++i)
      if (!same(outputs[i], tensors_[n_inputs_ + i])) return false;
    return true;
  }

 private:
  static constexpr uint32_t kMaxRank = 8;  // (a higher rank takes check_call every call)
  struct Tensor {
    int32_t dtype;
    uint32_t rank;
    uint64_t bytes;
    int64_t dims[kMaxRank];
    // The name, here when short (the common case: compared without touching the
    // executable's strings), else only `name`.
    char short_name[48] = {};
    const char *name;
  };

  static bool same(const nr_tensor &t, const Tensor &s) {
    if (dtype_of(t) != s.dtype || t.rank != s.rank || t.bytes < s.bytes || (s.bytes && !t.data) ||
        (s.rank && (!t.shape || std::memcmp(t.shape, s.dims, s.rank * sizeof(int64_t)) != 0)))
      return false;
    return !t.name || std::strcmp(t.name, s.short_name[0] ? s.short_name : s.name) == 0;
  }

  size_t n_inputs_, n_outputs_;
  std::unique_ptr<Tensor[]> tensors_;  // inputs, then outputs
  bool usable_ = true;
};

}  // namespace nr
