/* Run a compiled SavedModel from TensorFlow's C API, without Python (C99).
 *
 *   tf_saved_model [-l OP_LIBRARY]... [-i INPUTS.bin] [-o OUTPUTS.bin] [-n CALLS]
 *                  [-T THREADS [-S SECONDS]] [-B BASELINE_DIR]
 *                  MODEL_DIR INPUT=DTYPE:D0,D1,... ... -- OUTPUT ... [-- BASELINE_OUTPUT ...]
 *
 * Loads each OP_LIBRARY with TF_LoadLibrary (`neuronish op-library` prints the path of
 * the one whose NeuronOp calls the C runtime), then MODEL_DIR with
 * TF_LoadSessionFromSavedModel (tag "serve"), and runs the given graph tensors: inputs
 * named as in the signature's SignatureDef (`serving_default_x:0=float32:4,16`) filled
 * with zeros, or with the bytes of INPUTS.bin (every input in order, C-contiguous, one
 * after another), and outputs (`StatefulPartitionedCall:0`). It prints one line per
 * output (name, dtype, shape, sum of its elements) and writes their bytes, one after
 * another, to OUTPUTS.bin.
 *
 * -n CALLS runs the call that many more times and prints the median time of one; with
 * -B, a second SavedModel (the original, say) with the same input names is loaded too,
 * its outputs named after a second `--` (compiling renames them), and the two are called
 * alternately, CALLS times each, and both medians printed.
 * -T THREADS measures throughput: the call made in a loop by one thread, then by THREADS
 * threads at once (one session, as a server's request threads share one), SECONDS (default
 * 1) each, five rounds, alternating with the baseline's; it prints each model's median calls
 * per second with one thread and with THREADS, and the median of the rounds' ratios. Each
 * thread checks its last outputs against the first call's (THREADS from 1 to 64).
 * Exit status 0 on success, 1 with TensorFlow's message on stderr, 2 on bad usage.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensorflow/c/c_api.h"

#define MAX_TENSORS 64
#define MAX_DIMS 16

static int usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [-l OP_LIBRARY]... [-i INPUTS.bin] [-o OUTPUTS.bin] [-n CALLS] "
          "[-T THREADS [-S SECONDS]] [-B BASELINE_DIR] MODEL_DIR INPUT=DTYPE:D0,D1,... ... -- "
          "OUTPUT ... "
          "[-- BASELINE_OUTPUT ...]\n",
          argv0);
  return 2;
}

/* TensorFlow's status codes (tensorflow/c/tf_status.h) a NeuronOp call may return. */
static const char *code_name(TF_Code code) {
  switch (code) {
    case TF_CANCELLED: return "CANCELLED";
    case TF_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case TF_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case TF_NOT_FOUND: return "NOT_FOUND";
    case TF_DATA_LOSS: return "DATA_LOSS";
    case TF_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case TF_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case TF_INTERNAL: return "INTERNAL";
    default: return "error";
  }
}

static int fail(const char *what, TF_Status *status) {
  fprintf(stderr, "tf_saved_model: %s: [%s] %s\n", what, code_name(TF_GetCode(status)),
          TF_Message(status));
  return 1;
}

static const struct {
  const char *name;
  TF_DataType type;
} kDtypes[] = {{"float32", TF_FLOAT}, {"float64", TF_DOUBLE}, {"float16", TF_HALF},
               {"bfloat16", TF_BFLOAT16}, {"int8", TF_INT8}, {"uint8", TF_UINT8},
               {"int16", TF_INT16}, {"int32", TF_INT32}, {"int64", TF_INT64},
               {"bool", TF_BOOL}};

static const char *dtype_name(TF_DataType t) {
  for (size_t i = 0; i < sizeof kDtypes / sizeof kDtypes[0]; ++i)
    if (kDtypes[i].type == t) return kDtypes[i].name;
  return "?";
}

/* "op_name:index" -> TF_Output of `graph`; 0 when the graph has no such operation. */
static int find_output(TF_Graph *graph, const char *tensor, TF_Output *out) {
  char op[512];
  const char *colon = strrchr(tensor, ':');
  size_t len = colon ? (size_t)(colon - tensor) : strlen(tensor);
  if (len >= sizeof op) return 0;
  memcpy(op, tensor, len);
  op[len] = '\0';
  out->oper = TF_GraphOperationByName(graph, op);
  out->index = colon ? atoi(colon + 1) : 0;
  return out->oper != NULL;
}

/* One input argument, `name=dtype:d0,d1,...`, as a zero-filled tensor; NULL if malformed. */
static TF_Tensor *parse_input(char *arg, char **name) {
  char *eq = strrchr(arg, '=');
  if (!eq) return NULL;
  *eq = '\0';
  *name = arg;
  char *colon = strchr(eq + 1, ':');
  if (!colon) return NULL;
  *colon = '\0';
  TF_DataType type = (TF_DataType)-1;
  for (size_t i = 0; i < sizeof kDtypes / sizeof kDtypes[0]; ++i)
    if (strcmp(kDtypes[i].name, eq + 1) == 0) type = kDtypes[i].type;
  if ((int)type < 0) return NULL;
  int64_t dims[MAX_DIMS];
  int rank = 0;
  size_t bytes = TF_DataTypeSize(type);
  for (char *p = colon + 1; *p && rank < MAX_DIMS; ++rank) {
    char *end;
    dims[rank] = strtoll(p, &end, 10);
    if (end == p || dims[rank] < 0) return NULL;
    bytes *= (size_t)dims[rank];
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return NULL;
  }
  TF_Tensor *t = TF_AllocateTensor(type, dims, rank, bytes);
  if (t) memset(TF_TensorData(t), 0, bytes);
  return t;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_doubles);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A loaded SavedModel with its feeds and fetches resolved. */
typedef struct {
  TF_Graph *graph;
  TF_Session *session;
  TF_Output ins[MAX_TENSORS], outs[MAX_TENSORS];
} Model;

static int load_model(const char *dir, char **in_names, int n_in, char **out_names, int n_out,
                      Model *m, TF_Status *status) {
  const char *tags[] = {"serve"};
  TF_SessionOptions *opts = TF_NewSessionOptions();
  m->graph = TF_NewGraph();
  m->session = TF_LoadSessionFromSavedModel(opts, NULL, dir, tags, 1, m->graph, NULL, status);
  TF_DeleteSessionOptions(opts);
  if (TF_GetCode(status) != TF_OK) return fail(dir, status);
  for (int i = 0; i < n_in + n_out; ++i) {
    const char *name = i < n_in ? in_names[i] : out_names[i - n_in];
    if (!find_output(m->graph, name, i < n_in ? &m->ins[i] : &m->outs[i - n_in])) {
      fprintf(stderr, "tf_saved_model: %s has no tensor %s (take the names from the "
              "signature's SignatureDef)\n", dir, name);
      return 1;
    }
  }
  return 0;
}

/* One call; the outputs replace `results` (deleted first when set). */
static int run(Model *m, TF_Tensor **ins, int n_in, TF_Tensor **results, int n_out,
               TF_Status *status) {
  for (int i = 0; i < n_out; ++i) {
    if (results[i]) TF_DeleteTensor(results[i]);
    results[i] = NULL;
  }
  TF_SessionRun(m->session, NULL, m->ins, ins, n_in, m->outs, results, n_out, NULL, 0, NULL,
                status);
  return TF_GetCode(status) == TF_OK ? 0 : fail("running the model", status);
}

/* Throughput: `threads` threads call `m` in a loop until `deadline_us`; calls per second.
 * Each thread checks its last outputs against `want` (the first call's): a race between
 * concurrent calls would show as a failure, not as a figure. */
typedef struct {
  Model *m;
  TF_Tensor **ins, **want;
  int n_in, n_out;
  double deadline_us;
  long calls;
  int failed;
} Caller;

/* Whether `got` is `want` (float32 within 1e-5 relative: the engine may pick another thread
 * count under load, and sum in another order; every other dtype exactly). */
static int same_tensor(TF_Tensor *got, TF_Tensor *want) {
  size_t bytes = TF_TensorByteSize(want);
  if (TF_TensorType(got) != TF_TensorType(want) || TF_TensorByteSize(got) != bytes) return 0;
  if (TF_TensorType(want) != TF_FLOAT) return memcmp(TF_TensorData(got), TF_TensorData(want), bytes) == 0;
  const float *g = TF_TensorData(got), *w = TF_TensorData(want);
  for (size_t k = 0; k < bytes / sizeof *w; ++k) {
    float tolerance = 1e-5f * (1.0f + (w[k] < 0 ? -w[k] : w[k]));
    if (!(g[k] - w[k] <= tolerance && w[k] - g[k] <= tolerance)) return 0;
  }
  return 1;
}

static void *call_in_loop(void *arg) {
  Caller *c = arg;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *results[MAX_TENSORS] = {0};
  while (!c->failed && now_us() < c->deadline_us) {
    c->failed = run(c->m, c->ins, c->n_in, results, c->n_out, status);
    ++c->calls;
  }
  for (int i = 0; i < c->n_out; ++i) {
    if (!c->failed && results[i] && !same_tensor(results[i], c->want[i])) {
      fprintf(stderr, "tf_saved_model: a concurrent call's output %d differs from the first "
              "call's\n", i);
      c->failed = 1;
    }
    if (results[i]) TF_DeleteTensor(results[i]);
  }
  TF_DeleteStatus(status);
  return NULL;
}

static double calls_per_second(Model *m, TF_Tensor **ins, int n_in, TF_Tensor **want, int n_out,
                               int threads, double seconds) {
  Caller callers[64];
  pthread_t ids[64];
  double t0 = now_us();
  int started = 0, failed = 0;
  for (; started < threads; ++started) {
    callers[started] = (Caller){m, ins, want, n_in, n_out, t0 + seconds * 1e6, 0, 0};
    if (pthread_create(&ids[started], NULL, call_in_loop, &callers[started]) != 0) {
      fprintf(stderr, "tf_saved_model: cannot start thread %d of %d\n", started + 1, threads);
      failed = 1;
      break;
    }
  }
  long calls = 0;
  for (int t = 0; t < started; ++t) { /* (each stops at the deadline: none outlives this) */
    pthread_join(ids[t], NULL);
    calls += callers[t].calls;
    failed |= callers[t].failed;
  }
  return failed ? -1 : calls / ((now_us() - t0) / 1e6);
}

/* Five rounds of one thread then `threads`, each model in turn; prints the medians. */
static int throughput(Model **models, const char **names, int n_models, TF_Tensor **ins,
                      int n_in, TF_Tensor ***wants, int n_out, int threads, double seconds) {
  enum { kRounds = 5 };
  double one[2][kRounds], many[2][kRounds], ratio[2][kRounds];
  for (int m = 0; m < n_models; ++m) /* warm: every thread's first call */
    if (calls_per_second(models[m], ins, n_in, wants[m], n_out, threads, 0.2) < 0) return 1;
  for (int r = 0; r < kRounds; ++r) {
    for (int m = 0; m < n_models; ++m) {
      one[m][r] = calls_per_second(models[m], ins, n_in, wants[m], n_out, 1, seconds);
      many[m][r] = calls_per_second(models[m], ins, n_in, wants[m], n_out, threads, seconds);
      if (one[m][r] < 0 || many[m][r] < 0) return 1;
      ratio[m][r] = many[m][r] / one[m][r];
    }
  }
  for (int m = 0; m < n_models; ++m) {
    printf("calls_per_s %s 1 %.0f %d %.0f ratio %.3f\n", names[m], median(one[m], kRounds),
           threads, median(many[m], kRounds), median(ratio[m], kRounds));
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *feed_path = NULL, *out_path = NULL, *baseline = NULL;
  int calls = 0, threads = 0, argi = 1;
  double seconds = 1.0;
  TF_Status *status = TF_NewStatus();
  for (; argi < argc && argv[argi][0] == '-' && argv[argi][1] && !argv[argi][2]; argi += 2) {
    if (argi + 1 >= argc) return usage(argv[0]);
    const char *value = argv[argi + 1];
    switch (argv[argi][1]) {
      case 'l':
        /* The library stays loaded for the process's life: its op and kernel are
         * registered in TensorFlow's global registries. */
        TF_LoadLibrary(value, status);
        if (TF_GetCode(status) != TF_OK) return fail(value, status);
        break;
      case 'i': feed_path = value; break;
      case 'o': out_path = value; break;
      case 'n': calls = atoi(value); break;
      case 'T': {
        char *end;
        long n = strtol(value, &end, 10);
        threads = *end || n < 1 || n > 64 ? -1 : (int)n; /* (refused below, with the usage) */
        break;
      }
      case 'S': {
        char *end;
        seconds = strtod(value, &end);
        if (*end) seconds = -1;
        break;
      }
      case 'B': baseline = value; break;
      default: return usage(argv[0]);
    }
  }
  if (argi >= argc) return usage(argv[0]);
  const char *model_dir = argv[argi++];
  char *in_names[MAX_TENSORS], *out_names[MAX_TENSORS], *base_names[MAX_TENSORS];
  TF_Tensor *ins[MAX_TENSORS], *results[MAX_TENSORS] = {0}, *base_results[MAX_TENSORS] = {0};
  int n_in = 0, n_out = 0;
  for (; argi < argc && strcmp(argv[argi], "--") != 0; ++argi) {
    if (n_in == MAX_TENSORS) return usage(argv[0]);
    ins[n_in] = parse_input(argv[argi], &in_names[n_in]);
    if (!ins[n_in]) {
      fprintf(stderr, "tf_saved_model: input '%s': expected NAME=DTYPE:D0,D1,... with DTYPE "
              "one of float32, float64, float16, bfloat16, int8, uint8, int16, int32, int64, "
              "bool\n", argv[argi]);
      return 2;
    }
    ++n_in;
  }
  for (++argi; argi < argc && strcmp(argv[argi], "--") != 0; ++argi) {
    if (n_out == MAX_TENSORS) return usage(argv[0]);
    out_names[n_out++] = argv[argi];
  }
  int n_base = 0;
  for (++argi; argi < argc; ++argi) {
    if (n_base == MAX_TENSORS) return usage(argv[0]);
    base_names[n_base++] = argv[argi];
  }
  if (n_out == 0 || (baseline && n_base != n_out) || threads < 0 || threads > 64 ||
      !(seconds > 0)) {
    return usage(argv[0]);
  }

  if (feed_path) {
    FILE *feed = fopen(feed_path, "rb");
    if (!feed) {
      fprintf(stderr, "tf_saved_model: cannot open %s\n", feed_path);
      return 1;
    }
    for (int i = 0; i < n_in; ++i) {
      size_t bytes = TF_TensorByteSize(ins[i]);
      if (fread(TF_TensorData(ins[i]), 1, bytes, feed) != bytes) {
        fprintf(stderr, "tf_saved_model: %s is too short for the inputs (at %s)\n", feed_path,
                in_names[i]);
        return 1;
      }
    }
    fclose(feed);
  }

  Model model, base;
  if (load_model(model_dir, in_names, n_in, out_names, n_out, &model, status)) return 1;
  if (baseline && load_model(baseline, in_names, n_in, base_names, n_out, &base, status)) return 1;
  if (run(&model, ins, n_in, results, n_out, status)) return 1;

  FILE *out = out_path ? fopen(out_path, "wb") : NULL;
  if (out_path && !out) {
    fprintf(stderr, "tf_saved_model: cannot write %s\n", out_path);
    return 1;
  }
  for (int i = 0; i < n_out; ++i) {
    TF_Tensor *t = results[i];
    printf("%s %s [", out_names[i], dtype_name(TF_TensorType(t)));
    for (int d = 0; d < TF_NumDims(t); ++d) printf("%s%lld", d ? "," : "", (long long)TF_Dim(t, d));
    double sum = 0;
    if (TF_TensorType(t) == TF_FLOAT) {
      const float *v = TF_TensorData(t);
      for (size_t k = 0; k < TF_TensorByteSize(t) / sizeof *v; ++k) sum += v[k];
    }
    printf("] %.9g\n", sum);
    if (out && fwrite(TF_TensorData(t), 1, TF_TensorByteSize(t), out) != TF_TensorByteSize(t)) {
      fprintf(stderr, "tf_saved_model: cannot write %s\n", out_path);
      return 1;
    }
  }
  if (out && fclose(out) != 0) {
    fprintf(stderr, "tf_saved_model: cannot write %s\n", out_path);
    return 1;
  }

  if (calls > 0) {
    double *times = malloc(sizeof(double) * (size_t)calls * 2);
    if (!times) return 1;
    if (baseline && run(&base, ins, n_in, base_results, n_out, status)) return 1; /* warm */
    for (int k = 0; k < calls; ++k) {
      double t0 = now_us();
      if (run(&model, ins, n_in, results, n_out, status)) return 1;
      times[k] = now_us() - t0;
      if (baseline) {
        t0 = now_us();
        if (run(&base, ins, n_in, base_results, n_out, status)) return 1;
        times[calls + k] = now_us() - t0;
      }
    }
    printf("median_us %s %.2f\n", model_dir, median(times, calls));
    if (baseline) printf("median_us %s %.2f\n", baseline, median(times + calls, calls));
    free(times);
  }

  if (threads > 0) {
    Model *models[2] = {&model, &base};
    const char *names[2] = {model_dir, baseline};
    /* each model's first outputs, which every concurrent call must give again */
    if (baseline && !base_results[0] && run(&base, ins, n_in, base_results, n_out, status)) return 1;
    TF_Tensor **wants[2] = {results, base_results};
    if (throughput(models, names, baseline ? 2 : 1, ins, n_in, wants, n_out, threads, seconds))
      return 1;
  }

  for (int i = 0; i < n_out; ++i) {
    if (results[i]) TF_DeleteTensor(results[i]);
    if (base_results[i]) TF_DeleteTensor(base_results[i]);
  }
  for (int i = 0; i < n_in; ++i) TF_DeleteTensor(ins[i]);
  TF_CloseSession(model.session, status);
  TF_DeleteSession(model.session, status);
  TF_DeleteGraph(model.graph);
  if (baseline) {
    TF_CloseSession(base.session, status);
    TF_DeleteSession(base.session, status);
    TF_DeleteGraph(base.graph);
  }
  TF_DeleteStatus(status);
  return 0;
}
