// Every implementation oneDNN offers for ResNet50's convolutions (batch 8), each timed.
//
// The native engine takes the first implementation of a primitive descriptor; this lists
// the rest (`primitive_desc::next_impl()`) for the descriptors the engine builds (src/dst
// NHWC or, fp32 in blocked regions, nChw16c; weights `any`; f32 bias; relu and, for the
// blocks' last 1x1, the in-place residual as a `sum` post-op; int8: u8 in and out with
// per-tensor src/dst and per-channel weight scales), and times each: median of REPS runs
// on the same buffers (so weights are hot: in a model the late layers' weights come from
// memory, see docs/performance.md). Reference and gemm implementations are skipped (and,
// with AMX_ONLY=1 in the environment, bf16/int8 ones without AMX: 5-10x slower on AMX).
//
//   R=.venv   # the oneDNN wheels' prefix
//   g++ -std=c++17 -O2 -fopenmp benchmarks/conv_impls.cc -o /tmp/conv_impls -I$R/include
//       -L$R/lib -ldnnl -Wl,-rpath,$R/lib   (one line)
//   OMP_NUM_THREADS=2 chrt -f 1 /tmp/conv_impls PRECISION [NAME_PART] [REPS] [any]
//
// PRECISION: f32 (NHWC), f32b (nChw16c), bf16 (NHWC), bf16b (nChw16c), int8. NAME_PART picks cases by name
// ("rtus": instead, the copy that takes a stride-2 1x1's input pixels, a strided view
// reordered dense, per stage). `any`: src/dst in format_tag::any (oneDNN picks the
// layout). ALG=wino or ALG=auto in the environment asks for Winograd / automatic.
#include <oneapi/dnnl/dnnl.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>
#include <vector>
#include <unordered_map>
#ifndef STEM_IC  // -DSTEM_IC=4: the stem with its input channels padded (to see what comes)
#define STEM_IC 3
#endif
using namespace dnnl;
using dt = memory::data_type;
using tag = memory::format_tag;

struct Case { const char* name; int n, ic, oc, h, w, k, s, p; bool relu, sum; };

double time_prim(primitive& prim, std::unordered_map<int, memory>& args, stream& st, int reps) {
  std::vector<double> t;
  for (int r = 0; r < reps + 2; ++r) {
    auto a = std::chrono::steady_clock::now();
    prim.execute(st, args);
    st.wait();
    auto b = std::chrono::steady_clock::now();
    if (r >= 2) t.push_back(std::chrono::duration<double, std::milli>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main(int argc, char** argv) {
  std::string prec = argc > 1 ? argv[1] : "f32";  // f32 | f32b | bf16 | bf16b | int8
  bool blocked = prec == "f32b" || prec == "bf16b";
  bool bf16 = prec == "bf16" || prec == "bf16b";
  // AMX_ONLY=1 skips bf16/int8 kernels without AMX (5-10x slower on an AMX CPU); on a CPU
  // without it the avx512_core_bf16 / _vnni kernels are the ones to time.
  bool amx_only = std::getenv("AMX_ONLY") != nullptr;
  std::string only = argc > 2 ? argv[2] : "";
  int reps = argc > 3 ? atoi(argv[3]) : 15;
  std::string srcfmt = argc > 4 ? argv[4] : "";  // "any" to let oneDNN choose src/dst
  engine eng(engine::kind::cpu, 0);
  stream st(eng);
  std::vector<Case> cases = {
      {"stem7x7s2", 8, STEM_IC, 64, 224, 224, 7, 2, 3, true, false},
      {"c2_1x1_64_64", 8, 64, 64, 56, 56, 1, 1, 0, true, false},
      {"c2_3x3_64", 8, 64, 64, 56, 56, 3, 1, 1, true, false},
      {"c2_1x1_64_256res", 8, 64, 256, 56, 56, 1, 1, 0, true, true},
      {"c2_sc_64_256", 8, 64, 256, 56, 56, 1, 1, 0, false, false},
      {"c2_1x1_256_64", 8, 256, 64, 56, 56, 1, 1, 0, true, false},
      {"c3_1x1s2_256_128", 8, 256, 128, 56, 56, 1, 2, 0, true, false},
      {"c3_sc_s2_256_512", 8, 256, 512, 56, 56, 1, 2, 0, false, false},
      // "eq_s1": a stride-2 1x1 as a stride-1 1x1 on its subsampled input (add "rtus")
      {"c3_eq_s1_256_128", 8, 256, 128, 28, 28, 1, 1, 0, true, false},
      {"c3_eq_s1_256_512", 8, 256, 512, 28, 28, 1, 1, 0, false, false},
      {"c3_3x3_128", 8, 128, 128, 28, 28, 3, 1, 1, true, false},
      {"c3_1x1_128_512res", 8, 128, 512, 28, 28, 1, 1, 0, true, true},
      {"c3_1x1_512_128", 8, 512, 128, 28, 28, 1, 1, 0, true, false},
      {"c4_1x1s2_512_256", 8, 512, 256, 28, 28, 1, 2, 0, true, false},
      {"c4_sc_s2_512_1024", 8, 512, 1024, 28, 28, 1, 2, 0, false, false},
      {"c4_eq_s1_512_256", 8, 512, 256, 14, 14, 1, 1, 0, true, false},
      {"c4_eq_s1_512_1024", 8, 512, 1024, 14, 14, 1, 1, 0, false, false},
      {"c4_3x3_256", 8, 256, 256, 14, 14, 3, 1, 1, true, false},
      {"c4_1x1_256_1024res", 8, 256, 1024, 14, 14, 1, 1, 0, true, true},
      {"c4_1x1_1024_256", 8, 1024, 256, 14, 14, 1, 1, 0, true, false},
      {"c5_1x1s2_1024_512", 8, 1024, 512, 14, 14, 1, 2, 0, true, false},
      {"c5_sc_s2_1024_2048", 8, 1024, 2048, 14, 14, 1, 2, 0, false, false},
      {"c5_eq_s1_1024_512", 8, 1024, 512, 7, 7, 1, 1, 0, true, false},
      {"c5_eq_s1_1024_2048", 8, 1024, 2048, 7, 7, 1, 1, 0, false, false},
      {"c5_3x3_512", 8, 512, 512, 7, 7, 3, 1, 1, true, false},
      {"c5_1x1_512_2048res", 8, 512, 2048, 7, 7, 1, 1, 0, true, true},
      {"c5_1x1_2048_512", 8, 2048, 512, 7, 7, 1, 1, 0, true, false},
  };
  if (only == "rtus") {  // subsample copies: a strided NHWC view -> dense
    for (int k = 0; k < 3; ++k) {
      int C = 256 << k, H = 56 >> k, N = 8;
      dt d = bf16 ? dt::bf16 : prec == "int8" ? dt::u8 : dt::f32;
      memory::desc view({N, C, H / 2, H / 2}, d,
                        memory::dims{(memory::dim)H * H * C, 1, (memory::dim)2 * H * C, 2 * C});
      memory::desc dense({N, C, H / 2, H / 2}, d, tag::nhwc);
      memory::desc full({N, C, H, H}, d, tag::nhwc);
      memory big(full, eng), out(dense, eng);
      std::memset(big.get_data_handle(), 1, full.get_size());
      memory vm(view, eng, big.get_data_handle());
      auto rpd = reorder::primitive_desc(eng, view, eng, dense);
      reorder r(rpd);
      std::unordered_map<int, memory> args = {{DNNL_ARG_FROM, vm}, {DNNL_ARG_TO, out}};
      primitive& pr = r;
      printf("subsample C=%d H=%d %s %.3f ms (%s)\n", C, H, prec.c_str(),
             time_prim(pr, args, st, reps), rpd.impl_info_str());
    }
    return 0;
  }
  for (auto& c : cases) {
    if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
    int oh = (c.h + 2 * c.p - c.k) / c.s + 1, ow = (c.w + 2 * c.p - c.k) / c.s + 1;
    dt sdt = dt::f32, ddt = dt::f32, wdt = dt::f32;
    if (bf16) sdt = ddt = wdt = dt::bf16;
    if (prec == "int8") { sdt = c.ic == STEM_IC ? dt::s8 : dt::u8; ddt = dt::u8; wdt = dt::s8; }
    tag t = blocked && c.ic % 16 == 0 ? tag::nChw16c : tag::nhwc;
    tag td = blocked ? tag::nChw16c : tag::nhwc;
    memory::desc src({c.n, c.ic, c.h, c.w}, sdt, srcfmt == "any" ? tag::any : t);
    memory::desc dst({c.n, c.oc, oh, ow}, ddt, srcfmt == "any" ? tag::any : td);
    memory::desc wts({c.oc, c.ic, c.k, c.k}, wdt, tag::any);
    memory::desc bias({c.oc}, dt::f32, tag::a);
    primitive_attr a;
    if (prec == "int8") {
      a.set_scales_mask(DNNL_ARG_SRC, 0);
      a.set_scales_mask(DNNL_ARG_WEIGHTS, 1);
      a.set_scales_mask(DNNL_ARG_DST, 0);
    }
    post_ops po;
    if (c.sum) { if (prec == "int8") po.append_sum(0.05f, 0, dt::u8); else po.append_sum(1.f); }
    if (c.relu) po.append_eltwise(algorithm::eltwise_relu, 0.f, 0.f);
    a.set_post_ops(po);
    const char* alg_env = std::getenv("ALG");
    algorithm alg = !alg_env ? algorithm::convolution_direct
                    : std::string(alg_env) == "wino" ? algorithm::convolution_winograd
                                                     : algorithm::convolution_auto;
    convolution_forward::primitive_desc pd;
    try {
      pd = convolution_forward::primitive_desc(eng, prop_kind::forward_inference,
          alg, src, wts, bias, dst, {c.s, c.s}, {0, 0},
          {c.p, c.p}, {c.p, c.p}, a);
    } catch (error& e) { printf("%s: no pd (%s)\n", c.name, e.what()); continue; }
    int idx = 0;
    do {
      std::string impl = pd.impl_info_str();
      if (impl.find("ref") != std::string::npos || impl.find("gemm") != std::string::npos ||
          (amx_only && prec.rfind("f32", 0) != 0 && impl.find("amx") == std::string::npos)) {
        ++idx;
        continue;
      }
      try {
        convolution_forward prim(pd);
        memory ms(pd.src_desc(), eng), mw(pd.weights_desc(), eng), mb(bias, eng), md(pd.dst_desc(), eng);
        std::memset(ms.get_data_handle(), 1, pd.src_desc().get_size());
        std::memset(mw.get_data_handle(), 1, pd.weights_desc().get_size());
        std::memset(mb.get_data_handle(), 0, bias.get_size());
        std::memset(md.get_data_handle(), 0, pd.dst_desc().get_size());
        std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw},
                                                {DNNL_ARG_BIAS, mb}, {DNNL_ARG_DST, md}};
        std::vector<memory> keep;
        if (prec == "int8") {
          for (int arg : {DNNL_ARG_SRC, DNNL_ARG_DST}) {
            memory m({{1}, dt::f32, tag::a}, eng);
            *(float*)m.get_data_handle() = 0.01f;
            args[DNNL_ARG_ATTR_SCALES | arg] = m;
          }
          memory m({{c.oc}, dt::f32, tag::a}, eng);
          for (int i = 0; i < c.oc; ++i) ((float*)m.get_data_handle())[i] = 0.01f;
          args[DNNL_ARG_ATTR_SCALES | DNNL_ARG_WEIGHTS] = m;
        }
        double ms_t = time_prim(prim, args, st, reps);
        printf("%-22s %-5s #%d %-40s %8.3f ms  src=%s\n", c.name, prec.c_str(), idx, impl.c_str(), ms_t,
               pd.src_desc().get_format_kind() == memory::format_kind::blocked ? "blk" : "?");
      } catch (error& e) {
        printf("%-22s #%d %-40s failed %s\n", c.name, idx, impl.c_str(), e.what());
      }
      fflush(stdout);
      ++idx;
    } while (pd.next_impl());
  }
}
