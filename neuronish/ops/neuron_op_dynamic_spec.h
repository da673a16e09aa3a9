// The `dynamic_shapes` attr of a NeuronOp with free dimensions (docs/contracts.md; written by
// neuronish.shape_specialize.DynamicSpec), read by the native kernel: per input, its free
// axes with their bounds and where they come from, and the compiler flags. With a strict,
// depth-bounded reader of the JSON it is written in (the attr is untrusted input, and
// TensorFlow's headers bring no JSON reader). Included by neuron_op_native.cc only.
#ifndef NEURONISH_OPS_NEURON_OP_DYNAMIC_SPEC_H_
#define NEURONISH_OPS_NEURON_OP_DYNAMIC_SPEC_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace neuronish {
namespace {

// -- the dynamic_shapes attr (JSON written by neuronish.shape_specialize.DynamicSpec) ------

// A JSON value: what the attr needs of JSON (TensorFlow's headers bring no JSON reader).
struct Json {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = kNull;
  double number = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json* Member(const std::string& key) const {
    for (const auto& m : members) {
      if (m.first == key) return &m.second;
    }
    return nullptr;
  }
};

// A strict reader of one JSON document; nesting is bounded (the attr is untrusted input).
class JsonReader {
 public:
  explicit JsonReader(const std::string& s) : s_(s) {}

  bool Read(Json* out, std::string* error) {
    if (!Value(out, 0)) {
      *error = absl::StrCat(why_, " at byte ", at_);
      return false;
    }
    Space();
    if (at_ != s_.size()) {
      *error = absl::StrCat("text after the JSON value at byte ", at_);
      return false;
    }
    return true;
  }

 private:
  static constexpr int kMaxDepth = 32;

  bool Fail(const char* why) {
    why_ = why;
    return false;
  }
  void Space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\n' || s_[at_] == '\t' ||
                               s_[at_] == '\r')) {
      ++at_;
    }
  }
  bool Literal(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(at_, n, word) != 0) return Fail("an unknown literal");
    at_ += n;
    return true;
  }

  bool Value(Json* out, int depth) {
    if (depth > kMaxDepth) return Fail("nesting deeper than 32");
    Space();
    if (at_ >= s_.size()) return Fail("the end of the text where a value was due");
    const char c = s_[at_];
    if (c == '{') return Object(out, depth);
    if (c == '[') return Array(out, depth);
    if (c == '"') {
      out->kind = Json::kString;
      return String(&out->text);
    }
    if (c == 't' || c == 'f') {
      out->kind = Json::kBool;
      out->number = c == 't';
      return Literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') return Literal("null");
    return Number(out);
  }

  bool Number(Json* out) {
    const char* begin = s_.c_str() + at_;
    char* end = nullptr;
    out->kind = Json::kNumber;
    out->number = std::strtod(begin, &end);
    if (end == begin) return Fail("not a value");
    at_ += static_cast<size_t>(end - begin);
    return true;
  }

  static void Utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool Hex4(uint32_t* cp) {
    if (at_ + 4 > s_.size()) return Fail("a \\u escape cut short");
    *cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[at_++];
      const int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (v < 0) return Fail("a \\u escape with a non-hex digit");
      *cp = *cp * 16 + static_cast<uint32_t>(v);
    }
    return true;
  }

  bool String(std::string* out) {
    ++at_;  // the opening quote
    while (at_ < s_.size() && s_[at_] != '"') {
      const char c = s_[at_++];
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (at_ >= s_.size()) break;
      const char e = s_[at_++];
      static const std::string kFrom = "\"\\/bfnrt", kTo = "\"\\/\b\f\n\r\t";
      const size_t k = kFrom.find(e);
      if (k != std::string::npos) {
        *out += kTo[k];
        continue;
      }
      if (e != 'u') return Fail("an unknown escape");
      uint32_t cp = 0;
      if (!Hex4(&cp)) return false;
      if (cp >= 0xD800 && cp < 0xDC00) {  // a surrogate pair (Python escapes non-BMP so)
        uint32_t low = 0;
        if (s_.compare(at_, 2, "\\u") != 0) return Fail("a lone surrogate");
        at_ += 2;
        if (!Hex4(&low) || low < 0xDC00 || low >= 0xE000) return Fail("a lone surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
      }
      Utf8(cp, out);
    }
    if (at_ >= s_.size()) return Fail("an unterminated string");
    ++at_;
    return true;
  }

  // The items of an array or the members of an object, after its opening bracket:
  // `item` reads one, then a ',' continues and `close` ends it.
  template <typename Item>
  bool Items(char close, const char* unclosed, Item item) {
    ++at_;
    Space();
    if (at_ < s_.size() && s_[at_] == close) return ++at_, true;
    while (true) {
      if (!item()) return false;
      Space();
      if (at_ < s_.size() && s_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < s_.size() && s_[at_] == close) return ++at_, true;
      return Fail(unclosed);
    }
  }

  bool Array(Json* out, int depth) {
    out->kind = Json::kArray;
    return Items(']', "an array not closed by ']'", [&] {
      out->items.emplace_back();
      return Value(&out->items.back(), depth + 1);
    });
  }

  bool Object(Json* out, int depth) {
    out->kind = Json::kObject;
    return Items('}', "an object not closed by '}'", [&] {
      Space();
      if (at_ >= s_.size() || s_[at_] != '"') return Fail("an object key that is not a string");
      out->members.emplace_back();
      if (!String(&out->members.back().first)) return false;
      Space();
      if (at_ >= s_.size() || s_[at_] != ':') return Fail("a key without ':'");
      ++at_;
      return Value(&out->members.back().second, depth + 1);
    });
  }

  const std::string& s_;
  size_t at_ = 0;
  const char* why_ = "";
};

// The attr value of an executable stored in the SavedModel's assets (neuronish/external.py).
constexpr char kExternalPrefix[] = "neuronish-external:v1:";

// One free dimension of an input: its axis and bounds, and where the bounds come from.
struct FreeDim {
  int axis;
  int64_t low, high;
  std::string why;
};

// An executable compiled ahead and stored in the SavedModel's assets: the op's input shapes
// it was compiled at, and the external reference naming its file.
struct StoredShape {
  std::vector<std::vector<int64_t>> shapes;
  std::string executable;
};

// The attr: per op input, its free dimensions and how messages name it; the compiler
// flags the op was compiled with; the executables stored for the shapes compiled ahead.
struct DynamicSpec {
  std::vector<std::vector<FreeDim>> free;
  std::vector<std::string> labels;
  std::vector<std::string> compiler_args;
  std::vector<StoredShape> stored;

  // `ranks`: each input's rank, from the op's shape attrs.
  static absl::Status Parse(const std::string& text, const std::string& where,
                            const std::vector<int>& ranks, DynamicSpec* out) {
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "its dynamic_shapes attr is not what neuronish writes (", what,
          "); recompile the model"));
    };
    Json root;
    std::string error;
    if (!JsonReader(text).Read(&root, &error)) return bad("not JSON: " + error);
    const Json* version = root.Member("version");
    if (root.kind != Json::kObject || !version || version->number != 1) {
      return bad("version 1 expected");
    }
    const Json* inputs = root.Member("inputs");
    const Json* args = root.Member("compiler_args");
    if (!inputs || inputs->kind != Json::kArray || inputs->items.size() != ranks.size()) {
      return bad(absl::StrCat("'inputs' must list the op's ", ranks.size(), " input(s)"));
    }
    if (!args || args->kind != Json::kArray) return bad("'compiler_args' must be a list");
    for (const Json& a : args->items) {
      if (a.kind != Json::kString) return bad("'compiler_args' must hold strings");
      out->compiler_args.push_back(a.text);
    }
    for (size_t i = 0; i < ranks.size(); ++i) {
      const Json& in = inputs->items[i];
      const Json* label = in.kind == Json::kObject ? in.Member("label") : nullptr;
      const Json* free = in.kind == Json::kObject ? in.Member("free") : nullptr;
      if (!label || label->kind != Json::kString || !free || free->kind != Json::kObject) {
        return bad(absl::StrCat("inputs[", i, "] needs a 'label' string and a 'free' object"));
      }
      out->labels.push_back(label->text);
      out->free.emplace_back();
      for (const auto& [key, b] : free->members) {
        char* end = nullptr;
        const long axis = std::strtol(key.c_str(), &end, 10);
        const bool ok = !key.empty() && *end == '\0' && axis >= 0 && axis < ranks[i] &&
                        b.kind == Json::kArray && b.items.size() == 3 &&
                        b.items[0].kind == Json::kNumber && b.items[1].kind == Json::kNumber &&
                        b.items[2].kind == Json::kString && b.items[0].number >= 0 &&
                        b.items[0].number <= b.items[1].number && b.items[1].number < 1e15;
        if (!ok) {
          return bad(absl::StrCat("inputs[", i, "] free axis '", key, "' must map an axis below ",
                                  ranks[i], " to [low, high, why] with 0 <= low <= high"));
        }
        out->free.back().push_back(FreeDim{static_cast<int>(axis),
                                           static_cast<int64_t>(b.items[0].number),
                                           static_cast<int64_t>(b.items[1].number),
                                           b.items[2].text});
      }
    }
    const Json* stored = root.Member("stored");  // (absent: nothing compiled ahead)
    if (stored && stored->kind != Json::kArray) return bad("'stored' must be a list");
    for (size_t k = 0; stored && k < stored->items.size(); ++k) {
      const Json& s = stored->items[k];
      const Json* shapes = s.kind == Json::kObject ? s.Member("shapes") : nullptr;
      const Json* exe = s.kind == Json::kObject ? s.Member("executable") : nullptr;
      if (!exe || exe->kind != Json::kString ||
          exe->text.compare(0, sizeof kExternalPrefix - 1, kExternalPrefix) != 0) {
        return bad(absl::StrCat("stored[", k, "] needs an 'executable' external reference (",
                                kExternalPrefix, "...)"));
      }
      StoredShape entry{{}, exe->text};
      bool ok = shapes && shapes->kind == Json::kArray && shapes->items.size() == ranks.size();
      for (size_t i = 0; ok && i < ranks.size(); ++i) {
        const Json& shape = shapes->items[i];
        ok = shape.kind == Json::kArray && shape.items.size() == static_cast<size_t>(ranks[i]);
        entry.shapes.emplace_back();
        for (size_t d = 0; ok && d < shape.items.size(); ++d) {
          const Json& n = shape.items[d];
          ok = n.kind == Json::kNumber && n.number >= 0 && n.number < 1e15 &&
               n.number == static_cast<double>(static_cast<int64_t>(n.number));
          entry.shapes.back().push_back(ok ? static_cast<int64_t>(n.number) : 0);
        }
      }
      if (!ok) {
        return bad(absl::StrCat("stored[", k, "] 'shapes' must give each of the op's ",
                                ranks.size(), " input(s) a shape of its rank in sizes >= 0"));
      }
      out->stored.push_back(std::move(entry));
    }
    return absl::OkStatus();
  }
};

}  // namespace
}  // namespace neuronish

#endif  // NEURONISH_OPS_NEURON_OP_DYNAMIC_SPEC_H_
