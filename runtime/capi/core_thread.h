// A core's host thread: the long-lived thread that runs the stages handed to one core of
// a loaded copy (one per stage of each copy), one at a time, in arrival order.
//
// Why not run a stage on the calling thread under the core's lock, as the C runtime did
// until session 6: eight callers of a pipelined model then handed the two cores to each
// other through futex wake-ups, a different caller computing each time, and reached 1.53x
// one core where core threads reach 1.89x (docs/c-api.md, "Per-core host threads in C").
// The suspected cause, not verified (the host was saturated under `perf sched`): the
// default (CFS/EEVDF) scheduler placing a woken caller on the CPU that woke it while the
// other idled. A core's own thread computes stage after stage, and a pipelined call moves
// from core thread to core thread, its caller sleeping until the last stage is done.
//
// A caller may still run a stage itself when the core is idle and nobody is queued for it
// (`try_enter`): a single-stage model's lone call then pays no hand-off (a tiny model's
// whole call is ~1 us in C; two wake-ups cost more than that).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace nr {

// One stage of one call, handed to a core's thread.
class CoreJob {
 public:
  virtual void run() noexcept = 0;  // on the core's thread; what happens next is the job's

 protected:
  ~CoreJob() = default;
};

class CoreThread {
 public:
  CoreThread() = default;
  ~CoreThread();  // ends the thread; nothing may be queued (a model unloads with no call in flight)
  CoreThread(const CoreThread &) = delete;
  CoreThread &operator=(const CoreThread &) = delete;

  // Takes the core for the calling thread when it is idle and nobody is queued: true, and
  // the caller runs its stage, then leave(). False: the core is busy; submit() instead.
  bool try_enter();
  void leave();
  // Queues `job` behind those queued before it; the core's thread (started on first use)
  // runs it once the core is free.
  void submit(CoreJob *job);
  // Takes `job` out of the queue if it has not started: true. (A caller giving up.)
  bool withdraw(CoreJob *job);

 private:
  void loop();
  void start_locked();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CoreJob *> queue_;
  bool busy_ = false;  // a stage is running on the core (on its thread or a caller's)
  bool stop_ = false;
  std::unique_ptr<std::thread> thread_;
  uint64_t generation_ = 0;  // the fork generation the thread was started in
};

// The Linux thread id of the calling thread (cached per thread: no system call per use).
int64_t this_thread_tid();

}  // namespace nr
