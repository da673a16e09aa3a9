// 3x3 float32 convolutions by Winograd's F(2x2, 3x3) (part of engine.cc's unit, included
// there after engine_small_matmul.cc, whose activations it applies).
//
// Each 2x2 block of outputs is computed from its 4x4 window of inputs as
// A^T [(G g G^T) . (B^T d B)] A: 16 products per input channel and output channel where the
// direct convolution takes 36. Summed over the input channels, those products are 16
// matrix products, [tiles, IC] @ [IC, OC], one per position in the 4x4 tile: a 2.25x
// smaller multiply count that oneDNN 3.2 has no kernel for on AVX2 (its Winograd is
// AVX-512 only). The transforms add and subtract only (G's halves are exact), so results
// differ from the direct sums by rounding alone (tests: within 1e-4 of TensorFlow).
//
// A call runs blocks of tiles through three phases: the input transform into V [16][T][IC],
// the products into M [16][T][OC], and the output transform with bias and activation
// into y. With few channels each thread takes blocks of its own through all three, V and M
// in its own cache (~200 KB); otherwise the threads split each phase of a shared block of
// ~4 MB (a whole 8x56x56x64 image's V is 26 MB), so that U, too large to be read once per
// thread's block, is read once per block.
namespace {

typedef float WinoV __attribute__((vector_size(32)));  // eight floats: one AVX2 register
constexpr int64_t kWinoLanes = 8, kWinoPanel = 2 * kWinoLanes;  // output channels a product tile takes
constexpr int64_t kWinoChunkBytes = int64_t(4) << 20;     // a shared block's V and M
constexpr int64_t kWinoThreadBytes = int64_t(192) << 10;  // a thread's own block's

struct Winograd {
  int64_t H = 0, W = 0, IC = 0, OC = 0, OH = 0, OW = 0;
  int64_t pad_top = 0, pad_left = 0;
  int64_t tiles_y = 0, tiles_x = 0, tiles = 0;  // over the whole batch
  int64_t chunk = 0;      // tiles a pass of the three phases takes
  bool own_blocks = false;  // each thread its own chunks (else the threads share each)
  bool bias = false, res = false;
  Epilogue act;
};

__attribute__((always_inline, target("avx2,fma"))) inline WinoV wino_load(const float* p) {
  WinoV v;
  std::memcpy(&v, p, sizeof v);  // (unaligned)
  return v;
}
__attribute__((always_inline, target("avx2,fma"))) inline void wino_store(float* p, WinoV v) {
  std::memcpy(p, &v, sizeof v);
}

// U [16][OC / kWinoPanel][IC][kWinoPanel] = G g G^T for each (input, output) channel pair
// of w, a TensorFlow [3, 3, IC, OC] kernel. Once per weight, at load.
void winograd_weights(const Winograd& g, const float* w, float* U) {
  const int64_t panels = g.OC / kWinoPanel;
  for (int64_t ic = 0; ic < g.IC; ++ic)
    for (int64_t oc = 0; oc < g.OC; ++oc) {
      float k[3][3], t[4][3];
      for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3; ++b) k[a][b] = w[((a * 3 + b) * g.IC + ic) * g.OC + oc];
      for (int b = 0; b < 3; ++b) {  // G k: rows
        t[0][b] = k[0][b];
        t[1][b] = 0.5f * (k[0][b] + k[1][b] + k[2][b]);
        t[2][b] = 0.5f * (k[0][b] - k[1][b] + k[2][b]);
        t[3][b] = k[2][b];
      }
      for (int a = 0; a < 4; ++a) {  // (G k) G^T: columns
        const float u[4] = {t[a][0], 0.5f * (t[a][0] + t[a][1] + t[a][2]),
                            0.5f * (t[a][0] - t[a][1] + t[a][2]), t[a][2]};
        for (int b = 0; b < 4; ++b)
          U[(((a * 4 + b) * panels + oc / kWinoPanel) * g.IC + ic) * kWinoPanel +
            oc % kWinoPanel] = u[b];
      }
    }
}

// Tile t of the batch (chunk row `row` of T) into V: B^T d B of its 4x4 input window, the
// window's pixels outside the image (padding) read as zeros.
__attribute__((target("avx2,fma"))) void winograd_input(const Winograd& g, const float* x,
                                                        float* V, int64_t T, int64_t t,
                                                        int64_t row) {
  const int64_t image = t / (g.tiles_y * g.tiles_x), in_image = t % (g.tiles_y * g.tiles_x);
  const int64_t y0 = 2 * (in_image / g.tiles_x) - g.pad_top;
  const int64_t x0 = 2 * (in_image % g.tiles_x) - g.pad_left;
  const float* pixel[4][4];
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b) {
      const int64_t iy = y0 + a, ix = x0 + b;
      pixel[a][b] = iy >= 0 && iy < g.H && ix >= 0 && ix < g.W
                        ? x + ((image * g.H + iy) * g.W + ix) * g.IC
                        : nullptr;
    }
  const WinoV zero = {};
  const int64_t plane = T * g.IC;  // from one of the 16 positions to the next
  for (int64_t c = 0; c < g.IC; c += kWinoLanes) {
    WinoV d[4][4], e[4][4];
    for (int a = 0; a < 4; ++a)
      for (int b = 0; b < 4; ++b) d[a][b] = pixel[a][b] ? wino_load(pixel[a][b] + c) : zero;
    for (int b = 0; b < 4; ++b) {  // B^T d
      e[0][b] = d[0][b] - d[2][b];
      e[1][b] = d[1][b] + d[2][b];
      e[2][b] = d[2][b] - d[1][b];
      e[3][b] = d[1][b] - d[3][b];
    }
    for (int a = 0; a < 4; ++a) {  // (B^T d) B
      float* out = V + (a * 4) * plane + row * g.IC + c;
      wino_store(out, e[a][0] - e[a][2]);
      wino_store(out + plane, e[a][1] + e[a][2]);
      wino_store(out + 2 * plane, e[a][2] - e[a][1]);
      wino_store(out + 3 * plane, e[a][1] - e[a][3]);
    }
  }
}

// R rows of a product: C[r][0..15] = sum_k A[r][k] * B[k][0..15], in 2R registers.
template <int R>
__attribute__((always_inline, target("avx2,fma"))) inline void winograd_rows(const float* A, int64_t K,
                                                         const float* B, float* C,
                                                         int64_t ldc) {
  WinoV acc[R][2] = {};
  for (int64_t k = 0; k < K; ++k) {
    const WinoV b0 = wino_load(B + k * kWinoPanel), b1 = wino_load(B + k * kWinoPanel + kWinoLanes);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const float a = A[r * K + k];
      acc[r][0] += a * b0;
      acc[r][1] += a * b1;
    }
  }
  for (int r = 0; r < R; ++r) {
    wino_store(C + r * ldc, acc[r][0]);
    wino_store(C + r * ldc + kWinoLanes, acc[r][1]);
  }
}

// M[p][0..T)[panel's 16 channels] = V[p] @ U[p][panel], six rows at a time (12 accumulators,
// 2 of U's vectors and a broadcast: 15 of AVX2's 16 registers).
__attribute__((target("avx2,fma"))) void winograd_product(const Winograd& g, const float* V,
                                                          const float* U, float* M, int64_t T,
                                                          int64_t p, int64_t panel) {
  const int64_t panels = g.OC / kWinoPanel;
  const float* A = V + p * T * g.IC;
  const float* B = U + (p * panels + panel) * g.IC * kWinoPanel;
  float* C = M + p * T * g.OC + panel * kWinoPanel;
  int64_t r = 0;
  for (; r + 6 <= T; r += 6) winograd_rows<6>(A + r * g.IC, g.IC, B, C + r * g.OC, g.OC);
  const float* a = A + r * g.IC;
  float* c = C + r * g.OC;
  switch (T - r) {
    case 5: winograd_rows<5>(a, g.IC, B, c, g.OC); break;
    case 4: winograd_rows<4>(a, g.IC, B, c, g.OC); break;
    case 3: winograd_rows<3>(a, g.IC, B, c, g.OC); break;
    case 2: winograd_rows<2>(a, g.IC, B, c, g.OC); break;
    case 1: winograd_rows<1>(a, g.IC, B, c, g.OC); break;
    default: break;
  }
}

// Tile t's 2x2 outputs (those inside the image) from M: A^T m A, then bias, residual (of
// y's shape; it may be y itself) and activation.
__attribute__((target("avx2,fma"))) void winograd_output(const Winograd& g, const float* M,
                                                         const float* bias, const float* res,
                                                         float* y, int64_t T, int64_t t,
                                                         int64_t row) {
  const int64_t image = t / (g.tiles_y * g.tiles_x), in_image = t % (g.tiles_y * g.tiles_x);
  const int64_t oy = 2 * (in_image / g.tiles_x), ox = 2 * (in_image % g.tiles_x);
  const bool second_row = oy + 1 < g.OH, second_col = ox + 1 < g.OW;
  const int64_t at = ((image * g.OH + oy) * g.OW + ox) * g.OC;
  float* out = y + at;
  const float* add_in = res ? res + at : nullptr;
  const int64_t plane = T * g.OC;
  const int64_t next[2][2] = {{0, g.OC}, {g.OW * g.OC, (g.OW + 1) * g.OC}};
  const bool inside[2][2] = {{true, second_col}, {second_row, second_row && second_col}};
  const WinoV zero = {};
  for (int64_t c = 0; c < g.OC; c += kWinoLanes) {
    WinoV m[4][4], s[2][4], o[2][2];
    for (int p = 0; p < 16; ++p) m[p / 4][p % 4] = wino_load(M + p * plane + row * g.OC + c);
    for (int b = 0; b < 4; ++b) {  // A^T m
      s[0][b] = m[0][b] + m[1][b] + m[2][b];
      s[1][b] = m[1][b] - m[2][b] - m[3][b];
    }
    const WinoV add = g.bias ? wino_load(bias + c) : zero;
    for (int a = 0; a < 2; ++a) {  // (A^T m) A
      o[a][0] = s[a][0] + s[a][1] + s[a][2] + add;
      o[a][1] = s[a][1] - s[a][2] - s[a][3] + add;
    }
    for (int a = 0; a < 2; ++a)
      for (int b = 0; b < 2; ++b) {
        if (!inside[a][b]) continue;
        if (add_in) o[a][b] += wino_load(add_in + next[a][b] + c);
        small_matmul_act(g.act, o[a][b]);
        wino_store(out + next[a][b] + c, o[a][b]);
      }
  }
}

// Where each thread takes blocks of its own (winograd_plan), and how many tiles a block
// has: on AMD EPYC Zen 3 (2 threads), 64 channels in and out at 56x56 and 112x112 gained
// 1.05-1.15x over oneDNN with shared 4 MB blocks and 1.25-1.45x with 24-tile blocks of a
// thread's own; 128 channels gained the same either way.
void winograd_plan(Winograd& g) {
  const int64_t per_tile = 16 * (g.IC + g.OC) * 4;
  g.own_blocks = kWinoThreadBytes / per_tile >= 18;
  const int64_t tiles = g.own_blocks ? kWinoThreadBytes / per_tile / 6 * 6
                                     : std::max<int64_t>(6, kWinoChunkBytes / per_tile);
  g.chunk = std::min(g.tiles, tiles);
}

// Floats of work memory a call takes on `threads` threads.
int64_t winograd_work(const Winograd& g, int threads) {
  return (g.own_blocks ? threads : 1) * 16 * g.chunk * (g.IC + g.OC);
}

// Tiles first .. first+T-1 through the three phases, on this thread alone.
void winograd_block(const Winograd& g, const float* x, const float* U, const float* bias,
                    const float* res, float* y, float* V, float* M, int64_t first,
                    int64_t T) {
  const int64_t panels = g.OC / kWinoPanel;
  for (int64_t row = 0; row < T; ++row) winograd_input(g, x, V, T, first + row, row);
  for (int64_t i = 0; i < 16 * panels; ++i) winograd_product(g, V, U, M, T, i / panels, i % panels);
  for (int64_t row = 0; row < T; ++row) winograd_output(g, M, bias, res, y, T, first + row, row);
}

// One call: x [N, H, W, IC] -> y [N, OH, OW, OC] on `threads` threads, `work` holding
// winograd_work(g, threads) floats. x must not overlap y; res (or null) may be y.
void winograd_conv(const Winograd& g, const float* x, const float* U, const float* bias,
                   const float* res, float* y, float* work, int threads) {
  if (g.own_blocks) {
    const int64_t blocks = (g.tiles + g.chunk - 1) / g.chunk;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      float* V = work + omp_get_thread_num() * 16 * g.chunk * (g.IC + g.OC);
      float* M = V + 16 * g.chunk * g.IC;
#pragma omp for schedule(static)
      for (int64_t b = 0; b < blocks; ++b)
        winograd_block(g, x, U, bias, res, y, V, M, b * g.chunk,
                       std::min(g.chunk, g.tiles - b * g.chunk));
    }
    return;
  }
  const int64_t panels = g.OC / kWinoPanel;
  float* V = work;
  float* M = work + 16 * g.chunk * g.IC;
#pragma omp parallel num_threads(threads) if (threads > 1)
  for (int64_t first = 0; first < g.tiles; first += g.chunk) {
    const int64_t T = std::min(g.chunk, g.tiles - first);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < T; ++row) winograd_input(g, x, V, T, first + row, row);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < 16 * panels; ++i) winograd_product(g, V, U, M, T, i / panels, i % panels);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < T; ++row) winograd_output(g, M, bias, res, y, T, first + row, row);
  }
}

// NEURONISH_NATIVE_WINOGRAD: `auto` (unset) takes Winograd where it was measured to pay, a
// CPU with AVX2 and FMA but no AVX-512 (there oneDNN's direct kernels are twice as wide);
// `on` wherever AVX2 and FMA run (tests hold it to TensorFlow on any such CPU); `off` never.
bool winograd_enabled() {
  const char* env = std::getenv("NEURONISH_NATIVE_WINOGRAD");
  const std::string ask = env ? env : "auto";
  if (ask != "auto" && ask != "on" && ask != "off")
    throw Error("NEURONISH_NATIVE_WINOGRAD must be auto, on or off, got '" + ask + "'");
  if (ask == "off" || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    return false;
  return ask == "on" || !__builtin_cpu_supports("avx512f");
}

// Whether a convolution of these sizes gains from Winograd (AMD EPYC Zen 3, 2 threads,
// batch 8, oneDNN's brgconv:avx2 against this, medians of 21: 64 channels at 56x56 1.1-1.2x,
// 128 at 28x28 1.3x, 256 at 14x14 1.4-1.6x, 512 at 7x7 1.25-1.35x). Fewer channels leave
// the transforms' memory traffic to dominate; an image under 7x7 computes many outputs it
// drops (the 2x2 tiles of a 5x5 image cover 6x6).
bool winograd_fits(int64_t ic, int64_t oc, int64_t oh, int64_t ow) {
  return ic >= 64 && oc >= 64 && ic % kWinoLanes == 0 && oc % kWinoPanel == 0 && oh >= 7 &&
         ow >= 7;
}

}  // namespace
