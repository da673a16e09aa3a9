// Runs neuronish-cc as a subprocess for the native NeuronOp (free dimensions compile a new
// shape at run time): `$NEURONISH_CC` split as a shell splits words, else `neuronish-cc` on
// PATH, as neuronish.contracts.default_compiler finds it; in a scratch directory and a
// process group of its own, killed past a time limit or on request. Included by
// neuron_op_native.cc only.
#ifndef NEURONISH_OPS_NEURON_OP_COMPILER_H_
#define NEURONISH_OPS_NEURON_OP_COMPILER_H_

#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace neuronish {
namespace {

// -- running the compiler ---------------------------------------------------------------

constexpr double kCompileTimeoutS = 600.0;  // as shape_specialize.COMPILE_TIMEOUT_S

// The words of environment variable `name`, split as a shell splits words (quotes,
// backslash), as shlex.split does on the Python side.
inline std::vector<std::string> EnvWords(const char* name) {
  const char* env = std::getenv(name);
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
  return words;
}

// The compiler command: `$NEURONISH_CC`, else `neuronish-cc` on PATH, as
// neuronish.contracts.default_compiler finds it.
inline std::vector<std::string> CompilerCommand() {
  std::vector<std::string> words = EnvWords("NEURONISH_CC");
  if (words.empty()) words.push_back("neuronish-cc");
  return words;
}

// The flags the environment adds to every compile, as neuronish/cc_flags.py reads them:
// `$NEURON_CC_FLAGS` (tensorflow-neuron's), then `$NEURONISH_CC_FLAGS`.
inline std::vector<std::string> EnvironmentFlags() {
  std::vector<std::string> flags = EnvWords("NEURON_CC_FLAGS");
  for (std::string& f : EnvWords("NEURONISH_CC_FLAGS")) flags.push_back(std::move(f));
  return flags;
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

// `path` and everything in it, best effort (what cannot go does not stop the rest).
inline void RemoveTree(const std::string& path) {
  nftw(path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) {
    std::remove(p);
    return 0;
  }, 16, FTW_DEPTH | FTW_PHYS);
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
    if (!path_.empty()) RemoveTree(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The compilers this process runs, with their scratch directories: killed (their whole
// group) and removed if the host exits first. A compile thread does not outlive exit(), and
// neither must what it started (it would run on, orphaned, and leave its files).
class LiveCompilers {
 public:
  static LiveCompilers& Get() {
    static LiveCompilers* live = [] {
      auto* made = new LiveCompilers();  // (never destroyed: the exit handler reads it)
      std::atexit([] { Get().KillAll(); });
      return made;
    }();
    return *live;
  }
  void Add(pid_t group, const std::string& dir) {
    std::lock_guard<std::mutex> lock(mu_);
    running_[group] = dir;
  }
  void Remove(pid_t group) {
    std::lock_guard<std::mutex> lock(mu_);
    running_.erase(group);
  }

 private:
  void KillAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [group, dir] : running_) {
      killpg(group, SIGKILL);
      RemoveTree(dir);
    }
    running_.clear();
  }
  std::mutex mu_;
  std::map<pid_t, std::string> running_;
};

// The compiler's log, its last `limit` bytes (what a failed compile says is at its end).
inline std::string LogTail(const std::string& path, size_t limit = 1500) {
  std::string log;
  if (!ReadFile(path, &log)) return "(no log)";
  while (!log.empty() && (log.back() == '\n' || log.back() == ' ')) log.pop_back();
  return log.size() > limit ? "..." + log.substr(log.size() - limit) : log;
}

// How a child of RunInGroup ended.
struct ChildEnd {
  int spawn_error = 0;      // posix_spawnp's error: it did not start
  const char* killed = nullptr;  // why it was stopped, if it was
  int status = 0;           // waitpid's status otherwise
};

// Runs `argv` in a process group of its own (stdin /dev/null; stdout, and stderr too
// unless `quiet_stderr`, to `out_path`), killed as a whole past `timeout_s`, once `stop`
// is set, or when the host exits (`scratch` then removed): a child of ours never outlives
// its host, nor does whatever it started.
inline ChildEnd RunInGroup(std::vector<std::string> argv, const std::string& out_path,
                           bool quiet_stderr, const std::string& scratch, double timeout_s,
                           const std::atomic<bool>& stop) {
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawnattr_t attrs;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&files, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (quiet_stderr) {
    posix_spawn_file_actions_addopen(&files, 2, "/dev/null", O_WRONLY, 0);
  } else {
    posix_spawn_file_actions_adddup2(&files, 1, 2);
  }
  posix_spawnattr_init(&attrs);
  posix_spawnattr_setflags(&attrs, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attrs, 0);  // (a group of its own: killed as a whole)
  pid_t pid = -1;
  ChildEnd end;
  end.spawn_error = posix_spawnp(&pid, cargv[0], &files, &attrs, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attrs);
  if (end.spawn_error != 0) return end;
  LiveCompilers::Get().Add(pid, scratch);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::chrono::milliseconds poll(5);
  while (true) {
    siginfo_t info{};
    // (WNOWAIT: exited but not reaped, so its id, its group's, cannot have been reused)
    if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid) {
      break;
    }
    if (stop.load(std::memory_order_relaxed)) end.killed = "the op was unloaded";
    if (std::chrono::steady_clock::now() > deadline) end.killed = "it ran past the time limit";
    if (end.killed) break;
    // (5 ms at first, so a --version returns quickly; up to 50 ms through a long compile)
    std::this_thread::sleep_for(poll);
    poll = std::min(poll * 2, std::chrono::milliseconds(50));
  }
  killpg(pid, SIGKILL);  // (it, on a stop, and whatever it left running in its group)
  waitpid(pid, &end.status, 0);
  LiveCompilers::Get().Remove(pid);
  return end;
}

// Runs the compiler on `graph` with `io_config`, `args` and the environment's flags (as the
// Python host's run-time compiles have them), killed past kCompileTimeoutS or once `stop`
// is set (RunInGroup); the executable it wrote into `executable`. `what` names the shape in
// messages.
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
  for (std::string& flag : EnvironmentFlags()) argv.push_back(std::move(flag));
  const ChildEnd end = RunInGroup(argv, log_path, false, dir.path(), kCompileTimeoutS, stop);
  if (end.spawn_error != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": cannot start the compiler '", argv[0], "': ", std::strerror(end.spawn_error),
        ". Set NEURONISH_CC to the neuronish-cc command (e.g. /path/to/venv/bin/neuronish-cc) "
        "or put neuronish-cc on PATH"));
  }
  const std::string command = absl::StrCat("'", argv[0], " compile ...'");
  if (end.killed) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": the compiler ", command,
                                                    " was stopped: ", end.killed));
  }
  if (!WIFEXITED(end.status) || WEXITSTATUS(end.status) != 0) {
    const std::string how = WIFEXITED(end.status)
                                ? absl::StrCat("exited with status ", WEXITSTATUS(end.status))
                                : absl::StrCat("died of signal ", WTERMSIG(end.status));
    return absl::InternalError(absl::StrCat(what, ": the compiler ", command, " ", how, ": ",
                                            LogTail(log_path)));
  }
  if (!ReadFile(out_path, executable) || executable->empty()) {
    return absl::InternalError(absl::StrCat(what, ": the compiler ", command,
                                            " exited 0 but wrote no executable"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace neuronish

#endif  // NEURONISH_OPS_NEURON_OP_COMPILER_H_
