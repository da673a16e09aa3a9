// A bounded msgpack reader for the executable's body (docs/executable-format.md).
//
// Why not a msgpack library: the native parts of neuronish are built by users from
// PyPI wheels only (runtime/native/library.py compiles engine.cc against the oneDNN
// wheel on first use); no wheel ships msgpack-c headers, and a system package
// (libmsgpack-cxx-dev) cannot be assumed. The body is also untrusted input, so the
// reader must enforce its own limits as it reads: a nesting depth, counts that the
// remaining bytes could actually hold (no allocation sized by a hostile header), strict
// UTF-8 in strings (what Python's msgpack.unpackb(raw=False) decodes), and no trailing
// bytes. What it reads is a tree of Nodes; strings and bins point into the caller's
// buffer, which must outlive the tree.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nr::mp {

enum class Type : uint8_t { Nil, Bool, Int, Float, Str, Bin, Array, Map, Ext };

struct Node {
  Type type = Type::Nil;
  bool boolean = false;
  __int128 integer = 0;          // Int: every msgpack integer (-2^63 .. 2^64-1) fits
  double real = 0;               // Float (float32 widened)
  const uint8_t *data = nullptr; // Str, Bin, Ext payload
  size_t size = 0;
  int8_t ext_type = 0;
  std::vector<Node> items;       // Array: elements; Map: key, value, key, value, ...

  std::string_view str() const { return {reinterpret_cast<const char *>(data), size}; }
  bool is_str(std::string_view s) const { return type == Type::Str && str() == s; }
  size_t map_size() const { return items.size() / 2; }
  // The value of key `key` in a Map (the last one, as a Python dict keeps), or nullptr.
  const Node *get(std::string_view key) const;
};

constexpr int kMaxDepth = 64;  // a valid body nests at most ~10 deep

// Parse `size` bytes as exactly one msgpack object. On failure returns false and sets
// `error` to what is wrong and at which byte offset.
bool parse(const uint8_t *data, size_t size, Node &out, std::string &error);

}  // namespace nr::mp
