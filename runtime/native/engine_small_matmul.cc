// Small float32 matmuls on a loop of our own (part of engine.cc's unit, included there).
//
// A oneDNN primitive's execute costs ~0.6 us and ten heap allocations per call whatever
// its size (the argument map, the execution context, the post-op arguments): for a 16x16
// MatMul + Relu that is most of the instruction's time, several times its arithmetic.
// Below kSmallMatmulMacs multiply-adds the engine computes y = act(a @ b + bias + res)
// itself, single-threaded, in registers, with AVX-512 or AVX2 where the CPU has them
// (target_clones picks the variant once, at load). Sums run over k in order, so results
// differ from oneDNN's blocked sums only by rounding.
namespace {

// ~4 us of scalar work at worst, and ~0.3 us on AVX-512: below it the loop wins over the
// primitive's fixed cost; above it oneDNN's blocked kernels win.
constexpr int64_t kSmallMatmulMacs = 32 * 32 * 32;

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

inline float small_matmul_act(const Epilogue& e, float v) {
  for (size_t k = 0; k < e.codes.size(); ++k) {
    const float alpha = e.alpha[k], beta = e.beta[k];
    switch (e.codes[k]) {
      case E_RELU:  // (NaN stays NaN; -inf with no slope gives 0, not 0 * -inf)
        if (v <= 0.f) v = alpha == 0.f ? 0.f : alpha * v;
        break;
      case E_CLIP: v = v <= alpha ? alpha : v >= beta ? beta : v; break;
      default: v = alpha * v + beta; break;  // E_LINEAR
    }
  }
  return v;
}

// Rows i0..i0+R-1, columns j0..j0+15 of a @ b into acc (R rows of 16 lanes: one AVX-512
// register or two AVX2 ones each).
template <int R>
inline void small_matmul_block(const SmallMatmul& g, const float* a, const float* b, int64_t i0,
                               int64_t j0, float (&acc)[4][16]) {
  for (int64_t q = 0; q < g.K; ++q) {
    const float* brow = b + q * g.b_row + j0;
    for (int r = 0; r < R; ++r) {
      const float ar = a[(i0 + r) * g.a_row + q * g.a_col];
      for (int j = 0; j < 16; ++j) acc[r][j] += ar * brow[j];
    }
  }
}

__attribute__((target_clones("avx512f", "avx2", "default")))
void small_matmul(const SmallMatmul& g, const float* a, const float* b, const float* bias,
                  const float* res, float* y) {
  for (int64_t i0 = 0; i0 < g.M; i0 += 4) {
    const int64_t rows = std::min<int64_t>(4, g.M - i0);
    for (int64_t j0 = 0; j0 < g.N; j0 += 16) {
      const int64_t cols = std::min<int64_t>(16, g.N - j0);
      float acc[4][16] = {};
      if (cols == 16 && rows == 4) {
        small_matmul_block<4>(g, a, b, i0, j0, acc);
      } else if (cols == 16) {
        for (int64_t r = 0; r < rows; ++r) {  // (the last rows, one at a time)
          float one[4][16] = {};
          small_matmul_block<1>(g, a, b, i0 + r, j0, one);
          std::memcpy(acc[r], one[0], sizeof one[0]);
        }
      } else {  // the last columns: a partial block (never read past b's row)
        for (int64_t q = 0; q < g.K; ++q)
          for (int64_t r = 0; r < rows; ++r) {
            const float ar = a[(i0 + r) * g.a_row + q * g.a_col];
            for (int64_t j = 0; j < cols; ++j) acc[r][j] += ar * b[q * g.b_row + j0 + j];
          }
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* yrow = y + (i0 + r) * g.y_row + j0;
        const float* rrow = g.res ? res + (i0 + r) * g.N + j0 : nullptr;
        for (int64_t j = 0; j < cols; ++j) {
          float v = acc[r][j];
          if (g.bias) v += bias[j0 + j];
          if (g.res) v += rrow[j];
          yrow[j] = small_matmul_act(g.act, v);
        }
      }
    }
  }
}

}  // namespace
