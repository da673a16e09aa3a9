// Small float32 matmuls on a loop of our own (part of engine.cc's unit, included there).
//
// A oneDNN primitive's execute costs ~0.6 us and ten heap allocations per call whatever
// its size (the argument map, the execution context, the post-op arguments): for a 16x16
// MatMul + Relu that is most of the instruction's time, several times its arithmetic.
// Where the loop below is quicker (small_matmul_fits) the engine computes
// y = act(a @ b + bias + res) itself, single-threaded, with accumulators in registers, on
// AVX-512, AVX2 + FMA or SSE vectors as the CPU has them (small_matmul_variant).
// Sums run over k in order, so results differ from oneDNN's blocked sums only by rounding.
namespace {

struct SmallMatmul {
  int64_t M = 0, N = 0, K = 0;
  int64_t a_row = 0, a_col = 0;  // a's element strides (any: a transposed view is fine)
  int64_t b_row = 0;             // b's row stride; its columns are contiguous
  int64_t y_row = 0;             // y's row stride; its columns are contiguous
  bool bias = false, res = false;  // res is dense [M, N]
  Epilogue act;                    // only the codes small_matmul_takes() accepts
};

// The activations the loop applies itself (oneDNN's definitions, TensorFlow's results:
// relu's alpha is the negative slope, clip_v2 passes NaN through, linear is alpha * x +
// beta).
bool small_matmul_takes(const Epilogue& e) {
  for (int64_t code : e.codes)
    if (code != E_RELU && code != E_CLIP && code != E_LINEAR) return false;
  return true;
}

// (V in place, by reference: a vector wider than the default target's passed by value
// has an ABI GCC warns about, although these are always inlined.)
template <class V>
__attribute__((always_inline)) inline void small_matmul_act(const Epilogue& e, V& v) {
  const V zero = {};  // (comparisons of a vector give a mask; of a float, a bool)
  for (size_t k = 0; k < e.codes.size(); ++k) {
    const float alpha = e.alpha[k], beta = e.beta[k];
    switch (e.codes[k]) {
      case E_RELU:  // (NaN stays NaN; -inf with no slope gives 0, not 0 * -inf)
        v = v <= zero ? (alpha == 0.f ? zero : alpha * v) : v;
        break;
      case E_CLIP: v = v <= alpha ? zero + alpha : v >= beta ? zero + beta : v; break;
      default: v = alpha * v + beta; break;  // E_LINEAR
    }
  }
}

// Vectors of 16, 8 and 4 floats (GCC's vector extension: one AVX-512, AVX2 or SSE register
// in the variant built for it), and float itself for the last single columns.
typedef float SmallV16 __attribute__((vector_size(64)));
typedef float SmallV8 __attribute__((vector_size(32)));
typedef float SmallV4 __attribute__((vector_size(16)));

template <class V>
__attribute__((always_inline)) inline void small_add(V& v, const float* p) {
  V x;
  std::memcpy(&x, p, sizeof x);  // (unaligned)
  v += x;
}

// y's rows i0..i0+R-1, columns j0..j0+C*lanes(V)-1: R*C accumulators held in registers
// over all of k (each a chain of k multiply-adds: R*C chains hide the add's latency),
// then bias, residual and activation, a vector at a time.
template <int R, int C, class V>
__attribute__((always_inline)) inline void small_matmul_tile(
    const SmallMatmul& g, const float* a, const float* b, const float* bias, const float* res,
    float* y, int64_t i0, int64_t j0) {
  constexpr int L = sizeof(V) / sizeof(float);
  V acc[R][C] = {};
  const float* arow = a + i0 * g.a_row;
  for (int64_t q = 0; q < g.K; ++q) {
    const float* brow = b + q * g.b_row + j0;
    V bv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) std::memcpy(&bv[c], brow + c * L, sizeof(V));  // (unaligned)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const float ar = arow[r * g.a_row + q * g.a_col];
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] += ar * bv[c];
    }
  }
  for (int r = 0; r < R; ++r) {
    float* yrow = y + (i0 + r) * g.y_row + j0;
    const float* rrow = g.res ? res + (i0 + r) * g.N + j0 : nullptr;
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      V v = acc[r][c];
      if (g.bias) small_add(v, bias + j0 + c * L);
      if (g.res) small_add(v, rrow + c * L);
      small_matmul_act(g.act, v);
      std::memcpy(yrow + c * L, &v, sizeof v);
    }
  }
}

// How many vectors of columns small_matmul_rows<R, V> computes at once: R * C
// accumulators, at most eight (with b's vectors, within AVX2's and SSE's 16 registers),
// four or more chains of multiply-adds to hide their latency.
constexpr int small_matmul_vectors(int R) { return R <= 2 ? 4 : 2; }

// y's rows i0..i0+R-1, all columns: tiles of C vectors V, of one, then one 8- and one
// 4-wide tile (where V is wider) and one of the last 1 to 3 columns side by side.
template <int R, class V>
__attribute__((always_inline)) inline void small_matmul_rows(
    const SmallMatmul& g, const float* a, const float* b, const float* bias, const float* res,
    float* y, int64_t i0) {
  constexpr int L = sizeof(V) / sizeof(float), C = small_matmul_vectors(R);
  int64_t j = 0;
  for (; j + L * C <= g.N; j += L * C) small_matmul_tile<R, C, V>(g, a, b, bias, res, y, i0, j);
  for (; j + L <= g.N; j += L) small_matmul_tile<R, 1, V>(g, a, b, bias, res, y, i0, j);
  if (L > 8 && j + 8 <= g.N) {
    small_matmul_tile<R, 1, SmallV8>(g, a, b, bias, res, y, i0, j);
    j += 8;
  }
  if (L > 4 && j + 4 <= g.N) {
    small_matmul_tile<R, 1, SmallV4>(g, a, b, bias, res, y, i0, j);
    j += 4;
  }
  switch (g.N - j) {  // (three chains side by side, not one after another)
    case 3: small_matmul_tile<R, 3, float>(g, a, b, bias, res, y, i0, j); break;
    case 2: small_matmul_tile<R, 2, float>(g, a, b, bias, res, y, i0, j); break;
    case 1: small_matmul_tile<R, 1, float>(g, a, b, bias, res, y, i0, j); break;
    default: break;
  }
}

// All of y in blocks of four rows, then the last rows, on vectors V.
template <class V>
__attribute__((always_inline)) inline void small_matmul_on(
    const SmallMatmul& g, const float* a, const float* b, const float* bias, const float* res,
    float* y) {
  int64_t i = 0;
  for (; i + 4 <= g.M; i += 4) small_matmul_rows<4, V>(g, a, b, bias, res, y, i);
  switch (g.M - i) {
    case 3: small_matmul_rows<3, V>(g, a, b, bias, res, y, i); break;
    case 2: small_matmul_rows<2, V>(g, a, b, bias, res, y, i); break;
    case 1: small_matmul_rows<1, V>(g, a, b, bias, res, y, i); break;
    default: break;
  }
}

// One variant per vector width, each built for the instructions that width needs (a
// vector wider than the CPU's registers is split into several per operation, and GCC
// does that badly: 16-wide vectors on AVX2 ran 32x32x32 ten times slower than 8-wide
// ones, and slower than SSE).
using SmallMatmulFn = void (*)(const SmallMatmul&, const float*, const float*, const float*,
                               const float*, float*);

__attribute__((target("avx512f"))) void small_matmul_avx512(
    const SmallMatmul& g, const float* a, const float* b, const float* bias, const float* res,
    float* y) {
  small_matmul_on<SmallV16>(g, a, b, bias, res, y);
}

__attribute__((target("avx2,fma"))) void small_matmul_avx2(
    const SmallMatmul& g, const float* a, const float* b, const float* bias, const float* res,
    float* y) {
  small_matmul_on<SmallV8>(g, a, b, bias, res, y);
}

void small_matmul_sse(const SmallMatmul& g, const float* a, const float* b, const float* bias,
                      const float* res, float* y) {
  small_matmul_on<SmallV4>(g, a, b, bias, res, y);
}

struct SmallMatmulVariant {
  SmallMatmulFn run;
  int lanes;  // its vectors' width in floats
};

// The widest variant this CPU runs, or a narrower one NEURONISH_NATIVE_SMALL_MATMUL
// (avx2, sse; avx512 is the widest) asks for, read when an instruction is added: so that
// tests hold each variant to TensorFlow on any CPU.
SmallMatmulVariant small_matmul_variant() {
  const char* env = std::getenv("NEURONISH_NATIVE_SMALL_MATMUL");
  const std::string ask = env ? env : "";
  if (!ask.empty() && ask != "avx512" && ask != "avx2" && ask != "sse")
    throw Error("NEURONISH_NATIVE_SMALL_MATMUL must be avx512, avx2 or sse, got '" + ask + "'");
  // (no __builtin_cpu_init: libgcc's constructor ran it at load; calling it again from
  // copies loading on several threads at once would race on what it writes)
  if (ask != "avx2" && ask != "sse" && __builtin_cpu_supports("avx512f"))
    return {small_matmul_avx512, 16};
  if (ask != "sse" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return {small_matmul_avx2, 8};
  return {small_matmul_sse, 4};
}

// The tiles small_matmul_rows<R, V> runs for N columns, V `lanes` wide.
int64_t small_matmul_tiles(int R, int64_t N, int64_t lanes) {
  const int64_t wide = lanes * small_matmul_vectors(R);
  int64_t n = N / wide + N % wide / lanes, rest = N % lanes;
  for (int64_t w = 8; w >= 4; w /= 2)
    if (w < lanes && rest >= w) ++n, rest -= w;
  return n + (rest > 0);
}

// Whether the loop beats oneDNN's primitive on a product of these sizes (AMD EPYC Zen 4,
// one thread, in-engine times). Each tile runs k steps, each one multiply-add chain deep
// (~1 ns: an FMA's latency, whatever the width). oneDNN took ~0.6 us plus ~1.3 ns per k
// per block of four rows on the narrow products where the loop's tiles add up (N = 3 or
// 7 with k in the thousands), so the loop is taken for one tile per block of rows and
// ~768 steps more (a [1, 2048] @ [2048, 7] product, 4096 steps: 3.9 us here, 3.1 us
// there). Past 32K multiply-adds oneDNN's blocked kernels win anyway.
bool small_matmul_fits(int64_t M, int64_t N, int64_t K, int64_t lanes) {
  if (M * N * K > 32 * 32 * 32) return false;
  const int64_t blocks = (M + 3) / 4;
  const int64_t steps = K * (M / 4 * small_matmul_tiles(4, N, lanes) +
                             (M % 4 ? small_matmul_tiles(int(M % 4), N, lanes) : 0));
  return steps <= 768 + K * blocks;
}

}  // namespace
