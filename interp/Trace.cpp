// Gathering every rank's trace on rank 0, and writing it as a Chrome trace.
#include "interp/Trace.h"

#include "backend/comm/Comm.h"
#include "support/Svg.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

namespace epl::interp {

namespace {

// Within the MPI standard's smallest tag bound. A pipeline's transfer may use the same tag,
// but the traces are gathered after the last step, when every transfer has completed.
constexpr int kTraceTag = 32767;

std::string serialize(const TraceRecorder& r, int stage) {
  nlohmann::json steps = nlohmann::json::array(), events = nlohmann::json::array();
  for (const TraceStep& s : r.steps())
    steps.push_back({s.step, s.startUs, s.endUs});
  for (const TraceEvent& e : r.events())
    events.push_back({e.name, e.step, e.micro, static_cast<int>(e.track), e.startUs, e.endUs});
  return nlohmann::json{{"stage", stage}, {"steps", steps}, {"events", events}}.dump();
}

RankTrace deserialize(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text);
  RankTrace t;
  t.stage = j.at("stage").get<int>();
  for (const auto& s : j.at("steps"))
    t.steps.push_back({s[0].get<int64_t>(), s[1].get<double>(), s[2].get<double>()});
  for (const auto& e : j.at("events"))
    t.events.push_back({e[0].get<std::string>(), e[1].get<int64_t>(), e[2].get<int>(),
                        static_cast<Track>(e[3].get<int>()), e[4].get<double>(),
                        e[5].get<double>()});
  return t;
}

} // namespace

// 1. Every rank learns every rank's byte count (allGather).
// 2. The other ranks send their serialized events to rank 0, which receives them in rank
//    order under one tag.
std::vector<RankTrace> gatherTraces(const TraceRecorder& mine, int stage, backend::Comm& comm) {
  std::string text = serialize(mine, stage);
  int64_t bytes = static_cast<int64_t>(text.size());
  std::vector<int64_t> sizes(static_cast<size_t>(comm.size()));
  comm.allGather(&bytes, sizes.data(), sizeof bytes, "the trace's sizes");
  std::vector<RankTrace> out;
  if (comm.rank() != 0) {
    backend::Request r = comm.isend(text.data(), bytes, 0, kTraceTag);
    comm.wait(r, "sending the trace to rank 0");
    return out;
  }
  out.push_back(deserialize(text));
  for (int k = 1; k < comm.size(); ++k) {
    std::string theirs(static_cast<size_t>(sizes[k]), '\0');
    backend::Request r = comm.irecv(theirs.data(), sizes[k], k, kTraceTag);
    comm.wait(r, fmt::format("the trace of rank {}", k));
    out.push_back(deserialize(theirs));
  }
  return out;
}

std::string traceSvgPath(const std::string& tracePath) {
  const std::string json = ".json";
  if (tracePath.size() > json.size() &&
      tracePath.compare(tracePath.size() - json.size(), json.size(), json) == 0)
    return tracePath.substr(0, tracePath.size() - json.size()) + ".svg";
  return tracePath + ".svg";
}

namespace {

// A box's colour by what the instruction did: its name's first word.
const char* traceColour(const std::string& name) {
  std::string word = name.substr(0, name.find(' '));
  if (word == "fwd") return "#4e79a7";
  if (word == "bwd") return "#f28e2b";
  if (word == "bwd-inputs") return "#e15759";
  if (word == "bwd-params") return "#59a14f";
  if (word == "optimizer" || word == "adam" || word == "adamw" || word == "sgd") return "#76b7b2";
  if (word.rfind("send", 0) == 0 || word.rfind("recv", 0) == 0) return "#b07aa1";
  if (word.rfind("reduce", 0) == 0 || word.rfind("gather", 0) == 0) return "#edc948";
  return "#9c9c9c";
}

} // namespace

std::optional<std::string> writeTraceSvg(const std::string& path,
                                         const std::vector<RankTrace>& ranks) {
  // The last step every rank traced, from the first rank's start of it to the last's end.
  int64_t step = -1;
  for (const RankTrace& r : ranks)
    if (!r.steps.empty())
      step = step < 0 ? r.steps.back().step : std::min(step, r.steps.back().step);
  double begin = 1e300, end = 0;
  for (const RankTrace& r : ranks)
    for (const TraceStep& s : r.steps)
      if (s.step == step) begin = std::min(begin, s.startUs), end = std::max(end, s.endUs);
  if (step < 0 || end <= begin) return std::string("no step was traced to draw");
  const double left = 150, top = 40, row = 18, width = 1000;
  double scale = width / (end - begin);
  Svg svg(left + width + 20, top + row * 2 * static_cast<double>(ranks.size()) + 40);
  svg.text(10, 22,
           fmt::format("step {} of the trace, {:.1f} ms; a row a rank and track (hover a box "
                       "for the instruction)",
                       step + 1, (end - begin) / 1000),
           13);
  for (size_t r = 0; r < ranks.size(); ++r)
    for (int track = 0; track < 2; ++track) {
      double y = top + row * static_cast<double>(2 * r + track);
      svg.text(10, y + row * 0.7,
               fmt::format("rank {} {}", r, track == 0 ? "compute" : "communication"), 10);
      svg.rect(left, y + 1, width, row - 2, "#f2f2f2", "");
      for (const TraceEvent& e : ranks[r].events) {
        if (e.step != step || static_cast<int>(e.track) != track) continue;
        double x = left + (std::max(e.startUs, begin) - begin) * scale;
        double w = std::max((std::min(e.endUs, end) - std::max(e.startUs, begin)) * scale, 0.5);
        svg.rect(x, y + 1, w, row - 2, traceColour(e.name),
                 fmt::format("rank {}: {} (micro-batch {}), {:.3f} ms at {:.3f} ms", r, e.name,
                             e.micro, (e.endUs - e.startUs) / 1000, (e.startUs - begin) / 1000));
      }
    }
  std::ofstream out(path, std::ios::binary);
  out << svg.str();
  out.close();
  if (!out)
    return fmt::format("cannot write the trace's picture `{}`: {}", path, std::strerror(errno));
  return std::nullopt;
}

std::optional<std::string> writeChromeTrace(const std::string& path,
                                            const std::vector<RankTrace>& ranks) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    auto meta = [&](const char* kind, int tid, const std::string& name) {
      events.push_back(
          {{"name", kind}, {"ph", "M"}, {"pid", r}, {"tid", tid}, {"args", {{"name", name}}}});
    };
    meta("process_name", 0, fmt::format("rank {} (stage {})", r, ranks[r].stage));
    meta("thread_name", 0, "compute");
    meta("thread_name", 1, "communication");
    for (const TraceEvent& e : ranks[r].events)
      events.push_back({{"name", e.name},
                        {"ph", "X"},
                        {"ts", e.startUs},
                        {"dur", e.endUs - e.startUs},
                        {"pid", r},
                        {"tid", static_cast<int>(e.track)},
                        {"args", {{"micro", e.micro}, {"step", e.step + 1}}}});
  }
  std::ofstream f(path, std::ios::trunc);
  if (f) f << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << "\n";
  f.close();
  if (!f) return fmt::format("cannot write the trace `{}`: {}", path, std::strerror(errno));
  return std::nullopt;
}

double measuredBubble(const std::vector<RankTrace>& ranks, int* steps) {
  // Per step: one window for every rank, from the first rank's start to the last rank's
  // end (a rank that finished early idles until the step ends on all of them), and the
  // compute time of every rank in it.
  struct Window {
    double start = 0, end = 0, busy = 0;
    int ranks = 0;
  };
  std::map<int64_t, Window> windows;
  for (const RankTrace& r : ranks)
    for (const TraceStep& s : r.steps) {
      Window& w = windows[s.step];
      w.start = w.ranks == 0 ? s.startUs : std::min(w.start, s.startUs);
      w.end = w.ranks == 0 ? s.endUs : std::max(w.end, s.endUs);
      ++w.ranks;
      for (const TraceEvent& e : r.events)
        if (e.step == s.step && e.track == Track::Compute) w.busy += e.endUs - e.startUs;
    }
  double sum = 0;
  int n = 0;
  for (const auto& [step, w] : windows) {
    double wall = w.end - w.start;
    if (wall <= 0) continue;
    sum += 1 - w.busy / (wall * w.ranks);
    ++n;
  }
  *steps = static_cast<int>(windows.size());
  return n > 0 ? sum / n : 0;
}

} // namespace epl::interp
