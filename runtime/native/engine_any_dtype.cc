// Loops over every dtype (float32 and float64, 16-bit floats, integers, bool). Part of
// engine.cc's unit, included at its end.
//
// What oneDNN's primitives above leave out, so that no instruction needs the numpy engine:
// the one element-wise loop per instruction kind (unary, binary, cast) for every dtype,
// float32's libm functions (erf, log, ...) included, and reductions, pools, softmax, layer
// norm, concat, matmul and convolution on dtypes oneDNN lacks. Semantics are the reference
// kernels' (runtime/kernels/): float32 with glibc's single-precision libm (within 1 ulp,
// as accurate as TF's Eigen kernels or more), 16-bit floats compute in float32 and round
// once per result (numpy's float16 loops and the bfloat16 path do the same), float64 in
// double, integers wrap in their own width (as numpy and TF). Integer division by zero
// gives 0 (and its remainder 0), as numpy; INT_MIN / -1 wraps to INT_MIN. Plain loops,
// parallel over elements or rows where that is free. The spec codes are
// runtime/native/spec.py's G_* tables.
namespace {

// OP_G_UNARY functions (spec.py's G_UNARY).
enum GUnary : int64_t {
  G_RELU = 1, G_RELU6 = 2, G_LEAKY_RELU = 3, G_ELU = 4, G_SELU = 5, G_SIGMOID = 6, G_TANH = 7,
  G_SOFTPLUS = 8, G_GELU = 9, G_GELU_TANH = 10, G_ERF = 11, G_ERFC = 12, G_EXP = 13, G_LOG = 14,
  G_SQRT = 15, G_RSQRT = 16, G_SQUARE = 17, G_ABS = 18, G_NEG = 19, G_RECIPROCAL = 20,
  G_FLOOR = 21, G_SIGN = 22, G_ROUND_BF16 = 23, G_ROUND_FP16 = 24, G_SIN = 25, G_COS = 26,
  G_TAN = 27, G_ATAN = 28, G_LOG1P = 29, G_EXPM1 = 30, G_ROUND = 31, G_SWISH = 32,
  G_LOGICAL_NOT = 33 /* bool only */, G_HARD_SIGMOID = 34, G_HARD_SWISH = 35,
};

template <class T> T int_div(T a, T b) {  // toward zero; x/0 = 0; MIN/-1 wraps
  if (b == 0) return 0;
  if (std::is_signed<T>::value && b == (T)-1) return wrap_sub<T>(0, a);
  return (T)(a / b);
}
template <class T> T int_floor_div(T a, T b) {
  if (b == 0) return 0;
  if (std::is_signed<T>::value && b == (T)-1) return wrap_sub<T>(0, a);
  T q = (T)(a / b);
  return (a % b != 0 && ((a < 0) != (b < 0))) ? (T)(q - 1) : q;
}
template <class T> T int_floor_mod(T a, T b) {
  if (b == 0 || (std::is_signed<T>::value && b == (T)-1)) return 0;
  T m = (T)(a % b);
  return (m != 0 && ((m < 0) != (b < 0))) ? (T)(m + b) : m;
}
template <class C> C real_floor_mod(C a, C b) {  // numpy's: the result takes b's sign
  C m = std::fmod(a, b);
  if (b == 0) return m;
  if (m != 0) {
    if ((b < 0) != (m < 0)) m += b;
  } else {
    m = std::copysign(C(0), b);
  }
  return m;
}
template <class C> C nan_max(C a, C b) { return (a != a || b != b) ? a + b : std::max(a, b); }
template <class C> C nan_min(C a, C b) { return (a != a || b != b) ? a + b : std::min(a, b); }

template <class C> C softplus_any(C x) {  // TF's thresholds for the type's epsilon
  const C threshold = std::log(std::numeric_limits<C>::epsilon()) + C(2);
  if (x > -threshold) return x;
  C e = std::exp(x);
  return x < threshold ? e : std::log1p(e);
}

template <class C> C hard_sigmoid_any(C x) {  // relu6(x + 3) / 6, TF's order; NaN stays NaN
  C t = x + C(3);
  return t != t ? t : std::min(std::max(t, C(0)), C(6)) / C(6);
}

// Calls g(f) with f the element function `fn` of a real type C (float for 16-bit floats):
// the switch runs once, at load, and each loop is built around one function.
template <class C, class G> void with_real_unary(int64_t fn, C alpha, G&& g) {
  const C sqrt1_2 = C(0.70710678118654752440);
  switch (fn) {
    case G_RELU: return g([](C x) { return x > 0 || x != x ? x : C(0); });
    case G_RELU6: return g([](C x) { return x != x ? x : std::min(std::max(x, C(0)), C(6)); });
    case G_LEAKY_RELU: return g([alpha](C x) { return x >= 0 || x != x ? x : alpha * x; });
    case G_ELU: return g([](C x) { return x > 0 || x != x ? x : std::expm1(x); });
    case G_SELU: return g([](C x) {
      const C a = C(1.6732632423543772), s = C(1.0507009873554805);
      return x > 0 || x != x ? s * x : s * (a * std::expm1(x));
    });
    case G_SIGMOID: return g([](C x) { return C(1) / (C(1) + std::exp(-x)); });
    case G_TANH: return g([](C x) { return std::tanh(x); });
    case G_SOFTPLUS: return g([](C x) { return softplus_any(x); });
    case G_GELU: return g([sqrt1_2](C x) { return C(0.5) * x * std::erfc(-x * sqrt1_2); });
    case G_GELU_TANH: return g([](C x) {
      C t = std::tanh(C(0.7978845608028654) * (x + C(0.044715) * x * x * x));
      return C(0.5) * x * (C(1) + t);
    });
    case G_SWISH: return g([](C x) { return x / (C(1) + std::exp(-x)); });
    case G_HARD_SIGMOID: return g([](C x) { return hard_sigmoid_any(x); });
    case G_HARD_SWISH: return g([](C x) { return x * hard_sigmoid_any(x); });
    case G_ERF: return g([](C x) { return std::erf(x); });
    case G_ERFC: return g([](C x) { return std::erfc(x); });
    case G_EXP: return g([](C x) { return std::exp(x); });
    case G_LOG: return g([](C x) { return std::log(x); });
    case G_SQRT: return g([](C x) { return std::sqrt(x); });
    case G_RSQRT: return g([](C x) { return C(1) / std::sqrt(x); });
    case G_SQUARE: return g([](C x) { return x * x; });
    case G_ABS: return g([](C x) { return std::fabs(x); });
    case G_NEG: return g([](C x) { return -x; });
    case G_RECIPROCAL: return g([](C x) { return C(1) / x; });
    case G_FLOOR: return g([](C x) { return std::floor(x); });
    case G_SIGN: return g([](C x) { return x > 0 ? C(1) : x < 0 ? C(-1) : x; });  // 0, NaN kept
    case G_ROUND_BF16: return g([](C x) { return (C)round_bf16((float)x); });
    case G_ROUND_FP16: return g([](C x) { return (C)f16_to_f32(f32_to_f16((float)x)); });
    case G_SIN: return g([](C x) { return std::sin(x); });
    case G_COS: return g([](C x) { return std::cos(x); });
    case G_TAN: return g([](C x) { return std::tan(x); });
    case G_ATAN: return g([](C x) { return std::atan(x); });
    case G_LOG1P: return g([](C x) { return std::log1p(x); });
    case G_EXPM1: return g([](C x) { return std::expm1(x); });
    case G_ROUND: return g([](C x) { return std::nearbyint(x); });  // half to even
  }
  throw Error("unary: unknown function " + std::to_string(fn));
}

// The same for an integer type T: wrapping, as numpy.
template <class T, class G> void with_int_unary(int64_t fn, G&& g) {
  switch (fn) {
    case G_ABS: return g([](T v) { return v < 0 ? wrap_sub<T>(0, v) : v; });
    case G_NEG: return g([](T v) { return wrap_sub<T>(0, v); });
    case G_SIGN: return g([](T v) { return (T)((v > 0) - (v < 0)); });
    case G_SQUARE: return g([](T v) { return wrap_mul<T>(v, v); });
    case G_RELU: return g([](T v) { return v > 0 ? v : T(0); });
    case G_RELU6: return g([](T v) { return v > 6 ? T(6) : v > 0 ? v : T(0); });
  }
  throw Error("unary: function " + std::to_string(fn) + " takes no integers");
}

// One element's function, for the activations fused into the matmul and convolution loops.
template <class C> C real_unary(int64_t fn, C x, C alpha) {
  C out{};
  with_real_unary<C>(fn, alpha, [&](auto f) { out = f(x); });
  return out;
}
template <class T> T int_unary(int64_t fn, T v) {
  T out{};
  with_int_unary<T>(fn, [&](auto f) { out = f(v); });
  return out;
}

int64_t elems(const Ref& r) {
  int64_t n = 1;
  for (auto d : r.dims) n *= d;
  return n;
}

// x -> y, same shape and dtype. floats: `alpha` is leaky_relu's slope (a double's bits:
// float64 needs all of them).
void add_g_unary(Program& p, Reader& rd, Instr& ins) {
  int64_t fn = rd.next(), alpha_bits = rd.next();
  double alpha;
  std::memcpy(&alpha, &alpha_bits, 8);
  Ref x = rd.ref(), y = rd.ref();
  int64_t n = elems(x);
  if (n != elems(y) || x.code != y.code) throw Error("unary: x and y differ");
  if ((fn == G_LOGICAL_NOT) != (x.code == D_BOOL)) throw Error("unary: logical_not is bool's");
  Step s;
  p.byte_arg(s, x);
  p.byte_arg(s, y);
  if (fn == G_LOGICAL_NOT) {
    p.push_loop(ins, s, "neuronish:unary_any", [n](const Step& st, int threads) {
      const uint8_t* a = data<const uint8_t>(st, 0);
      uint8_t* o = data<uint8_t>(st, 1);
#pragma omp parallel for num_threads(threads) if (threads > 1)
      for (int64_t i = 0; i < n; ++i) o[i] = a[i] == 0;
    });
    return;
  }
  with_type(x.code, [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto f) {
      p.push_loop(ins, s, "neuronish:unary_any", [n, f](const Step& st, int threads) {
        const T* a = data<const T>(st, 0);
        T* o = data<T>(st, 1);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static, 4096)
        for (int64_t i = 0; i < n; ++i) o[i] = Num<T>::put(f(Num<T>::get(a[i])));
      });
    };
    using C = typename Num<T>::C;
    if constexpr (is_real<T>()) {
      with_real_unary<C>(fn, C(alpha), run);
    } else {
      with_int_unary<T>(fn, run);
    }
  });
}

// a, b (padded to y's rank, either may broadcast) -> y, for any dtype (spec.py's LOOP
// codes; comparisons write bool; bool operands take and, or, equal and not_equal).
void add_g_binary(Program& p, Reader& rd, Instr& ins) {
  int64_t fn = rd.next();
  Ref A = rd.ref(), B = rd.ref(), y = rd.ref();
  if (A.code != B.code) throw Error("binary: operand dtypes differ");
  bool cmp = fn >= F_GT && fn <= F_NE;
  if (A.code == D_BOOL ? y.code != D_BOOL : cmp != (y.code == D_BOOL) || (!cmp && y.code != A.code))
    throw Error("binary: the output's dtype");
  Broadcast b(y.dims, {A.dims, B.dims});
  int64_t nb = elems(B);
  Step s;
  p.byte_arg(s, A);
  p.byte_arg(s, B);
  p.byte_arg(s, y);
  if (A.code == D_BOOL) {
    auto run = [&](auto f) {
      p.push_loop(ins, s, "neuronish:binary_any", [b, f](const Step& st, int threads) {
        binary_rows<uint8_t, uint8_t>(st, threads, b, f);
      });
    };
    switch (fn) {
      case F_AND: run([](uint8_t p, uint8_t q) -> uint8_t { return p && q; }); return;
      case F_OR: run([](uint8_t p, uint8_t q) -> uint8_t { return p || q; }); return;
      case F_EQ: run([](uint8_t p, uint8_t q) -> uint8_t { return (p != 0) == (q != 0); }); return;
      case F_NE: run([](uint8_t p, uint8_t q) -> uint8_t { return (p != 0) != (q != 0); }); return;
    }
    throw Error("binary: no bool loop for function " + std::to_string(fn));
  }
  with_type(A.code, [&](auto tag) {
    using T = decltype(tag);
    using C = typename Num<T>::C;
    auto run = [&](auto f) {
      p.push_loop(ins, s, "neuronish:binary_any", [b, f](const Step& st, int threads) {
        binary_rows<T, T>(st, threads, b, f);
      });
    };
    auto cmp_run = [&](auto f) {
      p.push_loop(ins, s, "neuronish:binary_any", [b, f](const Step& st, int threads) {
        binary_rows<T, uint8_t>(st, threads, b, f);
      });
    };
#define NE_R(EXPR) run([](T p_, T q_) -> T { C p = Num<T>::get(p_), q = Num<T>::get(q_); \
                                          return Num<T>::put(EXPR); }); return
#define NE_C(OP) cmp_run([](T p_, T q_) -> uint8_t { return Num<T>::get(p_) OP Num<T>::get(q_); }); return
    switch (fn) {
      case F_GT: NE_C(>);
      case F_GE: NE_C(>=);
      case F_LT: NE_C(<);
      case F_LE: NE_C(<=);
      case F_EQ: NE_C(==);
      case F_NE: NE_C(!=);
    }
    if constexpr (is_real<T>()) {
      switch (fn) {
        case F_ADD: NE_R(p + q);
        case F_SUB: NE_R(p - q);
        case F_MUL: NE_R(p * q);
        case F_DIV: NE_R(p / q);
        case F_MAX: NE_R(nan_max(p, q));
        case F_MIN: NE_R(nan_min(p, q));
        case F_POW: NE_R(std::pow(p, q));
        // TF (Eigen) rounds the quotient to T before the floor: for float16 and bfloat16
        // flooring the float quotient differs in ~2% and ~10% of random operands.
        case F_FLOOR_DIV: NE_R(std::floor(Num<T>::get(Num<T>::put(p / q))));
        case F_FLOOR_MOD: NE_R(real_floor_mod(p, q));
        case F_SQUARED_DIFFERENCE: NE_R((p - q) * (p - q));
      }
    } else {
      switch (fn) {
        case F_ADD: NE_R(wrap_add<T>(p, q));
        case F_SUB: NE_R(wrap_sub<T>(p, q));
        case F_MUL: NE_R(wrap_mul<T>(p, q));
        case F_DIV: NE_R(int_div<T>(p, q));
        case F_MAX: NE_R(std::max(p, q));
        case F_MIN: NE_R(std::min(p, q));
        case F_FLOOR_DIV: NE_R(int_floor_div<T>(p, q));
        case F_FLOOR_MOD: NE_R(int_floor_mod<T>(p, q));
        case F_SQUARED_DIFFERENCE: NE_R(wrap_mul<T>(wrap_sub<T>(p, q), wrap_sub<T>(p, q)));
        case F_POW:
          // By squaring, wrapping (numpy's and TF's integer pow); a negative exponent is an
          // error in both, found before the loop starts.
          p.push_loop(ins, s, "neuronish:binary_any", [b, nb](const Step& st, int threads) {
            const T* e = data<const T>(st, 1);
            for (int64_t i = 0; i < nb; ++i)
              if (e[i] < 0)
                throw Error("integers to negative integer powers are not allowed (exponent " +
                            std::to_string((int64_t)e[i]) + ")");
            binary_rows<T, T>(st, threads, b, [](T p, T q) {
              using U = typename std::make_unsigned<T>::type;
              U base = (U)p, acc = 1;
              for (uint64_t k = (uint64_t)q; k; k >>= 1, base = (U)(base * base))
                if (k & 1u) acc = (U)(acc * base);
              return (T)acc;
            });
          });
          return;
      }
    }
#undef NE_R
#undef NE_C
    throw Error("binary: no loop for function " + std::to_string(fn));
  });
}

// x -> y over the axes flagged in `reduced` (y keeps them as 1s): sum/mean/max/min/prod
// (spec.py's REDUCE codes), and any/all of bool (REDUCE_LOGICAL). 16-bit floats accumulate
// in float32 and round once; float64 in double; integers wrap in their own width and a mean
// truncates toward zero, as TF. Walks x once in order, accumulating into y's slot.
void add_g_reduce(Program& p, Reader& rd, Instr& ins) {
  int64_t fn = rd.next();
  Ref x = rd.ref(), y = rd.ref();
  size_t r = x.dims.size();
  std::vector<int64_t> reduced = rd.ints((int64_t)r);
  bool logical = x.code == D_BOOL;
  if (y.dims.size() != r || x.code != y.code ||
      (logical ? fn != R_ANY && fn != R_ALL : fn < R_SUM || fn > R_MUL))
    throw Error("reduce (any dtype): bad spec");
  std::vector<int64_t> yst(r), step(r);
  int64_t group = 1, acc_stride = 1;
  for (size_t k = r; k-- > 0;) {
    yst[k] = acc_stride;
    acc_stride *= y.dims[k];
  }
  for (size_t k = 0; k < r; ++k) {
    if (reduced[k]) group *= x.dims[k];
    if ((reduced[k] ? 1 : x.dims[k]) != y.dims[k]) throw Error("reduce: y's shape");
    step[k] = reduced[k] ? 0 : yst[k];
  }
  int64_t total = elems(x), outs = elems(y);
  memory::dims xd = x.dims;
  Step s;
  p.byte_arg(s, x);
  p.byte_arg(s, y);
  // Along x's last axis a run either folds into one slot of y (reduced) or onto a row of
  // y (kept); the function is chosen here, not per element (a per-element switch was 2.5-3x
  // slower on int32 than the int32-only loop this one replaced).
  const int64_t len = r ? xd[r - 1] : 1;
  const bool fold = r ? reduced[r - 1] != 0 : true;
  with_type(x.code, [&](auto tag) {
    using T = decltype(tag);
    using C = typename Num<T>::C;
    auto push = [&](C init, auto op) {
      p.push_loop(ins, s, "neuronish:reduce_any", [=](const Step& st, int) {
        const T* px = data<const T>(st, 0);
        T* py = data<T>(st, 1);
        std::vector<C> acc(outs, init);
        std::vector<int64_t> at(r, 0);
        int64_t yo = 0;
        for (int64_t base = 0; len > 0 && base < total; base += len) {
          const T* xs = px + base;
          if (fold) {
            C a = acc[yo];
            for (int64_t t = 0; t < len; ++t) a = op(a, Num<T>::get(xs[t]));
            acc[yo] = a;
          } else {
            C* as = acc.data() + yo;  // (a kept last axis: y's stride 1 there)
            for (int64_t t = 0; t < len; ++t) as[t] = op(as[t], Num<T>::get(xs[t]));
          }
          for (size_t k = r ? r - 1 : 0; k-- > 0;) {  // the next run's x index, its y offset
            yo += step[k];
            if (++at[k] < xd[k]) break;
            yo -= step[k] * xd[k];
            at[k] = 0;
          }
        }
        for (int64_t j = 0; j < outs; ++j) {
          C v = acc[j];
          if (fn == R_MEAN) {
            if constexpr (is_real<T>()) v = v / (C)group;
            else v = (C)((int64_t)v / group);  // (int64 sums: C is int64_t, exact)
          }
          py[j] = Num<T>::put(v);
        }
      });
    };
    using L = std::numeric_limits<C>;
    if constexpr (is_real<T>()) {
      switch (fn) {
        case R_MAX: push(-L::infinity(), [](C a, C v) { return nan_max(a, v); }); break;
        case R_MIN: push(L::infinity(), [](C a, C v) { return nan_min(a, v); }); break;
        case R_MUL: push(C(1), [](C a, C v) { return a * v; }); break;
        default: push(C(0), [](C a, C v) { return a + v; });
      }
    } else {
      switch (fn) {
        case R_ANY: push(C(0), [](C a, C v) { return (C)(a | (v != 0)); }); break;
        case R_ALL: push(C(1), [](C a, C v) { return (C)(a & (v != 0)); }); break;
        case R_MAX: push(L::lowest(), [](C a, C v) { return std::max(a, v); }); break;
        case R_MIN: push(L::max(), [](C a, C v) { return std::min(a, v); }); break;
        case R_MUL: push(C(1), [](C a, C v) { return wrap_mul<T>(a, v); }); break;
        default: push(C(0), [](C a, C v) { return wrap_add<T>(a, v); });
      }
    }
  });
}

// One value's conversion, as numpy's astype (the reference kernel): floats to integers
// truncate toward zero, NaN and out-of-range values give the x86 "integer indefinite"
// (INT_MIN of 32 or 64 bits) then keep its low bits; integers narrow to their low bits;
// anything to bool is `x != 0` (NaN is true).
template <class S, class D> D convert(S v) {
  using CS = typename Num<S>::C;
  CS c = Num<S>::get(v);
  if constexpr (std::is_same<D, bool>::value) {
    return c != CS(0);
  } else if constexpr (is_real<D>()) {
    using CD = typename Num<D>::C;
    if constexpr (is_real<S>() && sizeof(CD) < sizeof(CS)) return Num<D>::put((CD)(float)c);
    return Num<D>::put((CD)c);
  } else if constexpr (is_real<S>()) {
    if (sizeof(D) == 8) {
      double d = (double)c;
      return d != d || d >= 9223372036854775808.0 || d < -9223372036854775808.0
                 ? (D)INT64_MIN : (D)(int64_t)d;
    }
    double d = (double)c;
    int32_t w = d != d || d >= 2147483648.0 || d < -2147483648.0 ? INT32_MIN : (int32_t)d;
    return (D)(uint32_t)w;
  } else {
    return (D)(typename std::make_unsigned<D>::type)(uint64_t)(int64_t)c;
  }
}

void add_g_cast(Program& p, Reader& rd, Instr& ins) {
  Ref x = rd.ref(), y = rd.ref();
  int64_t n = elems(x);
  if (n != elems(y)) throw Error("cast: sizes differ");
  Step s;
  p.byte_arg(s, x);
  p.byte_arg(s, y);
  bool to_bool = y.code == D_BOOL;
  with_type(x.code, [&](auto stag) {
    using S = decltype(stag);
    with_type(y.code, [&](auto dtag) {
      using D = decltype(dtag);
      p.push_loop(ins, s, "neuronish:cast_any", [n, to_bool](const Step& st, int threads) {
        const S* a = data<const S>(st, 0);
        D* o = data<D>(st, 1);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static, 4096)
        for (int64_t i = 0; i < n; ++i) {
          if constexpr (std::is_same<D, uint8_t>::value) {
            if (to_bool) {
              o[i] = convert<S, bool>(a[i]);
              continue;
            }
          }
          o[i] = convert<S, D>(a[i]);
        }
      });
    });
  });
}

// Max / avg pooling over NDHWC (a 2-D pool is D = 1), TF's semantics: max ignores the
// padding, avg divides by the count of in-bounds elements. avg accumulates 16-bit floats
// in float32, integers in double (the mean truncated toward zero), as the reference.
void add_g_pool(Program& p, Reader& rd, Instr& ins) {
  int64_t is_max = rd.next();
  memory::dims d = rd.ints(14);  // N D H W C OD OH OW kd kh kw sd sh sw
  memory::dims pad = rd.ints(3);  // front, top, left
  Ref x = rd.ref(), y = rd.ref();
  int64_t N = d[0], D = d[1], H = d[2], W = d[3], C = d[4], OD = d[5], OH = d[6], OW = d[7];
  int64_t kd = d[8], kh = d[9], kw = d[10], sd = d[11], sh = d[12], sw = d[13];
  if (x.code != y.code || x.code == D_BOOL || elems(x) != N * D * H * W * C ||
      elems(y) != N * OD * OH * OW * C)
    throw Error("pool (any dtype): bad spec");
  // An 8-bit 2-D max pool (int8 programs pass uint8 through ResNet's stem pool:
  // cc/passes/quantize.py) is oneDNN's int8 pooling: exact like the loop below, and
  // vectorized (the loop took 5 ms for a 1x1/2 subsample of 8x56x56x256, oneDNN 0.1). Its
  // padding fills with the dtype's least value, which no window's max can be below (each
  // window holds an element of x); the bottom and right pads are the ones the output
  // reaches, oneDNN's output size being floor((H + top + bottom - kh) / sh) + 1.
  int64_t pad_b = std::max<int64_t>(0, (OH - 1) * sh + kh - H - pad[1]);
  int64_t pad_r = std::max<int64_t>(0, (OW - 1) * sw + kw - W - pad[2]);
  if (is_max && D == 1 && OD == 1 && kd == 1 && (x.code == D_U8 || x.code == D_S8) &&
      (H + pad[1] + pad_b - kh) / sh + 1 == OH && (W + pad[2] + pad_r - kw) / sw + 1 == OW) {
    memory::desc x_md({N, C, H, W}, x.type, tag::nhwc), y_md({N, C, OH, OW}, y.type, tag::nhwc);
    auto pd = dnnl::pooling_forward::primitive_desc(
        p.eng, prop_kind::forward_inference, algorithm::pooling_max, x_md, y_md, {sh, sw},
        {kh, kw}, {0, 0}, {pad[1], pad[2]}, {pad_b, pad_r}, p.attr());
    Step s;
    p.arg(s, DNNL_ARG_SRC, x, x_md);
    p.arg(s, DNNL_ARG_DST, y, y_md);
    p.push<dnnl::pooling_forward>(ins, s, pd);
    return;
  }
  Step s;
  p.byte_arg(s, x);
  p.byte_arg(s, y);
  with_type(x.code, [&](auto tag) {
    using T = decltype(tag);
    p.push_loop(ins, s, "neuronish:pool_any", [=](const Step& st, int threads) {
      using C_ = typename Num<T>::C;
      using A = typename std::conditional<std::is_floating_point<C_>::value, C_, double>::type;
      const T* px = data<const T>(st, 0);
      T* py = data<T>(st, 1);
#pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1)
      for (int64_t b = 0; b < N; ++b)
        for (int64_t od = 0; od < OD; ++od)
          for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow)
              for (int64_t c = 0; c < C; ++c) {
                A acc = 0;
                C_ best = 0;
                bool first = true;
                int64_t count = 0;
                for (int64_t i = 0; i < kd; ++i) {
                  int64_t z = od * sd - pad[0] + i;
                  if (z < 0 || z >= D) continue;
                  for (int64_t j = 0; j < kh; ++j) {
                    int64_t yy = oh * sh - pad[1] + j;
                    if (yy < 0 || yy >= H) continue;
                    for (int64_t k = 0; k < kw; ++k) {
                      int64_t xx = ow * sw - pad[2] + k;
                      if (xx < 0 || xx >= W) continue;
                      C_ v = Num<T>::get(px[(((b * D + z) * H + yy) * W + xx) * C + c]);
                      if (is_max) {
                        if constexpr (is_real<T>()) best = first ? v : nan_max(best, v);
                        else best = first ? v : std::max(best, v);
                        first = false;
                      } else {
                        acc += (A)v;
                        ++count;
                      }
                    }
                  }
                }
                T& out = py[(((b * OD + od) * OH + oh) * OW + ow) * C + c];
                if (is_max) {
                  out = Num<T>::put(best);
                } else if constexpr (is_real<T>()) {
                  out = Num<T>::put((C_)(acc / (A)count));
                } else {
                  out = (T)(int64_t)std::trunc(acc / (A)count);
                }
              }
    });
  });
}

// Softmax or log-softmax of x [outer, n, inner] along n, numerically stable (x - max),
// in float32 for 16-bit floats and in double for float64, rounded once.
void add_g_softmax(Program& p, Reader& rd, Instr& ins) {
  int64_t log = rd.next(), outer = rd.next(), n = rd.next(), inner = rd.next();
  Ref x = rd.ref(), y = rd.ref();
  if (x.code != y.code || elems(x) != outer * n * inner || elems(y) != elems(x) || n < 1)
    throw Error("softmax (any dtype): bad spec");
  Step s;
  p.byte_arg(s, x);
  p.byte_arg(s, y);
  with_type(x.code, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_real<T>()) {
      throw Error("softmax takes floats");
    } else {
      using C = typename Num<T>::C;
      // An axis not the last: the same steps for up to kBlock neighbouring positions at
      // once, walking rows of x in order (one strided column at a time was 5x slower).
      auto blocks = [=](const T* px, T* py, int threads) {
        constexpr int64_t kBlock = 256;
        const int64_t nblocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1)
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t b = 0; b < nblocks; ++b) {
            const int64_t i0 = b * kBlock, w = std::min(kBlock, inner - i0);
            const T* a = px + o * n * inner + i0;
            T* out = py + o * n * inner + i0;
            C m[kBlock], sum[kBlock], lsum[kBlock];
            bool nan[kBlock];
            for (int64_t i = 0; i < w; ++i) {
              m[i] = -std::numeric_limits<C>::infinity();
              nan[i] = false;
              sum[i] = 0;
            }
            for (int64_t j = 0; j < n; ++j)
              for (int64_t i = 0; i < w; ++i) {
                C v = Num<T>::get(a[j * inner + i]);
                nan[i] |= v != v;
                m[i] = std::max(m[i], v);
              }
            for (int64_t i = 0; i < w; ++i)
              if (nan[i]) m[i] = std::numeric_limits<C>::quiet_NaN();
            for (int64_t j = 0; j < n; ++j)
              for (int64_t i = 0; i < w; ++i)
                sum[i] += std::exp(Num<T>::get(a[j * inner + i]) - m[i]);
            for (int64_t i = 0; i < w; ++i) lsum[i] = std::log(sum[i]);
            for (int64_t j = 0; j < n; ++j)
              for (int64_t i = 0; i < w; ++i) {
                C v = Num<T>::get(a[j * inner + i]) - m[i];
                out[j * inner + i] = Num<T>::put(log ? v - lsum[i] : std::exp(v) / sum[i]);
              }
          }
      };
      p.push_loop(ins, s, "neuronish:softmax_any", [=](const Step& st, int threads) {
        const T* px = data<const T>(st, 0);
        T* py = data<T>(st, 1);
        if (inner > 1) {
          blocks(px, py, threads);
          return;
        }
#pragma omp parallel for num_threads(threads) if (threads > 1)
        for (int64_t o = 0; o < outer; ++o) {  // the last axis: one contiguous row each
          const T* a = px + o * n;
          T* out = py + o * n;
          C m = -std::numeric_limits<C>::infinity();
          bool nan = false;
          for (int64_t j = 0; j < n; ++j) {
            C v = Num<T>::get(a[j]);
            nan |= v != v;
            m = std::max(m, v);
          }
          if (nan) m = std::numeric_limits<C>::quiet_NaN();
          C sum = 0;
          for (int64_t j = 0; j < n; ++j) sum += std::exp(Num<T>::get(a[j]) - m);
          C lsum = std::log(sum);
          for (int64_t j = 0; j < n; ++j) {
            C v = Num<T>::get(a[j]) - m;
            out[j] = Num<T>::put(log ? v - lsum : std::exp(v) / sum);
          }
        }
      });
    }
  });
}

// Layer norm of x [rows, c] over c: (x - mean) / sqrt(var + eps) * scale + shift, var the
// mean of the squared deviations; float32 for 16-bit floats, double for float64.
void add_g_layer_norm(Program& p, Reader& rd, Instr& ins) {
  int64_t rows = rd.next(), c = rd.next(), eps_bits = rd.next();
  double eps;
  std::memcpy(&eps, &eps_bits, 8);
  Ref x = rd.ref(), scale = rd.ref(), shift = rd.ref(), y = rd.ref();
  if (x.code != y.code || scale.code != x.code || shift.code != x.code ||
      elems(x) != rows * c || elems(scale) != c || elems(shift) != c || elems(y) != rows * c)
    throw Error("layer_norm (any dtype): bad spec");
  Step s;
  p.byte_arg(s, x);
  p.byte_arg(s, scale);
  p.byte_arg(s, shift);
  p.byte_arg(s, y);
  with_type(x.code, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!is_real<T>()) {
      throw Error("layer_norm takes floats");
    } else {
      p.push_loop(ins, s, "neuronish:layer_norm_any", [=](const Step& st, int threads) {
        using C = typename Num<T>::C;
        const T* px = data<const T>(st, 0);
        const T* sc = data<const T>(st, 1);
        const T* sh = data<const T>(st, 2);
        T* py = data<T>(st, 3);
#pragma omp parallel for num_threads(threads) if (threads > 1)
        for (int64_t r = 0; r < rows; ++r) {
          const T* a = px + r * c;
          C mean = 0, var = 0;
          for (int64_t j = 0; j < c; ++j) mean += Num<T>::get(a[j]);
          mean /= (C)c;
          for (int64_t j = 0; j < c; ++j) {
            C dv = Num<T>::get(a[j]) - mean;
            var += dv * dv;
          }
          var /= (C)c;
          C inv = C(1) / std::sqrt(var + (C)eps);
          for (int64_t j = 0; j < c; ++j)
            py[r * c + j] = Num<T>::put((Num<T>::get(a[j]) - mean) * inv * Num<T>::get(sc[j]) +
                                        Num<T>::get(sh[j]));
        }
      });
    }
  });
}

// Concatenation of `count` inputs [outer, inner_k] (elements of any dtype, moved as bytes)
// into y [outer, sum of inner_k].
void add_g_concat(Program& p, Reader& rd, Instr& ins) {
  int64_t count = rd.next(), outer = rd.next();
  if (count < 1 || count > 4096) throw Error("concat: bad input count");
  std::vector<Ref> xs;
  std::vector<int64_t> inner;
  for (int64_t k = 0; k < count; ++k) {
    inner.push_back(rd.next());
    xs.push_back(rd.ref());
  }
  Ref y = rd.ref();
  int64_t total = 0;
  size_t size = memory::data_type_size(y.type);
  for (int64_t k = 0; k < count; ++k) {
    if (xs[k].code != y.code || elems(xs[k]) != outer * inner[k])
      throw Error("concat: an input's dtype or size");
    total += inner[k];
  }
  if (elems(y) != outer * total) throw Error("concat: y's size");
  Step s;
  for (auto& x : xs) p.byte_arg(s, x);
  p.byte_arg(s, y);
  p.push_loop(ins, s, "neuronish:concat_any", [=](const Step& st, int threads) {
    char* py = data<char>(st, (size_t)count);
#pragma omp parallel for num_threads(threads) if (threads > 1)
    for (int64_t o = 0; o < outer; ++o) {
      int64_t at = o * total;
      for (int64_t k = 0; k < count; ++k) {
        std::memcpy(py + at * size, data<const char>(st, (size_t)k) + o * inner[k] * size,
                    inner[k] * size);
        at += inner[k];
      }
    }
  });
}

// The fused epilogue of the loops below: bias, residual, then a unary function (0: none).
template <class T>
typename Num<T>::C epilogue(typename Num<T>::C v, int64_t act, double alpha) {
  using C = typename Num<T>::C;
  if (act == 0) return v;
  if constexpr (is_real<T>()) return real_unary<C>(act, v, (C)alpha);
  else return int_unary<T>(act, (T)v);
}

// y [batch, M, N] = op(a) @ op(b) (+ bias) (+ residual), then the activation; per batch
// index the offsets of its a and b matrices (broadcasting). float64 in double; integers
// wrap in their width, as numpy's matmul.
void add_g_matmul(Program& p, Reader& rd, Instr& ins) {
  int64_t batch = rd.next(), M = rd.next(), N = rd.next(), K = rd.next();
  int64_t ta = rd.next(), tb = rd.next(), has_bias = rd.next(), has_res = rd.next();
  int64_t act = rd.next(), alpha_bits = rd.next();
  double alpha;
  std::memcpy(&alpha, &alpha_bits, 8);
  if (batch < 1 || batch > (1 << 24)) throw Error("matmul (any dtype): bad batch");
  std::vector<int64_t> aoff = rd.ints(batch), boff = rd.ints(batch);
  Ref A = rd.ref(), B = rd.ref(), bias, res;
  if (has_bias) bias = rd.ref();
  if (has_res) res = rd.ref();
  Ref y = rd.ref();
  for (int64_t k = 0; k < batch; ++k)
    if (aoff[k] < 0 || aoff[k] + M * K > elems(A) || boff[k] < 0 || boff[k] + K * N > elems(B))
      throw Error("matmul (any dtype): an operand offset");
  if (A.code != B.code || y.code != A.code || elems(y) != batch * M * N ||
      (has_bias && (bias.code != A.code || elems(bias) != N)) ||
      (has_res && (res.code != A.code || elems(res) != elems(y))))
    throw Error("matmul (any dtype): bad spec");
  Step s;
  p.byte_arg(s, A);
  p.byte_arg(s, B);
  if (has_bias) p.byte_arg(s, bias);
  if (has_res) p.byte_arg(s, res);
  p.byte_arg(s, y);
  with_type(A.code, [&](auto tag) {
    using T = decltype(tag);
    using C = typename Num<T>::C;
    epilogue<T>(C(1), act, alpha);  // an unknown activation fails at load
    p.push_loop(ins, s, "neuronish:matmul_any", [=](const Step& st, int threads) {
      const T* pa = data<const T>(st, 0);
      const T* pb = data<const T>(st, 1);
      size_t k = 2;
      const T* pbias = has_bias ? data<const T>(st, k++) : nullptr;
      const T* pres = has_res ? data<const T>(st, k++) : nullptr;
      T* py = data<T>(st, k);
#pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1)
      for (int64_t bi = 0; bi < batch; ++bi)
        for (int64_t i = 0; i < M; ++i) {
          const T* a = pa + aoff[bi];
          const T* b = pb + boff[bi];
          // Row i of y accumulated over k (b's rows read contiguously; a transposed b is
          // read as dot products instead).
          std::vector<C> row(N, C(0));
          for (int64_t q = 0; q < K; ++q) {
            C u = Num<T>::get(ta ? a[q * M + i] : a[i * K + q]);
            if (tb) {
              for (int64_t j = 0; j < N; ++j) {
                C v = Num<T>::get(b[j * K + q]);
                if constexpr (is_real<T>()) row[j] += u * v;
                else row[j] = wrap_add<T>(row[j], wrap_mul<T>(u, v));
              }
            } else {
              const T* brow = b + q * N;
              C* acc = row.data();
#pragma omp simd
              for (int64_t j = 0; j < N; ++j) {
                C v = Num<T>::get(brow[j]);
                if constexpr (is_real<T>()) acc[j] += u * v;
                else acc[j] = wrap_add<T>(acc[j], wrap_mul<T>(u, v));
              }
            }
          }
          for (int64_t j = 0; j < N; ++j) {
            C acc = row[j];
            int64_t at = (bi * M + i) * N + j;
            if constexpr (is_real<T>()) {
              if (pbias) acc += Num<T>::get(pbias[j]);
              if (pres) acc += Num<T>::get(pres[at]);
            } else {
              if (pbias) acc = wrap_add<T>(acc, pbias[j]);
              if (pres) acc = wrap_add<T>(acc, pres[at]);
            }
            py[at] = Num<T>::put(epilogue<T>(acc, act, alpha));
          }
        }
    });
  });
}

// Direct convolution over NDHWC (2-D: D = 1) with a [KD, KH, KW, CI, O] filter, in groups
// (depthwise: C groups of `mult` outputs each), zero padding, then bias, residual and the
// activation. float64 in double; integers wrap in their width.
void add_g_conv(Program& p, Reader& rd, Instr& ins) {
  memory::dims d = rd.ints(16);  // N D H W C | KD KH KW CI O | OD OH OW | groups depthwise mult
  memory::dims st = rd.ints(9);  // strides, dilations, pads (front, top, left) per dim
  int64_t has_bias = rd.next(), has_res = rd.next(), act = rd.next(), alpha_bits = rd.next();
  double alpha;
  std::memcpy(&alpha, &alpha_bits, 8);
  Ref x = rd.ref(), w = rd.ref(), bias, res;
  if (has_bias) bias = rd.ref();
  if (has_res) res = rd.ref();
  Ref y = rd.ref();
  int64_t N = d[0], D = d[1], H = d[2], W = d[3], C = d[4], KD = d[5], KH = d[6], KW = d[7];
  int64_t CI = d[8], O = d[9], OD = d[10], OH = d[11], OW = d[12], G = d[13];
  bool depthwise = d[14] != 0;
  int64_t mult = d[15];
  int64_t OC = depthwise ? C * mult : O;  // output channels
  int64_t WC = depthwise ? C : CI;        // the filter's channel dim
  if (x.code != w.code || y.code != x.code || G < 1 || CI * G != C ||
      elems(x) != N * D * H * W * C || elems(w) != KD * KH * KW * WC * O || elems(y) != N * OD * OH * OW * OC ||
      (has_bias && (bias.code != x.code || elems(bias) != OC)) ||
      (has_res && (res.code != x.code || elems(res) != elems(y))) || (!depthwise && O % G))
    throw Error("conv (any dtype): bad spec");
  Step s;
  p.byte_arg(s, x);
  p.byte_arg(s, w);
  if (has_bias) p.byte_arg(s, bias);
  if (has_res) p.byte_arg(s, res);
  p.byte_arg(s, y);
  with_type(x.code, [&](auto tag) {
    using T = decltype(tag);
    using Cv = typename Num<T>::C;
    epilogue<T>(Cv(1), act, alpha);
    p.push_loop(ins, s, "neuronish:conv_any", [=](const Step& step, int threads) {
      const T* px = data<const T>(step, 0);
      const T* pw = data<const T>(step, 1);
      size_t k = 2;
      const T* pbias = has_bias ? data<const T>(step, k++) : nullptr;
      const T* pres = has_res ? data<const T>(step, k++) : nullptr;
      T* py = data<T>(step, k);
      const int64_t og = depthwise ? mult : O / G;  // outputs per group
#pragma omp parallel for collapse(2) num_threads(threads) if (threads > 1)
      for (int64_t b = 0; b < N; ++b)
        for (int64_t od = 0; od < OD; ++od)
          for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow)
              {
                // This pixel's output channels accumulated together: each input value times
                // its filter row (contiguous over the outputs).
                std::vector<Cv> acc(OC, Cv(0));
                for (int64_t i = 0; i < KD; ++i) {
                  int64_t z = od * st[0] - st[6] + i * st[3];
                  if (z < 0 || z >= D) continue;
                  for (int64_t j = 0; j < KH; ++j) {
                    int64_t yy = oh * st[1] - st[7] + j * st[4];
                    if (yy < 0 || yy >= H) continue;
                    for (int64_t q = 0; q < KW; ++q) {
                      int64_t xx = ow * st[2] - st[8] + q * st[5];
                      if (xx < 0 || xx >= W) continue;
                      const T* xin = px + (((b * D + z) * H + yy) * W + xx) * C;
                      const T* wk = pw + ((i * KH + j) * KW + q) * WC * O;
                      for (int64_t c = 0; c < C; ++c) {
                        // channel c of group g feeds outputs [g*og, (g+1)*og); depthwise:
                        // w [.., C, mult], output c*mult+m; else w [.., CI, O].
                        Cv u = Num<T>::get(xin[c]);
                        int64_t g = c / CI;
                        const T* wrow = depthwise ? wk + c * O : wk + (c % CI) * O + g * og;
                        Cv* out = acc.data() + g * og;
#pragma omp simd
                        for (int64_t m = 0; m < og; ++m) {
                          Cv v = Num<T>::get(wrow[m]);
                          if constexpr (is_real<T>()) out[m] += u * v;
                          else out[m] = wrap_add<T>(out[m], wrap_mul<T>(u, v));
                        }
                      }
                    }
                  }
                }
                for (int64_t oc = 0; oc < OC; ++oc) {
                  Cv v = acc[oc];
                  int64_t at = (((b * OD + od) * OH + oh) * OW + ow) * OC + oc;
                  if constexpr (is_real<T>()) {
                    if (pbias) v += Num<T>::get(pbias[oc]);
                    if (pres) v += Num<T>::get(pres[at]);
                  } else {
                    if (pbias) v = wrap_add<T>(v, pbias[oc]);
                    if (pres) v = wrap_add<T>(v, pres[at]);
                  }
                  py[at] = Num<T>::put(epilogue<T>(v, act, alpha));
                }
              }
    });
  });
}

void add_generic(Program& p, int64_t op, Reader& rd, Instr& ins) {
  switch (op) {
    case OP_G_UNARY: add_g_unary(p, rd, ins); break;
    case OP_G_BINARY: add_g_binary(p, rd, ins); break;
    case OP_G_REDUCE: add_g_reduce(p, rd, ins); break;
    case OP_G_CAST: add_g_cast(p, rd, ins); break;
    case OP_G_POOL: add_g_pool(p, rd, ins); break;
    case OP_G_SOFTMAX: add_g_softmax(p, rd, ins); break;
    case OP_G_LAYER_NORM: add_g_layer_norm(p, rd, ins); break;
    case OP_G_CONCAT: add_g_concat(p, rd, ins); break;
    case OP_G_MATMUL: add_g_matmul(p, rd, ins); break;
    default: add_g_conv(p, rd, ins); break;
  }
}

}  // namespace
