// Idempotency keys: one key → one job. Re-submitting returns that job (or its stored outcome), never a second run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/clock.h"
#include "core/result.h"
#include "policy/config.h"
#include "policy/job.h"

namespace tandem::policy {

struct StoredOutcome {
  JobPhase phase = JobPhase::completed;  // always terminal
  std::string summary;                   // e.g. reason of a failure, or a result digest
  Clock::time_point at{};

  friend bool operator==(const StoredOutcome&, const StoredOutcome&) = default;
};

struct Claim {
  JobId job = 0;
  bool created = false;                  // true: run `job`; false: `job` already exists (do not run again)
  std::optional<StoredOutcome> outcome;  // set when that job has finished
};

class IdempotencyRegistry {
 public:
  explicit IdempotencyRegistry(IdempotencyConfig cfg = {}) : cfg_(cfg) {}

  // Claims `key` for `new_job`. `request_digest` identifies the request's content: the same key with a different
  // request is Errc::duplicate. `resume` = the client resubmits after a failed(resumable) outcome with its
  // checkpoint: only then is a failed key handed to a new job (a completed or cancelled key never is).
  Result<Claim> claim(const std::string& key, JobId new_job, std::uint64_t request_digest, Clock::time_point now,
                      bool resume = false);
  // Stores the terminal outcome of `job`, which must be the key's current job: an outcome from any other job (e.g. a
  // late one from the job a resume claim replaced) is Errc::illegal_transition and changes nothing. The first
  // outcome wins; repeating it is a no-op, a different one is Errc::illegal_transition.
  Status record_outcome(const std::string& key, JobId job, StoredOutcome outcome);
  // Drops keys whose outcome is older than the retention; keys of live jobs never expire. Returns how many.
  std::size_t expire(Clock::time_point now);

  std::optional<Claim> find(const std::string& key) const;
  std::size_t size() const { return keys_.size(); }

 private:
  struct Entry {
    JobId job = 0;
    std::uint64_t digest = 0;
    std::optional<StoredOutcome> outcome;
  };
  IdempotencyConfig cfg_;
  std::unordered_map<std::string, Entry> keys_;
};

}  // namespace tandem::policy
