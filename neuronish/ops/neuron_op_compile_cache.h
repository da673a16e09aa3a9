// The compile cache in a host without Python: the native NeuronOp's side of
// neuronish/compile_cache.py. The same directory ($NEURONISH_COMPILE_CACHE, default
// ~/.cache/neuronish/compile, `off` for none), the same entries (<key>.neff and its record
// <key>.sum = magic + key + HMAC-SHA-256(.secret, key + SHA-256(executable))), the same keys
// and the same trust rules, so a shape one process compiled at run time (a C host, a TF
// Serving replica, a Python host) is not compiled again by the next: a restarted server finds
// it there. The key covers the subgraph, the io-config, every compiler flag and the
// compiler's identity (its command and what `--version` prints, which for neuronish-cc
// includes a digest of its sources), so an entry is only ever the output the compiler would
// give now. Entries are read only if they are regular files of ours that nobody else can
// write and their record matches; a damaged one is removed and compiled again. The shared
// tier of the Python side ($NEURONISH_COMPILE_CACHE_REMOTE, fsspec) is not read here.
// Included by neuron_op_shapes.h only.
#ifndef NEURONISH_OPS_NEURON_OP_COMPILE_CACHE_H_
#define NEURONISH_OPS_NEURON_OP_COMPILE_CACHE_H_

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "neuron_op_compiler.h"
#include "neuronish_runtime.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/lib/strings/proto_serialization.h"

namespace neuronish {
namespace {

// -- the key (neuronish.compile_cache.cache_key) -----------------------------------------

// `s` as Python's json.dumps writes a str (ensure_ascii): the short escapes, other control
// characters and everything past ASCII as \uXXXX (UTF-16, so surrogate pairs above the
// BMP). A byte that is not UTF-8 is what Python made of it: U+FFFD when it decoded a
// program's output with errors="replace", U+DC80+byte for an environment word.
inline std::string PyJsonString(const std::string& s, bool from_environment) {
  std::string out = "\"";
  auto u = [&out](uint32_t cp) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    out += buf;
  };
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      const char* esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f" : nullptr;
      if (esc) {
        out += esc;
      } else if (c < 0x20) {
        u(c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const int n = c >= 0xF0 && c < 0xF5 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    uint32_t cp = n == 4 ? c & 0x07 : n == 3 ? c & 0x0F : c & 0x1F;
    bool ok = n > 0 && i + n <= s.size();
    for (int k = 1; ok && k < n; ++k) {
      const unsigned char b = s[i + k];
      ok = (b & 0xC0) == 0x80;
      cp = (cp << 6) | (b & 0x3F);
    }
    ok = ok && !(n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) &&
         !(n == 4 && (cp < 0x10000 || cp > 0x10FFFF));
    if (!ok) {
      u(from_environment ? 0xDC00 + c : 0xFFFD);
      ++i;
      continue;
    }
    if (cp >= 0x10000) {
      u(0xD800 + ((cp - 0x10000) >> 10));
      u(0xDC00 + ((cp - 0x10000) & 0x3FF));
    } else {
      u(cp);
    }
    i += n;
  }
  return out + "\"";
}

// A list of strings as json.dumps writes it: ["a", "b"].
inline std::string PyJsonList(const std::vector<std::string>& words, bool from_environment) {
  std::string out = "[";
  for (size_t i = 0; i < words.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", PyJsonString(words[i], from_environment));
  }
  return out + "]";
}

inline std::string Hex(const uint8_t* bytes, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 15];
  }
  return out;
}

// The flags as the key reads them (compile_cache._flags_for_key): the file a
// `--calibration` flag names (`--calibration FILE` or `--calibration=FILE`) by its
// contents, "sha256:<hex>", not its path; the path itself if the file cannot be read.
inline std::vector<std::string> FlagsForKey(std::vector<std::string> flags) {
  auto content = [](const std::string& path) -> std::string {
    struct stat st;
    std::string data;  // (a directory opens but does not read: Python's open() refuses it)
    if (stat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode) || !ReadFile(path, &data)) return path;
    uint8_t digest[32];
    nr_sha256(data.data(), data.size(), digest);
    return "sha256:" + Hex(digest, sizeof digest);
  };
  static const std::string kFlag = "--calibration";
  for (size_t k = 0; k < flags.size(); ++k) {
    if (flags[k].rfind(kFlag + "=", 0) == 0) {
      flags[k] = kFlag + "=" + content(flags[k].substr(kFlag.size() + 1));
    } else if (flags[k] == kFlag && k + 1 < flags.size()) {
      flags[k + 1] = content(flags[k + 1]);
    }
  }
  return flags;
}

// The subgraph as the key reads it: without `experimental_debug_info`, which names the
// traced function instance (a counter that differs between two loads of one SavedModel),
// serialized deterministically; the bytes themselves when there is none to drop.
inline std::string StableGraphBytes(const std::string& graph) {
  if (graph.find("__inference_") == std::string::npos) return graph;
  tensorflow::GraphDef def;
  if (!def.ParseFromString(graph)) return graph;
  for (auto& node : *def.mutable_node()) node.clear_experimental_debug_info();
  if (def.has_library()) {  // (mutable_library() would add an empty one: other bytes)
    for (auto& function : *def.mutable_library()->mutable_function()) {
      for (auto& node : *function.mutable_node_def()) node.clear_experimental_debug_info();
    }
  }
  std::string out;
  return tensorflow::SerializeToStringDeterministic(def, &out) ? out : graph;
}

// SHA-256 over each part's length (8 bytes, little-endian) and bytes, in hex.
inline std::string CacheKey(const std::vector<const std::string*>& parts) {
  size_t total = 0;
  for (const std::string* p : parts) total += 8 + p->size();
  std::string message;
  message.reserve(total);
  for (const std::string* p : parts) {
    uint64_t n = p->size();
    for (int k = 0; k < 8; ++k, n >>= 8) message += static_cast<char>(n & 0xFF);
    message += *p;
  }
  uint8_t digest[32];
  nr_sha256(message.data(), message.size(), digest);
  return Hex(digest, 32);
}

// What `command --version` prints, whitespace stripped; false if it cannot be run, fails,
// prints nothing, or is stopped (a minute at most, or `stop`: RunInGroup).
inline bool CompilerVersion(const std::vector<std::string>& command,
                            const std::atomic<bool>& stop, std::string* text) {
  ScratchDir dir;
  if (dir.path().empty()) return false;
  const std::string out_path = dir.path() + "/version.txt";
  std::vector<std::string> argv = command;
  argv.push_back("--version");
  const ChildEnd end = RunInGroup(argv, out_path, true, dir.path(), 60.0, stop);
  if (end.spawn_error != 0 || end.killed || !WIFEXITED(end.status) ||
      WEXITSTATUS(end.status) != 0 || !ReadFile(out_path, text)) {
    return false;
  }
  const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!text->empty() && space(text->back())) text->pop_back();
  text->erase(text->begin(), std::find_if_not(text->begin(), text->end(), space));
  return !text->empty();
}

// The program `word` names, as the key writes it (compile_cache.canonical_command): a word
// without a slash looked up on PATH, then its real path; the word itself if not found.
// (The two hosts name the same compiler differently: `neuronish-cc` on PATH here, the
// venv's script by its path in Python.)
inline std::string CanonicalProgram(const std::string& word) {
  std::string found;
  if (word.find('/') != std::string::npos) {
    found = word;
  } else {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "";
    for (size_t start = 0; start <= dirs.size() && found.empty();) {
      const size_t colon = std::min(dirs.find(':', start), dirs.size());
      const std::string dir = colon > start ? dirs.substr(start, colon - start) : ".";
      const std::string candidate = dir + "/" + word;
      struct stat st {};
      if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          access(candidate.c_str(), X_OK) == 0) {
        found = candidate;
      }
      start = colon + 1;
    }
  }
  char real[PATH_MAX];
  return !found.empty() && realpath(found.c_str(), real) ? std::string(real) : word;
}

// The compiler's identity as neuronish.compile_cache.compiler_identity writes it (JSON:
// [its command, the program canonical, what --version prints]); empty if its version
// cannot be read (then nothing is cached, as on the Python side).
inline std::string CompilerIdentity(const std::vector<std::string>& command,
                                    const std::atomic<bool>& stop) {
  std::string version;
  if (command.empty() || !CompilerVersion(command, stop, &version)) return "";
  std::vector<std::string> canonical = command;
  canonical[0] = CanonicalProgram(command[0]);
  return absl::StrCat("[", PyJsonList(canonical, true), ", ", PyJsonString(version, false), "]");
}

// -- the directory ----------------------------------------------------------------------

constexpr char kRecordMagic[] = "NRNISHC2";  // as compile_cache._MAGIC
constexpr size_t kRecordBytes = 8 + 32 + 32;
constexpr uint64_t kDefaultCacheBytes = uint64_t{10} << 30;
constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 40;

// A byte count as runtime/config.parse_bytes reads one (`4096`, `512MiB`, `4G`).
inline bool ParseBytes(const std::string& text, uint64_t* bytes) {
  size_t i = 0;
  const auto skip = [&] { while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i; };
  skip();
  const size_t digits = i;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == digits || i - digits > 18) return false;
  uint64_t n = std::strtoull(text.substr(digits, i - digits).c_str(), nullptr, 10);
  skip();
  std::string unit;
  while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) {
    unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[i++])));
  }
  skip();
  if (i != text.size()) return false;
  static const std::vector<std::pair<std::string, int>> kUnits = {
      {"", 0}, {"B", 0}, {"K", 10}, {"KB", 10}, {"KI", 10}, {"KIB", 10}, {"M", 20}, {"MB", 20},
      {"MI", 20}, {"MIB", 20}, {"G", 30}, {"GB", 30}, {"GI", 30}, {"GIB", 30}};
  for (const auto& [name, shift] : kUnits) {
    if (unit == name) {
      *bytes = n > (UINT64_MAX >> shift) ? UINT64_MAX : n << shift;  // (no wrap to a tiny bound)
      return true;
    }
  }
  return false;
}

// Whether `st` (of `path`, a `kind`) is ours and writable by nobody else (`private_`:
// readable by nobody else either); `why` says what is wrong otherwise.
inline bool Ours(const struct stat& st, const std::string& kind, const std::string& path,
                 bool private_, std::string* why) {
  if (st.st_uid != getuid()) {
    *why = absl::StrCat("the ", kind, " ", path, " belongs to uid ", st.st_uid, ", not to you");
    return false;
  }
  if (st.st_mode & (private_ ? 077 : 022)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 0777));
    *why = absl::StrCat("the ", kind, " ", path, " has mode ", mode, "; others may ",
                        private_ ? "read or " : "", "write it");
    return false;
  }
  return true;
}

// The contents of `path`, a regular file of ours (not a symlink, not a FIFO) of at most
// `max_bytes`: 1 read, 0 missing, -1 refused (not such a file: `why` says how), -2 it could
// not be read now (`why` says why: too many open files, say), which says nothing of the file.
inline int ReadOurFile(const std::string& path, uint64_t max_bytes, const std::string& kind,
                       bool private_, std::string* bytes, std::string* why) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    *why = absl::StrCat("cannot open the ", kind, " ", path, ": ", std::strerror(errno));
    return errno == ELOOP ? -1 : -2;  // (ELOOP: a symlink where the file should be)
  }
  struct stat st {};
  int result = -1;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *why = absl::StrCat("the ", kind, " ", path, " is not a regular file");
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    *why = absl::StrCat("the ", kind, " ", path, " has ", st.st_size, " bytes, more than ",
                        max_bytes);
  } else if (Ours(st, kind, path, private_, why)) {
    bytes->resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes->size()) {
      const ssize_t n = read(fd, bytes->data() + done, bytes->size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    if (done == bytes->size()) {
      result = 1;
    } else {
      *why = absl::StrCat("cannot read the ", kind, " ", path, ": ", std::strerror(errno));
      result = -2;
    }
  }
  close(fd);
  return result;
}

// `bytes` written to a new file in `dir` (0600) and renamed to `target`.
inline bool PlaceFile(const std::string& dir, const std::string& target, const std::string& bytes) {
  std::string tmp = dir + "/.tmp-XXXXXX";
  const int fd = mkstemp(tmp.data());
  if (fd < 0) return false;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool ok = close(fd) == 0 && done == bytes.size() && rename(tmp.c_str(), target.c_str()) == 0;
  if (!ok) unlink(tmp.c_str());
  return ok;
}

// HMAC-SHA-256 (RFC 2104) of `message` under `key` (at most the block's 64 bytes).
inline std::string HmacSha256(const std::string& key, const std::string& message) {
  std::string inner(64, '\x36'), outer(64, '\x5c');
  for (size_t i = 0; i < key.size() && i < 64; ++i) {
    inner[i] = static_cast<char>(inner[i] ^ key[i]);
    outer[i] = static_cast<char>(outer[i] ^ key[i]);
  }
  uint8_t digest[32];
  inner += message;
  nr_sha256(inner.data(), inner.size(), digest);
  outer.append(reinterpret_cast<const char*>(digest), 32);
  nr_sha256(outer.data(), outer.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), 32);
}

// Whether two records are equal, in time that does not depend on where they differ (as
// hmac.compare_digest: a forger learns nothing from how long a refusal took).
inline bool SameBytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The user's home directory: $HOME, else the password database's (as os.path.expanduser).
inline std::string HomeDirectory() {
  const char* home = std::getenv("HOME");
  if (home && *home) return home;
  std::vector<char> buf(16384);
  struct passwd pw {};
  struct passwd* found = nullptr;
  if (getpwuid_r(getuid(), &pw, buf.data(), buf.size(), &found) == 0 && found && pw.pw_dir) {
    return pw.pw_dir;
  }
  return "";
}

class DiskCompileCache {
 public:
  // The cache $NEURONISH_COMPILE_CACHE names, its directory made (0700) or checked and its
  // secret read or made; nullptr when it is off, and also, with `why` set, when it cannot
  // be used (untrusted, unwritable, a bad NEURONISH_COMPILE_CACHE_SIZE).
  static std::unique_ptr<DiskCompileCache> FromEnv(std::string* why) {
    const char* env = std::getenv("NEURONISH_COMPILE_CACHE");
    std::string where = env ? env : "";
    where.erase(0, where.find_first_not_of(" \t\n"));
    where.erase(where.find_last_not_of(" \t\n") + 1);
    std::string lower = where;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "off" || lower == "0" || lower == "none" || lower == "false") return nullptr;
    if (where.empty()) where = "~/.cache/neuronish/compile";
    if (where[0] == '~' && (where.size() == 1 || where[1] == '/')) {
      where = HomeDirectory() + where.substr(1);
    }
    auto cache = std::unique_ptr<DiskCompileCache>(new DiskCompileCache(where));
    const char* size = std::getenv("NEURONISH_COMPILE_CACHE_SIZE");
    const bool blank = !size || std::all_of(size, size + std::strlen(size), [](unsigned char c) {
      return std::isspace(c) != 0;
    });
    if (!blank && !ParseBytes(size, &cache->max_bytes_)) {
      *why = absl::StrCat("NEURONISH_COMPILE_CACHE_SIZE='", size, "': expected a byte count "
                          "such as 4096, 512MiB or 4GiB");
      return nullptr;
    }
    if (!cache->Secure(why)) return nullptr;
    return cache;
  }

  // The executable stored under `key`: true on a hit. A damaged or untrusted entry is
  // removed, `warning` says so, and it is a miss.
  bool Get(const std::string& key, std::string* executable, std::string* warning) {
    const std::string entry = Path(key, ".neff"), record_path = Path(key, ".sum");
    std::string record, why;
    int found = ReadOurFile(record_path, kRecordBytes, "compile-cache record", false, &record, &why);
    if (found == 1) {
      found = ReadOurFile(entry, kMaxEntryBytes, "compile-cache entry", false, executable, &why);
      if (found == 1 && !SameBytes(record, Seal(key, *executable))) {
        why = "its record or checksum does not match";
        found = -1;
      }
    }
    if (found == 0) return false;
    if (found == -2) {  // (the files may be fine: left as they are, as the Python side does)
      *warning = absl::StrCat("compile cache: ", why, "; compiling instead");
      executable->clear();
      return false;
    }
    if (found < 0) {
      *warning = absl::StrCat("compile cache: entry ", entry, " is damaged or untrusted (", why,
                              "); removed it and compiling the subgraph again");
      unlink(record_path.c_str());
      unlink(entry.c_str());
      executable->clear();
      return false;
    }
    utimensat(AT_FDCWD, entry.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);  // used last: evicted last
    return true;
  }

  // Stores `executable` under `key` (the entry, then its record, each renamed into
  // place), then evicts the least recently used entries until the cache fits. A cache
  // that cannot be written only warns.
  void Put(const std::string& key, const std::string& executable, std::string* warning) {
    if (executable.size() + kRecordBytes > max_bytes_) return;  // would not fit alone
    if (!PlaceFile(root_, Path(key, ".neff"), executable) ||
        !PlaceFile(root_, Path(key, ".sum"), Seal(key, executable))) {
      *warning = absl::StrCat("compile cache: cannot write to ", root_, " (",
                              std::strerror(errno), "); the executable is used but not "
                              "cached. Set NEURONISH_COMPILE_CACHE=DIR or "
                              "NEURONISH_COMPILE_CACHE=off");
      return;
    }
    Evict();
  }

 private:
  explicit DiskCompileCache(std::string root) : root_(std::move(root)) {}

  std::string Path(const std::string& key, const char* suffix) const {
    return absl::StrCat(root_, "/", key, suffix);
  }

  // As runtime/buildcache.Cache.secure and CompileCache.secure do.
  bool Secure(std::string* why) {
    const std::string hint = "; set NEURONISH_COMPILE_CACHE to a directory only you can write "
                             "(it is created with mode 0700), or NEURONISH_COMPILE_CACHE=off";
    for (size_t slash = root_.find('/', 1); slash != std::string::npos;
         slash = root_.find('/', slash + 1)) {
      mkdir(root_.substr(0, slash).c_str(), 0755);  // (parents, as mkdir -p; errors below)
    }
    if (mkdir(root_.c_str(), 0700) != 0 && errno != EEXIST) {
      *why = absl::StrCat("cannot create ", root_, ": ", std::strerror(errno), hint);
      return false;
    }
    struct stat st {};
    if (lstat(root_.c_str(), &st) != 0 || S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
      *why = absl::StrCat("the directory ", root_, " is a symbolic link or not a directory", hint);
      return false;
    }
    if (!Ours(st, "directory", root_, false, why)) {
      *why += hint;
      return false;
    }
    char real[PATH_MAX];
    if (!realpath(root_.c_str(), real)) {
      *why = absl::StrCat("cannot resolve ", root_, ": ", std::strerror(errno), hint);
      return false;
    }
    for (std::string parent = real; parent.size() > 1;) {  // who renames entries swaps the dir
      parent = parent.substr(0, std::max<size_t>(1, parent.rfind('/')));
      struct stat pst {};
      if (stat(parent.c_str(), &pst) != 0) continue;
      if (pst.st_uid != 0 && pst.st_uid != getuid()) {
        *why = absl::StrCat("the parent directory ", parent, " belongs to uid ", pst.st_uid, hint);
        return false;
      }
      if ((pst.st_mode & S_IWOTH) && !(pst.st_mode & S_ISVTX)) {
        *why = absl::StrCat("the parent directory ", parent, " is writable by everyone "
                            "without the sticky bit", hint);
        return false;
      }
    }
    const std::string secret_path = root_ + "/.secret";
    const int read = ReadOurFile(secret_path, 32, "compile cache's secret", true, &secret_, why);
    if (read < 0) {
      *why += hint;
      return false;
    }
    if (read == 0) {
      std::string fresh(32, '\0');
      if (getrandom(fresh.data(), fresh.size(), 0) != 32) {
        *why = "cannot draw the compile cache's secret from the kernel";
        return false;
      }
      std::string tmp = root_ + "/.tmp-XXXXXX";
      const int fd = mkstemp(tmp.data());
      if (fd < 0 || write(fd, fresh.data(), fresh.size()) != 32) {
        if (fd >= 0) close(fd);
        unlink(tmp.c_str());
        *why = absl::StrCat("cannot write to ", root_, ": ", std::strerror(errno), hint);
        return false;
      }
      close(fd);
      link(tmp.c_str(), secret_path.c_str());  // (EEXIST: another process made one first)
      unlink(tmp.c_str());
      if (ReadOurFile(secret_path, 32, "compile cache's secret", true, &secret_, why) != 1) {
        if (why->empty()) *why = absl::StrCat("cannot read ", secret_path);
        *why += hint;
        return false;
      }
    }
    if (secret_.size() != 32) {
      *why = absl::StrCat("the compile cache's secret ", secret_path, " has ", secret_.size(),
                          " bytes, not 32; remove it (a new one is made)", hint);
      return false;
    }
    return true;
  }

  // magic + key + HMAC-SHA-256(secret, key + SHA-256(executable)).
  std::string Seal(const std::string& key, const std::string& executable) const {
    std::string key_bytes;
    for (size_t i = 0; i + 1 < key.size(); i += 2) {
      key_bytes += static_cast<char>(std::strtol(key.substr(i, 2).c_str(), nullptr, 16));
    }
    uint8_t digest[32];
    nr_sha256(executable.data(), executable.size(), digest);
    return absl::StrCat(std::string(kRecordMagic, 8), key_bytes,
                        HmacSha256(secret_, key_bytes + std::string(reinterpret_cast<char*>(digest), 32)));
  }

  // Least recently used entries removed until the cache fits, and temporary files older
  // than an hour (left by a process that died writing them) too (CompileCache.evict).
  void Evict() {
    std::vector<std::tuple<int64_t, uint64_t, std::string>> entries;  // (mtime, bytes, key)
    uint64_t total = 0;
    const time_t stale = time(nullptr) - 3600;
    if (DIR* d = opendir(root_.c_str())) {
      while (const dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name.compare(0, 5, ".tmp-") == 0) {
          struct stat st {};
          if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_mtime < stale) {
            unlinkat(dirfd(d), e->d_name, 0);
          }
          continue;
        }
        if (name.size() != 69 || name.compare(64, 5, ".neff") != 0 ||
            name.find_first_not_of("0123456789abcdef") < 64) {
          continue;
        }
        struct stat st {};
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
        entries.emplace_back(mtime, st.st_size + kRecordBytes, name.substr(0, 64));
        total += st.st_size + kRecordBytes;
      }
      closedir(d);
    }
    std::sort(entries.begin(), entries.end());
    for (const auto& [mtime, bytes, key] : entries) {
      if (total <= max_bytes_) break;
      unlink(Path(key, ".neff").c_str());
      unlink(Path(key, ".sum").c_str());
      total -= bytes;
    }
  }

  const std::string root_;
  uint64_t max_bytes_ = kDefaultCacheBytes;
  std::string secret_;
};

}  // namespace
}  // namespace neuronish

#endif  // NEURONISH_OPS_NEURON_OP_COMPILE_CACHE_H_
