// Job lifecycle and the failover rule. A Job can only change state through its transition functions, each of which
// checks the current state and returns Errc::illegal_transition otherwise; the state is a variant whose
// alternatives carry exactly the data of that state (a running job has a route, a failed one a checkpoint).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "policy/config.h"
#include "policy/types.h"

namespace tandem::policy {

enum class JobPhase { queued, running, retrying, migrating, completed, failed, cancelled };
std::string_view job_phase_name(JobPhase p) noexcept;
inline bool is_terminal(JobPhase p) {
  return p == JobPhase::completed || p == JobPhase::failed || p == JobPhase::cancelled;
}

// Where a client (or a migration) can resume: re-prefill prompt + the delivered tokens, continue at step
// `tokens_delivered` with the same seed (the sampler's RNG is keyed by (seed, step)).
struct Checkpoint {
  std::uint64_t seed = 0;
  std::uint32_t tokens_delivered = 0;
  std::string model;

  friend bool operator==(const Checkpoint&, const Checkpoint&) = default;
};

struct ResumableError {
  Errc code = Errc::rejected;
  std::string reason;  // machine-readable, e.g. "side_effects"
  Checkpoint checkpoint;
  Clock::duration retry_after{};
};

struct JobTransition {
  JobPhase from = JobPhase::queued;
  JobPhase to = JobPhase::queued;
  std::string reason;
  Clock::time_point at{};
};

class Job {
 public:
  Job(JobId id, std::uint64_t seed, std::string model, Clock::time_point accepted_at);

  // queued | retrying | migrating → running(route). From retrying (the GPU run broke before any token) the route
  // must be the CPU (Device::cpu); otherwise Errc::illegal_transition and the job stays retrying.
  Status start(Route route, Clock::time_point now);
  // Tokens handed to the client so far (running only; monotone).
  Status record_tokens(std::uint32_t delivered_total);
  // running → completed.
  Status complete(Clock::time_point now);
  // running, no token delivered → retrying (same id, same seed; next start() is the retry).
  Status begin_retry(std::string reason, Clock::time_point now);
  // running, tokens delivered → migrating (next start() continues from the checkpoint).
  Status begin_migration(std::string reason, Clock::time_point now);
  // any non-terminal → failed(resumable, checkpoint of what was delivered).
  Status fail(Errc code, std::string reason, Clock::duration retry_after, Clock::time_point now);
  // any non-terminal → cancelled.
  Status cancel(Clock::time_point now);

  JobId id() const { return id_; }
  std::uint64_t seed() const { return seed_; }
  JobPhase phase() const;
  bool terminal() const { return is_terminal(phase()); }
  const Route* route() const;                // running only
  const ResumableError* failure() const;     // failed only
  const Checkpoint* checkpoint() const;      // migrating or failed
  std::uint32_t tokens_delivered() const { return tokens_; }
  std::uint32_t attempts() const { return attempts_; }  // number of start()s
  Clock::time_point accepted_at() const { return accepted_at_; }
  const std::vector<JobTransition>& history() const { return history_; }

 private:
  struct Queued {};
  struct Running { Route route; };
  struct Retrying {};
  struct Migrating { Checkpoint checkpoint; };
  struct Completed {};
  struct Failed { ResumableError error; };
  struct Cancelled {};
  using State = std::variant<Queued, Running, Retrying, Migrating, Completed, Failed, Cancelled>;

  Status illegal(std::string_view what) const;
  void move_to(State s, std::string reason, Clock::time_point now);
  Checkpoint make_checkpoint() const;

  JobId id_;
  std::uint64_t seed_;
  std::string model_;
  Clock::time_point accepted_at_;
  State state_;
  std::uint32_t tokens_ = 0;
  std::uint32_t attempts_ = 0;
  std::vector<JobTransition> history_;
};

// The failover rule (DESIGN §2.6), applied when a job's GPU run breaks.
struct FailoverInput {
  std::uint32_t tokens_delivered = 0;
  // Counter-based RNG keyed by (seed, step) and the same fingerprint on the CPU. Fails closed: false unless the
  // caller has established it.
  bool sampling_reproducible = false;
  bool side_effects = false;
  bool cpu_route_available = false;   // allowed by the request, compatible replica, queue and host memory fit
};

enum class FailoverAction { retry_on_cpu, migrate_at_checkpoint, fail_resumable };
std::string_view failover_action_name(FailoverAction a) noexcept;

struct FailoverDecision {
  FailoverAction action = FailoverAction::fail_resumable;
  std::string reason;  // "no_tokens_delivered", "checkpoint_reproducible", "side_effects", ...
};

class FailoverPolicy {
 public:
  explicit FailoverPolicy(FailoverConfig cfg = {}) : cfg_(cfg) {}
  FailoverDecision decide(const FailoverInput& in) const;

 private:
  FailoverConfig cfg_;
};

}  // namespace tandem::policy
