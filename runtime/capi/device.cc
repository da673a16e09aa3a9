// runtime/config.py, runtime/device.py and runtime/host.py in C++ (device.h).
#include "device.h"


#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "cpu_quota.h"
#include "executable.h"
#include "model.h"

namespace nr {
namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;

[[noreturn]] void bad(const std::string &what) { throw Refused{NR_INVALID_CONFIG, what}; }

std::string trim(const std::string &s) {
  size_t a = s.find_first_not_of(" \t\n\r\f\v"), b = s.find_last_not_of(" \t\n\r\f\v");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The largest device config_from_env accepts, as runtime/config.py's MAX_CORES and
// MAX_CORE_MEMORY.
constexpr int kMaxCores = 1024;
constexpr uint64_t kMaxCoreMemory = uint64_t(1) << 50;

bool digits(const std::string &s) {
  return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(uint8_t(c)); });
}

const char *env(const char *name) { return std::getenv(name); }  // read once, at open

// A value as Python's repr() shows it in config.py's messages (for ASCII: its quote, and
// backslash, control and DEL bytes escaped), so both runtimes refuse in the same words.
std::string quoted(const std::string &s) {
  char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\' || c == uint8_t(q)) out += {'\\', char(c)};
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else {
      out += char(c);
    }
  }
  return out + q;
}

}  // namespace

std::string list(const std::vector<int> &v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

namespace {

// config.parse_bytes: 4096, 512KiB, 64MiB, 4GiB (case-insensitive, i and B optional).
uint64_t parse_bytes(const std::string &text, const char *var) {
  std::string t = trim(text);
  size_t n = 0;
  while (n < t.size() && std::isdigit(uint8_t(t[n]))) ++n;
  std::string unit = trim(t.substr(n));
  for (char &c : unit) c = char(std::toupper(uint8_t(c)));
  uint64_t scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit[0] == 'K' || unit[0] == 'M' || unit[0] == 'G') {
    std::string rest = unit.substr(1);
    if (rest.empty() || rest == "I" || rest == "B" || rest == "IB")
      scale = unit[0] == 'K' ? 1 << 10 : unit[0] == 'M' ? 1 << 20 : 1 << 30;
  }
  if (n == 0 || scale == 0)
    bad(std::string(var) + "=" + quoted(text) + ": expected a byte count such as 4096, 512MiB or 4GiB");
  // Python's int has no limit; past 2^64 - 1 bytes (no host has them) the count stays there
  // rather than wrap: 17179869184G wrapped to 0, and every load was then out of memory.
  uint64_t bytes = 0;
  for (size_t k = 0; k < n; ++k)
    if (__builtin_mul_overflow(bytes, uint64_t(10), &bytes) ||
        __builtin_add_overflow(bytes, uint64_t(t[k] - '0'), &bytes))
      return UINT64_MAX;
  return __builtin_mul_overflow(bytes, scale, &bytes) ? UINT64_MAX : bytes;
}

std::vector<int> parse_cores(const std::string &text, int num_cores) {
  std::vector<int> cores;
  bool out_of_range = false;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string part = trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    size_t dash = part.find('-');
    std::string lo = trim(part.substr(0, dash)), hi = dash == std::string::npos ? lo : trim(part.substr(dash + 1));
    if (!digits(lo) || !digits(hi))
      bad("NEURONISH_VISIBLE_CORES=" + quoted(text) + ": expected e.g. '0-1', '2' or '0,2'");
    int first = std::stoi(lo), last = std::stoi(hi);
    // A range past the last core is refused below; it is not expanded first (0-999999999
    // would take gigabytes before the refusal).
    if (first <= last && last >= num_cores) out_of_range = true;
    for (int c = first; !out_of_range && c <= last; ++c) cores.push_back(c);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::set<int> distinct(cores.begin(), cores.end());
  if (out_of_range || distinct.size() != cores.size() || cores.empty())
    bad("NEURONISH_VISIBLE_CORES=" + quoted(text) + ": cores must be distinct and in 0.." +
        std::to_string(num_cores - 1) + " (NEURONISH_NUM_CORES=" + std::to_string(num_cores) + ")");
  return cores;
}

std::vector<std::vector<int>> parse_groups(const std::string &text, const std::vector<int> &visible) {
  std::vector<int> sizes;
  uint64_t total = 0;
  size_t start = 0;
  std::string usage = "NEURONISH_CORE_GROUP_SIZES=" + quoted(text) + ": expected e.g. '2,2' or '4x1'";
  while (true) {
    size_t comma = text.find(',', start);
    std::string part = trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    size_t x = part.find('x');
    std::string a = trim(part.substr(0, x)), b = x == std::string::npos ? "" : trim(part.substr(x + 1));
    if (!digits(a) || (x != std::string::npos && !digits(b))) bad(usage);
    int count = x == std::string::npos ? 1 : std::stoi(a), size = x == std::string::npos ? std::stoi(a) : std::stoi(b);
    if (size == 0) bad(usage);
    if (__builtin_add_overflow(total, uint64_t(count) * uint64_t(size), &total)) total = UINT64_MAX;
    // Sizes are listed only while they could fit: 999999999x1 would take gigabytes
    // before it is refused below.
    if (total <= visible.size()) sizes.insert(sizes.end(), size_t(count), size);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (total > visible.size())
    bad("NEURONISH_CORE_GROUP_SIZES=" + quoted(text) + " needs " + std::to_string(total) + " cores, only " +
        std::to_string(visible.size()) + " are visible");
  std::vector<std::vector<int>> groups;
  size_t at = 0;
  for (int s : sizes) {
    groups.emplace_back(visible.begin() + long(at), visible.begin() + long(at + size_t(s)));
    at += size_t(s);
  }
  return groups;
}

// NEURONISH_FAILED_CORES (runtime/device.py's failed_cores_from_env, word for word):
// "1", "0,1", "1:ECC error,0": visible cores, each with an optional reason after ':'.
std::vector<std::pair<int, std::string>> parse_failed(const std::string &text, const std::vector<int> &visible) {
  std::vector<std::pair<int, std::string>> failed;
  if (trim(text).empty()) return failed;
  const std::string var = "NEURONISH_FAILED_CORES=" + quoted(text) + ": ";
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string entry = trim(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    size_t colon = entry.find(':');
    std::string core = trim(entry.substr(0, colon));
    std::string why = colon == std::string::npos ? "" : trim(entry.substr(colon + 1));
    if (!digits(core))
      bad(var + "expected visible cores separated by commas, each with an optional reason after ':' "
                "(e.g. '1' or '0:ECC error,1'); got " + quoted(entry));
    int c = std::stoi(core);
    if (std::find(visible.begin(), visible.end(), c) == visible.end())
      bad(var + "core " + std::to_string(c) + " is not one of the visible cores " + list(visible));
    for (auto &f : failed)
      if (f.first == c) bad(var + "core " + std::to_string(c) + " is named twice");
    failed.emplace_back(c, why.empty() ? "named in NEURONISH_FAILED_CORES" : why);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return failed;
}

int positive(const char *var, const char *text) {
  std::string t = trim(text);
  if (!digits(t) || std::stoi(t) <= 0)
    bad(std::string(var) + " must be a positive integer, got " + quoted(text));
  return std::stoi(t);
}

}  // namespace

DeviceConfig config_from_env() {
  DeviceConfig c;
  if (const char *v = env("NEURONISH_NUM_CORES")) {
    std::string t = trim(v);
    bool neg = !t.empty() && t[0] == '-';
    if (!digits(neg ? t.substr(1) : t))
      bad(std::string("NEURONISH_NUM_CORES must be a positive integer, got ") + quoted(v));
    if (neg || std::stoi(t) < 1) bad("NEURONISH_NUM_CORES must be >= 1, got " + t);
    // As runtime/config.py: a device of more cores is a typo, and would be built core by
    // core before anything else could refuse it.
    if (std::stoi(t) > kMaxCores)
      bad("NEURONISH_NUM_CORES must be at most " + std::to_string(kMaxCores) + ", got " + t);
    c.num_cores = std::stoi(t);
  }
  if (const char *v = env("NEURONISH_CORE_MEMORY"); v && *v) {  // (empty: unset, as in Python)
    c.core_memory = parse_bytes(v, "NEURONISH_CORE_MEMORY");
    if (c.core_memory > kMaxCoreMemory)
      bad(std::string("NEURONISH_CORE_MEMORY=") + quoted(v) + ": at most 1PiB (" +
          std::to_string(kMaxCoreMemory) + " bytes) per core");
  }
  if (const char *v = env("NEURONISH_VISIBLE_CORES"); v && *v) {
    c.visible_cores = parse_cores(v, c.num_cores);
  } else {
    for (int i = 0; i < c.num_cores; ++i) c.visible_cores.push_back(i);
  }
  if (const char *v = env("NEURONISH_CORE_GROUP_SIZES"); v && *v) {
    c.core_groups = parse_groups(v, c.visible_cores);
  } else {
    for (int core : c.visible_cores) c.core_groups.push_back({core});
  }
  const char *threads = env("NEURONISH_CORE_THREADS");
  if (threads) positive("NEURONISH_CORE_THREADS", threads);
  const char *parallelism = env("NEURONISH_HOST_PARALLELISM");
  int cpus = usable_cpus();  // the affinity mask, capped by a container's CPU quota
  if (!parallelism && threads) {
    c.host_parallelism = std::max(1, cpus / positive("NEURONISH_CORE_THREADS", threads));
  } else if (!parallelism) {
    int blas = cpus;  // config.default_host_parallelism: BLAS threads as OpenBLAS reads them
    for (const char *var : {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"}) {
      const char *t = env(var);
      if (t && digits(trim(t)) && std::stoi(trim(t)) > 0) { blas = std::stoi(trim(t)); break; }
    }
    c.host_parallelism = std::max(1, cpus / blas);
  } else {
    c.host_parallelism = positive("NEURONISH_HOST_PARALLELISM", parallelism);
  }
  c.core_threads = threads ? positive("NEURONISH_CORE_THREADS", threads) : std::max(1, cpus / c.host_parallelism);
  c.share_by_width = parallelism == nullptr;
  if (const char *v = env("NEURONISH_NARROW_TWIN")) {
    std::string t = trim(v);  // (blank: the default, as config.py reads it)
    if (t == "off") c.narrow_twin = DeviceConfig::Twin::off;
    else if (t == "queued") c.narrow_twin = DeviceConfig::Twin::queued;
    else if (t == "auto" || t.empty()) c.narrow_twin = DeviceConfig::Twin::automatic;
    else bad("NEURONISH_NARROW_TWIN must be auto, queued or off, got " + quoted(v));
  }
  if (const char *v = env("NEURONISH_FAILED_CORES")) c.failed_cores = parse_failed(v, c.visible_cores);
  return c;
}

HostCPUs::HostCPUs(int cpus, int fixed_width) : cpus_(std::max(1, cpus)), fixed_(fixed_width), free_(cpus_) {}

int HostCPUs::width(int team) const {
  int w = fixed_ > 0 ? fixed_ : team;
  return std::min(std::max(1, w), cpus_);
}

bool HostCPUs::acquire(int n, const std::function<bool()> &give_up, std::chrono::milliseconds poll) {
  std::unique_lock<std::mutex> lock(mu_);
  if (waiting_.empty() && free_ >= n) {
    free_ -= n;
    return true;
  }
  uint64_t ticket = next_ticket_++;
  waiting_.push_back(ticket);
  auto ready = [&] { return waiting_.front() == ticket && free_ >= n; };
  bool got = true;
  if (!give_up) {
    cv_.wait(lock, ready);
  } else {
    while (!cv_.wait_for(lock, poll, ready))
      if (give_up()) { got = false; break; }
  }
  if (got) free_ -= n;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), ticket));
  cv_.notify_all();  // the next in line may now be first
  return got;
}

int HostCPUs::acquire_either(int n, bool wide_if_idle, const std::function<bool()> &give_up) {
  {
    // (seen and taken under one lock: a call that saw the CPUs free, then waited behind
    // another for them, would lose what the twin is for)
    std::lock_guard<std::mutex> lock(mu_);
    if (wide_if_idle && waiting_.empty() && free_ >= n) {
      free_ -= n;
      return n;
    }
  }
  return acquire(1, give_up) ? 1 : 0;
}

void HostCPUs::release(int n) {
  bool waiters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_ += n;
    waiters = !waiting_.empty();  // (a waiter joins the line under the lock before it waits)
  }
  if (waiters) cv_.notify_all();
}

Device::Device(DeviceConfig config)
    : config_(std::move(config)),
      host_(config_.host_parallelism * config_.core_threads, config_.share_by_width ? 0 : config_.core_threads) {
  for (int c : config_.visible_cores) used_[c] = 0;
  for (auto &[core, why] : config_.failed_cores)
    failed_.emplace_back(core, "core " + std::to_string(core) + " failed (" + why + ")");
}

uint64_t Device::used(int core) {
  std::lock_guard<std::mutex> lock(mu_);
  return used_.at(core);
}

std::vector<std::vector<int>> Device::candidate_groups(size_t size) const {
  std::vector<std::vector<int>> groups;
  for (auto &g : config_.core_groups)
    if (g.size() >= size) groups.emplace_back(g.begin(), g.begin() + long(size));
  bool singles = std::all_of(config_.core_groups.begin(), config_.core_groups.end(),
                             [](auto &g) { return g.size() == 1; });
  if (groups.empty() && singles && size > 0) {  // default layout: consecutive runs of cores
    auto &cores = config_.visible_cores;
    for (size_t i = 0; i + size <= cores.size(); i += size)
      groups.emplace_back(cores.begin() + long(i), cores.begin() + long(i + size));
  }
  groups.erase(std::remove_if(groups.begin(), groups.end(),
                              [&](auto &g) { return std::any_of(g.begin(), g.end(), [&](int c) { return failed(c); }); }),
               groups.end());
  return groups;
}

bool Device::failed(int core) const {
  return std::any_of(failed_.begin(), failed_.end(), [&](auto &f) { return f.first == core; });
}

void Device::fail_core(int core, const std::string &why) {
  const std::string message = "core " + std::to_string(core) + " failed (" + why + ")";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!used_.count(core))
      throw Refused{NR_INVALID_ARGUMENT, "core " + std::to_string(core) + " is not one of the visible cores " +
                                             list(config_.visible_cores)};
    if (failed(core)) return;  // (its models lost it then)
    failed_.emplace_back(core, message);
  }
  // (A model loading now is not in models_ yet: it looks at failed_ when it tracks itself.)
  std::lock_guard<std::mutex> lock(models_mu_);
  for (Model *model : models_) model->lose_core(core, message);
}

std::string Device::failure(int core) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!used_.count(core))
    throw Refused{NR_INVALID_ARGUMENT, "core " + std::to_string(core) + " is not one of the visible cores " +
                                           list(config_.visible_cores)};
  for (auto &[c, message] : failed_)
    if (c == core) return message;
  return "";
}

void Device::track(Model *model) {
  std::lock_guard<std::mutex> lock(models_mu_);
  models_.insert(model);
  std::vector<std::pair<int, std::string>> failed;
  {
    std::lock_guard<std::mutex> lock_failed(mu_);
    failed = failed_;
  }
  for (auto &[core, message] : failed) model->lose_core(core, message);
}

void Device::untrack(Model *model) {
  std::lock_guard<std::mutex> lock(models_mu_);
  models_.erase(model);
}

std::vector<Reservation> Device::reserve(size_t group_size, const std::vector<uint64_t> &bytes,
                                         size_t copies) {
  std::lock_guard<std::mutex> lock(mu_);
  auto groups = candidate_groups(group_size);  // (none with a failed core)
  if (copies > groups.size()) {
    std::string all, failed;
    for (auto &g : config_.core_groups) all += (all.empty() ? "" : ", ") + list(g);
    for (auto &f : failed_) failed += (failed.empty() ? "; failed: " : ", ") + f.second;
    throw Refused{NR_DEVICE_ERROR, "cannot load " + std::to_string(copies) + " duplicate(s) of a model that needs " +
                  std::to_string(group_size) + " core(s) per copy: the device has " + std::to_string(groups.size()) +
                  " such core group(s) (visible cores " + list(config_.visible_cores) + ", groups [" + all +
                  "]" + failed + "); set NEURONISH_NUM_CORES / NEURONISH_CORE_GROUP_SIZES or ask for fewer"};
  }
  auto min_free = [&](const std::vector<int> &g) {
    uint64_t m = UINT64_MAX;
    for (int c : g) m = std::min(m, free_bytes(c));
    return m;
  };
  std::vector<std::vector<int>> fits;
  for (auto &g : groups) {
    bool ok = true;
    for (size_t k = 0; k < g.size(); ++k) ok = ok && free_bytes(g[k]) >= bytes[k];
    if (ok) fits.push_back(g);
  }
  if (fits.size() < copies) {
    auto best = *std::max_element(groups.begin(), groups.end(),
                                  [&](auto &a, auto &b) { return min_free(a) < min_free(b); });
    uint64_t need = *std::max_element(bytes.begin(), bytes.end());
    char text[512];
    std::snprintf(text, sizeof text,
                  "out of device memory: loading needs %.1f MiB on each core of %zu core group(s); %zu "
                  "group(s) have room, the freest core group %s has %.1f MiB free of %.0f MiB per core. "
                  "Unload a model, load fewer duplicates, or raise NEURONISH_CORE_MEMORY",
                  double(need) / kMiB, copies, fits.size(), list(best).c_str(), double(min_free(best)) / kMiB,
                  double(config_.core_memory) / kMiB);
    throw Refused{NR_OUT_OF_DEVICE_MEMORY, text};
  }
  std::stable_sort(fits.begin(), fits.end(), [&](auto &a, auto &b) { return min_free(a) > min_free(b); });
  std::vector<Reservation> out;
  for (size_t i = 0; i < copies; ++i) {
    for (size_t k = 0; k < fits[i].size(); ++k) used_[fits[i][k]] += bytes[k];
    out.push_back({fits[i], bytes});
  }
  return out;
}

void Device::resize(Reservation &r, const std::vector<uint64_t> &bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t k = 0; k < r.cores.size(); ++k) {
    int c = r.cores[k];
    if (bytes[k] > r.bytes_per_core[k] && bytes[k] - r.bytes_per_core[k] > free_bytes(c)) {
      char text[400];
      std::snprintf(text, sizeof text,
                    "out of device memory: the loaded model needs %.1f MiB on core %d, which has %.1f MiB free "
                    "of %.0f MiB. Unload a model, load fewer duplicates, or raise NEURONISH_CORE_MEMORY",
                    double(bytes[k]) / kMiB, c, double(free_bytes(c) + r.bytes_per_core[k]) / kMiB,
                    double(config_.core_memory) / kMiB);
      throw Refused{NR_OUT_OF_DEVICE_MEMORY, text};
    }
  }
  for (size_t k = 0; k < r.cores.size(); ++k) used_[r.cores[k]] += bytes[k] - r.bytes_per_core[k];
  r.bytes_per_core = bytes;
}

void Device::release(const Reservation &r) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t k = 0; k < r.cores.size(); ++k) used_[r.cores[k]] -= r.bytes_per_core[k];
}

void Device::charge(const std::vector<int> &cores, const std::vector<int64_t> &deltas) {
  std::lock_guard<std::mutex> lock(mu_);
  // A core named twice: its deltas summed, in 128 bits (a caller's deltas are untrusted:
  // two of INT64_MAX must read as the 2^64 bytes they ask for, not wrap to a refund).
  std::map<int, __int128> total;
  for (size_t k = 0; k < cores.size(); ++k) {
    if (!used_.count(cores[k]))
      throw Refused{NR_INVALID_ARGUMENT, "core " + std::to_string(cores[k]) + " is not one of the visible cores " +
                                             list(config_.visible_cores)};
    total[cores[k]] += deltas[k];
  }
  auto decimal = [](unsigned __int128 n) {  // (std::to_string has no 128-bit overload)
    std::string s;
    do s.insert(s.begin(), char('0' + int(n % 10))); while (n /= 10);
    return s;
  };
  for (auto &[c, d] : total) {
    if (d < 0 && (unsigned __int128)(-d) > used_[c])
      throw Refused{NR_INVALID_ARGUMENT, "cannot give back " + decimal((unsigned __int128)(-d)) + " bytes on core " +
                                             std::to_string(c) + ": it holds " + std::to_string(used_[c])};
    if (d > 0 && (unsigned __int128)d > free_bytes(c)) {
      char text[400];
      std::snprintf(text, sizeof text,
                    "out of device memory: %.1f MiB more needed on core %d, which has %.1f MiB free of %.0f MiB. "
                    "Unload a model, load fewer duplicates, or raise NEURONISH_CORE_MEMORY",
                    double(d) / kMiB, c, double(free_bytes(c)) / kMiB, double(config_.core_memory) / kMiB);
      throw Refused{NR_OUT_OF_DEVICE_MEMORY, text};
    }
  }
  for (auto &[c, d] : total) used_[c] = uint64_t(__int128(used_[c]) + d);  // (within 0..core memory)
}

}  // namespace nr
