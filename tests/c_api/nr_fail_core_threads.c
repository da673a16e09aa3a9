/* Cores failing while calls and loads are in flight (tests/runtime/test_capi_fail_core.py,
 * under ThreadSanitizer): a model with two duplicates, six threads calling it at batches
 * 1 to 5, one thread loading and unloading another copy of it, while the main thread
 * fails a core under one duplicate and then one under the other. Every call gives the
 * result the same call gives alone, until the last failure; once that has returned every
 * call fails with NR_DEVICE_ERROR naming both cores; loads either succeed or are refused
 * with NR_DEVICE_ERROR; no call hangs; every byte of device memory is given back.
 * Usage: nr_fail_core_threads MODEL.neff CORE1 CORE2 (a float32 model with one input and
 * one output, both batched on axis 0; CORE1 and CORE2 under different duplicates).
 * Prints "ok". */
#define _POSIX_C_SOURCE 199309L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "neuronish_runtime.h"

#define WORKERS 6

static nr_device *dev;
static nr_model *model;
static const char *path;
static float *reference[6]; /* the output of the call at batch b (1..5), alone */
static atomic_int failing_last; /* the second core is being failed: calls may be refused */
static atomic_int failed_last;  /* ... it has been: calls must be refused */
static atomic_int stop;
static atomic_int calls[WORKERS];
static atomic_int failures;
static char second_message[256];

static void fill(float *x, size_t n) {
  for (size_t k = 0; k < n; ++k) x[k] = (float)((k * 7) % 13) - 6.0f;
}

static void problem(const char *what, const char *detail) {
  fprintf(stderr, "%s: %s\n", what, detail);
  atomic_fetch_add(&failures, 1);
}

/* One call at `batch`; its output into `y` (allocated here, of *bytes). */
static nr_status call(int64_t batch, float **y, size_t *bytes, char *err, size_t err_size) {
  nr_tensor_info in, out;
  const nr_executable *exe = nr_model_executable(model);
  nr_executable_tensor(exe, NR_INPUT, 0, &in);
  nr_executable_tensor(exe, NR_OUTPUT, 0, &out);
  int64_t ishape[8], oshape[8];
  size_t ib = 4, ob = 4;
  for (size_t d = 0; d < in.rank; ++d) { ishape[d] = d == 0 ? batch : in.shape[d]; ib *= (size_t)ishape[d]; }
  for (size_t d = 0; d < out.rank; ++d) { oshape[d] = d == 0 ? batch : out.shape[d]; ob *= (size_t)oshape[d]; }
  float *x = malloc(ib);
  *y = malloc(ob);
  *bytes = ob;
  fill(x, ib / 4);
  nr_tensor ti = {NULL, in.dtype, in.rank, ishape, x, ib}, to = {NULL, out.dtype, out.rank, oshape, *y, ob};
  nr_status s = nr_execute(model, &ti, 1, &to, 1, err, err_size);
  free(x);
  return s;
}

static void *worker(void *arg) {
  long id = (long)arg;
  for (int k = 0; !atomic_load(&stop); ++k) {
    int64_t batch = 1 + (id + k) % 5;
    int must_fail = atomic_load(&failed_last);
    char err[1024] = "";
    float *y;
    size_t bytes;
    nr_status s = call(batch, &y, &bytes, err, sizeof err);
    int may_fail = atomic_load(&failing_last);
    if (s == NR_OK) {
      if (must_fail) problem("a call started after the last core failed ran", "");
      else if (memcmp(y, reference[batch], bytes) != 0) problem("a call gave another result than alone", "");
    } else if (s != NR_DEVICE_ERROR || !may_fail) {
      problem("a call failed while a copy was left", err);
    } else if (!strstr(err, "core ") || !strstr(err, second_message) || !strstr(err, "failed (first)")) {
      problem("the refusal does not name both cores", err);
    }
    free(y);
    atomic_fetch_add(&calls[id], 1);
  }
  return NULL;
}

static void *loader(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    nr_model *other;
    char err[1024];
    nr_status s = nr_model_load_file(dev, path, 1, &other, err, sizeof err);
    if (s == NR_OK) nr_model_unload(other);
    else if (s != NR_DEVICE_ERROR) problem("a load failed otherwise than for want of cores", err);
  }
  return NULL;
}

/* Until every worker has made `n` more calls. */
static void served(int n) {
  int want[WORKERS];
  for (int i = 0; i < WORKERS; ++i) want[i] = atomic_load(&calls[i]) + n;
  for (int i = 0; i < WORKERS; ++i)
    while (atomic_load(&calls[i]) < want[i]) nanosleep(&(struct timespec){0, 1000000}, NULL);
}

static int core_failed(int core) {
  nr_core_state state = NR_CORE_WORKING;
  char why[256];
  if (nr_device_core_state(dev, core, &state, why, sizeof why) != NR_OK) {
    problem("nr_device_core_state", why);
    return -1;
  }
  return state == NR_CORE_FAILED;
}

int main(int argc, char **argv) {
  char err[1024];
  if (argc != 4) return 2;
  path = argv[1];
  int first = atoi(argv[2]), second = atoi(argv[3]);
  snprintf(second_message, sizeof second_message, "core %d failed (second)", second);
  if (nr_device_open(&dev, err, sizeof err) != NR_OK) { fprintf(stderr, "%s\n", err); return 1; }
  if (nr_model_load_file(dev, path, 2, &model, err, sizeof err) != NR_OK) { fprintf(stderr, "%s\n", err); return 1; }
  for (int64_t batch = 1; batch <= 5; ++batch) {
    size_t bytes;
    if (call(batch, &reference[batch], &bytes, err, sizeof err) != NR_OK) { fprintf(stderr, "%s\n", err); return 1; }
  }
  pthread_t t[WORKERS], load_thread;
  for (long i = 0; i < WORKERS; ++i) pthread_create(&t[i], NULL, worker, (void *)i);
  pthread_create(&load_thread, NULL, loader, NULL);
  served(3);
  if (nr_device_fail_core(dev, first, "first", err, sizeof err) != NR_OK) problem("nr_device_fail_core", err);
  if (core_failed(first) != 1 || core_failed(second) != 0) problem("core states", "wrong after the first failure");
  served(3);
  atomic_store(&failing_last, 1);
  if (nr_device_fail_core(dev, second, "second", err, sizeof err) != NR_OK) problem("nr_device_fail_core", err);
  atomic_store(&failed_last, 1);
  served(2);
  atomic_store(&stop, 1);
  for (int i = 0; i < WORKERS; ++i) pthread_join(t[i], NULL);
  pthread_join(load_thread, NULL);
  nr_model_unload(model);
  for (size_t k = 0; k < nr_device_num_cores(dev); ++k) {
    nr_core_info info;
    nr_device_core(dev, k, &info);
    if (info.used) problem("device memory left after every model unloaded", "");
  }
  nr_device_close(dev);
  for (int b = 1; b <= 5; ++b) free(reference[b]);
  if (atomic_load(&failures)) return 1;
  printf("ok\n");
  return 0;
}
