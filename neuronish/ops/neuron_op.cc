// NeuronOp: one fused subgraph compiled for the neuronish device.
//
// The op's attributes are the contract in docs/contracts.md ("NeuronOp").
// The kernel runs on the CPU device and hands each call to the Python runtime
// (neuronish.runtime) in-process, the way TensorFlow's own py_func kernel calls
// Python: take the GIL, call neuronish/kernel_bridge.py, turn a Python
// exception into a Status. Inputs and outputs cross as buffer objects over the
// tensors' own memory, so numpy wraps them without a copy.
//
// Built by neuronish/op_library.py against the installed TensorFlow and the
// running Python's headers. Not linked against libpython: the library is only
// ever loaded into a Python process, which already exports the C API.

#define PY_SSIZE_T_CLEAN
#include <Python.h>  // first, as the C API asks

#include <time.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/logging.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
// The C runtime's types only: the kernel calls it through the pointer kernel_bridge
// hands it (native_entry), so this library does not link it.
#include "neuronish_runtime.h"

// The op (attrs, shape function): shared with the Python-free kernel.
#include "neuron_op_def.h"
// The attrs record and checks, and the cancellation guard: shared with it too.
#include "neuron_op_attrs.h"

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
namespace shape_inference = tensorflow::shape_inference;

// ---------------------------------------------------------------------------
// Python plumbing. Everything below that touches a PyObject holds the GIL.

struct PyDecref {
  void operator()(PyObject* p) const { Py_XDECREF(p); }
};
using PyRef = std::unique_ptr<PyObject, PyDecref>;

// Takes the GIL on any thread. TensorFlow's threads were not started by Python,
// so PyGILState_Ensure would create a Python thread state, and Release destroy
// it, on every call (with a fresh frame stack each time): that measured ~16 us
// of overhead per call against ~5 us with the state kept. So the first time a
// foreign thread gets here, one thread state is made and kept (gilstate counter
// left at 1, GIL released) for the thread's life: one per TensorFlow worker
// thread, reclaimed by Py_Finalize.
class Gil {
 public:
  Gil() {
    thread_local bool kept = false;
    if (!kept && PyGILState_GetThisThreadState() == nullptr) {
      PyGILState_Ensure();
      PyEval_SaveThread();
    }
    kept = true;
    state_ = PyGILState_Ensure();
  }
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

bool PythonUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Locks `mu` with the GIL released if this thread holds it: the lock order is
// always mutex, then GIL, or a thread holding the GIL and waiting for the mutex
// would deadlock with one holding the mutex and waiting for the GIL.
std::unique_lock<std::mutex> LockWithoutGil(std::mutex& mu) {
  if (!Py_IsInitialized() || !PyGILState_Check()) return std::unique_lock<std::mutex>(mu);
  PyThreadState* saved = PyEval_SaveThread();
  std::unique_lock<std::mutex> lock(mu);
  PyEval_RestoreThread(saved);
  return lock;
}

// numpy's name and PEP 3118 format for each dtype the device has.
struct DtypeInfo {
  const char* numpy_name;
  const char* format;
};

DtypeInfo Describe(DataType dt) {
  switch (dt) {
    case tensorflow::DT_FLOAT: return {"float32", "f"};
    case tensorflow::DT_DOUBLE: return {"float64", "d"};
    case tensorflow::DT_HALF: return {"float16", "e"};
    case tensorflow::DT_INT8: return {"int8", "b"};
    case tensorflow::DT_INT16: return {"int16", "h"};
    case tensorflow::DT_INT32: return {"int32", "i"};
    case tensorflow::DT_INT64: return {"int64", "q"};
    case tensorflow::DT_UINT8: return {"uint8", "B"};
    case tensorflow::DT_BOOL: return {"bool", "?"};
    default: return {nullptr, nullptr};  // refused when the kernel is built
  }
}

// A read-only or writable buffer over a tensor's memory, typed and shaped, that
// keeps the tensor's buffer alive (it holds its own Tensor, which shares the
// refcounted TensorBuffer) for as long as Python holds it or anything made from
// it. So numpy's zero-copy view can never point at freed memory, even if Python
// kept it (a traceback, a cache) after the call returned.
struct TensorView {
  PyObject_HEAD
  Tensor* tensor;
  char* data;
  Py_ssize_t len;
  Py_ssize_t itemsize;
  const char* format;
  int ndim;
  bool readonly;
  Py_ssize_t* dims;  // ndim sizes, then ndim strides (bytes)
};

char kEmpty[1];  // numpy wants a non-null pointer even for zero bytes

int TensorViewGetBuffer(PyObject* obj, Py_buffer* view, int flags) {
  auto* self = reinterpret_cast<TensorView*>(obj);
  if ((flags & PyBUF_WRITABLE) && self->readonly) {
    PyErr_SetString(PyExc_BufferError, "NeuronOp input tensors are read-only");
    view->obj = nullptr;
    return -1;
  }
  view->obj = Py_NewRef(obj);
  view->buf = self->data;
  view->len = self->len;
  view->readonly = self->readonly;
  view->itemsize = self->itemsize;
  view->format = (flags & PyBUF_FORMAT) ? const_cast<char*>(self->format) : nullptr;
  const bool nd = (flags & PyBUF_ND) == PyBUF_ND;
  view->ndim = nd ? self->ndim : 1;
  view->shape = nd ? self->dims : nullptr;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? self->dims + self->ndim : nullptr;
  view->suboffsets = nullptr;
  view->internal = nullptr;
  return 0;
}

void TensorViewDealloc(PyObject* obj) {
  auto* self = reinterpret_cast<TensorView*>(obj);
  delete self->tensor;
  delete[] self->dims;
  PyTypeObject* type = Py_TYPE(obj);
  PyObject_Free(obj);
  Py_DECREF(type);  // heap types are owned by their instances
}

PyType_Slot kTensorViewSlots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(TensorViewDealloc)},
    {Py_bf_getbuffer, reinterpret_cast<void*>(TensorViewGetBuffer)},
    {Py_tp_doc, const_cast<char*>("A TensorFlow tensor's memory, for np.asarray.")},
    {0, nullptr},
};
PyType_Spec kTensorViewSpec = {"neuronish.TensorView", sizeof(TensorView), 0,
                               Py_TPFLAGS_DEFAULT, kTensorViewSlots};

// neuronish.kernel_bridge, imported once per process and kept for its life. Its
// functions are looked up on every call (a dict lookup) rather than cached, so a
// test or a profiler can wrap them.
struct Bridge {
  PyObject* module;
  PyObject* load;  // interned attribute names
  PyObject* run;
  PyObject* output_shapes;
  PyObject* unload;
  PyObject* error_status;
  PyTypeObject* tensor_view;

  // Calls kernel_bridge.<name>(*args); nullptr with a Python error set on failure.
  template <typename... Args>
  PyObject* Call(PyObject* name, Args... args) const {
    PyRef fn(PyObject_GetAttr(module, name));
    return fn ? PyObject_CallFunctionObjArgs(fn.get(), args..., nullptr) : nullptr;
  }
};

// Returns nullptr with a Python error set on failure.
const Bridge* GetBridge() {
  static Bridge* bridge = nullptr;  // guarded by the GIL
  if (bridge) return bridge;
  PyObject* module = PyImport_ImportModule("neuronish.kernel_bridge");
  if (!module) return nullptr;
  auto* type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&kTensorViewSpec));
  if (!type) return nullptr;
  // Importing may release the GIL and let another thread finish first; then
  // this thread's references are simply dropped.
  if (!bridge) {
    bridge = new Bridge{module,
                        PyUnicode_InternFromString("load"),
                        PyUnicode_InternFromString("run"),
                        PyUnicode_InternFromString("output_shapes"),
                        PyUnicode_InternFromString("unload"),
                        PyUnicode_InternFromString("error_status"),
                        type};
  } else {
    Py_DECREF(module);
    Py_DECREF(type);
  }
  return bridge;
}

PyObject* NewTensorView(const Bridge& b, const Tensor& t, bool writable) {
  auto* v = PyObject_New(TensorView, b.tensor_view);
  if (!v) return nullptr;
  const int ndim = t.dims();
  v->tensor = new Tensor(t);
  auto bytes = t.tensor_data();
  v->len = static_cast<Py_ssize_t>(bytes.size());
  v->data = v->len ? const_cast<char*>(bytes.data()) : kEmpty;
  v->itemsize = static_cast<Py_ssize_t>(tensorflow::DataTypeSize(t.dtype()));
  v->format = Describe(t.dtype()).format;
  v->ndim = ndim;
  v->readonly = !writable;
  v->dims = new Py_ssize_t[2 * ndim + 1];
  Py_ssize_t stride = v->itemsize;
  for (int d = ndim - 1; d >= 0; --d) {
    v->dims[d] = static_cast<Py_ssize_t>(t.dim_size(d));
    v->dims[ndim + d] = stride;
    stride *= v->dims[d];
  }
  return reinterpret_cast<PyObject*>(v);
}

std::string DtypeName(DataType dt) {
  const char* name = Describe(dt).numpy_name;
  return name ? name : tensorflow::DataTypeString(dt);
}

bool HasDtype(DataType dt) { return Describe(dt).format != nullptr; }

// The C runtime's dtype of a dtype HasDtype takes.
nr_dtype ToDevice(DataType dt) {
  switch (dt) {
    case tensorflow::DT_DOUBLE: return NR_FLOAT64;
    case tensorflow::DT_HALF: return NR_FLOAT16;
    case tensorflow::DT_INT8: return NR_INT8;
    case tensorflow::DT_INT16: return NR_INT16;
    case tensorflow::DT_INT32: return NR_INT32;
    case tensorflow::DT_INT64: return NR_INT64;
    case tensorflow::DT_UINT8: return NR_UINT8;
    case tensorflow::DT_BOOL: return NR_BOOL;
    default: return NR_FLOAT32;
  }
}

int64_t NowNs() {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1000000000LL + now.tv_nsec;
}

PyObject* StringList(const std::vector<std::string>& items) {
  PyObject* list = PyList_New(items.size());
  for (size_t i = 0; list && i < items.size(); ++i) {
    PyList_SET_ITEM(list, i, PyUnicode_FromStringAndSize(items[i].data(), items[i].size()));
  }
  return list;  // a failed item leaves a NULL slot; Python raises MemoryError first
}

PyObject* IntList(const std::vector<int64_t>& items) {
  PyObject* list = PyList_New(items.size());
  for (size_t i = 0; list && i < items.size(); ++i) {
    PyList_SET_ITEM(list, i, PyLong_FromLongLong(items[i]));
  }
  return list;
}

PyObject* ShapeList(const std::vector<PartialTensorShape>& shapes) {
  PyObject* list = PyList_New(shapes.size());
  for (size_t i = 0; list && i < shapes.size(); ++i) {
    const auto sizes = shapes[i].dim_sizes();  // by value: one copy, not two
    PyList_SET_ITEM(list, i, IntList(std::vector<int64_t>(sizes.begin(), sizes.end())));
  }
  return list;
}

PyObject* DtypeList(const DataTypeVector& dtypes) {
  std::vector<std::string> names;
  for (DataType dt : dtypes) names.push_back(DtypeName(dt));
  return StringList(names);
}

std::string PyText(PyObject* obj) {
  PyRef s(obj ? PyObject_Str(obj) : nullptr);
  const char* text = s ? PyUnicode_AsUTF8(s.get()) : nullptr;
  if (!text) {
    PyErr_Clear();
    return "<unprintable>";
  }
  return text;
}

// The pending Python exception as a Status; kernel_bridge.error_status picks the
// code (InvalidInput -> INVALID_ARGUMENT, ...) so the mapping lives in one place.
absl::Status StatusFromPython(const std::string& node) {
  PyObject *type, *value, *trace;
  PyErr_Fetch(&type, &value, &trace);
  PyErr_NormalizeException(&type, &value, &trace);
  PyRef type_ref(type), value_ref(value), trace_ref(trace);
  const std::string prefix = "NeuronOp '" + node + "': ";
  const Bridge* b = GetBridge();
  PyRef result(b && value ? b->Call(b->error_status, value) : nullptr);
  long code = 0;
  const char* message = nullptr;
  if (result && PyArg_ParseTuple(result.get(), "ls", &code, &message) && code > 0 && code < 17) {
    return absl::Status(static_cast<absl::StatusCode>(code), prefix + message);
  }
  PyErr_Clear();
  return absl::InternalError(absl::StrCat(
      prefix, "Python error ", PyText(type), ": ", PyText(value),
      " (and neuronish.kernel_bridge.error_status could not describe it)"));
}

// ---------------------------------------------------------------------------
// The kernel.
//
// Synchronous on purpose. An AsyncOpKernel variant (checks and output
// allocation inline, the Python call on a 16-thread pool, then done()) was
// measured against this one on a 2-CPU machine (OPENBLAS_NUM_THREADS=1, 3 runs):
//   overhead per call, chain of 50 NeuronOps:    sync 4-7 us, async 9-12 us
//   8 client threads, tiny dense model, calls/s: sync 4100-4700, async 2800-3550
//   8 client threads, 1024x1024 dense, b32/b128: the same within the noise
// The device is CPU work under one GIL and TensorFlow sizes its inter-op pool to
// the CPUs, so a blocked inter-op thread leaves no CPU idle, while the async hop
// adds a thread switch and more threads contending for the GIL. Revisit for an
// out-of-process device, where the kernel would be waiting on I/O instead.

class NeuronOpKernel : public OpKernel {
 public:
  explicit NeuronOpKernel(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, a_.Read(ctx, DtypeTable{HasDtype, DtypeName}));
  }

  ~NeuronOpKernel() override {
    PyObject* handle = handle_.exchange(nullptr);
    // At interpreter shutdown the process, and the in-process device with it, is
    // going away, and taking the GIL then can hang: leave the handle be.
    if (!handle || !PythonUsable()) return;
    Gil gil;
    const Bridge* b = GetBridge();
    PyRef r(b ? b->Call(b->unload, handle) : nullptr);
    if (!r) LOG(WARNING) << StatusFromPython(name()).message() << " (while unloading)";
    Py_DECREF(handle);
  }

  void Compute(OpKernelContext* ctx) override {
    OutputTensors outputs;
    if (!a_.dynamic_shapes.empty()) {
      OP_REQUIRES_OK(ctx, PrepareDynamic(ctx, &outputs));
      OP_REQUIRES_OK(ctx, Run(ctx, outputs));
      return;
    }
    OP_REQUIRES_OK(ctx, Prepare(ctx, &outputs));
    if (!handle_.load(std::memory_order_acquire)) {
      OP_REQUIRES_OK(ctx, RequirePython());
      OP_REQUIRES_OK(ctx, EnsureLoaded(ctx));
    }
    if (nr_model* model = native_.load(std::memory_order_acquire)) {
      absl::Status result;
      if (RunNative(ctx, model, outputs, &result)) {
        OP_REQUIRES_OK(ctx, result);
        return;
      }
      // The C runtime failed the call (not a bad input, deadline or cancel): the Python
      // runtime's rules decide what happens (retry, run it on TensorFlow, fall back).
    }
    OP_REQUIRES_OK(ctx, Run(ctx, outputs));
  }

 private:
  const std::string& Where() const { return a_.where; }

  // Checks the inputs and allocates the outputs: the compiled shapes with the
  // call's batch, which is exactly what the runtime returns.
  absl::Status Prepare(OpKernelContext* ctx, OutputTensors* outputs) const {
    int64_t batch = -1;
    TF_RETURN_IF_ERROR(a_.CheckInputs(ctx, &batch));
    return a_.AllocateOutputs(ctx, batch, outputs);
  }

  // A NeuronOp with free dimensions (dynamic_shapes): ranks and fixed sizes checked
  // here, the rest (bounds, which executable, the outputs' shapes) by the bridge's
  // output_shapes(handle, inputs), which may compile one for a new shape (or compute
  // the call on TensorFlow, when it falls back).
  absl::Status PrepareDynamic(OpKernelContext* ctx, OutputTensors* outputs) {
    int64_t batch = -1;
    TF_RETURN_IF_ERROR(a_.CheckInputs(ctx, &batch));
    if (!PythonUsable()) {
      return absl::FailedPreconditionError(
          Where() + "the neuronish device runs in Python and this process has no running "
          "Python interpreter; serve the model from Python, after `import neuronish`");
    }
    TF_RETURN_IF_ERROR(EnsureLoaded(ctx));
    std::vector<std::vector<int64_t>> shapes;
    {
      Gil gil;
      const Bridge* b = GetBridge();
      if (!b) return StatusFromPython(name());
      PyRef given(PyList_New(a_.NumTensorInputs()));
      if (!given) return StatusFromPython(name());
      for (int i = 0; i < a_.NumTensorInputs(); ++i) {
        PyObject* view = NewTensorView(*b, ctx->input(i), /*writable=*/false);
        if (!view) return StatusFromPython(name());
        PyList_SET_ITEM(given.get(), i, view);
      }
      // The bridge may wait here for the call's shape to compile: the caller's
      // cancellation reaches it as it reaches run (see Run).
      PyRef cancel(PyByteArray_FromStringAndSize(nullptr, 1));
      if (!cancel) return StatusFromPython(name());
      CancelGuard guard(ctx, reinterpret_cast<uint8_t*>(PyByteArray_AS_STRING(cancel.get())));
      if (!guard.started()) {
        return absl::CancelledError(Where() + "the call was cancelled before it started");
      }
      PyObject* handle = handle_.load(std::memory_order_acquire);
      PyRef r(b->Call(b->output_shapes, handle, given.get(),
                      guard.flag() ? cancel.get() : Py_None));
      if (!r) return StatusFromPython(name());
      PyRef seq(PySequence_Fast(r.get(), "output_shapes must return a list"));
      if (!seq || PySequence_Fast_GET_SIZE(seq.get()) !=
                      static_cast<Py_ssize_t>(a_.output_shapes.size())) {
        PyErr_Clear();
        return absl::InternalError(Where() + "the bridge returned the wrong number of shapes");
      }
      for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq.get()); ++i) {
        PyRef dims(PySequence_Fast(PySequence_Fast_GET_ITEM(seq.get(), i), "a shape"));
        if (!dims) return StatusFromPython(name());
        std::vector<int64_t> shape;
        for (Py_ssize_t d = 0; d < PySequence_Fast_GET_SIZE(dims.get()); ++d) {
          shape.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims.get(), d)));
        }
        if (PyErr_Occurred()) return StatusFromPython(name());
        shapes.push_back(std::move(shape));
      }
    }
    outputs->resize(a_.output_shapes.size());
    for (size_t i = 0; i < outputs->size(); ++i) {
      TensorShape shape;
      TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape(shapes[i], &shape));
      PartialTensorShape want = a_.output_shapes[i];
      if (a_.output_batch_axis[i] >= 0) want.set_dim(a_.output_batch_axis[i], -1);
      if (!want.IsCompatibleWith(shape)) {
        return absl::InternalError(absl::StrCat(Where(), "output '", a_.output_names[i],
                                                "' would have shape ", ShapeText(shape),
                                                ", which its attr ",
                                                a_.output_shapes[i].DebugString(), " refuses"));
      }
      TF_RETURN_IF_ERROR(ctx->allocate_output(i, shape, &(*outputs)[i]));
    }
    return absl::OkStatus();
  }

  // The paths fed to external_files (scalar strings), as a Python list.
  absl::Status ExternalFiles(OpKernelContext* ctx, PyObject** list) const {
    std::vector<std::string> paths;
    for (int k = 0; k < a_.n_external; ++k) {
      const Tensor& t = ctx->input(a_.NumTensorInputs() + k);
      if (t.dims() != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), "external_files[", k, "] must be a scalar path, got shape ",
            ShapeText(t.shape())));
      }
      paths.emplace_back(t.scalar<tensorflow::tstring>()());
    }
    *list = StringList(paths);
    return absl::OkStatus();
  }

  // Loads the executable on the first call; later calls only read handle_.
  absl::Status EnsureLoaded(OpKernelContext* ctx) {
    if (handle_.load(std::memory_order_acquire)) return absl::OkStatus();
    auto lock = LockWithoutGil(load_mu_);
    if (handle_.load(std::memory_order_acquire)) return absl::OkStatus();
    Gil gil;
    const Bridge* b = GetBridge();
    if (!b) return StatusFromPython(name());
    // A view of the attr, not a copy; the bridge does not keep it past load().
    PyObject* exe = PyMemoryView_FromMemory(const_cast<char*>(a_.executable->data()),
                                            a_.executable->size(), PyBUF_READ);
    PyObject* graph = PyMemoryView_FromMemory(const_cast<char*>(a_.graph_def->data()),
                                              a_.graph_def->size(), PyBUF_READ);
    PyObject* files = nullptr;
    absl::Status files_ok = ExternalFiles(ctx, &files);
    if (!files_ok.ok()) {
      Py_XDECREF(exe);
      Py_XDECREF(graph);
      return files_ok;
    }
    PyRef args(Py_BuildValue(
        "(s#NNNNNNNNNNNNs#)", name().data(), static_cast<Py_ssize_t>(name().size()), exe,
        StringList(a_.input_names), DtypeList(a_.input_dtypes), ShapeList(a_.input_shapes),
        IntList(a_.input_batch_axis), StringList(a_.output_names), DtypeList(a_.output_dtypes),
        ShapeList(a_.output_shapes), IntList(a_.output_batch_axis), IntList(a_.model_config), graph,
        files, a_.dynamic_shapes.data(), static_cast<Py_ssize_t>(a_.dynamic_shapes.size())));
    PyRef load(args ? PyObject_GetAttr(b->module, b->load) : nullptr);
    PyRef handle(load ? PyObject_Call(load.get(), args.get(), nullptr) : nullptr);
    if (!handle) return StatusFromPython(name());
    TF_RETURN_IF_ERROR(ReadNativeEntry(handle.get()));
    handle_.store(handle.release(), std::memory_order_release);
    return absl::OkStatus();
  }

  // Whether calls go to the C runtime directly: the handle's native_entry is
  // (nr_model*, nr_execute_with) when its model is there, None when the Python runtime or
  // TensorFlow (the fallback) runs it. Holds the GIL.
  absl::Status ReadNativeEntry(PyObject* handle) {
    PyRef entry(PyObject_GetAttrString(handle, "native_entry"));
    if (!entry) return StatusFromPython(name());
    if (entry.get() == Py_None) {
      native_.store(nullptr, std::memory_order_release);
      return absl::OkStatus();
    }
    unsigned long long model = 0, execute = 0;
    if (!PyArg_ParseTuple(entry.get(), "KK", &model, &execute) || !model || !execute) {
      PyErr_Clear();
      return absl::InternalError(Where() + "the bridge's native_entry is not "
                                 "(nr_model*, nr_execute_with)");
    }
    execute_.store(reinterpret_cast<ExecuteFn>(execute), std::memory_order_relaxed);
    native_.store(reinterpret_cast<nr_model*>(model), std::memory_order_release);
    return absl::OkStatus();
  }

  absl::Status RequirePython() const {
    if (PythonUsable()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        Where() + "the neuronish device runs in Python and this process has no running "
        "Python interpreter; serve the model from Python, after `import neuronish`");
  }

  // One call on the C runtime, on TensorFlow's buffers, without the GIL. True when the
  // call is settled (`result` is what it came to); false when the runtime failed it in
  // a way the Python runtime decides about (an engine error, a failed device).
  bool RunNative(OpKernelContext* ctx, nr_model* model, const OutputTensors& outputs,
                 absl::Status* result) const {
    const int n_in = a_.NumTensorInputs();
    const size_t n_out = outputs.size();
    const CallViews call(ctx, a_, outputs, [](DataType dt) { return ToDevice(dt); });
    const nr_tensor* views = call.views.data();
    nr_execute_options options{0, nullptr};
    const int64_t timeout_s = a_.model_config.size() > 3 ? a_.model_config[3] : -1;
    if (timeout_s > 0) options.deadline_ns = NowNs() + timeout_s * 1000000000LL;
    volatile uint8_t cancelled = 0;
    CancelGuard guard(ctx, &cancelled);
    if (!guard.started()) {
      *result = absl::CancelledError(Where() + "the call was cancelled before it started");
      return true;
    }
    options.cancel = guard.flag();
    char error[1024];
    error[0] = '\0';
    const nr_status s = execute_.load(std::memory_order_relaxed)(
        model, views, n_in, views + n_in, n_out, &options, error, sizeof error);
    switch (s) {
      case NR_OK: *result = absl::OkStatus(); return true;
      case NR_INVALID_INPUT:
      case NR_INVALID_ARGUMENT:
        *result = absl::InvalidArgumentError(Where() + error);
        return true;
      // (as kernel_bridge.error_status words them)
      case NR_DEADLINE_EXCEEDED:
        *result = absl::DeadlineExceededError(Where() + "DeadlineExceeded: " + error);
        return true;
      case NR_CANCELLED:
        *result = absl::CancelledError(Where() + "Cancelled: " + error);
        return true;
      default: return false;
    }
  }

  absl::Status Run(OpKernelContext* ctx, const OutputTensors& outputs) {
    TF_RETURN_IF_ERROR(RequirePython());
    TF_RETURN_IF_ERROR(EnsureLoaded(ctx));
    Gil gil;
    const Bridge* b = GetBridge();
    if (!b) return StatusFromPython(name());
    PyRef ins(PyTuple_New(a_.NumTensorInputs()));
    PyRef outs(PyTuple_New(outputs.size()));
    if (!ins || !outs) return StatusFromPython(name());
    for (int i = 0; i < a_.NumTensorInputs(); ++i) {
      PyObject* view = NewTensorView(*b, ctx->input(i), /*writable=*/false);
      if (!view) return StatusFromPython(name());
      PyTuple_SET_ITEM(ins.get(), i, view);
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      PyObject* view = NewTensorView(*b, *outputs[i], /*writable=*/true);
      if (!view) return StatusFromPython(name());
      PyTuple_SET_ITEM(outs.get(), i, view);
    }
    // A caller may give up on the call (the model server cancels a request's TF call at
    // its deadline): the guard's callback then sets this byte, which the runtime reads
    // before every instruction, so the device stops computing for nobody.
    PyRef cancel(PyByteArray_FromStringAndSize(nullptr, 1));
    if (!cancel) return StatusFromPython(name());
    CancelGuard guard(ctx, reinterpret_cast<uint8_t*>(PyByteArray_AS_STRING(cancel.get())));
    if (!guard.started()) {
      return absl::CancelledError(Where() + "the call was cancelled before it started");
    }
    PyObject* handle = handle_.load(std::memory_order_acquire);
    PyRef r(b->Call(b->run, handle, ins.get(), outs.get(), guard.flag() ? cancel.get() : Py_None));
    if (!r) return StatusFromPython(name());
    // The call may have moved the op off the C runtime (it fell back to TensorFlow).
    if (native_.load(std::memory_order_acquire)) TF_RETURN_IF_ERROR(ReadNativeEntry(handle));
    return absl::OkStatus();
  }

  NeuronOpAttrs a_;

  std::mutex load_mu_;                      // serializes the first load
  std::atomic<PyObject*> handle_{nullptr};  // kernel_bridge.Handle, owned
  // Its model on the C runtime (owned by the handle, which keeps it loaded until the
  // kernel goes, even after a fallback), or null: calls go through the bridge.
  using ExecuteFn = decltype(&nr_execute_with);
  std::atomic<nr_model*> native_{nullptr};
  std::atomic<ExecuteFn> execute_{nullptr};
};

REGISTER_KERNEL_BUILDER(Name("NeuronOp").Device(tensorflow::DEVICE_CPU), NeuronOpKernel);

}  // namespace
}  // namespace neuronish
