#include "validate/events.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace tandem::validate {

std::int64_t monotonic_us() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

nlohmann::json to_json(const Event& e) {
  nlohmann::json j;
  j["t_us"] = e.t_us;
  j["seq"] = e.seq;
  j["type"] = e.type;
  j["phase"] = e.phase;
  if (e.client != -1) j["client"] = e.client;
  if (e.job != 0) j["job"] = e.job;
  if (!e.data.empty()) j["data"] = e.data;
  return j;
}

Result<Event> event_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return fail(Errc::format_error, "an event must be a JSON object");
  Event e;
  try {
    if (!j.contains("t_us") || !j.contains("type")) return fail(Errc::format_error, "an event needs t_us and type");
    e.t_us = j.at("t_us").get<std::int64_t>();
    e.type = j.at("type").get<std::string>();
    e.seq = j.value("seq", std::uint64_t{0});
    e.phase = j.value("phase", -1);
    e.client = j.value("client", -1);
    e.job = j.value("job", std::uint64_t{0});
    if (j.contains("data")) {
      if (!j.at("data").is_object()) return fail(Errc::format_error, "event data must be an object");
      e.data = j.at("data");
    }
  } catch (const nlohmann::json::exception& ex) {
    return fail(Errc::format_error, std::string("bad event field: ") + ex.what());
  }
  if (e.type.empty()) return fail(Errc::format_error, "event type is empty");
  return e;
}

Result<std::vector<Event>> read_events(const std::string& path) {
  std::ifstream in(path);
  if (!in) return fail(Errc::io_error, path + ": cannot read: " + std::strerror(errno));
  std::vector<Event> out;
  std::string line;
  std::size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return fail(Errc::parse_error, path + ":" + std::to_string(n) + ": not valid JSON");
    auto e = event_from_json(j);
    if (!e) return fail(Errc::format_error, path + ":" + std::to_string(n) + ": " + e.error().message);
    out.push_back(std::move(*e));
  }
  std::stable_sort(out.begin(), out.end(), [](const Event& a, const Event& b) {
    return a.t_us != b.t_us ? a.t_us < b.t_us : a.seq < b.seq;
  });
  return out;
}

Status write_events(const std::string& path, const std::vector<Event>& events) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return fail(Errc::io_error, path + ": cannot write: " + std::strerror(errno));
  for (const auto& e : events) out << to_json(e).dump() << '\n';
  out.flush();
  if (!out) return fail(Errc::io_error, path + ": write failed");
  return {};
}

EventLog::~EventLog() { close(); }

Status EventLog::open(const std::string& path) {
  std::lock_guard lk(mu_);
  if (file_) std::fclose(file_);
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) return fail(Errc::io_error, path + ": cannot open: " + std::strerror(errno));
  return {};
}

void EventLog::close() {
  std::lock_guard lk(mu_);
  if (file_) {
    std::fflush(file_);
    std::fclose(file_);
    file_ = nullptr;
  }
}

Event EventLog::record(std::string type, std::int32_t phase, std::int32_t client, std::uint64_t job,
                       nlohmann::json data) {
  Event e;
  e.type = std::move(type);
  e.phase = phase;
  e.client = client;
  e.job = job;
  e.data = std::move(data);
  std::lock_guard lk(mu_);
  e.t_us = monotonic_us();
  e.seq = next_seq_++;
  if (file_) {
    const std::string line = to_json(e).dump() + "\n";
    std::fwrite(line.data(), 1, line.size(), file_);
    std::fflush(file_);
  }
  events_.push_back(e);
  return e;
}

void EventLog::add(Event e) {
  std::lock_guard lk(mu_);
  next_seq_ = std::max(next_seq_, e.seq + 1);
  events_.push_back(std::move(e));
}

std::vector<Event> EventLog::snapshot() const {
  std::lock_guard lk(mu_);
  return events_;
}

void EventLog::clear() {
  std::lock_guard lk(mu_);
  events_.clear();
  events_.shrink_to_fit();
}

std::vector<Event> EventLog::phase_events(std::int32_t phase) const {
  std::lock_guard lk(mu_);
  std::vector<Event> out;
  for (const auto& e : events_)
    if (e.phase == phase) out.push_back(e);
  return out;
}

}  // namespace tandem::validate
