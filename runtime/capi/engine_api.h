// The native engine's C ABI (runtime/native/engine.cc's extern "C" ne_* functions), which
// this library links against (library.py builds engine.cc as runtime/native/library.py
// does and links the result). Declarations only: engine.cc stays the one definition.
#pragma once
#include <cstdint>

// ne_run's result when it stopped for the cancel byte (engine.cc's STOP_CANCELLED).
constexpr int64_t kNeStopCancelled = 1;

extern "C" {
int64_t ne_version();
void *ne_create(int64_t n_slots, int64_t threads, char *err, int64_t len);
void ne_destroy(void *p);
void *ne_pool_create();
void ne_pool_destroy(void *pool);
int64_t ne_use_pool(void *p, void *pool);
int64_t ne_bind(void *p, int64_t slot, void *ptr, char *err, int64_t len);
int64_t ne_add(void *p, const int64_t *spec, int64_t n, const float *fs, int64_t nf, char *err, int64_t len);
int64_t ne_set_threads(void *p, int64_t threads);
int64_t ne_set_timing(void *p, double *buf);
int64_t ne_finalize(void *p, char *err, int64_t len);
int64_t ne_bytes(void *p);
int64_t ne_run(void *p, int64_t first, int64_t last, int64_t first_slot, void **ptrs, int64_t n_ptrs,
               const char *cancel, double deadline, char *err, int64_t len);
int64_t ne_impl(void *p, int64_t k, char *out, int64_t len);
}
