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
// When the device refuses the executable (too few cores, out of device memory, a damaged
// file) or fails a call, the op computes its own subgraph (the graph_def attr) on
// TensorFlow instead, as the Python host does (neuronish/fallback.py), unless
// NEURONISH_FALLBACK=0: in a session of its own, made through TensorFlow's session
// factory (so nothing more is linked: the host's TensorFlow registered the factory).
//
// An op with free dimensions (`dynamic_shapes`) compiles an executable per new shape at run
// time, running the compiler as a subprocess (neuron_op_shapes.h).
//
// Not here (docs/c-api.md, "Limits"): the fallback's counters.
//
// Built by neuronish/native_op_library.py (`neuronish op-library`) against the installed
// TensorFlow.

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "neuronish_runtime.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/protobuf/config.pb.h"
#include "tensorflow/core/public/session.h"
#include "tensorflow/core/public/session_options.h"

#include "neuron_op_def.h"
#include "neuron_op_attrs.h"
#include "neuron_op_shapes.h"

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
// model_config's entries (docs/contracts.md, "NeuronOp").
constexpr size_t kMaxDuplicates = 2, kTimeoutS = 3;
// As kernel_bridge.DEFAULT_MAX_DUPLICATES: copies loaded when model_config does not
// bound them, or fewer when the device has fewer core groups.
constexpr int64_t kDefaultDuplicates = 4;
// Copies of each other shape's executable of an op with free dimensions (compiled at run
// time or stored ahead) when model_config does not bound them: each holds its own weights,
// so one, as kernel_bridge.load loads them (four each held up to 4x the device memory
// of the Python host's, for every shape kept).
constexpr int64_t kDefaultShapeDuplicates = 1;

bool ToDevice(DataType dt, nr_dtype* out);
// A call's tensor dtype on the device (the attrs were checked against HasDtype).
nr_dtype DeviceDtype(DataType dt) {
  nr_dtype d = NR_FLOAT32;
  ToDevice(dt, &d);
  return d;
}
bool HasDtype(DataType dt) {
  nr_dtype unused;
  return ToDevice(dt, &unused);
}
std::string DtypeName(DataType dt) { return tensorflow::DataTypeString(dt); }

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

int64_t NowNs() {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1000000000LL + now.tv_nsec;
}

// NEURONISH_FALLBACK as neuronish/fallback.py reads it: off for 0, false, off, no.
bool FallbackEnabled() {
  const char* env = std::getenv("NEURONISH_FALLBACK");
  std::string v = env ? env : "1";
  v.erase(0, v.find_first_not_of(" \t\n"));
  v.erase(v.find_last_not_of(" \t\n") + 1);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return !(v == "0" || v == "false" || v == "off" || v == "no");
}

// Load failures the device may have where TensorFlow would not: fall back on these.
bool DeviceRefused(nr_status s) {
  return s == NR_DEVICE_ERROR || s == NR_OUT_OF_DEVICE_MEMORY || s == NR_OUT_OF_MEMORY ||
         s == NR_INVALID_EXECUTABLE || s == NR_UNSUPPORTED || s == NR_IO_ERROR;
}

// Rows [start, start + n) of `src` on `axis` into rows [0, n) of `dst` (the same shape
// but on the axis), and rows n.. of `dst` up to its size repeating the last one copied
// (padding: no value the model has not seen). Byte copies: any dtype but string.
void CopyRows(const Tensor& src, int axis, int64_t start, int64_t n, Tensor* dst) {
  int64_t outer = 1, inner = DataTypeSize(src.dtype());
  for (int d = 0; d < axis; ++d) outer *= src.dim_size(d);
  for (int d = axis + 1; d < src.dims(); ++d) inner *= src.dim_size(d);
  const int64_t src_rows = src.dim_size(axis), dst_rows = dst->dim_size(axis);
  const char* from = src.tensor_data().data();
  char* to = const_cast<char*>(dst->tensor_data().data());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t r = 0; r < dst_rows; ++r) {
      const int64_t row = start + std::min(r, n - 1);
      std::memcpy(to + (o * dst_rows + r) * inner, from + (o * src_rows + row) * inner, inner);
    }
  }
}

// The op's subgraph on TensorFlow: its placeholders have the compiled shapes, so a call
// of another batch is cut into compiled-size chunks, the last padded, as on the device.
class Fallback {
 public:
  static absl::Status Make(const std::string& where, const std::string& graph_bytes,
                           std::unique_ptr<Fallback>* out) {
    tensorflow::GraphDef graph;
    if (!graph.ParseFromString(graph_bytes)) {
      return absl::InternalError(where + "its graph_def attr cannot be parsed, so it cannot "
                                 "run on TensorFlow either");
    }
    // Its own threads, one inter-op: a kernel blocking one of the host's inter-op
    // threads while it waits for this session cannot starve it.
    tensorflow::SessionOptions options;
    options.config.set_use_per_session_threads(true);
    options.config.set_inter_op_parallelism_threads(1);
    tensorflow::Session* session = nullptr;
    TF_RETURN_IF_ERROR(tensorflow::NewSession(options, &session));
    out->reset(new Fallback(session));
    absl::Status s = (*out)->session_->Create(std::move(graph));
    if (!s.ok()) {
      out->reset();
      return absl::InternalError(absl::StrCat(where, "its graph_def does not load on "
                                              "TensorFlow: ", s.message()));
    }
    return absl::OkStatus();
  }
  ~Fallback() { (void)session_->Close(); }

  // One run at the compiled shapes; the deadline (0: none) bounds it.
  absl::Status RunChunk(const std::string& where,
                        const std::vector<std::pair<std::string, Tensor>>& feeds,
                        const std::vector<std::string>& fetches, int64_t deadline_ns,
                        const volatile uint8_t* cancel, std::vector<Tensor>* out) {
    tensorflow::RunOptions options;
    if (cancel && *cancel) return absl::CancelledError(where + "the call was cancelled");
    if (deadline_ns) {
      const int64_t left_ms = (deadline_ns - NowNs()) / 1000000;
      if (left_ms <= 0) return absl::DeadlineExceededError(where + "the call's deadline passed");
      options.set_timeout_in_ms(left_ms);
    }
    absl::Status s = session_->Run(options, feeds, fetches, {}, out, nullptr);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat(where, "(on TensorFlow) ", s.message()));
  }

 private:
  explicit Fallback(tensorflow::Session* session) : session_(session) {}
  std::unique_ptr<tensorflow::Session> session_;
};

class NeuronOpNativeKernel : public OpKernel {
 public:
  explicit NeuronOpNativeKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, a_.Read(ctx, DtypeTable{HasDtype, DtypeName}));
    if (!a_.dynamic_shapes.empty()) {
      std::vector<int> ranks;
      for (const PartialTensorShape& s : a_.input_shapes) ranks.push_back(s.dims());
      OP_REQUIRES_OK(ctx, DynamicSpec::Parse(a_.dynamic_shapes, Where(), ranks, &spec_));
    }
  }

  ~NeuronOpNativeKernel() override {
    shapes_.reset();  // (its compile thread stops; its executables go)
    nr_model_unload(model_.load());
    for (nr_model* m : retired_) nr_model_unload(m);
  }

  void Compute(OpKernelContext* ctx) override {
    if (!a_.dynamic_shapes.empty()) {
      OP_REQUIRES_OK(ctx, ComputeDynamic(ctx));
      return;
    }
    int64_t batch = -1;
    OP_REQUIRES_OK(ctx, a_.CheckInputs(ctx, &batch));
    OP_REQUIRES_OK(ctx, EnsureLoaded(ctx));
    OutputTensors outputs;
    OP_REQUIRES_OK(ctx, a_.AllocateOutputs(ctx, batch, &outputs));
    OP_REQUIRES_OK(ctx, Run(ctx, outputs));
  }

 private:
  const std::string& Where() const { return a_.where; }

  static bool IsExternal(const std::string& value) {
    return value.compare(0, sizeof kExternalPrefix - 1, kExternalPrefix) == 0;
  }

  // The content of the file an external attr reference names (`what`: "executable",
  // stored as <sha256>.neff, or "graph_def", <sha256>.pb), among the paths fed to the op's
  // external_files inputs (the SavedModel's assets, wherever it was loaded from): its
  // size and SHA-256 must be the reference's, as the Python host checks them
  // (neuronish/external.py): a valid executable put in the asset's place is refused too.
  absl::Status ExternalFile(OpKernelContext* ctx, const std::string& value, const char* what,
                            std::string* content) const {
    std::string path;
    TF_RETURN_IF_ERROR(ExternalPath(ctx, value, what, &path));
    return ReadChecked(path, value, what, content);
  }

  // The content of `path`, which must hash to what the reference `value` names.
  absl::Status ReadChecked(const std::string& path, const std::string& value, const char* what,
                           std::string* content) const {
    if (!ReadFile(path, content)) {
      return absl::DataLossError(absl::StrCat(Where(), "cannot read its ", what, " ", path));
    }
    uint8_t digest[32];
    nr_sha256(content->data(), content->size(), digest);
    static const char kHex[] = "0123456789abcdef";
    std::string hex;
    for (uint8_t b : digest) hex += {kHex[b >> 4], kHex[b & 15]};
    const std::string want = value.substr(sizeof kExternalPrefix - 1, 64);
    if (hex != want) {
      return absl::DataLossError(absl::StrCat(
          Where(), path, " does not hash to the ", what, " the op was compiled with (sha256 "
          "mismatch: ", hex, ", the reference names ", want, "); the file is damaged or was "
          "replaced. Recompile the model or restore the file"));
    }
    return absl::OkStatus();
  }

  // The path of that file, its size checked (ExternalFile reads and hashes it).
  absl::Status ExternalPath(OpKernelContext* ctx, const std::string& value, const char* what,
                            std::string* path) const {
    const std::string ref = value.substr(sizeof kExternalPrefix - 1);
    const size_t colon = ref.find(':');
    const std::string digest = ref.substr(0, colon);
    const std::string size_text = colon == std::string::npos ? "" : ref.substr(colon + 1);
    char* end = nullptr;
    const unsigned long long size = std::strtoull(size_text.c_str(), &end, 10);
    if (digest.size() != 64 || size_text.empty() || *end != '\0') {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), "malformed external ", what, " reference '", value.substr(0, 120),
          "'; expected neuronish-external:v1:<sha256>:<size>"));
    }
    const std::string file = digest + (std::strcmp(what, "executable") == 0 ? ".neff" : ".pb");
    std::vector<std::string> fed;
    for (int k = 0; k < a_.n_external; ++k) {
      const Tensor& t = ctx->input(a_.NumTensorInputs() + k);
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
        return absl::NotFoundError(absl::StrCat(Where(), "its ", what, " ", p,
                                                " is missing or not a regular file"));
      }
      if (static_cast<unsigned long long>(st.st_size) != size) {
        return absl::DataLossError(absl::StrCat(Where(), "its ", what, " ", p, " has ",
                                                st.st_size, " bytes; the reference says ",
                                                size));
      }
      *path = p;
      return absl::OkStatus();
    }
    return absl::NotFoundError(absl::StrCat(
        Where(), "its ", what, " is the asset ", file, ", which none of the ", fed.size(),
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
        const nr_dtype want = DeviceDtype(dtypes[i]);
        if (names[i] != info.name || info.dtype != want) {
          return absl::InvalidArgumentError(absl::StrCat(
              Where(), kind, " ", i, " is '", names[i], "' (",
              tensorflow::DataTypeString(dtypes[i]), ") in the op's attrs but '", info.name,
              "' (", info.dtype_name, ") in its executable"));
        }
      }
      return absl::OkStatus();
    };
    TF_RETURN_IF_ERROR(check(NR_INPUT, "input", a_.input_names, a_.input_dtypes));
    return check(NR_OUTPUT, "output", a_.output_names, a_.output_dtypes);
  }

  // Loads the executable on the first call (external_files are inputs, so not before);
  // later calls only read model_.
  absl::Status EnsureLoaded(OpKernelContext* ctx) {
    if (ready_.load(std::memory_order_acquire)) return absl::OkStatus();
    std::lock_guard<std::mutex> lock(load_mu_);
    if (ready_.load(std::memory_order_acquire)) return absl::OkStatus();
    TF_RETURN_IF_ERROR(SharedDevice(Where(), &device_));
    std::string external;  // the executable's asset, read and checked
    const std::string* executable = a_.executable;
    if (IsExternal(*a_.executable)) {
      executable = &external;
      // A missing or damaged asset is the device's problem, not the subgraph's.
      const absl::Status found = ExternalFile(ctx, *a_.executable, "executable", &external);
      if (!found.ok()) {
        if (!FallbackEnabled()) return found;
        TF_RETURN_IF_ERROR(StartFallback(ctx, found));
        ready_.store(true, std::memory_order_release);
        return absl::OkStatus();
      }
    }
    char error[kErrorSize];
    nr_model* model = nullptr;
    const nr_status s = LoadOnDevice(*executable, &model, error);
    if (s != NR_OK) {
      const absl::Status refused =
          FromRuntime(s, Where() + "cannot load its executable: ", error);
      if (!DeviceRefused(s) || !FallbackEnabled()) return refused;
      TF_RETURN_IF_ERROR(StartFallback(ctx, refused));
      ready_.store(true, std::memory_order_release);
      return absl::OkStatus();
    }
    absl::Status ok = CheckSignature(nr_model_executable(model));
    if (!ok.ok()) {
      nr_model_unload(model);
      return ok;
    }
    if (!a_.dynamic_shapes.empty()) {
      // Its other shapes are compiled from its subgraph: the attr itself (not copied: it
      // may hold the weights), or its asset, read and checked now.
      const std::string* graph = a_.graph_def;
      if (IsExternal(*a_.graph_def)) {
        absl::Status read = ExternalFile(ctx, *a_.graph_def, "graph_def", &external_graph_);
        if (!read.ok()) {
          nr_model_unload(model);
          return read;
        }
        graph = &external_graph_;
      }
      auto load = [this](const std::string& bytes, const std::string& label, nr_model** out) {
        char why[kErrorSize];
        const nr_status loaded = LoadOnDevice(bytes, out, why, kDefaultShapeDuplicates);
        if (loaded != NR_OK) return FromRuntime(loaded, "", why);
        absl::Status same = CheckSignature(nr_model_executable(*out));
        if (!same.ok()) {
          nr_model_unload(*out);
          return same;
        }
        nr_model_set_label(*out, label.c_str());
        return absl::OkStatus();
      };
      // The executables compiled ahead: their files found now (the paths are inputs), read
      // when a call first needs one; a missing file fails that shape only.
      for (const StoredShape& stored : spec_.stored) {
        std::string path;
        absl::Status found = ExternalPath(ctx, stored.executable, "executable", &path);
        stored_files_.emplace_back(path, found);
      }
      auto read_stored = [this](size_t index, std::string* bytes) {
        const auto& [path, found] = stored_files_[index];
        absl::Status s = found.ok() ? ReadChecked(path, spec_.stored[index].executable,
                                                  "executable", bytes) : found;
        // (the table names the op: not twice)
        return s.ok() ? s : absl::Status(s.code(), absl::StripPrefix(s.message(), Where()));
      };
      shapes_ = std::make_unique<ShapeTable>(Where(), a_.node, spec_, model, graph, load,
                                             read_stored);
      ready_.store(true, std::memory_order_release);
      return absl::OkStatus();
    }
    nr_model_set_label(model, a_.node.c_str());  // (its name in profiles and neuronish ls)
    model_.store(model, std::memory_order_release);
    ready_.store(true, std::memory_order_release);
    return absl::OkStatus();
  }

  // Loads `executable` with as many copies as model_config asks (or the default), fewer,
  // down to one, if the device's core groups cannot hold them (too few groups, or too
  // little free memory), as the Python host loads (kernel_bridge.load_model).
  // (Called once EnsureLoaded has opened the device.)
  // `unbound`: the copies wanted when model_config does not say.
  nr_status LoadOnDevice(const std::string& executable, nr_model** model, char* error,
                         int64_t unbound = kDefaultDuplicates) const {
    return StepDown([&](uint32_t dups) {
      return nr_model_load_bytes(device_, executable.data(), executable.size(), dups, model,
                                 error, kErrorSize);
    }, unbound);
  }

  // `load(duplicates)` with as many as model_config asks (or `unbound`), then fewer, down
  // to one, while the device has too few core groups or too little memory for them.
  template <typename Load>
  nr_status StepDown(Load load, int64_t unbound = kDefaultDuplicates) const {
    const int64_t bound = a_.model_config.size() > kMaxDuplicates ? a_.model_config[kMaxDuplicates]
                                                                : -1;
    nr_status s = NR_DEVICE_ERROR;
    for (int64_t dups = bound >= 1 ? bound : unbound; dups >= 1; --dups) {
      s = load(static_cast<uint32_t>(dups));
      if (s != NR_DEVICE_ERROR && s != NR_OUT_OF_DEVICE_MEMORY) break;
    }
    return s;
  }

  absl::Status MakeFallback(OpKernelContext* ctx, std::unique_ptr<Fallback>* out) const {
    if (!IsExternal(*a_.graph_def)) return Fallback::Make(Where(), *a_.graph_def, out);
    std::string bytes;
    TF_RETURN_IF_ERROR(ExternalFile(ctx, *a_.graph_def, "graph_def", &bytes));
    return Fallback::Make(Where(), bytes, out);
  }

  // From now on every call of this op runs its subgraph on TensorFlow; said once, with
  // why. Called with load_mu_ held.
  absl::Status StartFallback(OpKernelContext* ctx, const absl::Status& why) {
    if (fallback_) return absl::OkStatus();
    std::unique_ptr<Fallback> fallback;
    absl::Status made = MakeFallback(ctx, &fallback);
    if (!made.ok()) {
      return absl::Status(why.code(), absl::StrCat(why.message(), "; and the fallback to "
                                                   "TensorFlow failed: ", made.message()));
    }
    LOG(WARNING) << why.message() << "; it runs on TensorFlow instead (NEURONISH_FALLBACK=0 "
                 << "turns this off)";
    fallback_ = std::move(fallback);
    fallback_ready_.store(true, std::memory_order_release);
    return absl::OkStatus();
  }

  // The call on the fallback's session: at the compiled batch as it is, else cut into
  // compiled-size chunks (the last padded), each written into the outputs' rows.
  absl::Status RunFallback(OpKernelContext* ctx, const OutputTensors& outputs,
                           int64_t deadline_ns, const volatile uint8_t* cancel) {
    const std::string where = Where();
    int64_t batch = -1;
    for (int i = 0; i < a_.NumTensorInputs() && a_.splittable; ++i) {
      if (a_.input_batch_axis[i] >= 0) batch = ctx->input(i).dim_size(a_.input_batch_axis[i]);
    }
    const int64_t size = batch < 0 ? -1 : a_.compiled_batch;
    std::vector<std::pair<std::string, Tensor>> feeds(a_.NumTensorInputs());
    std::vector<Tensor> results;
    for (int64_t start = 0; size < 0 || start < batch; start += size) {
      const int64_t n = size < 0 ? -1 : std::min(size, batch - start);
      for (int i = 0; i < a_.NumTensorInputs(); ++i) {
        const Tensor& x = ctx->input(i);
        feeds[i].first = a_.input_names[i];
        if (n < 0 || a_.input_batch_axis[i] < 0 || (n == batch && batch == size)) {
          feeds[i].second = x;
          continue;
        }
        TensorShape shape = x.shape();
        shape.set_dim(a_.input_batch_axis[i], size);
        Tensor chunk(x.dtype(), shape);
        CopyRows(x, static_cast<int>(a_.input_batch_axis[i]), start, n, &chunk);
        feeds[i].second = std::move(chunk);
      }
      TF_RETURN_IF_ERROR(fallback_->RunChunk(where, feeds, a_.output_names, deadline_ns, cancel,
                                             &results));
      for (size_t o = 0; o < outputs.size(); ++o) {
        Tensor* out = outputs[o];
        const int axis = static_cast<int>(a_.output_batch_axis[o]);
        if (results[o].dtype() != out->dtype()) {
          return absl::InternalError(absl::StrCat(where, "(on TensorFlow) output '",
                                                  a_.output_names[o], "' came as ",
                                                  DataTypeString(results[o].dtype())));
        }
        if (n < 0 || axis < 0) {
          if (results[o].shape() != out->shape()) {
            return absl::InternalError(absl::StrCat(
                where, "(on TensorFlow) output '", a_.output_names[o], "' has shape ",
                ShapeText(results[o].shape()), "; its attr says ", ShapeText(out->shape())));
          }
          std::memcpy(const_cast<char*>(out->tensor_data().data()),
                      results[o].tensor_data().data(), out->TotalBytes());
          continue;
        }
        // Rows [0, n) of the chunk's result into rows [start, start + n) of the output.
        TensorShape want = out->shape();
        want.set_dim(axis, size);
        if (results[o].shape() != want) {
          return absl::InternalError(absl::StrCat(
              where, "(on TensorFlow) output '", a_.output_names[o], "' has shape ",
              ShapeText(results[o].shape()), "; expected ", ShapeText(want)));
        }
        int64_t outer = 1, inner = DataTypeSize(out->dtype());
        for (int d = 0; d < axis; ++d) outer *= want.dim_size(d);
        for (int d = axis + 1; d < want.dims(); ++d) inner *= want.dim_size(d);
        const char* from = results[o].tensor_data().data();
        char* to = const_cast<char*>(out->tensor_data().data());
        for (int64_t k = 0; k < outer; ++k) {
          std::memcpy(to + (k * batch + start) * inner, from + k * size * inner, n * inner);
        }
      }
      if (size < 0) break;
    }
    return absl::OkStatus();
  }

  absl::Status Run(OpKernelContext* ctx, const OutputTensors& outputs) {
    const int n_in = a_.NumTensorInputs();
    const CallViews call(ctx, a_, outputs, DeviceDtype);
    const nr_tensor* views = call.views.data();
    nr_execute_options options{CallDeadlineNs(), nullptr};
    // A caller may give up on the call (TF Serving cancels a request's run at its
    // deadline): the guard's callback sets this byte, which the runtime reads before
    // each instruction, stage and chunk.
    volatile uint8_t cancelled = 0;
    CancelGuard guard(ctx, &cancelled);
    if (!guard.started()) {
      return absl::CancelledError(Where() + "the call was cancelled before it started");
    }
    options.cancel = guard.flag();
    return Execute(ctx, views, n_in, views + n_in, outputs, options);
  }

  // The deadline of a call starting now: model_config's timeout_s from now (0: none).
  int64_t CallDeadlineNs() const {
    const int64_t timeout_s = a_.model_config.size() > kTimeoutS ? a_.model_config[kTimeoutS] : -1;
    return timeout_s > 0 ? NowNs() + timeout_s * 1000000000LL : 0;
  }

  // On the device; or on TensorFlow, when the device refused the executable or fails
  // this call with an engine error (a later call tries the device again).
  absl::Status Execute(OpKernelContext* ctx, const nr_tensor* ins, size_t n_in,
                       const nr_tensor* outs, const OutputTensors& outputs,
                       const nr_execute_options& options) {
    nr_model* model = model_.load(std::memory_order_acquire);
    if (!model) return RunFallback(ctx, outputs, options.deadline_ns, options.cancel);
    char error[kErrorSize];
    nr_status s = nr_execute_with(model, ins, n_in, outs, outputs.size(), &options, error,
                                  sizeof error);
    // (Before any message is built: on success `error` was never written, and building
    // one cost every call a few string allocations.)
    if (s == NR_OK) return absl::OkStatus();
    if (s == NR_DEVICE_ERROR) {
      // Failed cores took every copy: the model is loaded again on the cores that still
      // work and the call made there (once), before the fallback has a say.
      if (nr_model* again = LoadAgain(model)) {
        model = again;
        s = nr_execute_with(model, ins, n_in, outs, outputs.size(), &options, error, sizeof error);
        if (s == NR_OK) return absl::OkStatus();
      }
    }
    const absl::Status failed = FromRuntime(s, Where(), error);
    if ((s != NR_EXECUTION_ERROR && s != NR_DEVICE_ERROR) || !FallbackEnabled()) return failed;
    {
      std::lock_guard<std::mutex> lock(load_mu_);
      if (!fallback_ready_.load(std::memory_order_acquire)) TF_RETURN_IF_ERROR(StartFallback(ctx, failed));
      // A device error is for good (the model has no copy left on a working core): later
      // calls go straight to TensorFlow. The model stays loaded until the kernel goes
      // (other calls may be inside it).
      if (s == NR_DEVICE_ERROR && model_.load(std::memory_order_relaxed) == model) {
        retired_.push_back(model);
        model_.store(nullptr, std::memory_order_release);
      }
    }
    return RunFallback(ctx, outputs, options.deadline_ns, options.cancel);
  }

  // Whether failed cores retired every copy of `model` (each copy has a failed core).
  bool EveryCopyLost(const nr_model* model) const {
    for (size_t c = 0; c < nr_model_duplicates(model); ++c) {
      nr_copy_info copy;
      if (nr_model_copy(model, c, &copy) != NR_OK) return false;
      bool failed = false;
      for (size_t k = 0; k < copy.num_cores && !failed; ++k) {
        nr_core_state state = NR_CORE_WORKING;
        failed = nr_device_core_state(device_, copy.cores[k], &state, nullptr, 0) == NR_OK &&
                 state == NR_CORE_FAILED;
      }
      if (!failed) return false;
    }
    return true;
  }

  // `lost`, the op's model, refused a call with a device error: if failed cores took every
  // copy, its executable is loaded again onto the cores that still work (as many copies as
  // model_config wants and fit; the device's loads avoid failed cores) and becomes the op's
  // model. The op's model now (another caller's reload, or this one), or null: none of the
  // working cores can take it, or the error was something else.
  nr_model* LoadAgain(nr_model* lost) {
    std::lock_guard<std::mutex> lock(load_mu_);
    nr_model* now = model_.load(std::memory_order_relaxed);
    if (now != lost || reload_failed_) return now == lost ? nullptr : now;
    nr_model* again = LoadedAgain(lost, "its model");
    if (!again) {
      reload_failed_ = true;  // (cores do not come back: not tried on every call)
      return nullptr;
    }
    nr_model_set_label(again, a_.node.c_str());  // (its name in profiles and neuronish ls)
    retired_.push_back(lost);  // (other callers may still be inside it: unloaded with the op)
    model_.store(again, std::memory_order_release);
    return again;
  }

  // `lost`'s executable (`what`, in messages) loaded anew, if failed cores took every copy
  // of it and the working cores can take it (as many copies as model_config wants and fit;
  // the device's loads avoid failed cores; `unbound` when it does not say); else null.
  // Warns either way (once if it fails). Called under load_mu_ (the static op) or the
  // shape table's reload lock (a shape's).
  nr_model* LoadedAgain(nr_model* lost, const char* what, int64_t unbound = kDefaultDuplicates) {
    if (!EveryCopyLost(lost)) return nullptr;
    char error[kErrorSize];
    nr_model* again = nullptr;
    const nr_status s = StepDown([&](uint32_t dups) {
      return nr_model_load(device_, nr_model_executable(lost), dups, &again, error, kErrorSize);
    }, unbound);
    if (s != NR_OK) {
      if (!warned_load_again_.exchange(true)) {  // (once per op, whichever shape)
        LOG(WARNING) << Where() << "failed cores took every copy of " << what
                     << ", and loading it again failed: " << error << "; its calls run on "
                     << "TensorFlow (with NEURONISH_FALLBACK=0 they fail)";
      }
      return nullptr;
    }
    std::string groups;
    for (size_t c = 0; c < nr_model_duplicates(again); ++c) {
      nr_copy_info copy;
      if (nr_model_copy(again, c, &copy) != NR_OK) continue;
      absl::StrAppend(&groups, c ? ", " : "", "[");
      for (size_t k = 0; k < copy.num_cores; ++k) absl::StrAppend(&groups, k ? ", " : "", copy.cores[k]);
      groups += "]";
    }
    LOG(WARNING) << Where() << "failed cores took every copy of " << what
                 << "; loaded it again on core group(s) " << groups;
    return again;
  }

  // A call of an op with free dimensions: on the executable for its shape (compiled at
  // run time when new: neuron_op_shapes.h), or on TensorFlow, with the runtime fallback
  // on, while that compiles, for a shape outside the bounds or one that failed to compile,
  // and when the device refused the op.
  absl::Status ComputeDynamic(OpKernelContext* ctx) {
    int64_t batch = -1;
    TF_RETURN_IF_ERROR(a_.CheckInputs(ctx, &batch));  // (ranks and fixed sizes)
    TF_RETURN_IF_ERROR(EnsureLoaded(ctx));
    nr_execute_options options{CallDeadlineNs(), nullptr};
    volatile uint8_t cancelled = 0;
    CancelGuard guard(ctx, &cancelled);  // (a call may wait here for its shape to compile)
    if (!guard.started()) {
      return absl::CancelledError(Where() + "the call was cancelled before it started");
    }
    options.cancel = guard.flag();
    ShapeTable* table = shapes_.get();
    if (!table) return RunOnTensorFlow(ctx, "", options);  // (refused at load: said then)
    const bool fallback = FallbackEnabled();
    Shapes shapes(a_.NumTensorInputs());
    for (int i = 0; i < a_.NumTensorInputs(); ++i) {
      for (int d = 0; d < ctx->input(i).dims(); ++d) shapes[i].push_back(ctx->input(i).dim_size(d));
    }
    const std::string outside = table->OutOfBounds(shapes);
    if (!outside.empty()) {
      if (!fallback) return absl::InvalidArgumentError(outside);
      return RunOnTensorFlow(ctx, outside, options);
    }
    ShapeTable::Entry* entry = nullptr;
    const absl::Status taken =
        table->Take(shapes, /*wait=*/!fallback, options.cancel, options.deadline_ns, &entry);
    if (!taken.ok()) {
      if (!fallback || absl::IsCancelled(taken) || absl::IsDeadlineExceeded(taken)) return taken;
      return RunOnTensorFlow(ctx, std::string(taken.message()), options);
    }
    if (!entry) {
      return RunOnTensorFlow(ctx, absl::StrCat("the call's shape ", table->LabelFor(shapes),
                                               " is new; it runs on TensorFlow until its "
                                               "executable is compiled"), options);
    }
    struct Release {
      ShapeTable* table;
      ShapeTable::Entry* entry;
      ~Release() { table->Done(entry); }
    } release{table, entry};
    OutputTensors outputs(entry->outputs.size());
    for (size_t o = 0; o < outputs.size(); ++o) {
      const nr_tensor_info& info = entry->outputs[o];
      std::vector<int64_t> dims(info.shape, info.shape + info.rank);
      if (batch >= 0 && info.batch_axis >= 0) dims[info.batch_axis] = batch;
      TensorShape shape;
      TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape(dims, &shape));
      TF_RETURN_IF_ERROR(ctx->allocate_output(static_cast<int>(o), shape, &outputs[o]));
    }
    const CallViews call(ctx, a_, outputs, DeviceDtype);
    const int n_in = a_.NumTensorInputs();
    char error[kErrorSize];
    nr_model* model = entry->model.load();
    nr_status s = nr_execute_with(model, call.views.data(), n_in, call.views.data() + n_in,
                                  outputs.size(), &options, error, sizeof error);
    if (s == NR_OK) return absl::OkStatus();
    if (s == NR_DEVICE_ERROR) {  // (as in Execute: failed cores took every copy)
      nr_model* again = table->LoadAgain(entry, model, [this](nr_model* lost) {
        return LoadedAgain(lost, "the executable of the call's shape", kDefaultShapeDuplicates);
      });
      if (again) {
        s = nr_execute_with(again, call.views.data(), n_in, call.views.data() + n_in,
                            outputs.size(), &options, error, sizeof error);
        if (s == NR_OK) return absl::OkStatus();
      }
    }
    const absl::Status failed = FromRuntime(s, Where(), error);
    if ((s != NR_EXECUTION_ERROR && s != NR_DEVICE_ERROR) || !fallback) return failed;
    return RunOnTensorFlow(ctx, std::string(failed.message()), options);
  }

  // The whole call on the op's subgraph in TensorFlow (its placeholders take any shape),
  // its outputs TensorFlow's. `why` (empty: said already) is warned once per op.
  absl::Status RunOnTensorFlow(OpKernelContext* ctx, const std::string& why,
                               const nr_execute_options& options) {
    Fallback* session = nullptr;
    {
      std::lock_guard<std::mutex> lock(load_mu_);
      if (!fallback_) {
        std::unique_ptr<Fallback> made;
        absl::Status ok = MakeFallback(ctx, &made);
        if (!ok.ok()) {
          return absl::Status(ok.code(), absl::StrCat(why, why.empty() ? "" : "; and ",
                                                      "the fallback to TensorFlow failed: ",
                                                      ok.message()));
        }
        fallback_ = std::move(made);
      }
      if (!why.empty() && !warned_tensorflow_) {
        const bool named = why.compare(0, Where().size(), Where()) == 0;  // (said once)
        LOG(WARNING) << Where() << "calls it cannot run on the device run on TensorFlow "
                     << "(NEURONISH_FALLBACK=0 turns this off); the first: "
                     << (named ? why.substr(Where().size()) : why);
        warned_tensorflow_ = true;
      }
      session = fallback_.get();
    }
    std::vector<std::pair<std::string, Tensor>> feeds;
    for (int i = 0; i < a_.NumTensorInputs(); ++i) feeds.emplace_back(a_.input_names[i], ctx->input(i));
    std::vector<Tensor> results;
    TF_RETURN_IF_ERROR(session->RunChunk(Where(), feeds, a_.output_names, options.deadline_ns,
                                         options.cancel, &results));
    for (size_t o = 0; o < results.size(); ++o) {
      if (results[o].dtype() != a_.output_dtypes[o]) {
        return absl::InternalError(absl::StrCat(Where(), "(on TensorFlow) output '",
                                                a_.output_names[o], "' came as ",
                                                DataTypeString(results[o].dtype())));
      }
      ctx->set_output(static_cast<int>(o), results[o]);
    }
    return absl::OkStatus();
  }

  NeuronOpAttrs a_;

  std::mutex load_mu_;                      // serializes the first load and the fallback's
  nr_device* device_ = nullptr;             // the process's device, set by the first load
  std::atomic<bool> ready_{false};          // loaded, on the device or the fallback
  std::atomic<nr_model*> model_{nullptr};  // owned; null: the fallback runs every call
  std::vector<nr_model*> retired_;  // owned: models the device lost (under load_mu_)
  std::unique_ptr<Fallback> fallback_;      // set once, under load_mu_
  std::atomic<bool> fallback_ready_{false};
  bool warned_tensorflow_ = false;          // (under load_mu_)
  bool reload_failed_ = false;               // (under load_mu_)
  std::atomic<bool> warned_load_again_{false};
  // With free dimensions: the attr read, and the executables by shape (set once loaded).
  DynamicSpec spec_;
  // Per spec_.stored: its file's path, or why it was not found.
  std::vector<std::pair<std::string, absl::Status>> stored_files_;
  std::string external_graph_;  // the subgraph, when it is an asset (read once loaded)
  std::unique_ptr<ShapeTable> shapes_;  // (destroyed first: it reads the subgraph)
};

REGISTER_KERNEL_BUILDER(Name("NeuronOp").Device(tensorflow::DEVICE_CPU), NeuronOpNativeKernel);

}  // namespace
}  // namespace neuronish
