/* A model server moving between versions of one compiled SavedModel, on TensorFlow's C API
 * (C99; built and run by tests/neuronish/test_op_library_c_versions.py).
 *
 *   tf_versions OP_LIBRARY MODEL_DIR INPUT_TENSOR OUTPUT_TENSOR ROWS COLS THREADS RELOADS
 *
 * As TensorFlow Serving does when a new version of a model arrives: THREADS request threads
 * call the current version without pause; RELOADS times the main thread loads a new session
 * of MODEL_DIR, makes it current, and retires the old one, which is closed and deleted by
 * whichever thread finishes its last call on it (the servable handles' reference count).
 * Every call's output must equal the first call's. It prints the first call's output
 * ("output v0 v1 ..."), the process's telemetry record once the first version is loaded and
 * again once every retired version is gone ("telemetry {...}": what `neuronish ls` reads;
 * NEURONISH_RUN_DIR must be set), and the number of calls made. Exit status 0 on success,
 * 1 with the reason on stderr.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tensorflow/c/c_api.h"

typedef struct {
  TF_Graph *graph;
  TF_Session *session;
  TF_Output in, out;
  int calls_in_flight, retired;
} Version;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static Version *current;
static int stopping, failed;
static long calls;
static const char *model_dir, *input_name, *output_name;
static int64_t rows, cols;
static float *first_output;
static size_t output_count;

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static void die(const char *what, const char *why) {
  fprintf(stderr, "tf_versions: %s: %s\n", what, why);
  exit(1);
}

static TF_Output find(TF_Graph *graph, const char *tensor) {
  char op[256];
  const char *colon = strrchr(tensor, ':');
  size_t len = colon ? (size_t)(colon - tensor) : strlen(tensor);
  if (len >= sizeof op) die(tensor, "name too long");
  memcpy(op, tensor, len);
  op[len] = '\0';
  TF_Output o = {TF_GraphOperationByName(graph, op), colon ? atoi(colon + 1) : 0};
  if (!o.oper) die(tensor, "no such tensor in the graph");
  return o;
}

static Version *load_version(void) {
  TF_Status *status = TF_NewStatus();
  TF_SessionOptions *options = TF_NewSessionOptions();
  Version *v = calloc(1, sizeof *v);
  const char *tags[] = {"serve"};
  v->graph = TF_NewGraph();
  v->session = TF_LoadSessionFromSavedModel(options, NULL, model_dir, tags, 1, v->graph, NULL,
                                            status);
  if (TF_GetCode(status) != TF_OK) die(model_dir, TF_Message(status));
  v->in = find(v->graph, input_name);
  v->out = find(v->graph, output_name);
  TF_DeleteSessionOptions(options);
  TF_DeleteStatus(status);
  return v;
}

static void unload_version(Version *v) {
  TF_Status *status = TF_NewStatus();
  TF_CloseSession(v->session, status);
  TF_DeleteSession(v->session, status);
  if (TF_GetCode(status) != TF_OK) die("closing a retired version", TF_Message(status));
  TF_DeleteGraph(v->graph);
  free(v);
  TF_DeleteStatus(status);
}

/* Retire `v`: the last call on it unloads it (now, if none is in flight). */
static void retire(Version *v) {
  pthread_mutex_lock(&mu);
  v->retired = 1;
  int idle = v->calls_in_flight == 0;
  pthread_mutex_unlock(&mu);
  if (idle) unload_version(v);
}

static TF_Tensor *make_input(void) {
  int64_t dims[2] = {rows, cols};
  TF_Tensor *x = TF_AllocateTensor(TF_FLOAT, dims, 2, (size_t)(rows * cols) * sizeof(float));
  float *p = TF_TensorData(x);
  for (int64_t i = 0; i < rows * cols; ++i) p[i] = (float)(i % 7 - 3) / 4.0f;
  return x;
}

/* One call on `v`; 0 when its output is the first call's. */
static int call_once(Version *v, TF_Tensor *x, TF_Status *status) {
  TF_Tensor *y = NULL;
  TF_SessionRun(v->session, NULL, &v->in, &x, 1, &v->out, &y, 1, NULL, 0, NULL, status);
  if (TF_GetCode(status) != TF_OK) {
    fprintf(stderr, "tf_versions: a call failed: %s\n", TF_Message(status));
    return 1;
  }
  const float *got = TF_TensorData(y);
  size_t n = TF_TensorByteSize(y) / sizeof(float);
  int differs = n != output_count;
  for (size_t k = 0; !differs && k < n; ++k) {
    float want = first_output[k], tolerance = 1e-5f * (1.0f + (want < 0 ? -want : want));
    differs = !(got[k] - want <= tolerance && want - got[k] <= tolerance);
  }
  if (differs) fprintf(stderr, "tf_versions: a call's output differs from the first call's\n");
  TF_DeleteTensor(y);
  return differs;
}

static void *serve_requests(void *unused) {
  (void)unused;
  TF_Status *status = TF_NewStatus();
  TF_Tensor *x = make_input();
  for (;;) {
    pthread_mutex_lock(&mu);
    if (stopping || failed) {
      pthread_mutex_unlock(&mu);
      break;
    }
    Version *v = current;
    ++v->calls_in_flight;
    pthread_mutex_unlock(&mu);
    int bad = call_once(v, x, status);
    pthread_mutex_lock(&mu);
    failed |= bad;
    ++calls;
    int last = --v->calls_in_flight == 0 && v->retired;
    pthread_mutex_unlock(&mu);
    if (last) unload_version(v);
  }
  TF_DeleteTensor(x);
  TF_DeleteStatus(status);
  return NULL;
}

/* Prints the process's telemetry record once it was written after this moment. */
static void print_fresh_telemetry(void) {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  double after = (double)now.tv_sec + now.tv_nsec / 1e9;
  char path[4096], record[1 << 16];
  const char *run_dir = getenv("NEURONISH_RUN_DIR");
  if (!run_dir) die("telemetry", "NEURONISH_RUN_DIR is not set");
  snprintf(path, sizeof path, "%s/%ld.json", run_dir, (long)getpid());
  for (int tries = 0; tries < 100; ++tries) { /* the publisher writes every 0.5 s */
    sleep_ms(100);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(record, 1, sizeof record - 1, f);
    fclose(f);
    record[n] = '\0';
    const char *time_field = strstr(record, "\"time\": ");
    if (time_field && atof(time_field + 8) > after) {
      printf("telemetry %s\n", record);
      return;
    }
  }
  die(path, "no telemetry record written within 10 s");
}

int main(int argc, char **argv) {
  if (argc != 9) {
    fprintf(stderr, "usage: %s OP_LIBRARY MODEL_DIR INPUT_TENSOR OUTPUT_TENSOR ROWS COLS "
            "THREADS RELOADS\n", argv[0]);
    return 2;
  }
  model_dir = argv[2];
  input_name = argv[3];
  output_name = argv[4];
  rows = atoll(argv[5]);
  cols = atoll(argv[6]);
  int threads = atoi(argv[7]), reloads = atoi(argv[8]);
  if (rows < 1 || cols < 1 || threads < 1 || threads > 64 || reloads < 0) {
    fprintf(stderr, "tf_versions: ROWS, COLS >= 1, THREADS in [1, 64], RELOADS >= 0\n");
    return 2;
  }
  TF_Status *status = TF_NewStatus();
  TF_LoadLibrary(argv[1], status);
  if (TF_GetCode(status) != TF_OK) die(argv[1], TF_Message(status));

  current = load_version();
  TF_Tensor *x = make_input(), *y = NULL;
  TF_SessionRun(current->session, NULL, &current->in, &x, 1, &current->out, &y, 1, NULL, 0,
                NULL, status);
  if (TF_GetCode(status) != TF_OK) die("the first call", TF_Message(status));
  output_count = TF_TensorByteSize(y) / sizeof(float);
  first_output = malloc(TF_TensorByteSize(y));
  memcpy(first_output, TF_TensorData(y), TF_TensorByteSize(y));
  printf("output");
  for (size_t k = 0; k < output_count; ++k) printf(" %.9g", first_output[k]);
  printf("\n");
  TF_DeleteTensor(y);
  TF_DeleteTensor(x);
  print_fresh_telemetry();

  pthread_t ids[64];
  for (int t = 0; t < threads; ++t)
    if (pthread_create(&ids[t], NULL, serve_requests, NULL) != 0) die("threads", "cannot start");
  for (int r = 0; r < reloads && !failed; ++r) {
    sleep_ms(100); /* requests keep coming between versions */
    Version *next = load_version();
    pthread_mutex_lock(&mu);
    Version *old = current;
    current = next;
    pthread_mutex_unlock(&mu);
    retire(old);
  }
  sleep_ms(100);
  pthread_mutex_lock(&mu);
  stopping = 1;
  pthread_mutex_unlock(&mu);
  for (int t = 0; t < threads; ++t) pthread_join(ids[t], NULL);
  if (failed) return 1;
  print_fresh_telemetry(); /* every retired version is unloaded by now */
  printf("calls %ld\n", calls);
  unload_version(current);
  free(first_output);
  TF_DeleteStatus(status);
  return 0;
}
