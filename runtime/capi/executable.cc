// Reading and validating an executable: the C twin of runtime/executable.py's
// from_bytes and runtime/validate.py's check_executable (docs/executable-format.md).
//
// An executable is untrusted input. The body is first read by the bounded msgpack
// reader (msgpack_reader.h), then every field is checked before anything is built
// from it, with the same rules validate.py applies and the same leniencies
// from_bytes has (Python iterates what it calls tuple() on, so the helpers below accept
// what Python's tuple() and dict() accept), so both loaders accept the same files;
// tests/runtime/test_c_api.py checks that on fuzzed mutants. Instruction attributes are
// checked against isa_table.h, generated from runtime/isa.py at build time.
// Not checked yet (docs/c-api.md): the kinds' shape rules (isa.py's Python functions
// that derive output types from input types and check axes, windows, perms).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <tuple>

#include "executable.h"
#include "isa_table.h"
#include "msgpack_reader.h"
#include "sha256.h"
#include "shape_rules.h"

namespace nr {
namespace {

using mp::Node;
using mp::Type;

constexpr uint32_t kFormatVersion = 1;
constexpr int kNumDTypes = sizeof(isa::kDTypes) / sizeof(isa::kDTypes[0]);
constexpr int kNumKinds = sizeof(isa::kKinds) / sizeof(isa::kKinds[0]);

[[noreturn]] void refuse(const std::string &what, nr_status status = NR_INVALID_EXECUTABLE) {
  throw Refused{status, what};
}

// validate.py's _fail: the body parsed but its contents disagree.
[[noreturn]] void inconsistent(const std::string &what) {
  refuse("executable is inconsistent: " + what +
         ". It was not written by a compatible neuronish-cc; recompile the model");
}

// from_bytes's malformed-body error (Python: a KeyError/TypeError/ValueError).
[[noreturn]] void malformed(const std::string &field, const std::string &what) {
  refuse("executable body is malformed: " + what + " (field '" + field +
         "'); it was not written by a compatible neuronish-cc");
}

std::string i128(__int128 v) {
  if (v == 0) return "0";
  bool neg = v < 0;
  unsigned __int128 u = neg ? -(unsigned __int128)v : (unsigned __int128)v;
  std::string s;
  while (u) { s += char('0' + int(u % 10)); u /= 10; }
  if (neg) s += '-';
  return {s.rbegin(), s.rend()};
}

// A short, bounded rendering of a value for messages (Python's repr, roughly).
std::string show(const Node &n, int depth = 0) {
  switch (n.type) {
    case Type::Nil: return "None";
    case Type::Bool: return n.boolean ? "True" : "False";
    case Type::Int: return i128(n.integer);
    case Type::Float: { char b[40]; snprintf(b, sizeof b, "%g", n.real); return b; }
    case Type::Str: {
      size_t cut = std::min<size_t>(n.size, 40);
      while (cut < n.size && cut > 0 && (n.data[cut] & 0xC0) == 0x80) --cut;  // whole characters
      std::string s(n.str().substr(0, cut));
      for (char &c : s) if (uint8_t(c) < 0x20) c = '?';
      return "'" + s + (cut < n.size ? "...'" : "'");
    }
    case Type::Bin: return "b<" + std::to_string(n.size) + " bytes>";
    case Type::Ext: return "ext<" + std::to_string(n.ext_type) + ">";
    case Type::Array: case Type::Map: {
      bool map = n.type == Type::Map;
      if (depth > 1) return map ? "{...}" : "[...]";
      std::string s = map ? "{" : "[";
      size_t step = map ? 2 : 1;
      for (size_t i = 0; i < n.items.size() && i < 8 * step; i += step) {
        if (i) s += ", ";
        s += show(n.items[i], depth + 1);
        if (map) s += ": " + show(n.items[i + 1], depth + 1);
      }
      if (n.items.size() > 8 * step) s += ", ...";
      return s + (map ? "}" : "]");
    }
  }
  return "?";
}

bool is_int(const Node &n) { return n.type == Type::Int; }  // Python: int, never bool
bool is_count(const Node &n) { return is_int(n) && n.integer >= 0; }
bool is_num(const Node &n) { return n.type == Type::Int || n.type == Type::Float; }

// Python's truth value of a decoded msgpack object.
bool truthy(const Node &n) {
  switch (n.type) {
    case Type::Nil: return false;
    case Type::Bool: return n.boolean;
    case Type::Int: return n.integer != 0;
    case Type::Float: return n.real != 0;
    case Type::Str: case Type::Bin: return n.size != 0;
    case Type::Array: case Type::Map: return !n.items.empty();
    case Type::Ext: return true;
  }
  return true;
}

// Python's `==` between a decoded object and an int.
bool equals_int(const Node &n, int64_t v) {
  if (n.type == Type::Int) return n.integer == v;
  if (n.type == Type::Float) return n.real == double(v) && double(v) == n.real;
  if (n.type == Type::Bool) return int64_t(n.boolean) == v;
  return false;
}

class Body {
 public:
  // What Python's tuple(x) gives for a decoded object: a list's items, a map's keys, a
  // string's characters, a bin's bytes (as ints); anything else is a TypeError.
  std::vector<const Node *> items(const Node &n, const std::string &field) {
    std::vector<const Node *> out;
    if (n.type == Type::Array) {
      for (const Node &c : n.items) out.push_back(&c);
    } else if (n.type == Type::Map) {
      for (size_t i = 0; i < n.items.size(); i += 2) out.push_back(&n.items[i]);
    } else if (n.type == Type::Str) {
      for (size_t i = 0; i < n.size;) {
        size_t len = 1;
        uint8_t c = n.data[i];
        if (c >= 0xF0) len = 4; else if (c >= 0xE0) len = 3; else if (c >= 0xC0) len = 2;
        Node &ch = synth_.emplace_back();
        ch.type = Type::Str; ch.data = n.data + i; ch.size = len;
        out.push_back(&ch);
        i += len;
      }
    } else if (n.type == Type::Bin) {
      for (size_t i = 0; i < n.size; ++i) {
        Node &b = synth_.emplace_back();
        b.type = Type::Int; b.integer = n.data[i];
        out.push_back(&b);
      }
    } else {
      malformed(field, show(n) + " is not a list");
    }
    return out;
  }

  // What dict(x) gives: a map's entries, or a list of two-item sequences.
  std::vector<std::pair<const Node *, const Node *>> pairs(const Node &n,
                                                           const std::string &field) {
    std::vector<std::pair<const Node *, const Node *>> out;
    if (n.type == Type::Map) {
      for (size_t i = 0; i < n.items.size(); i += 2) out.emplace_back(&n.items[i], &n.items[i + 1]);
      return out;
    }
    for (const Node *item : items(n, field)) {
      if (item->type == Type::Int) malformed(field, "an entry " + show(*item) + " is not a pair");
      auto kv = items(*item, field);
      if (kv.size() != 2) malformed(field, "an entry " + show(*item) + " is not a pair");
      out.emplace_back(kv[0], kv[1]);
    }
    return out;
  }

 private:
  std::deque<Node> synth_;  // characters and bytes items() made into objects
};

const Node &key(const Node &map, const char *name, const std::string &field) {
  if (map.type != Type::Map) malformed(field, show(map) + " is not a map");
  const Node *v = map.get(name);
  if (!v) malformed(field.empty() ? name : field + "." + name, "missing");
  return *v;
}

int dtype_index(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (name == isa::kDTypes[i].name) return i;
  return -1;
}

int64_t item_size(int dtype) { return isa::kDTypes[dtype].itemsize; }

// isa.nbytes, saturated above what any limit compares against (Python's ints are exact).
__int128 nbytes(const std::vector<int64_t> &shape, int dtype) {
  for (int64_t d : shape) if (d == 0) return 0;
  __int128 n = item_size(dtype);
  for (int64_t d : shape) n = std::min<__int128>(n * d, (__int128)1 << 80);
  return n;
}

// A signature's name as validate.py quotes it (repr of an ordinary str): whole, since
// graph tensor names run long, with control characters shown as '?' (a NUL would end the
// message).
std::string quoted_name(std::string_view name) {
  std::string s(name);
  for (char &c : s) if (uint8_t(c) < 0x20) c = '?';
  return "'" + s + "'";
}

// A shape as Python prints a list of ints, and a type as validate.py does: float32[2, 3].
std::string shape_text(const TensorType &t) {
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

std::string type_text(const TensorType &t) { return isa::kDTypes[t.dtype].name + shape_text(t); }

// isa.check_type on a shape (already a sequence of objects) and a dtype object.
TensorType check_type(const std::vector<const Node *> &shape, const Node &dtype,
                      const std::string &what) {
  int d = dtype.type == Type::Str ? dtype_index(dtype.str()) : -1;
  if (d < 0) inconsistent(what + ": dtype " + show(dtype) + " is not a device dtype (field 'dtype')");
  TensorType t;
  t.dtype = d;
  if (int64_t(shape.size()) > isa::kMaxRank)
    inconsistent(what + ": shape has " + std::to_string(shape.size()) + " dims, more than " +
                 std::to_string(isa::kMaxRank) + " (field 'shape')");
  for (const Node *dim : shape) {
    if (!is_int(*dim) || dim->integer < 0 || dim->integer > isa::kMaxDim)
      inconsistent(what + ": shape dim " + show(*dim) + " is not in [0, " +
                   std::to_string(isa::kMaxDim) + "] (field 'shape')");
    t.shape.push_back(int64_t(dim->integer));
  }
  if (nbytes(t.shape, d) > isa::kMaxValueBytes)
    inconsistent(what + ": a " + type_text(t) + " tensor is larger than the " +
                 std::to_string(isa::kMaxValueBytes >> 30) + " GiB one value may hold (field 'shape')");
  return t;
}

// The compiler writes numpy dtype names; np.dtype() also reads these spellings.
int numpy_dtype(const Node &n) {
  if (n.type == Type::Nil) return dtype_index("float64");  // np.dtype(None)
  if (n.type != Type::Str) return -1;
  static const std::pair<const char *, const char *> aliases[] = {
      {"int", "int64"}, {"float", "float64"}, {"double", "float64"}, {"half", "float16"},
      {"single", "float32"}, {"f2", "float16"}, {"f4", "float32"}, {"f8", "float64"},
      {"i1", "int8"}, {"i2", "int16"}, {"i4", "int32"}, {"i8", "int64"}, {"u1", "uint8"},
      {"b1", "bool"}, {"?", "bool"}};
  std::string_view s = n.str();
  int d = dtype_index(s);
  if (d >= 0) return d;
  if (s.size() == 1 && s[0] == '\0') return dtype_index("bool");  // numpy reads "\0" as bool
  for (auto &[alias, name] : aliases)
    if (s == alias) return dtype_index(name);
  return -2;  // a dtype numpy may know but the device does not have
}

// runtime/executable.py's _array: frombuffer(data, dtype).reshape(shape).
Constant read_constant(const Node &raw, const uint8_t *body, const std::string &field) {
  const Node &shape = key(raw, "shape", field);
  const Node &dtype = key(raw, "dtype", field);
  const Node &data = key(raw, "data", field);
  Constant c;
  int d = numpy_dtype(dtype);
  if (d == -1) malformed(field + ".dtype", show(dtype) + " is not a dtype");
  if (d == -2) inconsistent(field + ": dtype " + show(dtype) + " is not a device dtype (field 'dtype')");
  if (data.type != Type::Bin) malformed(field + ".data", show(data) + " is not bytes");
  if (data.size % item_size(d)) malformed(field + ".data", std::to_string(data.size) +
                                          " bytes are not whole " + isa::kDTypes[d].name + " items");
  int64_t count = int64_t(data.size / item_size(d));
  std::vector<__int128> dims;
  if (shape.type == Type::Nil) {
    dims.push_back(count);
  } else if (shape.type == Type::Int) {
    dims.push_back(shape.integer);
  } else if (shape.type == Type::Array) {
    for (const Node &x : shape.items) {
      if (!is_int(x)) malformed(field + ".shape", show(x) + " is not an integer");
      dims.push_back(x.integer);
    }
  } else {
    malformed(field + ".shape", show(shape) + " is not a shape");
  }
  int unknown = -1;
  __int128 known = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      if (unknown >= 0) malformed(field + ".shape", "more than one unknown dim");
      unknown = int(i);
    } else {
      known = std::min<__int128>(known * dims[i], (__int128)1 << 80);
    }
  }
  if (unknown >= 0) {
    if (known == 0 || count % known) malformed(field + ".shape", "cannot reshape " +
                                               std::to_string(count) + " items into " + show(shape));
    dims[unknown] = count / known;
  } else if (known != count) {
    malformed(field + ".shape", "cannot reshape " + std::to_string(count) + " items into " + show(shape));
  }
  if (dims.size() > size_t(isa::kMaxRank))
    inconsistent(field + ": shape has " + std::to_string(dims.size()) + " dims (field 'shape')");
  for (__int128 x : dims) {
    if (x > isa::kMaxDim) inconsistent(field + ": shape dim " + i128(x) + " is too large (field 'shape')");
    c.type.shape.push_back(int64_t(x));
  }
  c.type.dtype = d;
  c.data_offset = size_t(data.data - body);
  c.data_bytes = data.size;
  return c;
}

// validate.py's _plain: JSON-like data, nested at most 8 deep.
bool plain(const Node &n, int depth = 0) {
  if (depth > 8) return false;
  switch (n.type) {
    case Type::Nil: case Type::Bool: case Type::Int: case Type::Float: case Type::Str: return true;
    case Type::Array:
      for (const Node &c : n.items) if (!plain(c, depth + 1)) return false;
      return true;
    case Type::Map:
      for (size_t i = 0; i < n.items.size(); i += 2)
        if ((n.items[i].type != Type::Str && n.items[i].type != Type::Int) ||
            !plain(n.items[i + 1], depth + 1))
          return false;
      return true;
    default: return false;
  }
}

void check_metadata(const Node &compiler, const Node *stats, Executable &exe) {
  if (compiler.type != Type::Map || !plain(compiler))
    inconsistent("its 'compiler' field is not a map of plain data (field 'compiler')");
  if (stats && (stats->type != Type::Map || !plain(*stats)))
    inconsistent("its 'stats' field is not a map of plain data (field 'stats')");
  const Node *options = compiler.get("options");
  if (options && options->type != Type::Map)
    inconsistent("its compiler options are not a map (field 'compiler.options')");
  struct Known { const Node *fields; const char *name; Type want; const char *where; };
  const Known known[] = {
      {&compiler, "name", Type::Str, "compiler"}, {&compiler, "version", Type::Str, "compiler"},
      {options, "auto_cast", Type::Str, "compiler.options"},
      {options, "auto_cast_type", Type::Str, "compiler.options"},
      {options, "pipeline_cores", Type::Int, "compiler.options"},
      {options, "command_line", Type::Array, "compiler.options"},
      {options, "output_names", Type::Array, "compiler.options"},
      {options, "disabled_passes", Type::Array, "compiler.options"}};
  for (const Known &k : known) {
    const Node *v = k.fields ? k.fields->get(k.name) : nullptr;
    if (v && v->type != k.want)
      inconsistent(std::string(k.where) + " " + k.name + " is " + show(*v) + ", not of its type (field '" +
                   k.where + "." + k.name + "')");
  }
  if (const Node *v = compiler.get("name")) exe.compiler_name = std::string(v->str());
  if (const Node *v = compiler.get("version")) exe.compiler_version = std::string(v->str());
}

// `what` is validate.py's word for the signature ("input" or "output"), `field` its place
// in the body ("inputs[0]"): messages are Python's with the field named.
Signature read_sig(const Node &raw, Body &b, const std::string &what, const std::string &field) {
  // from_bytes reads every key before validate.py looks at any.
  const Node &name = key(raw, "name", field), &value = key(raw, "value", field);
  const Node &shape = key(raw, "shape", field), &dtype = key(raw, "dtype", field);
  const Node &batch = key(raw, "batch_axis", field);
  b.items(shape, field + ".shape");  // from_bytes's tuple(shape): a TypeError if not a sequence
  Signature s;
  if (name.type != Type::Str) inconsistent(what + " name " + show(name) + " is not a string (field '" + field + ".name')");
  s.name = std::string(name.str());
  if (!is_int(value)) inconsistent(what + " " + quoted_name(name.str()) + " names value " + show(value) +
                                   ", which is not a value id (field '" + field + ".value')");
  s.value = value.integer < 0 ? UINT64_MAX : uint64_t(value.integer);  // negative: never defined
  // The type is compared with its value's in check_sig, once the values are known.
  s.batch_axis = is_int(batch) && batch.integer >= -1 && batch.integer <= isa::kMaxRank ?
                 int64_t(batch.integer) : INT64_MIN;
  (void)dtype;  // read here so a missing key is refused as from_bytes does
  return s;
}

struct RawSig { const Node *raw; std::vector<const Node *> shape; };

// The type a signature declares, as validate.py prints it: the dtype bare when it is a
// string (shown as show() shows one, shortened and without control characters, less the
// quotes), and the list of its dims.
std::string declared_text(const RawSig &raw) {
  const Node &dtype = *raw.raw->get("dtype");
  std::string s = show(dtype);
  if (dtype.type == Type::Str) s = s.substr(1, s.size() - 2);
  s += "[";
  for (size_t i = 0; i < raw.shape.size(); ++i) s += (i ? ", " : "") + show(*raw.shape[i]);
  return s + "]";
}

void check_sig(Signature &s, const RawSig &raw, const Executable &exe, const std::string &what,
               const std::string &field, bool allow_const) {
  std::string where = what + " " + quoted_name(s.name);
  const TensorType *t = nullptr;
  if (auto it = exe.values.find(s.value); it != exe.values.end()) t = &it->second;
  else if (auto c = exe.constants.find(s.value); allow_const && c != exe.constants.end()) t = &c->second.type;
  if (!t) inconsistent(where + " names value %" + (s.value == UINT64_MAX ? std::string("<negative>") :
                       std::to_string(s.value)) + ", which the file does not define (field '" + field + ".value')");
  const Node &dtype = *raw.raw->get("dtype");
  const bool same_dtype = dtype.type == Type::Str && dtype.str() == isa::kDTypes[t->dtype].name;
  bool same_shape = raw.shape.size() == t->shape.size();
  for (size_t i = 0; same_shape && i < raw.shape.size(); ++i) same_shape = equals_int(*raw.shape[i], t->shape[i]);
  if (!same_dtype || !same_shape)
    inconsistent(where + " is " + declared_text(raw) + " but its value %" + std::to_string(s.value) + " is " +
                 type_text(*t) + " (field '" + field + (same_dtype ? ".shape')" : ".dtype')"));
  s.type = *t;
  int64_t rank = int64_t(t->shape.size());
  if (s.batch_axis == INT64_MIN || s.batch_axis >= std::max<int64_t>(rank, 1))
    inconsistent(where + " has batch axis " + show(*raw.raw->get("batch_axis")) + " for shape " +
                 shape_text(*t) + " (field '" + field + ".batch_axis')");
}

// isa.Spec.check for one attribute value.
bool int_ok(const Node &x, const isa::Attr &a) {
  return is_int(x) && x.integer >= a.lo && x.integer <= a.hi;
}
bool list_ok(const Node &v, const isa::Attr &a, bool (*item)(const Node &, const isa::Attr &)) {
  if (v.type != Type::Array || int64_t(v.items.size()) > isa::kMaxRank) return false;
  if (a.length >= 0 && int64_t(v.items.size()) != a.length) return false;
  for (const Node &x : v.items) if (!item(x, a)) return false;
  return true;
}
bool num_ok(const Node &v) {
  return v.type == Type::Float || (is_int(v) && v.integer <= isa::kMaxDim && v.integer >= -isa::kMaxDim);
}
bool attr_ok(const Node &v, const isa::Attr &a) {
  switch (a.spec) {
    case isa::Spec::Int: return int_ok(v, a);
    case isa::Spec::Num: return num_ok(v);
    case isa::Spec::Bool: return v.type == Type::Bool;
    case isa::Spec::Choice:
      if (v.type != Type::Str) return false;
      for (int i = 0; i < a.num_choices; ++i) if (v.str() == a.choices[i]) return true;
      return false;
    case isa::Spec::Ints: return list_ok(v, a, int_ok);
    case isa::Spec::OptInts:
      return list_ok(v, a, [](const Node &x, const isa::Attr &at) {
        return x.type == Type::Nil || int_ok(x, at); });
    case isa::Spec::IntPairs:
      return list_ok(v, a, [](const Node &p, const isa::Attr &at) {
        return p.type == Type::Array && p.items.size() == 2 && int_ok(p.items[0], at) &&
               int_ok(p.items[1], at); });
    case isa::Spec::Scalar: return v.type == Type::Bool || num_ok(v);
  }
  return false;
}

// isa.check without the shape rule: arity, then every attribute against the schema.
void check_attrs(const isa::Kind &kind, size_t num_inputs, const Node &attrs, const std::string &where) {
  bool arity = kind.variadic ? num_inputs >= 1 :
      int(num_inputs) >= kind.inputs && int(num_inputs) <= kind.inputs + kind.optional;
  if (!arity) inconsistent(where + ": " + kind.name + " takes " +
                           (kind.variadic ? std::string("one or more") : std::to_string(kind.inputs) +
                            (kind.optional ? " to " + std::to_string(kind.inputs + kind.optional) : "")) +
                           " inputs, got " + std::to_string(num_inputs) + " (field 'in')");
  for (size_t i = 0; i < attrs.items.size(); i += 2) {
    const Node &k = attrs.items[i];
    bool found = false;
    for (int a = 0; a < kind.num_attrs && !found; ++a) found = k.is_str(kind.attrs[a].name);
    if (!found) inconsistent(where + ": " + kind.name + " has no attribute " + show(k) +
                             " (field 'attrs." + (k.type == Type::Str ? std::string(k.str()) : show(k)) + "')");
  }
  for (int a = 0; a < kind.num_attrs; ++a) {
    const isa::Attr &attr = kind.attrs[a];
    const Node *v = attrs.get(attr.name);
    if (!v) {
      if (attr.required) inconsistent(where + ": " + kind.name + " needs attribute '" + attr.name +
                                      "' (" + attr.describe + ") (field 'attrs." + attr.name + "')");
      continue;
    }
    if (!attr_ok(*v, attr)) inconsistent(where + ": attribute " + attr.name + "=" + show(*v) +
                                         " is not " + attr.describe + " (field 'attrs." + attr.name + "')");
  }
}

const isa::Kind *find_kind(const Node &kind) {
  if (kind.type != Type::Str) return nullptr;
  for (int k = 0; k < kNumKinds; ++k) if (kind.str() == isa::kKinds[k].name) return &isa::kKinds[k];
  return nullptr;
}

uint64_t id_of(const Node &n) { return uint64_t(n.integer); }  // callers checked is_count

const TensorType &value_type(const Executable &exe, uint64_t vid) {
  auto it = exe.values.find(vid);
  return it != exe.values.end() ? it->second : exe.constants.at(vid).type;
}

// validate.py's _check_instruction, for the kinds whose shape rule is ported: the
// output types the rule derives must be the declared ones.
void check_types(const isa::Kind &kind, const Instruction &ins, const Node &attrs,
                 const Executable &exe, const std::string &where) {
  std::vector<TensorType> in, derived, declared;
  for (uint64_t v : ins.inputs) in.push_back(value_type(exe, v));
  for (uint64_t v : ins.outputs) declared.push_back(value_type(exe, v));
  try {
    if (!derive_types(kind.name, in, attrs, derived))
      refuse(std::string("the shape rule of ") + kind.name + " is missing from this build", NR_INTERNAL);
  } catch (const RuleError &e) {
    bool attr = false;
    for (int a = 0; a < kind.num_attrs; ++a) attr = attr || e.field == kind.attrs[a].name;
    inconsistent(where + ": " + e.reason + " (field '" + (attr ? "attrs." : "") + e.field + "')");
  }
  bool same = declared.size() == derived.size();
  for (size_t i = 0; same && i < declared.size(); ++i)
    same = declared[i].shape == derived[i].shape && declared[i].dtype == derived[i].dtype;
  if (!same) {
    std::string d, g;
    for (auto &t : declared) d += (d.empty() ? "" : ", ") + type_text(t);
    for (auto &t : derived) g += (g.empty() ? "" : ", ") + type_text(t);
    inconsistent(where + " declares outputs " + (d.empty() ? "none" : d) + " but its inputs and attributes give " +
                 g + " (field 'out')");
  }
}

void read_programs(const Node &programs, Body &b, Executable &exe, const std::set<uint64_t> &external) {
  std::set<uint64_t> defined;
  for (auto &s : exe.inputs) defined.insert(s.value);
  for (auto &[vid, c] : exe.constants) defined.insert(vid);
  size_t index = 0;
  auto cores = b.items(programs, "programs");
  for (size_t core = 0; core < cores.size(); ++core) {
    std::string pfield = "programs[" + std::to_string(core) + "]";
    auto program = b.items(*cores[core], pfield);
    exe.programs.emplace_back();
    for (size_t n = 0; n < program.size(); ++n, ++index) {
      std::string field = pfield + "[" + std::to_string(n) + "]";
      const Node &raw = *program[n];
      const Node &kind = key(raw, "kind", field), &in = key(raw, "in", field);
      const Node &out = key(raw, "out", field), &attrs = key(raw, "attrs", field);
      const Node &scratch = key(raw, "scratch", field), &tf = key(raw, "tf", field);
      auto ins = b.items(in, field + ".in");
      auto outs = b.items(out, field + ".out");
      std::vector<const Node *> scratch_items;
      if (truthy(scratch)) scratch_items = b.items(scratch, field + ".scratch");
      auto sources = b.items(tf, field + ".tf");
      Instruction ins_out;
      bool named = std::all_of(sources.begin(), sources.end(),
                               [](const Node *s) { return s->type == Type::Str; });
      std::string where = "instruction " + std::to_string(index) + " (#" + std::to_string(n) +
                          " of core " + std::to_string(core) + ", " + show(kind) + ", from TF node(s) ";
      if (named) {
        for (size_t i = 0; i < sources.size(); ++i) {
          where += (i ? ", " : "") + std::string(sources[i]->str());
          ins_out.source.emplace_back(sources[i]->str());
        }
      } else {
        where += "?";
      }
      where += ")";
      if (!named) inconsistent(where + " names its TF nodes " + show(tf) + ", not strings (field 'tf')");
      const isa::Kind *k = find_kind(kind);
      if (!k) refuse(where + ": instruction kind " + show(kind) + " is not one this runtime has "
                     "(docs/isa.md); upgrade neuronish or recompile the model with this version "
                     "(field 'kind')", NR_UNSUPPORTED);
      ins_out.kind = k->name;
      if (attrs.type != Type::Map) inconsistent(where + " has attrs " + show(attrs) + ", not a map (field 'attrs')");
      for (const Node *v : ins) {
        if (!is_count(*v) || !defined.count(id_of(*v)))
          inconsistent(where + " reads value %" + show(*v) + ", which is not an input, a constant "
                       "or the output of an earlier instruction (field 'in')");
        ins_out.inputs.push_back(id_of(*v));
      }
      for (const Node *v : outs) {
        if (!is_count(*v) || !exe.values.count(id_of(*v)) || defined.count(id_of(*v)))
          inconsistent(where + " writes value %" + show(*v) + ", which is " +
                       (is_count(*v) && defined.count(id_of(*v)) ? "an input, a constant or written earlier"
                                                                 : "not defined") + " (field 'out')");
        uint64_t vid = id_of(*v);
        if (!external.count(vid) && !exe.offsets.count(vid))
          inconsistent(where + " writes value %" + std::to_string(vid) +
                       ", which has no place in the arena (field 'out')");
        defined.insert(vid);
        ins_out.outputs.push_back(vid);
      }
      if (truthy(scratch)) {
        bool ok = scratch_items.size() == 2 && is_count(*scratch_items[0]) && is_count(*scratch_items[1]) &&
                  scratch_items[0]->integer + scratch_items[1]->integer <= (__int128)exe.arena_bytes;
        if (!ok) inconsistent(where + " has scratch " + show(scratch) + " outside the " +
                              std::to_string(exe.arena_bytes) + "-byte arena (field 'scratch')");
        ins_out.has_scratch = true;
        ins_out.scratch_offset = id_of(*scratch_items[0]);
        ins_out.scratch_bytes = id_of(*scratch_items[1]);
      }
      check_attrs(*k, ins.size(), attrs, where);
      ins_out.attrs = &attrs;
      if (k->native_rule) check_types(*k, ins_out, attrs, exe, where);
      exe.programs.back().push_back(std::move(ins_out));
    }
  }
}

// validate.py's _check_overlaps: no two arena buffers in use at once share bytes.
void check_overlaps(const Executable &exe) {
  std::map<uint64_t, std::pair<size_t, size_t>> spans;
  std::map<uint64_t, uint64_t> shares;  // a reshape's output on its input's bytes -> that buffer
  struct Buffer { size_t first, last; uint64_t start, end; std::string what; };
  std::vector<Buffer> buffers;
  auto bytes = [&](uint64_t v) { return nbytes(exe.values.at(v).shape, exe.values.at(v).dtype); };
  // validate.py's _aliasing_reshape: the same bytes under other dims (cc/memory.py).
  auto aliasing = [&](const Instruction &ins) {
    if (ins.kind != "reshape" || ins.inputs.size() != 1 || ins.outputs.size() != 1) return false;
    uint64_t x = ins.inputs[0], y = ins.outputs[0];
    auto ox = exe.offsets.find(x), oy = exe.offsets.find(y);
    return ox != exe.offsets.end() && oy != exe.offsets.end() && ox->second == oy->second &&
           bytes(x) == bytes(y);
  };
  // validate.py's _in_place_residual: a convolution writing over its residual's bytes,
  // whose life then ends before the instruction (a later reader overlaps the output).
  auto in_place = [&](const Instruction &ins) {
    if ((ins.kind != "conv2d" && ins.kind != "conv2d_int8") || ins.inputs.size() < 3 ||
        ins.outputs.size() != 1 || !ins.attrs)
      return false;
    const Node *residual = ins.attrs->get("residual");
    if (!residual || !truthy(*residual)) return false;
    uint64_t r = ins.inputs.back(), y = ins.outputs[0];
    auto orr = exe.offsets.find(r), oy = exe.offsets.find(y);
    return orr != exe.offsets.end() && oy != exe.offsets.end() && orr->second == oy->second &&
           bytes(r) == bytes(y) &&
           std::find(ins.inputs.begin(), ins.inputs.end() - 1, r) == ins.inputs.end() - 1;
  };
  size_t t = 0;
  for (auto &program : exe.programs)
    for (auto &ins : program) {
      size_t reads = in_place(ins) ? ins.inputs.size() - 1 : ins.inputs.size();
      for (size_t k = 0; k < reads; ++k) {
        uint64_t v = ins.inputs[k];
        if (auto s = shares.find(v); s != shares.end()) v = s->second;
        if (auto it = spans.find(v); it != spans.end()) it->second.second = t;
      }
      if (aliasing(ins)) {
        auto s = shares.find(ins.inputs[0]);
        shares[ins.outputs[0]] = s != shares.end() ? s->second : ins.inputs[0];
        ++t;
        continue;
      }
      for (uint64_t v : ins.outputs) if (exe.offsets.count(v)) spans[v] = {t, t};
      if (ins.has_scratch && ins.scratch_bytes)
        buffers.push_back({t, t, ins.scratch_offset, ins.scratch_offset + ins.scratch_bytes,
                           "the scratch of instruction " + std::to_string(t)});
      ++t;
    }
  for (auto &[vid, span] : spans) {
    uint64_t start = exe.offsets.at(vid);
    uint64_t end = start + uint64_t(nbytes(exe.values.at(vid).shape, exe.values.at(vid).dtype));
    if (end > start) buffers.push_back({span.first, span.second, start, end, "value %" + std::to_string(vid)});
  }
  std::sort(buffers.begin(), buffers.end(), [](const Buffer &a, const Buffer &b) {
    return std::tie(a.first, a.last, a.start, a.end, a.what) < std::tie(b.first, b.last, b.start, b.end, b.what);
  });
  std::vector<const Buffer *> live;
  for (const Buffer &buf : buffers) {
    live.erase(std::remove_if(live.begin(), live.end(), [&](const Buffer *b) { return b->last < buf.first; }),
               live.end());
    for (const Buffer *o : live)
      if (o->start < buf.end && buf.start < o->end)
        inconsistent("the memory plan puts " + buf.what + " (bytes " + std::to_string(buf.start) + ".." +
                     std::to_string(buf.end) + ") over " + o->what + " (bytes " + std::to_string(o->start) +
                     ".." + std::to_string(o->end) + ") while both are in use (field 'memory.offsets')");
    live.push_back(&buf);
  }
}

void parse_body(const uint8_t *body, size_t size, Executable &exe) {
  Node &root = exe.tree;  // kept: the engine spec encoder reads the attributes later
  std::string error;
  if (!mp::parse(body, size, root, error)) malformed("body", error);
  Body b;
  // from_bytes's reads, in its order: every key it needs must be there.
  const Node &compiler = key(root, "compiler", "");
  const Node &inputs = key(root, "inputs", ""), &outputs = key(root, "outputs", "");
  const Node &constants = key(root, "constants", ""), &values = key(root, "values", "");
  const Node &memory = key(root, "memory", "");
  const Node &arena = key(memory, "arena_bytes", "memory");
  const Node &offsets = key(memory, "offsets", "memory");
  const Node &programs = key(root, "programs", "");
  const Node *stats = root.get("stats");

  std::vector<RawSig> raw_in, raw_out;
  for (auto [list, raws, sigs, name, what] :
       {std::tuple{&inputs, &raw_in, &exe.inputs, "inputs", "input"},
        std::tuple{&outputs, &raw_out, &exe.outputs, "outputs", "output"}}) {
    auto items = b.items(*list, name);
    for (size_t i = 0; i < items.size(); ++i) {
      std::string field = std::string(name) + "[" + std::to_string(i) + "]";
      const Node &raw = *items[i];
      sigs->push_back(read_sig(raw, b, what, field));
      raws->push_back({&raw, b.items(*raw.get("shape"), field + ".shape")});
    }
  }
  // Constants and values as Python dicts: a repeated id keeps the last entry.
  std::map<uint64_t, std::pair<const Node *, const Node *>> value_raw;
  auto const_items = b.items(constants, "constants");
  for (size_t i = 0; i < const_items.size(); ++i) {
    std::string field = "constants[" + std::to_string(i) + "]";
    const Node &vid = key(*const_items[i], "value", field);
    Constant c = read_constant(*const_items[i], body, field);
    if (!is_count(vid)) inconsistent("constant id " + show(vid) + " is not a value id (field '" + field + ".value')");
    exe.constants[id_of(vid)] = c;
  }
  auto value_items = b.items(values, "values");
  for (size_t i = 0; i < value_items.size(); ++i) {
    std::string field = "values[" + std::to_string(i) + "]";
    auto parts = b.items(*value_items[i], field);
    if (parts.size() != 3) malformed(field, show(*value_items[i]) + " is not [value, shape, dtype]");
    b.items(*parts[1], field + ".shape");  // tuple(shape) happens at read time
    if (!is_count(*parts[0])) inconsistent("value id " + show(*parts[0]) + " is not a value id (field '" + field + "')");
    value_raw[id_of(*parts[0])] = {parts[1], parts[2]};
  }
  std::vector<std::pair<const Node *, const Node *>> offset_pairs = b.pairs(offsets, "memory.offsets");
  b.items(programs, "programs");

  check_metadata(compiler, stats, exe);
  if (!is_count(arena)) inconsistent("arena size " + show(arena) + " is not a byte count (field 'memory.arena_bytes')");
  // Any u64 is a byte count here (validate.py's rule); whether it fits is the device's
  // question at load time. Sums below are computed in 128 bits.
  exe.arena_bytes = id_of(arena);
  if (!truthy(programs)) inconsistent("it holds no program (field 'programs')");
  for (auto &[vid, raw] : value_raw)
    exe.values[vid] = check_type(b.items(*raw.first, "values.shape"), *raw.second, "value %" + std::to_string(vid));
  for (auto &[vid, c] : exe.constants) {
    if (exe.values.count(vid)) inconsistent("value %" + std::to_string(vid) + " is both a constant and computed (field 'constants')");
    std::vector<Node> dims(c.type.shape.size());
    std::vector<const Node *> ptrs;
    for (size_t i = 0; i < dims.size(); ++i) { dims[i].type = Type::Int; dims[i].integer = c.type.shape[i]; ptrs.push_back(&dims[i]); }
    Node dtype;
    dtype.type = Type::Str;
    dtype.data = reinterpret_cast<const uint8_t *>(isa::kDTypes[c.type.dtype].name);
    dtype.size = std::strlen(isa::kDTypes[c.type.dtype].name);
    check_type(ptrs, dtype, "constant %" + std::to_string(vid));
  }
  uint64_t limit = exe.values.size() + exe.constants.size();
  uint64_t big = 0;
  bool any = false;
  for (auto &[vid, t] : exe.values) { big = std::max(big, vid); any = true; }
  for (auto &[vid, c] : exe.constants) { big = std::max(big, vid); any = true; }
  if (any && big >= limit) inconsistent("value id %" + std::to_string(big) + " is out of range (the file holds " +
                                        std::to_string(limit) + " values) (field 'values')");
  for (size_t i = 0; i < exe.inputs.size(); ++i) check_sig(exe.inputs[i], raw_in[i], exe, "input", "inputs[" + std::to_string(i) + "]", false);
  for (size_t i = 0; i < exe.outputs.size(); ++i) check_sig(exe.outputs[i], raw_out[i], exe, "output", "outputs[" + std::to_string(i) + "]", true);
  std::set<uint64_t> in_ids, out_ids;
  for (auto &s : exe.inputs) in_ids.insert(s.value);
  for (auto &s : exe.outputs) out_ids.insert(s.value);
  if (in_ids.size() != exe.inputs.size()) inconsistent("two inputs share one value (field 'inputs')");
  if (out_ids.size() != exe.outputs.size()) inconsistent("two outputs share one value (field 'outputs')");
  std::set<uint64_t> external = in_ids;
  external.insert(out_ids.begin(), out_ids.end());
  // dict(offsets): a repeated value keeps the last offset.
  std::map<uint64_t, const Node *> placed;
  for (auto &[vid, off] : offset_pairs) {
    if (!is_count(*vid) || !exe.values.count(id_of(*vid)))
      inconsistent("the memory plan places value %" + show(*vid) + ", which the file does not define (field 'memory.offsets')");
    placed[id_of(*vid)] = off;
  }
  for (auto &[vid, off] : placed) {
    if (external.count(vid)) inconsistent("the memory plan places value %" + std::to_string(vid) +
                                          ", an input or output, in the arena (field 'memory.offsets')");
    __int128 bytes = nbytes(exe.values[vid].shape, exe.values[vid].dtype);
    if (!is_count(*off) || off->integer + bytes > (__int128)exe.arena_bytes)
      inconsistent("the memory plan places value %" + std::to_string(vid) + " (" + i128(bytes) + " bytes) at offset " +
                   show(*off) + ", outside the " + std::to_string(exe.arena_bytes) + "-byte arena (field 'memory.offsets')");
    exe.offsets[vid] = id_of(*off);
  }
  read_programs(programs, b, exe, external);
  check_overlaps(exe);
  std::set<uint64_t> produced;
  for (auto &p : exe.programs) for (auto &ins : p) produced.insert(ins.outputs.begin(), ins.outputs.end());
  for (auto &s : exe.outputs)
    if (!exe.constants.count(s.value) && !produced.count(s.value))
      inconsistent("output '" + s.name + "' (value %" + std::to_string(s.value) +
                   ") is never written by any instruction (field 'outputs')");
}

// Bytes as Python's repr() writes them (b'...'), so the magic is named in Python's words.
std::string bytes_repr(const uint8_t *data, size_t size) {
  bool single = std::memchr(data, '\'', size) == nullptr || std::memchr(data, '"', size) != nullptr;
  char quote = single ? '\'' : '"';
  std::string out = std::string("b") + quote;
  for (size_t i = 0; i < size; ++i) {
    uint8_t c = data[i];
    if (c == quote || c == '\\') out += std::string("\\") + char(c);
    else if (c == '\t') out += "\\t";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c >= 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else out += char(c);
  }
  return out + quote;
}

}  // namespace

uint64_t check_header(const uint8_t *data, size_t size, uint32_t &version) {
  if (size < kHeaderSize)
    refuse("executable is truncated: " + std::to_string(size) + " bytes, but the header alone is 56 (field 'header')");
  if (std::memcmp(data, "NRNISHEX", 8) != 0)
    refuse("not a neuronish executable: magic " + bytes_repr(data, 8) + ", expected b'NRNISHEX' (field 'header.magic')");
  auto u32 = [&](size_t at) { uint32_t v = 0; for (int i = 3; i >= 0; --i) v = v << 8 | data[at + i]; return v; };
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = length << 8 | data[16 + i];
  version = u32(8);
  if (version > kFormatVersion)
    refuse("executable format version " + std::to_string(version) + " is newer than this runtime reads (up to " +
           std::to_string(kFormatVersion) + "); upgrade neuronish or recompile with this version (field 'header.version')",
           NR_UNSUPPORTED);
  if (version < 1)
    refuse("executable format version 0 does not exist (versions are 1 to " + std::to_string(kFormatVersion) +
           "); the file is corrupt or not written by neuronish-cc: recompile the model (field 'header.version')");
  if (u32(12) != 0)
    refuse("executable header's reserved field is " + std::to_string(u32(12)) + ", expected 0; the file is corrupt "
           "or not written by neuronish-cc: recompile the model (field 'header.reserved')");
  return length;
}

void check_digest(const uint8_t *header, const uint8_t digest[32]) {
  if (std::memcmp(digest, header + 24, 32) != 0)
    refuse("executable checksum mismatch: the file is corrupt (recompile it or copy it again) (field 'header.sha256')");
}

void parse_executable(const uint8_t *data, size_t size, Executable &exe) {
  uint64_t length = check_header(data, size, exe.version);
  if (size - kHeaderSize != length)
    refuse("executable is truncated or padded: the header says the body has " + std::to_string(length) +
           " bytes, the file has " + std::to_string(size - kHeaderSize) + " (field 'header.length')");
  uint8_t digest[32];
  sha256(data + kHeaderSize, size - kHeaderSize, digest);
  check_digest(data, digest);
  exe.body.assign(data + kHeaderSize, data + size);
  parse_body(exe.body.data(), exe.body.size(), exe);
}

void parse_checked_body(uint32_t version, std::vector<uint8_t> &&body, Executable &exe) {
  exe.version = version;
  exe.body = std::move(body);
  parse_body(exe.body.data(), exe.body.size(), exe);
}

}  // namespace nr
