/* A client written from neuronish_runtime.h and docs/c-api.md alone, calling the C API the
 * ways a stranger might: NULL wherever a pointer is taken, indices and counts out of range,
 * damaged and odd files, shapes whose byte counts overflow, batches 0, 1, odd and larger
 * than compiled, deltas that overflow, labels that are not UTF-8, many threads at once.
 * Every call must return a status the header lists, with a message that names what is
 * wrong, and never crash. tests/runtime/test_capi_client.py builds and runs it (also under
 * AddressSanitizer and UBSan).
 *
 * Usage: nr_client CASE DIR, CASE one of load, inspect, device, execute, threads, label,
 * config (open a device from the environment and print what it has).
 * DIR holds dense3.neff (x:0 float32[3,16] -> Identity:0 float32[3,8], batch axis 0) and
 * two.neff (a:0, b:0 float32[2,4] -> relu(a)+b, a*2, batch axis 0). Prints "ok" (and, for
 * execute, the outputs of one call at batch 5), or one line per failed check; exit 1 then. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "neuronish_runtime.h"

static int failures;
static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;
static char dir[512];

#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      pthread_mutex_lock(&report_mu);                         \
      ++failures;                                             \
      printf("FAIL line %d: ", __LINE__);                     \
      printf(__VA_ARGS__);                                    \
      printf("\n");                                           \
      pthread_mutex_unlock(&report_mu);                       \
    }                                                         \
  } while (0)

static int says(const char *message, const char *want) { return !want || strstr(message, want); }

/* A status and a message containing `want` (NULL: any message). */
#define EXPECT(call, status, want)                                                      \
  do {                                                                                  \
    char err_[1024] = "";                                                               \
    nr_status got_ = call(err_, sizeof err_);                                           \
    CHECK(got_ == (status) && says(err_, want), "%s: got %d (%s) '%s'; expected %d with '%s'", \
          #call, (int)got_, nr_status_name(got_), err_, (int)(status), want ? want : "");        \
  } while (0)

static char *path_of(const char *name) {
  static char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return path;
}

static unsigned char *slurp(const char *name, size_t *size) {
  FILE *f = fopen(path_of(name), "rb");
  if (!f) { printf("cannot open %s\n", path_of(name)); exit(2); }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *data = malloc((size_t)n);
  *size = fread(data, 1, (size_t)n, f);
  fclose(f);
  return data;
}

static void spill(const char *name, const void *data, size_t size) {
  FILE *f = fopen(path_of(name), "wb");
  fwrite(data, 1, size, f);
  fclose(f);
}

/* ---- load ------------------------------------------------------------------------- */

static void case_load(void) {
  size_t size;
  unsigned char *good = slurp("dense3.neff", &size);
  unsigned char *bytes = malloc(size + 16);
  nr_executable *exe;
  char err[1024];
#define LOAD_BYTES(data, n, status, want)                                               \
  do {                                                                                  \
    exe = (nr_executable *)&exe; /* not NULL: a failed load must set it NULL */         \
    nr_status s_ = nr_executable_load_bytes(data, n, &exe, err, sizeof err);            \
    CHECK(s_ == (status) && !exe && strstr(err, want), "load_bytes(%s, %zu): %d '%s'; " \
          "expected %d with '%s'", #data, (size_t)(n), (int)s_, err, (int)(status), want); \
  } while (0)
#define LOAD_FILE(path, status, want)                                                  \
  do {                                                                                 \
    exe = (nr_executable *)&exe;                                                       \
    nr_status s_ = nr_executable_load_file(path, &exe, err, sizeof err);               \
    CHECK(s_ == (status) && !exe && strstr(err, want), "load_file(%s): %d '%s'; "      \
          "expected %d with '%s'", #path, (int)s_, err, (int)(status), want);          \
  } while (0)
  LOAD_BYTES(NULL, 0, NR_INVALID_EXECUTABLE, "truncated");
  LOAD_BYTES(NULL, 100, NR_INVALID_ARGUMENT, "data is NULL");
  LOAD_BYTES(good, 0, NR_INVALID_EXECUTABLE, "truncated");
  for (size_t cut = 1; cut < size; cut += 37) LOAD_BYTES(good, cut, NR_INVALID_EXECUTABLE, "truncated");
  memcpy(bytes, good, size);
  memset(bytes + size, 0, 16);
  LOAD_BYTES(bytes, size + 16, NR_INVALID_EXECUTABLE, "padded");
  for (int huge = 0; huge < 3; ++huge) {  /* a body length the buffer cannot hold */
    uint64_t length = huge == 0 ? UINT64_MAX : huge == 1 ? (uint64_t)1 << 40 : (uint64_t)INT64_MAX + 1;
    memcpy(bytes + 16, &length, 8);
    LOAD_BYTES(bytes, size, NR_INVALID_EXECUTABLE, "header.length");
    spill("huge.neff", bytes, size);
    LOAD_FILE(path_of("huge.neff"), NR_INVALID_EXECUTABLE, "header.length");
  }
  memcpy(bytes, good, size);
  bytes[0] ^= 1;
  LOAD_BYTES(bytes, size, NR_INVALID_EXECUTABLE, "header.magic");
  memcpy(bytes, good, size);
  bytes[8] = 2;
  LOAD_BYTES(bytes, size, NR_UNSUPPORTED, "newer");
  bytes[8] = 0;
  LOAD_BYTES(bytes, size, NR_INVALID_EXECUTABLE, "header.version");
  memcpy(bytes, good, size);
  bytes[12] = 1;
  LOAD_BYTES(bytes, size, NR_INVALID_EXECUTABLE, "header.reserved");
  memcpy(bytes, good, size);
  bytes[size - 5] ^= 0x40;
  LOAD_BYTES(bytes, size, NR_INVALID_EXECUTABLE, "header.sha256");
  /* the caller may free or reuse its bytes at once: the executable keeps a copy */
  memcpy(bytes, good, size);
  CHECK(nr_executable_load_bytes(bytes, size, &exe, err, sizeof err) == NR_OK, "load_bytes: %s", err);
  memset(bytes, 0xAB, size);
  nr_tensor_info info;
  CHECK(nr_executable_tensor(exe, NR_INPUT, 0, &info) == NR_OK && !strcmp(info.name, "x:0"),
        "the signature after the caller's bytes were overwritten");
  nr_executable_unload(exe);
  CHECK(nr_executable_load_bytes(good, size, NULL, err, sizeof err) == NR_INVALID_ARGUMENT &&
        strstr(err, "out is NULL"), "load_bytes(out NULL): %s", err);

  LOAD_FILE(NULL, NR_INVALID_ARGUMENT, "path is NULL");
  LOAD_FILE(dir, NR_IO_ERROR, "not a regular file");
  LOAD_FILE(path_of("missing.neff"), NR_IO_ERROR, "No such file");
  LOAD_FILE("", NR_IO_ERROR, "cannot open");
  LOAD_FILE("/dev/null", NR_IO_ERROR, "not a regular file");
  unlink(path_of("fifo"));
  if (mkfifo(path_of("fifo"), 0600) == 0) {  /* refused without waiting for a writer */
    LOAD_FILE(path_of("fifo"), NR_IO_ERROR, "not a regular file");
    unlink(path_of("fifo"));
  }
  spill("empty.neff", good, 0);
  LOAD_FILE(path_of("empty.neff"), NR_INVALID_EXECUTABLE, "truncated");
  spill("short.neff", good, 40);
  LOAD_FILE(path_of("short.neff"), NR_INVALID_EXECUTABLE, "truncated");
  spill("half.neff", good, size / 2);
  LOAD_FILE(path_of("half.neff"), NR_INVALID_EXECUTABLE, "header.length");
  exe = NULL;
  CHECK(nr_executable_load_file(path_of("dense3.neff"), NULL, err, sizeof err) == NR_INVALID_ARGUMENT,
        "load_file(out NULL)");
  /* the error buffer: NULL, size 0 and size 1 are allowed; never written past error_size */
  char small[4] = "zzz";
  CHECK(nr_executable_load_bytes(good, 5, &exe, NULL, 100) == NR_INVALID_EXECUTABLE, "error NULL");
  CHECK(nr_executable_load_bytes(good, 5, &exe, small, 0) == NR_INVALID_EXECUTABLE && small[0] == 'z',
        "error_size 0 was written");
  CHECK(nr_executable_load_bytes(good, 5, &exe, small, 1) == NR_INVALID_EXECUTABLE && small[0] == 0 &&
        small[1] == 'z', "error_size 1 wrote more than the NUL");
  memcpy(small, "zzz", 4);
  CHECK(nr_executable_load_bytes(good, 5, &exe, small, 3) == NR_INVALID_EXECUTABLE && small[2] == 0 &&
        small[3] == 0, "error_size 3 not NUL-terminated within the buffer");
  nr_executable_unload(NULL);
  free(bytes);
  free(good);
}

/* ---- inspect ---------------------------------------------------------------------- */

static void case_inspect(void) {
  char err[1024];
  nr_executable *exe;
  CHECK(nr_executable_load_file(path_of("two.neff"), &exe, err, sizeof err) == NR_OK, "load: %s", err);
  CHECK(nr_executable_num_tensors(exe, NR_INPUT) == 2 && nr_executable_num_tensors(exe, NR_OUTPUT) == 2,
        "two inputs, two outputs");
  CHECK(nr_executable_num_tensors(exe, (nr_io)7) == 0 && nr_executable_num_tensors(NULL, NR_INPUT) == 0,
        "num_tensors of a bad `which` or NULL");
  nr_tensor_info info;
  CHECK(nr_executable_tensor(exe, NR_INPUT, 1, &info) == NR_OK && !strcmp(info.name, "b:0") &&
        info.dtype == NR_FLOAT32 && !strcmp(info.dtype_name, "float32") && info.rank == 2 &&
        info.shape[0] == 2 && info.shape[1] == 4 && info.batch_axis == 0, "input 1's signature");
  CHECK(nr_executable_tensor(exe, NR_INPUT, 2, &info) == NR_INVALID_ARGUMENT, "input 2");
  CHECK(nr_executable_tensor(exe, NR_OUTPUT, SIZE_MAX, &info) == NR_INVALID_ARGUMENT, "output SIZE_MAX");
  CHECK(nr_executable_tensor(exe, (nr_io)7, 0, &info) == NR_INVALID_ARGUMENT, "which 7");
  CHECK(nr_executable_tensor(exe, (nr_io)-1, 0, &info) == NR_INVALID_ARGUMENT, "which -1");
  CHECK(nr_executable_tensor(exe, NR_INPUT, 0, NULL) == NR_INVALID_ARGUMENT, "info NULL");
  CHECK(nr_executable_tensor(NULL, NR_INPUT, 0, &info) == NR_INVALID_ARGUMENT, "exe NULL");
  size_t cores = nr_executable_num_cores(exe);
  CHECK(cores == 1 && nr_executable_version(exe) == 1, "one core, format 1");
  CHECK(nr_executable_num_instructions(exe, 0) == 3 && nr_executable_num_instructions(exe, cores) == 0,
        "instructions per core");
  CHECK(nr_executable_instruction_kind(exe, 0, 0) && !nr_executable_instruction_kind(exe, 0, 3) &&
        !nr_executable_instruction_kind(exe, 1, 0) && !nr_executable_instruction_kind(NULL, 0, 0),
        "instruction kinds out of range are NULL");
  CHECK(!strcmp(nr_executable_compiler_name(exe), "neuronish-cc"), "compiler name");
  CHECK(nr_executable_compiler_name(NULL) && nr_executable_compiler_version(NULL), "\"\" for NULL");
  CHECK(!nr_executable_version(NULL) && !nr_executable_num_cores(NULL) &&
        !nr_executable_num_instructions(NULL, 0) && !nr_executable_arena_bytes(NULL) &&
        !nr_executable_num_constants(NULL) && !nr_executable_constant_bytes(NULL), "0 for NULL");
  CHECK(!nr_dtype_name((nr_dtype)10) && !nr_dtype_name((nr_dtype)-1) &&
        !strcmp(nr_dtype_name(NR_BFLOAT16), "bfloat16"), "dtype names");
  for (int s = NR_OK; s <= NR_DEADLINE_EXCEEDED; ++s)
    CHECK(nr_status_name((nr_status)s) && strcmp(nr_status_name((nr_status)s), "unknown status"),
          "status %d has a name", s);
  CHECK(nr_status_name((nr_status)99) != NULL, "an unknown status still has a name");
  CHECK(nr_api_version() == NR_API_VERSION && nr_format_version() >= 1, "versions");
  uint8_t digest[32];
  nr_sha256(NULL, 0, digest);  /* SHA-256 of nothing: e3b0c442... */
  CHECK(digest[0] == 0xe3 && digest[1] == 0xb0 && digest[31] == 0x55, "sha256 of nothing");
  nr_executable_unload(exe);
}

/* ---- device ----------------------------------------------------------------------- */

static nr_device *dev;
static nr_status open_null(char *e, size_t n) { return nr_device_open(NULL, e, n); }
static int32_t charge_cores[2];
static int64_t charge_deltas[2];
static size_t charge_n;
static nr_status charge(char *e, size_t n) {
  return nr_device_charge(dev, charge_cores, charge_deltas, charge_n, e, n);
}
static void set_charge(int32_t c0, int64_t d0, int32_t c1, int64_t d1, size_t n) {
  charge_cores[0] = c0, charge_deltas[0] = d0, charge_cores[1] = c1, charge_deltas[1] = d1, charge_n = n;
}
static uint64_t used(size_t index) {
  nr_core_info info;
  return nr_device_core(dev, index, &info) == NR_OK ? info.used : UINT64_MAX;
}

static void case_device(void) {
  char err[1024];
  EXPECT(open_null, NR_INVALID_ARGUMENT, "out is NULL");
  CHECK(nr_device_open(&dev, err, sizeof err) == NR_OK, "open: %s", err);
  size_t n = nr_device_num_cores(dev);
  CHECK(n == 2 && nr_device_num_cores(NULL) == 0, "two cores (NEURONISH_NUM_CORES=2)");
  nr_core_info info;
  CHECK(nr_device_core(dev, n, &info) == NR_INVALID_ARGUMENT && nr_device_core(dev, 0, NULL) ==
        NR_INVALID_ARGUMENT && nr_device_core(NULL, 0, &info) == NR_INVALID_ARGUMENT, "core queries");
  CHECK(nr_device_core(dev, 0, &info) == NR_OK && info.used == 0 && info.total > 0, "core 0");
  uint64_t total = info.total;
  /* two deltas of INT64_MAX on one core ask for 2^64 - 2 bytes: out of memory, not a refund */
  set_charge(0, INT64_MAX, 0, INT64_MAX, 2);
  EXPECT(charge, NR_OUT_OF_DEVICE_MEMORY, "core 0");
  set_charge(0, INT64_MIN, 0, 0, 1);
  EXPECT(charge, NR_INVALID_ARGUMENT, "cannot give back 9223372036854775808 bytes on core 0");
  set_charge(0, INT64_MIN, 0, INT64_MIN, 2);
  EXPECT(charge, NR_INVALID_ARGUMENT, "cannot give back 18446744073709551616 bytes on core 0");
  set_charge(0, (int64_t)total, 0, 1, 2);
  EXPECT(charge, NR_OUT_OF_DEVICE_MEMORY, "core 0");
  set_charge(1, 1000, 7, 1, 2);  /* all or nothing: core 1 keeps nothing */
  EXPECT(charge, NR_INVALID_ARGUMENT, "core 7 is not one of the visible cores [0, 1]");
  CHECK(used(1) == 0, "a refused charge changed core 1: %llu", (unsigned long long)used(1));
  set_charge(0, 100, 0, -100, 2);
  EXPECT(charge, NR_OK, NULL);
  set_charge(1, 4096, 0, 0, 1);
  EXPECT(charge, NR_OK, NULL);
  CHECK(used(1) == 4096, "charged 4096 on core 1");
  set_charge(1, -4096, 0, 0, 1);
  EXPECT(charge, NR_OK, NULL);
  CHECK(used(0) == 0 && used(1) == 0, "all given back");
  CHECK(nr_device_charge(dev, NULL, charge_deltas, 1, err, sizeof err) == NR_INVALID_ARGUMENT &&
        nr_device_charge(dev, charge_cores, NULL, 1, err, sizeof err) == NR_INVALID_ARGUMENT &&
        nr_device_charge(NULL, charge_cores, charge_deltas, 1, err, sizeof err) == NR_INVALID_ARGUMENT &&
        nr_device_charge(dev, NULL, NULL, 0, err, sizeof err) == NR_OK, "charge's NULL pointers");
  nr_core_state state;
  char why[8] = "zzzzzzz";
  CHECK(nr_device_core_state(dev, 0, &state, NULL, 10) == NR_OK && state == NR_CORE_WORKING, "state");
  CHECK(nr_device_core_state(dev, 0, NULL, why, sizeof why) == NR_INVALID_ARGUMENT, "state NULL");
  CHECK(nr_device_core_state(NULL, 0, &state, why, sizeof why) == NR_INVALID_ARGUMENT, "dev NULL");
  CHECK(nr_device_core_state(dev, 2, &state, why, sizeof why) == NR_INVALID_ARGUMENT &&
        strstr(why, "core 2") && strlen(why) == sizeof why - 1, "core 2, its message cut to why_size");
  CHECK(nr_device_fail_core(NULL, 0, NULL, err, sizeof err) == NR_INVALID_ARGUMENT, "fail_core NULL");
  CHECK(nr_device_fail_core(dev, -1, NULL, err, sizeof err) == NR_INVALID_ARGUMENT && strstr(err, "core -1"),
        "fail_core(-1): %s", err);
  /* loads: NULL everywhere, 0 and too many duplicates; none holds memory afterwards */
  nr_executable *exe;
  nr_model *model = (nr_model *)&model;
  CHECK(nr_executable_load_file(path_of("dense3.neff"), &exe, err, sizeof err) == NR_OK, "%s", err);
  CHECK(nr_model_load(NULL, exe, 1, &model, err, sizeof err) == NR_INVALID_ARGUMENT && !model, "dev NULL");
  CHECK(nr_model_load(dev, NULL, 1, &model, err, sizeof err) == NR_INVALID_ARGUMENT, "exe NULL");
  CHECK(nr_model_load(dev, exe, 1, NULL, err, sizeof err) == NR_INVALID_ARGUMENT, "out NULL");
  CHECK(nr_model_load(dev, exe, 0, &model, err, sizeof err) == NR_INVALID_ARGUMENT &&
        strstr(err, "duplicates"), "0 duplicates: %s", err);
  CHECK(nr_model_load(dev, exe, UINT32_MAX, &model, err, sizeof err) == NR_DEVICE_ERROR &&
        strstr(err, "4294967295 duplicate(s)"), "UINT32_MAX duplicates: %s", err);
  CHECK(nr_model_load(dev, exe, 3, &model, err, sizeof err) == NR_DEVICE_ERROR, "3 copies on 2 cores");
  CHECK(nr_model_load_bytes(dev, NULL, 10, 1, &model, err, sizeof err) == NR_INVALID_ARGUMENT, "bytes NULL");
  CHECK(nr_model_load_file(dev, NULL, 1, &model, err, sizeof err) == NR_INVALID_ARGUMENT, "path NULL");
  CHECK(nr_model_load_file(dev, dir, 1, &model, err, sizeof err) == NR_IO_ERROR, "a directory");
  CHECK(used(0) == 0 && used(1) == 0, "failed loads hold device memory");
  CHECK(nr_model_load(dev, exe, 2, &model, err, sizeof err) == NR_OK, "2 copies: %s", err);
  CHECK(used(0) > 0 && used(1) > 0, "two copies charge both cores");
  nr_copy_info copy;
  CHECK(nr_model_copy(model, 1, &copy) == NR_OK && copy.num_cores == 1 && copy.runs == 0, "copy 1");
  CHECK(nr_model_copy(model, 2, &copy) == NR_INVALID_ARGUMENT && nr_model_copy(model, 0, NULL) ==
        NR_INVALID_ARGUMENT && nr_model_copy(NULL, 0, &copy) == NR_INVALID_ARGUMENT, "copy queries");
  CHECK(!nr_model_executable(NULL) && nr_model_batch_size(NULL) == -1 && nr_model_duplicates(NULL) == 0,
        "model queries on NULL");
  CHECK(nr_model_set_label(NULL, "x") == NR_INVALID_ARGUMENT && nr_model_set_label(model, NULL) ==
        NR_INVALID_ARGUMENT, "set_label's NULLs");
  CHECK(nr_model_instruction_team(NULL, 0) == -1 && nr_model_instruction_team(model, 999) == -1 &&
        nr_model_stage_thread(model, 2, 0) == -1 && nr_model_stage_thread(model, 0, 1) == -1 &&
        nr_model_narrow_runs(model, 2) == -1 && nr_model_narrow_runs(NULL, 0) == -1, "test hooks");
  const int64_t *ints;
  const double *floats;
  size_t ni, nf;
  CHECK(nr_model_instruction_spec(model, 999, &ints, &ni, &floats, &nf) == NR_INVALID_ARGUMENT &&
        nr_model_instruction_spec(model, 0, NULL, &ni, &floats, &nf) == NR_INVALID_ARGUMENT, "spec");
  nr_model_unload(model);
  CHECK(used(0) == 0 && used(1) == 0, "an unloaded model holds device memory");
  nr_model_unload(NULL);
  nr_executable_unload(exe);
  nr_device_close(dev);
  nr_device_close(NULL);
}

/* ---- execute ---------------------------------------------------------------------- */

static float input_value(size_t k) { return (float)((k * 5) % 11) - 5.0f; }

static nr_model *model;
static nr_tensor in_t, out_t;
static nr_tensor *in_p = &in_t, *out_p = &out_t;
static size_t n_in = 1, n_out = 1;
static nr_status run(char *e, size_t n) { return nr_execute(model, in_p, n_in, out_p, n_out, e, n); }

static void case_execute(void) {
  char err[1024];
  CHECK(nr_device_open(&dev, err, sizeof err) == NR_OK, "open: %s", err);
  nr_executable *exe;
  CHECK(nr_executable_load_file(path_of("dense3.neff"), &exe, err, sizeof err) == NR_OK, "%s", err);
  CHECK(nr_model_load(dev, exe, 2, &model, err, sizeof err) == NR_OK, "load: %s", err);
  /* documented: the executable may go first, and the device handle too */
  nr_executable_unload(exe);
  nr_device_close(dev);
  CHECK(nr_model_batch_size(model) == 3 && nr_model_duplicates(model) == 2, "batch 3, 2 copies");
  enum { MAX_BATCH = 11 };
  float x[MAX_BATCH * 16], y[MAX_BATCH * 8], rows[MAX_BATCH * 8];
  for (size_t k = 0; k < MAX_BATCH * 16; ++k) x[k] = input_value(k);
  int64_t xs[2] = {3, 16}, ys[2] = {3, 8};
  in_t = (nr_tensor){"x:0", NR_FLOAT32, 2, xs, x, 3 * 64};
  out_t = (nr_tensor){NULL, NR_FLOAT32, 2, ys, y, 3 * 32};
  EXPECT(run, NR_OK, NULL);
  /* every batch gives the rows each gives alone (split, padded, assembled) */
  for (int64_t b = 0; b < MAX_BATCH; ++b) {
    int64_t x1[2] = {1, 16}, y1[2] = {1, 8};
    nr_tensor i1 = {NULL, NR_FLOAT32, 2, x1, x + 16 * b, 64}, o1 = {NULL, NR_FLOAT32, 2, y1, rows + 8 * b, 32};
    CHECK(nr_execute(model, &i1, 1, &o1, 1, err, sizeof err) == NR_OK, "row %d: %s", (int)b, err);
  }
  for (int64_t b = 0; b <= MAX_BATCH; ++b) {
    xs[0] = ys[0] = b;
    in_t.bytes = (size_t)b * 64;
    out_t.bytes = (size_t)b * 32;
    memset(y, 0xFF, sizeof y);
    EXPECT(run, NR_OK, NULL);
    CHECK(!memcmp(y, rows, (size_t)b * 32), "batch %d differs from its rows run alone", (int)b);
    CHECK(b == MAX_BATCH || ((unsigned char *)y)[b * 32] == 0xFF, "batch %d wrote past its rows", (int)b);
  }
  /* batch 0 needs no data */
  xs[0] = ys[0] = 0;
  in_t.data = out_t.data = NULL;
  in_t.bytes = out_t.bytes = 0;
  EXPECT(run, NR_OK, NULL);
  in_t.data = x, out_t.data = y;
  xs[0] = ys[0] = 3;
  in_t.bytes = 3 * 64, out_t.bytes = 3 * 32;
  /* Bad calls: each refused with NR_INVALID_INPUT naming what is wrong, nothing written. */
  memset(y, 0x7F, sizeof y);
  in_p = NULL;
  EXPECT(run, NR_INVALID_INPUT, "inputs is NULL but num_inputs is 1");
  in_p = &in_t, out_p = NULL;
  EXPECT(run, NR_INVALID_INPUT, "outputs is NULL but num_outputs is 1");
  out_p = &out_t, n_in = 0;
  EXPECT(run, NR_INVALID_INPUT, "the call has 0 input(s); the model's inputs are 'x:0'");
  n_in = 1, n_out = 2;
  EXPECT(run, NR_INVALID_INPUT, "the call has 2 output buffer(s)");
  n_out = 1;
  in_t.name = "x";
  EXPECT(run, NR_INVALID_INPUT, "input 0 'x:0' is named 'x'");
  in_t.name = NULL, out_t.name = "y:0";
  EXPECT(run, NR_INVALID_INPUT, "output 'Identity:0' is named 'y:0'");
  out_t.name = NULL, in_t.dtype = (nr_dtype)99;
  EXPECT(run, NR_INVALID_INPUT, "'x:0' has dtype <not a dtype: 99>; the model was compiled for float32");
  in_t.dtype = NR_FLOAT64;
  EXPECT(run, NR_INVALID_INPUT, "'x:0' has dtype float64");
  in_t.dtype = NR_FLOAT32, in_t.shape = NULL;
  EXPECT(run, NR_INVALID_INPUT, "'x:0' has shape NULL with rank 2; expected float32[*,16]");
  in_t.shape = xs, in_t.rank = SIZE_MAX;
  EXPECT(run, NR_INVALID_INPUT, "'x:0' has rank 18446744073709551615 (at most 32); expected float32[*,16]");
  in_t.rank = 1;
  EXPECT(run, NR_INVALID_INPUT, "'x:0' has shape [3]; expected float32[*,16]");
  in_t.rank = 2, out_t.rank = SIZE_MAX;
  EXPECT(run, NR_INVALID_INPUT, "output 'Identity:0' is float32 of rank 18446744073709551615");
  out_t.rank = 2;
  xs[0] = -3;
  EXPECT(run, NR_INVALID_INPUT, "'x:0' has shape [-3,16]");
  xs[0] = 3, xs[1] = 15;
  EXPECT(run, NR_INVALID_INPUT, "'x:0' has shape [3,15]; expected float32[*,16] (any size on batch axis 0)");
  xs[1] = 16, in_t.data = NULL;
  EXPECT(run, NR_INVALID_INPUT, "'x:0' has data NULL; its shape [3,16] needs 192 bytes");
  in_t.data = x, in_t.bytes = 191;
  EXPECT(run, NR_INVALID_INPUT, "'x:0' holds 191 bytes; its shape [3,16] needs 192");
  in_t.bytes = 192, out_t.data = NULL;
  EXPECT(run, NR_INVALID_INPUT, "'Identity:0' is float32[3,8] with data NULL; expected a writable "
                                "float32[3,8] buffer of 96 bytes");
  out_t.data = y, out_t.bytes = 95;
  EXPECT(run, NR_INVALID_INPUT, "with 95 bytes; expected a writable float32[3,8] buffer of 96 bytes");
  out_t.bytes = 96, ys[0] = 4;
  EXPECT(run, NR_INVALID_INPUT, "'Identity:0' is float32[4,8]");
  ys[0] = 3;
  /* Shapes whose byte count overflows 64 bits: a wrapped count would let a small buffer pass
   * for a huge tensor (2^60 x 16 floats is 2^66 bytes, 0 modulo 2^64). */
  const int64_t huge[] = {(int64_t)1 << 60, ((int64_t)1 << 62) + 1, INT64_MAX};
  for (size_t h = 0; h < sizeof huge / sizeof huge[0]; ++h) {
    xs[0] = ys[0] = huge[h];
    in_t.bytes = 0, out_t.bytes = 0;
    EXPECT(run, NR_INVALID_INPUT, "more than 2^64 bytes");
    in_t.bytes = 64, out_t.bytes = 32;
    EXPECT(run, NR_INVALID_INPUT, "more than 2^64 bytes");
  }
  for (size_t k = 0; k < sizeof y / sizeof y[0]; ++k)
    CHECK(((uint32_t *)y)[k] == 0x7F7F7F7Fu, "a refused call wrote output element %zu", k);
  xs[0] = ys[0] = 3;
  in_t.bytes = 192, out_t.bytes = 96;
  EXPECT(run, NR_OK, NULL);  /* the model goes on */
  /* deadlines and cancel: unset (0 / NULL / <= 0), passed, set */
  nr_execute_options options = {0, NULL};
  volatile uint8_t cancel = 0;
  CHECK(nr_execute_with(model, &in_t, 1, &out_t, 1, NULL, err, sizeof err) == NR_OK, "options NULL");
  CHECK(nr_execute_with(model, &in_t, 1, &out_t, 1, &options, err, sizeof err) == NR_OK, "options 0");
  options.deadline_ns = -5;
  CHECK(nr_execute_with(model, &in_t, 1, &out_t, 1, &options, err, sizeof err) == NR_OK, "deadline <= 0");
  options.deadline_ns = INT64_MAX, options.cancel = &cancel;
  CHECK(nr_execute_with(model, &in_t, 1, &out_t, 1, &options, err, sizeof err) == NR_OK, "far deadline");
  options.deadline_ns = 1;
  CHECK(nr_execute_with(model, &in_t, 1, &out_t, 1, &options, err, sizeof err) == NR_DEADLINE_EXCEEDED &&
        strstr(err, "before it started"), "a passed deadline: %s", err);
  options.deadline_ns = 0, cancel = 1;
  CHECK(nr_execute_with(model, &in_t, 1, &out_t, 1, &options, err, sizeof err) == NR_CANCELLED &&
        strstr(err, "cancelled by its caller before it started"), "cancelled: %s", err);
  xs[1] = 15;  /* a bad call that is also cancelled: the bad input is what it hears about */
  CHECK(nr_execute_with(model, &in_t, 1, &out_t, 1, &options, err, sizeof err) == NR_INVALID_INPUT,
        "bad and cancelled: %s", err);
  xs[1] = 16;
  CHECK(nr_execute_with(NULL, &in_t, 1, &out_t, 1, NULL, err, sizeof err) == NR_INVALID_ARGUMENT &&
        strstr(err, "model is NULL"), "model NULL: %s", err);
  /* the outputs of batch 5 for the test to hold against TensorFlow */
  xs[0] = ys[0] = 5;
  in_t.bytes = 5 * 64, out_t.bytes = 5 * 32;
  EXPECT(run, NR_OK, NULL);
  if (!failures) {
    for (size_t k = 0; k < 5 * 8; ++k) printf("%s%.9g", k ? " " : "", y[k]);
    printf("\n");
  }
  nr_model_unload(model);
}

/* ---- threads ---------------------------------------------------------------------- */

/* Eight threads call one model (2 copies) at batches 1..7 with and without far deadlines,
 * while two more load, run and unload another model on the same device and charge and
 * refund memory: every call gives the rows it gives alone. */
static float reference[7 * 8];

static void *caller(void *arg) {
  long id = (long)arg;
  char err[1024];
  for (int call = 0; call < 30; ++call) {
    int64_t b = 1 + (id + call) % 7;
    float x[7 * 16], y[7 * 8];
    for (size_t k = 0; k < (size_t)b * 16; ++k) x[k] = input_value(k);
    int64_t xs[2] = {b, 16}, ys[2] = {b, 8};
    nr_tensor i = {NULL, NR_FLOAT32, 2, xs, x, (size_t)b * 64}, o = {NULL, NR_FLOAT32, 2, ys, y, (size_t)b * 32};
    nr_execute_options options = {call % 2 ? INT64_MAX : 0, NULL};
    nr_status s = nr_execute_with(model, &i, 1, &o, 1, &options, err, sizeof err);
    CHECK(s == NR_OK && !memcmp(y, reference, (size_t)b * 32), "thread %ld call %d: %d %s", id, call, (int)s,
          s ? err : "another result than alone");
  }
  return NULL;
}

static char two_path[1024];  /* (path_of's buffer is not for threads) */

static void *loader(void *arg) {
  long id = (long)arg;
  char err[1024];
  for (int k = 0; k < 10; ++k) {
    nr_model *other;
    nr_status s = nr_model_load_file(dev, two_path, 1, &other, err, sizeof err);
    CHECK(s == NR_OK, "loader %ld: %s", id, err);
    if (s != NR_OK) continue;
    float a[8] = {-1, 2, -3, 4, -5, 6, -7, 8}, b[8] = {1, 1, 1, 1, 1, 1, 1, 1}, r[8], twice[8];
    int64_t shape[2] = {2, 4};
    nr_tensor ins[2] = {{NULL, NR_FLOAT32, 2, shape, a, 32}, {NULL, NR_FLOAT32, 2, shape, b, 32}};
    nr_tensor outs[2] = {{NULL, NR_FLOAT32, 2, shape, r, 32}, {NULL, NR_FLOAT32, 2, shape, twice, 32}};
    s = nr_execute(other, ins, 2, outs, 2, err, sizeof err);
    CHECK(s == NR_OK && r[0] == 1 && r[1] == 3 && twice[7] == 16, "loader %ld run: %s", id, err);
    int32_t core = (int32_t)(id % 2);
    int64_t delta = 1 << 20;
    CHECK(nr_device_charge(dev, &core, &delta, 1, err, sizeof err) == NR_OK, "charge: %s", err);
    delta = -delta;
    CHECK(nr_device_charge(dev, &core, &delta, 1, err, sizeof err) == NR_OK, "refund: %s", err);
    nr_model_unload(other);
  }
  return NULL;
}

static void case_threads(void) {
  char err[1024];
  CHECK(nr_device_open(&dev, err, sizeof err) == NR_OK, "open: %s", err);
  CHECK(nr_model_load_file(dev, path_of("dense3.neff"), 2, &model, err, sizeof err) == NR_OK, "%s", err);
  float x[7 * 16];
  for (size_t k = 0; k < 7 * 16; ++k) x[k] = input_value(k);
  int64_t xs[2] = {7, 16}, ys[2] = {7, 8};
  nr_tensor i = {NULL, NR_FLOAT32, 2, xs, x, sizeof x}, o = {NULL, NR_FLOAT32, 2, ys, reference, sizeof reference};
  CHECK(nr_execute(model, &i, 1, &o, 1, err, sizeof err) == NR_OK, "reference: %s", err);
  snprintf(two_path, sizeof two_path, "%s", path_of("two.neff"));
  /* Loaded once before the threads: its oneDNN primitives make oneDNN's global primitive
   * cache, whose lazily built lock ThreadSanitizer cannot see guarded (oneDNN is not
   * instrumented), and reports as a race when two threads' first loads build it. */
  nr_model *warm;
  CHECK(nr_model_load_file(dev, two_path, 1, &warm, err, sizeof err) == NR_OK, "%s", err);
  nr_model_unload(warm);
  pthread_t threads[10];
  for (long t = 0; t < 10; ++t) pthread_create(&threads[t], NULL, t < 8 ? caller : loader, (void *)t);
  for (int t = 0; t < 10; ++t) pthread_join(threads[t], NULL);
  nr_copy_info copy0, copy1;
  CHECK(nr_model_copy(model, 0, &copy0) == NR_OK && nr_model_copy(model, 1, &copy1) == NR_OK &&
        copy0.runs + copy1.runs >= 8 * 30, "copies' runs: %llu + %llu", (unsigned long long)copy0.runs,
        (unsigned long long)copy1.runs);
  nr_model_unload(model);
  CHECK(used(0) == 0 && used(1) == 0, "memory left after the threads");
  nr_device_close(dev);
}

/* ---- label ------------------------------------------------------------------------ */

/* Labels a stranger might pass: quotes and control bytes, bytes that are not UTF-8, and a
 * long one whose 200th byte falls inside a character. The test reads the telemetry file
 * (NEURONISH_RUN_DIR) and the profile (NEURONISH_PROFILE) with Python's json. */
static void case_label(void) {
  char err[1024], longer[400];
  CHECK(nr_device_open(&dev, err, sizeof err) == NR_OK, "open: %s", err);
  nr_model *models[3];
  size_t n = strlen(strcpy(longer, "x"));
  while (n + 2 < sizeof longer) longer[n++] = (char)0xC3, longer[n++] = (char)0xA9;  /* "é" */
  longer[n] = 0;
  const char *labels[3] = {"quote\" back\\ nl\n ctl\x01 end", "not utf-8: \xff\xfe \xc3( \xed\xa0\x80 end", longer};
  for (int m = 0; m < 3; ++m) {
    CHECK(nr_model_load_file(dev, path_of("dense3.neff"), 1, &models[m], err, sizeof err) == NR_OK, "%s", err);
    CHECK(nr_model_set_label(models[m], labels[m]) == NR_OK, "label %d", m);
    float x[48] = {0}, y[24];
    int64_t xs[2] = {3, 16}, ys[2] = {3, 8};
    nr_tensor i = {NULL, NR_FLOAT32, 2, xs, x, sizeof x}, o = {NULL, NR_FLOAT32, 2, ys, y, sizeof y};
    CHECK(nr_execute(models[m], &i, 1, &o, 1, err, sizeof err) == NR_OK, "run: %s", err);
  }
  CHECK(nr_device_fail_core(dev, 1, "bad \xff byte", err, sizeof err) == NR_OK, "fail_core: %s", err);
  sleep(1);  /* telemetry is published every 0.5 s */
  printf("published\n");
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) printf("no go-ahead\n");  /* the test has read the file */
  for (int m = 0; m < 3; ++m) nr_model_unload(models[m]);
  nr_device_close(dev);
}

/* ---- config ----------------------------------------------------------------------- */

/* Open a device from the environment the test sets; print its status and message, or each
 * core's memory. */
static void case_config(void) {
  char err[1024];
  nr_status s = nr_device_open(&dev, err, sizeof err);
  if (s != NR_OK) {
    printf("%d %s\n", (int)s, err);
    return;
  }
  for (size_t k = 0; k < nr_device_num_cores(dev); ++k) {
    nr_core_info info;
    nr_device_core(dev, k, &info);
    printf("%score %d total %llu", k ? ", " : "0 ", info.core, (unsigned long long)info.total);
  }
  printf("\n");
  nr_device_close(dev);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: nr_client load|inspect|device|execute|threads|label|config DIR\n");
    return 2;
  }
  snprintf(dir, sizeof dir, "%s", argv[2]);
  const char *c = argv[1];
  if (!strcmp(c, "load")) case_load();
  else if (!strcmp(c, "inspect")) case_inspect();
  else if (!strcmp(c, "device")) case_device();
  else if (!strcmp(c, "execute")) case_execute();
  else if (!strcmp(c, "threads")) case_threads();
  else if (!strcmp(c, "label")) case_label();
  else if (!strcmp(c, "config")) case_config();
  else return 2;
  if (failures) return 1;
  printf("ok\n");
  return 0;
}
