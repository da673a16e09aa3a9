// Profiles and device telemetry without Python (observe.h).
#include "observe.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "device.h"
#include "handles.h"
#include "model.h"
#include "utf8.h"

namespace nr {
namespace observe {

std::atomic<bool> g_profiling{false};
std::atomic<bool> g_env_profile{false};

namespace {

std::atomic<bool> g_host{false};  // the host observes (nr_host_observes)

// A JSON string of `s`. Bytes that are not UTF-8 (a caller's label or failure reason may
// hold any) become U+FFFD, as Python's errors="replace" reads them: the file stays one
// that json.load and `neuronish ls` / `profile --read` can read.
std::string json_string(const std::string &s) {
  std::string out = "\"";
  const auto *p = reinterpret_cast<const uint8_t *>(s.data());
  for (size_t i = 0, len; i < s.size(); i += len) {
    unsigned char c = p[i];
    len = 1;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else if (c < 0x80) {
      out += char(c);
    } else if ((len = utf8_char(p + i, s.size() - i))) {
      out.append(s, i, len);
    } else {
      out += "\\ufffd";
      len = 1;
    }
  }
  return out + "\"";
}

std::string json_ints(const std::vector<int> &v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string number(double x) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

// A core's telemetry field saying it failed (runtime/telemetry.py writes the same), or "".
std::string failed_field(Device &device, int core) {
  std::string why = device.failure(core);
  return why.empty() ? "" : ", \"failed\": " + json_string(why);
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Write `text` to `path` through a temp file in the same directory, then rename: a reader
// sees the old file or the new one, never half of one. False (nothing left) on failure.
bool write_atomically(const std::string &dir, const std::string &path, const std::string &text) {
  std::string tmp = dir + "/." + std::to_string(getpid()) + ".XXXXXX.tmp";
  std::vector<char> name(tmp.begin(), tmp.end());
  name.push_back('\0');
  int fd = mkstemps(name.data(), 4);  // mode 0600
  if (fd < 0) return false;
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n <= 0) break;
    done += size_t(n);
  }
  bool ok = close(fd) == 0 && done == text.size() && rename(name.data(), path.c_str()) == 0;
  if (!ok) unlink(name.data());
  return ok;
}

// ---- the profile --------------------------------------------------------------------

enum Kind : uint8_t { kCall, kQueue, kExecute, kInstruction };

struct Record {
  Kind kind;
  int32_t stage = -1, instruction = -1;
  uint32_t track;
  double start, end;
  std::shared_ptr<const About> about;
};

constexpr size_t kMaxEvents = 2000000;  // runtime/profiler.py's _MAX_EVENTS

// Who the recording is for: NEURONISH_PROFILE (this library writes the trace at exit) or
// a host that asked (nr_profile_start: it takes the spans). Never both: one writer a file.
enum class Mode : uint8_t { kOff, kEnv, kOnDemand };

struct Profile {
  std::mutex mu;  // guards the rest, and g_profiling's changes
  Mode mode = Mode::kOff;
  std::string directory;
  double t0 = 0;
  std::vector<Record> records;
  std::unordered_map<std::string, uint32_t> track_ids;
  std::vector<std::string> tracks;
  std::vector<long> track_threads;  // per track: the Linux thread id of a host track, else 0
  uint64_t dropped = 0;

  uint32_t track(const std::string &name, long thread = 0) {  // (under mu)
    auto it = track_ids.find(name);
    if (it != track_ids.end()) return it->second;
    tracks.push_back(name);
    track_threads.push_back(thread);
    return track_ids[name] = uint32_t(tracks.size());
  }
  void clear() {  // (under mu)
    records.clear();
    track_ids.clear();
    tracks.clear();
    track_threads.clear();
    dropped = 0;
  }
  bool room(size_t n) {  // (under mu)
    if (records.size() + n > kMaxEvents) {
      dropped += n;
      return false;
    }
    return true;
  }
};

Profile &profile() {
  static Profile *p = new Profile;  // (never destroyed: the exit handler uses it last)
  return *p;
}

long this_thread() {
  thread_local long tid = long(syscall(SYS_gettid));
  return tid;
}

const std::string &host_track() {
  thread_local std::string name = "host (thread " + std::to_string(this_thread()) + ")";
  return name;
}

// A span's `model_id` arg (nr_model_id), which a host's profiler keys the model by.
std::string model_id(const About &a) { return ", \"model_id\": " + std::to_string(a.model_id); }

// A record's span name, category and args (JSON).
struct Described {
  std::string name, cat, args;
};
Described describe(const Record &r) {
  const About &a = *r.about;
  switch (r.kind) {
    case kCall: return {"call", "call", "{\"model\": " + json_string(a.name) + model_id(a) + "}"};
    case kQueue: return {"queue", "queue", "{\"model\": " + json_string(a.name) + model_id(a) + "}"};
    case kExecute:
      return {"execute", "execute",
              "{\"model\": " + json_string(a.name) + model_id(a) + ", \"batch\": " +
                  (a.batch >= 0 ? std::to_string(a.batch) : std::string("null")) + "}"};
    case kInstruction: break;
  }
  return {a.kind[size_t(r.stage)][size_t(r.instruction)], "instruction",
          a.args[size_t(r.stage)][size_t(r.instruction)]};
}

std::string trace_json() {
  Profile &p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  long pid = long(getpid());
  std::string pid_text = std::to_string(pid);
  std::string out = "{\"traceEvents\": [";
  out += "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + pid_text +
         ", \"tid\": 0, \"args\": {\"name\": \"neuronish (pid " + pid_text + ")\"}}";
  for (size_t k = 0; k < p.tracks.size(); ++k) {
    std::string tid = std::to_string(k + 1);
    out += ", {\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + pid_text + ", \"tid\": " + tid +
           ", \"args\": {\"name\": " + json_string(p.tracks[k]) + "}}";
    out += ", {\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": " + pid_text + ", \"tid\": " + tid +
           ", \"args\": {\"sort_index\": " + tid + "}}";
  }
  auto us = [&](double t) { return std::round((t - p.t0) * 1e9) / 1e3; };
  char text[160];
  for (const Record &r : p.records) {
    auto [name, cat, args] = describe(r);
    // (the end rounded alike: spans laid end to end never overlap, as in profiler.py)
    double ts = us(r.start), dur = std::max(std::round((us(r.end) - ts) * 1e3) / 1e3, 0.0);
    std::snprintf(text, sizeof text, "\", \"ph\": \"X\", \"pid\": %ld, \"tid\": %u, \"ts\": %.3f, \"dur\": %.3f, ",
                  pid, r.track, ts, dur);
    out += ", {\"name\": " + json_string(name) + ", \"cat\": \"" + cat + text + "\"args\": " + args + "}";
  }
  out += "], \"displayTimeUnit\": \"ms\", \"otherData\": {\"producer\": \"neuronish\", \"dropped_events\": " +
         std::to_string(p.dropped) + "}}";
  return out;
}

void write_profile() {
  Profile &p = profile();
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.mode != Mode::kEnv) return;  // (a host's recording is the host's to take)
    p.mode = Mode::kOff;
    g_env_profile.store(false);
    g_profiling.store(false);
    if (p.records.empty()) return;  // a program that never ran a model writes nothing
  }
  std::string path = p.directory + "/neuronish-" + std::to_string(long(getpid())) + ".json";
  std::string text = trace_json();
  mkdir(p.directory.c_str(), 0777);  // (as profiler.py's mkdir(parents=True): the umask decides)
  if (!write_atomically(p.directory, path, text))
    std::fprintf(stderr, "neuronish: $NEURONISH_PROFILE: could not write %s: %s\n", path.c_str(),
                 std::strerror(errno));
}

// ---- telemetry ------------------------------------------------------------------------

constexpr double kPublishInterval = 0.5;  // telemetry.py's PUBLISH_INTERVAL

struct Tracked {
  int64_t id;
  double loaded_at;
};

struct Telemetry {
  std::mutex mu;  // guards the rest; a model leaves `models` before it is destroyed
  std::map<const Model *, Tracked> models;
  std::vector<const Model *> order;
  std::shared_ptr<Device> device;  // the device of the models (NEURONISH_* configure all alike)
  std::map<int, double> retired_busy;  // busy seconds per core of models since unloaded
  int64_t next_id = 0;
  double started = wall_time();
  std::string directory, path;
  std::thread thread;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop = false;
  std::atomic<bool> trusted{false};  // the run dir passed `secure`: our file may be there
};

Telemetry &telemetry() {
  static Telemetry *t = new Telemetry;  // (never destroyed: the exit handler uses it last)
  return *t;
}

bool telemetry_enabled() {
  const char *v = std::getenv("NEURONISH_TELEMETRY");
  if (!v) return true;
  std::string s(v);
  return !(s == "0" || s == "false" || s == "no" || s == "off");
}

std::string run_dir() {  // telemetry.run_dir()
  const char *explicit_dir = std::getenv("NEURONISH_RUN_DIR");
  if (explicit_dir && *explicit_dir) return explicit_dir;
  const char *xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg) return std::string(xdg) + "/neuronish";
  std::string tmp = "/tmp";  // (tempfile.gettempdir(): the first of these that is a directory)
  for (const char *var : {"TMPDIR", "TEMP", "TMP"}) {
    const char *v = std::getenv(var);
    struct stat st;
    if (v && *v && stat(v, &st) == 0 && S_ISDIR(st.st_mode)) {
      tmp = v;
      break;
    }
  }
  return tmp + "/neuronish-" + std::to_string(long(getuid()));
}

// buildcache.Cache.secure for the run dir: created 0700 if missing, else it must be a real
// directory of ours that nobody else can write, and so must be safe every parent (owned by
// us or root; writable by all only with the sticky bit). "" when trusted, else why not.
std::string secure(const std::string &dir) {
  std::string title = "the run directory of device counters " + dir;
  std::string parent = dir.substr(0, dir.find_last_of('/'));
  if (!parent.empty()) {  // (its parents, as mkdir(parents=True))
    for (size_t at = 1; at <= parent.size(); ++at)
      if (at == parent.size() || parent[at] == '/') mkdir(parent.substr(0, at).c_str(), 0777);
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return "cannot create " + title + ": " + std::strerror(errno) + "; set NEURONISH_RUN_DIR to a writable directory";
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) return "cannot read " + title + ": " + std::strerror(errno);
  std::string risk = " (another user could plant or replace the counters that neuronish ls/top show, or read this "
                     "process's); set NEURONISH_RUN_DIR to a directory of your own";
  if (S_ISLNK(st.st_mode)) return title + " is a symbolic link" + risk;
  if (!S_ISDIR(st.st_mode)) return title + " is not a directory" + risk;
  if (st.st_uid != getuid())
    return title + " belongs to uid " + std::to_string(st.st_uid) + ", not to you (uid " +
           std::to_string(getuid()) + ")" + risk;
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
    return title + " is writable by group or others (mode " + mode + ")" + risk;
  }
  char resolved[PATH_MAX];
  if (!realpath(dir.c_str(), resolved)) return "cannot resolve " + title + ": " + std::strerror(errno);
  std::string path = resolved;
  while (path.size() > 1) {  // every parent: who can rename entries there can swap the dir
    path = path.substr(0, std::max<size_t>(path.find_last_of('/'), 1));
    struct stat pst;
    if (stat(path.c_str(), &pst) != 0) return "cannot read parent directory " + path + ": " + std::strerror(errno);
    if (pst.st_uid != 0 && pst.st_uid != getuid())
      return "parent directory " + path + " of " + title + " belongs to uid " + std::to_string(pst.st_uid) + risk;
    if ((pst.st_mode & S_IWOTH) && !(pst.st_mode & S_ISVTX))
      return "parent directory " + path + " of " + title + " is writable by everyone without the sticky bit" + risk;
  }
  return "";
}

std::string command_line() {
  std::string cmd;
  if (FILE *f = std::fopen("/proc/self/cmdline", "rb")) {
    char buf[256];
    size_t n = std::fread(buf, 1, sizeof buf, f);
    std::fclose(f);
    for (size_t i = 0; i < n; ++i) cmd += buf[i] ? ((unsigned char)buf[i] < 0x80 ? buf[i] : '?') : ' ';
  }
  while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
  return cmd.substr(0, 200);
}

// telemetry.Telemetry.snapshot's record, from the C runtime's counters (under t.mu).
std::string snapshot(Telemetry &t) {
  const DeviceConfig &config = t.device->config();
  std::map<int, double> busy = t.retired_busy;
  std::string models;
  for (const Model *m : t.order) {
    const Tracked &tracked = t.models.at(m);
    std::string groups, bytes;
    uint64_t runs = 0, busy_ns = 0;
    for (size_t k = 0; k < m->duplicates(); ++k) {
      const Copy &c = m->copy(k);
      uint64_t copy_ns = c.busy_ns.load(std::memory_order_relaxed);
      runs += c.runs.load(std::memory_order_relaxed);
      busy_ns += copy_ns;
      for (int core : c.reservation.cores) busy[core] += double(copy_ns) * 1e-9;
      groups += (k ? ", " : "") + json_ints(c.reservation.cores);
      if (k == 0)
        for (size_t i = 0; i < c.reservation.bytes_per_core.size(); ++i)
          bytes += (i ? ", " : "") + std::to_string(c.reservation.bytes_per_core[i]);
    }
    int64_t batch = m->batch_size() > 0 ? m->batch_size() : 1;
    models += std::string(models.empty() ? "" : ", ") + "{\"id\": " + std::to_string(tracked.id) +
              ", \"name\": " + json_string(m->label()) + ", \"core_groups\": [" + groups +
              "], \"bytes_per_core\": [" + bytes + "], \"batch\": " + std::to_string(batch) +
              ", \"engine\": \"native (C runtime)\", \"calls\": " + std::to_string(runs) +
              ", \"inferences\": " + std::to_string(runs * uint64_t(batch)) +
              ", \"busy_seconds\": " + number(double(busy_ns) * 1e-9) +
              ", \"loaded_at\": " + number(tracked.loaded_at) + "}";
  }
  std::string groups, cores;
  for (auto &g : config.core_groups) groups += (groups.empty() ? "" : ", ") + json_ints(g);
  for (int core : config.visible_cores)
    cores += (cores.empty() ? "" : ", ") + json_string(std::to_string(core)) +
             ": {\"used_bytes\": " + std::to_string(t.device->used(core)) +
             ", \"busy_seconds\": " + number(busy[core]) + failed_field(*t.device, core) + "}";
  return "{\"format\": 1, \"pid\": " + std::to_string(long(getpid())) + ", \"command\": " +
         json_string(command_line()) + ", \"started\": " + number(t.started) + ", \"time\": " +
         number(wall_time()) + ", \"device\": {\"num_cores\": " + std::to_string(config.num_cores) +
         ", \"visible_cores\": " + json_ints(config.visible_cores) + ", \"core_groups\": [" + groups +
         "], \"core_memory\": " + std::to_string(config.core_memory) + ", \"engine\": \"" +
         (t.order.empty() ? "-" : "native (C runtime)") + "\"}, \"cores\": {" + cores + "}, \"models\": [" + models +
         "]}";
}

void publish_loop() {
  Telemetry &t = telemetry();
  std::string why = secure(t.directory);
  if (!why.empty()) {  // say so once; the device carries on unpublished
    std::fprintf(stderr, "neuronish: warning: not publishing device counters: %s\n", why.c_str());
    return;
  }
  t.trusted = true;
  std::unique_lock<std::mutex> stop(t.stop_mu);
  while (!t.stop) {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(t.mu);
      text = snapshot(t);
    }
    write_atomically(t.directory, t.path, text);  // (a full or read-only disk must not stop the device)
    t.stop_cv.wait_for(stop, std::chrono::duration<double>(kPublishInterval), [&] { return t.stop; });
  }
}

pid_t g_owner = 0;  // the process that registered at_exit (a forked child is not it)

void at_exit() {
  // A forked child has neither the publisher thread nor the right to the parent's files:
  // it writes and removes nothing (as profiler.py and telemetry.py forget in a child).
  if (getpid() != g_owner) return;
  write_profile();
  Telemetry &t = telemetry();
  if (t.thread.joinable()) {
    {
      std::lock_guard<std::mutex> lock(t.stop_mu);
      t.stop = true;
    }
    t.stop_cv.notify_all();
    t.thread.join();
    if (t.trusted) unlink(t.path.c_str());
  }
}

std::once_flag g_exit_registered;
void register_exit() {
  std::call_once(g_exit_registered, [] {
    g_owner = getpid();
    std::atexit(at_exit);
  });
}

}  // namespace

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void host_observes() { g_host.store(true); }

void device_opened() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char *dir = std::getenv("NEURONISH_PROFILE");
    if (!dir || !*dir) return;
    struct stat st;
    if (lstat(dir, &st) == 0 && !(S_ISDIR(st.st_mode) || (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)))) {
      // A file, /dev/null or a dangling symlink: the trace could never be written.
      if (!g_host.load())  // (a host that observes says so itself: runtime/profiler.py)
        std::fprintf(stderr, "neuronish: $NEURONISH_PROFILE='%s' is not a directory; not profiling\n", dir);
      return;
    }
    if (g_host.load()) {  // the host records it, with this library's spans (runtime/profiler.py)
      g_env_profile.store(true);
      return;
    }
    Profile &p = profile();
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.mode == Mode::kOnDemand) {  // (a C host that called nr_profile_start first)
      std::fprintf(stderr, "neuronish: $NEURONISH_PROFILE ignored: the host records a profile itself "
                           "(nr_profile_start)\n");
      return;
    }
    p.directory = dir;
    p.t0 = now();
    p.mode = Mode::kEnv;
    register_exit();
    g_env_profile.store(true);
    g_profiling.store(true);
  });
}

void start_recording() {
  Profile &p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.mode == Mode::kEnv)
    throw Refused{NR_INVALID_ARGUMENT, "this process records a profile for NEURONISH_PROFILE=" + p.directory +
                                           " (this library writes it at exit); unset NEURONISH_PROFILE to "
                                           "record on demand"};
  p.clear();
  p.mode = Mode::kOnDemand;
  g_profiling.store(true);
}

std::string take_spans() {
  Profile &p = profile();
  std::vector<Record> records;
  std::vector<std::string> tracks;
  std::vector<long> threads;
  uint64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.mode == Mode::kEnv)
      throw Refused{NR_INVALID_ARGUMENT, "this process records a profile for NEURONISH_PROFILE=" + p.directory +
                                             " (this library writes it at exit); there is no recording to take"};
    if (p.mode == Mode::kOnDemand) {
      p.mode = Mode::kOff;
      g_profiling.store(false);  // (under mu: no call records after this)
      records.swap(p.records);
      tracks.swap(p.tracks);
      threads.swap(p.track_threads);
      dropped = p.dropped;
      p.clear();
    }
  }
  // Built outside the lock: a recording started meanwhile is not held up.
  std::string out = "{\"clock\": \"CLOCK_MONOTONIC\", \"dropped_events\": " + std::to_string(dropped) +
                    ", \"spans\": [";
  for (size_t i = 0; i < records.size(); ++i) {
    const Record &r = records[i];
    auto [name, cat, args] = describe(r);
    long thread = threads[r.track - 1];
    out += std::string(i ? ", " : "") + "{\"name\": " + json_string(name) + ", \"cat\": \"" + cat +
           "\", \"track\": " + json_string(tracks[r.track - 1]) +
           (thread ? ", \"thread\": " + std::to_string(thread) : std::string()) + ", \"start\": " +
           number(r.start) + ", \"end\": " + number(r.end) + ", \"args\": " + args + "}";
  }
  return out + "]}";
}

std::string model_name(const Executable &exe) {
  std::string name;
  for (auto &s : exe.outputs) name += (name.empty() ? "" : ", ") + s.name;
  return name.substr(0, 80);
}

void model_loaded(const Model *model) {
  if (g_host.load() || !telemetry_enabled()) return;
  Telemetry &t = telemetry();
  std::lock_guard<std::mutex> lock(t.mu);
  t.models[model] = Tracked{t.next_id++, wall_time()};
  t.order.push_back(model);
  t.device = model->device();
  if (!t.thread.joinable()) {
    t.directory = run_dir();
    t.path = t.directory + "/" + std::to_string(long(getpid())) + ".json";
    register_exit();
    t.thread = std::thread(publish_loop);
  }
}

void relabel(const Model *, const std::function<void()> &set) {
  std::lock_guard<std::mutex> lock(telemetry().mu);
  set();
}

void model_unloaded(const Model *model) {
  Telemetry &t = telemetry();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.models.erase(model)) return;
  t.order.erase(std::find(t.order.begin(), t.order.end(), model));
  for (size_t k = 0; k < model->duplicates(); ++k) {  // the cores keep the time it was busy
    const Copy &c = model->copy(k);
    for (int core : c.reservation.cores) t.retired_busy[core] += double(c.busy_ns.load()) * 1e-9;
  }
}

std::shared_ptr<const About> about(const Model &model) {
  auto a = std::make_shared<About>();
  const Executable &exe = model.exe();
  a->name = utf8_prefix(model.label(), 60);  // (never half a character)
  a->model_id = model.id();
  a->batch = model.batch_size();
  for (size_t k = 0; k < model.duplicates(); ++k) {
    std::string cores = "[";
    for (size_t i = 0; i < model.copy(k).reservation.cores.size(); ++i)
      cores += (i ? ", " : "") + std::to_string(model.copy(k).reservation.cores[i]);
    a->copy_tracks.push_back("device cores " + cores + "]: " + a->name);
  }
  const auto &stages = model.copy(0).program->stages;
  for (size_t s = 0; s < stages.size() && s < exe.programs.size(); ++s) {
    a->engine_index.push_back(stages[s]->engine_index);
    a->kind.emplace_back();
    a->args.emplace_back();
    for (auto &ins : exe.programs[s]) {
      std::string tf = "[";
      for (size_t i = 0; i < ins.source.size(); ++i) tf += (i ? ", " : "") + json_string(ins.source[i]);
      tf += "]";
      a->kind.back().push_back(ins.kind);
      a->args.back().push_back("{\"tf\": " + tf + ", \"engine\": \"native\", \"parts\": [" + tf + "]}");
    }
  }
  return a;
}

void record_call(const std::shared_ptr<const About> &about, double start, double end) {
  Profile &p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!profiling() || !p.room(1)) return;
  p.records.push_back(Record{kCall, -1, -1, p.track(host_track(), this_thread()), start, end, about});
}

void record_chunk(const std::shared_ptr<const About> &about, size_t copy, double queued, double start, double end,
                  const std::vector<std::vector<double>> &times) {
  Profile &p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  size_t n = 2;
  for (auto &t : times) n += t.size() / 2;
  if (!profiling() || !p.room(n)) return;
  p.records.push_back(Record{kQueue, -1, -1, p.track(host_track(), this_thread()), queued, start, about});
  uint32_t device = p.track(about->copy_tracks.at(copy));
  p.records.push_back(Record{kExecute, -1, -1, device, start, end, about});
  for (size_t s = 0; s < times.size() && s < about->engine_index.size(); ++s) {
    const auto &index = about->engine_index[s];
    for (size_t k = 0; k < index.size(); ++k) {
      int64_t e = index[k];
      if (e < 0 || size_t(2 * e + 1) >= times[s].size()) continue;
      p.records.push_back(Record{kInstruction, int32_t(s), int32_t(k), device, times[s][size_t(2 * e)],
                                 times[s][size_t(2 * e + 1)], about});
    }
  }
}

}  // namespace observe
}  // namespace nr

// ---- the C API's on-demand profile (neuronish_runtime.h) ------------------------------

extern "C" {

nr_status nr_profile_start(char *error, size_t error_size) {
  return nr::guarded(error, error_size, [] { nr::observe::start_recording(); });
}

nr_status nr_profile_stop(char **spans, size_t *size, char *error, size_t error_size) {
  if (!spans || !size) return nr::report(NR_INVALID_ARGUMENT, "spans or size is NULL", error, error_size);
  *spans = nullptr;
  *size = 0;
  return nr::guarded(error, error_size, [&] {
    std::string text = nr::observe::take_spans();
    char *out = static_cast<char *>(std::malloc(text.size() + 1));
    if (!out) throw std::bad_alloc();
    std::memcpy(out, text.c_str(), text.size() + 1);
    *spans = out;
    *size = text.size();
  });
}

void nr_profile_free(char *spans) { std::free(spans); }

int nr_profile_recording(void) { return nr::observe::profiling() ? 1 : 0; }

}  // extern "C"
