// The event log of a validation run: every observation the runner makes (a submit and its answer, each JobUpdate a
// client received, DegradedModeChanged, property samples, faults, memory steps, the final GetJob of each job, RSS
// samples) is one Event with a monotonic timestamp, written as one JSON object per line (JSONL). Metrics and the
// verdict are computed from events only, so a run can be re-analysed offline (tandem-validate --analyze).
// docs/validate.md lists every type and its fields.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/result.h"

namespace tandem::validate {

struct Event {
  std::int64_t t_us = 0;    // CLOCK_MONOTONIC, microseconds (comparable across processes of one boot)
  std::uint64_t seq = 0;    // order in which the runner recorded it (ties in t_us)
  std::string type;         // see docs/validate.md ("Event log")
  std::int32_t phase = -1;  // phase index, -1 = outside any phase
  std::int32_t client = -1; // the connection that saw it (-1 = the control/monitor connection)
  std::uint64_t job = 0;    // 0 = not about one job
  nlohmann::json data = nlohmann::json::object();
};

nlohmann::json to_json(const Event& e);
Result<Event> event_from_json(const nlohmann::json& j);
// Parses a JSONL file; an unparsable line is an error naming the file and the line number.
Result<std::vector<Event>> read_events(const std::string& path);
Status write_events(const std::string& path, const std::vector<Event>& events);

std::int64_t monotonic_us();

// Thread-safe recorder used by the runner: keeps the events in memory and appends each to a JSONL file as it comes
// (so a crash of the tool still leaves the log of what happened).
class EventLog {
 public:
  EventLog() = default;
  ~EventLog();
  // Starts a new file (the phase's events.jsonl); events recorded from now go there too.
  Status open(const std::string& path);
  void close();
  Event record(std::string type, std::int32_t phase, std::int32_t client, std::uint64_t job,
               nlohmann::json data = nlohmann::json::object());
  void add(Event e);  // for events read back (resume)
  std::vector<Event> snapshot() const;
  std::vector<Event> phase_events(std::int32_t phase) const;
  void clear();  // drops the in-memory copy (a finished phase lives on in its file)

 private:
  mutable std::mutex mu_;
  std::vector<Event> events_;
  std::FILE* file_ = nullptr;
  std::uint64_t next_seq_ = 1;
};

}  // namespace tandem::validate
