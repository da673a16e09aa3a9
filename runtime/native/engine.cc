// neuronish native engine: runs a device program's instructions as oneDNN primitives.
//
// A loader translates each validated instruction into a flat spec of int64s (tensor
// references and attributes) plus a few floats and calls `ne_add` once per instruction at
// load time: runtime/native/spec.py's `encode` (called by runtime/native/engine_program.py)
// for the Python runtime, its C++ twin runtime/capi/engine_spec*.cc for the C runtime.
// Here each spec becomes one oneDNN primitive or one loop of ours (plus, for bf16
// compute, a reorder of its input), created once: weights are reordered
// into the layout the primitive prefers at load, scratchpads are user-managed and shared
// by the program's primitives (they run one after another), so a call allocates nothing.
//
// Memory is addressed by slot: a slot is a base pointer (the arena, a constant, a call's
// input or output) and a tensor is (slot, byte offset, dtype, dims). Fixed slots are bound
// at load, per-call slots before each run; every primitive argument records its slot and
// offset so a run only swaps data handles.
//
// C ABI (ctypes): every function returns 0 / a non-negative value on success and -1 on
// failure, with a message in the caller's error buffer. No C++ exception crosses it.

#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <limits>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl.hpp"

using dnnl::algorithm;
using dnnl::memory;
using dnnl::primitive_attr;
using dnnl::prop_kind;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

namespace {

// Spec codes: tests/runtime/test_native_codes.py holds these enums to runtime/native/spec.py's.
enum Op : int64_t {
  OP_CONV = 1, OP_MATMUL = 2, OP_POOL = 3, OP_ELTWISE = 4, OP_BINARY = 5, OP_SOFTMAX = 6,
  OP_REDUCE = 7, OP_CONCAT = 8, OP_TRANSPOSE = 9, OP_REORDER = 10, OP_LAYER_NORM = 11,
  // Loops of our own (below) for what oneDNN 3.2 has no primitive for, or none as accurate
  // as TF's. (12, 13 and 19 were element-wise loops, 18 and 27 float32 log-softmax and 26
  // int32/bool reductions: now the OP_G_* ones.)
  OP_SELECT = 14, OP_GATHER = 15, OP_STRIDED_COPY = 16, OP_PAD = 17,
  OP_ARGMINMAX = 20, OP_CUMULATIVE = 21, OP_ONE_HOT = 22, OP_TOP_K = 23, OP_MIRROR_PAD = 24,
  OP_RESIZE = 25, OP_CONV3D = 28, OP_POOL3D = 29,
  OP_MASKED_SOFTMAX = 30,
  // A reshape whose output the memory plan put on its input's bytes: nothing to do.
  OP_ALIAS = 60,
};
// OP_G_BINARY functions (spec.py's LOOP).
enum LoopFn : int64_t {
  F_ADD = 1, F_SUB = 2, F_MUL = 3, F_DIV = 4, F_MAX = 5, F_MIN = 6, F_GT = 7, F_GE = 8,
  F_LT = 9, F_LE = 10, F_EQ = 11, F_NE = 12, F_POW = 13, F_FLOOR_DIV = 14, F_FLOOR_MOD = 15,
  F_AND = 16, F_OR = 17, F_SQUARED_DIFFERENCE = 18,
};
enum Dtype : int64_t {
  D_F32 = 0, D_BF16 = 1, D_U8 = 2, D_S32 = 3, D_S8 = 4, D_F16 = 5, D_S64 = 6, D_F64 = 7,
  D_S16 = 8, D_BOOL = 9,
};
enum Elt : int64_t {
  E_RELU = 1, E_CLIP = 2, E_ELU = 3, E_LOGISTIC = 4, E_TANH = 5, E_SOFT_RELU = 6, E_EXP = 7,
  E_LOG = 8, E_SQRT = 9, E_SQUARE = 10, E_ABS = 11, E_LINEAR = 12, E_POW = 13, E_ROUND = 14,
  E_GELU_TANH = 15, E_GELU_ERF = 16, E_SWISH = 17, E_HARDSWISH = 18, E_HARDSIGMOID = 19,
};
enum Bin : int64_t {
  B_ADD = 1, B_SUB = 2, B_MUL = 3, B_DIV = 4, B_MAX = 5, B_MIN = 6, B_GT = 7, B_GE = 8,
  B_LT = 9, B_LE = 10, B_EQ = 11, B_NE = 12,
};
// OP_REDUCE and OP_G_REDUCE functions; any and all are OP_G_REDUCE's, on bool only.
enum Red : int64_t { R_SUM = 1, R_MEAN = 2, R_MAX = 3, R_MIN = 4, R_MUL = 5, R_ANY = 6, R_ALL = 7 };
// Why a run stopped early (ne_run's result; keep in step with runtime/native/engine_program.py).
enum Stop : int64_t { STOP_CANCELLED = 1, STOP_DEADLINE = 2 };

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

dt to_dt(int64_t code) {
  switch (code) {
    case D_F32: return dt::f32;
    case D_BF16: return dt::bf16;
    case D_U8: return dt::u8;
    case D_S32: return dt::s32;
    case D_S8: return dt::s8;
    case D_F16: return dt::f16;
    // int64: oneDNN 3.2 has no s64; only byte-moving loops take it, by its 8-byte size.
    case D_S64: return dt::f64;
    // float64, int16: only our loops take them (they read Ref::code); the oneDNN type
    // stands for the element size. bool is u8 to oneDNN.
    case D_F64: return dt::f64;
    case D_S16: return dt::f16;
    case D_BOOL: return dt::u8;
  }
  throw Error("unknown dtype code " + std::to_string(code));
}

algorithm elt_alg(int64_t code) {
  switch (code) {
    case E_RELU: return algorithm::eltwise_relu;
    case E_CLIP: return algorithm::eltwise_clip_v2;
    case E_ELU: return algorithm::eltwise_elu;
    case E_LOGISTIC: return algorithm::eltwise_logistic;
    case E_TANH: return algorithm::eltwise_tanh;
    case E_SOFT_RELU: return algorithm::eltwise_soft_relu;
    case E_EXP: return algorithm::eltwise_exp;
    case E_LOG: return algorithm::eltwise_log;
    case E_SQRT: return algorithm::eltwise_sqrt;
    case E_SQUARE: return algorithm::eltwise_square;
    case E_ABS: return algorithm::eltwise_abs;
    case E_LINEAR: return algorithm::eltwise_linear;
    case E_POW: return algorithm::eltwise_pow;
    case E_ROUND: return algorithm::eltwise_round;
    case E_GELU_TANH: return algorithm::eltwise_gelu_tanh;
    case E_GELU_ERF: return algorithm::eltwise_gelu_erf;
    case E_SWISH: return algorithm::eltwise_swish;
    case E_HARDSWISH: return algorithm::eltwise_hardswish;
    case E_HARDSIGMOID: return algorithm::eltwise_hardsigmoid;
  }
  throw Error("unknown element-wise code " + std::to_string(code));
}

algorithm bin_alg(int64_t code) {
  switch (code) {
    case B_ADD: return algorithm::binary_add;
    case B_SUB: return algorithm::binary_sub;
    case B_MUL: return algorithm::binary_mul;
    case B_DIV: return algorithm::binary_div;
    case B_MAX: return algorithm::binary_max;
    case B_MIN: return algorithm::binary_min;
    case B_GT: return algorithm::binary_gt;
    case B_GE: return algorithm::binary_ge;
    case B_LT: return algorithm::binary_lt;
    case B_LE: return algorithm::binary_le;
    case B_EQ: return algorithm::binary_eq;
    case B_NE: return algorithm::binary_ne;
  }
  throw Error("unknown binary code " + std::to_string(code));
}

algorithm red_alg(int64_t code) {
  switch (code) {
    case R_SUM: return algorithm::reduction_sum;
    case R_MEAN: return algorithm::reduction_mean;
    case R_MAX: return algorithm::reduction_max;
    case R_MIN: return algorithm::reduction_min;
    case R_MUL: return algorithm::reduction_mul;
  }
  throw Error("unknown reduction code " + std::to_string(code));
}

// A tensor as the spec names it.
struct Ref {
  int64_t slot = -1;
  int64_t offset = 0;
  dt type = dt::f32;
  int64_t code = D_F32;  // the spec's dtype code (tells int64 from float64, bool from u8)
  bool blocked = false;  // an NHWC image kept channel-blocked (nChw16c)
  bool widened = false;  // a bfloat16 value kept in float32 (Program::widened_slot)
  memory::dims dims;
};

bool cpu_has_bf16_kernels();

// A Ref's flags in the spec (spec.py Ref.encode).
constexpr int64_t REF_BLOCKED = 1, REF_WIDENABLE = 2;

// Reads a spec front to back.
struct Reader {
  const int64_t* p;
  int64_t n, i = 0;
  const float* f;
  int64_t nf, fi = 0;
  int64_t widened_slot = -1;       // where a widenable bfloat16 value goes (Program's)
  size_t* widened_bytes = nullptr;  // grown to hold every value put there
  int64_t next() {
    if (i >= n) throw Error("spec too short");
    return p[i++];
  }
  float nextf() {
    if (fi >= nf) throw Error("spec has too few float parameters");
    return f[fi++];
  }
  Ref ref() {
    Ref r;
    r.slot = next();
    r.offset = next();
    r.code = next();
    r.type = to_dt(r.code);
    const int64_t flags = next();
    r.blocked = (flags & REF_BLOCKED) != 0;
    int64_t nd = next();
    if (nd < 0 || nd > DNNL_MAX_NDIMS) throw Error("bad rank " + std::to_string(nd));
    for (int64_t k = 0; k < nd; ++k) {
      int64_t d = next();
      if (d < 0) throw Error("negative dimension");
      r.dims.push_back(d);
    }
    if (r.dims.empty()) r.dims.push_back(1);  // scalars are one-element vectors
    if (r.slot == widened_slot) throw Error("slot out of range");  // the engine's own
    if ((flags & REF_WIDENABLE) && r.code == D_BF16 && widened_bytes && !cpu_has_bf16_kernels())
      widen_in_place(r);
    return r;
  }
  // `r` in float32 at twice its offset in the widened slot: every widenable value keeps
  // its own bytes there, as in the arena (an offset plan's disjoint ranges stay disjoint
  // doubled, and a view inside a value stays at the same element).
  void widen_in_place(Ref& r) {
    if (r.offset < 0) throw Error("negative offset");
    int64_t n = 1;
    for (auto d : r.dims) n *= d;
    r.slot = widened_slot;
    r.offset *= 2;
    r.type = dt::f32;
    r.code = D_F32;
    r.widened = true;
    *widened_bytes = std::max(*widened_bytes, (size_t)(r.offset + n * (int64_t)sizeof(float)));
  }
  memory::dims ints(int64_t count) {
    memory::dims out;
    for (int64_t k = 0; k < count; ++k) out.push_back(next());
    return out;
  }
};

tag plain_tag(size_t rank) {
  static const tag tags[] = {tag::undef, tag::a, tag::ab, tag::abc, tag::abcd, tag::abcde,
                             tag::abcdef};
  if (rank < 1 || rank > 6) throw Error("rank " + std::to_string(rank) + " is not supported");
  return tags[rank];
}

memory::desc plain(const Ref& r) { return memory::desc(r.dims, r.type, plain_tag(r.dims.size())); }
memory::desc plain(const memory::dims& dims, dt type) {
  return memory::desc(dims, type, plain_tag(dims.size()));
}

// NHWC activations described with oneDNN's logical NCHW dims; or, when the compiler and
// the loader agreed to keep the value blocked, its nChw16c layout (same size: C % 16 == 0).
memory::desc nhwc(const Ref& r) {
  if (r.dims.size() != 4) throw Error("expected a 4-D NHWC tensor");
  if (r.blocked && r.dims[3] % 16 != 0) throw Error("blocked layout needs C % 16 == 0");
  return memory::desc({r.dims[0], r.dims[3], r.dims[1], r.dims[2]}, r.type,
                      r.blocked ? tag::nChw16c : tag::nhwc);
}

// Arg::slot of an argument in the engine's temporaries (bound by Program::finalize).
constexpr int64_t TEMP_SLOT = -2;

struct Arg {
  int id;
  memory mem;
  int64_t slot;     // -1: engine-owned memory (reordered weights); TEMP_SLOT: temporaries
  int64_t offset;
  // Where the data is this run: what our loops read. Only a primitive's args are handed to
  // oneDNN (set_data_handle costs ~15 ns an argument, a fifth of a tiny matmul's loop).
  char* ptr = nullptr;
  // Bytes from one image to the next, when the instruction runs image by image
  // (Instr::images > 1) and this argument is one of its batched tensors; else 0.
  int64_t image_step = 0;
};

struct Step {
  dnnl::primitive prim;
  std::vector<Arg> args;
  std::unordered_map<int, memory> map;
  size_t scratchpad = 0;
  memory::desc scratch_md;
  // Instead of `prim`, when inner_len > 0: a reduction (code `reduce`) of each of `rows`
  // runs of inner_len contiguous floats, args[0] -> args[1]. oneDNN 3.2's reduction
  // kernel is slow on innermost axes (a layer norm's mean over [256, 64]: 47 us, numpy
  // 14 us, this loop ~2 us).
  int64_t rows = 0, inner_len = 0, reduce = 0;
  // Instead of both, when set: one of our own loops over the args' data (engine_loops.cc).
  std::function<void(const Step&, int)> loop;
  const char* loop_name = nullptr;
};

// Loops of our own, where oneDNN 3.2 has none (or a less accurate one).
#include "engine_loops.cc"

// One instruction: its primitives in order (a bf16 input reorder, then the op).
struct Instr {
  std::vector<Step> steps;
  int threads = 1;  // the OpenMP team it was created for, and runs with
  int64_t main_step = -1;  // the op's own step, when steps follow it (-1: the last)
  // Its steps run once per image, described for one (Program::by_image): > 1 only for an
  // instruction computing in float32 on 16- or 8-bit operands.
  int64_t images = 1;
};

struct Epilogue {
  std::vector<int64_t> codes;
  std::vector<float> alpha, beta;
};

Epilogue read_epilogue(Reader& rd) {
  Epilogue e;
  int64_t n = rd.next();
  if (n < 0 || n > 8) throw Error("bad activation count");
  for (int64_t k = 0; k < n; ++k) {
    e.codes.push_back(rd.next());
    e.alpha.push_back(rd.nextf());
    e.beta.push_back(rd.nextf());
  }
  return e;
}

void append_eltwise(dnnl::post_ops& po, const Epilogue& e, size_t from = 0) {
  for (size_t k = from; k < e.codes.size(); ++k)
    po.append_eltwise(elt_alg(e.codes[k]), e.alpha[k], e.beta[k]);
}

// Small float32 matmuls on our own loop (y = act(a @ b + bias + res)).
#include "engine_small_matmul.cc"
#include "engine_winograd.cc"

// int8 instructions (docs/int8.md), defined in engine_int8.cc (included below).
enum OpInt8 : int64_t { OP_QUANTIZE = 40, OP_QCONV = 41, OP_QMATMUL = 42, OP_QBINARY = 43 };
// Loops over every dtype, defined in engine_any_dtype.cc (included at the end).
enum OpGeneric : int64_t {
  OP_G_UNARY = 50, OP_G_BINARY = 51, OP_G_REDUCE = 52, OP_G_CAST = 53, OP_G_POOL = 54,
  OP_G_SOFTMAX = 55, OP_G_LAYER_NORM = 56, OP_G_CONCAT = 57, OP_G_MATMUL = 58, OP_G_CONV = 59,
};

// Whether this CPU's oneDNN computes in `type` (f16 or bf16): a tiny matmul and pool,
// tried once per type. oneDNN 3.2 has float16 convolutions, matmuls, pools and element-wise
// ops only with AVX512-FP16 (or AVX2-VNNI-2), and bfloat16 ones from AVX-512 (avx512_core)
// up and on AVX2-VNNI-2. On an AVX2-only CPU (AMD Zen 3, Intel before Skylake-SP) it creates
// neither, and its bfloat16 concat and conversions fall to reference code (a 4x56x56x64
// concat ~0.1 s). There such an instruction computes in float32 (Program::in_f32): the same
// numbers, one rounding per result. NEURONISH_NATIVE_F16=float32 / NEURONISH_NATIVE_BF16=
// float32 take that path on any CPU (so tests hold it to the reference everywhere).
bool probe_half_kernels(dt type, const char* force_env) {
  const char* force = std::getenv(force_env);
  if (force && std::string(force) == "float32") return false;
  try {
    dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    memory::desc m({16, 16}, type, tag::ab);
    dnnl::matmul::primitive_desc(eng, m, m, m);
    memory::desc x({1, 16, 4, 4}, type, tag::nhwc), y({1, 16, 2, 2}, type, tag::nhwc);
    dnnl::pooling_forward::primitive_desc(eng, prop_kind::forward_inference,
                                          algorithm::pooling_max, x, y, {2, 2}, {2, 2},
                                          {0, 0}, {0, 0}, {0, 0});
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

bool cpu_has_f16_kernels() {
  static const bool has = probe_half_kernels(dt::f16, "NEURONISH_NATIVE_F16");
  return has;
}

bool cpu_has_bf16_kernels() {
  static const bool has = probe_half_kernels(dt::bf16, "NEURONISH_NATIVE_BF16");
  return has;
}
}  // namespace

struct Program;
namespace {
void add_int8(Program& p, int64_t op, Reader& rd, Instr& ins);
void add_generic(Program& p, int64_t op, Reader& rd, Instr& ins);
}  // namespace

// `bytes` on 2 MB pages when that many, as runtime/capi/model.cc's arena: a call streams
// through all of it. With the widened values on 4 KB pages ResNet50 bf16 took 1.12x the
// fp32 time (whose values are in that arena) in benchmarks/peers.py; on 2 MB pages 1.01x.
// A hint the kernel may refuse (then 4 KB pages). Freed with std::free.
static void* on_huge_pages(size_t bytes) {
  constexpr size_t kHuge = size_t(2) << 20;
  if (bytes < kHuge) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = std::aligned_alloc(kHuge, size);
  if (p) madvise(p, size, MADV_HUGEPAGE);
  return p;
}

// Reordered weights programs share: a model's copies (and their one-thread twins) are
// built from the same constants, and each reordered every weight for itself: ResNet50's
// four copies held four of its ~100 MB of reordered weights. A program built with a pool
// takes a weight another program of the pool reordered from the same bytes (the same
// address) into the same layout. Both runtimes put every load of the process in one pool,
// placing equal constants once. Entries are weak: the memory lives as long as a program
// using it, and with it the constant it was made from (its model holds that).
// Each program still counts the bytes as its own (ne_bytes): the device charges every
// core for its copy, as a real device's cores each hold one.
struct WeightPool {
  struct Entry {
    const void* src;
    memory::desc given, want;
    dt via;
    std::weak_ptr<void> data;
  };
  std::mutex m;
  std::vector<Entry> entries;
};

struct Program {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  int threads = 1;                     // the program's team size
  int next_threads = 0;                // for the next instruction added (0: `threads`)
  std::vector<char*> slots;            // base pointers
  std::vector<Instr> instrs;
  std::vector<std::shared_ptr<void>> owned;  // reordered weights
  size_t owned_bytes = 0;
  std::shared_ptr<WeightPool> pool;    // shared with other programs, or null
  size_t temp_bytes = 0;               // engine temporaries (bf16 copies), shared
  // --- bfloat16 values kept in float32, where the CPU has no bfloat16 kernels ----------
  // Such a CPU computes every bfloat16 instruction in float32 (in_f32): it widens its
  // operands and narrows its result, two passes over memory per value that cost ResNet50
  // bf16 18% over fp32 on AVX2 with its convolutions as fast. A loader marks the values
  // only this program's native instructions write and read (REF_WIDENABLE); the engine
  // keeps those in float32 in a buffer of its own, the slot after the caller's, and no
  // instruction converts them. They are then not rounded to bfloat16 between instructions,
  // as OpenVINO's bf16 runs in float32 on such a CPU (docs/auto-cast.md).
  int64_t widened_slot = -1;  // slots.size() - 1: bound to `widened` by finalize()
  size_t widened_bytes = 0;
  void* widened = nullptr;
  size_t scratch_bytes = 0;            // largest primitive scratchpad, shared
  void* temp = nullptr;
  void* scratch = nullptr;
  bool finalized = false;
  double* timing = nullptr;  // when set: [start, end] seconds (CLOCK_MONOTONIC) per instr

  ~Program() {
    std::free(temp);
    std::free(scratch);
    std::free(widened);
  }

  // A slot the caller binds (not the widened one).
  char* base(int64_t slot) {
    if (slot < 0 || slot >= (int64_t)slots.size() || slot == widened_slot)
      throw Error("slot out of range");
    return slots[slot];
  }

  // Whether `r` was bound before its instruction was added: a constant of the program.
  bool bound_at_load(const Ref& r) const {
    return r.slot >= 0 && r.slot < (int64_t)slots.size() && slots[r.slot] != nullptr;
  }

  // Memory bound to a spec tensor, described by `md`.
  memory bind(const Ref& r, const memory::desc& md) {
    if (r.slot == TEMP_SLOT) return memory(md, eng, DNNL_MEMORY_NONE);  // bound by finalize()
    if (r.slot < 0 || r.slot >= (int64_t)slots.size()) throw Error("slot out of range");
    return memory(md, eng, slots[r.slot] ? slots[r.slot] + r.offset : DNNL_MEMORY_NONE);
  }

  void arg(Step& s, int id, const Ref& r, const memory::desc& md) {
    memory m = bind(r, md);
    s.args.push_back({id, m, r.slot, r.offset, static_cast<char*>(m.get_data_handle())});
    s.map[id] = m;
  }

  void own_arg(Step& s, int id, memory m) {
    s.args.push_back({id, m, -1, 0, static_cast<char*>(m.get_data_handle())});
    s.map[id] = m;
  }

  // An argument in the engine's temporaries (bound to them by finalize()).
  void temp_arg(Step& s, int id, const memory::desc& md, size_t offset) {
    own_arg(s, id, memory(md, eng, DNNL_MEMORY_NONE));
    s.args.back().slot = TEMP_SLOT;
    s.args.back().offset = (int64_t)offset;
  }

  // Ends a step: its primitive, its scratchpad's size, appended to the instruction.
  template <class Prim, class PD>
  void push(Instr& ins, Step& s, const PD& pd) {
    s.prim = Prim(pd);
    s.scratch_md = pd.scratchpad_desc();
    s.scratchpad = s.scratch_md.get_size();
    scratch_bytes = std::max(scratch_bytes, s.scratchpad);
    ins.steps.push_back(std::move(s));
  }

  // A step reading x (DNNL_ARG_SRC) and writing y (DNNL_ARG_DST), both dense.
  template <class Prim, class PD>
  void push_plain(Instr& ins, const PD& pd, const Ref& x, const Ref& y) {
    Step s;
    arg(s, DNNL_ARG_SRC, x, plain(x));
    arg(s, DNNL_ARG_DST, y, plain(y));
    push<Prim>(ins, s, pd);
  }

  // `from` converted into `to` by our bfloat16 <-> float32 loops when both are plain and
  // dense with the same dims and strides (element i to element i); false, untouched, else.
  static bool convert_dense(const memory& from, const memory& to) {
    const memory::desc a = from.get_desc(), b = to.get_desc();
    const dt fa = a.get_data_type(), fb = b.get_data_type();
    const bool widen = fa == dt::bf16 && fb == dt::f32;
    if (!widen && !(fa == dt::f32 && fb == dt::bf16)) return false;
    if (a.get_dims() != b.get_dims() || a.get_strides() != b.get_strides() ||
        a.get_inner_nblks() != 0 || b.get_inner_nblks() != 0)
      return false;
    int64_t n = 1;
    for (auto d : a.get_dims()) n *= d;
    if (n <= 0 || a.get_size() != (size_t)n * memory::data_type_size(fa) ||
        b.get_size() != (size_t)n * memory::data_type_size(fb))
      return false;  // (a layout with gaps: element i is not at i)
    const Bf16Converters k = bf16_converters();
    if (widen)
      k.widen(static_cast<const uint16_t*>(from.get_data_handle()),
              static_cast<float*>(to.get_data_handle()), n);
    else
      k.narrow(static_cast<const float*>(from.get_data_handle()),
               static_cast<uint16_t*>(to.get_data_handle()), n);
    return true;
  }

  // A weight as the primitive wants it: reordered once, now, into engine memory.
  // With `via` (float16 for a float32 weight read in float16 but computed in float32),
  // the weight is rounded to that dtype on the way.
  memory reorder_weights(const Ref& w, const memory::desc& given, const memory::desc& want,
                         dt via = dt::undef) {
    return made_weights(w, given, want, via, [&](const void* at, memory dst) {
      memory src(given, eng, const_cast<void*>(at));
      std::shared_ptr<void> widened;  // (freed on return)
      if (via != dt::undef && via != given.get_data_type()) {
        memory rounded(memory::desc(given.get_dims(), via, given.get_strides()), eng);
        if (!convert_dense(src, rounded)) {
          dnnl::reorder(src, rounded).execute(strm, src, rounded);
          strm.wait();
        }
        src = rounded;
      }
      // A bfloat16 weight computed in float32 (a CPU without bfloat16 kernels) is widened by
      // our loop first: oneDNN 3.2's bfloat16 -> float32 reorder into a blocked layout is its
      // reference code, which took about half of ResNet50 bf16's first call (2-3 s) on AVX2.
      if (src.get_desc().get_data_type() == dt::bf16 && want.get_data_type() == dt::f32) {
        memory::desc f32_md(src.get_desc().get_dims(), dt::f32, src.get_desc().get_strides());
        const size_t bytes = f32_md.get_size();
        widened.reset(std::aligned_alloc(64, (bytes + 63) / 64 * 64), std::free);
        if (!widened) throw Error("out of host memory for reordered weights");
        memory wide(f32_md, eng, widened.get());
        if (convert_dense(src, wide)) src = wide;
      }
      dnnl::reorder(src, dst).execute(strm, src, dst);
      strm.wait();
    });
  }

  // Engine memory described by `want`, made once from the constant `w` (described by
  // `given`) by `make(w's bytes, the memory)`; or, when a program sharing this one's pool
  // made the same from the same bytes, that one.
  memory made_weights(const Ref& w, const memory::desc& given, const memory::desc& want, dt via,
                      const std::function<void(const void*, memory)>& make) {
    if (!slots[w.slot]) throw Error("weights must be bound before the instruction is added");
    const void* at = slots[w.slot] + w.offset;
    const size_t n = want.get_size();
    if (pool) {
      std::lock_guard<std::mutex> hold(pool->m);
      for (const WeightPool::Entry& e : pool->entries)
        if (e.src == at && e.via == via && e.given == given && e.want == want)
          if (std::shared_ptr<void> done = e.data.lock()) {
            owned.push_back(done);
            owned_bytes += n;
            return memory(want, eng, done.get());
          }
    }
    void* p = std::aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) throw Error("out of host memory for reordered weights");
    owned.emplace_back(p, std::free);
    owned_bytes += n;
    memory dst(want, eng, p);
    make(at, dst);
    if (pool) {
      std::lock_guard<std::mutex> hold(pool->m);
      auto& e = pool->entries;  // (a process's pool outlives loads: drop what they freed)
      e.erase(std::remove_if(e.begin(), e.end(), [](const WeightPool::Entry& x) { return x.data.expired(); }),
              e.end());
      e.push_back({at, given, want, via, owned.back()});
    }
    return dst;
  }

  // A step that converts `r` (described by `md`) into `bmd`, an engine temporary at
  // temp offset `after` (the compute dtype's copy of an input).
  void to_compute(Instr& ins, const Ref& r, const memory::desc& md, const memory::desc& bmd,
                  size_t after) {
    Step s;
    arg(s, DNNL_ARG_FROM, r, md);
    temp_arg(s, DNNL_ARG_TO, bmd, after);
    temp_bytes = std::max(temp_bytes, after + bmd.get_size());
    if (convert_loop(ins, s, md, bmd)) return;
    push<dnnl::reorder>(ins, s, dnnl::reorder::primitive_desc(eng, md, eng, bmd));
  }

  // Ends a conversion step (args FROM, TO) on our loop when it is bfloat16 <-> float32
  // between plain (unblocked) tensors of the same dims, any strides: where oneDNN 3.2 has
  // no bfloat16 kernels its reorder for this is reference code (a 4x56x56x64 tensor ~50 ms;
  // the loop ~0.2 ms). False, pushing nothing, for any other conversion.
  bool convert_loop(Instr& ins, Step& s, const memory::desc& from, const memory::desc& to) {
    const dt a = from.get_data_type(), b = to.get_data_type();
    const bool widen = a == dt::bf16 && b == dt::f32;
    if (!widen && !(a == dt::f32 && b == dt::bf16)) return false;
    memory::dims dims = from.get_dims(), fs = from.get_strides(), ts = to.get_strides();
    if (dims.empty() || dims != to.get_dims() || from.get_inner_nblks() != 0 ||
        to.get_inner_nblks() != 0)
      return false;
    int64_t n = 1;
    for (auto d : dims) n *= d;
    if (n == 0) return false;
    const Bf16Converters k = bf16_converters();
    const char* name = widen ? "neuronish:widen_bf16" : "neuronish:narrow_bf16";
    auto run = [k, widen](const Step& st, int64_t from_at, int64_t to_at, int64_t len,
                          int64_t from_step, int64_t to_step) {
      if (from_step == 1 && to_step == 1) {
        if (widen) k.widen(data<const uint16_t>(st, 0) + from_at, data<float>(st, 1) + to_at, len);
        else k.narrow(data<const float>(st, 0) + from_at, data<uint16_t>(st, 1) + to_at, len);
        return;
      }
      for (int64_t j = 0; j < len; ++j) {  // (a transposed view: one element at a time)
        if (widen)
          k.widen(data<const uint16_t>(st, 0) + from_at + j * from_step,
                  data<float>(st, 1) + to_at + j * to_step, 1);
        else
          k.narrow(data<const float>(st, 0) + from_at + j * from_step,
                   data<uint16_t>(st, 1) + to_at + j * to_step, 1);
      }
    };
    if (fs == ts && from.get_size() == (size_t)n * memory::data_type_size(a) &&
        to.get_size() == (size_t)n * memory::data_type_size(b)) {
      // Laid out alike in one dense run: element i to element i, in chunks over the team.
      push_loop(ins, s, name, [n, run](const Step& st, int threads) {
        const int64_t chunk = 1 << 14, chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) if (threads > 1 && chunks > 1)
        for (int64_t c = 0; c < chunks; ++c)
          run(st, c * chunk, c * chunk, std::min(chunk, n - c * chunk), 1, 1);
      });
      return true;
    }
    // Otherwise row by row over the last axis, each row's start from its outer indices.
    const size_t r = dims.size();
    const int64_t len = dims[r - 1], rows = n / len;
    push_loop(ins, s, name, [dims, fs, ts, r, len, rows, run](const Step& st, int threads) {
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows > 1)
      for (int64_t row = 0; row < rows; ++row) {
        int64_t rest = row, from_at = 0, to_at = 0;
        for (size_t d = r - 1; d-- > 0;) {
          const int64_t i = rest % dims[d];
          rest /= dims[d];
          from_at += i * fs[d];
          to_at += i * ts[d];
        }
        run(st, from_at, to_at, len, fs[r - 1], ts[r - 1]);
      }
    });
    return true;
  }

  // How an image input `r` is read by a primitive whose output is `y_blocked` and whose
  // compute dtype is `cdt`: as it is when layout and dtype already match, else through a
  // reorder step into an engine temporary at `temp_at` (then advanced past it). oneDNN's
  // fast convolutions and pools want input and output in one layout; the loader keeps
  // such boundaries rare (runtime/program.py).
  void bind_image(Instr& ins, Step& s, int id, const Ref& r, dt cdt, bool y_blocked,
                  size_t& temp_at, memory::desc* used = nullptr) {
    memory::desc md = nhwc(r);
    if (r.blocked == y_blocked && r.type == cdt) {
      arg(s, id, r, md);
      if (used) *used = md;
      return;
    }
    memory::desc want({r.dims[0], r.dims[3], r.dims[1], r.dims[2]}, cdt,
                      y_blocked ? tag::nChw16c : tag::nhwc);
    to_compute(ins, r, md, want, temp_at);
    temp_arg(s, id, want, temp_at);
    temp_at += (want.get_size() + 63) / 64 * 64;
    if (used) *used = want;
  }

  // --- float16 computed in float32, where cpu_has_f16_kernels() is false ---------------
  // The op reads its float16 operands through float32 copies (the compute-dtype
  // conversions it has anyway), writes its result to a float32 stand-in among the
  // temporaries, and one reorder after it rounds that into the float16 output: one
  // rounding, as docs/isa.md defines these instructions. The spec is the same on every
  // CPU, so an executable runs the same instructions everywhere.
  static bool in_f32(dt t) {
    return (t == dt::f16 && !cpu_has_f16_kernels()) || (t == dt::bf16 && !cpu_has_bf16_kernels());
  }
  static dt compute_dt(dt t) { return in_f32(t) ? dt::f32 : t; }

  // A `type` stand-in for `r` (same dims and layout) at temporaries offset `temp_at`,
  // which advances past it.
  Ref stand_in(const Ref& r, dt type, int64_t code, size_t& temp_at) {
    Ref t = r;
    t.slot = TEMP_SLOT;
    t.offset = (int64_t)temp_at;
    t.type = type;
    t.code = code;
    size_t n = plain(r.dims, type).get_size();
    temp_at += (n + 63) / 64 * 64;
    temp_bytes = std::max(temp_bytes, temp_at);
    return t;
  }
  Ref f32_stand_in(const Ref& r, size_t& temp_at) { return stand_in(r, dt::f32, D_F32, temp_at); }

  // `r` (described as `md`) converted by a step before the op into a stand-in of `type`
  // (float32 unless said).
  Ref widen(Instr& ins, const Ref& r, const memory::desc& md, size_t& temp_at,
            dt type = dt::f32, int64_t code = D_F32) {
    Ref t = stand_in(r, type, code, temp_at);
    memory::desc t_md = r.blocked ? nhwc(t) : memory::desc(md.get_dims(), type, md.get_strides());
    to_compute(ins, r, md, t_md, (size_t)t.offset);
    return t;
  }

  // A float32 operand of an instruction that reads its operands in `via` (float16 or
  // bfloat16) but computes in float32 here: rounded to `via` by a step before the op (the op
  // then widens it back).
  Ref rounded_to(Instr& ins, const Ref& r, const memory::desc& md, size_t& temp_at, dt via) {
    if (r.type != dt::f32 || r.widened) return r;  // (a widened value is never rounded)
    return via == dt::bf16 ? widen(ins, r, md, temp_at, dt::bf16, D_BF16)
                           : widen(ins, r, md, temp_at, dt::f16, D_F16);
  }

  // The step after the op: its float32 stand-in `t` rounded into `y`, both described
  // by `md`'s dims and strides.
  void narrow_into(Instr& ins, const Ref& t, const Ref& y, const memory::desc& y_md) {
    ins.main_step = (int64_t)ins.steps.size() - 1;
    memory::desc t_md = y.blocked ? nhwc(t)
                                  : memory::desc(y_md.get_dims(), dt::f32, y_md.get_strides());
    Step s;
    arg(s, DNNL_ARG_FROM, t, t_md);
    arg(s, DNNL_ARG_TO, y, y_md);
    if (convert_loop(ins, s, t_md, y_md)) return;
    push<dnnl::reorder>(ins, s, dnnl::reorder::primitive_desc(eng, t_md, eng, y_md));
  }

  // A bias or other small operand in float32 when it is float16 and the op computes in
  // float32: a constant is converted once, now; a computed one by a step before the op.
  void small_arg(Instr& ins, Step& s, int id, const Ref& r, const memory::desc& md,
                 size_t& temp_at) {
    if (!in_f32(r.type)) return arg(s, id, r, md);
    memory::desc want(md.get_dims(), dt::f32, md.get_strides());
    if (bound_at_load(r)) return own_arg(s, id, reorder_weights(r, md, want));
    Ref t = widen(ins, r, md, temp_at);
    arg(s, id, t, want);
  }

  // --- image by image, where an instruction computes in float32 on narrower operands ----
  // Such an instruction (bf16 or fp16 where in_f32, int8 where engine_int8.cc's int8_path
  // is float32) widens its inputs into float32 copies and rounds its float32 result back,
  // each a pass of its own over the batch. When a batch's copies outgrow the cache
  // (MobileNetV2's 8x112x112x96 is 38 MB in float32) those passes run at memory speed: a
  // bf16 depthwise convolution took 1.3x its float32 time on AVX2. Run one image at a
  // time, a copy is read again while it is still in the cache and only the narrow tensors
  // travel to memory. The same steps run once per image, so the numbers are the batch's.
  // Measured on a 32 MiB L3 (docs/performance.md, session 20): worth it from kBatchMin
  // bytes of float32 input and output per batch; below, the copies stay in the cache
  // anyway and a primitive per image only costs (a 7x7x1152 convolution rereads its
  // 1.5 MB of weights per image). kImageMin keeps large batches of small images whole.
  static constexpr int64_t kBatchMin = 16 << 20, kImageMin = 256 << 10;

  // How many images an instruction reading `x` and writing `y` runs in: their batch (the
  // first dim) when it converts to or from float32 and its float32 copies are large
  // enough; else 1 (the whole batch at once).
  static int64_t images_of(const Ref& x, const Ref& y, bool converts) {
    const size_t rank = y.dims.size();
    if (!converts || rank < 2 || x.dims.size() != rank || x.dims[0] != y.dims[0] ||
        y.dims[0] < 2)
      return 1;
    const int64_t bytes = (count(x) + count(y)) * (int64_t)sizeof(float);
    return bytes >= kBatchMin && bytes / y.dims[0] >= kImageMin ? y.dims[0] : 1;
  }

  // Whether `r` is batched like `y` (one image per image of y), not broadcast over it.
  static bool batched_like(const Ref& r, const Ref& y) {
    return r.slot != -1 && r.dims.size() == y.dims.size() && r.dims[0] == y.dims[0];
  }

  // An instruction's split: how many images it runs in, and (when more than one) its
  // batched operands as the whole batch describes them.
  struct ImageSplit {
    int64_t images = 1;
    std::vector<Ref> whole;
  };

  // Decides the split of an instruction whose batched operands are `batched`: first the
  // input x and the output y that images_of weighs, then any others (null ones skipped).
  // When it splits, each is described for one image from here on.
  static ImageSplit split_by_image(std::initializer_list<Ref*> batched, bool converts) {
    const Ref* const* first = batched.begin();
    ImageSplit split;
    split.images = images_of(*first[0], *first[1], converts);
    if (split.images < 2) return split;
    for (Ref* r : batched)
      if (r) {
        split.whole.push_back(*r);
        r->dims[0] = 1;
      }
    return split;
  }

  // Makes `ins`, built for one image of each batched operand, run `split.images` times: an
  // argument bound to one of those operands steps by its own one-image size each time.
  // Every other argument (weights, a broadcast operand, the engine's temporaries) stays.
  static void by_image(Instr& ins, const ImageSplit& split) {
    if (split.images < 2) return;
    ins.images = split.images;
    for (auto& st : ins.steps)
      for (auto& a : st.args)
        for (const Ref& r : split.whole)
          if (r.slot >= 0 && a.slot == r.slot && a.offset == r.offset)
            a.image_step = (int64_t)a.mem.get_desc().get_size();
  }

  primitive_attr attr() {
    primitive_attr a;
    a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return a;
  }

  void add(Reader& rd) {
    Instr ins;
    ins.threads = next_threads > 0 ? std::min(next_threads, threads) : threads;
    omp_set_num_threads(ins.threads);  // primitives size their work for this many threads
    int64_t op = rd.next();
    switch (op) {
      case OP_CONV: add_conv(rd, ins); break;
      case OP_MATMUL: add_matmul(rd, ins); break;
      case OP_POOL: add_pool(rd, ins); break;
      case OP_ELTWISE: add_eltwise(rd, ins); break;
      case OP_BINARY: add_binary(rd, ins); break;
      case OP_SOFTMAX: add_softmax(rd, ins); break;
      case OP_REDUCE: add_reduce(rd, ins); break;
      case OP_CONCAT: add_concat(rd, ins); break;
      case OP_TRANSPOSE: add_transpose(rd, ins); break;
      case OP_REORDER: add_reorder(rd, ins); break;
      case OP_LAYER_NORM: add_layer_norm(rd, ins); break;
      case OP_SELECT: add_select(rd, ins); break;
      case OP_GATHER: add_gather(rd, ins); break;
      case OP_STRIDED_COPY: add_strided_copy(rd, ins); break;
      case OP_PAD: add_pad(rd, ins); break;
      case OP_ARGMINMAX: add_argminmax(rd, ins); break;
      case OP_CUMULATIVE: add_cumulative(rd, ins); break;
      case OP_ONE_HOT: add_one_hot(rd, ins); break;
      case OP_TOP_K: add_top_k(rd, ins); break;
      case OP_MIRROR_PAD: add_mirror_pad(rd, ins); break;
      case OP_RESIZE: add_resize(rd, ins); break;
      case OP_MASKED_SOFTMAX: add_masked_softmax(rd, ins); break;
      case OP_CONV3D: add_conv3d(rd, ins); break;
      case OP_POOL3D: add_pool3d(rd, ins); break;
      case OP_ALIAS: {
        Step s;
        push_loop(ins, s, "neuronish:alias", [](const Step&, int) {});
        break;
      }
      case OP_QUANTIZE: case OP_QCONV: case OP_QMATMUL: case OP_QBINARY:
        add_int8(*this, op, rd, ins);
        break;
      case OP_G_UNARY: case OP_G_BINARY: case OP_G_REDUCE: case OP_G_CAST: case OP_G_POOL:
      case OP_G_SOFTMAX: case OP_G_LAYER_NORM: case OP_G_CONCAT: case OP_G_MATMUL:
      case OP_G_CONV:
        add_generic(*this, op, rd, ins);
        break;
      default: throw Error("unknown op code " + std::to_string(op));
    }
    if (rd.i != rd.n) throw Error("spec has trailing values");
    instrs.push_back(std::move(ins));
  }

  // Whether the memory plan put a convolution's output `y` on its residual's bytes, in
  // the same layout (cc/memory.py `in_place_residual`): then the residual is added as a
  // `sum` post-op, each output element read where it is written, instead of a binary_add
  // reading a second tensor (the 56x56/28x28 conv + add + relu blocks of ResNet50 are
  // memory-bound: bf16 batch 8 9% faster per call). Otherwise (a residual the engine
  // reorders into y's layout first) the binary_add reads that copy.
  static bool in_place(const Ref& res, const Ref& y) {
    bool bytes8 = (res.type == dt::u8 || res.type == dt::s8) &&
                  (y.type == dt::u8 || y.type == dt::s8);  // int8: a signed shortcut
    return res.slot == y.slot && res.offset == y.offset && res.blocked == y.blocked &&
           res.dims == y.dims && (res.type == y.type || bytes8);
  }

  // x, w [, bias] [, residual], y. w is in TF layout: [KH, KW, C/groups, O] or, depthwise,
  // [KH, KW, C, M]; constant weights are reordered now.
  void add_conv(Reader& rd, Instr& ins) {
    int64_t has_bias = rd.next(), has_res = rd.next(), groups = rd.next(), depthwise = rd.next();
    int64_t compute = rd.next(), w_const = rd.next();
    Ref x = rd.ref(), w = rd.ref(), b, res;
    if (has_bias) b = rd.ref();
    if (has_res) res = rd.ref();
    Ref y = rd.ref();
    memory::dims strides = rd.ints(2), dil = rd.ints(2), pads = rd.ints(4);
    Epilogue act = read_epilogue(rd);
    for (auto& d : dil) d -= 1;  // oneDNN counts dilation from 0
    if (w.dims.size() != 4) throw Error("conv weights must be 4-D");
    int64_t kh = w.dims[0], kw = w.dims[1], ci = w.dims[2], co = w.dims[3];
    if (!depthwise && groups == 1 && w_const &&
        add_winograd_conv(ins, x, w, has_bias ? &b : nullptr, has_res ? &res : nullptr, y,
                          strides, dil, pads, act, compute))
      return;
    memory::desc w_given;
    if (depthwise) {  // groups = C, M outputs per group
      groups = ci;
      w_given = memory::desc({ci, co, 1, kh, kw}, w.type, tag::hwigo);
    } else if (groups > 1) {
      w_given = memory::desc({groups, co / groups, ci, kh, kw}, w.type, tag::hwigo);
    } else {
      w_given = memory::desc({co, ci, kh, kw}, w.type, tag::hwio);
    }
    dt cdt = compute_dt(to_dt(compute));  // the dtype the operands are read in
    dt via = to_dt(compute) != cdt ? to_dt(compute) : dt::undef;  // read in, computed wider
    const ImageSplit split = split_by_image(
        {&x, &y, has_res ? &res : nullptr},
        (via != dt::undef && !x.widened) || in_f32(x.type) || in_f32(y.type) ||
            (has_res && in_f32(res.type)));
    Step s;
    size_t temp_at = 0;
    memory::desc x_use, res_use;
    if (via != dt::undef) x = rounded_to(ins, x, nhwc(x), temp_at, via);
    bind_image(ins, s, DNNL_ARG_SRC, x, cdt, y.blocked, temp_at, &x_use);
    bool narrow = in_f32(y.type);
    // Where y is rounded from a float32 stand-in and the residual needs widening anyway
    // (bf16 where in_f32: ResNet50's block ends), the residual is widened into the stand-in
    // itself and added by a sum post-op, as an in-place fp32 residual is: a binary post-op
    // reading a widened copy cost those convolutions 1.3x on AVX2 (docs/performance.md,
    // session 22), and the copy took a stand-in's worth of temporaries.
    const bool res_in_out = has_res && narrow && in_f32(res.type) && res.dims == y.dims &&
                            res.blocked == y.blocked;
    bool sum = has_res && ((in_place(res, y) && !narrow) || res_in_out);
    if (has_res && !sum)
      bind_image(ins, s, DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, res,
                 compute_dt(res.type), y.blocked, temp_at, &res_use);
    Ref out = narrow ? f32_stand_in(y, temp_at) : y;
    memory::desc y_md = nhwc(out);
    if (res_in_out) to_compute(ins, res, nhwc(res), y_md, (size_t)out.offset);
    memory::desc w_any(w_given.get_dims(), cdt, tag::any);
    // oneDNN 3.2 takes its brdgmm kernel for a bf16 depthwise convolution writing bf16 only
    // with a bf16 bias; an f32 one selects jit_dw, 1.45x slower (8x144x56x56 3x3, one
    // thread: 2.2 vs 1.5 ms; slower than the f32 convolution). So a constant f32 bias is
    // rounded to bf16 once, here: an error of the size of the bf16 output's own rounding.
    bool bias_bf16 = has_bias && depthwise && cdt == dt::bf16 && y.type == dt::bf16 &&
                     b.type == dt::f32 && bound_at_load(b);
    memory::desc b_md = !has_bias   ? memory::desc()
                        : bias_bf16 ? plain(b.dims, dt::bf16)
                                    : plain(b.dims, compute_dt(b.type));
    primitive_attr a = attr();
    dnnl::post_ops po;
    if (sum) po.append_sum(1.f);
    else if (has_res) po.append_binary(algorithm::binary_add, res_use);
    append_eltwise(po, act);
    a.set_post_ops(po);
    auto pd = dnnl::convolution_forward::primitive_desc(
        eng, prop_kind::forward_inference, algorithm::convolution_direct, x_use,
        w_const ? w_any : memory::desc(w_given.get_dims(), cdt, w_given.get_strides()), b_md,
        y_md, strides, dil, {pads[0], pads[2]}, {pads[1], pads[3]}, a);
    if (w_const) {
      own_arg(s, DNNL_ARG_WEIGHTS, reorder_weights(w, w_given, pd.weights_desc(), via));
    } else if (w.type == cdt) {
      arg(s, DNNL_ARG_WEIGHTS, w, w_given);
    } else if (in_f32(w.type)) {
      Ref w32 = widen(ins, w, w_given, temp_at);
      arg(s, DNNL_ARG_WEIGHTS, w32, memory::desc(w_given.get_dims(), cdt, w_given.get_strides()));
    } else {
      throw Error("computed conv weights must already have the compute dtype");
    }
    if (bias_bf16) own_arg(s, DNNL_ARG_BIAS, reorder_weights(b, plain(b), b_md));
    else if (has_bias) small_arg(ins, s, DNNL_ARG_BIAS, b, plain(b), temp_at);
    arg(s, DNNL_ARG_DST, out, y_md);
    push<dnnl::convolution_forward>(ins, s, pd);
    if (narrow) narrow_into(ins, out, y, nhwc(y));
    by_image(ins, split);
  }

  // A tensor's element strides, as many as its dims, each within the buffer the caller
  // placed it in: a matmul operand or result read through a permutation (no copy).
  memory::dims read_steps(Reader& rd, const Ref& t) {
    memory::dims steps = rd.ints((int64_t)t.dims.size());
    int64_t count = 1, reach = 0;
    for (size_t k = 0; k < steps.size(); ++k) {
      if (steps[k] < 0) throw Error("negative stride");
      count *= t.dims[k];
      if (t.dims[k] > 0) reach += (t.dims[k] - 1) * steps[k];
    }
    if (count > 0 && reach >= count) throw Error("strides reach outside the tensor");
    return steps;
  }

  // a [..., M, K], b [..., K, N] (either possibly transposed, leading dims broadcast and
  // already padded to y's rank by the caller) [, bias [N]] [, residual (y's dims)],
  // y [..., M, N]. The residual is a binary-add post-op: added after the bias, before the
  // activation, while the output block is still in registers.
  void add_matmul(Reader& rd, Instr& ins) {
    int64_t has_bias = rd.next(), ta = rd.next(), tb = rd.next(), compute = rd.next();
    int64_t b_const = rd.next(), has_res = rd.next();
    Ref A = rd.ref();
    memory::dims a_steps = read_steps(rd, A);
    Ref B = rd.ref();
    memory::dims b_steps = read_steps(rd, B), y_steps;
    Ref bias, res;
    if (has_bias) bias = rd.ref();
    if (has_res) res = rd.ref();
    Ref y = rd.ref();
    y_steps = read_steps(rd, y);
    if (has_res && res.dims != y.dims) throw Error("matmul: the residual must have y's dims");
    Epilogue act = read_epilogue(rd);
    size_t r = y.dims.size();
    if (r < 2) throw Error("matmul: y has rank " + std::to_string(r) + ", expected 2 or more");
    if (A.dims.size() != r || B.dims.size() != r) throw Error("matmul ranks differ");
    // Each operand as the product reads it: its dims with the strides the caller gave (a
    // transposed view of where it is stored: attention's heads read in place), then the
    // transpose flag swapping the last two.
    auto logical = [&](const Ref& t, const memory::dims& steps, bool trans) {
      memory::dims dims = t.dims, strides = steps;
      if (trans) {
        std::swap(dims[r - 1], dims[r - 2]);
        std::swap(strides[r - 1], strides[r - 2]);
      }
      return std::make_pair(dims, strides);
    };
    auto [ad, as] = logical(A, a_steps, ta);
    auto [bd, bs] = logical(B, b_steps, tb);
    // (the small loop reads as far as y's dims say; oneDNN refused a disagreement without
    // naming the operand)
    check_matmul_dims(ad, bd, has_bias ? &bias : nullptr, y.dims);
    if (add_small_matmul(ins, A, ad, as, B, bs, has_bias ? &bias : nullptr,
                         has_res ? &res : nullptr, y, y_steps, act, compute))
      return;
    bool narrow = in_f32(y.type);
    memory::desc y_md(y.dims, narrow ? dt::f32 : y.type, y_steps);
    dt cdt = compute_dt(to_dt(compute));
    dt via = to_dt(compute) != cdt ? to_dt(compute) : dt::undef;  // read in, computed wider
    Step s;
    size_t temp_at = 0;
    if (via != dt::undef) {
      A = rounded_to(ins, A, memory::desc(ad, A.type, as), temp_at, via);
      if (!b_const) B = rounded_to(ins, B, memory::desc(bd, B.type, bs), temp_at, via);
    }
    memory::desc a_md(ad, A.type, as), b_md(bd, B.type, bs);
    memory::desc a_use = A.type != cdt ? memory::desc(ad, cdt, plain_tag(r)) : a_md;
    memory::desc b_use = b_const          ? memory::desc(bd, cdt, tag::any)
                         : B.type != cdt ? memory::desc(bd, cdt, plain_tag(r))
                                         : b_md;
    memory::desc bias_md;
    if (has_bias) {
      memory::dims bd2(r, 1);
      bd2[r - 1] = y.dims[r - 1];
      bias_md = plain(bd2, compute_dt(bias.type));
    }
    memory::desc res_md = has_res ? plain(res.dims, compute_dt(res.type)) : memory::desc();
    primitive_attr a = attr();
    dnnl::post_ops po;
    if (has_res) po.append_binary(algorithm::binary_add, res_md);
    append_eltwise(po, act);
    a.set_post_ops(po);
    auto pd = dnnl::matmul::primitive_desc(eng, a_use, b_use, bias_md, y_md, a);
    if (a_use.get_data_type() != A.type) {
      // Convert a (possibly a transposed view) into a dense temporary of the compute type.
      to_compute(ins, A, a_md, a_use, temp_at);
      temp_arg(s, DNNL_ARG_SRC, a_use, temp_at);
      temp_at += (a_use.get_size() + 63) / 64 * 64;
    } else {
      arg(s, DNNL_ARG_SRC, A, a_md);
    }
    if (b_const) {
      own_arg(s, DNNL_ARG_WEIGHTS, reorder_weights(B, b_md, pd.weights_desc(), via));
    } else if (B.type != cdt) {
      // A computed operand (attention's keys, values) read in reduced precision: converted
      // into the temporaries after a's.
      memory::desc b_cvt(bd, cdt, plain_tag(r));
      to_compute(ins, B, b_md, b_cvt, temp_at);
      temp_arg(s, DNNL_ARG_WEIGHTS, b_cvt, temp_at);
      temp_at += (b_cvt.get_size() + 63) / 64 * 64;
    } else {
      arg(s, DNNL_ARG_WEIGHTS, B, b_md);
    }
    if (has_bias) small_arg(ins, s, DNNL_ARG_BIAS, bias, plain(bias_md.get_dims(), bias.type), temp_at);
    if (has_res)
      small_arg(ins, s, DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, res, plain(res),
                temp_at);
    Ref out = narrow ? f32_stand_in(y, temp_at) : y;
    arg(s, DNNL_ARG_DST, out, y_md);
    push<dnnl::matmul>(ins, s, pd);
    if (narrow) narrow_into(ins, out, y, memory::desc(y.dims, y.type, y_steps));
  }

  // Throws, naming the operand, unless a [.., M, K] @ b [.., K, N] (+ bias [N]) gives y
  // [.., M, N], each leading dim of a and b 1 or y's (the logical dims, transposes applied).
  static void check_matmul_dims(const memory::dims& ad, const memory::dims& bd, const Ref* bias,
                                const memory::dims& y) {
    const size_t r = y.size();
    auto fail = [](const std::string& what, int64_t want, int64_t got) {
      throw Error("matmul: " + what + " is " + std::to_string(got) + ", expected " +
                  std::to_string(want));
    };
    for (size_t d = 0; d + 2 < r; ++d) {
      if (ad[d] != 1 && ad[d] != y[d]) fail("a's dim " + std::to_string(d), y[d], ad[d]);
      if (bd[d] != 1 && bd[d] != y[d]) fail("b's dim " + std::to_string(d), y[d], bd[d]);
    }
    if (ad[r - 2] != y[r - 2]) fail("a's row count (y's M)", y[r - 2], ad[r - 2]);
    if (bd[r - 2] != ad[r - 1]) fail("b's row count (a's K)", ad[r - 1], bd[r - 2]);
    if (bd[r - 1] != y[r - 1]) fail("b's column count (y's N)", y[r - 1], bd[r - 1]);
    if (bias && count(*bias) != y[r - 1]) fail("bias's size (y's N)", y[r - 1], count(*bias));
  }

  // A float32 matmul small enough that oneDNN's per-call cost would dominate it, on
  // small_matmul (engine_small_matmul.cc); false, adding nothing, when it is not one. Its
  // operands agree (check_matmul_dims).
  bool add_small_matmul(Instr& ins, const Ref& A, const memory::dims& ad, const memory::dims& as,
                        const Ref& B, const memory::dims& bs, const Ref* bias, const Ref* res,
                        const Ref& y, const memory::dims& y_steps, const Epilogue& act,
                        int64_t compute) {
    const size_t r = y.dims.size();
    auto f32 = [](const Ref* t) { return !t || t->type == dt::f32; };
    if (compute != D_F32 || !f32(&A) || !f32(&B) || !f32(&y) || !f32(bias) || !f32(res) ||
        bs[r - 1] != 1 || y_steps[r - 1] != 1 || !small_matmul_takes(act))
      return false;
    for (size_t d = 0; d + 2 < r; ++d)
      if (y.dims[d] != 1) return false;  // (a batch of matmuls: oneDNN's)
    SmallMatmul g;
    g.M = y.dims[r - 2];
    g.N = y.dims[r - 1];
    g.K = ad[r - 1];
    const SmallMatmulVariant variant = small_matmul_variant();
    if (!small_matmul_fits(g.M, g.N, g.K, variant.lanes)) return false;
    g.a_row = as[r - 2];
    g.a_col = as[r - 1];
    g.b_row = bs[r - 2];
    g.y_row = y_steps[r - 2];
    g.bias = bias != nullptr;
    g.res = res != nullptr;
    g.act = act;
    Step s;
    byte_arg(s, A);
    byte_arg(s, B);
    if (bias) byte_arg(s, *bias);
    if (res) byte_arg(s, *res);
    byte_arg(s, y);
    push_loop(ins, s, "neuronish:small_matmul", [g, run = variant.run](const Step& st, int) {
      size_t k = 2;
      const float* pbias = g.bias ? data<const float>(st, k++) : nullptr;
      const float* pres = g.res ? data<const float>(st, k++) : nullptr;
      run(g, data<const float>(st, 0), data<const float>(st, 1), pbias, pres, data<float>(st, k));
    });
    return true;
  }

  // A float32 3x3 convolution at stride 1 (or a bfloat16 one computed in float32) by
  // Winograd's F(2x2, 3x3) on loops of our own (engine_winograd.cc), its weights
  // transformed once, now; false, adding nothing, where it does not fit (winograd_fits) or
  // NEURONISH_NATIVE_WINOGRAD turns it off. `dil` counts from 0, as oneDNN's; `pads` are
  // top, bottom, left, right.
  bool add_winograd_conv(Instr& ins, const Ref& x, const Ref& w, const Ref* bias,
                         const Ref* res, const Ref& y,
                         const memory::dims& strides, const memory::dims& dil,
                         const memory::dims& pads, const Epilogue& act, int64_t compute) {
    // float32, or bfloat16 computed in float32 where the CPU has no bfloat16 kernels, its
    // values kept in float32 (widened): then, as oneDNN's path does, the weights are
    // rounded to bfloat16 and x is read as it is (a widened value is never rounded).
    const bool bf16_in_f32 = compute == D_BF16 && in_f32(dt::bf16);
    auto plain_f32 = [](const Ref* t) { return !t || (t->type == dt::f32 && !t->blocked); };
    if ((compute != D_F32 && !(bf16_in_f32 && x.widened)) || !plain_f32(&x) ||
        (w.type != dt::f32 && w.type != dt::bf16) || !plain_f32(bias) || !plain_f32(&y) ||
        x.dims.size() != 4 || y.dims.size() != 4 ||
        w.dims != memory::dims{3, 3, x.dims[3], y.dims[3]} || x.dims[0] != y.dims[0] ||
        strides != memory::dims{1, 1} || dil != memory::dims{0, 0} ||
        (bias && count(*bias) != y.dims[3]) || !plain_f32(res) || (res && res->dims != y.dims) ||
        !small_matmul_takes(act))
      return false;
    // (the loop reads x's windows after writing earlier tiles of y, and a residual's pixel
    // just before writing y's: x must be apart from y, a residual apart or y itself)
    auto apart = [](const Ref& a, const Ref& b) {
      const int64_t a_end = a.offset + 4 * count(a), b_end = b.offset + 4 * count(b);
      return a.slot != b.slot || a_end <= b.offset || b_end <= a.offset;
    };
    if (!apart(x, y) || (res && !apart(*res, y) && res->offset != y.offset)) return false;
    if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p < 0 || p > 2; }) ||
        y.dims[1] != x.dims[1] + pads[0] + pads[1] - 2 ||
        y.dims[2] != x.dims[2] + pads[2] + pads[3] - 2 ||
        !winograd_fits(x.dims[3], y.dims[3], y.dims[1], y.dims[2]) || !winograd_enabled())
      return false;
    Winograd g;
    g.H = x.dims[1];
    g.W = x.dims[2];
    g.IC = x.dims[3];
    g.OC = y.dims[3];
    g.OH = y.dims[1];
    g.OW = y.dims[2];
    g.pad_top = pads[0];
    g.pad_left = pads[2];
    g.tiles_y = (g.OH + 1) / 2;
    g.tiles_x = (g.OW + 1) / 2;
    g.tiles = x.dims[0] * g.tiles_y * g.tiles_x;
    winograd_plan(g);
    g.bias = bias != nullptr;
    g.res = res != nullptr;
    g.act = act;
    const memory::desc given({g.OC, g.IC, 3, 3}, w.type, tag::hwio);
    const memory::desc want({16, g.OC / kWinoPanel, g.IC, kWinoPanel}, dt::f32, tag::abcd);
    const dt via = bf16_in_f32 ? dt::bf16 : dt::undef;
    Step s;
    byte_arg(s, x);
    own_arg(s, (int)s.args.size(),
            made_weights(w, given, want, via, [&g, &w, via](const void* at, memory dst) {
              std::vector<float> k(9 * g.IC * g.OC);  // w in float32, rounded as it is read
              if (w.type == dt::bf16) {
                widen_bf16_row(static_cast<const uint16_t*>(at), k.data(), (int64_t)k.size());
              } else {
                std::memcpy(k.data(), at, k.size() * sizeof(float));
                if (via == dt::bf16)
                  for (float& v : k) v = round_bf16(v);
              }
              winograd_weights(g, k.data(), static_cast<float*>(dst.get_data_handle()));
            }));
    byte_arg(s, y);
    const int team = ins.threads;  // (the most the loop is run with)
    const memory::desc work({winograd_work(g, team)}, dt::f32, tag::a);
    temp_arg(s, (int)s.args.size(), work, 0);
    temp_bytes = std::max(temp_bytes, work.get_size());
    if (bias) byte_arg(s, *bias);
    if (res) byte_arg(s, *res);
    push_loop(ins, s, "neuronish:winograd_conv", [g, team](const Step& st, int threads) {
      const float* pbias = g.bias ? data<const float>(st, 4) : nullptr;
      const float* pres = g.res ? data<const float>(st, g.bias ? 5 : 4) : nullptr;
      winograd_conv(g, data<const float>(st, 0), data<const float>(st, 1), pbias, pres,
                    data<float>(st, 2), data<float>(st, 3), std::min(threads, team));
    });
    return true;
  }

  // A bfloat16 global average pool (x [N, H, W, C] -> y [N, 1, 1, C], no padding:
  // squeeze-excite's squeeze) where the CPU has no bfloat16 kernels (in_f32), in one pass of
  // our own (engine_loops.cc bf16_mean_rows: N groups of H*W rows of C) instead of widening
  // all of x first. (Only float32 values are kept channel-blocked: cc/passes/layout.py.)
  bool bf16_global_mean_in_one_pass(Instr& ins, int64_t is_max, const Ref& x, const Ref& y,
                                    const memory::dims& k, const memory::dims& pads) {
    if (is_max || x.type != dt::bf16 || y.type != dt::bf16 || !in_f32(dt::bf16) || x.blocked ||
        y.blocked || x.dims.size() != 4 || k != memory::dims{x.dims[1], x.dims[2]} ||
        std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; }) ||
        y.dims != memory::dims{x.dims[0], 1, 1, x.dims[3]} || count(y) == 0 ||
        !__builtin_cpu_supports("avx2"))
      return false;
    const Bf16Mean op{x.dims[1] * x.dims[2], x.dims[3]};
    const int64_t groups = x.dims[0];
    Step s;
    byte_arg(s, x);
    byte_arg(s, y);
    push_loop(ins, s, "neuronish:global_mean_bf16", [op, groups](const Step& st, int threads) {
      constexpr int64_t piece = Bf16Mean::kPiece;
      const int64_t pieces = (op.len + piece - 1) / piece, items = groups * pieces;
#pragma omp parallel for num_threads(threads) if (threads > 1 && items > 1)
      for (int64_t i = 0; i < items; ++i) {
        const int64_t from = (i % pieces) * piece;
        bf16_mean_rows(op, data<const uint16_t>(st, 0), data<uint16_t>(st, 1), i / pieces, from,
                       std::min(op.len, from + piece));
      }
    });
    return true;
  }

  void add_pool(Reader& rd, Instr& ins) {
    int64_t is_max = rd.next();
    Ref x = rd.ref(), y = rd.ref();
    memory::dims k = rd.ints(2), st = rd.ints(2), pads = rd.ints(4);
    if (bf16_global_mean_in_one_pass(ins, is_max, x, y, k, pads)) return;
    const ImageSplit split = split_by_image({&x, &y}, in_f32(x.type) || in_f32(y.type));
    Step s;
    size_t temp_at = 0;
    memory::desc x_use;
    bind_image(ins, s, DNNL_ARG_SRC, x, compute_dt(x.type), y.blocked, temp_at, &x_use);
    bool narrow = in_f32(y.type);
    Ref out = narrow ? f32_stand_in(y, temp_at) : y;
    auto pd = dnnl::pooling_forward::primitive_desc(
        eng, prop_kind::forward_inference,
        is_max ? algorithm::pooling_max : algorithm::pooling_avg_exclude_padding, x_use,
        nhwc(out), st, k, {0, 0}, {pads[0], pads[2]}, {pads[1], pads[3]}, attr());
    arg(s, DNNL_ARG_DST, out, nhwc(out));
    push<dnnl::pooling_forward>(ins, s, pd);
    if (narrow) narrow_into(ins, out, y, nhwc(y));
    by_image(ins, split);
  }

  void add_eltwise(Reader& rd, Instr& ins) {
    Ref x = rd.ref(), y = rd.ref();
    Epilogue e = read_epilogue(rd);
    if (e.codes.empty()) throw Error("element-wise op without a function");
    const ImageSplit split = split_by_image({&x, &y}, in_f32(x.type) || in_f32(y.type));
    size_t temp_at = 0;
    Ref in = in_f32(x.type) ? widen(ins, x, plain(x), temp_at) : x;
    bool narrow = in_f32(y.type);
    Ref out = narrow ? f32_stand_in(y, temp_at) : y;
    primitive_attr a = attr();
    dnnl::post_ops po;
    append_eltwise(po, e, 1);
    a.set_post_ops(po);
    auto pd = dnnl::eltwise_forward::primitive_desc(eng, prop_kind::forward_inference,
                                                    elt_alg(e.codes[0]), plain(in), plain(out),
                                                    e.alpha[0], e.beta[0], a);
    push_plain<dnnl::eltwise_forward>(ins, pd, in, out);
    if (narrow) narrow_into(ins, out, y, plain(y));
    by_image(ins, split);
  }

  // Whether `r` (padded to y's rank) is y-shaped, one value, or a vector over y's last dim.
  static bool channel_like(const Ref& r, const memory::dims& y) {
    if (r.dims == y) return true;
    for (size_t k = 0; k + 1 < r.dims.size(); ++k)
      if (r.dims[k] != 1) return false;
    return r.dims.back() == 1 || r.dims.back() == y.back();
  }

  // Rows of fewer channels than this run short on oneDNN's binary (see add_binary).
  static constexpr int64_t kShortRow = 16;

  // The k that regroups `rows` rows of `channels` into rows of at least 64 elements: the
  // smallest divisor of `rows` from there up to 1024 that makes whole vectors of 16 (rows
  // of 84 ran 1.3x slower than rows of 96), else the smallest divisor, else 1 (left as
  // they are).
  static int64_t regroup_factor(int64_t rows, int64_t channels) {
    const int64_t least = (64 + channels - 1) / channels;
    for (int64_t whole : {16 / std::gcd<int64_t>(channels, 16), int64_t{1}})
      for (int64_t k = (least + whole - 1) / whole * whole; k <= 1024 && k <= rows; k += whole)
        if (rows % k == 0) return k;
    return 1;
  }

  // `v` (a vector, any dtype) repeated k times into a temporary, by a step before the op.
  Ref tiled(Instr& ins, const Ref& v, int64_t k, size_t& temp_at) {
    Ref shape = v;
    shape.dims = {k * count(v)};
    Ref t = stand_in(shape, v.type, v.code, temp_at);
    Step s;
    byte_arg(s, v);
    byte_arg(s, t);
    const size_t bytes = (size_t)count(v) * memory::data_type_size(v.type);
    push_loop(ins, s, "tile", [bytes, k](const Step& st, int) {
      const char* from = data<const char>(st, 0);
      char* to = data<char>(st, 1);
      for (int64_t j = 0; j < k; ++j) std::memcpy(to + j * bytes, from, bytes);
    });
    return t;
  }

  // y = a op b in bfloat16 where the CPU has no bfloat16 kernels (in_f32), in one pass of
  // our own (engine_loops.cc bf16_binary_rows) instead of widen, oneDNN's float32 binary,
  // narrow: for add, subtract, multiply and divide without addend or activation, when b
  // is a's shape, a vector over the last axis, or one such vector per image
  // (squeeze-excite's x[N, H, W, C] * s[N, 1, 1, C]).
  bool bf16_binary_in_one_pass(Instr& ins, int64_t code, const Ref& a, const Ref& b,
                               const Ref& y) {
    if (a.type != dt::bf16 || b.type != dt::bf16 || y.type != dt::bf16 || !in_f32(dt::bf16) ||
        code < B_ADD || code > B_DIV ||
        a.blocked || b.blocked || y.blocked || y.dims.empty() || count(y) == 0 ||
        !__builtin_cpu_supports("avx2"))
      return false;
    const int64_t len = y.dims.back(), rows = count(y) / len;
    int64_t rows_per_b;
    if (b.dims == y.dims)
      rows_per_b = 1;
    else if (!b.dims.empty() && b.dims.back() == len && count(b) == len)
      rows_per_b = rows;  // one vector for every row
    else if (b.dims.size() == y.dims.size() && b.dims[0] == y.dims[0] && b.dims.back() == len &&
             count(b) == y.dims[0] * len)
      rows_per_b = rows / y.dims[0];  // one vector per image
    else
      return false;
    Step s;
    byte_arg(s, a);
    byte_arg(s, b);
    byte_arg(s, y);
    if (b.dims == y.dims) {  // element for element: chunks of the flat run, so one long row
      const int64_t n = count(y);  // ([1, 1M]) still spreads over the team
      push_loop(ins, s, "neuronish:binary_bf16", [code, n](const Step& st, int threads) {
        const int64_t chunk = 16384, chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) if (threads > 1 && chunks > 1)
        for (int64_t c = 0; c < chunks; ++c) {
          const int64_t at = c * chunk;
          bf16_binary_rows(Bf16Binary{code, 1, std::min(chunk, n - at), 1},
                           data<const uint16_t>(st, 0) + at, data<const uint16_t>(st, 1) + at,
                           data<uint16_t>(st, 2) + at, 0, 1);
        }
      });
      return true;
    }
    const Bf16Binary op{code, rows, len, rows_per_b};
    push_loop(ins, s, "neuronish:binary_bf16", [op](const Step& st, int threads) {
      const int64_t per = std::max<int64_t>(1, 16384 / op.len), chunks = (op.rows + per - 1) / per;
#pragma omp parallel for num_threads(threads) if (threads > 1 && chunks > 1)
      for (int64_t c = 0; c < chunks; ++c)
        bf16_binary_rows(op, data<const uint16_t>(st, 0), data<const uint16_t>(st, 1),
                         data<uint16_t>(st, 2), c * per, std::min(op.rows, (c + 1) * per));
    });
    return true;
  }

  // a has y's dims; b's dims (and the addend c's) are y's or 1 (numpy broadcasting, made
  // explicit by the caller). y = act(fn(a, b) + c): c is a binary-add post-op, so a
  // BatchNorm's scale and shift after a concat stream through memory once.
  void add_binary(Reader& rd, Instr& ins) {
    int64_t code = rd.next(), has_c = rd.next();
    Ref A = rd.ref(), B = rd.ref(), C;
    if (has_c) C = rd.ref();
    Ref y = rd.ref();
    Epilogue e = read_epilogue(rd);
    if (A.dims != y.dims) throw Error("binary: the first operand must have the output's shape");
    if (!has_c && e.codes.empty() && bf16_binary_in_one_pass(ins, code, A, B, y)) return;
    const ImageSplit split = split_by_image(
        {&A, &y, batched_like(B, y) ? &B : nullptr, has_c && batched_like(C, y) ? &C : nullptr},
        in_f32(A.type) || in_f32(B.type) || (has_c && in_f32(C.type)) || in_f32(y.type));
    size_t temp_at = 0;
    if (in_f32(A.type)) A = widen(ins, A, plain(A), temp_at);
    if (in_f32(B.type)) B = widen(ins, B, plain(B), temp_at);
    if (has_c && in_f32(C.type)) C = widen(ins, C, plain(C), temp_at);
    bool narrow = in_f32(y.type);
    Ref out = narrow ? f32_stand_in(y, temp_at) : y;
    // oneDNN 3.2 runs a binary post-op that broadcasts along anything but dims[1] on
    // reference code (8x56x56x256 with a [256] addend: 747 ms against 2 ms). A channel
    // vector is per_oc once y is seen as [rows, channels]: every operand is described so
    // when each is y-shaped, one value or such a vector (a BatchNorm's scale and shift).
    // When no operand is a vector, all are described flat ([elements] or [1]): as [rows, 3]
    // an RGB image's rescaling (x * s + o, one value each) ran 4.9 ns an element (5.9 ms
    // for 8x224x224x3) on jit:uni's short rows.
    // A vector over a few channels (Keras' Normalization on an RGB image: x - mean[3],
    // then / std[3]) makes rows too short for either form: 4.9 ns an element again. Such
    // rows are regrouped k at a time, [rows / k, k * channels], and each vector operand
    // tiled k times by a step before the op.
    memory::dims rows;
    auto flat = [&](const Ref& r) { return r.dims == y.dims || count(r) == 1; };
    auto vector_like = [&](const Ref& r) { return channel_like(r, y.dims) && !flat(r); };
    const int64_t channels = y.dims.empty() ? 1 : y.dims.back();
    const bool short_rows = y.dims.size() > 1 && channels < kShortRow &&
                            (vector_like(B) || (has_c && vector_like(C)));
    if (has_c && y.dims.size() > 1 && flat(B) && flat(C))
      rows = {count(y)};
    else if ((has_c || short_rows) && y.dims.size() > (short_rows ? 1u : 2u) &&
             channel_like(B, y.dims) && (!has_c || channel_like(C, y.dims)))
      rows = {count(y) / channels, channels};
    if (short_rows && rows.size() == 2) {
      int64_t k = regroup_factor(rows[0], channels);
      if (k > 1) {
        rows = {rows[0] / k, k * channels};
        if (vector_like(B)) B = tiled(ins, B, k, temp_at);
        if (has_c && vector_like(C)) C = tiled(ins, C, k, temp_at);
      }
    }
    auto md = [&](const Ref& r) {
      if (rows.empty()) return plain(r);
      int64_t n = count(r);
      if (rows.size() == 1) return plain(n == 1 ? memory::dims{1} : rows, r.type);
      return plain(n == 1 ? memory::dims{1, 1} : n == rows[1] ? memory::dims{1, rows[1]} : rows,
                   r.type);
    };
    primitive_attr a = attr();
    dnnl::post_ops po;
    if (has_c) po.append_binary(algorithm::binary_add, md(C));
    append_eltwise(po, e);
    a.set_post_ops(po);
    auto pd = dnnl::binary::primitive_desc(eng, bin_alg(code), md(A), md(B), md(out), a);
    Step s;
    arg(s, DNNL_ARG_SRC_0, A, md(A));
    arg(s, DNNL_ARG_SRC_1, B, md(B));
    if (has_c) arg(s, DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, C, md(C));
    arg(s, DNNL_ARG_DST, out, md(out));
    push<dnnl::binary>(ins, s, pd);
    if (narrow) narrow_into(ins, out, y, plain(y));
    by_image(ins, split);
  }

  void add_softmax(Reader& rd, Instr& ins) {
    int64_t axis = rd.next(), log = rd.next();
    Ref x = rd.ref(), y = rd.ref();
    size_t temp_at = 0;
    if (in_f32(x.type)) x = widen(ins, x, plain(x), temp_at);
    bool narrow = in_f32(y.type);
    Ref out = narrow ? f32_stand_in(y, temp_at) : y;
    auto pd = dnnl::softmax_forward::primitive_desc(
        eng, prop_kind::forward_inference,
        log ? algorithm::softmax_log : algorithm::softmax_accurate, plain(x), plain(out),
        (int)axis, attr());
    push_plain<dnnl::softmax_forward>(ins, pd, x, out);
    if (narrow) narrow_into(ins, out, y, plain(y));
  }

  // y's dims keep x's rank, with 1 on the reduced axes.
  void add_reduce(Reader& rd, Instr& ins) {
    int64_t code = rd.next();
    Ref x = rd.ref(), y_given = rd.ref();
    red_alg(code);  // (refuses an unknown code)
    if (x.dims.size() != y_given.dims.size()) throw Error("reduce: y must keep x's rank");
    size_t temp_at = 0;
    if (in_f32(x.type)) x = widen(ins, x, plain(x), temp_at);
    const bool narrow = in_f32(y_given.type);
    const Ref y = narrow ? f32_stand_in(y_given, temp_at) : y_given;
    // Reduced axes all innermost (y = x's leading dims, then 1s): done by inner_reduce.
    size_t lead = 0;
    while (lead < x.dims.size() && y.dims[lead] == x.dims[lead]) ++lead;
    bool inner = x.type == dt::f32 && lead < x.dims.size();
    int64_t rows = 1, n = 1;
    for (size_t k = 0; k < x.dims.size(); ++k) {
      if (k < lead) rows *= x.dims[k];
      else if (y.dims[k] != 1) inner = false;
      else n *= x.dims[k];
    }
    if (inner && n > 0) {
      Step s;
      arg(s, DNNL_ARG_SRC, x, plain(x));
      arg(s, DNNL_ARG_DST, y, plain(y));
      s.rows = rows;
      s.inner_len = n;
      s.reduce = code;
      ins.steps.push_back(std::move(s));
    } else {
      auto pd = dnnl::reduction::primitive_desc(eng, red_alg(code), plain(x), plain(y), 0.f,
                                                0.f, attr());
      push_plain<dnnl::reduction>(ins, pd, x, y);
    }
    if (narrow) narrow_into(ins, y, y_given, plain(y_given));
  }

  // x [rows, C], scale [C], shift [C], y [rows, C]; mean and variance computed per row.
  void add_layer_norm(Reader& rd, Instr& ins) {
    Ref x = rd.ref(), scale = rd.ref(), shift = rd.ref(), y = rd.ref();
    float epsilon = rd.nextf();
    if (x.dims.size() != 2 || scale.dims != memory::dims{x.dims[1]} ||
        shift.dims != scale.dims || y.dims != x.dims)
      throw Error("layer_norm: expected x [rows, C], scale [C], shift [C], y [rows, C]");
    size_t temp_at = 0;
    if (in_f32(x.type)) x = widen(ins, x, plain(x), temp_at);
    bool narrow = in_f32(y.type);
    Ref out = narrow ? f32_stand_in(y, temp_at) : y;
    auto pd = dnnl::layer_normalization_forward::primitive_desc(
        eng, prop_kind::forward_inference, plain(x), plain(out), epsilon,
        dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift, attr());
    Step s;
    arg(s, DNNL_ARG_SRC, x, plain(x));
    small_arg(ins, s, DNNL_ARG_SCALE, scale, plain(scale), temp_at);
    small_arg(ins, s, DNNL_ARG_SHIFT, shift, plain(shift), temp_at);
    arg(s, DNNL_ARG_DST, out, plain(out));
    push<dnnl::layer_normalization_forward>(ins, s, pd);
    if (narrow) narrow_into(ins, out, y, plain(y));
  }

  void add_concat(Reader& rd, Instr& ins) {
    int64_t axis = rd.next(), n = rd.next();
    if (n < 1 || n > 4096) throw Error("bad concat input count");
    std::vector<Ref> xs;
    std::vector<memory::desc> mds;
    for (int64_t k = 0; k < n; ++k) {
      xs.push_back(rd.ref());
      mds.push_back(plain(xs.back()));
    }
    Ref y = rd.ref();
    memory::desc y_md = plain(y);
    if (in_f32(y.type)) {  // (its concat is reference code there: moved as byte pairs)
      for (int64_t k = 0; k < n; ++k) mds[k] = byte_pairs(mds[k]);
      y_md = byte_pairs(y_md);
    }
    auto pd = dnnl::concat::primitive_desc(eng, y_md, (int)axis, mds, attr());
    Step s;
    for (int64_t k = 0; k < n; ++k) arg(s, DNNL_ARG_MULTIPLE_SRC + (int)k, xs[k], mds[k]);
    arg(s, DNNL_ARG_DST, y, y_md);
    push<dnnl::concat>(ins, s, pd);
  }

  // A plain 16-bit tensor's bytes as u8 [dims..., 2]: data movement of a 16-bit dtype
  // oneDNN has no kernels for (in_f32) on its fast u8 reorders and concat, element for
  // element the same bytes.
  static memory::desc byte_pairs(const memory::desc& md) {
    memory::dims dims = md.get_dims(), strides = md.get_strides();
    for (auto& st : strides) st *= 2;
    dims.push_back(2);
    strides.push_back(1);
    return memory::desc(dims, dt::u8, strides);
  }

  // y = x.transpose(perm): read x through permuted strides, write y densely.
  void add_transpose(Reader& rd, Instr& ins) {
    Ref x = rd.ref(), y = rd.ref();
    memory::dims perm = rd.ints((int64_t)y.dims.size());
    size_t r = x.dims.size();
    if (perm.size() != r) throw Error("transpose: perm does not match the rank");
    memory::dims xs(r), sd(r), ss(r);
    int64_t s = 1;
    for (size_t k = r; k-- > 0;) {
      xs[k] = s;
      s *= x.dims[k];
    }
    for (size_t k = 0; k < r; ++k) {
      if (perm[k] < 0 || perm[k] >= (int64_t)r) throw Error("transpose: bad perm");
      sd[k] = x.dims[perm[k]];
      ss[k] = xs[perm[k]];
    }
    memory::desc src(sd, x.type, ss);
    reorder_step(ins, x, src, y, plain(y));
  }

  void add_reorder(Reader& rd, Instr& ins) {
    Ref x = rd.ref(), y = rd.ref();
    reorder_step(ins, x, plain(x), y, plain(y));
  }

  void reorder_step(Instr& ins, const Ref& x, const memory::desc& xmd, const Ref& y,
                    const memory::desc& ymd) {
    Step s;
    arg(s, DNNL_ARG_FROM, x, xmd);
    arg(s, DNNL_ARG_TO, y, ymd);
    if (convert_loop(ins, s, xmd, ymd)) return;
    if (x.type == y.type && in_f32(x.type) && xmd.get_inner_nblks() == 0 &&
        ymd.get_inner_nblks() == 0) {
      Step pairs;
      arg(pairs, DNNL_ARG_FROM, x, byte_pairs(xmd));
      arg(pairs, DNNL_ARG_TO, y, byte_pairs(ymd));
      return push<dnnl::reorder>(
          ins, pairs, dnnl::reorder::primitive_desc(eng, byte_pairs(xmd), eng, byte_pairs(ymd),
                                                    attr()));
    }
    push<dnnl::reorder>(ins, s, dnnl::reorder::primitive_desc(eng, xmd, eng, ymd, attr()));
  }

  // --- loops of our own (engine_loops.cc) ------------------------------------------------------

  // `r` as raw bytes for a loop step (loops read the data handle, nothing else).
  void byte_arg(Step& s, const Ref& r) {
    int64_t n = (int64_t)memory::data_type_size(r.type);
    for (auto d : r.dims) n *= d;
    arg(s, (int)s.args.size(), r, memory::desc({std::max<int64_t>(n, 1)}, dt::u8, tag::a));
  }

  void push_loop(Instr& ins, Step& s, const char* name,
                 std::function<void(const Step&, int)> loop) {
    s.loop = std::move(loop);
    s.loop_name = name;
    ins.steps.push_back(std::move(s));
  }

  static int64_t count(const Ref& r) {
    int64_t n = 1;
    for (auto d : r.dims) n *= d;
    return n;
  }

  // cond (bool), a, b (padded to y's rank, any may broadcast) -> y: cond ? a : b.
  void add_select(Reader& rd, Instr& ins) {
    Ref c = rd.ref(), A = rd.ref(), B = rd.ref(), y = rd.ref();
    if (A.type != B.type || A.type != y.type || c.type != dt::u8)
      throw Error("select: bad dtypes");
    Broadcast b(y.dims, {c.dims, A.dims, B.dims});
    size_t size = memory::data_type_size(y.type);
    if (size != 1 && size != 2 && size != 4 && size != 8) throw Error("select: bad element size");
    Step s;
    for (const Ref* r : {&c, &A, &B, &y}) byte_arg(s, *r);
    auto loop = [b, size](const Step& st, int threads) {
      const uint8_t* cond = data<const uint8_t>(st, 0);
      const char* pa = data<const char>(st, 1);
      const char* pb = data<const char>(st, 2);
      char* py = data<char>(st, 3);
      const int64_t sc = b.strides[0].back(), sa = b.strides[1].back(),
                    sb = b.strides[2].back(), n = b.inner;
#pragma omp parallel for num_threads(threads) if (threads > 1)
      for (int64_t row = 0; row < b.rows; ++row) {
        const uint8_t* cr = cond + b.offset(0, row);
        const char* ar = pa + b.offset(1, row) * size;
        const char* br = pb + b.offset(2, row) * size;
        char* yr = py + row * n * size;
        auto pick = [&](auto tag) {
          using T = decltype(tag);
          const T* a = reinterpret_cast<const T*>(ar);
          const T* bb = reinterpret_cast<const T*>(br);
          T* o = reinterpret_cast<T*>(yr);
          if (sc == 1 && sa == 1 && sb == 0) {  // attention's mask: a row against a constant
            const T other = bb[0];
            for (int64_t j = 0; j < n; ++j) o[j] = cr[j] ? a[j] : other;
          } else if (sc == 1 && sa == 1 && sb == 1) {
            for (int64_t j = 0; j < n; ++j) o[j] = cr[j] ? a[j] : bb[j];
          } else {
            for (int64_t j = 0; j < n; ++j) o[j] = cr[j * sc] ? a[j * sa] : bb[j * sb];
          }
        };
        if (size == 8) pick(uint64_t());
        else if (size == 4) pick(uint32_t());
        else if (size == 2) pick(uint16_t());
        else pick(uint8_t());
      }
    };
    push_loop(ins, s, "neuronish:select", loop);
  }

  // params, indices (int32 or int64) -> y: y[b, o, j, i] = params[b, o, indices[b, j], i],
  // with `batch` = the params dims before batch_dims (1 without), `outer` those from there
  // to the axis, `inner` elements after it. An index out of [0, dim) stops the run with an
  // error (as TF's CPU kernel and the reference engine).
  void add_gather(Reader& rd, Instr& ins) {
    int64_t batch = rd.next(), outer = rd.next(), dim = rd.next(), inner_elems = rd.next();
    Ref p = rd.ref(), idx = rd.ref(), y = rd.ref();
    if (idx.type != dt::s32 && idx.type != dt::f64)  // (f64: int64, see to_dt)
      throw Error("gather: indices must be int32 or int64");
    bool wide = idx.type == dt::f64;
    int64_t n_all = count(idx), n_idx = batch > 0 ? n_all / batch : 0;
    int64_t row = inner_elems * (int64_t)memory::data_type_size(p.type);
    if (batch < 1 || n_idx * batch != n_all || batch * outer * dim * inner_elems != count(p) ||
        batch * outer * n_idx * inner_elems != count(y))
      throw Error("gather: shapes do not agree");
    Step s;
    for (const Ref* r : {&p, &idx, &y}) byte_arg(s, *r);
    memory::dims pdims = p.dims;
    push_loop(ins, s, "neuronish:gather", [=](const Step& st, int threads) {
      const char* src = data<const char>(st, 0);
      const void* raw = data<const void>(st, 1);
      auto ix = [raw, wide](int64_t j) -> int64_t {
        return wide ? static_cast<const int64_t*>(raw)[j] : static_cast<const int32_t*>(raw)[j];
      };
      char* dst = data<char>(st, 2);
      for (int64_t j = 0; j < n_all; ++j)
        if (ix(j) < 0 || ix(j) >= dim) {
          std::string shape;
          for (auto d : pdims) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
          throw Error("gather index " + std::to_string(ix(j)) + " is out of range [0, " +
                      std::to_string(dim) + ") for the gathered axis of params with shape [" +
                      shape + "]");
        }
#pragma omp parallel for collapse(3) num_threads(threads) if (threads > 1)
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t j = 0; j < n_idx; ++j)
            std::memcpy(dst + ((b * outer + o) * n_idx + j) * row,
                        src + ((b * outer + o) * dim + ix(b * n_idx + j)) * row, row);
    });
  }

  // y (dense, dims D) = x read at byte offset `start` with element strides S (any sign, 0
  // to repeat): strided_slice, broadcast_to, tile. Also pad's interior copy.
  struct Strided {
    std::vector<int64_t> dims, strides;  // per y dim; strides in x elements
    int64_t start = 0;                   // x elements
  };

  static void strided_copy(const char* x, char* y, const Strided& t, size_t size, int threads,
                           const std::vector<int64_t>& y_strides) {
    size_t r = t.dims.size();
    int64_t rows = 1, n = r ? t.dims[r - 1] : 1, sx = r ? t.strides[r - 1] : 1;
    for (size_t k = 0; k + 1 < r; ++k) rows *= t.dims[k];
    int64_t sy = r ? y_strides[r - 1] : 1;
#pragma omp parallel for num_threads(threads) if (threads > 1)
    for (int64_t row = 0; row < rows; ++row) {
      int64_t xo = t.start, yo = 0, rest = row;
      for (size_t k = r - 1; k-- > 0;) {
        int64_t i = rest % t.dims[k];
        rest /= t.dims[k];
        xo += i * t.strides[k];
        yo += i * y_strides[k];
      }
      const char* xs = x + xo * (int64_t)size;
      char* ys = y + yo * (int64_t)size;
      if (sx == 1 && sy == 1) {
        std::memcpy(ys, xs, n * size);
      } else if (size == 4) {  // (typed: a memcpy call per element is ~2.5 ns)
        strided_elements<uint32_t>(xs, ys, n, sx, sy);
      } else if (size == 2) {
        strided_elements<uint16_t>(xs, ys, n, sx, sy);
      } else if (size == 1) {
        strided_elements<uint8_t>(xs, ys, n, sx, sy);
      } else if (size == 8) {
        strided_elements<uint64_t>(xs, ys, n, sx, sy);
      } else {
        for (int64_t j = 0; j < n; ++j)
          std::memcpy(ys + j * sy * (int64_t)size, xs + j * sx * (int64_t)size, size);
      }
    }
  }

  // n elements of T, x's every sx-th to y's every sy-th (byte-aligned: memcpy per element).
  template <class T>
  static void strided_elements(const char* x, char* y, int64_t n, int64_t sx, int64_t sy) {
    for (int64_t j = 0; j < n; ++j) {
      T v;
      std::memcpy(&v, x + j * sx * int64_t(sizeof(T)), sizeof(T));
      std::memcpy(y + j * sy * int64_t(sizeof(T)), &v, sizeof(T));
    }
  }

  static std::vector<int64_t> dense_strides(const std::vector<int64_t>& dims) {
    std::vector<int64_t> st(dims.size());
    int64_t s = 1;
    for (size_t k = dims.size(); k-- > 0;) {
      st[k] = s;
      s *= dims[k];
    }
    return st;
  }

  Strided read_strided(Reader& rd, size_t rank) {
    Strided t;
    t.start = rd.next();
    for (size_t k = 0; k < rank; ++k) {
      t.dims.push_back(rd.next());
      t.strides.push_back(rd.next());
    }
    return t;
  }

  // x, y, then start and (dim, stride) per y dim of a view of x (up to 12 dims: tile
  // doubles the rank).
  void add_strided_copy(Reader& rd, Instr& ins) {
    Ref x = rd.ref(), y = rd.ref();
    int64_t rank = rd.next();
    if (rank < 1 || rank > 12 || x.type != y.type) throw Error("strided copy: bad spec");
    Strided t = read_strided(rd, (size_t)rank);
    int64_t n = 1, lo = t.start, hi = t.start;
    for (int64_t k = 0; k < rank; ++k) {
      n *= t.dims[k];
      (t.strides[k] < 0 ? lo : hi) += (t.dims[k] - 1) * t.strides[k];
    }
    if (n != count(y) || lo < 0 || hi >= count(x)) throw Error("strided copy: out of x");
    size_t size = memory::data_type_size(x.type);
    Step s;
    byte_arg(s, x);
    byte_arg(s, y);
    std::vector<int64_t> ys = dense_strides(t.dims);
    push_loop(ins, s, "neuronish:strided_copy", [t, size, ys](const Step& st, int threads) {
      strided_copy(data<const char>(st, 0), data<char>(st, 1), t, size, threads, ys);
    });
  }

  // Constant padding: x, y, the fill value's bytes (as an int64), then per dim `before`.
  void add_pad(Reader& rd, Instr& ins) {
    Ref x = rd.ref(), y = rd.ref();
    int64_t fill = rd.next();
    size_t r = y.dims.size(), size = memory::data_type_size(y.type);
    if (x.dims.size() != r || x.type != y.type) throw Error("pad: bad spec");
    std::vector<int64_t> before = rd.ints((int64_t)r);
    std::vector<int64_t> yst = dense_strides(y.dims);
    Strided t;  // x dense, written into y's interior
    t.dims = x.dims;
    t.strides = dense_strides(x.dims);
    int64_t y_start = 0;
    for (size_t k = 0; k < r; ++k) y_start += before[k] * yst[k];
    int64_t total = count(y);
    Step s;
    byte_arg(s, x);
    byte_arg(s, y);
    push_loop(ins, s, "neuronish:pad", [=](const Step& st, int threads) {
      char* py = data<char>(st, 1);
      fill_elements(py, total, fill, size, threads);
      strided_copy(data<const char>(st, 0), py + y_start * (int64_t)size, t, size, threads,
                   yst);
    });
  }

  // y[0, total) = the `size`-byte value in fill's low bytes. A memcpy per element (a call:
  // `size` is not a constant) took 2.6 ns an element, 18.9 ms of ResNet50V2's int8 call
  // for its stem pool's pad; memset and typed fills run at memory speed.
  static void fill_elements(char* y, int64_t total, int64_t fill, size_t size, int threads) {
    const int64_t bytes = total * int64_t(size), chunk = int64_t(1) << 20;
    const bool zero = (uint64_t(fill) & (size >= 8 ? ~0ull : (1ull << (8 * size)) - 1)) == 0;
    const int64_t chunks = (bytes + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) if (threads > 1 && chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t from = c * chunk / int64_t(size), to = std::min(total, (c + 1) * chunk / int64_t(size));
      if (zero || size == 1) {
        std::memset(y + from * int64_t(size), int(fill & 0xff), size_t(to - from) * size);
      } else if (size == 2) {
        std::fill(reinterpret_cast<uint16_t*>(y) + from, reinterpret_cast<uint16_t*>(y) + to,
                  uint16_t(fill));
      } else if (size == 4) {
        std::fill(reinterpret_cast<uint32_t*>(y) + from, reinterpret_cast<uint32_t*>(y) + to,
                  uint32_t(fill));
      } else if (size == 8) {
        std::fill(reinterpret_cast<uint64_t*>(y) + from, reinterpret_cast<uint64_t*>(y) + to,
                  uint64_t(fill));
      } else {
        for (int64_t i = from; i < to; ++i) std::memcpy(y + i * int64_t(size), &fill, size);
      }
    }
  }

  // Attention's masked softmax over the last axis of x (float32 or bfloat16, computed in
  // float32 and rounded once), the mask (bool, x's rank) broadcasting to it: one pass over
  // the scores where select, softmax and select took three (exp_poly, masked_softmax_row).
  void add_masked_softmax(Reader& rd, Instr& ins) {
    Ref x = rd.ref(), mask = rd.ref(), y = rd.ref();
    float fill = rd.nextf(), masked = rd.nextf();
    if ((x.type != dt::f32 && x.type != dt::bf16) || y.type != x.type || y.dims != x.dims ||
        mask.type != dt::u8 || x.dims.empty())
      throw Error("masked_softmax: bad spec");
    Broadcast b(x.dims, {mask.dims});
    bool wide = x.type == dt::f32;
    MaskedSoftmaxKernels k = masked_softmax_kernels();
    Step s;
    for (const Ref* r : {&x, &mask, &y}) byte_arg(s, *r);
    push_loop(ins, s, "neuronish:masked_softmax", [=](const Step& st, int threads) {
      const char* px = data<const char>(st, 0);
      const uint8_t* pm = data<const uint8_t>(st, 1);
      char* py = data<char>(st, 2);
      const int64_t n = b.inner, ms = b.strides[0].back();
#pragma omp parallel num_threads(threads) if (threads > 1)
      {
        // per thread: the row's mask (when it broadcasts along the row) and float32 rows
        std::vector<uint8_t> mrow(ms == 1 ? 0 : n);
        std::vector<float> xf(wide ? 0 : n), yf(wide ? 0 : n);
#pragma omp for
        for (int64_t row = 0; row < b.rows; ++row) {
          const uint8_t* m = pm + b.offset(0, row);
          if (ms != 1) {
            std::fill(mrow.begin(), mrow.end(), m[0]);
            m = mrow.data();
          }
          if (wide) {
            k.row(reinterpret_cast<const float*>(px) + row * n, m,
                  reinterpret_cast<float*>(py) + row * n, n, fill, masked);
          } else {
            k.widen(reinterpret_cast<const uint16_t*>(px) + row * n, xf.data(), n);
            k.row(xf.data(), m, yf.data(), n, fill, masked);
            k.narrow(yf.data(), reinterpret_cast<uint16_t*>(py) + row * n, n);
          }
        }
      }
    });
  }

  // --- Loops for the remaining kinds (argminmax, cumulative, one_hot, top_k, mirror pad,
  // resize): each computes what TF's CPU kernel computes, in its order, so the results are
  // bit-exact (no float math beyond TF's own: scans run sequentially, resize's coordinates
  // and weights come precomputed from spec.py). int64 tensors travel as 8-byte elements.

  // x [outer, n, inner] (any dtype; bool as 0/1) -> y [outer, inner] (int32 or int64): the
  // index of the first maximum (minimum) along n. A NaN wins at its first position (numpy's
  // argmax, which the reference engine runs).
  void add_argminmax(Reader& rd, Instr& ins) {
    int64_t is_min = rd.next(), outer = rd.next(), n = rd.next(), inner = rd.next();
    Ref x = rd.ref(), y = rd.ref();
    if (outer * n * inner != count(x) || outer * inner != count(y) || n < 1 ||
        (y.code != D_S32 && y.code != D_S64))
      throw Error("argminmax: bad spec");
    bool wide = y.code == D_S64;
    Step s;
    byte_arg(s, x);
    byte_arg(s, y);
    with_type(x.code, [&](auto tag) {
      using T = decltype(tag);
      push_loop(ins, s, "neuronish:argminmax", [=](const Step& st, int threads) {
        argminmax_run<T>(st, threads, is_min != 0, outer, n, inner, wide);
      });
    });
  }

  // One block of `inner` columns: x rows [n, inner] swept row by row (contiguous reads that
  // vectorize) keeping each column's extreme so far; a NaN, once seen, stays.
  template <class T>
  static void argminmax_run(const Step& st, int threads, bool is_min, int64_t outer,
                            int64_t n, int64_t inner, bool wide) {
    using C = typename Num<T>::C;
    const T* px = data<const T>(st, 0);
    if (inner == 1 && n <= 64) {  // short rows: one scalar scan each
#pragma omp parallel for num_threads(threads) if (threads > 1)
      for (int64_t o = 0; o < outer; ++o) {
        const T* a = px + o * n;
        C best = Num<T>::get(a[0]);
        int64_t at = 0;
        for (int64_t j = 1; j < n && best == best; ++j) {
          C v = Num<T>::get(a[j]);
          if (v != v || (is_min ? v < best : v > best)) {
            best = v;
            at = j;
          }
        }
        n_done(st, o, at, wide);
      }
      return;
    }
    if (inner == 1) {
      // A contiguous row, in blocks: each block's extreme by a vectorized pass (its NaNs
      // counted apart), the row's first extreme from the first block holding it; only that
      // block is scanned for the position. A NaN wins at its first position.
      const int64_t bs = 4096, sub = 256;
#pragma omp parallel for num_threads(threads) if (threads > 1)
      for (int64_t o = 0; o < outer; ++o) {
        const T* a = px + o * n;
        C m = Num<T>::get(a[0]);
        int64_t from = 0, at = -1;
        for (int64_t j0 = 0; j0 < n; j0 += bs) {
          const int64_t len = std::min(bs, n - j0);
          const T* blk = a + j0;
          C bm = Num<T>::get(blk[0]);
          int nan = 0;
          if constexpr (std::is_same<T, float>::value) {
            bm = block_extreme_f32(blk, len, is_min, &nan);
          } else if (is_min) {
#pragma omp simd reduction(min : bm) reduction(+ : nan)
            for (int64_t k = 0; k < len; ++k) {
              C v = Num<T>::get(blk[k]);
              bm = v < bm ? v : bm;
              nan += v != v;
            }
          } else {
#pragma omp simd reduction(max : bm) reduction(+ : nan)
            for (int64_t k = 0; k < len; ++k) {
              C v = Num<T>::get(blk[k]);
              bm = v > bm ? v : bm;
              nan += v != v;
            }
          }
          if (nan) {
            at = j0;
            while (Num<T>::get(a[at]) == Num<T>::get(a[at])) ++at;
            break;
          }
          if (is_min ? bm < m : bm > m) {
            m = bm;
            from = j0;
          }
        }
        if (at < 0) {  // the first sub-block of the winning block that holds m, then in it
          at = from;
          if constexpr (std::is_same<T, float>::value) {
            for (int64_t j0 = from; j0 < std::min(from + bs, n); j0 += sub) {
              int nan = 0;
              if (block_extreme_f32(a + j0, std::min(sub, n - j0), is_min, &nan) == m) {
                at = j0;
                break;
              }
            }
          }
          while (Num<T>::get(a[at]) != m) ++at;
        }
        n_done(st, o, at, wide);
      }
      return;
    }
    const int64_t block = 512;
    const int64_t blocks = (inner + block - 1) / block;
#pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t bi = 0; bi < blocks; ++bi) {
        const int64_t i0 = bi * block, len = std::min(block, inner - i0);
        C best[block];
        int32_t at[block];
        const T* a = px + o * n * inner + i0;
        for (int64_t i = 0; i < len; ++i) {
          best[i] = Num<T>::get(a[i]);
          at[i] = 0;
        }
        if constexpr (std::is_same<T, float>::value) {
          column_extremes_f32(a, n, inner, len, is_min, best, at);
          for (int64_t i = 0; i < len; ++i) n_done(st, o * inner + i0 + i, at[i], wide);
          continue;
        }
        for (int64_t j = 1; j < n; ++j) {
          const T* row = a + j * inner;
#pragma omp simd
          for (int64_t i = 0; i < len; ++i) {
            C v = Num<T>::get(row[i]), b = best[i];
            bool take = b == b && (v != v || (is_min ? v < b : v > b));
            best[i] = take ? v : b;
            at[i] = take ? (int32_t)j : at[i];
          }
        }
        for (int64_t i = 0; i < len; ++i) n_done(st, o * inner + i0 + i, at[i], wide);
      }
  }

  static void n_done(const Step& st, int64_t k, int64_t at, bool wide) {  // y[k] = at
    if (wide) data<int64_t>(st, 1)[k] = at;
    else data<int32_t>(st, 1)[k] = (int32_t)at;
  }

  // x [outer, n, inner] -> y, same shape: the running sum (product) along n, sequential as
  // TF's scan; exclusive leaves each element out, reverse runs from the end. Any dtype but
  // bool: each step rounds to the dtype (numpy's cumsum with dtype=x's), integers wrap.
  void add_cumulative(Reader& rd, Instr& ins) {
    int64_t prod = rd.next(), exclusive = rd.next(), reverse = rd.next();
    int64_t outer = rd.next(), n = rd.next(), inner = rd.next();
    Ref x = rd.ref(), y = rd.ref();
    if (x.code == D_BOOL || y.code != x.code || outer * n * inner != count(x) ||
        count(y) != count(x))
      throw Error("cumulative: bad spec");
    Step s;
    byte_arg(s, x);
    byte_arg(s, y);
    with_type(x.code, [&](auto tag) {
      using T = decltype(tag);
      push_loop(ins, s, "neuronish:cumulative", [=](const Step& st, int threads) {
        using C = typename Num<T>::C;
        const T* px = data<const T>(st, 0);
        T* py = data<T>(st, 1);
        auto step = [prod](C acc, C v) -> C {
          if constexpr (is_real<T>()) return prod ? acc * v : acc + v;
          else return prod ? wrap_mul<T>(acc, v) : wrap_add<T>(acc, v);
        };
#pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1)
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t i = 0; i < inner; ++i) {
            T acc = Num<T>::put(prod ? C(1) : C(0));
            for (int64_t t = 0; t < n; ++t) {
              int64_t j = reverse ? n - 1 - t : t;
              int64_t at = (o * n + j) * inner + i;
              T v = px[at];
              if (exclusive) py[at] = acc;
              acc = Num<T>::put(step(Num<T>::get(acc), Num<T>::get(v)));
              if (!exclusive) py[at] = acc;
            }
          }
      });
    });
  }

  static int64_t index_at(const char* p, int64_t code, int64_t k) {  // an integer, widened
    switch (code) {
      case D_S64: return reinterpret_cast<const int64_t*>(p)[k];
      case D_S32: return reinterpret_cast<const int32_t*>(p)[k];
      case D_S16: return reinterpret_cast<const int16_t*>(p)[k];
      case D_S8: return reinterpret_cast<const int8_t*>(p)[k];
      default: return reinterpret_cast<const uint8_t*>(p)[k];
    }
  }

  // indices [outer, inner] (any integer dtype) -> y [outer, depth, inner]: on where the index
  // is d, off elsewhere (an index outside [0, depth) gives an all-off row). on and off
  // are the values' bytes, as int64s.
  void add_one_hot(Reader& rd, Instr& ins) {
    int64_t outer = rd.next(), depth = rd.next(), inner = rd.next();
    int64_t on = rd.next(), off = rd.next();
    Ref idx = rd.ref(), y = rd.ref();
    size_t size = memory::data_type_size(y.type);
    int64_t icode = idx.code;
    if ((icode != D_S8 && icode != D_U8 && icode != D_S16 && icode != D_S32 && icode != D_S64) ||
        outer * inner != count(idx) ||
        outer * depth * inner != count(y) || (size != 1 && size != 2 && size != 4 && size != 8))
      throw Error("one_hot: bad spec");
    Step s;
    byte_arg(s, idx);
    byte_arg(s, y);
    push_loop(ins, s, "neuronish:one_hot", [=](const Step& st, int threads) {
      const char* pi = data<const char>(st, 0);
      char* py = data<char>(st, 1);
      auto fill = [&](auto tag) {  // every element off, then the indexed ones on
        using T = decltype(tag);
        T off_v, on_v;
        std::memcpy(&off_v, &off, sizeof(T));
        std::memcpy(&on_v, &on, sizeof(T));
        T* out = reinterpret_cast<T*>(py);
#pragma omp parallel for num_threads(threads) if (threads > 1)
        for (int64_t o = 0; o < outer; ++o) {
          T* row = out + o * depth * inner;
          for (int64_t e = 0; e < depth * inner; ++e) row[e] = off_v;
          for (int64_t i = 0; i < inner; ++i) {
            int64_t k = o * inner + i;
            int64_t v = index_at(pi, icode, k);
            if (v >= 0 && v < depth) row[v * inner + i] = on_v;
          }
        }
      };
      if (size == 8) fill(uint64_t());
      else if (size == 4) fill(uint32_t());
      else if (size == 2) fill(uint16_t());
      else fill(uint8_t());
    });
  }

  // x [rows, n] (float32 or int32) -> y [rows, k]: the k largest values in descending
  // order, equal values in index order (TF's TopKV2, sorted); or their indices (int32 or
  // int64) when `indices`. A NaN counts as the largest (the reference engine's order).
  void add_top_k(Reader& rd, Instr& ins) {
    int64_t want_indices = rd.next(), rows = rd.next(), n = rd.next(), k = rd.next();
    Ref x = rd.ref(), y = rd.ref();
    if (x.code == D_BOOL || rows * n != count(x) || rows * k != count(y) || k > n)
      throw Error("top_k: bad spec");
    bool wide = memory::data_type_size(y.type) == 8;
    Step s;
    byte_arg(s, x);
    byte_arg(s, y);
    with_type(x.code, [&](auto tag) {
      using T = decltype(tag);
      push_loop(ins, s, "neuronish:top_k", [=](const Step& st, int threads) {
        using C = typename Num<T>::C;
        const T* px = data<const T>(st, 0);
#pragma omp parallel for num_threads(threads) if (threads > 1)
        for (int64_t r = 0; r < rows; ++r) {
          const T* a = px + r * n;
          std::vector<int64_t> order(n);
          for (int64_t j = 0; j < n; ++j) order[j] = j;
          auto before = [a](int64_t p, int64_t q) {
            C u = Num<T>::get(a[p]), v = Num<T>::get(a[q]);
            bool un = u != u, vn = v != v;
            if (un || vn) return un && (!vn || p < q);
            return u > v || (u == v && p < q);
          };
          std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
          for (int64_t j = 0; j < k; ++j) {
            int64_t at = r * k + j;
            if (!want_indices) data<T>(st, 1)[at] = a[order[j]];
            else if (wide) data<int64_t>(st, 1)[at] = order[j];
            else data<int32_t>(st, 1)[at] = (int32_t)order[j];
          }
        }
      });
    });
  }

  // TF MirrorPad: x, y (same rank and dtype), `reflect` (1: REFLECT, the edge not
  // repeated; 0: SYMMETRIC), then per dim `before`. Each y coordinate reads the x
  // coordinate its mirror image falls on.
  void add_mirror_pad(Reader& rd, Instr& ins) {
    int64_t reflect = rd.next();
    Ref x = rd.ref(), y = rd.ref();
    size_t r = y.dims.size(), size = memory::data_type_size(y.type);
    if (x.dims.size() != r || x.type != y.type) throw Error("mirror pad: bad spec");
    std::vector<int64_t> before = rd.ints((int64_t)r);
    std::vector<std::vector<int64_t>> src(r);  // per dim: y coordinate -> x coordinate
    for (size_t k = 0; k < r; ++k) {
      int64_t d = x.dims[k];
      for (int64_t c = 0; c < y.dims[k]; ++c) {
        int64_t v = c - before[k];
        if (v < 0) v = reflect ? -v : -v - 1;
        if (v >= d) v = reflect ? 2 * (d - 1) - v : 2 * d - 1 - v;
        if (v < 0 || v >= d) throw Error("mirror pad: paddings too large for x");
        src[k].push_back(v);
      }
    }
    std::vector<int64_t> xst = dense_strides(x.dims);
    int64_t rows = count(y) / y.dims[r - 1], n = y.dims[r - 1];
    int64_t lead = before[r - 1], d_last = x.dims[r - 1];
    Step s;
    byte_arg(s, x);
    byte_arg(s, y);
    push_loop(ins, s, "neuronish:mirror_pad", [=](const Step& st, int threads) {
      const char* px = data<const char>(st, 0);
      char* py = data<char>(st, 1);
      const std::vector<int64_t>& last = src[r - 1];
#pragma omp parallel for num_threads(threads) if (threads > 1)
      for (int64_t row = 0; row < rows; ++row) {
        int64_t xo = 0, rest = row;
        for (size_t k = r - 1; k-- > 0;) {
          xo += src[k][rest % y.dims[k]] * xst[k];
          rest /= y.dims[k];
        }
        char* out = py + row * n * (int64_t)size;
        // the interior of the last dim is x's row as it is: one copy; the edges mirrored
        std::memcpy(out + lead * (int64_t)size, px + xo * (int64_t)size, d_last * size);
        for (int64_t j = 0; j < n; ++j) {
          if (j == lead) j += d_last;
          if (j >= n) break;
          std::memcpy(out + j * (int64_t)size, px + (xo + last[j]) * (int64_t)size, size);
        }
      }
    });
  }

  // resize of x [N, H, W, C] to y [N, OH, OW, C]; `bilinear` (float32: the lower and upper
  // source row and column, and the float lerps, as spec.py computes them after TF) or
  // nearest (any element size: one source row and column per output one).
  void add_resize(Reader& rd, Instr& ins) {
    int64_t bilinear = rd.next();
    Ref x = rd.ref(), y = rd.ref();
    if (x.dims.size() != 4 || y.dims.size() != 4 || x.dims[0] != y.dims[0] ||
        x.dims[3] != y.dims[3] || (bilinear && (x.code == D_BOOL || y.code != D_F32)) ||
        (!bilinear && x.type != y.type))
      throw Error("resize: bad spec");
    int64_t N = x.dims[0], H = x.dims[1], W = x.dims[2], C = x.dims[3];
    int64_t OH = y.dims[1], OW = y.dims[2];
    std::vector<int64_t> ylo = rd.ints(OH), xlo = rd.ints(OW), yhi, xhi;
    std::vector<float> yl, xl;
    if (bilinear) {
      yhi = rd.ints(OH);
      xhi = rd.ints(OW);
      for (int64_t k = 0; k < OH; ++k) yl.push_back(rd.nextf());
      for (int64_t k = 0; k < OW; ++k) xl.push_back(rd.nextf());
    }
    auto in_range = [](const std::vector<int64_t>& v, int64_t hi) {
      for (auto i : v)
        if (i < 0 || i >= hi) return false;
      return true;
    };
    if (!in_range(ylo, H) || !in_range(xlo, W) || !in_range(yhi, H) || !in_range(xhi, W))
      throw Error("resize: a source coordinate is out of the image");
    size_t size = memory::data_type_size(x.type);
    Step s;
    byte_arg(s, x);
    byte_arg(s, y);
    if (bilinear && x.code != D_F32) {  // any other input: read as float32, as the reference
      with_type(x.code, [&](auto tag) {
        using T = decltype(tag);
        push_loop(ins, s, "neuronish:resize", [=](const Step& st, int threads) {
          const T* px = data<const T>(st, 0);
          float* py = data<float>(st, 1);
          auto at = [px](int64_t i) { return (float)Num<T>::get(px[i]); };
#pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1)
          for (int64_t b = 0; b < N; ++b)
            for (int64_t oy = 0; oy < OH; ++oy) {
              const int64_t top = (b * H + ylo[oy]) * W * C, bot = (b * H + yhi[oy]) * W * C;
              float* o = py + (b * OH + oy) * OW * C;
              for (int64_t ox = 0; ox < OW; ++ox)
                for (int64_t c = 0; c < C; ++c) {
                  float tl = at(top + xlo[ox] * C + c), tr = at(top + xhi[ox] * C + c);
                  float bl = at(bot + xlo[ox] * C + c), br = at(bot + xhi[ox] * C + c);
                  float t = tl + (tr - tl) * xl[ox];
                  float u = bl + (br - bl) * xl[ox];
                  o[ox * C + c] = t + (u - t) * yl[oy];
                }
            }
        });
      });
      return;
    }
    push_loop(ins, s, "neuronish:resize", [=](const Step& st, int threads) {
      const char* px = data<const char>(st, 0);
      char* py = data<char>(st, 1);
      const int64_t row = C * (int64_t)size;
#pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1)
      for (int64_t b = 0; b < N; ++b)
        for (int64_t oy = 0; oy < OH; ++oy) {
          char* out = py + (b * OH + oy) * OW * row;
          if (!bilinear) {
            const char* in = px + (b * H + ylo[oy]) * W * row;
            for (int64_t ox = 0; ox < OW; ++ox)
              std::memcpy(out + ox * row, in + xlo[ox] * row, row);
            continue;
          }
          const float* top = reinterpret_cast<const float*>(px) + (b * H + ylo[oy]) * W * C;
          const float* bot = reinterpret_cast<const float*>(px) + (b * H + yhi[oy]) * W * C;
          float* o = reinterpret_cast<float*>(out);
          const float wy = yl[oy];
          for (int64_t ox = 0; ox < OW; ++ox) {
            const float wx = xl[ox];
            const float *tl = top + xlo[ox] * C, *tr = top + xhi[ox] * C;
            const float *bl = bot + xlo[ox] * C, *br = bot + xhi[ox] * C;
            for (int64_t c = 0; c < C; ++c) {
              float t = tl[c] + (tr[c] - tl[c]) * wx;
              float u = bl[c] + (br[c] - bl[c]) * wx;
              o[ox * C + c] = t + (u - t) * wy;
            }
          }
        }
    });
  }

  // 3-D convolution and pooling on NDHWC volumes: oneDNN's primitives (as conv2d and pool,
  // float32; the convolution without bias or post-ops, as the ISA's conv3d).
  static memory::desc ndhwc(const Ref& r) {
    if (r.dims.size() != 5 || r.type != dt::f32) throw Error("expected a float32 NDHWC volume");
    const auto& d = r.dims;
    return memory::desc({d[0], d[4], d[1], d[2], d[3]}, dt::f32, tag::ndhwc);
  }

  // x, w [KD, KH, KW, C, O] (TF layout; reordered now when constant), y; then strides,
  // dilations (3 each) and pads [front, back, top, bottom, left, right].
  void add_conv3d(Reader& rd, Instr& ins) {
    int64_t w_const = rd.next();
    Ref x = rd.ref(), w = rd.ref(), y = rd.ref();
    memory::dims strides = rd.ints(3), dil = rd.ints(3), pads = rd.ints(6);
    for (auto& d : dil) d -= 1;  // oneDNN counts dilation from 0
    if (w.dims.size() != 5 || w.type != dt::f32) throw Error("conv3d weights must be 5-D float32");
    memory::desc w_given({w.dims[4], w.dims[3], w.dims[0], w.dims[1], w.dims[2]}, dt::f32,
                         tag::dhwio);
    memory::desc x_md = ndhwc(x), y_md = ndhwc(y);
    auto pd = dnnl::convolution_forward::primitive_desc(
        eng, prop_kind::forward_inference, algorithm::convolution_direct, x_md,
        w_const ? memory::desc(w_given.get_dims(), dt::f32, tag::any) : w_given,
        memory::desc(), y_md, strides, dil, {pads[0], pads[2], pads[4]},
        {pads[1], pads[3], pads[5]}, attr());
    Step s;
    arg(s, DNNL_ARG_SRC, x, x_md);
    if (w_const) own_arg(s, DNNL_ARG_WEIGHTS, reorder_weights(w, w_given, pd.weights_desc()));
    else arg(s, DNNL_ARG_WEIGHTS, w, w_given);
    arg(s, DNNL_ARG_DST, y, y_md);
    push<dnnl::convolution_forward>(ins, s, pd);
  }

  // max or average (the count of non-padded elements) pooling: x, y, then ksize,
  // strides (3 each) and pads as conv3d's.
  void add_pool3d(Reader& rd, Instr& ins) {
    int64_t is_max = rd.next();
    Ref x = rd.ref(), y = rd.ref();
    memory::dims k = rd.ints(3), st = rd.ints(3), pads = rd.ints(6);
    memory::desc x_md = ndhwc(x), y_md = ndhwc(y);
    auto pd = dnnl::pooling_forward::primitive_desc(
        eng, prop_kind::forward_inference,
        is_max ? algorithm::pooling_max : algorithm::pooling_avg_exclude_padding, x_md, y_md,
        st, k, {0, 0, 0}, {pads[0], pads[2], pads[4]}, {pads[1], pads[3], pads[5]}, attr());
    Step s;
    arg(s, DNNL_ARG_SRC, x, x_md);
    arg(s, DNNL_ARG_DST, y, y_md);
    push<dnnl::pooling_forward>(ins, s, pd);
  }

  void finalize() {
    if (finalized) return;
    if (temp_bytes) temp = std::aligned_alloc(64, (temp_bytes + 63) / 64 * 64);
    if (scratch_bytes) scratch = std::aligned_alloc(64, (scratch_bytes + 63) / 64 * 64);
    if (widened_bytes) widened = on_huge_pages(widened_bytes);
    if ((temp_bytes && !temp) || (scratch_bytes && !scratch) || (widened_bytes && !widened))
      throw Error("out of host memory for the engine's working buffers");
    slots[widened_slot] = static_cast<char*>(widened);
    for (auto& ins : instrs)
      for (auto& s : ins.steps) {
        for (auto& a : s.args)
          if (a.slot == TEMP_SLOT) {
            a.ptr = static_cast<char*>(temp) + a.offset;
            a.mem.set_data_handle(a.ptr);
          }
        if (s.scratchpad) {
          memory m(s.scratch_md, eng, scratch);
          s.map[DNNL_ARG_SCRATCHPAD] = m;
        }
      }
    finalized = true;
  }

  // Returns 0 when done, or STOP_CANCELLED / STOP_DEADLINE when `cancel` (a byte another
  // thread may set) or `deadline` (CLOCK_MONOTONIC seconds, 0: none) stopped it before an
  // instruction: an abandoned call gives its core back between instructions.
  int64_t run(int64_t first, int64_t last, const volatile char* cancel, double deadline) {
    if (!finalized) finalize();
    if (first < 0 || last > (int64_t)instrs.size() || first > last)
      throw Error("instruction range out of bounds");
    int current = -1;
    auto now = [] {
      return std::chrono::duration<double>(
                 std::chrono::steady_clock::now().time_since_epoch()).count();
    };
    // One clock read per instruction: each starts where the previous ended (CPU
    // primitives on the OpenMP runtime return when done, so no wait is needed to time).
    double* const times = timing;
    double end = times ? now() : 0.0;
    bool primitives = false;  // (only oneDNN's work needs the stream waited for)
    for (int64_t k = first; k < last; ++k) {
      if (cancel && *cancel) return STOP_CANCELLED;
      if (deadline > 0 && now() >= deadline) return STOP_DEADLINE;
      Instr& ins = instrs[k];
      if (ins.threads != current) omp_set_num_threads(current = ins.threads);
      for (int64_t image = 0; image < ins.images; ++image)
        for (auto& a : ins.steps) {
          const bool ours = a.loop || a.inner_len;
          for (auto& arg : a.args)
            if (arg.slot >= 0) {
              arg.ptr = slots[arg.slot] + arg.offset + image * arg.image_step;
              if (!ours) arg.mem.set_data_handle(arg.ptr);
            }
          if (a.loop) {
            a.loop(a, ins.threads);
          } else if (a.inner_len) {
            inner_reduce(a, ins.threads);
          } else {
            a.prim.execute(strm, a.map);
            primitives = true;
          }
        }
      if (times) {
        times[2 * k] = end;
        times[2 * k + 1] = end = now();
      }
    }
    if (primitives) strm.wait();
    return 0;
  }
};

namespace {
void set_error(char* err, int64_t len, const std::string& msg) {
  if (err && len > 0) std::snprintf(err, (size_t)len, "%s", msg.c_str());
}

template <class F>
int64_t guarded(char* err, int64_t len, F&& f) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    set_error(err, len, std::string("oneDNN: ") + e.what() + " (status " +
                            std::to_string((int)e.status) + ")");
  } catch (const std::exception& e) {
    set_error(err, len, e.what());
  } catch (...) {
    set_error(err, len, "unknown C++ exception");
  }
  return -1;
}
}  // namespace

#define NE_API __attribute__((visibility("default")))

extern "C" {

NE_API int64_t ne_version() { return 1; }

NE_API void* ne_create(int64_t n_slots, int64_t threads, char* err, int64_t len) {
  Program* p = nullptr;
  int64_t rc = guarded(err, len, [&]() -> int64_t {
    if (n_slots < 0 || n_slots > (1 << 24)) throw Error("bad slot count");
    p = new Program();
    p->threads = threads > 0 ? (int)threads : 1;
    p->slots.assign((size_t)n_slots + 1, nullptr);  // and the widened values' slot
    p->widened_slot = n_slots;
    return 0;
  });
  return rc < 0 ? nullptr : p;
}

NE_API void ne_destroy(void* p) { delete static_cast<Program*>(p); }

// A pool of reordered weights (WeightPool): create it, give it to each program before its
// instructions are added; destroying it leaves the programs what they took.
NE_API void* ne_pool_create() { return new std::shared_ptr<WeightPool>(new WeightPool()); }
NE_API void ne_pool_destroy(void* pool) { delete static_cast<std::shared_ptr<WeightPool>*>(pool); }
NE_API int64_t ne_use_pool(void* p, void* pool) {
  static_cast<Program*>(p)->pool = pool ? *static_cast<std::shared_ptr<WeightPool>*>(pool)
                                        : std::shared_ptr<WeightPool>();
  return 0;
}

NE_API int64_t ne_bind(void* p, int64_t slot, void* ptr, char* err, int64_t len) {
  return guarded(err, len, [&]() -> int64_t {
    Program* prog = static_cast<Program*>(p);
    prog->base(slot);
    prog->slots[slot] = static_cast<char*>(ptr);
    return 0;
  });
}

NE_API int64_t ne_add(void* p, const int64_t* spec, int64_t n, const float* fs, int64_t nf, char* err,
               int64_t len) {
  return guarded(err, len, [&]() -> int64_t {
    Program* prog = static_cast<Program*>(p);
    if (prog->finalized) throw Error("program already finalized");
    Reader rd{spec, n, 0, fs, nf, 0, prog->widened_slot, &prog->widened_bytes};
    prog->add(rd);
    return (int64_t)prog->instrs.size() - 1;
  });
}

// Team size for the instructions added next (tiny ones run on the calling thread alone:
// waking a sleeping OpenMP team costs more than they take).
NE_API int64_t ne_set_threads(void* p, int64_t threads) {
  static_cast<Program*>(p)->next_threads = (int)threads;
  return 0;
}

// Where run() writes each instruction's [start, end] (2 doubles per instruction, by
// engine index; steady_clock, which is Python's time.perf_counter on Linux), or NULL.
NE_API int64_t ne_set_timing(void* p, double* buf) {
  static_cast<Program*>(p)->timing = buf;
  return 0;
}

NE_API int64_t ne_finalize(void* p, char* err, int64_t len) {
  return guarded(err, len, [&]() -> int64_t {
    static_cast<Program*>(p)->finalize();
    return 0;
  });
}

// Bytes the program holds besides the arena: reordered weights and working buffers.
NE_API int64_t ne_bytes(void* p) {
  Program* prog = static_cast<Program*>(p);
  return (int64_t)(prog->owned_bytes + prog->temp_bytes + prog->scratch_bytes +
                   prog->widened_bytes);
}

// Runs instructions [first, last) with per-call slots bound from `ptrs` (slot k gets
// ptrs[k - first_slot]). `cancel` (may be null) and `deadline` (0: none) as in
// Program::run, whose result this returns.
NE_API int64_t ne_run(void* p, int64_t first, int64_t last, int64_t first_slot, void** ptrs,
               int64_t n_ptrs, const char* cancel, double deadline, char* err, int64_t len) {
  return guarded(err, len, [&]() -> int64_t {
    Program* prog = static_cast<Program*>(p);
    for (int64_t k = 0; k < n_ptrs; ++k) {
      prog->base(first_slot + k);
      prog->slots[first_slot + k] = static_cast<char*>(ptrs[k]);
    }
    return prog->run(first, last, cancel, deadline);
  });
}

// The implementation oneDNN chose for instruction k's main primitive (for inspection).
NE_API int64_t ne_impl(void* p, int64_t k, char* out, int64_t len) {
  return guarded(out, len, [&]() -> int64_t {
    Program* prog = static_cast<Program*>(p);
    if (k < 0 || k >= (int64_t)prog->instrs.size()) throw Error("no such instruction");
    auto& ins = prog->instrs[k];
    auto& s = ins.main_step >= 0 ? ins.steps[ins.main_step] : ins.steps.back();
    if (s.loop_name) {
      set_error(out, len, s.loop_name);
      return 0;
    }
    if (s.inner_len) {
      set_error(out, len, "neuronish:inner_reduce");
      return 0;
    }
    const_dnnl_primitive_desc_t pd;
    dnnl::error::wrap_c_api(dnnl_primitive_get_primitive_desc(s.prim.get(), &pd), "pd");
    const char* info = nullptr;
    dnnl::error::wrap_c_api(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &info),
                            "impl");
    set_error(out, len, info ? info : "?");
    return 0;
  });
}

}  // extern "C"

// int8 instructions (docs/int8.md): runtime/native/engine_int8.cc, part of this unit.
#include "engine_int8.cc"

// Loops over every dtype (float32 and float64, 16-bit floats, integers, bool): what
// oneDNN's primitives leave out, so that no instruction needs the numpy engine.
#include "engine_any_dtype.cc"
