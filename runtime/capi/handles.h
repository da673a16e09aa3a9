// What the C API's opaque handles hold, and how every entry point turns a C++ error into
// a status and a message in the caller's buffer (no exception crosses the C API).
#pragma once
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "executable.h"

// Shared: a model keeps the executable it was loaded from (its constants live in the
// body), so unloading the executable handle first is fine.
struct nr_executable {
  std::shared_ptr<nr::Executable> exe;
};

namespace nr {

inline nr_status report(nr_status status, const std::string &message, char *error, size_t error_size) {
  if (error && error_size) {
    size_t n = std::min(message.size(), error_size - 1);
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return status;
}

template <typename F>
nr_status guarded(char *error, size_t error_size, F &&body) {
  try {
    body();
    return NR_OK;
  } catch (const Refused &r) {
    return report(r.status, r.message, error, error_size);
  } catch (const std::bad_alloc &) {
    return report(NR_OUT_OF_MEMORY, "out of host memory", error, error_size);
  } catch (const std::exception &e) {
    return report(NR_INTERNAL, std::string("internal error: ") + e.what(), error, error_size);
  }
}

}  // namespace nr
