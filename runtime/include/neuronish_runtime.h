/* neuronish device runtime: the C API (issue 25, docs/c-api.md).
 *
 * Plain C, opaque handles, no Python and no TensorFlow. Every call that can fail
 * returns an nr_status and, when the caller passes a buffer, writes a message there
 * that names the field or instruction at fault (the same facts runtime/validate.py
 * reports). Thread safety: the library has no global mutable state; an nr_executable
 * is immutable once loaded, so any number of threads may query one concurrently.
 * Unloading must not race with other calls on the same handle.
 *
 * Implemented in this version: loading an executable (bytes or file) with full
 * validation of the header and body, queries of its signature and program summary,
 * and unloading. Not yet: devices, cores, execute, batch split, deadlines (see
 * docs/c-api.md for the planned shape).
 */
#ifndef NEURONISH_RUNTIME_H
#define NEURONISH_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define NR_API __attribute__((visibility("default")))
#else
#define NR_API
#endif

#define NR_API_VERSION 1

typedef enum nr_status {
  NR_OK = 0,
  NR_INVALID_ARGUMENT = 1,    /* a NULL handle, an index out of range, ... */
  NR_IO_ERROR = 2,            /* the file cannot be opened or read */
  NR_INVALID_EXECUTABLE = 3,  /* corrupt, truncated, inconsistent, or not an executable */
  NR_UNSUPPORTED = 4,         /* a newer format version or an instruction kind this runtime lacks */
  NR_OUT_OF_MEMORY = 5,
  NR_INTERNAL = 6
} nr_status;

/* Device dtypes (runtime/isa.py ITEMSIZE). */
typedef enum nr_dtype {
  NR_BOOL = 0, NR_INT8, NR_UINT8, NR_INT16, NR_INT32, NR_INT64,
  NR_FLOAT16, NR_BFLOAT16, NR_FLOAT32, NR_FLOAT64
} nr_dtype;

typedef struct nr_executable nr_executable;

typedef enum nr_io { NR_INPUT = 0, NR_OUTPUT = 1 } nr_io;

/* One tensor of the signature. Pointers stay valid until the executable is unloaded. */
typedef struct nr_tensor_info {
  const char *name;        /* the TF tensor name, e.g. "x:0" (NUL-terminated UTF-8) */
  nr_dtype dtype;
  const char *dtype_name;  /* "float32", "bfloat16", ... */
  size_t rank;
  const int64_t *shape;    /* rank dims */
  int64_t batch_axis;      /* -1: none */
} nr_tensor_info;

/* The version of this API the library implements (NR_API_VERSION). */
NR_API uint32_t nr_api_version(void);
/* The executable format versions this library reads: 1..nr_format_version(). */
NR_API uint32_t nr_format_version(void);
/* "float32" for NR_FLOAT32, ...; NULL for a value that is not a dtype. */
NR_API const char *nr_dtype_name(nr_dtype dtype);
/* A short constant description of a status ("invalid executable", ...). */
NR_API const char *nr_status_name(nr_status status);

/* Load (read and validate) an executable. `data` is copied; the caller may free it on
 * return. On failure *out is NULL and, if error != NULL and error_size > 0, a
 * NUL-terminated message (truncated to error_size) says what is wrong. */
NR_API nr_status nr_executable_load_bytes(const void *data, size_t size, nr_executable **out,
                                          char *error, size_t error_size);
/* As above, from a regular file; the header is checked before the body is read. */
NR_API nr_status nr_executable_load_file(const char *path, nr_executable **out,
                                         char *error, size_t error_size);
/* Free an executable and everything its queries returned; NULL is allowed. */
NR_API void nr_executable_unload(nr_executable *exe);

NR_API size_t nr_executable_num_tensors(const nr_executable *exe, nr_io which);
NR_API nr_status nr_executable_tensor(const nr_executable *exe, nr_io which, size_t index,
                                      nr_tensor_info *info);

/* Program summary. */
NR_API uint32_t nr_executable_version(const nr_executable *exe);   /* its format version */
NR_API size_t nr_executable_num_cores(const nr_executable *exe);  /* programs (pipeline cores) */
NR_API size_t nr_executable_num_instructions(const nr_executable *exe, size_t core);
/* The kind of instruction `index` of `core` ("conv2d", ...); NULL when out of range. */
NR_API const char *nr_executable_instruction_kind(const nr_executable *exe, size_t core,
                                                  size_t index);
NR_API uint64_t nr_executable_arena_bytes(const nr_executable *exe);
NR_API size_t nr_executable_num_constants(const nr_executable *exe);
NR_API uint64_t nr_executable_constant_bytes(const nr_executable *exe);
/* compiler.name / compiler.version from the file ("" when absent). */
NR_API const char *nr_executable_compiler_name(const nr_executable *exe);
NR_API const char *nr_executable_compiler_version(const nr_executable *exe);

#ifdef __cplusplus
}
#endif
#endif /* NEURONISH_RUNTIME_H */
