#define _POSIX_C_SOURCE 200809L
/* Loads executables through the neuronish C API and prints, per file, one JSON line:
 * its signature and program summary, or the error. tests/runtime/test_c_api.py builds it with
 * gcc against libneuronish_runtime.so and compares the lines with Python's reading.
 * Every file is loaded twice, from the file and from its bytes; both must agree (the file's
 * message may begin with "executable file '<path>': "). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "neuronish_runtime.h"

static void json_string(const char *s) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)s; *p; ++p) {
    if (*p == '"' || *p == '\\') printf("\\%c", *p);
    else if (*p < 0x20) printf("\\u%04x", *p);
    else putchar(*p);
  }
  putchar('"');
}

static void tensors(const nr_executable *exe, nr_io which) {
  putchar('[');
  for (size_t i = 0; i < nr_executable_num_tensors(exe, which); ++i) {
    nr_tensor_info t;
    if (nr_executable_tensor(exe, which, i, &t) != NR_OK) { puts("query failed"); exit(3); }
    printf("%s{\"name\": ", i ? ", " : "");
    json_string(t.name);
    printf(", \"dtype\": \"%s\", \"dtype_id\": %d, \"shape\": [", t.dtype_name, (int)t.dtype);
    for (size_t d = 0; d < t.rank; ++d) printf("%s%lld", d ? ", " : "", (long long)t.shape[d]);
    printf("], \"batch_axis\": %lld}", (long long)t.batch_axis);
  }
  putchar(']');
}

static unsigned char *slurp(const char *path, size_t *size) {
  struct stat st; /* only regular files: fopen of a FIFO would wait for a writer */
  if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *data = malloc(n ? (size_t)n : 1);
  *size = fread(data, 1, (size_t)n, f);
  fclose(f);
  return data;
}

int main(int argc, char **argv) {
  char error[1024];
  for (int a = 1; a < argc; ++a) {
    nr_executable *exe = NULL;
    nr_status status = nr_executable_load_file(argv[a], &exe, error, sizeof error);
    size_t size = 0;
    unsigned char *data = slurp(argv[a], &size);
    nr_executable *again = NULL;
    char error2[1024];
    nr_status status2 = status; /* an unreadable file has no bytes to compare */
    if (data) status2 = nr_executable_load_bytes(data, size, &again, error2, sizeof error2);
    else strcpy(error2, error);
    free(data);
    /* a refusal of the file (header, size, checksum or body) names the file first */
    char named[1024 + 4096];
    snprintf(named, sizeof named, "executable file '%s': %s", argv[a], error2);
    if (status != status2 || (status != NR_OK && strcmp(error, error2) != 0 &&
                              strcmp(error, named) != 0 && !strstr(error, "truncated"))) {
      printf("{\"status\": \"mismatch\", \"file\": %d, \"bytes\": %d}\n", (int)status, (int)status2);
      return 4;
    }
    nr_executable_unload(again);
    if (status != NR_OK) {
      printf("{\"status\": \"error\", \"code\": %d, \"code_name\": \"%s\", \"message\": ", (int)status,
             nr_status_name(status));
      json_string(error);
      printf("}\n");
      fflush(stdout);
      continue;
    }
    printf("{\"status\": \"ok\", \"format_version\": %u, \"compiler\": {\"name\": ",
           nr_executable_version(exe));
    json_string(nr_executable_compiler_name(exe));
    printf(", \"version\": ");
    json_string(nr_executable_compiler_version(exe));
    printf("}, \"inputs\": ");
    tensors(exe, NR_INPUT);
    printf(", \"outputs\": ");
    tensors(exe, NR_OUTPUT);
    printf(", \"num_cores\": %zu, \"instructions_per_core\": [", nr_executable_num_cores(exe));
    for (size_t c = 0; c < nr_executable_num_cores(exe); ++c)
      printf("%s%zu", c ? ", " : "", nr_executable_num_instructions(exe, c));
    printf("], \"kinds\": [");
    int first = 1; /* a core may have no instructions */
    for (size_t c = 0; c < nr_executable_num_cores(exe); ++c)
      for (size_t i = 0; i < nr_executable_num_instructions(exe, c); ++i, first = 0)
        printf("%s\"%s\"", first ? "" : ", ", nr_executable_instruction_kind(exe, c, i));
    printf("], \"arena_bytes\": %llu, \"constants\": {\"count\": %zu, \"bytes\": %llu}}\n",
           (unsigned long long)nr_executable_arena_bytes(exe), nr_executable_num_constants(exe),
           (unsigned long long)nr_executable_constant_bytes(exe));
    fflush(stdout);
    nr_executable_unload(exe);
  }
  return 0;
}
