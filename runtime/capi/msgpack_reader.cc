#include "msgpack_reader.h"

#include <cstring>

#include "utf8.h"

namespace nr::mp {

const Node *Node::get(std::string_view key) const {
  if (type != Type::Map) return nullptr;
  const Node *found = nullptr;
  for (size_t i = 0; i + 1 < items.size(); i += 2)
    if (items[i].is_str(key)) found = &items[i + 1];
  return found;
}

namespace {

using nr::valid_utf8;  // (utf8.h: strict, as Python decodes)

class Reader {
 public:
  Reader(const uint8_t *data, size_t size) : p_(data), size_(size) {}

  bool read(Node &out, int depth) {
    if (depth > kMaxDepth) return fail("nesting deeper than " + std::to_string(kMaxDepth));
    uint8_t b;
    if (!byte(b)) return false;
    if (b <= 0x7F) return set_int(out, b);
    if (b >= 0xE0) return set_int(out, int8_t(b));
    if (b <= 0x8F) return container(out, Type::Map, b & 0x0F, depth);
    if (b <= 0x9F) return container(out, Type::Array, b & 0x0F, depth);
    if (b <= 0xBF) return bytes(out, Type::Str, b & 0x1F);
    uint64_t n;
    switch (b) {
      case 0xC0: out.type = Type::Nil; return true;
      case 0xC2: case 0xC3: out.type = Type::Bool; out.boolean = b == 0xC3; return true;
      case 0xC4: return uint(1, n) && bytes(out, Type::Bin, n);
      case 0xC5: return uint(2, n) && bytes(out, Type::Bin, n);
      case 0xC6: return uint(4, n) && bytes(out, Type::Bin, n);
      case 0xC7: return uint(1, n) && ext(out, n);
      case 0xC8: return uint(2, n) && ext(out, n);
      case 0xC9: return uint(4, n) && ext(out, n);
      case 0xCA: {
        if (!uint(4, n)) return false;
        uint32_t u = uint32_t(n);
        float f;
        std::memcpy(&f, &u, 4);
        out.type = Type::Float; out.real = f;
        return true;
      }
      case 0xCB: {
        if (!uint(8, n)) return false;
        out.type = Type::Float;
        std::memcpy(&out.real, &n, 8);
        return true;
      }
      case 0xCC: return uint(1, n) && set_int(out, n);
      case 0xCD: return uint(2, n) && set_int(out, n);
      case 0xCE: return uint(4, n) && set_int(out, n);
      case 0xCF: return uint(8, n) && set_int(out, n);
      case 0xD0: return uint(1, n) && set_int(out, int8_t(n));
      case 0xD1: return uint(2, n) && set_int(out, int16_t(n));
      case 0xD2: return uint(4, n) && set_int(out, int32_t(n));
      case 0xD3: return uint(8, n) && set_int(out, int64_t(n));
      case 0xD4: return ext(out, 1);
      case 0xD5: return ext(out, 2);
      case 0xD6: return ext(out, 4);
      case 0xD7: return ext(out, 8);
      case 0xD8: return ext(out, 16);
      case 0xD9: return uint(1, n) && bytes(out, Type::Str, n);
      case 0xDA: return uint(2, n) && bytes(out, Type::Str, n);
      case 0xDB: return uint(4, n) && bytes(out, Type::Str, n);
      case 0xDC: return uint(2, n) && container(out, Type::Array, n, depth);
      case 0xDD: return uint(4, n) && container(out, Type::Array, n, depth);
      case 0xDE: return uint(2, n) && container(out, Type::Map, n, depth);
      case 0xDF: return uint(4, n) && container(out, Type::Map, n, depth);
      default: return fail("byte 0xc1 is not a msgpack type");
    }
  }

  size_t pos() const { return pos_; }
  const std::string &error() const { return error_; }

 private:
  bool fail(const std::string &what) {
    if (error_.empty()) error_ = what + " at byte " + std::to_string(pos_) + " of the body";
    return false;
  }
  bool byte(uint8_t &b) {
    if (pos_ >= size_) return fail("the body ends inside an object");
    b = p_[pos_++];
    return true;
  }
  bool uint(int width, uint64_t &n) {
    if (size_ - pos_ < size_t(width)) return fail("the body ends inside an object");
    n = 0;
    for (int i = 0; i < width; ++i) n = n << 8 | p_[pos_++];
    return true;
  }
  static bool set_int(Node &out, __int128 v) {
    out.type = Type::Int;
    out.integer = v;
    return true;
  }
  bool bytes(Node &out, Type type, uint64_t n) {
    if (n > size_ - pos_) return fail("a string or bin of " + std::to_string(n) +
                                      " bytes runs past the end");
    out.type = type;
    out.data = p_ + pos_;
    out.size = size_t(n);
    if (type == Type::Str && !valid_utf8(out.data, out.size))
      return fail("a string that is not valid UTF-8");
    pos_ += size_t(n);
    return true;
  }
  bool ext(Node &out, uint64_t n) {
    uint8_t t;
    if (!byte(t) || !bytes(out, Type::Ext, n)) return false;
    out.ext_type = int8_t(t);
    if (out.ext_type == -1) {  // a timestamp: Python's msgpack refuses other lengths
      if (n != 4 && n != 8 && n != 12) return fail("a timestamp of " + std::to_string(n) +
                                                   " bytes");
      uint64_t ns = 0;
      if (n == 8) ns = (uint64_t(out.data[0]) << 24 | uint64_t(out.data[1]) << 16 |
                        uint64_t(out.data[2]) << 8 | out.data[3]) >> 2;
      if (n == 12) ns = uint64_t(out.data[0]) << 24 | uint64_t(out.data[1]) << 16 |
                        uint64_t(out.data[2]) << 8 | out.data[3];
      if (ns > 999999999) return fail("a timestamp with more than 999999999 nanoseconds");
    }
    return true;
  }
  bool container(Node &out, Type type, uint64_t count, int depth) {
    uint64_t children = type == Type::Map ? 2 * count : count;
    // Every child takes at least one byte: a count the rest cannot hold is refused
    // before anything is allocated for it.
    if (children > size_ - pos_) return fail("a container of " + std::to_string(count) +
                                             " entries runs past the end");
    out.type = type;
    out.items.resize(size_t(children));
    for (size_t i = 0; i < children; ++i) {
      if (!read(out.items[i], depth + 1)) return false;
      if (type == Type::Map && i % 2 == 0 &&
          (out.items[i].type == Type::Array || out.items[i].type == Type::Map))
        return fail("a map key that is a list or a map (unhashable)");
    }
    return true;
  }

  const uint8_t *p_;
  size_t size_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace

bool parse(const uint8_t *data, size_t size, Node &out, std::string &error) {
  Reader r(data, size);
  if (!r.read(out, 0)) {
    error = r.error();
    return false;
  }
  if (r.pos() != size) {
    error = std::to_string(size - r.pos()) + " bytes follow the body's map";
    return false;
  }
  return true;
}

}  // namespace nr::mp
