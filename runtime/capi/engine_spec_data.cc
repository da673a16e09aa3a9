// The data movement and indexing kinds of runtime/native/spec.py in C++
// (engine_spec_parts.h): copies, casts, transposes, slices, concat, pads, gathers, resize;
// each function is its Python namesake with the same order of tests.
#include <algorithm>
#include <cmath>
#include <set>

#include "engine_spec_parts.h"

namespace nr::spec::detail {
namespace {

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

}  // namespace

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
  if (src == dst) return flat_copy(a, ins, outs, c);
  Ints size{elements(ins[0].shape)};
  Ints ints{OP_G_CAST};
  put(ints, ins[0], size); put(ints, outs[0], size);
  return made(ints);
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

}  // namespace nr::spec::detail
