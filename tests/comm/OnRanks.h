// Runs a body on every in-process rank, each on its own thread (LocalCommTest,
// StagedCommTest).
#pragma once
#include "backend/comm/Comm.h"

#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

namespace epl::commtest {

// Runs body(comm) for each rank of `comms` on its own thread, then rethrows the first
// exception a rank threw.
inline void onRanks(std::vector<std::unique_ptr<backend::Comm>>& comms,
                    const std::function<void(backend::Comm&)>& body) {
  std::vector<std::exception_ptr> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads)
    t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

} // namespace epl::commtest
