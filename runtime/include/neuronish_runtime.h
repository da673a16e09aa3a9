/* neuronish device runtime: the C API (issue 25, docs/c-api.md).
 *
 * Plain C, opaque handles, no Python and no TensorFlow. Every call that can fail
 * returns an nr_status and, when the caller passes a buffer, writes a message there
 * that names the field, instruction, input or environment variable at fault. No call
 * aborts, prints or exits on bad input.
 *
 * What there is: loading an executable (bytes or a file) with full validation, queries
 * of its signature and program; a device configured from NEURONISH_* as the Python
 * runtime reads it (cores, core groups, core memory, host CPUs); loading a model onto
 * core groups (duplicates) as native engine programs (runtime/native/engine.cc, linked);
 * execute at any batch (split, padded, assembled), with a deadline and a cancel flag.
 * Profiles and telemetry as the Python runtime's (nr_host_observes). Cores that fail in
 * service, simulated (nr_device_fail_core, NEURONISH_FAILED_CORES).
 *
 * Thread safety: an nr_executable is immutable once loaded (any threads may query it);
 * nr_execute may be called from any number of threads on one model (a call takes an idle
 * copy; each of its stages runs on that core's host thread, one stage at a time per core,
 * with its share of the host's CPUs, while the caller waits; a single-stage call on an
 * idle core runs on the caller's thread). Devices and models may be opened and loaded from
 * several threads. A handle must not be unloaded or closed while another thread uses it.
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
  NR_OUT_OF_MEMORY = 5,       /* the host is out of memory */
  NR_INTERNAL = 6,            /* a bug in this library: please report it */
  NR_INVALID_CONFIG = 7,      /* a NEURONISH_* variable has a value this library cannot use */
  NR_DEVICE_ERROR = 8,        /* no core group can take the model (too few cores, failed) */
  NR_OUT_OF_DEVICE_MEMORY = 9,/* the cores of every fitting group lack the memory */
  NR_INVALID_INPUT = 10,      /* a call's inputs or output buffers do not fit the signature */
  NR_EXECUTION_ERROR = 11,    /* the engine failed while running an instruction */
  NR_CANCELLED = 12,          /* the caller cancelled the call (nr_execute_options.cancel) */
  NR_DEADLINE_EXCEEDED = 13   /* the call's deadline passed (nr_execute_options.deadline_ns) */
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
/* The SHA-256 of `size` bytes at `data` (FIPS 180-4): a host checks an executable stored
 * apart from its model against the digest that names it (neuronish/external.py). */
NR_API void nr_sha256(const void *data, size_t size, uint8_t digest[32]);

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

/* ---- Devices, models, execution -------------------------------------------------- */

typedef struct nr_device nr_device;
typedef struct nr_model nr_model;

/* A tensor of a call: an input (read) or an output buffer (written). `shape` has `rank`
 * dims; `data` holds at least `bytes` bytes, C-contiguous (row-major), the dtype's
 * native byte order. `name` may be NULL; if set it must be the signature's name. */
typedef struct nr_tensor {
  const char *name;
  nr_dtype dtype;
  size_t rank;
  const int64_t *shape;
  void *data;
  size_t bytes;
} nr_tensor;

/* One core of the device: its id and device memory (bytes). */
typedef struct nr_core_info {
  int32_t core;
  uint64_t used;
  uint64_t total;
} nr_core_info;

/* Open a simulated device configured from the environment as the Python runtime reads it
 * (NEURONISH_NUM_CORES, NEURONISH_VISIBLE_CORES, NEURONISH_CORE_GROUP_SIZES,
 * NEURONISH_CORE_MEMORY, NEURONISH_CORE_THREADS, NEURONISH_HOST_PARALLELISM,
 * NEURONISH_NARROW_TWIN, NEURONISH_FAILED_CORES; README). NR_INVALID_CONFIG names the
 * variable. Each call opens a new, independent device. */
NR_API nr_status nr_device_open(nr_device **out, char *error, size_t error_size);
/* Close the handle. Models still loaded keep the device alive until they are unloaded. */
NR_API void nr_device_close(nr_device *dev);
/* Visible cores, and core `index` of them (0 .. num_cores-1). */
NR_API size_t nr_device_num_cores(const nr_device *dev);
NR_API nr_status nr_device_core(const nr_device *dev, size_t index, nr_core_info *info);

/* Device memory held on the device's cores by something other than its models: a host
 * that runs other models on the same (simulated) device charges what they hold here, so
 * one budget covers both (the Python runtime does, runtime/device.py). deltas[k] bytes
 * more (positive) or fewer (negative) on core cores[k]; all or nothing:
 * NR_OUT_OF_DEVICE_MEMORY names a core that lacks the room, NR_INVALID_ARGUMENT a core
 * that is not visible or a refund larger than what the core holds; nothing changes then.
 * nr_device_core's `used` counts these bytes; model loads see them as taken. */
NR_API nr_status nr_device_charge(nr_device *dev, const int32_t *cores, const int64_t *deltas,
                                  size_t num, char *error, size_t error_size);

/* Cores failing in service, simulated (as runtime/device.py's Device.fail_core, so a host
 * can exercise what it does then; docs/c-api.md "Failed cores"). From the moment
 * nr_device_fail_core returns, core `core` (a visible core's id, as nr_core_info.core) is
 * out of service for good: loads avoid it (NR_DEVICE_ERROR when too few core groups are
 * left, naming the failed cores), and each model with a copy on it retires that copy: no
 * call starts there again and its device memory is given back (a call computing on it
 * then finishes, with correct outputs); calls run on the model's other copies. A model
 * left with no copy fails every call with NR_DEVICE_ERROR, the message naming each failed
 * core and why (a NeuronOp then runs on TensorFlow, unless NEURONISH_FALLBACK=0). The
 * core's message is "core <core> failed (<why>)" (`why` NULL or empty: "hardware error");
 * failing a failed core again changes nothing. NR_INVALID_ARGUMENT for a core that is not
 * visible. Thread-safe with calls and loads in flight. NEURONISH_FAILED_CORES (README)
 * fails cores as the device opens. */
NR_API nr_status nr_device_fail_core(nr_device *dev, int32_t core, const char *why, char *error,
                                     size_t error_size);

typedef enum nr_core_state { NR_CORE_WORKING = 0, NR_CORE_FAILED = 1 } nr_core_state;
/* Whether core `core` (an id, as nr_core_info.core) has failed; if so and `why` is given,
 * its message ("core 1 failed (ECC error)") is written there (NUL-terminated, truncated to
 * why_size; "" for a working core). NR_INVALID_ARGUMENT (and `why` says what is wrong) for
 * a NULL device or state, or a core that is not visible. */
NR_API nr_status nr_device_core_state(const nr_device *dev, int32_t core, nr_core_state *state,
                                      char *why, size_t why_size);

/* Load `exe` onto `duplicates` (>= 1) core groups of nr_executable_num_cores(exe) cores:
 * its constants are copied to device memory, every instruction is built as a native
 * engine primitive. Errors: NR_DEVICE_ERROR (too few core groups), NR_OUT_OF_DEVICE_MEMORY,
 * NR_UNSUPPORTED (an instruction the native engine has no kernel for: the message names
 * it; the Python runtime would run it on numpy), NR_INVALID_EXECUTABLE. The model keeps
 * what it needs of `exe`: the executable may be unloaded first. */
NR_API nr_status nr_model_load(nr_device *dev, const nr_executable *exe, uint32_t duplicates,
                               nr_model **out, char *error, size_t error_size);
/* The same from bytes or a file (read and validated as nr_executable_load_bytes and
 * nr_executable_load_file do; `data` is copied). */
NR_API nr_status nr_model_load_bytes(nr_device *dev, const void *data, size_t size,
                                     uint32_t duplicates, nr_model **out, char *error,
                                     size_t error_size);
NR_API nr_status nr_model_load_file(nr_device *dev, const char *path, uint32_t duplicates,
                                    nr_model **out, char *error, size_t error_size);
/* Free the model's device memory and engine programs; NULL is allowed. No call on the
 * model may be running or start afterwards. */
NR_API void nr_model_unload(nr_model *model);
/* The model's executable (its signature and program summary), valid while it is loaded. */
NR_API const nr_executable *nr_model_executable(const nr_model *model);
/* The compiled batch size calls are split by, or -1 when the model takes only its
 * compiled shapes (no input has a batch axis, or they disagree). */
NR_API int64_t nr_model_batch_size(const nr_model *model);
NR_API size_t nr_model_duplicates(const nr_model *model);

/* One copy (duplicate) of a loaded model: where it is and what it has done, for device
 * telemetry (`neuronish ls/top`). The pointers stay valid while the model is loaded; the
 * counters only grow. */
typedef struct nr_copy_info {
  const int32_t *cores;            /* its core group */
  const uint64_t *bytes_per_core;  /* the device memory it holds on each of those cores */
  size_t num_cores;
  uint64_t runs;     /* runs of its program: each a compiled-batch chunk of some call */
  uint64_t busy_ns;  /* their wall time, from taking the copy to giving it back */
} nr_copy_info;
/* Copy `index` (< nr_model_duplicates) of the model; NR_INVALID_ARGUMENT when out of range.
 * A copy retired by a failed core (nr_device_core_state) is still listed, with what it held
 * when it was loaded and the runs it made, as the Python runtime's telemetry lists it;
 * nr_model_duplicates counts the copies loaded, retired ones included. */
NR_API nr_status nr_model_copy(const nr_model *model, size_t index, nr_copy_info *info);

/* Run the model. `inputs` in signature order, each of its dtype and shape, except that
 * on its batch axis (nr_tensor_info.batch_axis >= 0, when nr_model_batch_size >= 0) every
 * batched input may have any size B, the same for all. `outputs` are caller-owned buffers
 * in signature order with each output's dtype and shape, with B on its batch axis. A call
 * at another batch than the compiled one is split into chunks of the compiled size (the
 * last padded by repeating its last row: no value the model has not seen), run on the
 * model's duplicates in parallel, and the outputs assembled; B = 0 computes nothing.
 * NR_INVALID_INPUT names the input or output at fault and what was expected; nothing is
 * written then. Thread-safe: any number of threads may call it on one model at once (a
 * call waits for an idle copy, and holds each core of it, one mutex per core, while its
 * program runs there). */
NR_API nr_status nr_execute(nr_model *model, const nr_tensor *inputs, size_t num_inputs,
                            const nr_tensor *outputs, size_t num_outputs, char *error,
                            size_t error_size);

/* When a call is abandoned. Either may be unset (0 or less / NULL). Once the deadline passes or
 * the cancel byte becomes non-zero, the call stops where it is: waiting for a copy, a
 * core or the host's CPUs, or before its next instruction, stage or chunk (an instruction
 * already computing finishes), and returns NR_DEADLINE_EXCEEDED / NR_CANCELLED saying
 * where it stopped; its outputs are then unspecified. */
typedef struct nr_execute_options {
  int64_t deadline_ns;             /* absolute CLOCK_MONOTONIC time in nanoseconds; <= 0: none */
  const volatile uint8_t *cancel;  /* a byte another thread may set non-zero */
} nr_execute_options;

/* nr_execute with a deadline and/or a cancel flag (`options` may be NULL: none). */
NR_API nr_status nr_execute_with(nr_model *model, const nr_tensor *inputs, size_t num_inputs,
                                 const nr_tensor *outputs, size_t num_outputs,
                                 const nr_execute_options *options, char *error,
                                 size_t error_size);

/* Profiles and device telemetry, as the Python runtime's (docs/see-inside.md). With
 * NEURONISH_PROFILE=DIR set when the process opens its first device, every call of a model
 * loaded afterwards is recorded (call, queue, execute and each engine instruction, host
 * time measured) and written at exit to DIR/neuronish-<pid>.json, the trace format that
 * `neuronish profile --read` prints and Perfetto opens. Once a model is loaded, the
 * device's counters (`neuronish ls/top`) are published to <run dir>/<pid>.json every
 * 0.5 s (NEURONISH_RUN_DIR, else $XDG_RUNTIME_DIR/neuronish, else /tmp/neuronish-<uid>:
 * a directory of the user's own, 0700; refused with one warning otherwise) and removed at
 * exit; NEURONISH_TELEMETRY=0 turns that off. A host that records and publishes these
 * itself (the Python runtime does) calls nr_host_observes() before opening a device: this
 * library then does neither. */
NR_API void nr_host_observes(void);
/* The model's name in profiles and `neuronish ls/top` (a NeuronOp's node name, say; by
 * default its output tensor names; at most 200 bytes kept, never half a UTF-8 character;
 * bytes that are not UTF-8 are written as U+FFFD). It may be called at any time, also
 * while other threads call the model: calls that start after it name the model by it.
 * NR_INVALID_ARGUMENT for a NULL model or label. */
NR_API nr_status nr_model_set_label(nr_model *model, const char *label);
/* A number no other model of this process has had (0 for NULL): profile spans carry it as
 * args.model_id, which tells apart models that share a label. */
NR_API uint64_t nr_model_id(const nr_model *model);

/* For tests: the native engine spec the loader built for instruction `index` (flat, over
 * all cores) of the model's first copy: its int64 list and its floats (as engine.cc reads
 * them). NR_UNSUPPORTED if the engine was not given that instruction (nothing to compute). */
NR_API nr_status nr_model_instruction_spec(const nr_model *model, size_t index,
                                           const int64_t **ints, size_t *num_ints,
                                           const double **floats, size_t *num_floats);
/* For tests: the OpenMP team instruction `index` runs on (as nr_model_instruction_spec
 * counts it): 0 when the engine was not given it, -1 for a NULL model or an index out of
 * range. */
NR_API int32_t nr_model_instruction_team(const nr_model *model, size_t index);

/* For tests: the Linux thread id of the thread that last ran stage `stage` (the program
 * of core `stage` of the group) of copy `copy`: its core's host thread, or a caller that
 * found a single-stage model's core idle. 0 before the stage first ran, -1 for a NULL
 * model or an index out of range. */
NR_API int64_t nr_model_stage_thread(const nr_model *model, size_t copy, size_t stage);

/* For tests: how many runs of copy `copy` computed on its one-thread twin (a copy of a
 * single-stage program whose team is wide runs the same program built for one thread,
 * on one CPU, when other calls hold or wait for the host's CPUs; docs/c-api.md). -1 for
 * a NULL model or a copy out of range. */
NR_API int64_t nr_model_narrow_runs(const nr_model *model, size_t copy);

/* ---- Profiles recorded on demand, for a host that observes for itself ------------------
 * A host that records its own profile (the Python runtime: runtime/profiler.py) has this
 * library record its models' spans too and takes them into its trace. While recording,
 * every model's calls record the spans NEURONISH_PROFILE records: call, queue, execute,
 * each engine instruction (one clock read each), whenever the model was loaded. A call
 * recorded runs on the model's program, never on its one-thread twin (a model loaded
 * while recording gets none). Off, a call pays one relaxed atomic load, and the engine
 * reads no clock. Any thread may call these, with calls in flight: a span that ends after
 * nr_profile_stop took the spans is not recorded. */

/* Start recording, discarding spans recorded and not taken. NR_INVALID_ARGUMENT (the
 * message names the variable) when this library records for NEURONISH_PROFILE itself:
 * that trace has one writer, at exit. */
NR_API nr_status nr_profile_start(char *error, size_t error_size);
/* Stop recording and take the spans recorded since nr_profile_start: *spans is set to
 * NUL-terminated JSON (*size bytes, the NUL not counted) that the caller frees with
 * nr_profile_free, of the form
 *   {"clock": "CLOCK_MONOTONIC", "dropped_events": N, "spans": [
 *     {"name": "execute", "cat": "execute", "track": "device cores [0]: <model>",
 *      "start": S, "end": S, "args": {"model": "<model>", "batch": 2}},
 *     {"name": "call", "cat": "call", "track": "host (thread 1234)", "thread": 1234, ...},
 *     {"name": "conv2d", "cat": "instruction", ..., "args": {"tf": [...], "engine": "native",
 *      "parts": [[...]]}}, ...]}
 * `start`/`end` in seconds of CLOCK_MONOTONIC (clock_gettime; Python's time.perf_counter
 * on Linux); `track` the track's name; `thread` (host tracks only) the Linux thread id of
 * the calling thread, so a host can name the track as it names that thread. Not
 * recording: an empty "spans". NR_INVALID_ARGUMENT for NULL spans or size, or while this
 * library records for NEURONISH_PROFILE; NR_OUT_OF_MEMORY (nothing taken, recording
 * stopped) when the JSON cannot be built. */
NR_API nr_status nr_profile_stop(char **spans, size_t *size, char *error, size_t error_size);
/* Free what nr_profile_stop returned; NULL is allowed. */
NR_API void nr_profile_free(char *spans);
/* 1 while this library records a profile (on demand or for NEURONISH_PROFILE), else 0. */
NR_API int nr_profile_recording(void);

#ifdef __cplusplus
}
#endif
#endif /* NEURONISH_RUNTIME_H */
