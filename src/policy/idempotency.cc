#include "policy/idempotency.h"

namespace tandem::policy {

Result<Claim> IdempotencyRegistry::claim(const std::string& key, JobId new_job, std::uint64_t request_digest,
                                         Clock::time_point now, bool resume) {
  if (key.empty()) return fail(Errc::invalid_argument, "idempotency key must not be empty");
  if (key.size() > 256) {
    return fail(Errc::invalid_argument, "idempotency key must be at most 256 bytes, got " + std::to_string(key.size()));
  }
  auto it = keys_.find(key);
  if (it != keys_.end()) {
    Entry& e = it->second;
    if (e.digest != request_digest) {
      return fail(Errc::duplicate, "idempotency key '" + key + "' was used for a different request (job " +
                                       std::to_string(e.job) + ")");
    }
    if (resume && e.outcome && e.outcome->phase == JobPhase::failed) {
      e.job = new_job;
      e.outcome.reset();
      return Claim{new_job, true, std::nullopt};
    }
    return Claim{e.job, false, e.outcome};
  }
  if (keys_.size() >= cfg_.max_keys) expire(now);
  if (keys_.size() >= cfg_.max_keys) {
    return fail(Errc::rejected, "idempotency registry is full (" + std::to_string(cfg_.max_keys) + " keys)");
  }
  keys_.emplace(key, Entry{new_job, request_digest, std::nullopt});
  return Claim{new_job, true, std::nullopt};
}

Status IdempotencyRegistry::record_outcome(const std::string& key, JobId job, StoredOutcome outcome) {
  if (!is_terminal(outcome.phase)) {
    return fail(Errc::invalid_argument,
                "outcome phase must be terminal, got " + std::string(job_phase_name(outcome.phase)));
  }
  auto it = keys_.find(key);
  if (it == keys_.end()) return fail(Errc::not_found, "no idempotency key '" + key + "'");
  Entry& e = it->second;
  if (e.job != job) {
    return fail(Errc::illegal_transition, "idempotency key '" + key + "' belongs to job " + std::to_string(e.job) +
                                              ", not job " + std::to_string(job) + " (outcome ignored)");
  }
  if (e.outcome) {
    if (e.outcome->phase == outcome.phase && e.outcome->summary == outcome.summary) return {};
    return fail(Errc::illegal_transition, "idempotency key '" + key + "' already has outcome " +
                                              std::string(job_phase_name(e.outcome->phase)));
  }
  e.outcome = std::move(outcome);
  return {};
}

std::size_t IdempotencyRegistry::expire(Clock::time_point now) {
  std::size_t n = 0;
  for (auto it = keys_.begin(); it != keys_.end();) {
    if (it->second.outcome && now - it->second.outcome->at >= cfg_.retention) {
      it = keys_.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

std::optional<Claim> IdempotencyRegistry::find(const std::string& key) const {
  auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  return Claim{it->second.job, false, it->second.outcome};
}

}  // namespace tandem::policy
