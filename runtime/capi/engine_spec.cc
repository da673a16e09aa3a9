// runtime/native/spec.py and spec_int8.py in C++ (engine_spec.h says why): the shared
// helpers, the table of encoders, `encode` and `work`. Every function here and in
// engine_spec_{compute,data,int8}.cc is its Python namesake with the same order of tests,
// so a change there is easy to follow here; the codes are engine.cc's enums
// (tests/runtime/test_native_codes.py holds spec.py to them, tests/runtime/test_capi_spec.py
// holds these files to spec.py, list for list).
#include <algorithm>
#include <cmath>
#include <map>

#include "engine_spec_parts.h"

namespace nr::spec {
namespace detail {
namespace {

const double kSeluAlpha = 1.6732632423543772, kSeluScale = 1.0507009873554805;
const std::map<std::string, Chain> kEltwise = {
    {"relu", {{E_RELU, 0, 0}}}, {"relu6", {{E_CLIP, 0, 6}}}, {"leaky_relu", {{E_RELU, 0.2, 0}}},
    {"elu", {{E_ELU, 1, 0}}}, {"selu", {{E_ELU, kSeluAlpha, 0}, {E_LINEAR, kSeluScale, 0}}},
    {"sigmoid", {{E_LOGISTIC, 0, 0}}}, {"tanh", {{E_TANH, 0, 0}}}, {"exp", {{E_EXP, 0, 0}}},
    {"gelu", {{E_GELU_ERF, 0, 0}}}, {"gelu_tanh", {{E_GELU_TANH, 0, 0}}},
    {"swish", {{E_SWISH, 1, 0}}}, {"sqrt", {{E_SQRT, 0, 0}}}, {"rsqrt", {{E_POW, 1, -0.5}}},
    {"square", {{E_SQUARE, 0, 0}}}, {"abs", {{E_ABS, 0, 0}}}, {"neg", {{E_LINEAR, -1, 0}}},
    {"reciprocal", {{E_POW, 1, -1}}}, {"hard_sigmoid", {{E_HARDSIGMOID, 1.0 / 6, 0.5}}},
    {"hard_swish", {{E_HARDSWISH, 1.0 / 6, 0.5}}}};
const char *const kGUnaryNames[] = {
    "relu", "relu6", "leaky_relu", "elu", "selu", "sigmoid", "tanh", "softplus", "gelu",
    "gelu_tanh", "erf", "erfc", "exp", "log", "sqrt", "rsqrt", "square", "abs", "neg",
    "reciprocal", "floor", "sign", "round_bf16", "round_fp16", "sin", "cos", "tan", "atan",
    "log1p", "expm1", "round", "swish", "logical_not", "hard_sigmoid", "hard_swish"};

uint16_t bf16_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

std::string activation_fn(const Attrs &a) {
  const Node *v = a.get("activation");
  return v && a.truth("activation") ? std::string(v->str()) : "none";
}

}  // namespace

std::optional<int64_t> g_unary(const std::string &fn) {
  for (size_t i = 0; i < sizeof kGUnaryNames / sizeof *kGUnaryNames; ++i)
    if (fn == kGUnaryNames[i]) return int64_t(i + 1);
  return std::nullopt;
}
int dtype_of(std::string_view name) {
  static const char *const names[] = {"bool", "int8", "uint8", "int16", "int32", "int64",
                                      "float16", "bfloat16", "float32", "float64"};
  for (int i = 0; i < 10; ++i) if (name == names[i]) return i;
  return -1;
}

int64_t elements(const Ints &shape, size_t from, size_t to) {
  int64_t n = 1;
  for (size_t i = from; i < std::min(to, shape.size()); ++i) n *= shape[i];
  return n;
}

Ints padded(const Ints &shape, size_t rank) {
  Ints out(rank > shape.size() ? rank - shape.size() : 0, 1);
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

Ints dense_strides(const Ints &shape) {
  Ints s(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) { s[i] = step; step *= shape[i]; }
  return s;
}

void put(Ints &ints, const Ref &r, const Ints *shape) {
  const Ints &dims = shape ? *shape : r.shape;
  ints.insert(ints.end(), {r.slot, r.offset, kEngineDType[r.dtype], int64_t(r.blocked) | (r.widenable ? 2 : 0),
                           int64_t(dims.size())});
  ints.insert(ints.end(), dims.begin(), dims.end());
}
void put(Ints &ints, const Ref &r, const Ints &shape) { put(ints, r, &shape); }
void append(Ints &ints, const Ints &more) { ints.insert(ints.end(), more.begin(), more.end()); }

// The attribute map, read as spec.py reads `attrs` (the raw map: defaults as .get gives).
Spec made(Ints ints, std::vector<double> floats) { return Spec{std::move(ints), std::move(floats)}; }

std::optional<Chain> chain_of(const std::string &fn, double alpha) {
  auto it = kEltwise.find(fn);
  if (it == kEltwise.end()) return std::nullopt;
  if (fn == "leaky_relu") return Chain{{E_RELU, alpha, 0}};
  return it->second;
}

void epilogue(const Chain &chain, Ints &ints, std::vector<double> &floats) {
  ints.push_back(int64_t(chain.size()));
  for (const Step &s : chain) {
    ints.push_back(s.code);
    floats.push_back(s.alpha);
    floats.push_back(s.beta);
  }
}


std::optional<Chain> activation(const Attrs &a) {
  std::string fn = activation_fn(a);
  if (fn == "none") return Chain{};
  return chain_of(fn, a.f("alpha", 0.2));
}

std::optional<int64_t> act_code(const Attrs &a) {
  std::string fn = activation_fn(a);
  return fn == "none" ? std::optional<int64_t>(0) : g_unary(fn);
}

int64_t bits(double v) { int64_t b; std::memcpy(&b, &v, 8); return b; }


// spec.py's _scalar_bits: np.asarray(value).astype(dtype)'s bytes as an int64.
int64_t scalar_bits(const Node &v, int dtype) {
  uint8_t raw[8] = {0};
  auto store = [&](auto x) { std::memcpy(raw, &x, sizeof x); };
  bool is_float = v.type == Type::Float;
  double real = Attrs::num(v);
  int64_t whole = v.type == Type::Bool ? int64_t(v.boolean) : is_float ? int64_t(real) : int64_t(v.integer);
  switch (dtype) {
    case BOOL: store(uint8_t(is_float ? real != 0 : whole != 0)); break;
    case I8: store(int8_t(whole)); break;
    case U8: store(uint8_t(whole)); break;
    case I16: store(int16_t(whole)); break;
    case I32: store(int32_t(whole)); break;
    case I64: store(whole); break;
    case F16: store(_Float16(is_float ? real : double(whole))); break;
    case BF16: store(bf16_of(float(is_float ? real : double(whole)))); break;
    case F32: store(float(is_float ? real : double(whole))); break;
    case F64: store(is_float ? real : double(whole)); break;
  }
  int64_t out;
  std::memcpy(&out, raw, 8);
  return out;
}

Ints around(const Ints &shape, int64_t axis) {
  return {elements(shape, 0, size_t(axis)), shape.at(size_t(axis)), elements(shape, size_t(axis) + 1)};
}

bool io_ok(int x, int y, int compute) { return (x == F32 || x == compute) && (y == F32 || y == compute); }

int compute_of(const Attrs &a, const Ref &x, const Ref &w) {
  int compute = dtype_of(a.s("compute", "float32"));
  if (compute == F32 && (x.dtype == F16 || x.dtype == BF16) && w.dtype == x.dtype) return x.dtype;
  return compute;
}

Out strided(const Ref &x, const Ref &y, int64_t start, const Ints &dims, const Ints &strides) {
  if (x.dtype != y.dtype || dims.empty() || dims.size() > 12) return std::nullopt;
  Ints ints{OP_STRIDED_COPY};
  put(ints, x, Ints{elements(x.shape)});
  put(ints, y, Ints{elements(y.shape)});
  ints.push_back(int64_t(dims.size()));
  ints.push_back(start);
  for (size_t i = 0; i < dims.size(); ++i) { ints.push_back(dims[i]); ints.push_back(strides[i]); }
  return made(ints);
}

}  // namespace detail

using namespace detail;

namespace {
using Encoder = Out (*)(const Attrs &, const std::vector<Ref> &, const std::vector<Ref> &,
                        const std::vector<bool> &);
const std::map<std::string, Encoder> kEncoders = {
    {"conv2d", conv2d}, {"depthwise_conv2d", depthwise_conv2d},
    {"matmul", matmul}, {"pool", pool}, {"unary", unary}, {"binary", binary},
    {"softmax", softmax}, {"masked_softmax", masked_softmax}, {"reduce", reduce}, {"layer_norm", layer_norm}, {"concat", concat},
    {"transpose", transpose}, {"copy", flat_copy}, {"reshape", flat_copy}, {"cast", cast},
    {"strided_slice", strided_slice}, {"broadcast_to", broadcast_to}, {"tile", tile},
    {"pad", pad}, {"argminmax", argminmax}, {"cumulative", cumulative}, {"one_hot", one_hot},
    {"top_k", top_k}, {"resize", resize}, {"conv3d", conv3d}, {"pool3d", pool3d},
    {"select", select}, {"gather", gather}, {"quantize", quantize},
    {"binary_quantize", binary_quantize}, {"conv2d_int8", conv2d_int8}, {"matmul_int8", matmul_int8}};

}  // namespace

bool windowed(const std::string &kind) {
  return kind == "conv2d" || kind == "depthwise_conv2d" || kind == "pool";
}

bool encode(const std::string &kind, const mp::Node &attrs, const std::vector<Ref> &ins,
            const std::vector<Ref> &outs, const std::vector<bool> &constant, Spec &out) {
  auto fn = kEncoders.find(kind);
  if (fn == kEncoders.end()) return false;
  bool blocked = false, empty = false;
  for (const auto *refs : {&ins, &outs})
    for (const Ref &r : *refs) {
      blocked = blocked || r.blocked;
      empty = empty || std::count(r.shape.begin(), r.shape.end(), 0) > 0;
    }
  if ((!windowed(kind) && blocked) || empty) return false;
  Out spec = fn->second(Attrs{attrs}, ins, outs, constant);
  if (!spec) return false;
  out = std::move(*spec);
  return true;
}

int64_t work(const std::string &kind, const mp::Node &attrs, const std::vector<Ref> &ins,
             const std::vector<Ref> &outs) {
  Attrs a{attrs};
  int64_t out = outs.empty() ? 0 : elements(outs[0].shape);
  // isa.flops for the matrix-unit kinds
  if (kind == "conv2d" || kind == "conv2d_int8") {
    const Ints &w = ins[1].shape;
    return 2 * out * w[0] * w[1] * w[2];
  }
  if (kind == "depthwise_conv2d") return 2 * out * ins[1].shape[0] * ins[1].shape[1];
  if (kind == "conv3d") {
    const Ints &w = ins[1].shape;
    return 2 * out * w[0] * w[1] * w[2] * w[3];
  }
  if (kind == "matmul_int8") return 2 * out * ins[1].shape[0];
  if (kind == "matmul") {
    Ints shape = ins[0].shape, perm = a.ints_or_empty("perm_a"), read;
    if (perm.empty()) read = shape;
    else for (int64_t p : perm) read.push_back(shape.at(size_t(p)));
    return 2 * out * (a.truth("transpose_a") ? read[read.size() - 2] : read.back());
  }
  int64_t total = out;
  for (const Ref &r : ins) total += elements(r.shape);
  return 16 * total;
}

}  // namespace nr::spec
