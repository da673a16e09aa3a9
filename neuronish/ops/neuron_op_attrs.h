// What both NeuronOp kernels (neuron_op.cc, the Python host's; neuron_op_native.cc, any
// host's) read from the node and check before and during a call: the attrs, read once
// into one record, checked among themselves, and each call's inputs checked against
// them; and the guard that ties a call's cancellation byte to TensorFlow's
// CancellationManager. One copy, so the two kernels cannot drift apart. The kernels
// differ only in which dtypes their device path takes (passed in) and in free dims
// (-1 in the shape attrs with `dynamic_shapes`: the Python kernel runs them, the native
// one refuses them at Compute). Include it from one translation unit per library.
#ifndef NEURONISH_OPS_NEURON_OP_ATTRS_H_
#define NEURONISH_OPS_NEURON_OP_ATTRS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "neuronish_runtime.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace neuronish {
namespace {

inline std::string ShapeText(const tensorflow::TensorShape& s) {
  std::string out = "[";
  for (int d = 0; d < s.dims(); ++d) out += (d ? "," : "") + std::to_string(s.dim_size(d));
  return out + "]";
}

// The kernel's dtype table: whether its device path has `dt`, and the name it gives it
// in messages (numpy's for the Python host, TensorFlow's for the native one).
struct DtypeTable {
  bool (*has)(tensorflow::DataType);
  std::string (*name)(tensorflow::DataType);
};

// A call's output tensors: inline up to 8 (no allocation on a call's path).
using OutputTensors = absl::InlinedVector<tensorflow::Tensor*, 8>;

// The op's attrs (docs/contracts.md, "NeuronOp"), read once when the kernel is built.
struct NeuronOpAttrs {
  std::string node;   // the op's node name
  std::string where;  // "NeuronOp '<node>': ", the prefix of every message
  std::vector<std::string> input_names, output_names;
  std::vector<tensorflow::PartialTensorShape> input_shapes, output_shapes;
  tensorflow::DataTypeVector input_dtypes, output_dtypes;
  std::vector<int64_t> input_batch_axis, output_batch_axis, model_config;
  int64_t n_external = 0;      // trailing string inputs: paths of external attrs
  std::string dynamic_shapes;  // JSON; empty: every shape is static but the batch
  // Borrowed from the kernel's own NodeDef, which lives as long as the kernel: an
  // executable may be hundreds of MB.
  const std::string* executable = nullptr;
  const std::string* graph_def = nullptr;  // the subgraph, for the fallback to TensorFlow
  bool splittable = false;  // other batch sizes are split into compiled ones
  int64_t compiled_batch = -1;
  // The outputs' compiled shapes as TensorShapes, made once here rather than from the
  // PartialTensorShape attrs on every call (empty with dynamic_shapes: then the bridge
  // gives each call's shapes).
  std::vector<tensorflow::TensorShape> static_output_shapes;
  DtypeTable dtypes{nullptr, nullptr};

  int NumTensorInputs() const { return static_cast<int>(input_dtypes.size()); }

  // Reads every attr from `ctx` and checks them among themselves (the executable is
  // checked against them when it loads).
  absl::Status Read(tensorflow::OpKernelConstruction* ctx, const DtypeTable& table) {
    dtypes = table;
    node = ctx->def().name();
    where = "NeuronOp '" + node + "': ";
    TF_RETURN_IF_ERROR(ctx->GetAttr("input_names", &input_names));
    TF_RETURN_IF_ERROR(ctx->GetAttr("output_names", &output_names));
    TF_RETURN_IF_ERROR(ctx->GetAttr("input_shapes", &input_shapes));
    TF_RETURN_IF_ERROR(ctx->GetAttr("output_shapes", &output_shapes));
    TF_RETURN_IF_ERROR(ctx->GetAttr("Tin", &input_dtypes));
    TF_RETURN_IF_ERROR(ctx->GetAttr("output_dtypes", &output_dtypes));
    TF_RETURN_IF_ERROR(ctx->GetAttr("input_batch_axis", &input_batch_axis));
    TF_RETURN_IF_ERROR(ctx->GetAttr("output_batch_axis", &output_batch_axis));
    TF_RETURN_IF_ERROR(ctx->GetAttr("model_config", &model_config));
    TF_RETURN_IF_ERROR(ctx->GetAttr("n_external", &n_external));
    TF_RETURN_IF_ERROR(ctx->GetAttr("dynamic_shapes", &dynamic_shapes));
    const auto& attrs = ctx->def().attr();
    auto exe = attrs.find("executable");
    if (exe == attrs.end()) return absl::InvalidArgumentError(where + "has no executable attr");
    executable = &exe->second.s();
    auto gd = attrs.find("graph_def");
    if (gd == attrs.end()) return absl::InvalidArgumentError(where + "has no graph_def attr");
    graph_def = &gd->second.s();
    return Check();
  }

  // `float32[*,16]`: what input i must look like (`*` = any size, `?` = a free dim).
  std::string Expected(size_t i) const {
    std::string out = dtypes.name(input_dtypes[i]) + "[";
    for (int d = 0; d < input_shapes[i].dims(); ++d) {
      if (d) out += ",";
      const bool any = splittable && d == input_batch_axis[i];
      const int64_t size = input_shapes[i].dim_size(d);
      out += any ? "*" : size < 0 ? "?" : std::to_string(size);
    }
    return out + "]";
  }

  // Ranks and sizes against the compiled shapes (dtypes are enforced by Tin, and Tin
  // against the executable at load); sets the call's batch, or leaves -1 when the
  // compiled shapes apply as they are.
  absl::Status CheckInputs(tensorflow::OpKernelContext* ctx, int64_t* batch) const {
    int first = -1;
    for (int i = 0; i < NumTensorInputs(); ++i) {
      const tensorflow::TensorShape& got = ctx->input(i).shape();
      const tensorflow::PartialTensorShape& want = input_shapes[i];
      const int axis = splittable ? static_cast<int>(input_batch_axis[i]) : -1;
      bool ok = got.dims() == want.dims();
      for (int d = 0; ok && d < got.dims(); ++d) {
        ok = d == axis || want.dim_size(d) < 0 || got.dim_size(d) == want.dim_size(d);
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "input '", input_names[i], "' has shape ", ShapeText(got), "; expected ",
            Expected(i),
            axis >= 0 ? absl::StrCat(" (any size on batch axis ", axis, ")") : std::string(),
            ". Feed the shape the model was compiled for, or recompile it for this one"));
      }
      if (axis < 0) continue;
      if (first < 0) {
        first = i;
        *batch = got.dim_size(axis);
      } else if (got.dim_size(axis) != *batch) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "inputs disagree on the batch size: '", input_names[first], "' has ",
            *batch, ", '", input_names[i], "' has ", got.dim_size(axis)));
      }
    }
    return absl::OkStatus();
  }

  // The outputs of a call of `batch` (-1: the compiled one) on static shapes: the
  // compiled shapes with the call's batch, which is exactly what the runtime returns.
  absl::Status AllocateOutputs(tensorflow::OpKernelContext* ctx, int64_t batch,
                               OutputTensors* outputs) const {
    if (static_output_shapes.size() != output_shapes.size()) {
      return absl::InternalError(absl::StrCat(where, "an output has a free dim; it needs "
                                              "dynamic_shapes"));
    }
    outputs->resize(output_shapes.size());
    for (size_t i = 0; i < outputs->size(); ++i) {
      tensorflow::TensorShape shape = static_output_shapes[i];
      if (batch >= 0 && output_batch_axis[i] >= 0) shape.set_dim(output_batch_axis[i], batch);
      TF_RETURN_IF_ERROR(ctx->allocate_output(i, shape, &(*outputs)[i]));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Check() {
    const size_t n_in = input_dtypes.size(), n_out = output_dtypes.size();
    if (input_names.size() != n_in || input_shapes.size() != n_in ||
        input_batch_axis.size() != n_in || output_names.size() != n_out ||
        output_shapes.size() != n_out || output_batch_axis.size() != n_out) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "attribute lists disagree in length: Tin ", n_in, ", input_names ",
          input_names.size(), ", input_shapes ", input_shapes.size(), ", input_batch_axis ",
          input_batch_axis.size(), "; output_dtypes ", n_out, ", output_names ",
          output_names.size(), ", output_shapes ", output_shapes.size(),
          ", output_batch_axis ", output_batch_axis.size(),
          ". Build the node with neuronish.neuron_op.neuron_op_node_def"));
    }
    TF_RETURN_IF_ERROR(
        CheckEach("input", input_names, input_dtypes, input_shapes, input_batch_axis));
    TF_RETURN_IF_ERROR(
        CheckEach("output", output_names, output_dtypes, output_shapes, output_batch_axis));
    if (dynamic_shapes.empty()) {  // (then every shape is fully defined: checked above)
      static_output_shapes.resize(n_out);
      for (size_t i = 0; i < n_out; ++i) {
        // (GetAttr has already refused a shape whose size overflows)
        if (!output_shapes[i].AsTensorShape(&static_output_shapes[i])) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, "output '", output_names[i], "' has shape ",
              output_shapes[i].DebugString(), "; compiled shapes are static"));
        }
      }
    }
    // As in the runtime: other batch sizes are split only when every batched input
    // was compiled with the same batch.
    for (size_t i = 0; i < n_in; ++i) {
      if (input_batch_axis[i] < 0) continue;
      const int64_t b = input_shapes[i].dim_size(input_batch_axis[i]);
      if (compiled_batch == -1) {
        compiled_batch = b;
        splittable = true;
      } else if (b != compiled_batch) {
        splittable = false;
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckEach(const char* kind, const std::vector<std::string>& names,
                         const tensorflow::DataTypeVector& types,
                         const std::vector<tensorflow::PartialTensorShape>& shapes,
                         const std::vector<int64_t>& axes) const {
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string what = absl::StrCat(where, kind, " '", names[i], "' ");
      if (!dtypes.has(types[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, "has dtype ", dtypes.name(types[i]), ", which the device does not have"));
      }
      if (shapes[i].unknown_rank() || (dynamic_shapes.empty() && !shapes[i].IsFullyDefined())) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, "has shape ", shapes[i].DebugString(), "; compiled shapes are static"));
      }
      if (axes[i] < -1 || axes[i] >= shapes[i].dims()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, "has batch axis ", axes[i], " outside [-1, ", shapes[i].dims(), ")"));
      }
    }
    return absl::OkStatus();
  }
};

// nr_tensor views of a call's TensorFlow tensors (no copies): inputs, then outputs, in
// signature order. Their dims live in one array sized first, so the pointers into it
// stay put; inlined: no heap on the call's path. `to_device` is the kernel's own dtype
// conversion (DataType -> nr_dtype), as the attr checks take its dtype table.
struct CallViews {
  absl::InlinedVector<int64_t, 32> dims;
  absl::InlinedVector<nr_tensor, 8> views;

  template <typename ToDevice>
  CallViews(tensorflow::OpKernelContext* ctx, const NeuronOpAttrs& a,
            const OutputTensors& outputs, ToDevice to_device) {
    const int n_in = a.NumTensorInputs();
    size_t ranks = 0;
    for (int i = 0; i < n_in; ++i) ranks += ctx->input(i).dims();
    for (const tensorflow::Tensor* t : outputs) ranks += t->dims();
    dims.resize(ranks);
    views.resize(n_in + outputs.size());
    int64_t* next = dims.data();
    auto view = [&](const tensorflow::Tensor& t, const std::string& name,
                    tensorflow::DataType dt, nr_tensor* v) {
      v->name = name.c_str();
      v->dtype = to_device(dt);
      v->rank = t.dims();
      v->shape = next;
      for (int d = 0; d < t.dims(); ++d) *next++ = t.dim_size(d);
      const auto bytes = t.tensor_data();
      v->data = const_cast<char*>(bytes.data());
      v->bytes = bytes.size();
    };
    for (int i = 0; i < n_in; ++i) {
      view(ctx->input(i), a.input_names[i], a.input_dtypes[i], &views[i]);
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      view(*outputs[i], a.output_names[i], a.output_dtypes[i], &views[n_in + i]);
    }
  }
};

// A call's cancellation byte, set by TensorFlow's cancellation callback when the
// caller gives up on the call (TF Serving cancels a request's run at its deadline);
// the device reads it before each instruction, stage and chunk. Registered for the
// guard's life: the callback only stores the byte, and is deregistered before the
// byte goes. `flag` is null when TensorFlow gave the kernel no CancellationManager.
class CancelGuard {
 public:
  CancelGuard(tensorflow::OpKernelContext* ctx, volatile uint8_t* byte)
      : cm_(ctx->cancellation_manager()) {
    if (!cm_) return;
    *byte = 0;
    token_ = cm_->get_cancellation_token();
    registered_ = cm_->RegisterCallback(token_, [byte] {
      __atomic_store_n(const_cast<uint8_t*>(byte), 1, __ATOMIC_RELEASE);
    });
    if (registered_) flag_ = byte;
  }
  ~CancelGuard() {
    if (registered_) cm_->DeregisterCallback(token_);
  }
  CancelGuard(const CancelGuard&) = delete;
  CancelGuard& operator=(const CancelGuard&) = delete;

  // False when the call was cancelled before it started (nothing was registered).
  bool started() const { return !cm_ || registered_; }
  const volatile uint8_t* flag() const { return flag_; }

 private:
  tensorflow::CancellationManager* cm_;
  tensorflow::CancellationToken token_ = tensorflow::CancellationManager::kInvalidToken;
  bool registered_ = false;
  const volatile uint8_t* flag_ = nullptr;
};

}  // namespace
}  // namespace neuronish

#endif  // NEURONISH_OPS_NEURON_OP_ATTRS_H_
