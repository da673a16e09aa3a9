// The arithmetic kinds of runtime/native/spec.py in C++ (engine_spec_parts.h): convolutions,
// matmul, pools, element-wise, softmax, reductions, layer norm; each function is its
// Python namesake with the same order of tests.
#include <algorithm>
#include <map>
#include <set>

#include "engine_spec_parts.h"

namespace nr::spec::detail {
namespace {

const std::map<std::string, int64_t> kLoop = {
    {"add", 1}, {"sub", 2}, {"mul", 3}, {"div", 4}, {"maximum", 5}, {"minimum", 6},
    {"greater", 7}, {"greater_equal", 8}, {"less", 9}, {"less_equal", 10}, {"equal", 11},
    {"not_equal", 12}, {"pow", 13}, {"floor_div", 14}, {"floor_mod", 15},
    {"logical_and", 16}, {"logical_or", 17}, {"squared_difference", 18}};

// spec.py's _BOOL_LOOP / _LOGICAL: bool operands take the logical functions and (in)equality,
// the others every function but the logical ones.
bool loop_takes(int dtype, const std::string &fn) {
  bool logical = fn == "logical_and" || fn == "logical_or";
  if (dtype == BOOL) return logical || fn == "equal" || fn == "not_equal";
  return !logical;
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
// spec.py's REDUCE_LOGICAL: OP_G_REDUCE's functions of bool.
const std::map<std::string, int64_t> kReduceLogical = {{"any", 6}, {"all", 7}};
const std::set<std::string> kGUnaryInt = {"abs", "neg", "sign", "square", "relu", "relu6"};

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
  if (!act) {  // (an epilogue with no oneDNN post-op: the direct loop, in float32 only)
    if (x.dtype == F32 && compute == F32) return generic_conv(a, ins, y, depthwise);
    return std::nullopt;
  }
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

Out generic_unary(const std::string &fn, const Attrs &a, const Ref &x, const Ref &y) {
  auto code = g_unary(fn);
  bool takes = fn == "logical_not" ? x.dtype == BOOL
                                   : g_float(x.dtype) || (is_int_dtype(x.dtype) && kGUnaryInt.count(fn));
  if (!code || !takes) return std::nullopt;
  Ints size{elements(x.shape)};
  Ints ints{OP_G_UNARY, *code, bits(a.f("alpha", 0.2))};
  put(ints, x, size); put(ints, y, size);
  return made(ints);
}

Out generic_reduce(const Attrs &a, const Ref &x, const Ref &y, const std::set<int64_t> &axes) {
  std::string fn = a.s("fn");
  const auto &fns = x.dtype == BOOL ? kReduceLogical : kReduce;
  if (!fns.count(fn) || y.dtype != x.dtype) return std::nullopt;
  Ints kept, mask;
  for (size_t i = 0; i < x.shape.size(); ++i) {
    kept.push_back(axes.count(int64_t(i)) ? 1 : x.shape[i]);
    mask.push_back(axes.count(int64_t(i)) ? 1 : 0);
  }
  Ints ints{OP_G_REDUCE, fns.at(fn)};
  put(ints, x); put(ints, y, kept); append(ints, mask);
  return made(ints);
}

}  // namespace

int64_t loop_fn(const std::string &fn) { return kLoop.at(fn); }

Out conv2d(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c) {
  return conv(a, ins, outs, c, false);
}

Out depthwise_conv2d(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs,
                     const std::vector<bool> &c) {
  return conv(a, ins, outs, c, true);
}

Out matmul(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs,
           const std::vector<bool> &c) {
  const Ref &A = ins[0], &B = ins[1], &y = outs[0];
  int compute = compute_of(a, A, B);
  if (!onednn_float(A.dtype)) return generic_matmul(a, ins, y);
  if (!io_ok(A.dtype, y.dtype, compute) || !(B.dtype == F32 || B.dtype == compute)) return std::nullopt;
  auto act = activation(a);
  size_t rank = y.shape.size();
  if (!act) {  // (an epilogue with no oneDNN post-op: the loop, in float32 only)
    if (A.dtype == F32 && B.dtype == F32 && compute == F32) return generic_matmul(a, ins, y);
    return std::nullopt;
  }
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

Out unary(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  std::string fn = a.s("fn");
  const Ref &x = ins[0];
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
  const Ref *C = ins.size() == 3 ? &ins[2] : nullptr;  // added before the activation
  const Ref &y = outs[0];
  Chain post;
  if (fn == "squared_difference") { fn = "sub"; post = {{E_SQUARE, 0, 0}}; }
  auto act = activation(a);
  if (!act) return std::nullopt;
  post.insert(post.end(), act->begin(), act->end());
  size_t rank = std::max<size_t>(y.shape.size(), 1);
  Ints shape_y = padded(y.shape, rank), sa = padded(A.shape, rank), sb = padded(B.shape, rank);
  bool onednn = kBinary.count(fn) && (A.dtype == F32 || A.dtype == BF16) && y.shape.size() <= 6 &&
                (sa == shape_y || (sb == shape_y && kSwapped.count(fn)));
  if (!onednn) {
    if (!act->empty() || C) return std::nullopt;  // (the loops have no epilogue)
    fn = a.s("fn");
    if (rank > 8) return std::nullopt;
    auto loop = kLoop.find(fn);
    if (loop == kLoop.end() || !loop_takes(A.dtype, fn)) return std::nullopt;
    Ints ints{OP_G_BINARY, loop->second};
    put(ints, A, sa); put(ints, B, sb); put(ints, y, shape_y);
    return made(ints);
  }
  if (sa != shape_y) { std::swap(A, B); std::swap(sa, sb); fn = kSwapped.at(fn); }
  Ints ints{OP_BINARY, kBinary.at(fn), C != nullptr};
  put(ints, A, sa); put(ints, B, sb);
  if (C) put(ints, *C, padded(C->shape, rank));
  put(ints, y, shape_y);
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
  if (x.shape.empty()) return std::nullopt;
  // Log-softmax is never oneDNN's (off by up to 3e-6 absolute: its log), but our one loop.
  if (x.dtype != F32 || x.shape.size() > 6 || log) {
    Ints flat{elements(x.shape)};
    Ints ints{OP_G_SOFTMAX, log};
    append(ints, around(x.shape, axis));
    put(ints, x, flat); put(ints, y, flat);
    return made(ints);
  }
  Ints ints{OP_SOFTMAX, axis, 0};
  put(ints, x); put(ints, y);
  return made(ints);
}

// ints: x, mask (padded to x's rank), y; floats: fill, masked (spec.py's _masked_softmax).
Out masked_softmax(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &) {
  const Ref &x = ins[0], &mask = ins[1], &y = outs[0];
  if ((x.dtype != F32 && x.dtype != BF16) || y.dtype != x.dtype || x.shape.empty() ||
      x.shape.size() > 8)
    return std::nullopt;
  Ints ints{OP_MASKED_SOFTMAX};
  put(ints, x); put(ints, mask, padded(mask.shape, x.shape.size())); put(ints, y);
  return made(ints, {a.f("fill"), a.f("masked")});
}

Out reduce(const Attrs &a, const std::vector<Ref> &ins, const std::vector<Ref> &outs, const std::vector<bool> &c) {
  const Ref &x = ins[0], &y = outs[0];
  Ints list = a.ints("axes");
  std::set<int64_t> axes(list.begin(), list.end());
  std::string fn = a.s("fn");
  Ints kept;
  for (size_t i = 0; i < x.shape.size(); ++i) kept.push_back(axes.count(int64_t(i)) ? 1 : x.shape[i]);
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

}  // namespace nr::spec::detail
