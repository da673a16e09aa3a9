// When a call is abandoned: at its deadline, or once its caller cancels it
// (runtime/cutoff.py in C++). Checked while the call waits for a copy, a core or the
// host's CPUs (waits look again every kPoll), and by the engine before every
// instruction; an instruction already computing finishes.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

#include "executable.h"

namespace nr {

struct Cutoff {
  double deadline = 0;                    // steady_clock (CLOCK_MONOTONIC) seconds; 0: none
  const volatile uint8_t *cancel = nullptr;  // non-zero: cancelled

  static constexpr std::chrono::milliseconds kPoll{20};  // cutoff.py's POLL_SECONDS

  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  bool stopped() const { return (cancel && *cancel) || (deadline > 0 && now() >= deadline); }
  // Throws Refused (NR_CANCELLED / NR_DEADLINE_EXCEEDED) if the call is to stop; `what`
  // says where it was, in cutoff.py's words.
  // (`what` is a literal: no string is built unless the call stops.)
  void check(const char *what) const {
    if (cancel && *cancel)
      throw Refused{NR_CANCELLED, std::string("the call was cancelled by its caller ") + what +
                                      "; the rest of it was abandoned"};
    if (deadline > 0 && now() >= deadline)
      throw Refused{NR_DEADLINE_EXCEEDED,
                    std::string("the call's deadline passed ") + what + "; the rest of it was abandoned"};
  }
  // How long to block before looking again.
  std::chrono::duration<double> slice() const {
    std::chrono::duration<double> left(deadline > 0 ? std::max(0.0, deadline - now()) : 1e9);
    return cancel ? std::min<std::chrono::duration<double>>(left, kPoll) : left;
  }
};

}  // namespace nr
