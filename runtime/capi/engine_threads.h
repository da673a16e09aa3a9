// Where the C runtime's engine runs wide stages: runtime/native/engine_program.py's
// _EngineThreads in C++.
//
// libgomp gives every thread that opens a parallel region a worker pool of its own, and
// once the pools' threads outnumber the CPUs it stops spinning between regions. A NeuronOp
// runs on whichever of TensorFlow's threads picks it up, so each of them grew a pool and
// every oneDNN primitive of a call paid a worker wake-up (~80 us on a 2-vCPU VM; measured
// in Python: MobileNetV2 bf16 batch 8, 14.8 ms from one thread, 19.4 ms once a second
// thread had made calls). The process's main thread runs its own calls; any other
// thread's wide stage is handed to one of a few persistent engine threads, one per stage
// in flight, so the number of pools stays the number of calls running at once.
//
// Loading a model opens parallel regions too (oneDNN reorders the weights as it builds each
// primitive), so loads from other threads go to the engine threads as well: a NeuronOp
// loads on the TensorFlow thread that runs its first call, and that thread's pool, kept
// for the thread's life, made the engine threads' pools one too many for libgomp to spin
// (MobileNetV2 fp32 batch 8 through TensorFlow paid a wake-up per primitive on every call).
#pragma once

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

namespace nr {

class EngineThreads {
 public:
  // `run` on an engine thread (or here, on the main thread); its result.
  static int64_t call(const std::function<int64_t()> &run) {
    if (syscall(SYS_gettid) == getpid()) return run();
    EngineThreads &self = instance();
    Worker *worker;
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      if (self.idle_.empty()) {
        worker = new Worker;  // lives as long as the process (its thread never ends)
        std::thread(&Worker::loop, worker).detach();
      } else {
        worker = self.idle_.back();
        self.idle_.pop_back();
      }
    }
    int64_t result = worker->call(run);
    std::lock_guard<std::mutex> lock(self.mu_);
    self.idle_.push_back(worker);
    return result;
  }

  // `work` where call() would run it, its exception (if any) rethrown here: an engine
  // thread's loop must not end in one.
  template <class Work>
  static void run(Work &&work) {
    std::exception_ptr error;
    call([&]() -> int64_t {
      try {
        work();
      } catch (...) {
        error = std::current_exception();
      }
      return 0;
    });
    if (error) std::rethrow_exception(error);
  }

 private:
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    const std::function<int64_t()> *job = nullptr;
    int64_t result = 0;
    bool done = false;

    void loop() {
      std::unique_lock<std::mutex> lock(mu);
      for (;;) {
        cv.wait(lock, [&] { return job != nullptr; });
        result = (*job)();
        job = nullptr;
        done = true;
        cv.notify_all();
      }
    }

    int64_t call(const std::function<int64_t()> &run) {
      std::unique_lock<std::mutex> lock(mu);
      job = &run;
      done = false;
      cv.notify_all();
      cv.wait(lock, [&] { return done; });
      return result;
    }
  };

  // A forked child has none of the parent's engine threads (and maybe a lock another of
  // its threads held): it starts afresh.
  EngineThreads() {
    pthread_atfork(nullptr, nullptr, [] {
      EngineThreads &self = instance();
      new (&self.mu_) std::mutex;
      new (&self.idle_) std::vector<Worker *>;
    });
  }

  // Never destroyed: detached engine threads may still wait on their workers at exit.
  static EngineThreads &instance() {
    static EngineThreads *threads = new EngineThreads;
    return *threads;
  }

  std::mutex mu_;
  std::vector<Worker *> idle_;
};

}  // namespace nr
