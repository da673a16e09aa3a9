/* Thread safety of the C API: 8 threads load, query and unload the same executable
 * (from its file and from one shared buffer) 40 times each, and one shared handle is
 * queried by all of them at once. tests/runtime/test_c_api.py runs it under ThreadSanitizer. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "neuronish_runtime.h"

static const char *path;
static unsigned char *bytes;
static size_t size;
static nr_executable *shared;

static void *work(void *arg) {
  (void)arg;
  char error[256];
  for (int i = 0; i < 40; ++i) {
    nr_executable *exe = NULL;
    nr_status s = i % 2 ? nr_executable_load_file(path, &exe, error, sizeof error)
                        : nr_executable_load_bytes(bytes, size, &exe, error, sizeof error);
    if (s != NR_OK) { fprintf(stderr, "load failed: %s\n", error); exit(1); }
    nr_tensor_info a, b;
    if (nr_executable_tensor(exe, NR_INPUT, 0, &a) != NR_OK ||
        nr_executable_tensor(shared, NR_INPUT, 0, &b) != NR_OK || strcmp(a.name, b.name) ||
        a.rank != b.rank || nr_executable_num_cores(exe) != nr_executable_num_cores(shared)) {
      fprintf(stderr, "queries disagree\n");
      exit(1);
    }
    nr_executable_unload(exe);
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 2) return 2;
  path = argv[1];
  FILE *f = fopen(path, "rb");
  if (!f) return 2;
  fseek(f, 0, SEEK_END);
  size = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  bytes = malloc(size);
  if (fread(bytes, 1, size, f) != size) return 2;
  fclose(f);
  char error[256];
  if (nr_executable_load_bytes(bytes, size, &shared, error, sizeof error) != NR_OK) return 3;
  pthread_t threads[8];
  for (int i = 0; i < 8; ++i) pthread_create(&threads[i], NULL, work, NULL);
  for (int i = 0; i < 8; ++i) pthread_join(threads[i], NULL);
  nr_executable_unload(shared);
  free(bytes);
  puts("ok");
  return 0;
}
