// Free dimensions in a host without Python: the native NeuronOp's side of
// neuronish/shape_specialize.py. An op whose `dynamic_shapes` attr is set holds the
// executable compiled at its probe shape and `graph_def` with the free dimensions (and the
// batch) unknown; each call's shape is served by an executable compiled for it:
//
// - the shape at `BatchFor` the call's batch if loaded; else the same shape at another
//   batch if loaded (the runtime splits or pads exactly: the compiler proved the subgraph
//   keeps samples apart);
// - else the shape is queued for the op's compile thread, which runs the compiler
//   (`$NEURONISH_CC`, else `neuronish-cc` on PATH) as a subprocess on `graph_def` with an
//   io-config at that shape, in a process group of its own (killed past kCompileTimeoutS
//   or when the op goes), and loads what it wrote. Meanwhile the call runs on TensorFlow
//   (the kernel's choice, with the runtime fallback on) or waits, honouring its deadline
//   and cancellation;
// - a shape whose compile or load failed is remembered and not compiled again;
// - at most NEURONISH_MAX_SHAPES (default 8) executables stay loaded per op, the least
//   recently used one not running unloaded first, and calls that do not wait queue at most
//   that many shapes.
//
// Unlike the Python host, the compiles are not shared through the compile cache (its
// entries are sealed with a key only the Python side holds): each process compiles a
// shape once. Included by neuron_op_native.cc only.
#ifndef NEURONISH_OPS_NEURON_OP_SHAPES_H_
#define NEURONISH_OPS_NEURON_OP_SHAPES_H_

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "neuronish_runtime.h"

extern char** environ;

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

  bool Array(Json* out, int depth) {
    out->kind = Json::kArray;
    ++at_;
    Space();
    if (at_ < s_.size() && s_[at_] == ']') return ++at_, true;
    while (true) {
      out->items.emplace_back();
      if (!Value(&out->items.back(), depth + 1)) return false;
      Space();
      if (at_ < s_.size() && s_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < s_.size() && s_[at_] == ']') return ++at_, true;
      return Fail("an array not closed by ']'");
    }
  }

  bool Object(Json* out, int depth) {
    out->kind = Json::kObject;
    ++at_;
    Space();
    if (at_ < s_.size() && s_[at_] == '}') return ++at_, true;
    while (true) {
      Space();
      if (at_ >= s_.size() || s_[at_] != '"') return Fail("an object key that is not a string");
      out->members.emplace_back();
      if (!String(&out->members.back().first)) return false;
      Space();
      if (at_ >= s_.size() || s_[at_] != ':') return Fail("a key without ':'");
      ++at_;
      if (!Value(&out->members.back().second, depth + 1)) return false;
      Space();
      if (at_ < s_.size() && s_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < s_.size() && s_[at_] == '}') return ++at_, true;
      return Fail("an object not closed by '}'");
    }
  }

  const std::string& s_;
  size_t at_ = 0;
  const char* why_ = "";
};

// One free dimension of an input: its axis and bounds, and where the bounds come from.
struct FreeDim {
  int axis;
  int64_t low, high;
  std::string why;
};

// The attr: per op input, its free dimensions and how messages name it; the compiler
// flags the op was compiled with.
struct DynamicSpec {
  std::vector<std::vector<FreeDim>> free;
  std::vector<std::string> labels;
  std::vector<std::string> compiler_args;

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
    return absl::OkStatus();
  }
};

// -- running the compiler ---------------------------------------------------------------

constexpr double kCompileTimeoutS = 600.0;  // as shape_specialize.COMPILE_TIMEOUT_S

inline std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// The compiler command: `$NEURONISH_CC` split as a shell splits words (quotes, backslash),
// else `neuronish-cc` on PATH, as neuronish.contracts.default_compiler finds it.
inline std::vector<std::string> CompilerCommand() {
  const char* env = std::getenv("NEURONISH_CC");
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (const char* p = env ? env : ""; *p; ++p) {
    const char c = *p;
    if (quote) {
      if (c == quote) {
        quote = 0;
      } else if (c == '\\' && quote == '"' && p[1]) {
        word += *++p;
      } else {
        word += c;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && p[1]) {
      word += *++p;
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  if (words.empty()) words.push_back("neuronish-cc");
  return words;
}

inline bool WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(f);
}

inline bool ReadFile(const std::string& path, std::string* bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream all;
  all << f.rdbuf();
  *bytes = all.str();
  return static_cast<bool>(f) || f.eof();
}

// A scratch directory removed with everything in it when this goes.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/neuronish-cc-XXXXXX";
    if (mkdtemp(pattern.data())) path_ = pattern;
  }
  ~ScratchDir() {
    if (path_.empty()) return;
    nftw(path_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) {
      std::remove(p);  // (best effort: what cannot go does not stop the rest)
      return 0;
    }, 16, FTW_DEPTH | FTW_PHYS);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The compiler's log, its last `limit` bytes (what a failed compile says is at its end).
inline std::string LogTail(const std::string& path, size_t limit = 1500) {
  std::string log;
  if (!ReadFile(path, &log)) return "(no log)";
  while (!log.empty() && (log.back() == '\n' || log.back() == ' ')) log.pop_back();
  return log.size() > limit ? "..." + log.substr(log.size() - limit) : log;
}

// Runs the compiler on `graph` with `io_config` and `args` in a process group of its own,
// killed past kCompileTimeoutS or once `stop` is set; the executable it wrote into
// `executable`. `what` names the shape in messages.
inline absl::Status RunCompiler(const std::string& what, const std::string& graph,
                                const std::string& io_config,
                                const std::vector<std::string>& args,
                                const std::atomic<bool>& stop, std::string* executable) {
  ScratchDir dir;
  if (dir.path().empty()) {
    return absl::InternalError(absl::StrCat(what, ": cannot make a scratch directory for the "
                                            "compiler under $TMPDIR or /tmp"));
  }
  const std::string graph_path = dir.path() + "/graph.pb", io_path = dir.path() + "/io-config.json",
                    out_path = dir.path() + "/executable.neff", log_path = dir.path() + "/compiler.log";
  if (!WriteFile(graph_path, graph) || !WriteFile(io_path, io_config)) {
    return absl::InternalError(absl::StrCat(what, ": cannot write the compiler's inputs to ",
                                            dir.path()));
  }
  std::vector<std::string> argv = CompilerCommand();
  argv.insert(argv.end(), {"compile", graph_path, "--framework", "TENSORFLOW", "--io-config", io_path,
                           "--output", out_path, "--workdir", dir.path()});
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);

  posix_spawn_file_actions_t files;
  posix_spawnattr_t attrs;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  posix_spawnattr_init(&attrs);
  posix_spawnattr_setflags(&attrs, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attrs, 0);  // (a group of its own: killed as a whole)
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, cargv[0], &files, &attrs, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attrs);
  if (spawned != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": cannot start the compiler '", argv[0], "': ", std::strerror(spawned),
        ". Set NEURONISH_CC to the neuronish-cc command (e.g. /path/to/venv/bin/neuronish-cc) "
        "or put neuronish-cc on PATH"));
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(kCompileTimeoutS);
  int status = 0;
  const char* killed = nullptr;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (stop.load(std::memory_order_relaxed)) killed = "the op was unloaded";
    if (std::chrono::steady_clock::now() > deadline) killed = "it ran past the time limit";
    if (killed) {
      killpg(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  killpg(pid, SIGKILL);  // (whatever it left running in its group)
  const std::string command = absl::StrCat("'", argv[0], " compile ...'");
  if (killed) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": the compiler ", command,
                                                    " was stopped: ", killed));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string how = WIFEXITED(status) ? absl::StrCat("exited with status ", WEXITSTATUS(status))
                                              : absl::StrCat("died of signal ", WTERMSIG(status));
    return absl::InternalError(absl::StrCat(what, ": the compiler ", command, " ", how, ": ",
                                            LogTail(log_path)));
  }
  if (!ReadFile(out_path, executable) || executable->empty()) {
    return absl::InternalError(absl::StrCat(what, ": the compiler ", command,
                                            " exited 0 but wrote no executable"));
  }
  return absl::OkStatus();
}

// -- the op's executables by shape --------------------------------------------------------

constexpr int64_t kMaxRuntimeBatch = 64;  // as shape_specialize.MAX_RUNTIME_BATCH

// The batch a shape is compiled at for a call of `calls` rows: the op's compiled batch for
// a call of that batch, else the next power of two, at most kMaxRuntimeBatch (as
// shape_specialize.batch_for: powers of two bound the executables per shape).
inline int64_t BatchFor(int64_t calls, int64_t compiled) {
  if (calls == compiled) return compiled;
  int64_t b = 1;
  while (b < calls && b < kMaxRuntimeBatch) b *= 2;
  return b;
}

// NEURONISH_MAX_SHAPES as shape_specialize.max_shapes reads it: at least 1, 8 if unset or
// not a number.
inline size_t MaxShapes() {
  const char* env = std::getenv("NEURONISH_MAX_SHAPES");
  char* end = nullptr;
  const long n = env ? std::strtol(env, &end, 10) : 8;
  if (!env || end == env || *end != '\0') return 8;
  return static_cast<size_t>(std::max(1L, n));
}

using Shapes = std::vector<std::vector<int64_t>>;

class ShapeTable {
 public:
  // One executable loaded, with its outputs' signature (valid until it is unloaded).
  struct Entry {
    nr_model* model = nullptr;
    std::vector<nr_tensor_info> outputs;
    int running = 0;
    uint64_t used = 0;
  };
  // Loads `bytes` on the device, labelled `label` (the kernel's loader: its duplicates).
  using Loader = std::function<absl::Status(const std::string& bytes, const std::string& label,
                                            nr_model** out)>;

  // `probe`: the op's loaded executable (owned from now on); `graph`: its subgraph.
  ShapeTable(std::string where, const std::string& node, DynamicSpec spec, nr_model* probe,
             std::string graph, Loader load)
      : where_(std::move(where)), spec_(std::move(spec)), graph_(std::move(graph)),
        load_(std::move(load)) {
    name_ = node.substr(node.rfind('/') == std::string::npos ? 0 : node.rfind('/') + 1);
    const nr_executable* exe = nr_model_executable(probe);
    std::set<int64_t> batches;
    Shapes shapes;
    for (size_t i = 0; i < nr_executable_num_tensors(exe, NR_INPUT); ++i) {
      nr_tensor_info info;
      nr_executable_tensor(exe, NR_INPUT, i, &info);
      inputs_.push_back(Input{info.name, info.dtype_name, {info.shape, info.shape + info.rank},
                              info.batch_axis});
      shapes.emplace_back(info.shape, info.shape + info.rank);
      if (info.batch_axis >= 0) batches.insert(info.shape[info.batch_axis]);
    }
    for (size_t i = 0; i < nr_executable_num_tensors(exe, NR_OUTPUT); ++i) {
      nr_tensor_info info;
      nr_executable_tensor(exe, NR_OUTPUT, i, &info);
      output_axes_.emplace_back(info.name, info.batch_axis);
    }
    // (an op without batch axes compiles and runs every shape at its fixed sizes)
    compiled_batch_ = batches.size() == 1 ? *batches.begin() : -1;
    Key key = MakeKey(shapes, compiled_batch_);
    nr_model_set_label(probe, Label(key).c_str());
    Insert(key, probe);
  }

  ~ShapeTable() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      queue_.clear();
    }
    stop_.store(true);
    if (worker_.joinable()) worker_.join();
    for (auto& [key, entry] : entries_) nr_model_unload(entry->model);
  }

  // Why a call at `shapes` is outside the op's bounds; empty if it is within.
  std::string OutOfBounds(const Shapes& shapes) const {
    for (size_t i = 0; i < spec_.free.size() && i < shapes.size(); ++i) {
      for (const FreeDim& f : spec_.free[i]) {
        const int64_t size = shapes[i][f.axis];
        if (size >= f.low && size <= f.high) continue;
        return absl::StrCat(where_, spec_.labels[i], " has size ", size, " in dimension ",
                            f.axis, "; the model accepts ", f.low, " to ", f.high,
                            " there (bound from ", f.why, "). Recompile with shape_bounds="
                            "{KEY: {AXIS: (LOW, HIGH)}} (neuronish compile --shape-bounds "
                            "KEY:AXIS=LOW:HIGH) to serve other sizes");
      }
    }
    return "";
  }

  // The executable to run a call at `shapes` on, marked running until Done (module doc).
  // With `wait` false, null when none is loaded yet: the caller computes the call
  // elsewhere. Waiting gives up at `deadline_ns` (0: none) or once `*cancel` is set.
  absl::Status Take(const Shapes& shapes, bool wait, const volatile uint8_t* cancel,
                    int64_t deadline_ns, Entry** out) {
    const Key want = KeyFor(shapes);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (closed_) return absl::InternalError(where_ + "was unloaded");
      auto found = entries_.find(want);
      Entry* entry = found == entries_.end() ? nullptr : found->second.get();
      if (!entry) {
        // A caller that does not wait queues no more than MaxShapes() compiles.
        if (!failed_.count(want) && (wait || pending_.count(want) || queue_.size() < MaxShapes())) {
          Request(want);
        }
        entry = OtherBatch(want);
      }
      if (entry) {
        ++entry->running;
        entry->used = ++clock_;
        *out = entry;
        return absl::OkStatus();
      }
      auto failed = failed_.find(want);
      if (failed != failed_.end()) return failed->second;
      if (!wait) {
        *out = nullptr;
        return absl::OkStatus();
      }
      const int64_t now = NowNs();
      if (cancel && *cancel) {
        return absl::CancelledError(absl::StrCat(
            where_, "the call was cancelled by its caller while it waited for its new shape ",
            Label(want), " to compile; the compile goes on for later calls"));
      }
      if (deadline_ns && now >= deadline_ns) {
        return absl::DeadlineExceededError(absl::StrCat(
            where_, "the call's deadline passed while it waited for its new shape ",
            Label(want), " to compile; the compile goes on for later calls"));
      }
      changed_.wait_for(lock, std::chrono::milliseconds(10));
    }
  }

  void Done(Entry* entry) {
    std::vector<nr_model*> gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --entry->running;
      gone = EvictLocked();
    }
    for (nr_model* m : gone) nr_model_unload(m);
  }

  // The label of the executable a call at `shapes` wants (`neuron_op_0@4x128;4x128`).
  std::string LabelFor(const Shapes& shapes) const { return Label(KeyFor(shapes)); }

  // Labels of the shapes loaded, least recently used first (for tests: `neuronish ls`
  // shows the same labels).
  size_t Loaded() {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_.size();
  }

 private:
  // (the batch compiled at, or -1 without batch axes; the shapes, batch axes as -1)
  using Key = std::pair<int64_t, Shapes>;

  static int64_t NowNs() {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
  }

  Key MakeKey(const Shapes& shapes, int64_t batch) const {
    Key key{batch, shapes};
    for (size_t i = 0; i < inputs_.size() && i < shapes.size(); ++i) {
      if (inputs_[i].batch_axis >= 0) key.second[i][inputs_[i].batch_axis] = -1;
    }
    return key;
  }

  Key KeyFor(const Shapes& shapes) const {
    int64_t calls = -1;
    for (size_t i = 0; i < inputs_.size() && i < shapes.size(); ++i) {
      if (inputs_[i].batch_axis >= 0) calls = shapes[i][inputs_[i].batch_axis];
    }
    const int64_t batch = calls < 0 || compiled_batch_ < 0 ? -1 : BatchFor(calls, compiled_batch_);
    return MakeKey(shapes, batch);
  }

  std::string Label(const Key& key) const {
    std::string out = name_ + "@";
    for (size_t i = 0; i < key.second.size(); ++i) {
      if (i) out += ";";
      for (size_t d = 0; d < key.second[i].size(); ++d) {
        const int64_t n = key.second[i][d];
        out += absl::StrCat(d ? "x" : "", n < 0 ? key.first : n);
      }
    }
    return out;
  }

  void Insert(const Key& key, nr_model* model) {
    auto entry = std::make_unique<Entry>();
    entry->model = model;
    const nr_executable* exe = nr_model_executable(model);
    for (size_t i = 0; i < nr_executable_num_tensors(exe, NR_OUTPUT); ++i) {
      nr_tensor_info info;
      nr_executable_tensor(exe, NR_OUTPUT, i, &info);
      entry->outputs.push_back(info);
    }
    entry->used = ++clock_;
    entries_[key] = std::move(entry);
  }

  // A loaded executable of `want`'s shape at another batch (under the lock): the smallest
  // batch at least `want`'s (one program), else the largest.
  Entry* OtherBatch(const Key& want) const {
    Entry* best = nullptr;
    int64_t best_batch = 0;
    for (const auto& [key, entry] : entries_) {
      if (key.second != want.second) continue;
      const bool fits = key.first >= want.first, best_fits = best && best_batch >= want.first;
      if (!best || (fits && (!best_fits || key.first < best_batch)) ||
          (!fits && !best_fits && key.first > best_batch)) {
        best = entry.get();
        best_batch = key.first;
      }
    }
    return best;
  }

  void Request(const Key& key) {  // (under the lock)
    if (!pending_.insert(key).second) return;
    queue_.push_back(key);
    if (working_) return;
    // (a worker that found the queue empty has left, or is leaving: it takes no lock again)
    if (worker_.joinable()) worker_.join();
    working_ = true;
    worker_ = std::thread([this] { CompileQueued(); });
  }

  void CompileQueued() {
    while (true) {
      Key key;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty() || closed_) {
          pending_.clear();
          changed_.notify_all();
          working_ = false;
          return;
        }
        key = queue_.front();
        queue_.pop_front();
      }
      nr_model* model = nullptr;
      absl::Status s = CompileOne(key, &model);
      std::vector<nr_model*> gone;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (s.ok() && !closed_) {
          Insert(key, model);
          model = nullptr;
        } else if (!s.ok()) {
          failed_[key] = s;
        }
        pending_.erase(key);
        gone = EvictLocked();
      }
      changed_.notify_all();
      if (model) nr_model_unload(model);
      for (nr_model* m : gone) nr_model_unload(m);
    }
  }

  absl::Status CompileOne(const Key& key, nr_model** out) {
    const std::string label = Label(key);
    // The io-config at that shape and batch (neuronish.contracts.io_config).
    std::string io = "{\"inputs\": {";
    for (size_t i = 0; i < inputs_.size(); ++i) {
      io += absl::StrCat(i ? ", " : "", JsonString(inputs_[i].name), ": [[");
      for (size_t d = 0; d < key.second[i].size(); ++d) {
        const int64_t n = key.second[i][d];
        io += absl::StrCat(d ? ", " : "", n < 0 ? (key.first > 0 ? key.first : inputs_[i].shape[d]) : n);
      }
      io += absl::StrCat("], ", JsonString(inputs_[i].dtype_name), ", ", inputs_[i].batch_axis, "]");
    }
    io += "}, \"outputs\": {";
    for (size_t i = 0; i < output_axes_.size(); ++i) {
      io += absl::StrCat(i ? ", " : "", JsonString(output_axes_[i].first), ": ",
                         output_axes_[i].second);
    }
    io += "}}\n";
    const std::string what = absl::StrCat(where_, "compiling it for the new shape ", label);
    std::string executable;
    absl::Status compiled = RunCompiler(what, graph_, io, spec_.compiler_args, stop_, &executable);
    if (!compiled.ok()) return compiled;
    absl::Status loaded = load_(executable, label, out);
    if (!loaded.ok()) {
      return absl::Status(loaded.code(), absl::StrCat(where_, "loading its new shape ", label,
                                                      " failed: ", loaded.message()));
    }
    return absl::OkStatus();
  }

  // Unloads (by returning them) the least recently used executables not running, down to
  // MaxShapes() (under the lock).
  std::vector<nr_model*> EvictLocked() {
    std::vector<nr_model*> gone;
    const size_t limit = MaxShapes();
    while (entries_.size() > limit) {
      auto oldest = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it) {
        if (it->second->running == 0 &&
            (oldest == entries_.end() || it->second->used < oldest->second->used)) {
          oldest = it;
        }
      }
      if (oldest == entries_.end()) break;
      gone.push_back(oldest->second->model);
      entries_.erase(oldest);
    }
    return gone;
  }

  const std::string where_;
  std::string name_;  // the node's name without its scope (labels)
  const DynamicSpec spec_;
  const std::string graph_;
  const Loader load_;
  // The probe's inputs, copied: the probe may be unloaded (least recently used).
  struct Input {
    std::string name, dtype_name;
    std::vector<int64_t> shape;
    int64_t batch_axis;
  };
  std::vector<Input> inputs_;
  std::vector<std::pair<std::string, int64_t>> output_axes_;  // (name, batch axis)
  int64_t compiled_batch_ = -1;

  std::mutex mu_;
  std::condition_variable changed_;  // an entry loaded, a compile failed, the queue drained
  std::map<Key, std::unique_ptr<Entry>> entries_;
  std::set<Key> pending_;  // queued or compiling
  std::deque<Key> queue_;
  std::map<Key, absl::Status> failed_;  // not compiled again
  uint64_t clock_ = 0;
  bool closed_ = false;
  bool working_ = false;
  std::thread worker_;
  std::atomic<bool> stop_{false};  // the compiler in flight is killed
};

}  // namespace
}  // namespace neuronish

#endif  // NEURONISH_OPS_NEURON_OP_SHAPES_H_
