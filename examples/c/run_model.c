/* Run a compiled neuronish executable from plain C (C99, only neuronish_runtime.h).
 *
 *   run_model [-w] MODEL.neff [BATCH [INPUTS.bin]]
 *
 * Loads the executable onto a device configured from the NEURONISH_* environment, runs it
 * once at BATCH (default: the compiled batch) on zeros, or on the bytes of INPUTS.bin
 * (every input in signature order, each C-contiguous in its dtype, one after another),
 * and prints one line per output: its name, dtype, shape and a checksum (the sum of its
 * elements as doubles for float32, else of its bytes). With -w it then keeps the model
 * loaded until its standard input ends (meanwhile `neuronish ls` shows it). Exit status 0
 * on success, 1 with the runtime's message on stderr otherwise.
 *
 * Profiles and device counters come with the library: NEURONISH_PROFILE=DIR writes
 * DIR/neuronish-<pid>.json at exit (`neuronish profile --read` prints it), and while the
 * model is loaded `neuronish ls/top` list this process (neuronish_runtime.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neuronish_runtime.h"

static int fail(const char *what, nr_status status, const char *message) {
  fprintf(stderr, "run_model: %s: %s (%s)\n", what, message, nr_status_name(status));
  return 1;
}

static size_t item_size(nr_dtype d) {
  switch (d) {
    case NR_BOOL: case NR_INT8: case NR_UINT8: return 1;
    case NR_INT16: case NR_FLOAT16: case NR_BFLOAT16: return 2;
    case NR_INT32: case NR_FLOAT32: return 4;
    default: return 8;
  }
}

/* One tensor of the call: the signature's dtype and shape, `batch` on its batch axis. */
static int make_tensor(const nr_tensor_info *info, int64_t batch, nr_tensor *t, int64_t *dims) {
  size_t bytes = item_size(info->dtype);
  for (size_t i = 0; i < info->rank; ++i) {
    dims[i] = ((int64_t)i == info->batch_axis && batch >= 0) ? batch : info->shape[i];
    bytes *= (size_t)dims[i];
  }
  t->name = info->name;
  t->dtype = info->dtype;
  t->rank = info->rank;
  t->shape = dims;
  t->bytes = bytes;
  t->data = calloc(bytes ? bytes : 1, 1);
  return t->data != NULL;
}

int main(int argc, char **argv) {
  int hold = argc > 1 && strcmp(argv[1], "-w") == 0;
  if (hold) {
    argv[1] = argv[0];
    ++argv;
    --argc;
  }
  if (argc < 2 || argc > 4) {
    fprintf(stderr, "usage: %s [-w] MODEL.neff [BATCH [INPUTS.bin]]\n", argv[0]);
    return 2;
  }
  char error[4096];
  nr_device *dev = NULL;
  nr_model *model = NULL;
  nr_status s = nr_device_open(&dev, error, sizeof error);
  if (s != NR_OK) return fail("opening the device", s, error);
  s = nr_model_load_file(dev, argv[1], 1, &model, error, sizeof error);
  if (s != NR_OK) return fail(argv[1], s, error);
  const nr_executable *exe = nr_model_executable(model);
  int64_t batch = argc > 2 ? strtoll(argv[2], NULL, 10) : nr_model_batch_size(model);
  if (nr_model_batch_size(model) < 0) batch = -1; /* compiled shapes only */

  size_t n_in = nr_executable_num_tensors(exe, NR_INPUT);
  size_t n_out = nr_executable_num_tensors(exe, NR_OUTPUT);
  nr_tensor *ins = calloc(n_in + 1, sizeof *ins), *outs = calloc(n_out + 1, sizeof *outs);
  int64_t (*dims)[32] = calloc(n_in + n_out + 1, sizeof *dims);
  if (!ins || !outs || !dims) return fail("allocating", NR_OUT_OF_MEMORY, "out of memory");
  FILE *feed = argc > 3 ? fopen(argv[3], "rb") : NULL;
  if (argc > 3 && !feed) return fail(argv[3], NR_IO_ERROR, "cannot open");
  nr_tensor_info info;
  for (size_t i = 0; i < n_in; ++i) {
    nr_executable_tensor(exe, NR_INPUT, i, &info);
    if (!make_tensor(&info, batch, &ins[i], dims[i])) return fail("allocating", NR_OUT_OF_MEMORY, info.name);
    if (feed && fread(ins[i].data, 1, ins[i].bytes, feed) != ins[i].bytes)
      return fail(argv[3], NR_IO_ERROR, "too short for the inputs");
  }
  if (feed) fclose(feed);
  for (size_t i = 0; i < n_out; ++i) {
    nr_executable_tensor(exe, NR_OUTPUT, i, &info);
    if (!make_tensor(&info, batch, &outs[i], dims[n_in + i])) return fail("allocating", NR_OUT_OF_MEMORY, info.name);
  }
  s = nr_execute(model, ins, n_in, outs, n_out, error, sizeof error);
  if (s != NR_OK) return fail("executing", s, error);
  for (size_t i = 0; i < n_out; ++i) {
    double sum = 0;
    if (outs[i].dtype == NR_FLOAT32) {
      const float *v = outs[i].data;
      for (size_t k = 0; k < outs[i].bytes / 4; ++k) sum += v[k];
    } else {
      const unsigned char *v = outs[i].data;
      for (size_t k = 0; k < outs[i].bytes; ++k) sum += v[k];
    }
    printf("%s %s [", outs[i].name, nr_dtype_name(outs[i].dtype));
    for (size_t d = 0; d < outs[i].rank; ++d) printf(d ? ",%lld" : "%lld", (long long)outs[i].shape[d]);
    printf("] %.9g\n", sum);
  }
  if (hold) {
    fflush(stdout);
    while (getchar() != EOF) continue;
  }
  for (size_t i = 0; i < n_in; ++i) free(ins[i].data);
  for (size_t i = 0; i < n_out; ++i) free(outs[i].data);
  free(ins);
  free(outs);
  free(dims);
  nr_model_unload(model);
  nr_device_close(dev);
  return 0;
}
