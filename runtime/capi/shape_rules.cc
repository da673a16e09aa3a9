// Ports of runtime/isa.py's shape rules, one function per rule, in isa.py's order and
// with its messages; tests/runtime/test_c_api.py compares them with isa.py on fuzzed mutants.
#include "shape_rules.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "isa_table.h"

namespace nr {
namespace {

using mp::Node;
using mp::Type;
using Shape = std::vector<int64_t>;

int dtype_of(std::string_view name) {
  for (int i = 0; i < int(sizeof(isa::kDTypes) / sizeof(isa::kDTypes[0])); ++i)
    if (name == isa::kDTypes[i].name) return i;
  return -1;
}

std::string fmt(const TensorType &t) {
  std::string s = std::string(isa::kDTypes[t.dtype].name) + "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

[[noreturn]] void fail(const std::string &reason, const std::string &field) {
  throw RuleError{reason, field};
}

// Attributes passed the schema check, so each present one has its declared type.
int64_t attr_int(const Node &a, const char *name, int64_t dflt) {
  const Node *v = a.get(name);
  return v ? int64_t(v->integer) : dflt;
}
bool attr_bool(const Node &a, const char *name, bool dflt) {
  const Node *v = a.get(name);
  return v ? v->boolean : dflt;
}
std::string attr_str(const Node &a, const char *name, const char *dflt) {
  const Node *v = a.get(name);
  return v ? std::string(v->str()) : dflt;
}
std::vector<int64_t> attr_ints(const Node &a, const char *name) {
  std::vector<int64_t> out;
  if (const Node *v = a.get(name))
    for (const Node &x : v->items) out.push_back(int64_t(x.integer));
  return out;
}

// Element count, saturated far above any limit (Python's ints are exact).
__int128 elements(const Shape &s) {
  for (int64_t d : s) if (d == 0) return 0;
  __int128 n = 1;
  for (int64_t d : s) n = std::min<__int128>(n * d, (__int128)1 << 80);
  return n;
}

Shape broadcast(const std::vector<const Shape *> &shapes) {
  size_t rank = 0;
  for (auto *s : shapes) rank = std::max(rank, s->size());
  Shape out;
  for (size_t axis = 0; axis < rank; ++axis) {
    std::set<int64_t> dims;
    for (auto *s : shapes)
      if (axis + s->size() >= rank) dims.insert((*s)[axis + s->size() - rank]);
    dims.erase(1);
    if (dims.size() > 1) fail("shapes do not broadcast", "in");
    out.push_back(dims.empty() ? 1 : *dims.begin());
  }
  return out;
}

int64_t axis_in(int64_t axis, size_t rank, const char *name) {
  if (axis < 0 || axis >= int64_t(rank))
    fail(std::string(name) + " " + std::to_string(axis) + " is out of range for rank " +
         std::to_string(rank), name);
  return axis;
}

constexpr __int128 kMaxWindow = 1 << 16;

int64_t window_out(__int128 size, __int128 k, __int128 stride, __int128 dilation, __int128 before,
                   __int128 after, const char *name) {
  __int128 effective = (k - 1) * dilation + 1;
  if (effective > kMaxWindow) fail("window extent (dilated) is above the device's limit 65536", name);
  if (effective > size + before + after) fail("window (dilated) is larger than the padded input", name);
  return int64_t((size + before + after - effective) / stride + 1);
}

bool same(const TensorType &a, const TensorType &b) { return a.shape == b.shape && a.dtype == b.dtype; }

using In = std::vector<TensorType>;
using Rule = std::function<TensorType(const In &, const Node &)>;

TensorType one(const In &t, const Node &) { return t[0]; }

bool named_in(const std::string &name, const char *const *names, int count) {
  return std::find(names, names + count, name) != names + count;
}

// isa._needs_one_pass: an activation or an addend is a post-op of oneDNN's binary.
void needs_one_pass(const std::string &what, const char *field, const std::string &fn,
                    const In &t, const Shape &y, int dtype) {
  if (dtype != dtype_of("float32") && dtype != dtype_of("bfloat16"))
    fail(what + " needs a float32 or bfloat16 output, got " +
         std::string(isa::kDTypes[dtype].name), field);
  if (!named_in(fn, isa::kEpilogueBinaryFns, isa::kEpilogueBinaryFnsCount)) {
    std::string names;
    for (int i = 0; i < isa::kEpilogueBinaryFnsCount; ++i)
      names += (i ? ", " : "") + std::string(isa::kEpilogueBinaryFns[i]);
    fail(what + " needs fn one of " + names + ", got " + fn, field);
  }
  bool full = t[0].shape == y || (t[1].shape == y && named_in(fn, isa::kOnePassSwappable,
                                                              isa::kOnePassSwappableCount));
  if (!full || y.size() > 6)
    fail(what + " needs y of rank <= 6 and a (or b, for add, mul, maximum, minimum) of y's "
         "shape", field);
}

// The addend c of `binary` or `binary_quantize`: a's dtype, broadcasting to y.
void addend_fits(const In &t, const Shape &y) {
  bool fits = t[2].dtype == t[0].dtype && t[2].shape.size() <= y.size();
  for (size_t k = 0; fits && k < t[2].shape.size(); ++k) {
    int64_t d = t[2].shape[t[2].shape.size() - 1 - k];
    fits = d == 1 || d == y[y.size() - 1 - k];
  }
  if (!fits)
    fail("c must be " + std::string(isa::kDTypes[t[0].dtype].name) + " and broadcast to y, got " +
         fmt(t[2]), "in");
}

TensorType binary(const In &t, const Node &a) {
  if (t[0].dtype != t[1].dtype) fail("operands have different dtypes; they must match", "in");
  static const std::set<std::string> comparisons = {"greater", "greater_equal", "less", "less_equal",
                                                    "equal", "not_equal"};
  std::string fn = attr_str(a, "fn", "");
  int dtype = comparisons.count(fn) ? dtype_of("bool") : t[0].dtype;
  Shape y = broadcast({&t[0].shape, &t[1].shape});
  std::string act = attr_str(a, "activation", "none");
  if (act != "none") needs_one_pass("activation " + act, "activation", fn, t, y, dtype);
  if (t.size() == 3) {
    needs_one_pass("an addend c", "in", fn, t, y, dtype);
    addend_fits(t, y);
  }
  return {y, dtype};
}

TensorType select(const In &t, const Node &) {
  if (t[0].dtype != dtype_of("bool") || t[1].dtype != t[2].dtype)
    fail("select wants a bool condition and equal branch dtypes, got " + fmt(t[0]) + ", " +
         fmt(t[1]) + ", " + fmt(t[2]), "in");
  return {broadcast({&t[0].shape, &t[1].shape, &t[2].shape}), t[1].dtype};
}

TensorType cast(const In &t, const Node &a) { return {t[0].shape, dtype_of(attr_str(a, "to", ""))}; }

// The trailing [bias] [residual] inputs of matmul and conv: isa.py's checks.
void extras(const In &t, const TensorType &out, bool residual, int64_t bias_n, const char *what) {
  In rest(t.begin() + 2, t.end());
  if (residual) {
    if (rest.empty() || !same(rest.back(), out))
      fail("residual must have the output's type " + fmt(out), "residual");
    rest.pop_back();
  }
  if (rest.size() > 1) fail(std::string(what) + " got too many inputs for its residual flag", "in");
  if (!rest.empty() && rest[0].shape != Shape{bias_n})
    fail("bias " + fmt(rest[0]) + " does not match the " + std::to_string(bias_n) + " outputs", "in");
}

// isa._permuted: `t` read through numpy transpose(perm) (an empty perm: as it is).
TensorType permuted(const TensorType &t, const std::vector<int64_t> &perm, const char *name) {
  if (perm.empty()) return t;
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  bool ok = sorted.size() == t.shape.size();
  for (size_t i = 0; ok && i < sorted.size(); ++i) ok = sorted[i] == int64_t(i);
  if (!ok) {
    std::string p;
    for (int64_t v : perm) p += (p.empty() ? "" : ", ") + std::to_string(v);
    fail(std::string(name) + " [" + p + "] is not a permutation of the " + std::to_string(t.shape.size()) +
         " dims of " + fmt(t), name);
  }
  TensorType out{{}, t.dtype};
  for (int64_t v : perm) out.shape.push_back(t.shape[size_t(v)]);
  return out;
}

TensorType matmul_logical(const In &t, const Node &a);

// isa._matmul: the operands read through perm_a / perm_b, the result stored through perm_y.
TensorType matmul(const In &t, const Node &a) {
  In logical(t);
  logical[0] = permuted(t[0], attr_ints(a, "perm_a"), "perm_a");
  logical[1] = permuted(t[1], attr_ints(a, "perm_b"), "perm_b");
  TensorType out = matmul_logical(logical, a);
  std::vector<int64_t> perm_y = attr_ints(a, "perm_y");
  if (!perm_y.empty()) {
    if (attr_bool(a, "residual", false)) fail("perm_y and residual do not go together", "perm_y");
    out = permuted(out, perm_y, "perm_y");
  }
  return out;
}

TensorType matmul_logical(const In &t, const Node &a) {
  const TensorType &x = t[0], &w = t[1];
  if (x.shape.size() < 2 || w.shape.size() < 2)
    fail("matmul operands must have rank >= 2, got " + fmt(x) + " and " + fmt(w), "in");
  size_t rx = x.shape.size(), rw = w.shape.size();
  int64_t m = x.shape[rx - 2], k = x.shape[rx - 1], k2 = w.shape[rw - 2], n = w.shape[rw - 1];
  if (attr_bool(a, "transpose_a", false)) std::swap(m, k);
  if (attr_bool(a, "transpose_b", false)) std::swap(k2, n);
  if (k != k2) fail("matmul inner dimensions differ: " + fmt(x) + " and " + fmt(w), "in");
  Shape bx(x.shape.begin(), x.shape.end() - 2), bw(w.shape.begin(), w.shape.end() - 2);
  Shape shape = broadcast({&bx, &bw});
  shape.push_back(m);
  shape.push_back(n);
  TensorType out{shape, x.dtype};
  bool residual = attr_bool(a, "residual", false);
  if (residual && t.size() > 2 && x.dtype == dtype_of("bfloat16") && t.back().dtype == dtype_of("float32"))
    out.dtype = dtype_of("float32");  // a bfloat16 product continuing a float32 residual stream
  extras(t, out, residual, n, "matmul");
  return out;
}

TensorType conv_like(const In &t, const Node &a, bool depthwise) {
  const TensorType &x = t[0], &w = t[1];
  if (x.shape.size() != 4 || w.shape.size() != 4)
    fail("conv wants NHWC input and a 4-D filter, got " + fmt(x) + " and " + fmt(w), "in");
  int64_t n = x.shape[0], h = x.shape[1], wd = x.shape[2], c = x.shape[3];
  int64_t kh = w.shape[0], kw = w.shape[1], ci = w.shape[2], co = w.shape[3];
  int64_t groups = depthwise ? 1 : attr_int(a, "groups", 1);
  if (depthwise && ci != c) fail("depthwise filter " + fmt(w) + " does not match the input " + fmt(x), "in");
  if ((__int128)ci * groups != c || co % groups)
    fail("filter " + fmt(w) + " in " + std::to_string(groups) + " group(s) does not match the input " + fmt(x),
         "groups");
  if (std::min(kh, kw) < 1) fail("filter " + fmt(w) + " has an empty window", "in");
  int64_t out_c = depthwise ? c * co : co;
  auto s = attr_ints(a, "strides"), d = attr_ints(a, "dilations"), p = attr_ints(a, "pads");
  int64_t oh = window_out(h, kh, s[0], d[0], p[0], p[1], "dilations");
  int64_t ow = window_out(wd, kw, s[1], d[1], p[2], p[3], "dilations");
  TensorType out{{n, oh, ow, out_c}, x.dtype};
  extras(t, out, !depthwise && attr_bool(a, "residual", false), out_c, "conv");
  return out;
}

TensorType pool(const In &t, const Node &a) {
  if (t[0].shape.size() != 4) fail("pool's input (NHWC) must have rank 4, got " + fmt(t[0]), "in");
  const Shape &x = t[0].shape;
  auto k = attr_ints(a, "ksize"), s = attr_ints(a, "strides"), p = attr_ints(a, "pads");
  if (std::max(p[0], p[1]) >= k[0] || std::max(p[2], p[3]) >= k[1])
    fail("pads must each be smaller than the window", "pads");
  return {{x[0], window_out(x[1], k[0], s[0], 1, p[0], p[1], "ksize"),
           window_out(x[2], k[1], s[1], 1, p[2], p[3], "ksize"), x[3]}, t[0].dtype};
}

TensorType reduce(const In &t, const Node &a) {
  auto axes = attr_ints(a, "axes");
  for (int64_t ax : axes) axis_in(ax, t[0].shape.size(), "axes");
  std::set<int64_t> distinct(axes.begin(), axes.end());
  if (distinct.size() != axes.size()) fail("axes repeat an axis", "axes");
  bool keep = attr_bool(a, "keepdims", false);
  Shape shape;
  for (size_t i = 0; i < t[0].shape.size(); ++i) {
    bool reduced = distinct.count(int64_t(i));
    if (keep || !reduced) shape.push_back(reduced ? 1 : t[0].shape[i]);
  }
  return {shape, t[0].dtype};
}

TensorType softmax(const In &t, const Node &a) {
  axis_in(attr_int(a, "axis", 0), t[0].shape.size(), "axis");
  return t[0];
}

TensorType argminmax(const In &t, const Node &a) {
  int64_t axis = axis_in(attr_int(a, "axis", 0), t[0].shape.size(), "axis");
  Shape shape;
  for (size_t i = 0; i < t[0].shape.size(); ++i) if (int64_t(i) != axis) shape.push_back(t[0].shape[i]);
  return {shape, dtype_of(attr_str(a, "to", ""))};
}

TensorType reshape(const In &t, const Node &a) {
  Shape shape = attr_ints(a, "shape");
  if (elements(shape) != elements(t[0].shape)) fail("cannot reshape " + fmt(t[0]), "shape");
  return {shape, t[0].dtype};
}

TensorType transpose(const In &t, const Node &a) {
  Shape perm = attr_ints(a, "perm"), sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  bool ok = sorted.size() == t[0].shape.size();
  for (size_t i = 0; ok && i < sorted.size(); ++i) ok = sorted[i] == int64_t(i);
  if (!ok) fail("perm is not a permutation of the dims of " + fmt(t[0]), "perm");
  Shape shape;
  for (int64_t p : perm) shape.push_back(t[0].shape[size_t(p)]);
  return {shape, t[0].dtype};
}

TensorType concat(const In &t, const Node &a) {
  const TensorType &first = t[0];
  size_t axis = size_t(axis_in(attr_int(a, "axis", 0), first.shape.size(), "axis"));
  int64_t total = 0;
  for (const TensorType &o : t) {
    bool ok = o.dtype == first.dtype && o.shape.size() == first.shape.size();
    for (size_t i = 0; ok && i < o.shape.size(); ++i) ok = i == axis || o.shape[i] == first.shape[i];
    if (!ok) fail("cannot concatenate " + fmt(first) + " and " + fmt(o), "in");
    total += o.shape[axis];
  }
  Shape shape = first.shape;
  shape[axis] = total;
  return {shape, first.dtype};
}

void per_dim(size_t n, size_t rank, const char *name) {
  if (n != rank) fail(std::string(name) + " has " + std::to_string(n) + " entries for a rank-" +
                      std::to_string(rank) + " input; it needs one per dim", name);
}

double attr_num(const Node &a, const char *name, double dflt) {
  const Node *v = a.get(name);
  if (!v) return dflt;
  return v->type == Type::Float ? v->real : double(v->integer);
}

// One Python slice's length over a dim: len(range(*slice(b, e, s).indices(d))).
int64_t slice_len(int64_t d, int64_t b, const Node &end, int64_t s) {
  __int128 lower = s < 0 ? -1 : 0, upper = s < 0 ? d - 1 : d;
  auto clamp = [&](__int128 v) {
    if (v < 0) { v += d; if (v < lower) v = lower; }
    else if (v > upper) v = upper;
    return v;
  };
  __int128 start = clamp(b);
  __int128 stop = end.type == Type::Nil ? (s < 0 ? lower : upper) : clamp(end.integer);
  __int128 n = s > 0 ? (stop - start + s - 1) / s : (start - stop + (-s) - 1) / (-s);
  return n > 0 ? int64_t(n) : 0;
}

TensorType strided_slice(const In &t, const Node &a) {
  size_t rank = t[0].shape.size();
  const Node *end = a.get("end");
  auto begin = a.get("begin"), strides = a.get("strides");
  per_dim(begin->items.size(), rank, "begin");
  per_dim(end->items.size(), rank, "end");
  per_dim(strides->items.size(), rank, "strides");
  for (const Node &x : strides->items) if (x.integer == 0) fail("strides must not be 0", "strides");
  Shape shape;
  for (size_t i = 0; i < rank; ++i)
    shape.push_back(slice_len(t[0].shape[i], int64_t(begin->items[i].integer), end->items[i],
                              int64_t(strides->items[i].integer)));
  return {shape, t[0].dtype};
}

TensorType masked_softmax(const In &t, const Node &) {
  const TensorType &x = t[0], &mask = t[1];
  if ((x.dtype != dtype_of("float32") && x.dtype != dtype_of("bfloat16")) || x.shape.empty())
    fail("x must be a float32 or bfloat16 tensor of rank >= 1, got " + fmt(x), "in");
  if (mask.dtype != dtype_of("bool")) fail("mask must be bool, got " + fmt(mask), "in");
  if (mask.shape.size() > x.shape.size() || broadcast({&x.shape, &mask.shape}) != x.shape)
    fail("mask " + fmt(mask) + " must broadcast to x " + fmt(x) + " without growing it", "in");
  return x;
}

TensorType layer_norm(const In &t, const Node &a) {
  const TensorType &x = t[0];
  if ((x.dtype != dtype_of("float32") && x.dtype != dtype_of("float16") && x.dtype != dtype_of("float64")) ||
      x.shape.empty())
    fail("x must be a float tensor of rank >= 1, got " + fmt(x), "in");
  if (attr_num(a, "epsilon", 0) < 0) fail("epsilon must be >= 0", "epsilon");
  for (int i = 1; i <= 2; ++i)
    if (t[i].shape != Shape{x.shape.back()} || t[i].dtype != x.dtype)
      fail(std::string(i == 1 ? "scale" : "shift") + " must be x's dtype and last dim, got " + fmt(t[i]), "in");
  return x;
}

TensorType pad(const In &t, const Node &a) {
  const TensorType &x = t[0];
  const Node *p = a.get("paddings");
  per_dim(p->items.size(), x.shape.size(), "paddings");
  std::string mode = attr_str(a, "mode", "constant");
  Shape shape;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    int64_t b = int64_t(p->items[i].items[0].integer), e = int64_t(p->items[i].items[1].integer);
    if (mode != "constant" && std::max(b, e) > x.shape[i] - (mode == "reflect" ? 1 : 0))
      fail(mode + " paddings are too large for " + fmt(x), "paddings");
    shape.push_back(x.shape[i] + b + e);
  }
  return {shape, x.dtype};
}

TensorType tile(const In &t, const Node &a) {
  auto m = attr_ints(a, "multiples");
  per_dim(m.size(), t[0].shape.size(), "multiples");
  Shape shape;
  for (size_t i = 0; i < m.size(); ++i) shape.push_back(t[0].shape[i] * m[i]);
  return {shape, t[0].dtype};
}

TensorType broadcast_to(const In &t, const Node &a) {
  Shape shape = attr_ints(a, "shape");
  bool fits = shape.size() >= t[0].shape.size();
  if (fits) {
    try { fits = broadcast({&t[0].shape, &shape}) == shape; } catch (const RuleError &) { fits = false; }
  }
  if (!fits) fail(fmt(t[0]) + " does not broadcast to the shape", "shape");
  return {shape, t[0].dtype};
}

TensorType gather(const In &t, const Node &a) {
  const TensorType &params = t[0], &indices = t[1];
  int64_t axis = axis_in(attr_int(a, "axis", 0), params.shape.size(), "axis");
  int64_t bd = attr_int(a, "batch_dims", 0);
  if (indices.dtype != dtype_of("int32") && indices.dtype != dtype_of("int64"))
    fail("gather indices must be int32 or int64", "in");
  if (bd > std::min<int64_t>(axis, int64_t(indices.shape.size())))
    fail("batch_dims must be at most min(axis, rank of indices)", "batch_dims");
  if (!std::equal(params.shape.begin(), params.shape.begin() + bd, indices.shape.begin()))
    fail("the batch dims of params and indices differ", "batch_dims");
  Shape shape(params.shape.begin(), params.shape.begin() + axis);
  shape.insert(shape.end(), indices.shape.begin() + bd, indices.shape.end());
  shape.insert(shape.end(), params.shape.begin() + axis + 1, params.shape.end());
  return {shape, params.dtype};
}

TensorType conv3d(const In &t, const Node &a) {
  if (t[0].shape.size() != 5) fail("conv3d's input (NDHWC) must have rank 5, got " + fmt(t[0]), "in");
  if (t[1].shape.size() != 5) fail("conv3d's filter must have rank 5, got " + fmt(t[1]), "in");
  if (t[0].dtype != t[1].dtype) fail("input and filter dtypes differ", "in");
  if (t[1].shape[3] != t[0].shape[4]) fail("filter channels differ from the input's", "in");
  auto s = attr_ints(a, "strides"), d = attr_ints(a, "dilations"), p = attr_ints(a, "pads");
  Shape shape{t[0].shape[0]};
  for (int i = 0; i < 3; ++i)
    shape.push_back(window_out(t[0].shape[1 + i], t[1].shape[i], s[i], d[i], p[2 * i], p[2 * i + 1], "filter"));
  shape.push_back(t[1].shape[4]);
  return {shape, t[0].dtype};
}

TensorType pool3d(const In &t, const Node &a) {
  if (t[0].shape.size() != 5) fail("pool3d's input (NDHWC) must have rank 5, got " + fmt(t[0]), "in");
  auto k = attr_ints(a, "ksize"), s = attr_ints(a, "strides"), p = attr_ints(a, "pads");
  for (int i = 0; i < 3; ++i)
    if (std::max(p[2 * i], p[2 * i + 1]) >= k[i]) fail("pads must each be smaller than the window", "pads");
  Shape shape{t[0].shape[0]};
  for (int i = 0; i < 3; ++i)
    shape.push_back(window_out(t[0].shape[1 + i], k[i], s[i], 1, p[2 * i], p[2 * i + 1], "ksize"));
  shape.push_back(t[0].shape[4]);
  return {shape, t[0].dtype};
}

TensorType cumulative(const In &t, const Node &a) {
  axis_in(attr_int(a, "axis", 0), t[0].shape.size(), "axis");
  if (t[0].dtype == dtype_of("bool")) fail("cumulative takes numbers, got bool", "in");
  return t[0];
}

TensorType top_k(const In &t, const Node &a) {
  int64_t k = attr_int(a, "k", 0);
  if (t[0].shape.empty() || k > t[0].shape.back()) fail("k must be at most the last dim of " + fmt(t[0]), "k");
  if (t[0].dtype == dtype_of("bool")) fail("top_k takes numbers, got bool", "in");
  Shape shape = t[0].shape;
  shape.back() = k;
  return {shape, attr_bool(a, "indices", false) ? dtype_of(attr_str(a, "to", "int32")) : t[0].dtype};
}

TensorType one_hot(const In &t, const Node &a) {
  static const std::set<std::string> integers = {"int8", "uint8", "int16", "int32", "int64"};
  if (!integers.count(isa::kDTypes[t[0].dtype].name)) fail("one_hot indices must be integers", "in");
  Shape shape = t[0].shape;
  int64_t axis = attr_int(a, "axis", -1);
  if (axis < 0) axis = int64_t(shape.size());
  if (axis > int64_t(shape.size())) fail("axis must be -1 or within the rank", "axis");
  shape.insert(shape.begin() + axis, attr_int(a, "depth", 0));
  return {shape, dtype_of(attr_str(a, "to", ""))};
}

TensorType resize(const In &t, const Node &a) {
  if (t[0].shape.size() != 4) fail("resize's input (NHWC) must have rank 4, got " + fmt(t[0]), "in");
  if (std::min(t[0].shape[1], t[0].shape[2]) < 1) fail("cannot resize the empty image " + fmt(t[0]), "in");
  auto size = attr_ints(a, "size");
  return {{t[0].shape[0], size[0], size[1], t[0].shape[3]},
          attr_str(a, "mode", "") == "bilinear" ? dtype_of("float32") : t[0].dtype};
}

TensorType quantize(const In &t, const Node &a) {
  if (t[0].dtype != dtype_of("float32") && t[0].dtype != dtype_of("bfloat16"))
    fail("quantize takes float32 or bfloat16, got " + fmt(t[0]), "in");
  double scale = attr_num(a, "scale", 0);
  if (!(std::isfinite(scale) && scale > 0)) fail("scale must be a finite number > 0", "scale");
  return {t[0].shape, dtype_of(attr_str(a, "to", ""))};
}

TensorType binary_quantize(const In &t, const Node &a) {
  if (t[0].dtype != t[1].dtype ||
      (t[0].dtype != dtype_of("float32") && t[0].dtype != dtype_of("bfloat16")))
    fail("binary_quantize takes two float32 or two bfloat16 operands, got " + fmt(t[0]) +
         " and " + fmt(t[1]), "in");
  double scale = attr_num(a, "scale", 0);
  if (!(std::isfinite(scale) && scale > 0)) fail("scale must be a finite number > 0", "scale");
  Shape y = broadcast({&t[0].shape, &t[1].shape});
  if (t.size() == 3) addend_fits(t, y);
  return {y, dtype_of(attr_str(a, "to", ""))};
}

// conv2d_int8 / matmul_int8 (isa.py's _int8_operands, _float_extras, _positive).
bool quantized(int dtype) { return dtype == dtype_of("uint8") || dtype == dtype_of("int8"); }

void positive(const Node &a, const char *name, double dflt) {
  double v = attr_num(a, name, dflt);
  if (!(std::isfinite(v) && v > 0)) fail(std::string(name) + " must be a finite number > 0", name);
}

void int8_operands(const In &t, const Node &a, const char *x_scale, int64_t out_ch) {
  if (!quantized(t[0].dtype) || t[1].dtype != dtype_of("int8"))
    fail("int8 operands must be uint8/int8 and int8, got " + fmt(t[0]) + " and " + fmt(t[1]), "in");
  if (t[2].dtype != dtype_of("float32") || t[2].shape != Shape{out_ch})
    fail("w_scale must be float32[" + std::to_string(out_ch) + "], got " + fmt(t[2]), "in");
  positive(a, x_scale, 0);
  positive(a, "y_scale", 1.0);
}

void float_extras(const In &t, int64_t bias_n, const TensorType &out, bool residual) {
  In rest(t.begin() + 3, t.end());
  if (residual) {
    if (rest.empty() || rest.back().shape != out.shape ||
        !(quantized(rest.back().dtype) || rest.back().dtype == dtype_of("float32")))
      fail("residual must be float32, uint8 or int8 of the output's shape", "residual");
    rest.pop_back();
  }
  if (rest.size() > 1) fail("too many inputs for the residual flag", "in");
  if (!rest.empty() && (rest[0].shape != Shape{bias_n} || rest[0].dtype != dtype_of("float32")))
    fail("bias must be float32[" + std::to_string(bias_n) + "], got " + fmt(rest[0]), "in");
}

TensorType conv2d_int8(const In &t, const Node &a) {
  if (t[1].shape.size() != 4) fail("conv2d_int8's filter must be 4-D, got " + fmt(t[1]), "in");
  bool depthwise = attr_bool(a, "depthwise", false);
  int8_operands(t, a, "x_scale", t[1].shape[3] * (depthwise ? t[1].shape[2] : 1));
  // The float conv's rule on x and w alone, one group, no residual.
  In xw{t[0], t[1]};
  Node plain_attrs;
  plain_attrs.type = Type::Map;
  for (size_t i = 0; i + 1 < a.items.size(); i += 2)
    if (a.items[i].is_str("strides") || a.items[i].is_str("dilations") || a.items[i].is_str("pads")) {
      plain_attrs.items.push_back(a.items[i]);
      plain_attrs.items.push_back(a.items[i + 1]);
    }
  TensorType y = conv_like(xw, plain_attrs, depthwise);
  y.dtype = dtype_of(attr_str(a, "out", "float32"));
  float_extras(t, y.shape[3], TensorType{y.shape, dtype_of("float32")}, attr_bool(a, "residual", false));
  return y;
}

TensorType matmul_int8(const In &t, const Node &a) {
  if (t[1].shape.size() != 2) fail("matmul_int8's b must be 2-D [K, N], got " + fmt(t[1]), "in");
  int8_operands(t, a, "a_scale", t[1].shape[1]);
  if (t[0].shape.size() < 2 || t[0].shape.back() != t[1].shape[0])
    fail("matmul_int8 inner dimensions differ: " + fmt(t[0]) + " and " + fmt(t[1]), "in");
  Shape shape(t[0].shape.begin(), t[0].shape.end() - 1);
  shape.push_back(t[1].shape[1]);
  TensorType y{shape, dtype_of(attr_str(a, "out", "float32"))};
  bool residual = attr_bool(a, "residual", false);
  float_extras(t, y.shape.back(), y, residual);
  if (residual && t.back().dtype != dtype_of("float32"))
    fail("matmul_int8's residual must be float32, got " + fmt(t.back()), "residual");
  return y;
}

const std::map<std::string, Rule> &rules() {
  static const std::map<std::string, Rule> table = {
      {"unary", one}, {"copy", one}, {"binary", binary}, {"select", select}, {"cast", cast},
      {"matmul", matmul},
      {"conv2d", [](const In &t, const Node &a) { return conv_like(t, a, false); }},
      {"depthwise_conv2d", [](const In &t, const Node &a) { return conv_like(t, a, true); }},
      {"pool", pool}, {"reduce", reduce}, {"softmax", softmax}, {"argminmax", argminmax},
      {"reshape", reshape}, {"transpose", transpose}, {"concat", concat},
      {"strided_slice", strided_slice}, {"masked_softmax", masked_softmax},
      {"layer_norm", layer_norm}, {"pad", pad}, {"tile", tile},
      {"broadcast_to", broadcast_to}, {"gather", gather}, {"conv3d", conv3d}, {"pool3d", pool3d},
      {"cumulative", cumulative}, {"top_k", top_k}, {"one_hot", one_hot}, {"resize", resize},
      {"quantize", quantize}, {"binary_quantize", binary_quantize},
      {"conv2d_int8", conv2d_int8}, {"matmul_int8", matmul_int8}};
  return table;
}

}  // namespace

bool derive_types(const std::string &kind, const std::vector<TensorType> &in, const mp::Node &attrs,
                  std::vector<TensorType> &out) {
  auto it = rules().find(kind);
  if (it == rules().end()) return false;
  out = {it->second(in, attrs)};
  return true;
}

}  // namespace nr
