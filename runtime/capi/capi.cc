// The C entry points (runtime/include/neuronish_runtime.h): loading, queries, unloading.
// No global mutable state: every error goes to the caller's buffer, every executable
// is immutable once loaded, so concurrent calls on distinct or shared handles are safe.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "executable.h"
#include "handles.h"
#include "sha256.h"
#include "isa_table.h"

namespace {

constexpr size_t kMaxFileBytes = size_t(1) << 40;  // runtime/executable.py's MAX_FILE_BYTES

using nr::report;

// The C views the queries return, built once so queries never allocate.
void build_views(nr::Executable &exe) {
  size_t dims = 0;
  for (auto *sigs : {&exe.inputs, &exe.outputs})
    for (auto &s : *sigs) dims += s.type.shape.size();
  exe.shape_storage.reserve(dims);  // never reallocated below: the pointers stay valid
  for (auto [sigs, infos] : {std::pair{&exe.inputs, &exe.input_info},
                             std::pair{&exe.outputs, &exe.output_info}}) {
    for (auto &s : *sigs) {
      nr_tensor_info info;
      info.name = s.name.c_str();
      info.dtype = nr_dtype(s.type.dtype);
      info.dtype_name = nr::isa::kDTypes[s.type.dtype].name;
      info.rank = s.type.shape.size();
      info.shape = exe.shape_storage.data() + exe.shape_storage.size();
      exe.shape_storage.insert(exe.shape_storage.end(), s.type.shape.begin(), s.type.shape.end());
      info.batch_axis = s.batch_axis;
      infos->push_back(info);
    }
  }
}

using nr::guarded;

// A handle for the executable `fill` reads and validates into it; *out is NULL on failure.
template <class Fill>
nr_status make_executable(nr_executable **out, char *error, size_t error_size, Fill fill) {
  nr_executable *handle = nullptr;
  nr_status status = guarded(error, error_size, [&] {
    auto h = std::make_unique<nr_executable>();
    h->exe = std::make_shared<nr::Executable>();
    fill(*h->exe);
    build_views(*h->exe);
    handle = h.release();
  });
  *out = handle;
  return status;
}

std::string errno_text(int e) { return std::strerror(e); }  // thread-safe in glibc for known errnos

// `n` bytes of the file at `offset` into `into`; NR_OK, or the error reported.
nr_status read_at(int fd, uint8_t *into, size_t n, size_t offset, const std::string &where, char *error,
                  size_t error_size) {
  for (size_t done = 0; done < n;) {
    ssize_t got = pread(fd, into + done, n - done, off_t(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return report(NR_IO_ERROR, "cannot read " + where + ": " + errno_text(errno), error, error_size);
    if (got == 0) return report(NR_IO_ERROR, where + " shrank while it was read", error, error_size);
    done += size_t(got);
  }
  return NR_OK;
}

// `check()`, its refusal preceded by `prefix`.
template <class Check>
void named_refusal(const std::string &prefix, Check check) {
  try {
    check();
  } catch (nr::Refused &r) {
    r.message.insert(0, prefix);
    throw;
  }
}

}  // namespace

extern "C" {

uint32_t nr_api_version(void) { return NR_API_VERSION; }

void nr_sha256(const void *data, size_t size, uint8_t digest[32]) {
  nr::sha256(static_cast<const uint8_t *>(data), size, digest);
}
uint32_t nr_format_version(void) { return 1; }

const char *nr_dtype_name(nr_dtype dtype) {
  int n = sizeof(nr::isa::kDTypes) / sizeof(nr::isa::kDTypes[0]);
  return int(dtype) >= 0 && int(dtype) < n ? nr::isa::kDTypes[dtype].name : nullptr;
}

const char *nr_status_name(nr_status status) {
  switch (status) {
    case NR_OK: return "ok";
    case NR_INVALID_ARGUMENT: return "invalid argument";
    case NR_IO_ERROR: return "I/O error";
    case NR_INVALID_EXECUTABLE: return "invalid executable";
    case NR_UNSUPPORTED: return "unsupported";
    case NR_OUT_OF_MEMORY: return "out of memory";
    case NR_INTERNAL: return "internal error";
    case NR_INVALID_CONFIG: return "invalid configuration";
    case NR_DEVICE_ERROR: return "device error";
    case NR_OUT_OF_DEVICE_MEMORY: return "out of device memory";
    case NR_INVALID_INPUT: return "invalid input";
    case NR_EXECUTION_ERROR: return "execution error";
    case NR_CANCELLED: return "cancelled";
    case NR_DEADLINE_EXCEEDED: return "deadline exceeded";
  }
  return "unknown status";
}

nr_status nr_executable_load_bytes(const void *data, size_t size, nr_executable **out,
                                   char *error, size_t error_size) {
  if (!out) return report(NR_INVALID_ARGUMENT, "out is NULL", error, error_size);
  *out = nullptr;
  if (!data && size) return report(NR_INVALID_ARGUMENT, "data is NULL", error, error_size);
  static const uint8_t empty = 0;
  const uint8_t *bytes = data ? static_cast<const uint8_t *>(data) : &empty;
  return make_executable(out, error, error_size,
                         [&](nr::Executable &exe) { nr::parse_executable(bytes, size, exe); });
}

nr_status nr_executable_load_file(const char *path, nr_executable **out, char *error, size_t error_size) {
  if (!out) return report(NR_INVALID_ARGUMENT, "out is NULL", error, error_size);
  *out = nullptr;
  if (!path) return report(NR_INVALID_ARGUMENT, "path is NULL", error, error_size);
  std::string where = std::string("executable ") + path;
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // O_NONBLOCK: a FIFO cannot hang us
  if (fd < 0) return report(NR_IO_ERROR, "cannot open " + where + ": " + errno_text(errno), error, error_size);
  struct Closer { int fd; ~Closer() { close(fd); } } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) return report(NR_IO_ERROR, "cannot stat " + where + ": " + errno_text(errno), error, error_size);
  if (!S_ISREG(st.st_mode)) return report(NR_IO_ERROR, where + " is not a regular file", error, error_size);
  size_t size = size_t(st.st_size);
  if (size > kMaxFileBytes) return report(NR_IO_ERROR, where + " is larger than 1 TiB", error, error_size);
  // The header first: a file whose size disagrees with it is refused before the body is read.
  uint8_t head[nr::kHeaderSize];
  ssize_t got = pread(fd, head, sizeof head, 0);
  if (got < 0) return report(NR_IO_ERROR, "cannot read " + where + ": " + errno_text(errno), error, error_size);
  // Its refusals name the file, as runtime.executable.read_file's do, in the same words.
  std::string named = std::string("executable file '") + path + "': ";
  uint32_t version = 0;
  nr_status status = guarded(error, error_size, [&] {
    named_refusal(named, [&] {
      uint64_t length = nr::check_header(head, size_t(got), version);
      if (length != size - nr::kHeaderSize)
        throw nr::Refused{NR_INVALID_EXECUTABLE, "executable is truncated or padded: the header says the body has " +
                          std::to_string(length) + " bytes, the file has " + std::to_string(size - nr::kHeaderSize) +
                          " (field 'header.length')"};
    });
  });
  if (status != NR_OK) return status;
  // The body is read once, into the buffer the executable keeps, hashed a piece at a time
  // as it lands, and the digest of those bytes checked: the bytes parsed are the bytes the
  // header seals, whatever happens to the file meanwhile (nothing is read twice to
  // compare). The buffer is the header's length only once that equals the file's size
  // (above), so a header cannot make it larger than the file. When the host cannot hold
  // the body, the rest is hashed in one piece's memory without being kept, so a corrupt
  // file (gigabytes of a sparse one) is still refused as corrupt, a sound one as too large.
  size_t length = size - nr::kHeaderSize;
  constexpr size_t kPiece = size_t(1) << 20;
  std::vector<uint8_t> body;
  std::vector<uint8_t> piece;  // only when the body cannot be held
  bool held = true;
  try {
    body.resize(length);
  } catch (const std::bad_alloc &) {
    held = false;
    std::vector<uint8_t>().swap(body);
  }
  try {
    if (!held) piece.resize(length < kPiece ? length : kPiece);
  } catch (const std::bad_alloc &) {
    return report(NR_OUT_OF_MEMORY, "out of host memory reading " + where, error, error_size);
  }
  nr::Sha256 sealed;
  for (size_t done = 0; done < length;) {
    size_t n = length - done < kPiece ? length - done : kPiece;
    uint8_t *into = held ? body.data() + done : piece.data();
    if (nr_status s = read_at(fd, into, n, nr::kHeaderSize + done, where, error, error_size)) return s;
    sealed.update(into, n);
    done += n;
  }
  uint8_t digest[32];
  sealed.finish(digest);
  status = guarded(error, error_size, [&] { named_refusal(named, [&] { nr::check_digest(head, digest); }); });
  if (status != NR_OK) return status;
  if (!held)
    return report(NR_OUT_OF_MEMORY, "out of host memory reading " + where + ": its body has " +
                  std::to_string(length) + " bytes", error, error_size);
  // The body's refusals name the file too (a field of a sealed but malformed body).
  return make_executable(out, error, error_size, [&](nr::Executable &exe) {
    named_refusal(named, [&] { nr::parse_checked_body(version, std::move(body), exe); });
  });
}

void nr_executable_unload(nr_executable *exe) { delete exe; }

size_t nr_executable_num_tensors(const nr_executable *exe, nr_io which) {
  if (!exe) return 0;
  return which == NR_INPUT ? exe->exe->inputs.size() : which == NR_OUTPUT ? exe->exe->outputs.size() : 0;
}

nr_status nr_executable_tensor(const nr_executable *exe, nr_io which, size_t index, nr_tensor_info *info) {
  if (!exe || !info || (which != NR_INPUT && which != NR_OUTPUT)) return NR_INVALID_ARGUMENT;
  auto &infos = which == NR_INPUT ? exe->exe->input_info : exe->exe->output_info;
  if (index >= infos.size()) return NR_INVALID_ARGUMENT;
  *info = infos[index];
  return NR_OK;
}

uint32_t nr_executable_version(const nr_executable *exe) { return exe ? exe->exe->version : 0; }
size_t nr_executable_num_cores(const nr_executable *exe) { return exe ? exe->exe->programs.size() : 0; }

size_t nr_executable_num_instructions(const nr_executable *exe, size_t core) {
  return exe && core < exe->exe->programs.size() ? exe->exe->programs[core].size() : 0;
}

const char *nr_executable_instruction_kind(const nr_executable *exe, size_t core, size_t index) {
  if (!exe || core >= exe->exe->programs.size() || index >= exe->exe->programs[core].size()) return nullptr;
  return exe->exe->programs[core][index].kind.c_str();
}

uint64_t nr_executable_arena_bytes(const nr_executable *exe) { return exe ? exe->exe->arena_bytes : 0; }
size_t nr_executable_num_constants(const nr_executable *exe) { return exe ? exe->exe->constants.size() : 0; }

uint64_t nr_executable_constant_bytes(const nr_executable *exe) {
  uint64_t n = 0;
  if (exe) for (auto &[vid, c] : exe->exe->constants) n += c.data_bytes;
  return n;
}

const char *nr_executable_compiler_name(const nr_executable *exe) {
  return exe ? exe->exe->compiler_name.c_str() : "";
}
const char *nr_executable_compiler_version(const nr_executable *exe) {
  return exe ? exe->exe->compiler_version.c_str() : "";
}

}  // extern "C"
