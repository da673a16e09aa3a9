// runtime/cgroup.py in C++: the same files, the same walk, the same rounding.
#include "cpu_quota.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

namespace nr {
namespace {

struct GroupDir {
  std::string dir, mount_point;
  int version;
};

bool read_file(const std::string &path, std::string *out) {
  std::ifstream f(path);
  if (!f) return false;
  std::stringstream s;
  s << f.rdbuf();
  *out = s.str();
  return true;
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

std::vector<std::string> words(const std::string &s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool lists(const std::string &list, const std::string &item, char sep = ',') {
  for (const std::string &p : split(list, sep))
    if (p == item) return true;
  return false;
}

bool octal(char c) { return c >= '0' && c <= '7'; }

// mountinfo writes space, tab, newline and backslash in paths as octal escapes (\ooo, at
// most \177, ASCII); a backslash followed by anything else is kept as it is (cgroup._unescape).
std::string unescape(const std::string &field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() && field[i + 1] >= '0' && field[i + 1] <= '1' && octal(field[i + 2]) &&
        octal(field[i + 3])) {
      out += char((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// Where the group `path` is under a hierarchy mounted from `root` (cgroup._group_dir).
std::string group_dir(const std::string &mount_point, std::string root, const std::string &path) {
  while (!root.empty() && root.back() == '/') root.pop_back();
  if (path == root || path.compare(0, root.size() + 1, root + "/") == 0) {
    std::string rest = path.substr(root.size());
    while (!rest.empty() && rest.front() == '/') rest.erase(0, 1);
    return rest.empty() ? mount_point : mount_point + "/" + rest;
  }
  return mount_point;
}

std::vector<GroupDir> cpu_group_dirs(const std::string &cgroup, const std::string &mountinfo) {
  std::optional<std::string> v1, v2;
  for (const std::string &line : split(cgroup, '\n')) {
    size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (lists(path, "..", '/')) continue;  // outside this process's cgroup namespace (cgroup.py)
    if (id == "0" && controllers.empty()) v2 = path;
    else if (lists(controllers, "cpu")) v1 = path;
  }
  std::vector<GroupDir> found;
  for (const std::string &line : split(mountinfo, '\n')) {
    size_t sep = line.find(" - ");
    if (sep == std::string::npos) continue;
    std::vector<std::string> left = words(line.substr(0, sep)), right = words(line.substr(sep + 3));
    if (left.size() < 5 || right.size() < 3) continue;
    const std::string &root = left[3], &fstype = right[0];
    std::string mount_point = unescape(left[4]);
    if (fstype == "cgroup2" && v2) found.push_back({group_dir(mount_point, root, *v2), mount_point, 2});
    else if (fstype == "cgroup" && v1 && lists(right[2], "cpu"))
      found.push_back({group_dir(mount_point, root, *v1), mount_point, 1});
  }
  return found;
}

// A file's text as a decimal integer ("-1", "150000\n"); nullopt for anything else ("max",
// "15x", "", more than 18 digits), where std::stoll would take "15x" as 15 (cgroup._number).
std::optional<long long> whole_number(const std::string &text) {
  std::vector<std::string> w = words(text);
  if (w.size() != 1) return std::nullopt;
  const std::string &t = w[0];
  size_t start = t[0] == '-' || t[0] == '+' ? 1 : 0;
  if (t.size() == start || t.size() - start > 18) return std::nullopt;
  long long v = 0;
  for (size_t i = start; i < t.size(); ++i) {
    if (t[i] < '0' || t[i] > '9') return std::nullopt;
    v = v * 10 + (t[i] - '0');
  }
  return t[0] == '-' ? -v : v;
}

// A group's CPU limit in CPUs; nullopt when it sets none or its files are unreadable.
std::optional<double> read_limit(const std::string &dir, int version) {
  std::string quota, period;
  if (version == 2) {
    std::string text;
    if (!read_file(dir + "/cpu.max", &text)) return std::nullopt;
    std::vector<std::string> w = words(text);
    if (w.size() != 2) return std::nullopt;
    quota = w[0], period = w[1];
  } else {
    if (!read_file(dir + "/cpu.cfs_quota_us", &quota) || !read_file(dir + "/cpu.cfs_period_us", &period))
      return std::nullopt;
  }
  std::optional<long long> q = whole_number(quota), p = whole_number(period);  // "max": no limit
  if (q && p && *q > 0 && *p > 0) return double(*q) / double(*p);
  return std::nullopt;
}

}  // namespace

std::optional<double> cgroup_cpu_limit(const std::string &proc) {
  std::string cgroup, mountinfo;
  if (!read_file(proc + "/cgroup", &cgroup) || !read_file(proc + "/mountinfo", &mountinfo)) return std::nullopt;
  std::optional<double> tightest;
  for (const GroupDir &g : cpu_group_dirs(cgroup, mountinfo)) {
    // The group and each parent up to the mount point: a parent's quota binds its children.
    for (std::string d = g.dir;;) {
      if (std::optional<double> limit = read_limit(d, g.version))
        tightest = tightest ? std::min(*tightest, *limit) : *limit;
      if (d.size() <= g.mount_point.size() || d.compare(0, g.mount_point.size(), g.mount_point) != 0) break;
      d = d.substr(0, d.find_last_of('/'));
      if (d.size() < g.mount_point.size()) break;
    }
  }
  return tightest;
}

int usable_cpus() {
  int cpus;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    cpus = CPU_COUNT(&set);
  } else {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cpus = n > 0 ? int(n) : 1;
  }
  if (std::optional<double> limit = cgroup_cpu_limit()) cpus = std::min(cpus, int(std::floor(*limit)));
  return std::max(1, cpus);
}

}  // namespace nr
