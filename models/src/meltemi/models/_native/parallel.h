// One parallel loop for the native kernels: items [0, n) shared by the calling thread and
// XLA's intra-op thread pool (`ffi::ThreadPool`), claimed one at a time from a counter.
//
// Why no deadlock: the caller waits only for items already claimed, so it never waits on a pool
// task that has not started (the caller may itself be one of the pool's threads, and the pool
// may be busy). A task that starts late finds no item left and returns without touching the
// kernel's buffers; shared ownership keeps the counters alive for it after the call returned.

#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace meltemi {

class Claims {
 public:
  explicit Claims(int64_t n) : n_(n) {}

  // One worker's view: `Next(&item)` marks its previous item done and claims the next one;
  // false when none is left.
  class Worker {
   public:
    explicit Worker(Claims& claims) : claims_(claims) {}
    bool Next(int64_t* item) {
      if (holding_) claims_.done_.fetch_add(1, std::memory_order_release);
      *item = claims_.next_.fetch_add(1, std::memory_order_relaxed);
      holding_ = *item < claims_.n_;
      return holding_;
    }

   private:
    Claims& claims_;
    bool holding_ = false;
  };

  bool Finished() const { return done_.load(std::memory_order_acquire) >= n_; }

 private:
  const int64_t n_;
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> done_{0};
};

// Calls `worker(claims)` on the calling thread and on up to `pool.num_threads() - 1` pool tasks
// (no more than `n`); each call loops `for (int64_t i; claims.Next(&i);)` over the items it gets
// and keeps its own scratch memory. Returns once every item is done.
template <typename WorkerFn>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t n, WorkerFn worker) {
  struct State {
    State(int64_t n, WorkerFn fn) : claims(n), fn(std::move(fn)) {}
    Claims claims;
    WorkerFn fn;
    void Run() {
      Claims::Worker claimer(claims);
      fn(claimer);
    }
  };
  auto state = std::make_shared<State>(n, std::move(worker));
  for (int64_t t = 1; t < pool.num_threads() && t < n; ++t) {
    pool.Schedule([state] { state->Run(); });
  }
  state->Run();
  while (!state->claims.Finished()) std::this_thread::yield();
}

}  // namespace meltemi
