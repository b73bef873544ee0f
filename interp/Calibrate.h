// `epl calibrate`: measures this machine for `epl plan --cluster here` (docs/cluster.md):
// the GEMM FLOP/s and memory bandwidth one rank reaches at each thread count, and the
// all-reduce's latency and bandwidth between two ranks.
#pragma once
#include "backend/comm/Comm.h"
#include "ir/Cluster.h"

#include <nlohmann/json.hpp>
#include <ostream>
#include <utility>
#include <vector>

namespace epl::interp {

// The counts `epl calibrate` measures at, of threads and of ranks side by side: 1, 2, 4, …
// below `cores`, then `cores`.
std::vector<int> calibratedCounts(int cores);

// This machine's cluster file without its link: the device, and the rates by threads a
// rank (1, 2, 4, … and all cores) under `calibration`, each the median of `rounds`
// measurements. Says what it measures on `log`.
nlohmann::json measureCompute(std::ostream& log, int rounds);

// The last-level cache as a bandwidth curve ([bytes, bytes/s] ascending, all cores) shows it:
// from the curve's fastest point on, the largest working set moved at least 1.5 times as fast
// as `memory` (the cores' rate over a set larger than any cache), and no larger than `sysfs` (what
// the system reports; 0: nothing) where that is smaller. A virtual machine may report its host's
// whole cache (480 MB on one), or none. 0: the curve shows no cache. (The curve's point past the
// cache is within a few percent of the memory's rate, one round more than a tenth above it: a lower
// bar would take it for cache.)
double cacheFromCurve(const std::vector<std::pair<double, double>>& curve, double memory,
                      double sysfs);

// The all-reduce over `comm` (two ranks or more): its latency a hop from a 4-byte sum, and
// its bus bandwidth from a 16 MiB one, each averaged over a fixed count. Collective: every
// rank calls it.
ir::Link measureLink(backend::Comm& comm);

// The GEMM rate of comm's ranks side by side on this machine: each of them on its share of
// the cores' threads (cores / ranks) times the large products of `gemm_flops` at once, a
// barrier before each round; their rates summed, the median of `rounds`. Collective: every
// rank calls it, and each gets the sum.
double measureSideBySide(backend::Comm& comm, int rounds);

// One rank sending to another: ranks 0 and 1 of `comm` pass a message back and forth, its
// latency half a round trip of 4 bytes and its bandwidth from 16 MiB ones, each averaged
// over a fixed count; into link.sendLatency and sendBandwidth. Every rank calls it (the
// others wait at a barrier).
void measureSends(backend::Comm& comm, ir::Link& link);

} // namespace epl::interp
