// Sub-communicators (Comm::split) checked the same way on the in-process and the MPI
// communicators: the grid a pipeline with data parallelism uses (ranks of one stage across
// replicas, ranks of one replica's pipeline), both alive at once, each running collectives
// beside the other groups' and the parent's, and point to point inside a group.
#pragma once
#include "Reference.h"

#include <algorithm>
#include <fmt/format.h>
#include <string>
#include <vector>

namespace epl::commtest {

// Runs on every rank of `world`; returns what went wrong on this rank, or "".
inline std::string checkSplit(backend::Comm& world) {
  const int n = world.size(), r = world.rank();
  // 1. Columns by parity, ranked in reverse (key = -rank); rows of two consecutive ranks.
  std::vector<int> column, row;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) column.push_back(q);
  for (int q = 0; q < n; ++q)
    if (q / 2 == r / 2) row.push_back(q);
  auto columns = world.split(r % 2, -r);
  auto rows = world.split(r / 2, r);
  auto position = [](const std::vector<int>& g, int q) {
    return static_cast<int>(std::find(g.begin(), g.end(), q) - g.begin());
  };
  if (columns->size() != static_cast<int>(column.size()) || columns->rank() != position(column, r))
    return fmt::format("column: rank {} of {}, expected {} of {}", columns->rank(), columns->size(),
                       position(column, r), column.size());
  if (rows->size() != static_cast<int>(row.size()) || rows->rank() != position(row, r))
    return fmt::format("row: rank {} of {}, expected {} of {}", rows->rank(), rows->size(),
                       position(row, r), row.size());
  if (columns->timeout() != world.timeout()) return "the split did not keep the timeout";
  // 2. All-reduces on both groups and the world at once, waited in reverse order.
  const int64_t count = 70001;
  std::vector<float> inColumn = floats(r, count, true), inRow = inColumn, inWorld = inColumn;
  backend::Request a = columns->iallReduce(inColumn.data(), count);
  backend::Request b = rows->iallReduce(inRow.data(), count);
  backend::Request c = world.iallReduce(inWorld.data(), count);
  world.wait(c, "world");
  rows->wait(b, "row");
  columns->wait(a, "column");
  auto sumOver = [](const std::vector<int>& g, int64_t i) {
    double s = 0;
    for (int q : g)
      s += exactValue(q, i);
    return static_cast<float>(s);
  };
  std::vector<int> all;
  for (int q = 0; q < n; ++q)
    all.push_back(q);
  for (int64_t i = 0; i < count; ++i)
    if (inColumn[i] != sumOver(column, i) || inRow[i] != sumOver(row, i) ||
        inWorld[i] != sumOver(all, i))
      return fmt::format("all-reduce element {} differs from the group's sum", i);
  // 3. An all-gather of world ranks comes back in group order.
  std::vector<int> gathered(column.size());
  columns->allGather(&r, gathered.data(), sizeof r, "gather the column");
  if (gathered != column) return "the column's all-gather is not in key order";
  // 4. A ring of sends inside each row, by row ranks.
  int next = (rows->rank() + 1) % rows->size(),
      prev = (rows->rank() + rows->size() - 1) % rows->size();
  int got = -1;
  backend::Request recv = rows->irecv(&got, sizeof got, prev, 7);
  backend::Request send = rows->isend(&r, sizeof r, next, 7);
  rows->wait(send, "send in the row");
  rows->wait(recv, "recv in the row");
  if (got != row[prev])
    return fmt::format("received {} from row rank {}, expected {}", got, prev, row[prev]);
  // 5. A broadcast from each column's last rank, then a split of a split (singletons).
  int value = r;
  columns->broadcast(&value, sizeof value, columns->size() - 1, "broadcast in the column");
  if (value != column.back()) return "the column's broadcast came from the wrong rank";
  auto single = columns->split(columns->rank(), 0);
  float one = 1.f;
  single->allReduce(&one, 1, "alone");
  if (single->size() != 1 || single->rank() != 0 || one != 1.f) return "a singleton split";
  return "";
}

} // namespace epl::commtest
