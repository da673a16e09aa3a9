/* A label changed while calls run (tests/runtime/test_capi_relabel.py, under
 * ThreadSanitizer): a model with two copies, labelled and called once, then four threads
 * call it while the main thread labels it again and again, and a profile records all
 * along (started before the load, so every call is timed). The last label must name the
 * model in the spans of a call made after it and in the published telemetry.
 * Usage: nr_relabel_threads MODEL.neff (float32, one input and one output, batched on
 * axis 0). Prints the spans JSON, then "published" once telemetry had time to be
 * written; exits when a line arrives on stdin (the test has read the file). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "neuronish_runtime.h"

static nr_model *model;
static nr_tensor_info in, out;
static int failures;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void call(void) {
  int64_t ishape[8], oshape[8];
  size_t ib = 4, ob = 4;
  for (size_t d = 0; d < in.rank; ++d) { ishape[d] = in.shape[d]; ib *= (size_t)ishape[d]; }
  for (size_t d = 0; d < out.rank; ++d) { oshape[d] = out.shape[d]; ob *= (size_t)oshape[d]; }
  float *x = calloc(1, ib), *y = malloc(ob);
  nr_tensor ti = {NULL, in.dtype, in.rank, ishape, x, ib}, to = {NULL, out.dtype, out.rank, oshape, y, ob};
  char err[1024];
  if (nr_execute(model, &ti, 1, &to, 1, err, sizeof err) != NR_OK) {
    pthread_mutex_lock(&mu);
    failures++;
    fprintf(stderr, "call: %s\n", err);
    pthread_mutex_unlock(&mu);
  }
  free(x);
  free(y);
}

static void *caller(void *arg) {
  (void)arg;
  for (int k = 0; k < 100; ++k) call();
  return NULL;
}

int main(int argc, char **argv) {
  char err[1024];
  nr_device *dev;
  if (argc != 2) { fprintf(stderr, "usage: nr_relabel_threads MODEL.neff\n"); return 2; }
  if (nr_profile_start(err, sizeof err) != NR_OK) { fprintf(stderr, "profile: %s\n", err); return 1; }
  if (nr_device_open(&dev, err, sizeof err) != NR_OK) { fprintf(stderr, "%s\n", err); return 1; }
  if (nr_model_load_file(dev, argv[1], 2, &model, err, sizeof err) != NR_OK) { fprintf(stderr, "%s\n", err); return 1; }
  const nr_executable *exe = nr_model_executable(model);
  nr_executable_tensor(exe, NR_INPUT, 0, &in);
  nr_executable_tensor(exe, NR_OUTPUT, 0, &out);
  nr_model_set_label(model, "warm-up");
  call();  /* the first call: labels after it used to be unsafe */
  pthread_t threads[4];
  for (long t = 0; t < 4; ++t) pthread_create(&threads[t], NULL, caller, (void *)t);
  for (int k = 0; k < 200; ++k) {
    char label[64];
    snprintf(label, sizeof label, "relabel %d", k);
    if (nr_model_set_label(model, label) != NR_OK) failures++;
  }
  for (int t = 0; t < 4; ++t) pthread_join(threads[t], NULL);
  nr_model_set_label(model, "served:1 dense");
  call();
  char *spans = NULL;
  size_t size = 0;
  if (nr_profile_stop(&spans, &size, err, sizeof err) != NR_OK) { fprintf(stderr, "stop: %s\n", err); return 1; }
  printf("%s\n", spans);
  nr_profile_free(spans);
  if (failures) { fprintf(stderr, "%d failure(s)\n", failures); return 1; }
  sleep(1);  /* telemetry is published every 0.5 s */
  printf("published\n");
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) fprintf(stderr, "no go-ahead\n");
  nr_model_unload(model);
  nr_device_close(dev);
  return 0;
}
