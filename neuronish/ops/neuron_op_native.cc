// NeuronOp for hosts without Python: the same op as neuron_op.cc (neuron_op_def.h), whose
// kernel calls the device runtime's C API (runtime/include/neuronish_runtime.h) directly.
//
// A TensorFlow host that is not Python (TF Serving's C++ server, the C API and the
// languages on it, a C++ application) loads this library with TF_LoadLibrary: it links
// libneuronish_runtime.so (rpath recorded) and TensorFlow's framework library, and not
// one Python symbol. Each kernel instance loads its executable once, on its first call,
// onto one process-wide device configured from NEURONISH_* (as the Python runtime reads
// it), and each call runs there with the call's cancellation and model_config's timeout.
//
// Not here yet (docs/c-api.md, "From TensorFlow's C API"): ops with free dimensions
// (dynamic_shapes; they compile executables at run time, which needs the Python host),
// the runtime fallback to TensorFlow (running graph_def when the device refuses the
// executable), profiles and telemetry.
//
// Built by neuronish/op_library.py (build_native) against the installed TensorFlow.

#include <sys/stat.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "neuronish_runtime.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

#include "neuron_op_def.h"

namespace neuronish {
namespace {

using tensorflow::DataType;
using tensorflow::DataTypeVector;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::PartialTensorShape;
using tensorflow::Tensor;
using tensorflow::TensorShape;

constexpr size_t kErrorSize = 4096;
// The attr value of an executable stored in the SavedModel's assets (neuronish/external.py).
constexpr char kExternalPrefix[] = "neuronish-external:v1:";
// model_config's entries (docs/contracts.md, "NeuronOp").
constexpr size_t kMaxDuplicates = 2, kTimeoutS = 3;
// As kernel_bridge.DEFAULT_MAX_DUPLICATES: copies loaded when model_config does not
// bound them, or fewer when the device has fewer core groups.
constexpr int64_t kDefaultDuplicates = 4;

bool ToDevice(DataType dt, nr_dtype* out) {
  switch (dt) {
    case tensorflow::DT_BOOL: *out = NR_BOOL; return true;
    case tensorflow::DT_INT8: *out = NR_INT8; return true;
    case tensorflow::DT_UINT8: *out = NR_UINT8; return true;
    case tensorflow::DT_INT16: *out = NR_INT16; return true;
    case tensorflow::DT_INT32: *out = NR_INT32; return true;
    case tensorflow::DT_INT64: *out = NR_INT64; return true;
    case tensorflow::DT_HALF: *out = NR_FLOAT16; return true;
    case tensorflow::DT_BFLOAT16: *out = NR_BFLOAT16; return true;
    case tensorflow::DT_FLOAT: *out = NR_FLOAT32; return true;
    case tensorflow::DT_DOUBLE: *out = NR_FLOAT64; return true;
    default: return false;
  }
}

// A runtime status as TensorFlow's, with the runtime's message.
absl::Status FromRuntime(nr_status s, const std::string& where, const char* message) {
  const std::string text = absl::StrCat(where, message, " (", nr_status_name(s), ")");
  switch (s) {
    case NR_OK: return absl::OkStatus();
    case NR_INVALID_INPUT:
    case NR_INVALID_ARGUMENT: return absl::InvalidArgumentError(text);
    case NR_DEADLINE_EXCEEDED: return absl::DeadlineExceededError(text);
    case NR_CANCELLED: return absl::CancelledError(text);
    case NR_OUT_OF_DEVICE_MEMORY:
    case NR_OUT_OF_MEMORY: return absl::ResourceExhaustedError(text);
    default: return absl::InternalError(text);
  }
}

// The process's device, opened on first use and kept for the process's life (the
// models of every NeuronOp share its cores and memory, as in the Python runtime).
absl::Status SharedDevice(const std::string& where, nr_device** out) {
  static std::once_flag once;
  static nr_device* device = nullptr;
  static nr_status status = NR_OK;
  static char error[kErrorSize];
  std::call_once(once, [] { status = nr_device_open(&device, error, sizeof error); });
  if (status != NR_OK) {
    return FromRuntime(status, where + "cannot open the neuronish device: ", error);
  }
  *out = device;
  return absl::OkStatus();
}

std::string ShapeText(const TensorShape& s) {
  std::string out = "[";
  for (int d = 0; d < s.dims(); ++d) out += (d ? "," : "") + std::to_string(s.dim_size(d));
  return out + "]";
}

class NeuronOpNativeKernel : public OpKernel {
 public:
  explicit NeuronOpNativeKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_names", &input_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_names", &output_names_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_shapes", &input_shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_shapes", &output_shapes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tin", &input_dtypes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_dtypes", &output_dtypes_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("input_batch_axis", &input_batch_axis_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("output_batch_axis", &output_batch_axis_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("model_config", &model_config_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("n_external", &n_external_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("dynamic_shapes", &dynamic_shapes_));
    // Borrowed from the kernel's own NodeDef (it lives as long as the kernel): an
    // executable may be hundreds of MB.
    auto it = def().attr().find("executable");
    OP_REQUIRES(ctx, it != def().attr().end(),
                absl::InvalidArgumentError(Where() + "has no executable attr"));
    executable_ = &it->second.s();
    if (dynamic_shapes_.empty()) OP_REQUIRES_OK(ctx, CheckAttrs());
  }

  ~NeuronOpNativeKernel() override { nr_model_unload(model_.load()); }

  void Compute(OpKernelContext* ctx) override {
    OP_REQUIRES(ctx, dynamic_shapes_.empty(),
                absl::UnimplementedError(
                    Where() + "has free dimensions (dynamic_shapes), which only the Python "
                    "host runs for now: it compiles an executable for each new shape. Serve "
                    "this model from Python, or compile it with static shapes"));
    int64_t batch = -1;
    OP_REQUIRES_OK(ctx, CheckInputs(ctx, &batch));
    OP_REQUIRES_OK(ctx, EnsureLoaded(ctx));
    std::vector<Tensor*> outputs(output_shapes_.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      TensorShape shape;
      output_shapes_[i].AsTensorShape(&shape);  // fully defined: CheckAttrs
      if (batch >= 0 && output_batch_axis_[i] >= 0) shape.set_dim(output_batch_axis_[i], batch);
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, shape, &outputs[i]));
    }
    OP_REQUIRES_OK(ctx, Run(ctx, outputs));
  }

 private:
  std::string Where() const { return "NeuronOp '" + name() + "': "; }
  int NumTensorInputs() const { return static_cast<int>(input_dtypes_.size()); }

  // The attrs must agree among themselves; EnsureLoaded checks them against the executable.
  absl::Status CheckAttrs() {
    const size_t n_in = input_dtypes_.size(), n_out = output_dtypes_.size();
    if (input_names_.size() != n_in || input_shapes_.size() != n_in ||
        input_batch_axis_.size() != n_in || output_names_.size() != n_out ||
        output_shapes_.size() != n_out || output_batch_axis_.size() != n_out) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), "attribute lists disagree in length: Tin ", n_in, ", input_names ",
          input_names_.size(), ", input_shapes ", input_shapes_.size(), ", input_batch_axis ",
          input_batch_axis_.size(), "; output_dtypes ", n_out, ", output_names ",
          output_names_.size(), ", output_shapes ", output_shapes_.size(),
          ", output_batch_axis ", output_batch_axis_.size(),
          ". Build the node with neuronish.neuron_op.neuron_op_node_def"));
    }
    auto check = [&](const char* kind, const std::vector<std::string>& names,
                     const DataTypeVector& dtypes, const std::vector<PartialTensorShape>& shapes,
                     const std::vector<int64_t>& axes) -> absl::Status {
      for (size_t i = 0; i < names.size(); ++i) {
        const std::string what = absl::StrCat(Where(), kind, " '", names[i], "' ");
        nr_dtype unused;
        if (!ToDevice(dtypes[i], &unused)) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, "has dtype ", tensorflow::DataTypeString(dtypes[i]),
              ", which the device does not have"));
        }
        if (!shapes[i].IsFullyDefined()) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, "has shape ", shapes[i].DebugString(), "; compiled shapes are static"));
        }
        if (axes[i] < -1 || axes[i] >= shapes[i].dims()) {
          return absl::InvalidArgumentError(absl::StrCat(
              what, "has batch axis ", axes[i], " outside [-1, ", shapes[i].dims(), ")"));
        }
      }
      return absl::OkStatus();
    };
    TF_RETURN_IF_ERROR(
        check("input", input_names_, input_dtypes_, input_shapes_, input_batch_axis_));
    TF_RETURN_IF_ERROR(
        check("output", output_names_, output_dtypes_, output_shapes_, output_batch_axis_));
    // As in the runtime: other batch sizes are split only when every batched input
    // was compiled with the same batch.
    for (size_t i = 0; i < n_in; ++i) {
      if (input_batch_axis_[i] < 0) continue;
      const int64_t b = input_shapes_[i].dim_size(input_batch_axis_[i]);
      if (compiled_batch_ == -1) {
        compiled_batch_ = b;
        splittable_ = true;
      } else if (b != compiled_batch_) {
        splittable_ = false;
      }
    }
    return absl::OkStatus();
  }

  // Ranks and sizes against the compiled shapes (dtypes are enforced by Tin); sets the
  // call's batch, or leaves -1 when the compiled shapes apply as they are. The runtime
  // checks again; this gives TensorFlow's names and the output shapes to allocate.
  absl::Status CheckInputs(OpKernelContext* ctx, int64_t* batch) const {
    int first = -1;
    for (int i = 0; i < NumTensorInputs(); ++i) {
      const TensorShape& got = ctx->input(i).shape();
      const PartialTensorShape& want = input_shapes_[i];
      const int axis = splittable_ ? static_cast<int>(input_batch_axis_[i]) : -1;
      bool ok = got.dims() == want.dims();
      for (int d = 0; ok && d < got.dims(); ++d) {
        ok = d == axis || got.dim_size(d) == want.dim_size(d);
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), "input '", input_names_[i], "' has shape ", ShapeText(got),
            "; expected ", want.DebugString(),
            axis >= 0 ? absl::StrCat(" (any size on batch axis ", axis, ")") : std::string(),
            ". Feed the shape the model was compiled for, or recompile it for this one"));
      }
      if (axis < 0) continue;
      if (first < 0) {
        first = i;
        *batch = got.dim_size(axis);
      } else if (got.dim_size(axis) != *batch) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), "inputs disagree on the batch size: '", input_names_[first], "' has ",
            *batch, ", '", input_names_[i], "' has ", got.dim_size(axis)));
      }
    }
    return absl::OkStatus();
  }

  // The file an external executable reference names, among the paths fed to the
  // op's external_files inputs (the SavedModel's assets, wherever it was loaded from).
  // Its size is checked here and its whole content by the runtime's validation; its
  // SHA-256 is not (the Python host checks it), which a damaged file would still fail.
  absl::Status ExternalPath(OpKernelContext* ctx, std::string* path) const {
    const std::string ref = executable_->substr(sizeof kExternalPrefix - 1);
    const size_t colon = ref.find(':');
    const std::string digest = ref.substr(0, colon);
    const std::string size_text = colon == std::string::npos ? "" : ref.substr(colon + 1);
    char* end = nullptr;
    const unsigned long long size = std::strtoull(size_text.c_str(), &end, 10);
    if (digest.size() != 64 || size_text.empty() || *end != '\0') {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), "malformed external executable reference '", executable_->substr(0, 120),
          "'; expected neuronish-external:v1:<sha256>:<size>"));
    }
    const std::string file = digest + ".neff";
    std::vector<std::string> fed;
    for (int k = 0; k < n_external_; ++k) {
      const Tensor& t = ctx->input(NumTensorInputs() + k);
      if (t.dims() != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), "external_files[", k, "] must be a scalar path, got shape ",
            ShapeText(t.shape())));
      }
      const std::string p(t.scalar<tensorflow::tstring>()());
      fed.push_back(p);
      const size_t slash = p.rfind('/');
      if ((slash == std::string::npos ? p : p.substr(slash + 1)) != file) continue;
      struct stat st;
      if (stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
        return absl::NotFoundError(absl::StrCat(Where(), "its executable ", p,
                                                " is missing or not a regular file"));
      }
      if (static_cast<unsigned long long>(st.st_size) != size) {
        return absl::DataLossError(absl::StrCat(Where(), "its executable ", p, " has ",
                                                st.st_size, " bytes; the reference says ",
                                                size));
      }
      *path = p;
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat(
        Where(), "its executable is the asset ", file, ", which none of the ", fed.size(),
        " external_files inputs names (", absl::StrJoin(fed, ", "), ")"));
  }

  // The executable's signature must be the attrs' (a rewrite that broke one fails here,
  // not as a wrong answer).
  absl::Status CheckSignature(const nr_executable* exe) const {
    auto check = [&](nr_io which, const char* kind, const std::vector<std::string>& names,
                     const DataTypeVector& dtypes) -> absl::Status {
      const size_t n = nr_executable_num_tensors(exe, which);
      if (n != names.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), "its executable has ", n, " ", kind, "s; the op's attrs list ",
            names.size()));
      }
      for (size_t i = 0; i < n; ++i) {
        nr_tensor_info info;
        nr_executable_tensor(exe, which, i, &info);
        nr_dtype want;
        ToDevice(dtypes[i], &want);
        if (names[i] != info.name || info.dtype != want) {
          return absl::InvalidArgumentError(absl::StrCat(
              Where(), kind, " ", i, " is '", names[i], "' (",
              tensorflow::DataTypeString(dtypes[i]), ") in the op's attrs but '", info.name,
              "' (", info.dtype_name, ") in its executable"));
        }
      }
      return absl::OkStatus();
    };
    TF_RETURN_IF_ERROR(check(NR_INPUT, "input", input_names_, input_dtypes_));
    return check(NR_OUTPUT, "output", output_names_, output_dtypes_);
  }

  // Loads the executable on the first call (external_files are inputs, so not before);
  // later calls only read model_.
  absl::Status EnsureLoaded(OpKernelContext* ctx) {
    if (model_.load(std::memory_order_acquire)) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(load_mu_);
    if (model_.load(std::memory_order_acquire)) return absl::OkStatus();
    nr_device* device = nullptr;
    TF_RETURN_IF_ERROR(SharedDevice(Where(), &device));
    std::string path;
    if (executable_->compare(0, sizeof kExternalPrefix - 1, kExternalPrefix) == 0) {
      TF_RETURN_IF_ERROR(ExternalPath(ctx, &path));
    }
    const int64_t bound = model_config_.size() > kMaxDuplicates ? model_config_[kMaxDuplicates]
                                                                : -1;
    // As many copies as asked (or the default), fewer if the device's core groups
    // cannot hold them: NR_DEVICE_ERROR says there are too few groups.
    char error[kErrorSize];
    nr_status s = NR_DEVICE_ERROR;
    nr_model* model = nullptr;
    for (int64_t dups = bound >= 1 ? bound : kDefaultDuplicates; dups >= 1; --dups) {
      s = path.empty() ? nr_model_load_bytes(device, executable_->data(), executable_->size(),
                                             static_cast<uint32_t>(dups), &model, error,
                                             sizeof error)
                       : nr_model_load_file(device, path.c_str(), static_cast<uint32_t>(dups),
                                            &model, error, sizeof error);
      if (s != NR_DEVICE_ERROR) break;
    }
    if (s != NR_OK) {
      return FromRuntime(s, Where() + "cannot load its executable: ", error);
    }
    absl::Status ok = CheckSignature(nr_model_executable(model));
    if (!ok.ok()) {
      nr_model_unload(model);
      return ok;
    }
    model_.store(model, std::memory_order_release);
    return absl::OkStatus();
  }

  absl::Status Run(OpKernelContext* ctx, const std::vector<Tensor*>& outputs) {
    // nr_tensor views of TensorFlow's buffers (no copies); dims kept alive alongside.
    std::vector<std::vector<int64_t>> dims;
    dims.reserve(NumTensorInputs() + outputs.size());
    auto view = [&dims](const Tensor& t, const std::string& name, DataType dt) {
      dims.emplace_back(t.dims());
      for (int d = 0; d < t.dims(); ++d) dims.back()[d] = t.dim_size(d);
      nr_tensor v;
      v.name = name.c_str();
      ToDevice(dt, &v.dtype);
      v.rank = dims.back().size();
      v.shape = dims.back().data();
      const auto bytes = t.tensor_data();
      v.data = const_cast<char*>(bytes.data());
      v.bytes = bytes.size();
      return v;
    };
    std::vector<nr_tensor> ins, outs;
    for (int i = 0; i < NumTensorInputs(); ++i) {
      ins.push_back(view(ctx->input(i), input_names_[i], input_dtypes_[i]));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      outs.push_back(view(*outputs[i], output_names_[i], output_dtypes_[i]));
    }
    nr_execute_options options{0, nullptr};
    const int64_t timeout_s = model_config_.size() > kTimeoutS ? model_config_[kTimeoutS] : -1;
    if (timeout_s > 0) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      options.deadline_ns = (now.tv_sec + timeout_s) * 1000000000LL + now.tv_nsec;
    }
    // A caller may give up on the call (TF Serving cancels a request's run at its
    // deadline): TensorFlow's cancellation callback sets this byte, which the runtime
    // reads before each instruction, stage and chunk. Deregistered before it goes.
    volatile uint8_t cancelled = 0;
    tensorflow::CancellationManager* cm = ctx->cancellation_manager();
    tensorflow::CancellationToken token = tensorflow::CancellationManager::kInvalidToken;
    if (cm) {
      token = cm->get_cancellation_token();
      if (!cm->RegisterCallback(token, [&cancelled] {
            __atomic_store_n(const_cast<uint8_t*>(&cancelled), 1, __ATOMIC_RELEASE);
          })) {
        return absl::CancelledError(Where() + "the call was cancelled before it started");
      }
      options.cancel = &cancelled;
    }
    char error[kErrorSize];
    const nr_status s = nr_execute_with(model_.load(std::memory_order_acquire), ins.data(),
                                        ins.size(), outs.data(), outs.size(), &options, error,
                                        sizeof error);
    if (cm) cm->DeregisterCallback(token);
    return FromRuntime(s, Where(), error);
  }

  std::vector<std::string> input_names_, output_names_;
  std::vector<PartialTensorShape> input_shapes_, output_shapes_;
  DataTypeVector input_dtypes_, output_dtypes_;
  std::vector<int64_t> input_batch_axis_, output_batch_axis_, model_config_;
  int64_t n_external_ = 0;      // trailing string inputs: paths of external attrs
  std::string dynamic_shapes_;  // JSON; refused for now (Compute)
  const std::string* executable_ = nullptr;  // in def(); see the constructor
  bool splittable_ = false;  // other batch sizes are split into compiled ones
  int64_t compiled_batch_ = -1;

  std::mutex load_mu_;                      // serializes the first load
  std::atomic<nr_model*> model_{nullptr};  // owned
};

REGISTER_KERNEL_BUILDER(Name("NeuronOp").Device(tensorflow::DEVICE_CPU), NeuronOpNativeKernel);

}  // namespace
}  // namespace neuronish
