// runtime/native/spec.py and spec_int8.py in C++ (engine_spec.h says why). Each function
// below is its Python namesake, in the same order of tests, so a change there is easy to
// follow here; the codes are engine.cc's enums (tests/runtime/test_native_codes.py holds
// spec.py to them, tests/runtime/test_capi_spec.py holds this file to spec.py).
#include "engine_spec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>

namespace nr::spec {
namespace {

using mp::Node;
using mp::Type;

// nr_dtype indices (neuronish_runtime.h).
enum D { BOOL, I8, U8, I16, I32, I64, F16, BF16, F32, F64 };
// spec.py's DTYPES: engine.cc's codes, by nr_dtype.
constexpr int64_t kEngineDType[] = {9, 4, 2, 8, 3, 6, 5, 1, 0, 7};
constexpr int kItemSize[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8};

enum : int64_t {
  OP_CONV = 1, OP_MATMUL = 2, OP_POOL = 3, OP_ELTWISE = 4, OP_BINARY = 5, OP_SOFTMAX = 6,
  OP_REDUCE = 7, OP_CONCAT = 8, OP_TRANSPOSE = 9, OP_REORDER = 10, OP_LAYER_NORM = 11,
  OP_MAP = 12, OP_BINARY_LOOP = 13, OP_SELECT = 14, OP_GATHER = 15, OP_STRIDED_COPY = 16,
  OP_PAD = 17, OP_LOG_SOFTMAX = 18, OP_CAST_LOOP = 19, OP_ARGMINMAX = 20, OP_CUMULATIVE = 21,
  OP_ONE_HOT = 22, OP_TOP_K = 23, OP_MIRROR_PAD = 24, OP_RESIZE = 25, OP_REDUCE_INT = 26,
  OP_LOG_SOFTMAX_AXIS = 27, OP_CONV3D = 28, OP_POOL3D = 29,
  OP_QUANTIZE = 40, OP_QCONV = 41, OP_QMATMUL = 42,
  OP_G_UNARY = 50, OP_G_BINARY = 51, OP_G_REDUCE = 52, OP_G_CAST = 53, OP_G_POOL = 54,
  OP_G_SOFTMAX = 55, OP_G_LAYER_NORM = 56, OP_G_CONCAT = 57, OP_G_MATMUL = 58, OP_G_CONV = 59,
  OP_ALIAS = 60,
};
enum : int64_t {
  E_RELU = 1, E_CLIP = 2, E_ELU = 3, E_LOGISTIC = 4, E_TANH = 5, E_EXP = 7, E_SQRT = 9,
  E_SQUARE = 10, E_ABS = 11, E_LINEAR = 12, E_POW = 13, E_GELU_TANH = 15, E_GELU_ERF = 16,
  E_SWISH = 17,
};

struct Step { int64_t code; double alpha, beta; };
using Chain = std::vector<Step>;
using Ints = std::vector<int64_t>;

const double kSeluAlpha = 1.6732632423543772, kSeluScale = 1.0507009873554805;
const std::map<std::string, Chain> kEltwise = {
    {"relu", {{E_RELU, 0, 0}}}, {"relu6", {{E_CLIP, 0, 6}}}, {"leaky_relu", {{E_RELU, 0.2, 0}}},
    {"elu", {{E_ELU, 1, 0}}}, {"selu", {{E_ELU, kSeluAlpha, 0}, {E_LINEAR, kSeluScale, 0}}},
    {"sigmoid", {{E_LOGISTIC, 0, 0}}}, {"tanh", {{E_TANH, 0, 0}}}, {"exp", {{E_EXP, 0, 0}}},
    {"gelu", {{E_GELU_ERF, 0, 0}}}, {"gelu_tanh", {{E_GELU_TANH, 0, 0}}},
    {"swish", {{E_SWISH, 1, 0}}}, {"sqrt", {{E_SQRT, 0, 0}}}, {"rsqrt", {{E_POW, 1, -0.5}}},
    {"square", {{E_SQUARE, 0, 0}}}, {"abs", {{E_ABS, 0, 0}}}, {"neg", {{E_LINEAR, -1, 0}}},
    {"reciprocal", {{E_POW, 1, -1}}}};
const std::map<std::string, int64_t> kMap = {
    {"erf", 1}, {"erfc", 2}, {"log", 3}, {"softplus", 4}, {"log1p", 5}, {"expm1", 6},
    {"floor", 7}, {"sign", 8}, {"round", 9}, {"sin", 10}, {"cos", 11}, {"tan", 12},
    {"atan", 13}, {"logical_not", 14}, {"round_bf16", 15}};
const std::map<std::string, int64_t> kLoop = {
    {"add", 1}, {"sub", 2}, {"mul", 3}, {"div", 4}, {"maximum", 5}, {"minimum", 6},
    {"greater", 7}, {"greater_equal", 8}, {"less", 9}, {"less_equal", 10}, {"equal", 11},
    {"not_equal", 12}, {"pow", 13}, {"floor_div", 14}, {"floor_mod", 15},
    {"logical_and", 16}, {"logical_or", 17}, {"squared_difference", 18}};
const std::map<std::string, int64_t> kMapI32 = {{"abs", 20}, {"neg", 21}, {"relu", 22},
                                                {"relu6", 23}, {"sign", 24}, {"square", 25}};
const std::set<std::string> kCompare = {"add", "sub", "mul", "maximum", "minimum", "greater",
                                        "greater_equal", "less", "less_equal", "equal",
                                        "not_equal"};

// spec.py's _LOOP_DTYPES: which binary functions the loop takes per operand dtype.
bool loop_takes(int dtype, const std::string &fn) {
  bool logical = fn == "logical_and" || fn == "logical_or";
  switch (dtype) {
    case F32: case I32: return kLoop.count(fn) && !logical;
    case I64: return kCompare.count(fn) > 0;
    case F16: return kCompare.count(fn) || fn == "div";
    case BOOL: return logical || fn == "equal" || fn == "not_equal";
    default: return false;
  }
}

const std::map<std::string, int64_t> kBinary = {
    {"add", 1}, {"sub", 2}, {"mul", 3}, {"div", 4}, {"maximum", 5}, {"minimum", 6},
    {"greater", 7}, {"greater_equal", 8}, {"less", 9}, {"less_equal", 10}, {"equal", 11},
    {"not_equal", 12}};
// isa.SWAPPED: f(a, b) == g(b, a).
const std::map<std::string, std::string> kSwapped = {
    {"add", "add"}, {"mul", "mul"}, {"maximum", "maximum"}, {"minimum", "minimum"},
    {"equal", "equal"}, {"not_equal", "not_equal"}, {"greater", "less"}, {"less", "greater"},
    {"greater_equal", "less_equal"}, {"less_equal", "greater_equal"}};
const std::map<std::string, int64_t> kReduce = {{"sum", 1}, {"mean", 2}, {"max", 3},
                                                {"min", 4}, {"prod", 5}};
const std::map<std::string, int64_t> kReduceInt = {{"sum", 1}, {"mean", 2}, {"max", 3},
                                                   {"min", 4}, {"prod", 5}, {"any", 6},
                                                   {"all", 7}};
const char *const kGUnaryNames[] = {
    "relu", "relu6", "leaky_relu", "elu", "selu", "sigmoid", "tanh", "softplus", "gelu",
    "gelu_tanh", "erf", "erfc", "exp", "log", "sqrt", "rsqrt", "square", "abs", "neg",
    "reciprocal", "floor", "sign", "round_bf16", "round_fp16", "sin", "cos", "tan", "atan",
    "log1p", "expm1", "round", "swish"};
std::optional<int64_t> g_unary(const std::string &fn) {
  for (size_t i = 0; i < sizeof kGUnaryNames / sizeof *kGUnaryNames; ++i)
    if (fn == kGUnaryNames[i]) return int64_t(i + 1);
  return std::nullopt;
}
const std::set<std::string> kGUnaryInt = {"abs", "neg", "sign", "square", "relu", "relu6"};

bool is_int_dtype(int d) { return d == I8 || d == U8 || d == I16 || d == I32 || d == I64; }
bool g_float(int d) { return d == F32 || d == F64 || d == F16 || d == BF16; }
bool onednn_float(int d) { return d == F32 || d == BF16 || d == F16; }
bool movable(int d) { return d == F32 || d == I32 || d == U8 || d == BOOL || d == I8 || d == BF16 || d == F16; }

int dtype_of(std::string_view name) {
  static const char *const names[] = {"bool", "int8", "uint8", "int16", "int32", "int64",
                                      "float16", "bfloat16", "float32", "float64"};
  for (int i = 0; i < 10; ++i) if (name == names[i]) return i;
  return -1;
}

int64_t elements(const Ints &shape, size_t from = 0, size_t to = SIZE_MAX) {
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

void put(Ints &ints, const Ref &r, const Ints *shape = nullptr) {
  const Ints &dims = shape ? *shape : r.shape;
  ints.insert(ints.end(), {r.slot, r.offset, kEngineDType[r.dtype], int64_t(r.blocked),
                           int64_t(dims.size())});
  ints.insert(ints.end(), dims.begin(), dims.end());
}
void put(Ints &ints, const Ref &r, const Ints &shape) { put(ints, r, &shape); }
void append(Ints &ints, const Ints &more) { ints.insert(ints.end(), more.begin(), more.end()); }

// The attribute map, read as spec.py reads `attrs` (the raw map: defaults as .get gives).
struct Attrs {
  const Node &m;
  const Node *get(const char *k) const { return m.get(k); }
  bool truth(const char *k) const {
    const Node *v = get(k);
    if (!v) return false;
    switch (v->type) {
      case Type::Nil: return false;
      case Type::Bool: return v->boolean;
      case Type::Int: return v->integer != 0;
      case Type::Float: return v->real != 0;
      case Type::Str: case Type::Bin: return v->size != 0;
      case Type::Array: case Type::Map: return !v->items.empty();
      default: return true;
    }
  }
  const Node &need(const char *k) const {
    const Node *v = get(k);
    if (!v) throw MissingAttr{k};
    return *v;
  }
  static double num(const Node &v) {
    return v.type == Type::Float ? v.real : v.type == Type::Bool ? double(v.boolean) : double(v.integer);
  }
  int64_t i(const char *k) const { return int64_t(need(k).integer); }
  int64_t i(const char *k, int64_t def) const { const Node *v = get(k); return v ? int64_t(v->integer) : def; }
  double f(const char *k) const { return num(need(k)); }
  double f(const char *k, double def) const { const Node *v = get(k); return v ? num(*v) : def; }
  std::string s(const char *k) const { return std::string(need(k).str()); }
  std::string s(const char *k, const char *def) const {
    const Node *v = get(k);
    return v ? std::string(v->str()) : def;
  }
  Ints ints(const char *k) const {
    Ints out;
    for (const Node &x : need(k).items) out.push_back(int64_t(x.integer));
    return out;
  }
  Ints ints_or_empty(const char *k) const {  // `attrs.get(k) or []`
    const Node *v = get(k);
    Ints out;
    if (v && v->type == Type::Array) for (const Node &x : v->items) out.push_back(int64_t(x.integer));
    return out;
  }
  std::vector<std::optional<int64_t>> opt_ints(const char *k) const {
    std::vector<std::optional<int64_t>> out;
    for (const Node &x : need(k).items)
      out.push_back(x.type == Type::Nil ? std::nullopt : std::optional<int64_t>(int64_t(x.integer)));
    return out;
  }
  Ints befores(const char *k) const {  // [before for before, _ in attrs[k]]
    Ints out;
    for (const Node &p : need(k).items) out.push_back(int64_t(p.items.at(0).integer));
    return out;
  }
};

using Out = std::optional<Spec>;
Spec made(Ints ints, std::vector<double> floats = {}) { return Spec{std::move(ints), std::move(floats)}; }

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

std::string activation_fn(const Attrs &a) {
  const Node *v = a.get("activation");
  return v && a.truth("activation") ? std::string(v->str()) : "none";
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

uint16_t bf16_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return uint16_t((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

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

Out generic_conv(const Attrs &a, const std::vector<Ref> &ins, const Ref &y, bool depthwise, int dims = 2) {
  const Ref &x = ins[0], &w = ins[1];
  auto act = act_code(a);
  if (!act || x.blocked || y.blocked) return std::nullopt;
  bool residual = a.truth("residual");
  bool has_bias = int64_t(ins.size()) - residual == 3;
  Ints lift(size_t(3 - dims), 1);
  int64_t n = x.shape.front(), c = x.shape.back();
  Ints spatial(x.shape.begin() + 1, x.shape.end() - 1);
  int64_t ci = w.shape[w.shape.size() - 2], o = w.shape.back();
  Ints kernel(w.shape.begin(), w.shape.end() - 2);
  int64_t groups = depthwise ? c : a.i("groups", 1);
  Ints pads(size_t(2 * (3 - dims)), 0);
  append(pads, a.ints("pads"));
  Ints ints{OP_G_CONV, n};
  append(ints, lift); append(ints, spatial); ints.push_back(c);
  append(ints, lift); append(ints, kernel); ints.push_back(depthwise ? 1 : ci); ints.push_back(o);
  append(ints, lift); ints.insert(ints.end(), y.shape.begin() + 1, y.shape.end() - 1);
  ints.insert(ints.end(), {groups, int64_t(depthwise), depthwise ? o : 1});
  append(ints, lift); append(ints, a.ints("strides"));
  append(ints, lift); append(ints, a.ints("dilations"));
  for (size_t i = 0; i < pads.size(); i += 2) ints.push_back(pads[i]);
  ints.insert(ints.end(), {int64_t(has_bias), int64_t(residual), *act, bits(a.f("alpha", 0.2))});
  for (const Ref &r : ins) put(ints, r, Ints{elements(r.shape)});
  put(ints, y, Ints{elements(y.shape)});
  return made(ints);
}

Out generic_pool(const Attrs &a, const Ref &x, const Ref &y, int dims = 2) {
  if (x.dtype == BOOL || x.blocked || y.blocked) return std::nullopt;
  Ints lift(size_t(3 - dims), 1);
  Ints pads(size_t(2 * (3 - dims)), 0);
  append(pads, a.ints("pads"));
  Ints ints{OP_G_POOL, int64_t(a.s("mode") == "max"), x.shape.front()};
  append(ints, lift); ints.insert(ints.end(), x.shape.begin() + 1, x.shape.end());
  append(ints, lift); ints.insert(ints.end(), y.shape.begin() + 1, y.shape.end() - 1);
  append(ints, lift); append(ints, a.ints("ksize"));
  append(ints, lift); append(ints, a.ints("strides"));
  for (size_t i = 0; i < pads.size(); i += 2) ints.push_back(pads[i]);
  put(ints, x, Ints{elements(x.shape)});
  put(ints, y, Ints{elements(y.shape)});
  return made(ints);
}

Out conv(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs,
         const std::vector<bool> &c, bool depthwise) {
  const Ref &x = ins[0], &w = ins[1], &y = outs[0];
  bool residual = a.truth("residual");
  bool has_bias = int64_t(ins.size()) - residual == 3;
  int compute = compute_of(a, x, w);
  if (!onednn_float(x.dtype)) return generic_conv(a, ins, y, depthwise);
  if (!io_ok(x.dtype, y.dtype, compute) || w.dtype != compute) return std::nullopt;
  auto act = activation(a);
  if (!act) return std::nullopt;
  Ints ints{OP_CONV, has_bias, residual, a.i("groups", 1), depthwise, kEngineDType[compute], int64_t(c[1])};
  put(ints, x); put(ints, w);
  if (has_bias) put(ints, ins[2]);
  if (residual) put(ints, ins.back());
  put(ints, y);
  append(ints, a.ints("strides")); append(ints, a.ints("dilations")); append(ints, a.ints("pads"));
  std::vector<double> floats;
  epilogue(*act, ints, floats);
  return made(ints, floats);
}

Out generic_matmul(const Attrs &a, const std::vector<Ref> &ins, const Ref &y) {
  if (a.truth("perm_a") || a.truth("perm_b") || a.truth("perm_y")) return std::nullopt;
  const Ref &A = ins[0], &B = ins[1];
  auto act = act_code(a);
  if (!act) return std::nullopt;
  bool residual = a.truth("residual");
  bool has_bias = int64_t(ins.size()) - residual == 3;
  bool ta = a.truth("transpose_a"), tb = a.truth("transpose_b");
  size_t r = y.shape.size();
  int64_t m = y.shape[r - 2], n = y.shape[r - 1];
  int64_t k = ta ? A.shape[A.shape.size() - 2] : A.shape.back();
  Ints batch(y.shape.begin(), y.shape.end() - 2);
  Ints pa = padded(Ints(A.shape.begin(), A.shape.end() - 2), batch.size());
  Ints pb = padded(Ints(B.shape.begin(), B.shape.end() - 2), batch.size());
  Ints off_a, off_b;
  int64_t total = elements(batch);
  size_t zipped = std::min({batch.size(), pa.size(), pb.size()});
  Ints index(batch.size(), 0);
  for (int64_t t = 0; t < total; ++t) {  // itertools.product: the last index fastest
    int64_t oa = 0, ob = 0;
    for (size_t i = 0; i < zipped; ++i) {
      oa = oa * pa[i] + (pa[i] != 1 ? index[i] : 0);
      ob = ob * pb[i] + (pb[i] != 1 ? index[i] : 0);
    }
    off_a.push_back(oa * m * k);
    off_b.push_back(ob * k * n);
    for (size_t i = batch.size(); i-- > 0;) {
      if (++index[i] < batch[i]) break;
      index[i] = 0;
    }
  }
  Ints ints{OP_G_MATMUL, int64_t(off_a.size()), m, n, k, ta, tb, has_bias, residual, *act,
            bits(a.f("alpha", 0.2))};
  append(ints, off_a); append(ints, off_b);
  for (const Ref &x : ins) put(ints, x, Ints{elements(x.shape)});
  put(ints, y, Ints{elements(y.shape)});
  return made(ints);
}

// spec.py's _view: `r` read as transpose(r, perm), padded with leading 1s to `rank`.
std::pair<Ints, Ints> view(const Ref &r, Ints perm, size_t rank) {
  Ints dense = dense_strides(r.shape);
  if (perm.empty()) for (size_t i = 0; i < r.shape.size(); ++i) perm.push_back(int64_t(i));
  Ints dims, steps;
  for (int64_t p : perm) { dims.push_back(r.shape.at(size_t(p))); steps.push_back(dense.at(size_t(p))); }
  size_t pad = rank > dims.size() ? rank - dims.size() : 0;
  Ints d(pad, 1), s(pad, elements(r.shape));
  append(d, dims); append(s, steps);
  return {d, s};
}

Ints tail(const Ints &v, size_t n) { return Ints(v.end() - long(std::min(n, v.size())), v.end()); }

Out matmul(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs,
           const std::vector<bool> &c) {
  const Ref &A = ins[0], &B = ins[1], &y = outs[0];
  int compute = compute_of(a, A, B);
  if (!onednn_float(A.dtype)) return generic_matmul(a, ins, y);
  if (!io_ok(A.dtype, y.dtype, compute) || !(B.dtype == F32 || B.dtype == compute)) return std::nullopt;
  auto act = activation(a);
  size_t rank = y.shape.size();
  if (!act) return std::nullopt;
  if (rank > 6) return generic_matmul(a, ins, y);
  bool residual = a.truth("residual");
  bool has_bias = int64_t(ins.size()) - residual == 3;
  auto [shape_a, step_a] = view(A, a.ints_or_empty("perm_a"), rank);
  auto [shape_b, step_b] = view(B, a.ints_or_empty("perm_b"), rank);
  Ints perm_y = a.ints_or_empty("perm_y"), inverse(perm_y.size());
  for (size_t i = 0; i < perm_y.size(); ++i) inverse.at(size_t(perm_y[i])) = int64_t(i);
  auto [shape_y, step_y] = view(y, inverse, rank);
  bool ones = std::all_of(shape_b.begin(), shape_b.end() - 2, [](int64_t d) { return d == 1; });
  if (rank > 2 && ones && !a.truth("transpose_a") && perm_y.empty() && !a.truth("perm_a") &&
      Ints(shape_a.begin(), shape_a.end() - 2) == Ints(shape_y.begin(), shape_y.end() - 2)) {
    int64_t rows = elements(shape_a, 0, shape_a.size() - 1);
    shape_a = {rows, shape_a.back()};
    shape_b = tail(shape_b, 2);
    shape_y = {rows, shape_y.back()};
    step_a = tail(step_a, 2); step_b = tail(step_b, 2); step_y = tail(step_y, 2);
  }
  Ints ints{OP_MATMUL, has_bias, a.truth("transpose_a"), a.truth("transpose_b"),
            kEngineDType[compute], int64_t(c[1]), residual};
  put(ints, A, shape_a); append(ints, step_a);
  put(ints, B, shape_b); append(ints, step_b);
  if (has_bias) put(ints, ins[2]);
  if (residual) put(ints, ins.back(), shape_y);
  put(ints, y, shape_y); append(ints, step_y);
  std::vector<double> floats;
  epilogue(*act, ints, floats);
  return made(ints, floats);
}

Out pool(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  if (!onednn_float(ins[0].dtype)) return generic_pool(a, ins[0], outs[0]);
  Ints ints{OP_POOL, a.s("mode") == "max"};
  put(ints, ins[0]); put(ints, outs[0]);
  append(ints, a.ints("ksize")); append(ints, a.ints("strides")); append(ints, a.ints("pads"));
  return made(ints);
}

Out generic_unary(const std::string &fn, const Attrs &a, const Ref &x, const Ref &y) {
  auto code = g_unary(fn);
  if (!code || !(g_float(x.dtype) || (is_int_dtype(x.dtype) && kGUnaryInt.count(fn)))) return std::nullopt;
  Ints size{elements(x.shape)};
  Ints ints{OP_G_UNARY, *code, bits(a.f("alpha", 0.2))};
  put(ints, x, size); put(ints, y, size);
  return made(ints);
}

Out unary(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  std::string fn = a.s("fn");
  const Ref &x = ins[0];
  auto m = kMap.find(fn);
  if (m != kMap.end() && x.dtype == (fn == "logical_not" ? BOOL : F32)) {
    Ints ints{OP_MAP, m->second};
    put(ints, x); put(ints, outs[0]);
    return made(ints);
  }
  auto mi = kMapI32.find(fn);
  if (mi != kMapI32.end() && x.dtype == I32) {
    Ints ints{OP_MAP, mi->second};
    put(ints, x); put(ints, outs[0]);
    return made(ints);
  }
  auto chain = chain_of(fn, a.f("alpha", 0.2));
  if (!chain || !onednn_float(x.dtype) || x.shape.size() > 6) return generic_unary(fn, a, x, outs[0]);
  Ints ints{OP_ELTWISE};
  put(ints, x); put(ints, outs[0]);
  std::vector<double> floats;
  epilogue(*chain, ints, floats);
  return made(ints, floats);
}

Out binary(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  std::string fn = a.s("fn");
  Ref A = ins[0], B = ins[1];
  const Ref &y = outs[0];
  Chain post;
  if (fn == "squared_difference") { fn = "sub"; post = {{E_SQUARE, 0, 0}}; }
  size_t rank = std::max<size_t>(y.shape.size(), 1);
  Ints shape_y = padded(y.shape, rank), sa = padded(A.shape, rank), sb = padded(B.shape, rank);
  bool onednn = kBinary.count(fn) && (A.dtype == F32 || A.dtype == BF16) && y.shape.size() <= 6 &&
                (sa == shape_y || (sb == shape_y && kSwapped.count(fn)));
  if (!onednn) {
    fn = a.s("fn");
    if (rank > 8) return std::nullopt;
    auto loop = kLoop.find(fn);
    Ints ints;
    if (!loop_takes(A.dtype, fn)) {
      if (A.dtype == BOOL || loop == kLoop.end()) return std::nullopt;
      ints = {OP_G_BINARY, loop->second};
    } else {
      ints = {OP_BINARY_LOOP, loop->second};
    }
    put(ints, A, sa); put(ints, B, sb); put(ints, y, shape_y);
    return made(ints);
  }
  if (sa != shape_y) { std::swap(A, B); std::swap(sa, sb); fn = kSwapped.at(fn); }
  Ints ints{OP_BINARY, kBinary.at(fn)};
  put(ints, A, sa); put(ints, B, sb); put(ints, y, shape_y);
  std::vector<double> floats;
  epilogue(post, ints, floats);
  return made(ints, floats);
}

Out softmax(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &y = outs[0];
  bool log = a.truth("log");
  int64_t axis = a.i("axis");
  if (x.dtype == BF16 && y.dtype == x.dtype && !log && !x.shape.empty() && x.shape.size() <= 6) {
    Ints ints{OP_SOFTMAX, axis, 0};
    put(ints, x); put(ints, y);
    return made(ints);
  }
  if (x.dtype != F32 || x.shape.empty() || x.shape.size() > 6) {
    if (x.shape.empty()) return std::nullopt;
    Ints flat{elements(x.shape)};
    Ints ints{OP_G_SOFTMAX, log};
    append(ints, around(x.shape, axis));
    put(ints, x, flat); put(ints, y, flat);
    return made(ints);
  }
  if (log) {
    if (axis != int64_t(x.shape.size()) - 1) {
      Ints ints{OP_LOG_SOFTMAX_AXIS};
      append(ints, around(x.shape, axis));
      put(ints, x, Ints{elements(x.shape)}); put(ints, y, Ints{elements(x.shape)});
      return made(ints);
    }
    Ints flat{elements(x.shape, 0, x.shape.size() - 1), x.shape.back()};
    Ints ints{OP_LOG_SOFTMAX};
    put(ints, x, flat); put(ints, y, flat);
    return made(ints);
  }
  Ints ints{OP_SOFTMAX, axis, 0};
  put(ints, x); put(ints, y);
  return made(ints);
}

Out flat_copy(const Attrs &, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &y = outs[0];
  if (x.dtype != y.dtype) return std::nullopt;
  if (x.slot == y.slot && x.offset == y.offset) return made({OP_ALIAS});
  Ints size{elements(x.shape)};
  if (!movable(x.dtype)) return strided(x, y, 0, size, {1});
  Ints ints{OP_REORDER};
  put(ints, x, size); put(ints, y, size);
  return made(ints);
}

Out generic_reduce(const Attrs &a, const Ref &x, const Ref &y, const std::set<int64_t> &axes) {
  std::string fn = a.s("fn");
  if (!kReduce.count(fn) || x.dtype == BOOL) return std::nullopt;
  Ints kept, mask;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    kept.push_back(axes.count(int64_t(i)) ? 1 : x.shape[i]);
    mask.push_back(axes.count(int64_t(i)) ? 1 : 0);
  }
  Ints ints{OP_G_REDUCE, kReduce.at(fn)};
  put(ints, x); put(ints, y, kept); append(ints, mask);
  return made(ints);
}

Out reduce(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c) {
  const Ref &x = ins[0], &y = outs[0];
  Ints list = a.ints("axes");
  std::set<int64_t> axes(list.begin(), list.end());
  std::string fn = a.s("fn");
  Ints kept, mask;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    kept.push_back(axes.count(int64_t(i)) ? 1 : x.shape[i]);
    mask.push_back(axes.count(int64_t(i)) ? 1 : 0);
  }
  if (x.dtype == ((fn == "any" || fn == "all") ? BOOL : I32) && !axes.empty() && y.dtype == x.dtype &&
      !x.shape.empty()) {
    Ints ints{OP_REDUCE_INT, kReduceInt.at(fn)};
    put(ints, x); put(ints, y, kept); append(ints, mask);
    return made(ints);
  }
  if (axes.empty() || x.shape.empty()) return flat_copy(a, ins, outs, c);
  if (!kReduce.count(fn) || !(x.dtype == F32 || x.dtype == BF16) || x.shape.size() > 6)
    return generic_reduce(a, x, y, axes);
  if (x.shape.size() == 4 && axes == std::set<int64_t>{1, 2} && (fn == "mean" || fn == "max")) {
    Ints ints{OP_POOL, fn == "max"};
    put(ints, x); put(ints, y, kept);
    ints.insert(ints.end(), {x.shape[1], x.shape[2], 1, 1, 0, 0, 0, 0});
    return made(ints);
  }
  if (x.dtype != F32) return generic_reduce(a, x, y, axes);
  Ints ints{OP_REDUCE, kReduce.at(fn)};
  put(ints, x); put(ints, y, kept);
  return made(ints);
}

Out layer_norm(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &scale = ins[1], &shift = ins[2], &y = outs[0];
  if (x.blocked) return std::nullopt;
  if (x.dtype != F32) {
    Ints flat{elements(x.shape)};
    Ints ints{OP_G_LAYER_NORM, elements(x.shape, 0, x.shape.size() - 1), x.shape.back(), bits(a.f("epsilon"))};
    put(ints, x, flat); put(ints, scale); put(ints, shift); put(ints, y, flat);
    return made(ints);
  }
  Ints flat{elements(x.shape, 0, x.shape.size() - 1), x.shape.back()};
  if (flat[0] == 0 || flat[1] == 0) return std::nullopt;
  Ints ints{OP_LAYER_NORM};
  put(ints, x, flat); put(ints, scale); put(ints, shift); put(ints, y, flat);
  return made(ints, {a.f("epsilon")});
}

Out concat(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &y = outs[0];
  if (y.shape.empty()) return std::nullopt;
  int64_t axis = a.i("axis");
  if (!movable(y.dtype) || y.shape.size() > 6) {
    Ints ints{OP_G_CONCAT, int64_t(ins.size()), elements(y.shape, 0, size_t(axis))};
    for (const Ref &r : ins) {
      ints.push_back(elements(r.shape, size_t(axis)));
      put(ints, r, Ints{elements(r.shape)});
    }
    put(ints, y, Ints{elements(y.shape)});
    return made(ints);
  }
  Ints ints{OP_CONCAT, axis, int64_t(ins.size())};
  for (const Ref &r : ins) put(ints, r);
  put(ints, y);
  return made(ints);
}

Out transpose(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0];
  Ints perm = a.ints("perm");
  if ((!movable(x.dtype) || x.shape.size() > 6) && !x.shape.empty()) {
    Ints strides = dense_strides(x.shape), dims, steps;
    for (int64_t p : perm) { dims.push_back(x.shape.at(size_t(p))); steps.push_back(strides.at(size_t(p))); }
    return strided(x, outs[0], 0, dims, steps);
  }
  if (x.shape.empty() || x.shape.size() > 6) return std::nullopt;
  Ints ints{OP_TRANSPOSE};
  put(ints, x); put(ints, outs[0]); append(ints, perm);
  return made(ints);
}

Out cast(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c) {
  int src = ins[0].dtype, dst = outs[0].dtype;
  bool ok = ((src == I32 || src == I8 || src == U8 || src == BOOL) && dst == F32) ||
            (src == F32 && (dst == BF16 || dst == F16)) || (dst == F32 && (src == BF16 || src == F16));
  if (ok && !ins[0].shape.empty() && ins[0].shape.size() <= 6) {
    Ints ints{OP_REORDER};
    put(ints, ins[0]); put(ints, outs[0]);
    return made(ints);
  }
  auto loop = [](int d) { return d == F32 || d == I32 || d == I8 || d == U8 || d == BOOL || d == I64; };
  if (src == dst) return flat_copy(a, ins, outs, c);
  if (!loop(src) || !loop(dst)) {
    Ints size{elements(ins[0].shape)};
    Ints ints{OP_G_CAST};
    put(ints, ins[0], size); put(ints, outs[0], size);
    return made(ints);
  }
  Ints ints{OP_CAST_LOOP, dst == BOOL};
  put(ints, ins[0], Ints{elements(ins[0].shape)}); put(ints, outs[0], Ints{elements(outs[0].shape)});
  return made(ints);
}

// Python's slice(begin, end, step).indices(d) and len(range(...)) of it.
void slice_indices(int64_t d, std::optional<int64_t> b, std::optional<int64_t> e, int64_t step,
                   int64_t &first, int64_t &count) {
  int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? d - 1 : d;
  auto clamp = [&](std::optional<int64_t> v, int64_t none) {
    if (!v) return none;
    return *v < 0 ? std::max(*v + d, lower) : std::min(*v, upper);
  };
  first = clamp(b, step < 0 ? upper : lower);
  int64_t stop = clamp(e, step < 0 ? lower : upper);
  if (step > 0) count = stop > first ? (stop - first + step - 1) / step : 0;
  else count = first > stop ? (first - stop - step - 1) / -step : 0;
}

Out strided_slice(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0];
  if (x.shape.empty()) return std::nullopt;
  Ints dense = dense_strides(x.shape), begin = a.ints("begin"), steps = a.ints("strides");
  auto end = a.opt_ints("end");
  size_t n = std::min({x.shape.size(), begin.size(), end.size(), steps.size()});
  int64_t start = 0;
  Ints dims, strides;
  for (size_t i = 0; i < n; ++i) {
    int64_t first, count;
    slice_indices(x.shape[i], begin[i], end[i], steps[i], first, count);
    dims.push_back(count);
    start += first * dense[i];
    strides.push_back(steps[i] * dense[i]);
  }
  return strided(x, outs[0], start, dims, strides);
}

Out broadcast_to(const Attrs &, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &y = outs[0];
  if (y.shape.empty()) return std::nullopt;
  Ints shape_x = padded(x.shape, y.shape.size()), dense = dense_strides(shape_x), strides;
  for (size_t i = 0; i < std::min(shape_x.size(), y.shape.size()); ++i)
    strides.push_back(shape_x[i] == 1 && y.shape[i] != 1 ? 0 : dense[i]);
  return strided(x, y, 0, y.shape, strides);
}

Out tile(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0];
  Ints multiples = a.ints("multiples"), dense = dense_strides(x.shape), dims, strides;
  for (size_t i = 0; i < std::min(x.shape.size(), multiples.size()); ++i) {
    dims.insert(dims.end(), {multiples[i], x.shape[i]});
    strides.insert(strides.end(), {0, dense[i]});
  }
  if (dims.empty()) return std::nullopt;
  return strided(x, outs[0], 0, dims, strides);
}

Out pad(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &y = outs[0];
  if (x.shape.empty()) return std::nullopt;
  std::string mode = a.s("mode", "constant");
  Ints ints;
  if (mode == "constant") {
    Node zero;
    zero.type = Type::Int;
    const Node *value = a.get("value");
    ints = {OP_PAD};
    put(ints, x); put(ints, y);
    ints.push_back(scalar_bits(value ? *value : zero, x.dtype));
  } else {
    ints = {OP_MIRROR_PAD, mode == "reflect"};
    put(ints, x); put(ints, y);
  }
  append(ints, a.befores("paddings"));
  return made(ints);
}

Out select(const Attrs &, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &c = ins[0], &a = ins[1], &y = outs[0];
  size_t rank = std::max<size_t>(y.shape.size(), 1);
  if (c.dtype != BOOL || rank > 8 || a.dtype < 0) return std::nullopt;
  Ints ints{OP_SELECT};
  for (const Ref *r : {&ins[0], &ins[1], &ins[2], &y}) put(ints, *r, padded(r->shape, rank));
  return made(ints);
}

Out gather(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &params = ins[0], &indices = ins[1];
  int64_t axis = a.i("axis"), bd = a.i("batch_dims", 0);
  if (!(indices.dtype == I32 || indices.dtype == I64) || params.shape.empty()) return std::nullopt;
  Ints ints{OP_GATHER, elements(params.shape, 0, size_t(bd)), elements(params.shape, size_t(bd), size_t(axis)),
            params.shape.at(size_t(axis)), elements(params.shape, size_t(axis) + 1)};
  put(ints, params, Ints{elements(params.shape)});
  put(ints, indices, Ints{std::max<int64_t>(elements(indices.shape), 1)});
  put(ints, outs[0], Ints{elements(outs[0].shape)});
  return made(ints);
}

Out argminmax(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &y = outs[0];
  if (!(y.dtype == I32 || y.dtype == I64) || x.shape.empty()) return std::nullopt;
  Ints ints{OP_ARGMINMAX, a.s("fn") == "argmin"};
  append(ints, around(x.shape, a.i("axis")));
  put(ints, x, Ints{elements(x.shape)});
  put(ints, y, Ints{std::max<int64_t>(elements(y.shape), 1)});
  return made(ints);
}

Out cumulative(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &y = outs[0];
  if (x.dtype == BOOL || y.dtype != x.dtype || x.shape.empty()) return std::nullopt;
  Ints flat{elements(x.shape)};
  Ints ints{OP_CUMULATIVE, a.s("fn") == "prod", a.truth("exclusive"), a.truth("reverse")};
  append(ints, around(x.shape, a.i("axis")));
  put(ints, x, flat); put(ints, y, flat);
  return made(ints);
}

Out one_hot(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &idx = ins[0], &y = outs[0];
  if (!is_int_dtype(idx.dtype)) return std::nullopt;
  int64_t axis = a.i("axis") >= 0 ? a.i("axis") : int64_t(idx.shape.size());
  int64_t outer = elements(idx.shape, 0, size_t(axis)), inner = elements(idx.shape, size_t(axis));
  Ints ints{OP_ONE_HOT, outer, a.i("depth"), inner, scalar_bits(a.need("on_value"), y.dtype),
            scalar_bits(a.need("off_value"), y.dtype)};
  put(ints, idx, Ints{std::max<int64_t>(outer * inner, 1)});
  put(ints, y, Ints{elements(y.shape)});
  return made(ints);
}

Out top_k(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &y = outs[0];
  if (x.dtype == BOOL || x.shape.empty()) return std::nullopt;
  int64_t n = x.shape.back(), k = a.i("k"), rows = elements(x.shape, 0, x.shape.size() - 1);
  Ints ints{OP_TOP_K, a.truth("indices"), rows, n, k};
  put(ints, x, Ints{rows * n}); put(ints, y, Ints{rows * k});
  return made(ints);
}

// runtime/kernels/image.py's source rows/columns and lerps, in its float32 arithmetic.
float resize_scale(int64_t in, int64_t out, bool align_corners) {
  if (align_corners && out > 1) return float(in - 1) / float(out - 1);
  return float(in) / float(out);
}

Ints nearest_index(int64_t in, int64_t out, bool ac, bool hp) {
  float scale = resize_scale(in, out, ac);
  Ints idx;
  for (int64_t d = 0; d < out; ++d) {
    float dst = float(d);
    volatile float src = hp ? (dst + 0.5f) * scale : dst * scale;  // (no fused multiply-add)
    float floor = std::floor(float(src));
    if (ac) floor += (float(src) - floor) >= 0.5f ? 1.0f : 0.0f;
    idx.push_back(std::clamp<int64_t>(int64_t(floor), 0, in - 1));
  }
  return idx;
}

void bilinear_weights(int64_t in, int64_t out, bool ac, bool hp, Ints &lo, Ints &hi,
                      std::vector<double> &lerp) {
  float scale = resize_scale(in, out, ac);
  for (int64_t d = 0; d < out; ++d) {
    float dst = float(d);
    volatile float prod = hp ? (dst + 0.5f) * scale : dst * scale;
    float src = hp ? float(prod) - 0.5f : float(prod);
    float floor = std::floor(src);
    lo.push_back(std::max<int64_t>(int64_t(floor), 0));
    hi.push_back(std::min<int64_t>(int64_t(std::ceil(src)), in - 1));
    lerp.push_back(double(src - floor));
  }
}

Out resize(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &y = outs[0];
  int64_t h = x.shape.at(1), w = x.shape.at(2);
  Ints size = a.ints("size");
  bool ac = a.truth("align_corners"), hp = a.truth("half_pixel_centers");
  if (a.s("mode") == "nearest") {
    Ints ints{OP_RESIZE, 0};
    put(ints, x); put(ints, y);
    append(ints, nearest_index(h, size.at(0), ac, hp));
    append(ints, nearest_index(w, size.at(1), ac, hp));
    return made(ints);
  }
  if (x.dtype == BOOL) return std::nullopt;
  Ints y_lo, y_hi, x_lo, x_hi;
  std::vector<double> y_lerp, x_lerp;
  bilinear_weights(h, size.at(0), ac, hp, y_lo, y_hi, y_lerp);
  bilinear_weights(w, size.at(1), ac, hp, x_lo, x_hi, x_lerp);
  Ints ints{OP_RESIZE, 1};
  put(ints, x); put(ints, y);
  append(ints, y_lo); append(ints, x_lo); append(ints, y_hi); append(ints, x_hi);
  y_lerp.insert(y_lerp.end(), x_lerp.begin(), x_lerp.end());
  return made(ints, y_lerp);
}

Out conv3d(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c) {
  const Ref &x = ins[0], &w = ins[1], &y = outs[0];
  if (x.dtype != F32 || w.dtype != F32 || y.dtype != F32) return generic_conv(a, ins, y, false, 3);
  Ints ints{OP_CONV3D, int64_t(c[1])};
  put(ints, x); put(ints, w); put(ints, y);
  append(ints, a.ints("strides")); append(ints, a.ints("dilations")); append(ints, a.ints("pads"));
  return made(ints);
}

Out pool3d(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  if (ins[0].dtype != F32) return generic_pool(a, ins[0], outs[0], 3);
  Ints ints{OP_POOL3D, a.s("mode") == "max"};
  put(ints, ins[0]); put(ints, outs[0]);
  append(ints, a.ints("ksize")); append(ints, a.ints("strides")); append(ints, a.ints("pads"));
  return made(ints);
}

// spec_int8.py
Out quantize(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0];
  if (x.shape.empty() || x.shape.size() > 6) return std::nullopt;
  Ints ints{OP_QUANTIZE};
  put(ints, x); put(ints, outs[0]);
  return made(ints, {double(float(1.0 / a.f("scale")))});  // kernels.quantized.inverse
}

Out conv2d_int8(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c) {
  auto act = activation(a);
  if (!act || !c[1]) return std::nullopt;
  bool residual = a.truth("residual");
  bool has_bias = int64_t(ins.size()) - residual == 4;
  Ints ints{OP_QCONV, has_bias, residual};
  for (const Ref &r : ins) put(ints, r);
  put(ints, outs[0]);
  append(ints, a.ints("strides")); append(ints, a.ints("dilations")); append(ints, a.ints("pads"));
  std::vector<double> floats;
  epilogue(*act, ints, floats);
  floats.insert(floats.end(), {a.f("x_scale"), a.f("y_scale", 1.0), a.f("residual_scale", 1.0)});
  return made(ints, floats);
}

Out matmul_int8(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c) {
  auto act = activation(a);
  size_t rank = outs[0].shape.size();
  if (!act || !c[1] || rank > 6) return std::nullopt;
  Ints ints{OP_QMATMUL, ins.size() > 3};
  put(ints, ins[0]); put(ints, ins[1], padded(ins[1].shape, rank)); put(ints, ins[2]);
  for (size_t i = 3; i < ins.size(); ++i) put(ints, ins[i]);
  put(ints, outs[0]);
  std::vector<double> floats;
  epilogue(*act, ints, floats);
  floats.insert(floats.end(), {a.f("a_scale"), a.f("y_scale", 1.0)});
  return made(ints, floats);
}

using Encoder = Out (*)(const Attrs &, const std::vector<Ref> &, const std::vector<Ref> &,
                        const std::vector<bool> &);
const std::map<std::string, Encoder> kEncoders = {
    {"conv2d", [](const Attrs &a, const std::vector<Ref> &i, const std::vector<Ref> &o,
                  const std::vector<bool> &c) { return conv(a, i, o, c, false); }},
    {"depthwise_conv2d", [](const Attrs &a, const std::vector<Ref> &i, const std::vector<Ref> &o,
                            const std::vector<bool> &c) { return conv(a, i, o, c, true); }},
    {"matmul", matmul}, {"pool", pool}, {"unary", unary}, {"binary", binary},
    {"softmax", softmax}, {"reduce", reduce}, {"layer_norm", layer_norm}, {"concat", concat},
    {"transpose", transpose}, {"copy", flat_copy}, {"reshape", flat_copy}, {"cast", cast},
    {"strided_slice", strided_slice}, {"broadcast_to", broadcast_to}, {"tile", tile},
    {"pad", pad}, {"argminmax", argminmax}, {"cumulative", cumulative}, {"one_hot", one_hot},
    {"top_k", top_k}, {"resize", resize}, {"conv3d", conv3d}, {"pool3d", pool3d},
    {"select", select}, {"gather", gather}, {"quantize", quantize},
    {"conv2d_int8", conv2d_int8}, {"matmul_int8", matmul_int8}};

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
