/* A profile started and stopped again and again while calls run
 * (tests/runtime/test_capi_profile_toggle.py, under ThreadSanitizer): each model is loaded
 * with its duplicates, four threads call every model in turn, and the main thread starts a
 * recording, lets calls run into it, and takes its spans, 200 times; the callers go on
 * until it is done. Each
 * call decides once whether it is timed; the stage that runs it arms or disarms the
 * engine's timing when the call's wish differs from the last one's. A last recording
 * around one call of each model shows that timing still works after all the flips.
 * Usage: nr_profile_toggle_threads MODEL.neff DUPLICATES [MODEL.neff DUPLICATES]...
 * (each model float32, one input and one output). Prints one JSON line:
 * {"toggles": N, "executes": timed chunks seen while toggling, "last": the spans of the
 * last recording}. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "neuronish_runtime.h"

#define MAX_MODELS 4
#define CALLERS 4
#define CALLS 20   /* per caller at least, and on until the toggling is done */
#define TOGGLES 200

typedef struct {
  nr_model *model;
  nr_tensor_info in, out;
} Loaded;

static Loaded models[MAX_MODELS];
static int num_models;
static atomic_int failures, toggling_done;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void call(const Loaded *m) {
  int64_t ishape[8], oshape[8];
  size_t ib = 4, ob = 4;
  for (size_t d = 0; d < m->in.rank; ++d) { ishape[d] = m->in.shape[d]; ib *= (size_t)ishape[d]; }
  for (size_t d = 0; d < m->out.rank; ++d) { oshape[d] = m->out.shape[d]; ob *= (size_t)oshape[d]; }
  float *x = calloc(1, ib), *y = malloc(ob);
  nr_tensor ti = {NULL, m->in.dtype, m->in.rank, ishape, x, ib};
  nr_tensor to = {NULL, m->out.dtype, m->out.rank, oshape, y, ob};
  char err[1024];
  if (nr_execute(m->model, &ti, 1, &to, 1, err, sizeof err) != NR_OK) {
    pthread_mutex_lock(&mu);
    fprintf(stderr, "call: %s\n", err);
    pthread_mutex_unlock(&mu);
    atomic_fetch_add(&failures, 1);
  }
  free(x);
  free(y);
}

static void *caller(void *arg) {
  long t = (long)arg;
  for (int k = 0; k < CALLS || !atomic_load(&toggling_done); ++k) call(&models[(t + k) % num_models]);
  return NULL;
}

/* How many times `needle` occurs in `text`. */
static long count(const char *text, const char *needle) {
  long n = 0;
  for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle)) ++n;
  return n;
}

int main(int argc, char **argv) {
  char err[1024];
  nr_device *dev;
  if (argc < 3 || argc % 2 == 0 || argc > 1 + 2 * MAX_MODELS) {
    fprintf(stderr, "usage: nr_profile_toggle_threads MODEL.neff DUPLICATES [MODEL.neff DUPLICATES]...\n");
    return 2;
  }
  if (nr_device_open(&dev, err, sizeof err) != NR_OK) { fprintf(stderr, "%s\n", err); return 1; }
  for (int a = 1; a < argc; a += 2, ++num_models) {
    Loaded *m = &models[num_models];
    if (nr_model_load_file(dev, argv[a], (uint32_t)atoi(argv[a + 1]), &m->model, err, sizeof err) != NR_OK) {
      fprintf(stderr, "%s: %s\n", argv[a], err);
      return 1;
    }
    const nr_executable *exe = nr_model_executable(m->model);
    nr_executable_tensor(exe, NR_INPUT, 0, &m->in);
    nr_executable_tensor(exe, NR_OUTPUT, 0, &m->out);
    call(m); /* untimed: every stage's timing starts disarmed */
  }
  pthread_t threads[CALLERS];
  for (long t = 0; t < CALLERS; ++t) pthread_create(&threads[t], NULL, caller, (void *)t);
  long toggles = 0, executes = 0;
  while (toggles < TOGGLES) {
    if (nr_profile_start(err, sizeof err) != NR_OK) { fprintf(stderr, "start: %s\n", err); return 1; }
    for (int k = 0; k < 1 + (int)(toggles % 3); ++k) sched_yield(); /* recordings of a few lengths */
    char *spans = NULL;
    size_t size = 0;
    if (nr_profile_stop(&spans, &size, err, sizeof err) != NR_OK) { fprintf(stderr, "stop: %s\n", err); return 1; }
    executes += count(spans, "\"cat\": \"execute\"");
    nr_profile_free(spans);
    ++toggles;
  }
  atomic_store(&toggling_done, 1);
  for (int t = 0; t < CALLERS; ++t) pthread_join(threads[t], NULL);
  if (nr_profile_start(err, sizeof err) != NR_OK) { fprintf(stderr, "start: %s\n", err); return 1; }
  for (int i = 0; i < num_models; ++i) call(&models[i]);
  char *last = NULL;
  size_t size = 0;
  if (nr_profile_stop(&last, &size, err, sizeof err) != NR_OK) { fprintf(stderr, "stop: %s\n", err); return 1; }
  printf("{\"toggles\": %ld, \"executes\": %ld, \"last\": %s}\n", toggles, executes, last);
  nr_profile_free(last);
  for (int i = 0; i < num_models; ++i) nr_model_unload(models[i].model);
  nr_device_close(dev);
  if (atomic_load(&failures)) { fprintf(stderr, "%d failure(s)\n", atomic_load(&failures)); return 1; }
  return 0;
}
