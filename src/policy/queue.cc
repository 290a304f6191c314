#include "policy/queue.h"

#include <algorithm>
#include <chrono>

namespace tandem::policy {

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Clock::duration from_seconds(double s) {
  constexpr double kMax = 1e9;  // ~31 years: "effectively never", and no overflow
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::min(s, kMax)));
}

}  // namespace

void ServiceRates::observe_prefill(std::uint64_t tokens, Clock::duration took) {
  if (tokens == 0 || took <= Clock::duration::zero()) return;
  prefill_tps_ = cfg_.ewma_alpha * (static_cast<double>(tokens) / seconds(took)) + (1 - cfg_.ewma_alpha) * prefill_tps_;
}

void ServiceRates::observe_decode(std::uint64_t tokens, Clock::duration took) {
  if (tokens == 0 || took <= Clock::duration::zero()) return;
  decode_tps_ = cfg_.ewma_alpha * (static_cast<double>(tokens) / seconds(took)) + (1 - cfg_.ewma_alpha) * decode_tps_;
}

Clock::duration ServiceRates::service_time(std::uint64_t prompt_tokens, std::uint64_t new_tokens) const {
  return from_seconds(static_cast<double>(prompt_tokens) / prefill_tps_ + static_cast<double>(new_tokens) / decode_tps_);
}

JobQueue::JobQueue(std::string name, QueueConfig cfg, RateConfig rates)
    : name_(std::move(name)), cfg_(cfg), rates_(rates) {}

Status JobQueue::check_limits(std::uint32_t prompt_tokens, std::uint32_t max_new_tokens) const {
  if (max_new_tokens > cfg_.max_new_tokens) {
    return fail(Errc::invalid_argument, "max_new_tokens " + std::to_string(max_new_tokens) + " exceeds " + name_ +
                                            ".max_new_tokens " + std::to_string(cfg_.max_new_tokens));
  }
  if (std::uint64_t{prompt_tokens} + max_new_tokens > cfg_.max_context) {
    return fail(Errc::invalid_argument, "prompt + max_new_tokens = " +
                                            std::to_string(std::uint64_t{prompt_tokens} + max_new_tokens) +
                                            " exceeds " + name_ + ".max_context " + std::to_string(cfg_.max_context));
  }
  return {};
}

Status JobQueue::enqueue(const QueueEntry& e) {
  TANDEM_TRY(check_limits(e.prompt_tokens, e.max_new_tokens));
  if (contains(e.id)) return fail(Errc::duplicate, "job " + std::to_string(e.id) + " is already in " + name_);
  if (full()) {
    return fail(Errc::queue_full, name_ + " is full (" + std::to_string(cfg_.capacity) + " queued)");
  }
  Key k{e.accepted_at, e.id};
  queued_.emplace(k, e);
  index_.emplace(e.id, k);
  q_prompt_ += e.prompt_tokens;
  q_new_ += e.max_new_tokens;
  return {};
}

std::optional<QueueEntry> JobQueue::start_next() {
  if (queued_.empty() || !has_free_slot()) return std::nullopt;
  auto it = queued_.begin();
  QueueEntry e = it->second;
  q_prompt_ -= e.prompt_tokens;
  q_new_ -= e.max_new_tokens;
  index_.erase(e.id);
  queued_.erase(it);
  running_.emplace(e.id, Running{e.prompt_tokens, e.max_new_tokens, false, 0});
  run_prompt_ += e.prompt_tokens;
  run_new_ += e.max_new_tokens;
  return e;
}

Status JobQueue::start_direct(const QueueEntry& e) {
  TANDEM_TRY(check_limits(e.prompt_tokens, e.max_new_tokens));
  if (contains(e.id)) return fail(Errc::duplicate, "job " + std::to_string(e.id) + " is already in " + name_);
  if (!queued_.empty()) {
    return fail(Errc::rejected, name_ + ": " + std::to_string(queued_.size()) + " jobs queued ahead (FIFO)");
  }
  if (!has_free_slot()) {
    return fail(Errc::rejected, name_ + ": all " + std::to_string(cfg_.concurrency) + " slots busy");
  }
  running_.emplace(e.id, Running{e.prompt_tokens, e.max_new_tokens, false, 0});
  run_prompt_ += e.prompt_tokens;
  run_new_ += e.max_new_tokens;
  return {};
}

void JobQueue::update_progress(JobId id, bool prefill_done, std::uint32_t generated) {
  auto it = running_.find(id);
  if (it == running_.end()) return;
  Running& r = it->second;
  if (prefill_done && !r.prefill_done) {
    r.prefill_done = true;
    run_prompt_ -= r.prompt_tokens;
  }
  generated = std::min(generated, r.max_new_tokens);
  if (generated > r.generated) {
    run_new_ -= generated - r.generated;
    r.generated = generated;
  }
}

Removed JobQueue::finish(JobId id) {
  auto it = running_.find(id);
  if (it == running_.end()) return Removed::none;
  if (!it->second.prefill_done) run_prompt_ -= it->second.prompt_tokens;
  run_new_ -= it->second.max_new_tokens - it->second.generated;
  running_.erase(it);
  return Removed::running;
}

Removed JobQueue::cancel(JobId id) { return remove(id); }

Removed JobQueue::remove(JobId id) {
  auto it = index_.find(id);
  if (it == index_.end()) return finish(id);
  auto q = queued_.find(it->second);
  q_prompt_ -= q->second.prompt_tokens;
  q_new_ -= q->second.max_new_tokens;
  queued_.erase(q);
  index_.erase(it);
  return Removed::queued;
}

std::optional<std::size_t> JobQueue::position(JobId id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return static_cast<std::size_t>(std::distance(queued_.begin(), queued_.find(it->second)));
}

Clock::duration JobQueue::oldest_age(Clock::time_point now) const {
  if (queued_.empty()) return Clock::duration::zero();
  auto t = queued_.begin()->first.first;
  return now > t ? now - t : Clock::duration::zero();
}

Clock::duration JobQueue::divide(Clock::duration work) const { return work / cfg_.concurrency; }

Clock::duration JobQueue::eta_start_for_new() const {
  // A new job starts once everything ahead of it (queued + the rest of the running work) has been served by
  // `concurrency` parallel slots; if a slot is free and nothing is queued it starts now.
  const std::size_t free_slots = cfg_.concurrency - std::min<std::size_t>(cfg_.concurrency, running_.size());
  if (queued_.size() < free_slots) return Clock::duration::zero();
  return divide(rates_.service_time(q_prompt_ + run_prompt_, q_new_ + run_new_));
}

Clock::duration JobQueue::eta_done_for_new(std::uint32_t prompt_tokens, std::uint32_t max_new_tokens) const {
  return eta_start_for_new() + rates_.service_time(prompt_tokens, max_new_tokens);
}

std::optional<Clock::duration> JobQueue::eta_start(JobId id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  const std::size_t free_slots = cfg_.concurrency - std::min<std::size_t>(cfg_.concurrency, running_.size());
  std::uint64_t prompt = run_prompt_, fresh = run_new_;
  std::size_t ahead = 0;
  for (auto q = queued_.begin(); q != queued_.end() && q->first != it->second; ++q, ++ahead) {
    prompt += q->second.prompt_tokens;
    fresh += q->second.max_new_tokens;
  }
  if (ahead < free_slots) return Clock::duration::zero();
  return divide(rates_.service_time(prompt, fresh));
}

std::vector<RunningWork> JobQueue::running_work() const {
  std::vector<RunningWork> out;
  out.reserve(running_.size());
  for (const auto& [id, r] : running_) {
    out.push_back(RunningWork{id, rates_.service_time(r.prefill_done ? 0 : r.prompt_tokens, r.max_new_tokens - r.generated)});
  }
  std::sort(out.begin(), out.end(), [](const RunningWork& a, const RunningWork& b) {
    return a.remaining != b.remaining ? a.remaining < b.remaining : a.id < b.id;
  });
  return out;
}

std::optional<Clock::time_point> JobQueue::accepted_at(JobId id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return it->second.first;
}

}  // namespace tandem::policy
