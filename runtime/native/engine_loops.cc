// Loops of our own, where oneDNN 3.2 has none (or a less accurate one): data movement,
// indexing, attention's masked softmax and the helpers the loops share (the element-wise
// loops are engine_any_dtype.cc's). Each parallelizes over rows with the instruction's
// OpenMP team. Part of engine.cc's unit, included there (inside its anonymous namespace).

template <class T>
T* data(const Step& s, size_t k) {
  return reinterpret_cast<T*>(s.args[k].ptr);
}

// float32 -> nearest bfloat16 (ties to even) -> float32, NaN kept a NaN (as TF's cast).
inline float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    u |= 0x00400000u;  // quiet NaN, payload's top bits kept
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  u &= 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}

// float16 <-> float32 bits (no F16C at -O2 baseline x86-64): float16 arithmetic computes
// in float32 and rounds once to nearest even, as TF's Eigen::half and numpy do.
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact
    float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  x = e == 0x1f ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112u) << 23) | (m << 13);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // >= 65520: infinity
  if (ax < 0x38800000u) {  // below 2^-14: a float16 subnormal, |f| * 2^24 rounded
    float a;
    std::memcpy(&a, &ax, 4);
    return (uint16_t)(sign | (uint32_t)std::nearbyint(a * 16777216.f));
  }
  uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u;  // round, rebias 127 -> 15
  return (uint16_t)(sign | (r >> 13));
}

// argminmax's float32 inner loops, built for each vector width (the loader picks the
// widest this CPU has; the engine's baseline is plain x86-64).
// The extreme of x[0, len) and whether it holds a NaN.
__attribute__((target_clones("avx512f", "avx2", "default")))
float block_extreme_f32(const float* x, int64_t len, bool is_min, int* nan) {
  float m = x[0];
  int bad = 0;
  if (is_min) {
#pragma omp simd reduction(min : m) reduction(+ : bad)
    for (int64_t k = 0; k < len; ++k) {
      m = x[k] < m ? x[k] : m;
      bad += x[k] != x[k];
    }
  } else {
#pragma omp simd reduction(max : m) reduction(+ : bad)
    for (int64_t k = 0; k < len; ++k) {
      m = x[k] > m ? x[k] : m;
      bad += x[k] != x[k];
    }
  }
  *nan = bad;
  return m;
}

// Rows j = 1..n-1 of x [n, inner] (columns [0, len)): each column's first extreme so far
// (best, at), a NaN kept once seen.
__attribute__((target_clones("avx512f", "avx2", "default")))
void column_extremes_f32(const float* x, int64_t n, int64_t inner, int64_t len, bool is_min,
                         float* best, int32_t* at) {
  for (int64_t j = 1; j < n; ++j) {
    const float* row = x + j * inner;
    if (len < 16) {  // a few columns: a vector loop would cost more to set up than it runs
      for (int64_t i = 0; i < len; ++i) {
        float v = row[i], b = best[i];
        if (b == b && (v != v || (is_min ? v < b : v > b))) {
          best[i] = v;
          at[i] = (int32_t)j;
        }
      }
    } else if (is_min) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) {
        float v = row[i], b = best[i];
        bool take = b == b && (v != v || v < b);
        best[i] = take ? v : b;
        at[i] = take ? (int32_t)j : at[i];
      }
    } else {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) {
        float v = row[i], b = best[i];
        bool take = b == b && (v != v || v > b);
        best[i] = take ? v : b;
        at[i] = take ? (int32_t)j : at[i];
      }
    }
  }
}

// Every dtype's storage type (the loops over any dtype: argminmax, cumulative, top_k and
// engine_any_dtype.cc).
struct Half { uint16_t bits; };
struct BHalf { uint16_t bits; };

// Storage type T <-> the type it computes in (C).
template <class T> struct Num {
  using C = T;
  static C get(T v) { return v; }
  static T put(C c) { return c; }
};
template <> struct Num<Half> {
  using C = float;
  static float get(Half h) { return f16_to_f32(h.bits); }
  static Half put(float f) { return Half{f32_to_f16(f)}; }
};
template <> struct Num<BHalf> {
  using C = float;
  static float get(BHalf h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static BHalf put(float f) {
    f = round_bf16(f);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return BHalf{(uint16_t)(u >> 16)};
  }
};

// exp(x) in float32 for the masked softmax's loop, as plain arithmetic a vector loop can
// take (libm's expf is a call per element): x = k ln2 + r with |r| <= ln2/2 (Cody-Waite, two
// parts of ln2), exp(r) by Cephes' degree-6 polynomial (within 2 ulp of the true value),
// times 2^k built in two halves (each a normal float). Arguments below -87 give 0: exp of
// them is subnormal (below 1.7e-38), and a vector lane making a subnormal stalls the CPU
// ~100 cycles (a masked score is -1e9: half of attention's lanes). Above 88.73 infinity, as
// expf; a NaN stays a NaN.
inline float exp_poly(float x) {
  float c = x < -87.f ? -87.f : (x > 88.8f ? 88.8f : x);  // (a NaN passes through)
  float k = (c * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest
  float r = c - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  int32_t ki = (int32_t)(k == k ? k : 0.f);
  int32_t k1 = ki / 2, k2 = ki - k1;
  uint32_t b1 = (uint32_t)(k1 + 127) << 23, b2 = (uint32_t)(k2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4);
  std::memcpy(&s2, &b2, 4);
  float e = p * s1 * s2;
  return x < -87.f ? 0.f : e;
}

// One row of attention's masked softmax, float32: z = m ? x : fill, y = exp(z - max) / sum
// where m, else `masked` (m one byte per element). A NaN among the z makes the row's kept
// outputs NaN, as the reference's max, exp and sum do. This is the portable form; the
// engine takes masked_softmax_row_avx512 where the CPU has AVX-512 (the compiler's own
// vectorization of this loop was 2-3x slower: byte masks and per-row reduction set-up).
using MaskedSoftmaxRow = void (*)(const float*, const uint8_t*, float*, int64_t, float, float);

void masked_softmax_row(const float* x, const uint8_t* m, float* y, int64_t n, float fill,
                        float masked) {
  float mx = -INFINITY;
  bool bad = false;
  for (int64_t j = 0; j < n; ++j) {
    float z = m[j] ? x[j] : fill;
    y[j] = z;
    mx = z > mx ? z : mx;
    bad |= z != z;
  }
  if (bad) mx = NAN;
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    float e = exp_poly(y[j] - mx);
    y[j] = e;
    sum += e;
  }
  for (int64_t j = 0; j < n; ++j) y[j] = m[j] ? y[j] / sum : masked;
}

// The same with AVX-512 (16 lanes, the row's tail by lane masks), exp_poly's steps with
// fused multiply-adds and scalef for the 2^k.
#define NEURONISH_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
NEURONISH_AVX512 inline __mmask16 lanes16(int64_t n, int64_t j) {  // the row's lanes from j
  return n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
}
NEURONISH_AVX512 inline __mmask16 kept16(const uint8_t* m, int64_t j, __mmask16 t) {
  __m128i b = _mm_maskz_loadu_epi8(t, m + j);
  return _mm_test_epi8_mask(b, b);
}

NEURONISH_AVX512
void masked_softmax_row_avx512(const float* x, const uint8_t* m, float* y, int64_t n,
                               float fill, float masked) {
  const __m512 vfill = _mm512_set1_ps(fill);
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 t = lanes16(n, j);
    __m512 z = _mm512_mask_loadu_ps(vfill, kept16(m, j, t) & t, x + j);
    _mm512_mask_storeu_ps(y + j, t, z);
    vmax = _mm512_mask_max_ps(vmax, t, vmax, z);
    nan |= _mm512_mask_cmp_ps_mask(t, z, z, _CMP_UNORD_Q);
  }
  if (nan) {
    for (int64_t j = 0; j < n; ++j) y[j] = m[j] ? NAN : masked;
    return;
  }
  const __m512 vmx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
  const __m512 lo = _mm512_set1_ps(-87.f), hi = _mm512_set1_ps(88.8f);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
  const __m512 c5 = _mm512_set1_ps(1.9875691500e-4f), c4 = _mm512_set1_ps(1.3981999507e-3f),
               c3 = _mm512_set1_ps(8.3334519073e-3f), c2 = _mm512_set1_ps(4.1665795894e-2f),
               c1 = _mm512_set1_ps(1.6666665459e-1f), c0 = _mm512_set1_ps(5.0000001201e-1f),
               one = _mm512_set1_ps(1.f);
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 t = lanes16(n, j);
    __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(t, y + j), vmx);
    __mmask16 tiny = _mm512_cmp_ps_mask(d, lo, _CMP_LT_OQ);
    __m512 c = _mm512_min_ps(_mm512_max_ps(d, lo), hi);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(c, log2e),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, ln2_hi, c);
    r = _mm512_fnmadd_ps(k, ln2_lo, r);
    __m512 p = _mm512_fmadd_ps(c5, r, c4);
    p = _mm512_fmadd_ps(p, r, c3);
    p = _mm512_fmadd_ps(p, r, c2);
    p = _mm512_fmadd_ps(p, r, c1);
    p = _mm512_fmadd_ps(p, r, c0);
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, one));
    __m512 e = _mm512_mask_mov_ps(_mm512_scalef_ps(p, k), tiny, _mm512_setzero_ps());
    _mm512_mask_storeu_ps(y + j, t, e);
    vsum = _mm512_mask_add_ps(vsum, t, vsum, e);
  }
  const __m512 vs = _mm512_set1_ps(_mm512_reduce_add_ps(vsum));
  const __m512 vmasked = _mm512_set1_ps(masked);
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 t = lanes16(n, j);
    __m512 q = _mm512_div_ps(_mm512_maskz_loadu_ps(t, y + j), vs);
    _mm512_mask_storeu_ps(y + j, t, _mm512_mask_blend_ps(kept16(m, j, t), vmasked, q));
  }
}

// bfloat16 rows <-> float32 for the masked softmax: widening is exact; narrowing rounds to
// nearest even and keeps a NaN a NaN, as round_bf16.
using Bf16Row = void (*)(const uint16_t*, float*, int64_t);
using Bf16RowOut = void (*)(const float*, uint16_t*, int64_t);

void widen_bf16_row(const uint16_t* x, float* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    uint32_t u = (uint32_t)x[j] << 16;
    std::memcpy(&y[j], &u, 4);
  }
}

void narrow_bf16_row(const float* x, uint16_t* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    float f = round_bf16(x[j]);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    y[j] = (uint16_t)(u >> 16);
  }
}

NEURONISH_AVX512 void widen_bf16_row_avx512(const uint16_t* x, float* y, int64_t n) {
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 t = lanes16(n, j);
    __m512i u = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(t, x + j));
    _mm512_mask_storeu_ps(y + j, t, _mm512_castsi512_ps(_mm512_slli_epi32(u, 16)));
  }
}

NEURONISH_AVX512 void narrow_bf16_row_avx512(const float* x, uint16_t* y, int64_t n) {
  const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff),
                quiet = _mm512_set1_epi32(0x00400000);
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 t = lanes16(n, j);
    __m512 f = _mm512_maskz_loadu_ps(t, x + j);
    __m512i u = _mm512_castps_si512(f);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, half),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), one));
    r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q), u, quiet);
    _mm256_mask_storeu_epi16(y + j, t, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
}

// The same on AVX2 (8 lanes; the tail by the scalar loops): on a CPU whose oneDNN has no
// bfloat16 kernels, every bfloat16 instruction's operands are widened and its results
// narrowed here (Program::in_f32), so these run once per value a bfloat16 program moves.
#define NEURONISH_AVX2 __attribute__((target("avx2")))
NEURONISH_AVX2 inline __m256 widen8_bf16(const uint16_t* x) {
  __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

// Eight floats rounded to bfloat16 (nearest even, a NaN kept a NaN, as round_bf16).
NEURONISH_AVX2 inline void narrow8_bf16(__m256 f, uint16_t* y) {
  const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7fff),
                quiet = _mm256_set1_epi32(0x00400000);
  __m256i u = _mm256_castps_si256(f);
  __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, half),
                               _mm256_and_si256(_mm256_srli_epi32(u, 16), one));
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  r = _mm256_srli_epi32(_mm256_blendv_epi8(r, _mm256_or_si256(u, quiet), nan), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y),
                   _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

NEURONISH_AVX2 void widen_bf16_row_avx2(const uint16_t* x, float* y, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, widen8_bf16(x + j));
  widen_bf16_row(x + j, y + j, n - j);
}

NEURONISH_AVX2 void narrow_bf16_row_avx2(const float* x, uint16_t* y, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) narrow8_bf16(_mm256_loadu_ps(x + j), y + j);
  narrow_bf16_row(x + j, y + j, n - j);
}

// bfloat16 <-> float32 over runs, the widest this CPU has.
struct Bf16Converters {
  Bf16Row widen;
  Bf16RowOut narrow;
};

Bf16Converters bf16_converters() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return {widen_bf16_row_avx512, narrow_bf16_row_avx512};
  if (__builtin_cpu_supports("avx2")) return {widen_bf16_row_avx2, narrow_bf16_row_avx2};
  return {widen_bf16_row, narrow_bf16_row};
}

// A bfloat16 binary where the CPU has no bfloat16 kernels, in one pass: y = round(a op b)
// over `rows` rows of `len` bfloat16 values, with one row of b for every `rows_per_b` rows
// of a (a squeeze-excite's x[N, H, W, C] * s[N, 1, 1, C]: one row of s per image). The
// path it replaces widened a into a float32 copy, ran oneDNN's float32 binary and narrowed
// the result, three passes over the batch; here eight values at a time are widened,
// combined and narrowed in registers. Add, subtract, multiply and divide round once in
// float32 as oneDNN's do, and the narrowing is narrow_bf16_row_avx2's (narrow8_bf16): the
// same bits.
struct Bf16Binary {
  int64_t code;  // B_ADD, B_SUB, B_MUL or B_DIV
  int64_t rows, len, rows_per_b;
};

template <int64_t Code>
NEURONISH_AVX2 inline __m256 combine8(__m256 a, __m256 b) {
  if constexpr (Code == B_ADD) return _mm256_add_ps(a, b);
  else if constexpr (Code == B_SUB) return _mm256_sub_ps(a, b);
  else if constexpr (Code == B_MUL) return _mm256_mul_ps(a, b);
  else return _mm256_div_ps(a, b);
}

template <int64_t Code>
inline float combine1(float a, float b) {
  if constexpr (Code == B_ADD) return a + b;
  else if constexpr (Code == B_SUB) return a - b;
  else if constexpr (Code == B_MUL) return a * b;
  else return a / b;
}

template <int64_t Code>
NEURONISH_AVX2 void bf16_binary_rows_avx2(const Bf16Binary& op, const uint16_t* a,
                                          const uint16_t* b, uint16_t* y, int64_t first,
                                          int64_t last) {
  for (int64_t r = first; r < last; ++r) {
    const uint16_t* pa = a + r * op.len;
    const uint16_t* pb = b + (r / op.rows_per_b) * op.len;
    uint16_t* py = y + r * op.len;
    int64_t j = 0;
    for (; j + 8 <= op.len; j += 8)
      narrow8_bf16(combine8<Code>(widen8_bf16(pa + j), widen8_bf16(pb + j)), py + j);
    for (; j < op.len; ++j) {
      float fa, fb;
      widen_bf16_row(pa + j, &fa, 1);
      widen_bf16_row(pb + j, &fb, 1);
      const float fy = combine1<Code>(fa, fb);
      narrow_bf16_row(&fy, py + j, 1);
    }
  }
}

void bf16_binary_rows(const Bf16Binary& op, const uint16_t* a, const uint16_t* b, uint16_t* y,
                      int64_t first, int64_t last) {
  switch (op.code) {
    case B_ADD: return bf16_binary_rows_avx2<B_ADD>(op, a, b, y, first, last);
    case B_SUB: return bf16_binary_rows_avx2<B_SUB>(op, a, b, y, first, last);
    case B_MUL: return bf16_binary_rows_avx2<B_MUL>(op, a, b, y, first, last);
    default: return bf16_binary_rows_avx2<B_DIV>(op, a, b, y, first, last);
  }
}

// A bfloat16 mean over rows where the CPU has no bfloat16 kernels, in one pass: x viewed
// as [groups, middle, len] -> y [groups, len] (a squeeze-excite's global mean). The path it
// replaces widened all of x into a float32 copy before oneDNN's pooling read it. Here each
// group's values are summed in float32, in order along the rows, a piece of channels at a
// time in L1, then divided and rounded once.
struct Bf16Mean {
  static constexpr int64_t kPiece = 512;  // channels summed at a time: 2 KiB of sums
  int64_t middle, len;
};

NEURONISH_AVX2 void bf16_mean_rows(const Bf16Mean& op, const uint16_t* x, uint16_t* y,
                                   int64_t group, int64_t from, int64_t to) {
  alignas(64) float sum[Bf16Mean::kPiece];
  const int64_t n = to - from, whole = n / 8 * 8;
  std::fill(sum, sum + n, 0.f);
  const uint16_t* at = x + group * op.middle * op.len + from;
  for (int64_t m = 0; m < op.middle; ++m, at += op.len) {
    for (int64_t j = 0; j < whole; j += 8)
      _mm256_store_ps(sum + j, _mm256_add_ps(_mm256_load_ps(sum + j), widen8_bf16(at + j)));
    for (int64_t j = whole; j < n; ++j) {
      float f;
      widen_bf16_row(at + j, &f, 1);
      sum[j] += f;
    }
  }
  for (int64_t j = 0; j < n; ++j) sum[j] /= (float)op.middle;
  narrow_bf16_row_avx2(sum, y + group * op.len + from, n);
}

struct MaskedSoftmaxKernels {
  MaskedSoftmaxRow row;
  Bf16Row widen;
  Bf16RowOut narrow;
};

MaskedSoftmaxKernels masked_softmax_kernels() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return {masked_softmax_row_avx512, widen_bf16_row_avx512, narrow_bf16_row_avx512};
  return {masked_softmax_row, widen_bf16_row, narrow_bf16_row};
}

template <class T> constexpr bool is_real() {
  return std::is_floating_point<typename Num<T>::C>::value;
}

// Calls f(T()) for the storage type of a dtype code (bool: uint8_t).
template <class F>
void with_type(int64_t code, F&& f) {
  switch (code) {
    case D_F32: f(float()); return;
    case D_F64: f(double()); return;
    case D_F16: f(Half()); return;
    case D_BF16: f(BHalf()); return;
    case D_S8: f(int8_t()); return;
    case D_U8: case D_BOOL: f(uint8_t()); return;
    case D_S16: f(int16_t()); return;
    case D_S32: f(int32_t()); return;
    case D_S64: f(int64_t()); return;
  }
  throw Error("unknown dtype code " + std::to_string(code));
}

// Wrapping integer arithmetic in T's own width.
template <class T> T wrap_add(T a, T b) {
  using U = typename std::make_unsigned<T>::type;
  return (T)(U)((U)a + (U)b);
}
template <class T> T wrap_sub(T a, T b) {
  using U = typename std::make_unsigned<T>::type;
  return (T)(U)((U)a - (U)b);
}
template <class T> T wrap_mul(T a, T b) {
  using U = typename std::make_unsigned<T>::type;
  return (T)(U)((uint64_t)(U)a * (uint64_t)(U)b);
}
// Rows of the output [rows, inner] and, per input, its element strides over the output's
// dims (0 where it broadcasts). Dims are y's, every input padded to y's rank.
struct Broadcast {
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides;
  int64_t rows = 1, inner = 1;

  Broadcast(const memory::dims& y, const std::vector<memory::dims>& ins) : dims(y) {
    size_t r = y.size();
    for (const auto& d : ins) {
      if (d.size() != r) throw Error("broadcast: operand ranks differ from the output's");
      std::vector<int64_t> st(r);
      int64_t s = 1;
      for (size_t k = r; k-- > 0;) {
        if (d[k] != y[k] && d[k] != 1) throw Error("broadcast: operand does not broadcast");
        st[k] = d[k] == 1 && y[k] != 1 ? 0 : s;
        s *= d[k];
      }
      strides.push_back(st);
    }
    inner = r ? y[r - 1] : 1;
    for (size_t k = 0; k + 1 < r; ++k) rows *= y[k];
  }

  // Element offset of input `i`'s first element in output row `row`.
  int64_t offset(size_t i, int64_t row) const {
    int64_t off = 0;
    for (size_t k = dims.size() - 1; k-- > 0;) {
      off += (row % dims[k]) * strides[i][k];
      row /= dims[k];
    }
    return off;
  }
};

template <class T, class R, class F>
void binary_rows(const Step& s, int threads, const Broadcast& b, F f) {
  const T* x0 = data<const T>(s, 0);
  const T* x1 = data<const T>(s, 1);
  R* y = data<R>(s, 2);
  const int64_t s0 = b.strides[0].back(), s1 = b.strides[1].back(), n = b.inner;
#pragma omp parallel for num_threads(threads) if (threads > 1)
  for (int64_t row = 0; row < b.rows; ++row) {
    const T* p = x0 + b.offset(0, row);
    const T* q = x1 + b.offset(1, row);
    R* o = y + row * n;
    if (s0 == 1 && s1 == 1) {
      for (int64_t j = 0; j < n; ++j) o[j] = f(p[j], q[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) o[j] = f(p[j * s0], q[j * s1]);
    }
  }
}

// One reduction of `n` contiguous floats (a mean is the sum / n, as in TF). Built for
// each vector width; the loader picks the widest this CPU has.
__attribute__((target_clones("avx512f", "avx2", "default")))
float reduce_run(const float* x, int64_t n, int64_t code) {
  switch (code) {
    case R_MAX: {  // NaN wins, as in TF and numpy; kept out of the loop so it vectorizes
      float m = -INFINITY;
      int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
      for (int64_t i = 0; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
      }
      return nan ? NAN : m;
    }
    case R_MIN: {
      float m = INFINITY;
      int nan = 0;
#pragma omp simd reduction(min : m) reduction(| : nan)
      for (int64_t i = 0; i < n; ++i) {
        m = x[i] < m ? x[i] : m;
        nan |= x[i] != x[i];
      }
      return nan ? NAN : m;
    }
    case R_MUL: {
      float p = 1.f;
      for (int64_t i = 0; i < n; ++i) p *= x[i];
      return p;
    }
    default: {  // R_SUM, R_MEAN
      float acc = 0.f;
#pragma omp simd reduction(+ : acc)
      for (int64_t i = 0; i < n; ++i) acc += x[i];
      return code == R_MEAN ? acc / (float)n : acc;
    }
  }
}

void inner_reduce(const Step& s, int threads) {
  const float* x = data<const float>(s, 0);
  float* y = data<float>(s, 1);
#pragma omp parallel for num_threads(threads) if (threads > 1)
  for (int64_t r = 0; r < s.rows; ++r) y[r] = reduce_run(x + r * s.inner_len, s.inner_len,
                                                         s.reduce);
}
