// What the engine spec encoder's files share (engine_spec.cc: helpers and dispatch;
// engine_spec_compute.cc: arithmetic kinds; engine_spec_data.cc: data movement and
// indexing kinds; engine_spec_int8.cc: spec_int8.py). Internal to the encoder.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "engine_spec.h"

namespace nr::spec::detail {

using mp::Node;
using mp::Type;

// nr_dtype indices (neuronish_runtime.h).
enum D { BOOL, I8, U8, I16, I32, I64, F16, BF16, F32, F64 };
// spec.py's DTYPES: engine.cc's codes, by nr_dtype.
constexpr int64_t kEngineDType[] = {9, 4, 2, 8, 3, 6, 5, 1, 0, 7};

enum : int64_t {
  OP_CONV = 1, OP_MATMUL = 2, OP_POOL = 3, OP_ELTWISE = 4, OP_BINARY = 5, OP_SOFTMAX = 6,
  OP_REDUCE = 7, OP_CONCAT = 8, OP_TRANSPOSE = 9, OP_REORDER = 10, OP_LAYER_NORM = 11,
  OP_SELECT = 14, OP_GATHER = 15, OP_STRIDED_COPY = 16, OP_PAD = 17,
  OP_ARGMINMAX = 20, OP_CUMULATIVE = 21,
  OP_ONE_HOT = 22, OP_TOP_K = 23, OP_MIRROR_PAD = 24, OP_RESIZE = 25, OP_CONV3D = 28, OP_POOL3D = 29,
  OP_MASKED_SOFTMAX = 30,
  OP_QUANTIZE = 40, OP_QCONV = 41, OP_QMATMUL = 42, OP_QBINARY = 43,
  OP_G_UNARY = 50, OP_G_BINARY = 51, OP_G_REDUCE = 52, OP_G_CAST = 53, OP_G_POOL = 54,
  OP_G_SOFTMAX = 55, OP_G_LAYER_NORM = 56, OP_G_CONCAT = 57, OP_G_MATMUL = 58, OP_G_CONV = 59,
  OP_ALIAS = 60,
};
enum : int64_t {
  E_RELU = 1, E_CLIP = 2, E_ELU = 3, E_LOGISTIC = 4, E_TANH = 5, E_EXP = 7, E_SQRT = 9,
  E_SQUARE = 10, E_ABS = 11, E_LINEAR = 12, E_POW = 13, E_GELU_TANH = 15, E_GELU_ERF = 16,
  E_SWISH = 17, E_HARDSWISH = 18, E_HARDSIGMOID = 19,
};

struct Step { int64_t code; double alpha, beta; };
using Chain = std::vector<Step>;
using Ints = std::vector<int64_t>;
using Out = std::optional<Spec>;

inline bool is_int_dtype(int d) { return d == I8 || d == U8 || d == I16 || d == I32 || d == I64; }
inline bool g_float(int d) { return d == F32 || d == F64 || d == F16 || d == BF16; }
inline bool onednn_float(int d) { return d == F32 || d == BF16 || d == F16; }
inline bool movable(int d) { return d == F32 || d == I32 || d == U8 || d == BOOL || d == I8 || d == BF16 || d == F16; }

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

// engine_spec.cc's helpers (spec.py's private functions of the same names).
int dtype_of(std::string_view name);
int64_t elements(const Ints &shape, size_t from = 0, size_t to = SIZE_MAX);
Ints padded(const Ints &shape, size_t rank);
Ints dense_strides(const Ints &shape);
void put(Ints &ints, const Ref &r, const Ints *shape = nullptr);
void put(Ints &ints, const Ref &r, const Ints &shape);
void append(Ints &ints, const Ints &more);
Spec made(Ints ints, std::vector<double> floats = {});
std::optional<Chain> chain_of(const std::string &fn, double alpha);
void epilogue(const Chain &chain, Ints &ints, std::vector<double> &floats);
std::optional<Chain> activation(const Attrs &a);
std::optional<int64_t> g_unary(const std::string &fn);
int64_t loop_fn(const std::string &fn);  // spec.py's LOOP (a known binary function)
std::optional<int64_t> act_code(const Attrs &a);
int64_t bits(double v);
int64_t scalar_bits(const Node &v, int dtype);
Ints around(const Ints &shape, int64_t axis);
bool io_ok(int x, int y, int compute);
int compute_of(const Attrs &a, const Ref &x, const Ref &w);
Out strided(const Ref &x, const Ref &y, int64_t start, const Ints &dims, const Ints &strides);

// One encoder per kind (spec.py's _ENCODERS), defined in the files named above.
#define NR_SPEC_ENCODER(name) \
  Out name(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c)
NR_SPEC_ENCODER(conv2d); NR_SPEC_ENCODER(depthwise_conv2d); NR_SPEC_ENCODER(matmul);
NR_SPEC_ENCODER(pool); NR_SPEC_ENCODER(unary); NR_SPEC_ENCODER(binary); NR_SPEC_ENCODER(softmax);
NR_SPEC_ENCODER(masked_softmax);
NR_SPEC_ENCODER(reduce); NR_SPEC_ENCODER(layer_norm); NR_SPEC_ENCODER(conv3d); NR_SPEC_ENCODER(pool3d);
NR_SPEC_ENCODER(flat_copy); NR_SPEC_ENCODER(concat); NR_SPEC_ENCODER(transpose); NR_SPEC_ENCODER(cast);
NR_SPEC_ENCODER(strided_slice); NR_SPEC_ENCODER(broadcast_to); NR_SPEC_ENCODER(tile); NR_SPEC_ENCODER(pad);
NR_SPEC_ENCODER(select); NR_SPEC_ENCODER(gather); NR_SPEC_ENCODER(argminmax); NR_SPEC_ENCODER(cumulative);
NR_SPEC_ENCODER(one_hot); NR_SPEC_ENCODER(top_k); NR_SPEC_ENCODER(resize);
NR_SPEC_ENCODER(quantize); NR_SPEC_ENCODER(binary_quantize); NR_SPEC_ENCODER(conv2d_int8);
NR_SPEC_ENCODER(matmul_int8);
#undef NR_SPEC_ENCODER

}  // namespace nr::spec::detail
