/* Concurrent nr_execute calls (tests/runtime/test_capi_threads.py, under ThreadSanitizer):
 * six threads, twenty calls each, on one model loaded with two duplicates, at batches 1
 * to 5 (split, padded, assembled); each call's result is checked against the first
 * thread's result for the same input, computed alone before the threads start.
 * Usage: nr_execute_threads MODEL.neff (a float32 model with one input and one output,
 * both batched on axis 0). Prints "ok". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "neuronish_runtime.h"

static nr_model *model;
static int failures;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static float *reference[6];  /* by batch (1..5) */  /* the output for batch b + 1 and input pattern 0, alone */

static void fill(float *x, size_t n) {
  for (size_t k = 0; k < n; ++k) x[k] = (float)((k * 7) % 13) - 6.0f;
}

static void *worker(void *arg) {
  long id = (long)arg;
  nr_tensor_info in, out;
  const nr_executable *exe = nr_model_executable(model);
  nr_executable_tensor(exe, NR_INPUT, 0, &in);
  nr_executable_tensor(exe, NR_OUTPUT, 0, &out);
  for (int call = 0; call < 20; ++call) {
    int64_t batch = 1 + (id + call) % 5;
    int64_t ishape[8], oshape[8];
    size_t ib = 4, ob = 4;
    for (size_t d = 0; d < in.rank; ++d) { ishape[d] = d == 0 ? batch : in.shape[d]; ib *= (size_t)ishape[d]; }
    for (size_t d = 0; d < out.rank; ++d) { oshape[d] = d == 0 ? batch : out.shape[d]; ob *= (size_t)oshape[d]; }
    float *x = malloc(ib), *y = malloc(ob);
    fill(x, ib / 4);
    nr_tensor ti = {NULL, in.dtype, in.rank, ishape, x, ib}, to = {NULL, out.dtype, out.rank, oshape, y, ob};
    char err[1024];
    nr_status s = nr_execute(model, &ti, 1, &to, 1, err, sizeof err);
    int wrong = s == NR_OK && reference[batch] && memcmp(y, reference[batch], ob) != 0;
    if (s != NR_OK || wrong) {
      pthread_mutex_lock(&mu);
      failures++;
      fprintf(stderr, "%s\n", wrong ? "a concurrent call gave another result than the same call alone" : err);
      pthread_mutex_unlock(&mu);
    }
    free(x); free(y);
  }
  return NULL;
}

int main(int argc, char **argv) {
  char err[1024];
  nr_device *dev;
  if (nr_device_open(&dev, err, sizeof err) != NR_OK) { fprintf(stderr, "%s\n", err); return 1; }
  if (nr_model_load_file(dev, argv[1], 2, &model, err, sizeof err) != NR_OK) { fprintf(stderr, "%s\n", err); return 1; }
  {  /* the references, one call at a time */
    nr_tensor_info in, out;
    const nr_executable *exe = nr_model_executable(model);
    nr_executable_tensor(exe, NR_INPUT, 0, &in);
    nr_executable_tensor(exe, NR_OUTPUT, 0, &out);
    for (int64_t batch = 1; batch <= 5; ++batch) {
      int64_t ishape[8], oshape[8];
      size_t ib = 4, ob = 4;
      for (size_t d = 0; d < in.rank; ++d) { ishape[d] = d == 0 ? batch : in.shape[d]; ib *= (size_t)ishape[d]; }
      for (size_t d = 0; d < out.rank; ++d) { oshape[d] = d == 0 ? batch : out.shape[d]; ob *= (size_t)oshape[d]; }
      float *x = malloc(ib);
      reference[batch] = malloc(ob);
      fill(x, ib / 4);
      nr_tensor ti = {NULL, in.dtype, in.rank, ishape, x, ib}, to = {NULL, out.dtype, out.rank, oshape, reference[batch], ob};
      if (nr_execute(model, &ti, 1, &to, 1, err, sizeof err) != NR_OK) { fprintf(stderr, "%s\n", err); return 1; }
      free(x);
    }
  }
  pthread_t t[6];
  for (long i = 0; i < 6; ++i) pthread_create(&t[i], NULL, worker, (void *)i);
  for (int i = 0; i < 6; ++i) pthread_join(t[i], NULL);
  nr_model_unload(model);
  nr_device_close(dev);
  for (int b = 1; b <= 5; ++b) free(reference[b]);
  if (failures) return 1;
  printf("ok\n");
  return 0;
}
