// A core's host thread (core_thread.h).
#include "core_thread.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

namespace nr {
namespace {

// Bumped in a forked child: it has none of the parent's threads, so a core whose thread
// was started before the fork starts a new one at its next job.
std::atomic<uint64_t> g_fork_generation{0};
const bool g_fork_hook = [] {
  pthread_atfork(nullptr, nullptr, [] { g_fork_generation.fetch_add(1, std::memory_order_relaxed); });
  return true;
}();

}  // namespace

int64_t this_thread_tid() {
  thread_local const int64_t tid = int64_t(syscall(SYS_gettid));
  return tid;
}

CoreThread::~CoreThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_ && generation_ == g_fork_generation.load(std::memory_order_relaxed)) thread_->join();
  else if (thread_) (void)thread_.release();  // (a forked child's copy of the parent's: not ours to join)
}

bool CoreThread::try_enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_ || !queue_.empty()) return false;
  busy_ = true;
  return true;
}

void CoreThread::leave() {
  bool waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    waiting = !queue_.empty();
  }
  if (waiting) cv_.notify_all();  // (the core's thread waits for the core to be free)
}

void CoreThread::start_locked() {
  uint64_t generation = g_fork_generation.load(std::memory_order_relaxed);
  if (thread_ && generation_ == generation) return;
  if (thread_) {  // forked since it started: the thread is the parent's
    (void)thread_.release();
    busy_ = false;
  }
  generation_ = generation;
  thread_ = std::make_unique<std::thread>(&CoreThread::loop, this);
}

void CoreThread::submit(CoreJob *job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    queue_.push_back(job);
  }
  cv_.notify_all();
}

bool CoreThread::withdraw(CoreJob *job) {
  std::lock_guard<std::mutex> lock(mu_);
  auto at = std::find(queue_.begin(), queue_.end(), job);
  if (at == queue_.end()) return false;
  queue_.erase(at);
  return true;
}

void CoreThread::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!busy_ && !queue_.empty()); });
    if (stop_) return;
    CoreJob *job = queue_.front();
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    job->run();  // (may hand the call to the next core, or wake its caller: not ours after)
    lock.lock();
    busy_ = false;
  }
}

}  // namespace nr
