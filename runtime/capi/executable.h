// The executable as the C runtime holds it once read and validated (executable.cc).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "../include/neuronish_runtime.h"
#include "msgpack_reader.h"

namespace nr {

struct TensorType {
  std::vector<int64_t> shape;
  int dtype = 0;  // index into isa::kDTypes == nr_dtype
};

struct Signature {
  std::string name;
  uint64_t value = 0;
  TensorType type;
  int64_t batch_axis = -1;
};

struct Instruction {
  std::string kind;
  std::vector<uint64_t> inputs, outputs;
  bool has_scratch = false;
  uint64_t scratch_offset = 0, scratch_bytes = 0;
  std::vector<std::string> source;  // TF node names
  const mp::Node *attrs = nullptr;  // the validated attribute map, inside Executable::tree
};

struct Constant {
  TensorType type;
  size_t data_offset = 0;  // into Executable::body
  size_t data_bytes = 0;
};

struct Executable {
  std::vector<uint8_t> body;  // owns the bytes constants point into
  mp::Node tree;              // the parsed body (attrs point into it; strings into body)
  uint32_t version = 0;
  std::string compiler_name, compiler_version;
  std::vector<Signature> inputs, outputs;
  std::map<uint64_t, TensorType> values;
  std::map<uint64_t, Constant> constants;
  uint64_t arena_bytes = 0;
  std::map<uint64_t, uint64_t> offsets;
  std::vector<std::vector<Instruction>> programs;
  // What the queries hand out: C views, built once at load.
  std::vector<int64_t> shape_storage;
  std::vector<nr_tensor_info> input_info, output_info;
};

// An error the C API returns: its status and message.
struct Refused {
  nr_status status;
  std::string message;
};

// Read and validate an executable (header and body); throws Refused.
void parse_executable(const uint8_t *data, size_t size, Executable &exe);
// The header's checks on its first bytes; returns the body length it declares.
uint64_t check_header(const uint8_t *data, size_t size, uint32_t &version);
// Refuses a body whose SHA-256 `digest` is not the one the header records.
void check_digest(const uint8_t *header, const uint8_t digest[32]);
// The body of a file read in pieces (nr_executable_load_file), its header, length and
// digest already checked: parsed and validated as parse_executable does, without a copy.
void parse_checked_body(uint32_t version, std::vector<uint8_t> &&body, Executable &exe);
constexpr size_t kHeaderSize = 56;

}  // namespace nr
