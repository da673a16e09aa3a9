// --- int8 (docs/int8.md; the numpy kernels in runtime/kernels/quantized.py define it) ------
//
// quantize: a reorder f32 (or bf16) -> u8/s8 whose source scale is float32(1/scale): one multiply,
// round half to even, saturate. conv2d_int8 / matmul_int8: oneDNN's int8 primitives
// (AMX-INT8 or VNNI on this CPU) with a per-tensor source scale, per-output-channel weight
// scales and, for an 8-bit output, a destination scale; bias, residual (a binary post-op)
// and the activation are applied in f32 between the scales, as the reference does. A
// float output is f32 or bf16 (rounded once, to nearest even, by the primitive).
namespace {

// A one-element scale (f32) or zero point (s32) owned by the program (oneDNN 3 takes both
// as memory arguments).
template <class T>
memory one_value_memory(Program& p, T value, dt type) {
  void* buf = std::aligned_alloc(64, 64);
  if (!buf) throw Error("out of host memory for a scale or zero point");
  p.owned.emplace_back(buf, std::free);
  *static_cast<T*>(buf) = value;
  return memory(memory::desc({1}, type, tag::a), p.eng, buf);
}

memory scale_memory(Program& p, float value) { return one_value_memory(p, value, dt::f32); }

// quantize's loop: v = x * inv (one float32 multiply), clamped to [lo, hi] in float (so a
// value beyond int32 saturates too), rounded half to even (the default MXCSR mode of
// cvtps2dq, and nearbyintf), narrowed; NaN gives 0, as the reference's nan_to_num. oneDNN
// 3.2's reorder with a source scale ran bf16 -> u8 at ~15 ns an element here: slower than
// the convolution it fed.
using QuantizeSpan = void (*)(const void*, void*, int64_t, int64_t, float);

template <class X>
float quantize_load(const X* x, int64_t i) {
  if constexpr (std::is_same<X, float>::value) {
    return x[i];
  } else {  // bf16: the upper half of a float32
    uint32_t bits = uint32_t(x[i]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
}

// quantize's conversion of one float: NaN gives 0 (the reference's nan_to_num).
template <class Y>
Y saturate_round(float v) {
  constexpr float lo = std::is_same<Y, uint8_t>::value ? 0.f : -128.f;
  constexpr float hi = std::is_same<Y, uint8_t>::value ? 255.f : 127.f;
  if (std::isnan(v)) return Y(0);
  return (Y)(int)std::nearbyint(std::min(std::max(v, lo), hi));
}

template <class X, class Y>
void quantize_span(const void* xv, void* yv, int64_t begin, int64_t end, float inv) {
  const X* x = static_cast<const X*>(xv);
  Y* y = static_cast<Y*>(yv);
  for (int64_t i = begin; i < end; ++i) y[i] = saturate_round<Y>(quantize_load(x, i) * inv);
}

template <class X, class Y>
NEURONISH_AVX512 void quantize_span_avx512(const void* xv, void* yv, int64_t begin,
                                           int64_t end, float inv) {
  const X* x = static_cast<const X*>(xv);
  Y* y = static_cast<Y*>(yv);
  const __m512 lo = _mm512_set1_ps(std::is_same<Y, uint8_t>::value ? 0.f : -128.f);
  const __m512 hi = _mm512_set1_ps(std::is_same<Y, uint8_t>::value ? 255.f : 127.f);
  const __m512 k = _mm512_set1_ps(inv);
  for (int64_t i = begin; i < end; i += 16) {
    __mmask16 m = end - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (end - i)) - 1);
    __m512 v;
    if constexpr (std::is_same<X, float>::value) {
      v = _mm512_maskz_loadu_ps(m, x + i);
    } else {  // bf16: the upper half of a float32
      __m256i h = _mm256_maskz_loadu_epi16(m, x + i);
      v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    // max/min return their second operand when either is NaN: NaN survives the clamp,
    // converts to INT_MIN and narrows (truncating) to 0. (Clamping it to lo instead gave
    // int8 -128 where the reference gives 0.)
    v = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v, k)));
    _mm_mask_storeu_epi8(y + i, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
  }
}

// AVX2: 8 lanes. NaN lanes are zeroed before the conversion (the packs below saturate,
// where AVX-512's narrowing truncates INT_MIN to 0). The scalar span took ~5 ns an element
// (nearbyint is a call): 16 ms for EfficientNet's 8x112x112x32 squeeze-excite product.
template <class X>
NEURONISH_AVX2 inline __m256 load8_as_f32(const X* x) {
  if constexpr (std::is_same<X, float>::value) {
    return _mm256_loadu_ps(x);
  } else {  // bf16: the upper half of a float32
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// 8 floats times k, clamped to Y's range, rounded half to even (NaN gives 0), stored.
template <class Y>
NEURONISH_AVX2 inline void store8_quantized(__m256 v, __m256 k, Y* y) {
  const __m256 lo = _mm256_set1_ps(std::is_same<Y, uint8_t>::value ? 0.f : -128.f);
  const __m256 hi = _mm256_set1_ps(std::is_same<Y, uint8_t>::value ? 255.f : 127.f);
  v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(v, k)));  // (NaN stays NaN)
  v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));          // NaN -> 0
  __m256i i = _mm256_cvtps_epi32(v);
  __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  __m128i b = std::is_same<Y, uint8_t>::value ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(y), b);
}

template <class X, class Y>
NEURONISH_AVX2 void quantize_span_avx2(const void* xv, void* yv, int64_t begin, int64_t end,
                                       float inv) {
  const X* x = static_cast<const X*>(xv);
  Y* y = static_cast<Y*>(yv);
  const __m256 k = _mm256_set1_ps(inv);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) store8_quantized<Y>(load8_as_f32(x + i), k, y + i);
  quantize_span<X, Y>(xv, yv, i, end, inv);
}

void add_quantize(Program& p, Reader& rd, Instr& ins) {
  Ref x = rd.ref(), y = rd.ref();
  float inv = rd.nextf();
  if ((x.type != dt::f32 && x.type != dt::bf16) || (y.type != dt::u8 && y.type != dt::s8) ||
      x.dims != y.dims)
    throw Error("quantize: f32/bf16 to u8/s8 of the same shape only");
  int64_t n = Program::count(x);
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
  bool avx2 = __builtin_cpu_supports("avx2");
  auto pick = [&](auto xt, auto yt) -> QuantizeSpan {
    using X = decltype(xt);
    using Y = decltype(yt);
    return avx512 ? quantize_span_avx512<X, Y>
                  : avx2 ? quantize_span_avx2<X, Y> : quantize_span<X, Y>;
  };
  bool bf16 = x.type == dt::bf16, u8 = y.type == dt::u8;
  QuantizeSpan span = bf16 ? (u8 ? pick(uint16_t(), uint8_t()) : pick(uint16_t(), int8_t()))
                           : (u8 ? pick(float(), uint8_t()) : pick(float(), int8_t()));
  Step s;
  p.byte_arg(s, x);
  p.byte_arg(s, y);
  p.push_loop(ins, s, "neuronish:quantize", [=](const Step& st, int threads) {
    const void* px = data<const char>(st, 0);
    void* py = data<char>(st, 1);
    const int64_t chunk = 1 << 14;  // elements per task (a multiple of 16)
    const int64_t tasks = (n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) if (threads > 1 && tasks > 1)
    for (int64_t t = 0; t < tasks; ++t)
      span(px, py, t * chunk, std::min(n, (t + 1) * chunk), inv);
  });
}

// --- binary_quantize: y = quantize(act(binary(a, b) [+ c])) in one pass (isa.py) ----------
//
// The float result is never stored: each element is computed in float32, plus the addend c
// when there is one, rounded to bf16 (nearest even) when the operands are bf16 -- the value
// the unfused `binary` stores -- through the ReLU when asked, and quantized as `quantize`
// does. Operands broadcast (numpy rules); the dims are first merged where all operands
// broadcast alike, so a squeeze-excite product a [N, H, W, C] * b [N, 1, 1, C] is N*H*W rows
// of C elements, b's row fixed for each image, and a BatchNorm's x [N, H, W, C] * scale [C]
// + shift [C] is N*H*W rows of C, the scale's and the shift's rows the same every time.
//
// The loops are built with and without c (HasC): adding a zero instead cost the
// squeeze-excite products 50% (one more load, add and a field re-read per 8 elements).
// The ReLU is max(v, 0) before scaling (relu commutes with the bf16 rounding), written so
// that a NaN stays NaN (x86's max returns its second operand when either is NaN) and then
// quantizes to 0, as `quantize` defines.

// float32 -> the nearest bf16 (ties to even), as a float32; NaN stays NaN.
inline float round_to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if (std::isnan(v)) return v;
  u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&v, &u, 4);
  return v;
}

template <int64_t Fn>
inline float binary_fn(float a, float b) {
  if constexpr (Fn == F_ADD) return a + b;
  else if constexpr (Fn == F_SUB) return a - b;
  else return a * b;
}

// The rows of one task: row r reads operand k at element offset at[k][r] and writes
// y[r * n, (r + 1) * n); along a row operand k advances by step[k]: 1, or 0 (one value
// broadcast over the row). Operands: a, b, c.
struct QRows {
  const int64_t* at[3];
  int64_t step[3];
  int64_t rows, first, n;
  bool relu;
};

// Elements [from, q.n) of one row, one at a time (the scalar loop, and vector loops' tails).
// (The loops copy QRows' fields to locals: their 8-bit stores may alias anything, so a
// field read in the loop is read again every iteration.)
template <class X, class Y, int64_t Fn, bool HasC>
void qbinary_row_from(const X* pa, const X* pb, const X* pc, Y* py, int64_t from,
                      const QRows& q, float inv) {
  const int64_t n = q.n, sa = q.step[0], sb = q.step[1], sc = q.step[2];
  const bool relu = q.relu;
  for (int64_t j = from; j < n; ++j) {
    float v = binary_fn<Fn>(quantize_load(pa, j * sa), quantize_load(pb, j * sb));
    if constexpr (HasC) v += quantize_load(pc, j * sc);
    if constexpr (std::is_same<X, uint16_t>::value) v = round_to_bf16(v);
    if (relu) v = std::max(v, 0.f);  // (NaN stays NaN, and quantizes to 0)
    py[j] = saturate_round<Y>(v * inv);
  }
}

template <class X, class Y, int64_t Fn, bool HasC>
void qbinary_rows(const X* a, const X* b, const X* c, Y* y, const QRows& q, float inv) {
  for (int64_t r = 0; r < q.rows; ++r)
    qbinary_row_from<X, Y, Fn, HasC>(a + q.at[0][r], b + q.at[1][r], c + q.at[2][r],
                                     y + (q.first + r) * q.n, 0, q, inv);
}

// fn(va, vb) + vc rounded to bf16 when X is, through the ReLU when `relu`, times k,
// clamped: 16 floats ready to convert. The rounding is integer arithmetic on the float32
// bits (round half to even on bit 16). A NaN comes out as NaN, 0 or, its payload carrying
// into the sign, as -0 or +0: each quantizes to 0, as NaN does.
template <class X, class Y, int64_t Fn, bool HasC>
NEURONISH_AVX512 inline __m512 qbinary_value(__m512 va, __m512 vb, __m512 vc, __m512 floor,
                                             __m512 k) {
  const __m512 lo = _mm512_set1_ps(std::is_same<Y, uint8_t>::value ? 0.f : -128.f);
  const __m512 hi = _mm512_set1_ps(std::is_same<Y, uint8_t>::value ? 255.f : 127.f);
  __m512 v;
  if constexpr (Fn == F_ADD) v = _mm512_add_ps(va, vb);
  else if constexpr (Fn == F_SUB) v = _mm512_sub_ps(va, vb);
  else v = _mm512_mul_ps(va, vb);
  if constexpr (HasC) v = _mm512_add_ps(v, vc);
  if constexpr (std::is_same<X, uint16_t>::value) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i biased = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
    v = _mm512_castsi512_ps(_mm512_and_si512(biased, _mm512_set1_epi32(int(0xFFFF0000u))));
  }
  v = _mm512_max_ps(floor, v);  // the ReLU (floor 0) or nothing (-inf); NaN stays NaN
  return _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v, k)));  // (NaN stays NaN)
}

// The floor `qbinary_value` takes: 0 for the ReLU, -inf (no bound) otherwise.
inline float relu_floor(bool relu) { return relu ? 0.f : -std::numeric_limits<float>::infinity(); }

// float32 operands: 16 lanes at a time. (cvtps2dq gives NaN INT_MIN, narrowed to 0.)
template <class Y, int64_t Fn, bool HasC>
NEURONISH_AVX512 void qbinary_rows_f32(const float* a, const float* b, const float* c, Y* y,
                                       const QRows& q, float inv) {
  const __m512 k = _mm512_set1_ps(inv), floor = _mm512_set1_ps(relu_floor(q.relu));
  const int64_t n = q.n, sa = q.step[0], sb = q.step[1], sc = q.step[2];
  for (int64_t r = 0; r < q.rows; ++r) {
    const float *pa = a + q.at[0][r], *pb = b + q.at[1][r], *pc = c + q.at[2][r];
    Y* py = y + (q.first + r) * n;
    for (int64_t j = 0; j < n; j += 16) {
      __mmask16 m = lanes16(n, j);
      __m512 va = sa ? _mm512_maskz_loadu_ps(m, pa + j) : _mm512_set1_ps(pa[0]);
      __m512 vb = sb ? _mm512_maskz_loadu_ps(m, pb + j) : _mm512_set1_ps(pb[0]);
      __m512 vc = !HasC ? va : sc ? _mm512_maskz_loadu_ps(m, pc + j) : _mm512_set1_ps(pc[0]);
      __m512 v = qbinary_value<float, Y, Fn, HasC>(va, vb, vc, floor, k);
      _mm_mask_storeu_epi8(py + j, m, _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
  }
}

// 32 bf16 values as two halves of 16 float32 lanes that need no shuffle: the even elements
// are each lane's low bf16 shifted up, the odd ones its high bf16 as it is.
struct Bf16Halves {
  __m512 even, odd;
};

NEURONISH_AVX512 inline Bf16Halves bf16_halves(const uint16_t* p, int64_t step, __mmask32 m,
                                               __m512 first) {
  if (!step) return {first, first};
  __m512i x = _mm512_maskz_loadu_epi16(m, p);
  return {_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
          _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(int(0xFFFF0000u))))};
}

// bf16 operands: 32 at a time, in the two halves above; the results go back in order as 32
// int16 lanes, narrowed once (vpmovwb). Widening and narrowing by cross-lane shuffles, 16 at
// a time, took twice as long as the arithmetic (single-thread, 8x56x56x144: 0.82 ms, the
// unfused pair's time).
template <class Y, int64_t Fn, bool HasC>
NEURONISH_AVX512 void qbinary_rows_bf16(const uint16_t* a, const uint16_t* b,
                                        const uint16_t* c, Y* y, const QRows& q, float inv) {
  const __m512 k = _mm512_set1_ps(inv), floor = _mm512_set1_ps(relu_floor(q.relu));
  const int64_t n = q.n, sa = q.step[0], sb = q.step[1], sc = q.step[2];
  for (int64_t r = 0; r < q.rows; ++r) {
    const uint16_t *pa = a + q.at[0][r], *pb = b + q.at[1][r], *pc = c + q.at[2][r];
    Y* py = y + (q.first + r) * n;
    const __m512 a0 = _mm512_set1_ps(quantize_load(pa, 0));
    const __m512 b0 = _mm512_set1_ps(quantize_load(pb, 0));
    const __m512 c0 = _mm512_set1_ps(quantize_load(pc, 0));
    for (int64_t j = 0; j < n; j += 32) {
      __mmask32 m = n - j >= 32 ? ~__mmask32(0) : (__mmask32(1) << (n - j)) - 1;
      Bf16Halves va = bf16_halves(pa + j, sa, m, a0);
      Bf16Halves vb = bf16_halves(pb + j, sb, m, b0);
      Bf16Halves vc = HasC ? bf16_halves(pc + j, sc, m, c0) : va;
      __m512i even = _mm512_cvtps_epi32(
          qbinary_value<uint16_t, Y, Fn, HasC>(va.even, vb.even, vc.even, floor, k));
      __m512i odd = _mm512_cvtps_epi32(
          qbinary_value<uint16_t, Y, Fn, HasC>(va.odd, vb.odd, vc.odd, floor, k));
      __m512i words = _mm512_mask_blend_epi16(0xAAAAAAAAu, even, _mm512_slli_epi32(odd, 16));
      _mm256_mask_storeu_epi8(py + j, m, _mm512_cvtepi16_epi8(words));
    }
  }
}

// AVX2: 8 lanes of either operand type, the tail of each row as the scalar loop does it.
template <class X, class Y, int64_t Fn, bool HasC>
NEURONISH_AVX2 void qbinary_rows_avx2(const X* a, const X* b, const X* c, Y* y, const QRows& q,
                                      float inv) {
  const __m256 k = _mm256_set1_ps(inv), floor = _mm256_set1_ps(relu_floor(q.relu));
  const int64_t n = q.n, whole = n / 8 * 8, sa = q.step[0], sb = q.step[1], sc = q.step[2];
  for (int64_t r = 0; r < q.rows; ++r) {
    const X *pa = a + q.at[0][r], *pb = b + q.at[1][r], *pc = c + q.at[2][r];
    Y* py = y + (q.first + r) * n;
    const __m256 a0 = _mm256_set1_ps(quantize_load(pa, 0));
    const __m256 b0 = _mm256_set1_ps(quantize_load(pb, 0));
    const __m256 c0 = _mm256_set1_ps(quantize_load(pc, 0));
    for (int64_t j = 0; j < whole; j += 8) {
      __m256 va = sa ? load8_as_f32(pa + j) : a0, vb = sb ? load8_as_f32(pb + j) : b0, v;
      if constexpr (Fn == F_ADD) v = _mm256_add_ps(va, vb);
      else if constexpr (Fn == F_SUB) v = _mm256_sub_ps(va, vb);
      else v = _mm256_mul_ps(va, vb);
      if constexpr (HasC) v = _mm256_add_ps(v, sc ? load8_as_f32(pc + j) : c0);
      if constexpr (std::is_same<X, uint16_t>::value) {  // round to bf16 (as qbinary_value)
        __m256i u = _mm256_castps_si256(v);
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
        __m256i biased = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd));
        v = _mm256_castsi256_ps(_mm256_and_si256(biased, _mm256_set1_epi32(int(0xFFFF0000u))));
      }
      store8_quantized<Y>(_mm256_max_ps(floor, v), k, py + j);  // the ReLU; NaN stays NaN
    }
    qbinary_row_from<X, Y, Fn, HasC>(pa, pb, pc, py, whole, q, inv);
  }
}

using QBinaryRows = void (*)(const void*, const void*, const void*, void*, const QRows&, float);

enum class Vector { none, avx2, avx512 };

template <class X, class Y, int64_t Fn, Vector V, bool HasC>
void qbinary_rows_of(const void* a, const void* b, const void* c, void* y, const QRows& q,
                     float inv) {
  const X *pa = static_cast<const X*>(a), *pb = static_cast<const X*>(b);
  const X* pc = static_cast<const X*>(c);
  Y* py = static_cast<Y*>(y);
  if constexpr (V == Vector::none) qbinary_rows<X, Y, Fn, HasC>(pa, pb, pc, py, q, inv);
  else if constexpr (V == Vector::avx2)
    qbinary_rows_avx2<X, Y, Fn, HasC>(pa, pb, pc, py, q, inv);
  else if constexpr (std::is_same<X, float>::value)
    qbinary_rows_f32<Y, Fn, HasC>(pa, pb, pc, py, q, inv);
  else qbinary_rows_bf16<Y, Fn, HasC>(pa, pb, pc, py, q, inv);
}

template <class X, class Y, Vector V, bool HasC>
QBinaryRows qbinary_rows_for(int64_t code) {
  if (code == F_ADD) return qbinary_rows_of<X, Y, F_ADD, V, HasC>;
  if (code == F_SUB) return qbinary_rows_of<X, Y, F_SUB, V, HasC>;
  return qbinary_rows_of<X, Y, F_MUL, V, HasC>;
}

template <class X, class Y, Vector V>
QBinaryRows qbinary_rows_for(int64_t code, bool has_c) {
  return has_c ? qbinary_rows_for<X, Y, V, true>(code) : qbinary_rows_for<X, Y, V, false>(code);
}

// The dims of y with each operand's element strides, merged where all operands broadcast
// alike (and dims of 1 dropped): rows of `inner` elements, each row's offsets by an
// odometer over the outer dims.
struct MergedBroadcast {
  static constexpr size_t kOperands = 3;          // a, b and c (one value when absent)
  std::vector<int64_t> dims;                      // outer dims first, the row's dim last
  std::array<std::vector<int64_t>, kOperands> stride;  // per operand, per dim of `dims`

  MergedBroadcast(const std::array<const memory::dims*, kOperands>& operands,
                  const memory::dims& y) {
    std::array<std::vector<int64_t>, kOperands> elem;  // element strides, 0 where broadcast
    std::array<int64_t, kOperands> total;
    elem.fill(std::vector<int64_t>(y.size()));
    total.fill(1);
    for (size_t k = y.size(); k-- > 0;) {
      for (size_t o = 0; o < kOperands; ++o) {
        int64_t d = (*operands[o])[k];
        if (d != y[k] && d != 1)
          throw Error("binary_quantize: operands do not broadcast to the output");
        elem[o][k] = d == y[k] ? total[o] : 0;
        total[o] *= d;
      }
    }
    for (size_t k = 0; k < y.size(); ++k) {
      if (y[k] == 1) continue;
      bool same = !dims.empty();
      for (size_t o = 0; same && o < kOperands; ++o)
        same = (stride[o].back() == 0) == (elem[o][k] == 0);
      if (same) {  // contiguous with the previous dim in every operand (or broadcast)
        dims.back() *= y[k];
        for (size_t o = 0; o < kOperands; ++o) stride[o].back() = elem[o][k];
      } else {
        dims.push_back(y[k]);
        for (size_t o = 0; o < kOperands; ++o) stride[o].push_back(elem[o][k]);
      }
    }
    if (dims.empty()) {
      dims = {1};
      for (auto& s : stride) s = {1};
    }
    for (const auto& s : stride)  // the row's own stride is 0 or 1
      if (s.back() > 1) throw Error("binary_quantize: internal stride error");
  }
  int64_t inner() const { return dims.back(); }
  int64_t rows() const {
    int64_t r = 1;
    for (size_t k = 0; k + 1 < dims.size(); ++k) r *= dims[k];
    return r;
  }
  // Rows [first, first + count): operand o's element offset of row r into at[o][r], by an
  // odometer over the outer dims. (Locals only: per row this runs once for as few as 8
  // elements of work.)
  void offsets(int64_t first, int64_t count, int64_t* const at[kOperands]) const {
    const int64_t outer = int64_t(dims.size()) - 1;
    const int64_t* st[kOperands] = {stride[0].data(), stride[1].data(), stride[2].data()};
    std::vector<int64_t> index(outer);
    int64_t now[kOperands] = {0, 0, 0};
    for (int64_t k = outer, r = first; k-- > 0;) {  // the first row's index over outer dims
      index[k] = r % dims[k];
      r /= dims[k];
      for (size_t o = 0; o < kOperands; ++o) now[o] += index[k] * st[o][k];
    }
    for (int64_t r = 0; r < count; ++r) {
      for (size_t o = 0; o < kOperands; ++o) at[o][r] = now[o];
      for (int64_t k = outer; k-- > 0;) {  // the next row
        for (size_t o = 0; o < kOperands; ++o) now[o] += st[o][k];
        if (++index[k] < dims[k]) break;
        for (size_t o = 0; o < kOperands; ++o) now[o] -= index[k] * st[o][k];
        index[k] = 0;
      }
    }
  }
};

// Rows of a few channels (an RGB image's normalization before an int8 stem: x * s[3] +
// o[3], 6.8 ms for 8x224x224x3 in rows of 3) regrouped k at a time as Program::add_binary
// does, each vector operand tiled k times by a step before the loop. Left as they are
// unless every operand is y-shaped, a vector over the channels or one value.
void regroup_short_rows(Program& p, Instr& ins, MergedBroadcast& mb, Ref& a, Ref& b, Ref& c,
                        Ref& y, bool has_c) {
  if (mb.dims.size() != 2 || mb.inner() >= Program::kShortRow) return;
  const int64_t rows = mb.dims[0], n = mb.inner();
  enum class Form { full, vector, one };  // y-shaped, a vector over the channels, one value
  std::array<Form, MergedBroadcast::kOperands> form;
  for (size_t o = 0; o < form.size(); ++o) {
    const auto& st = mb.stride[o];
    if (st[0] == n && st[1] == 1) form[o] = Form::full;
    else if (st[0] == 0 && st[1] == 1) form[o] = Form::vector;
    else if (st[0] == 0 && st[1] == 0) form[o] = Form::one;
    else return;
  }
  const int64_t k = Program::regroup_factor(rows, n);
  if (k == 1) return;
  size_t temp_at = 0;
  const memory::dims regrouped = {rows / k, k * n};
  Ref* operands[MergedBroadcast::kOperands] = {&a, &b, has_c ? &c : nullptr};
  for (size_t o = 0; o < form.size(); ++o) {
    if (!operands[o]) continue;
    Ref& r = *operands[o];
    if (form[o] == Form::vector) {
      r = p.tiled(ins, r, k, temp_at);
      r.dims = {1, k * n};
    } else {
      r.dims = form[o] == Form::full ? regrouped : memory::dims{1, 1};
    }
  }
  y.dims = regrouped;
  const memory::dims one = {1, 1};
  mb = MergedBroadcast({&a.dims, &b.dims, has_c ? &c.dims : &one}, y.dims);
}

// (code, has_c, relu, a, b, [c], y padded to one rank, inv)
void add_qbinary(Program& p, Reader& rd, Instr& ins) {
  int64_t code = rd.next();
  const bool has_c = rd.next() != 0, relu = rd.next() != 0;
  Ref a = rd.ref(), b = rd.ref();
  Ref c = has_c ? rd.ref() : Ref{};
  Ref y = rd.ref();
  float inv = rd.nextf();
  if ((a.type != dt::f32 && a.type != dt::bf16) || b.type != a.type ||
      (has_c && c.type != a.type) || (y.type != dt::u8 && y.type != dt::s8))
    throw Error("binary_quantize: f32 or bf16 operands, all of one type, to u8/s8 only");
  if (code != F_ADD && code != F_SUB && code != F_MUL)
    throw Error("binary_quantize: add, sub or mul only, got code " + std::to_string(code));
  if (a.dims.size() != y.dims.size() || b.dims.size() != y.dims.size() ||
      (has_c && c.dims.size() != y.dims.size()))
    throw Error("binary_quantize: operands not padded to the output's rank");
  // Without c the loops read no c; `zero` keeps the pointer they are given valid.
  static const float zero = 0.f;
  const memory::dims one(y.dims.size(), 1);
  MergedBroadcast mb({&a.dims, &b.dims, has_c ? &c.dims : &one}, y.dims);
  regroup_short_rows(p, ins, mb, a, b, c, y, has_c);
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
  bool avx2 = __builtin_cpu_supports("avx2");
  bool bf16 = a.type == dt::bf16, u8 = y.type == dt::u8;
  auto pick = [&](auto xt, auto yt) -> QBinaryRows {
    using X = decltype(xt);
    using Y = decltype(yt);
    return avx512 ? qbinary_rows_for<X, Y, Vector::avx512>(code, has_c)
                  : avx2 ? qbinary_rows_for<X, Y, Vector::avx2>(code, has_c)
                         : qbinary_rows_for<X, Y, Vector::none>(code, has_c);
  };
  QBinaryRows rows_fn = bf16 ? (u8 ? pick(uint16_t(), uint8_t()) : pick(uint16_t(), int8_t()))
                             : (u8 ? pick(float(), uint8_t()) : pick(float(), int8_t()));
  Step s;
  p.byte_arg(s, a);
  p.byte_arg(s, b);
  if (has_c) p.byte_arg(s, c);
  p.byte_arg(s, y);
  p.push_loop(ins, s, "neuronish:binary_quantize", [=](const Step& st, int threads) {
    const void* pa = data<const char>(st, 0);
    const void* pb = data<const char>(st, 1);
    const void* pc = has_c ? data<const char>(st, 2) : static_cast<const void*>(&zero);
    void* py = data<char>(st, has_c ? 3 : 2);
    const int64_t n = mb.inner(), rows = mb.rows();
    const int64_t per_task = std::max<int64_t>(1, (1 << 14) / n);  // ~16K elements a task
    const int64_t tasks = (rows + per_task - 1) / per_task;
#pragma omp parallel for num_threads(threads) if (threads > 1 && tasks > 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t first = t * per_task, last = std::min(rows, first + per_task);
      const int64_t count = last - first;
      std::vector<int64_t> buffer(3 * count);
      int64_t* const at[3] = {buffer.data(), buffer.data() + count, buffer.data() + 2 * count};
      mb.offsets(first, count, at);
      QRows q{{at[0], at[1], at[2]},
              {mb.stride[0].back(), mb.stride[1].back(), mb.stride[2].back()},
              count, first, n, relu};
      rows_fn(pa, pb, pc, py, q, inv);
    }
  });
}

// The scales and post-ops of an int8 primitive; `wmask` selects the weights' output axis.
// `sum_dt`, when not undef: the residual is the output's own bytes (Program::in_place),
// added as a sum post-op that reads it in that dtype, times its step (1 when float).
primitive_attr int8_attr(Program& p, int wmask, bool out_int, const memory::desc* residual,
                         const Epilogue& act, float res_step = 0.f, dt sum_dt = dt::undef) {
  primitive_attr a = p.attr();
  a.set_scales_mask(DNNL_ARG_SRC, 0);
  a.set_scales_mask(DNNL_ARG_WEIGHTS, wmask);
  if (out_int) a.set_scales_mask(DNNL_ARG_DST, 0);
  dnnl::post_ops po;
  if (sum_dt != dt::undef) {
    po.append_sum(res_step > 0 ? res_step : 1.f, 0, sum_dt);
    residual = nullptr;
    res_step = 0.f;
  }
  if (res_step > 0) po.append_eltwise(algorithm::eltwise_linear, 1.f / res_step, 0.f);
  if (residual) po.append_binary(algorithm::binary_add, *residual);
  if (res_step > 0) po.append_eltwise(algorithm::eltwise_linear, res_step, 0.f);
  append_eltwise(po, act);
  a.set_post_ops(po);
  return a;
}

// --- int8 computed in float32, where oneDNN's int8 kernels would not be exact ----------
// Without VNNI oneDNN 3.2 sums pairs of u8·s8 products in int16 (vpmaddubsw), which
// saturates for full-range s8 weights: a 3x3x4 int8 convolution was off by up to 37% on
// an AMD Zen 3. There the instruction runs as a float32 primitive on its 8-bit operands
// widened (exact; float32 sums of 8-bit products are exact below 2^24, as the
// reference's), with the reference's epilogue as post-ops: times x_scale·w_scale[o],
// plus bias, residual, activation, and for an 8-bit output times float32(1/y_scale)
// then a rounding, saturating reorder, as `quantize`.
bool int8_forced_to_f32() {
  static const bool forced = [] {
    const char* force = std::getenv("NEURONISH_NATIVE_INT8");
    return force && std::string(force) == "float32";
  }();
  return forced;
}

bool cpu_has_exact_int8() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") || __builtin_cpu_supports("avxvnni");
  }();
  return has;
}

// How an int8 convolution or matmul computes on this CPU, exactly in every case:
// - `int8`: on oneDNN's int8 kernels, with VNNI (int32 sums), or without it for u8
//   activations and constant weights all in [-64, 64] (what `--int8-weight-bits 7`
//   compiles, docs/int8.md), whose pair sums (at most 2·255·64 = 32640 in magnitude)
//   cannot saturate int16;
// - `shifted`: s8 activations with such weights, read as u8 x + 128 (a step before the op)
//   with a source zero point of 128, so oneDNN sums (x + 128 - 128)·w. Given s8 directly,
//   oneDNN without VNNI would halve the weights (its scale_adjust), rounding odd ones;
// - `float32`: the rest (F32Epilogue).
enum class Int8Path { int8, shifted, float32 };

Int8Path int8_path(const Program& p, const Ref& x, const Ref& w) {
  if (int8_forced_to_f32()) return Int8Path::float32;
  if (cpu_has_exact_int8()) return Int8Path::int8;
  if (w.type != dt::s8 || !p.bound_at_load(w)) return Int8Path::float32;
  const int8_t* v = reinterpret_cast<const int8_t*>(p.slots[w.slot] + w.offset);
  const int64_t n = Program::count(w);
  for (int64_t k = 0; k < n; ++k)
    if (v[k] < -64 || v[k] > 64) return Int8Path::float32;
  if (x.type == dt::u8) return Int8Path::int8;
  // (shifted_to_u8 walks the bytes densely: not a blocked layout's padded ones)
  return x.blocked ? Int8Path::float32 : Int8Path::shifted;
}

// int8_path's `shifted`: `x` (s8, dense) + 128 as u8 in a stand-in, by a loop step.
Ref shifted_to_u8(Program& p, Instr& ins, const Ref& x, size_t& temp_at) {
  Ref t = p.stand_in(x, dt::u8, D_U8, temp_at);
  Step s;
  p.byte_arg(s, x);
  p.byte_arg(s, t);
  const int64_t n = Program::count(x);
  p.push_loop(ins, s, "neuronish:s8_to_u8", [n](const Step& st, int threads) {
    const uint8_t* from = data<const uint8_t>(st, 0);
    uint8_t* to = data<uint8_t>(st, 1);
    // v + 128 is v with its sign bit flipped; eight bytes a word (-O2 does not vectorize
    // the byte loop: 9.6 MB took ~5 ms)
    const int64_t chunk = 1 << 16, chunks = (n + chunk - 1) / chunk;
    constexpr uint64_t signs = 0x8080808080808080ull;
#pragma omp parallel for num_threads(threads) if (threads > 1 && chunks > 1)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t end = std::min(n, (c + 1) * chunk);
      int64_t i = c * chunk;
      for (; i + 8 <= end; i += 8) {
        uint64_t w;
        std::memcpy(&w, from + i, 8);
        w ^= signs;
        std::memcpy(to + i, &w, 8);
      }
      for (; i < end; ++i) to[i] = from[i] ^ 0x80;
    }
  });
  return t;
}

// The source zero point of int8_path's `shifted`: the attribute and its value.
void shift_back(Program& p, primitive_attr& a, Step& s) {
  a.set_zero_points_mask(DNNL_ARG_SRC, 0);
  p.own_arg(s, DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC,
            one_value_memory(p, int32_t(128), dt::s32));
}

// float32(x_scale) · w_scale[o], as the reference's float32 product, in program-owned
// memory described as `dims` (1 on every axis but the output channel's). For constant
// scales (the compiler's); computed ones are bound as they are (F32Epilogue).
memory channel_scales(Program& p, const Ref& ws, float x_scale, const memory::dims& dims) {
  const int64_t n = Program::count(ws);
  float* buf = static_cast<float*>(std::aligned_alloc(64, (n * 4 + 63) / 64 * 64));
  if (!buf) throw Error("out of host memory for int8 scales");
  p.owned.emplace_back(buf, std::free);
  p.owned_bytes += n * 4;
  const float* w = reinterpret_cast<const float*>(p.slots[ws.slot] + ws.offset);
  for (int64_t o = 0; o < n; ++o) buf[o] = x_scale * w[o];
  return memory(memory::desc(dims, dt::f32, plain_tag(dims.size())), p.eng, buf);
}

// The float32 path's post-ops: the scales, bias, residual, activation, and the
// requantizing multiply; `res_step` > 0 for an 8-bit residual taken at its scale. Constant
// weight scales are one multiply by x_scale·w_scale (channel_scales); computed ones two,
// x_scale then w_scale (within a rounding of the reference's one).
struct F32Epilogue {
  dnnl::post_ops po;
  int scale_at = 0, bias_at = -1, res_at = -1;
};

F32Epilogue f32_epilogue(const memory::desc& per_channel, bool scales_const, float x_scale,
                         bool has_bias, const memory::desc* residual, float res_step,
                         const Epilogue& act, bool out_int, float y_scale) {
  F32Epilogue e;
  if (!scales_const) e.po.append_eltwise(algorithm::eltwise_linear, x_scale, 0.f);
  e.scale_at = e.po.len();
  e.po.append_binary(algorithm::binary_mul, per_channel);
  if (has_bias) {
    e.bias_at = e.po.len();
    e.po.append_binary(algorithm::binary_add, per_channel);
  }
  if (residual) {
    if (res_step > 0) e.po.append_eltwise(algorithm::eltwise_linear, 1.f / res_step, 0.f);
    e.res_at = e.po.len();
    e.po.append_binary(algorithm::binary_add, *residual);
    if (res_step > 0) e.po.append_eltwise(algorithm::eltwise_linear, res_step, 0.f);
  }
  append_eltwise(e.po, act);
  if (out_int) e.po.append_eltwise(algorithm::eltwise_linear, (float)(1.0 / y_scale), 0.f);
  return e;
}

// The weight scales' post-op argument of f32_epilogue's chain.
void bind_channel_scales(Program& p, Step& s, const F32Epilogue& e, const Ref& ws,
                         float x_scale, const memory::dims& per_channel) {
  int64_t channels = 1;
  for (auto d : per_channel) channels *= d;
  if (ws.type != dt::f32 || Program::count(ws) != channels)
    throw Error("int8 weight scales: expected float32, one per output channel (" +
                std::to_string(channels) + ")");
  const int id = DNNL_ARG_ATTR_MULTIPLE_POST_OP(e.scale_at) | DNNL_ARG_SRC_1;
  if (p.bound_at_load(ws)) p.own_arg(s, id, channel_scales(p, ws, x_scale, per_channel));
  else p.arg(s, id, ws, plain(per_channel, dt::f32));
}

void bind_scales(Program& p, Step& s, const Ref& ws, float x_scale, bool out_int,
                 float y_scale) {
  p.own_arg(s, DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, scale_memory(p, x_scale));
  p.arg(s, DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS, ws, plain(ws));
  if (out_int) p.own_arg(s, DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, scale_memory(p, y_scale));
}

// x (u8/s8 NHWC), w (s8 [KH, KW, C, O], constant; depthwise [KH, KW, C, M]), w_scale [O]
// [, bias] [, residual], y.
void add_qconv(Program& p, Reader& rd, Instr& ins) {
  int64_t has_bias = rd.next(), has_res = rd.next(), depthwise = rd.next();
  Ref x = rd.ref(), w = rd.ref(), ws = rd.ref(), b, res;
  if (has_bias) b = rd.ref();
  if (has_res) res = rd.ref();
  Ref y = rd.ref();
  memory::dims strides = rd.ints(2), dil = rd.ints(2), pads = rd.ints(4);
  Epilogue act = read_epilogue(rd);
  float x_scale = rd.nextf(), y_scale = rd.nextf(), res_scale = rd.nextf();
  for (auto& d : dil) d -= 1;
  if (w.dims.size() != 4 || w.type != dt::s8) throw Error("conv2d_int8 weights must be s8 4-D");
  bool out_int = y.type == dt::u8 || y.type == dt::s8;
  // TF's [KH, KW, C, O] is hwio; depthwise [KH, KW, C, M] is hwigo with C groups of M.
  memory::desc w_given = depthwise
      ? memory::desc({w.dims[2], w.dims[3], 1, w.dims[0], w.dims[1]}, dt::s8, tag::hwigo)
      : memory::desc({w.dims[3], w.dims[2], w.dims[0], w.dims[1]}, dt::s8, tag::hwio);
  Step s;
  size_t temp_at = 0;
  memory::desc x_use, res_use;
  const Int8Path path = int8_path(p, x, w);
  if (path == Int8Path::float32) {
    // (its 8-bit operands widened, its result narrowed: image by image when large, as
    // Program::by_image says)
    const Program::ImageSplit split = Program::split_by_image(
        {&x, &y, has_res ? &res : nullptr},
        x.type != dt::f32 || y.type != dt::f32 || (has_res && res.type != dt::f32));
    p.bind_image(ins, s, DNNL_ARG_SRC, x, dt::f32, false, temp_at, &x_use);
    float res_step = has_res && res.type != dt::f32 && res.type != dt::bf16 ? res_scale : 0.f;
    const bool scales_const = p.bound_at_load(ws);
    const int res_at = !scales_const + 1 + has_bias + (res_step > 0);  // (f32_epilogue's order)
    if (has_res)
      p.bind_image(ins, s, DNNL_ARG_ATTR_MULTIPLE_POST_OP(res_at) | DNNL_ARG_SRC_1, res,
                   dt::f32, false, temp_at, &res_use);
    const bool direct = y.type == dt::f32;
    Ref out = direct ? y : p.f32_stand_in(y, temp_at);
    const int64_t channels = y.dims[3];
    memory::desc per_channel = plain({1, channels, 1, 1}, dt::f32);
    F32Epilogue e = f32_epilogue(per_channel, scales_const, x_scale, has_bias,
                                 has_res ? &res_use : nullptr, res_step, act, out_int, y_scale);
    primitive_attr a = p.attr();
    a.set_post_ops(e.po);
    auto pd = dnnl::convolution_forward::primitive_desc(
        p.eng, prop_kind::forward_inference, algorithm::convolution_direct, x_use,
        memory::desc(w_given.get_dims(), dt::f32, tag::any), memory::desc(), nhwc(out), strides,
        dil, {pads[0], pads[2]}, {pads[1], pads[3]}, a);
    p.own_arg(s, DNNL_ARG_WEIGHTS, p.reorder_weights(w, w_given, pd.weights_desc()));
    bind_channel_scales(p, s, e, ws, x_scale, {1, channels, 1, 1});
    if (has_bias) {
      if (b.type != dt::f32) throw Error("conv2d_int8: the bias must be float32");
      p.arg(s, DNNL_ARG_ATTR_MULTIPLE_POST_OP(e.bias_at) | DNNL_ARG_SRC_1, b, per_channel);
    }
    if (has_res && e.res_at != res_at) throw Error("conv2d_int8: residual post-op misplaced");
    p.arg(s, DNNL_ARG_DST, out, nhwc(out));
    p.push<dnnl::convolution_forward>(ins, s, pd);
    if (!direct) p.narrow_into(ins, out, y, nhwc(y));
    Program::by_image(ins, split);
    return;
  }
  const Ref x_in = path == Int8Path::shifted ? shifted_to_u8(p, ins, x, temp_at) : x;
  p.bind_image(ins, s, DNNL_ARG_SRC, x_in, x_in.type, false, temp_at, &x_use);
  // An 8-bit residual r adds r * res_scale; oneDNN's binary post-op has no scale of its
  // own (3.2), so the sum is taken at the residual's scale: (v / res_scale + r) * res_scale
  // (then the binary is post-op 1, after that division).
  float res_step = has_res && res.type != dt::f32 ? res_scale : 0.f;
  // A bf16 output where oneDNN has no bf16 kernels: written to a float32 stand-in, then
  // rounded into y (Program::in_f32), as add_conv does.
  bool narrow = Program::in_f32(y.type);
  bool sum = has_res && Program::in_place(res, y) && !narrow;
  if (has_res && !sum)
    p.bind_image(ins, s, DNNL_ARG_ATTR_MULTIPLE_POST_OP(res_step > 0 ? 1 : 0) | DNNL_ARG_SRC_1,
                 res, Program::compute_dt(res.type), false, temp_at, &res_use);
  Ref out = narrow ? p.f32_stand_in(y, temp_at) : y;
  memory::desc b_md = has_bias ? plain(b.dims, Program::compute_dt(b.type)) : memory::desc();
  // per output channel: dim 0 (O), or dims 0 and 1 (group, M) of a grouped filter
  primitive_attr a = int8_attr(p, depthwise ? 3 : 1, out_int, has_res ? &res_use : nullptr, act,
                               res_step, sum ? res.type : dt::undef);
  if (path == Int8Path::shifted) shift_back(p, a, s);
  auto pd = dnnl::convolution_forward::primitive_desc(
      p.eng, prop_kind::forward_inference, algorithm::convolution_direct, x_use,
      memory::desc(w_given.get_dims(), dt::s8, tag::any), b_md, nhwc(out), strides, dil,
      {pads[0], pads[2]}, {pads[1], pads[3]}, a);
  p.own_arg(s, DNNL_ARG_WEIGHTS, p.reorder_weights(w, w_given, pd.weights_desc()));
  if (has_bias) p.small_arg(ins, s, DNNL_ARG_BIAS, b, plain(b), temp_at);
  p.arg(s, DNNL_ARG_DST, out, nhwc(out));
  bind_scales(p, s, ws, x_scale, out_int, y_scale);
  p.push<dnnl::convolution_forward>(ins, s, pd);
  if (narrow) p.narrow_into(ins, out, y, nhwc(y));
}

// a (u8/s8 [..., M, K]), b (s8 [K, N] constant, padded to a's rank), w_scale [N] [, bias]
// [, residual (f32, y's shape)], y.
void add_qmatmul(Program& p, Reader& rd, Instr& ins) {
  int64_t has_bias = rd.next(), has_res = rd.next();
  Ref A = rd.ref(), B = rd.ref(), ws = rd.ref(), bias, res;
  if (has_bias) bias = rd.ref();
  if (has_res) res = rd.ref();
  Ref y = rd.ref();
  Epilogue act = read_epilogue(rd);
  float a_scale = rd.nextf(), y_scale = rd.nextf();
  size_t r = y.dims.size();
  if (A.dims.size() != r || B.dims.size() != r || B.type != dt::s8)
    throw Error("matmul_int8: ranks differ or weights not s8");
  if (has_res && (res.type != dt::f32 || res.dims != y.dims))
    throw Error("matmul_int8: the residual must be f32 of the output's shape");
  bool out_int = y.type == dt::u8 || y.type == dt::s8;
  memory::desc bias_md, res_md = has_res ? plain(res) : memory::desc();
  if (has_bias) {
    memory::dims bd(r, 1);
    bd[r - 1] = y.dims[r - 1];
    bias_md = plain(bd, dt::f32);
  }
  size_t temp_at = 0;
  const Int8Path path = int8_path(p, A, B);
  if (path == Int8Path::float32) {
    Step s;
    Ref a32 = p.widen(ins, A, plain(A), temp_at);
    const bool direct = y.type == dt::f32;
    Ref out = direct ? y : p.f32_stand_in(y, temp_at);
    memory::dims per_n(r, 1);
    per_n[r - 1] = y.dims[r - 1];
    memory::desc per_channel = plain(per_n, dt::f32);
    F32Epilogue e = f32_epilogue(per_channel, p.bound_at_load(ws), a_scale, has_bias,
                                 has_res ? &res_md : nullptr, 0.f, act, out_int, y_scale);
    primitive_attr a = p.attr();
    a.set_post_ops(e.po);
    auto pd = dnnl::matmul::primitive_desc(p.eng, plain(a32),
                                           memory::desc(B.dims, dt::f32, tag::any),
                                           memory::desc(), plain(out), a);
    p.arg(s, DNNL_ARG_SRC, a32, plain(a32));
    p.own_arg(s, DNNL_ARG_WEIGHTS, p.reorder_weights(B, plain(B), pd.weights_desc()));
    bind_channel_scales(p, s, e, ws, a_scale, per_n);
    if (has_bias) {
      if (bias.type != dt::f32) throw Error("matmul_int8: the bias must be float32");
      p.arg(s, DNNL_ARG_ATTR_MULTIPLE_POST_OP(e.bias_at) | DNNL_ARG_SRC_1, bias, per_channel);
    }
    if (has_res) p.arg(s, DNNL_ARG_ATTR_MULTIPLE_POST_OP(e.res_at) | DNNL_ARG_SRC_1, res, res_md);
    p.arg(s, DNNL_ARG_DST, out, plain(out));
    p.push<dnnl::matmul>(ins, s, pd);
    if (!direct) p.narrow_into(ins, out, y, plain(y));
    return;
  }
  primitive_attr a = int8_attr(p, 1 << (r - 1), out_int, has_res ? &res_md : nullptr, act);
  Step s;
  const Ref a_in = path == Int8Path::shifted ? shifted_to_u8(p, ins, A, temp_at) : A;
  if (path == Int8Path::shifted) shift_back(p, a, s);
  bool narrow = Program::in_f32(y.type);  // (as add_qconv's)
  Ref out = narrow ? p.f32_stand_in(y, temp_at) : y;
  auto pd = dnnl::matmul::primitive_desc(p.eng, plain(a_in),
                                         memory::desc(B.dims, dt::s8, tag::any), bias_md,
                                         plain(out), a);
  p.arg(s, DNNL_ARG_SRC, a_in, plain(a_in));
  p.own_arg(s, DNNL_ARG_WEIGHTS, p.reorder_weights(B, plain(B), pd.weights_desc()));
  if (has_bias) p.arg(s, DNNL_ARG_BIAS, bias, bias_md);
  if (has_res) p.arg(s, DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, res, res_md);
  p.arg(s, DNNL_ARG_DST, out, plain(out));
  bind_scales(p, s, ws, a_scale, out_int, y_scale);
  p.push<dnnl::matmul>(ins, s, pd);
  if (narrow) p.narrow_into(ins, out, y, plain(y));
}

void add_int8(Program& p, int64_t op, Reader& rd, Instr& ins) {
  switch (op) {
    case OP_QUANTIZE: add_quantize(p, rd, ins); break;
    case OP_QCONV: add_qconv(p, rd, ins); break;
    case OP_QBINARY: add_qbinary(p, rd, ins); break;
    default: add_qmatmul(p, rd, ins); break;
  }
}

}  // namespace
