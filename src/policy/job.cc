#include "policy/job.h"

namespace tandem::policy {

std::string_view job_phase_name(JobPhase p) noexcept {
  switch (p) {
    case JobPhase::queued: return "queued";
    case JobPhase::running: return "running";
    case JobPhase::retrying: return "retrying";
    case JobPhase::migrating: return "migrating";
    case JobPhase::completed: return "completed";
    case JobPhase::failed: return "failed";
    case JobPhase::cancelled: return "cancelled";
  }
  return "failed";
}

std::string_view failover_action_name(FailoverAction a) noexcept {
  switch (a) {
    case FailoverAction::retry_on_cpu: return "retry_on_cpu";
    case FailoverAction::migrate_at_checkpoint: return "migrate_at_checkpoint";
    case FailoverAction::fail_resumable: return "fail_resumable";
  }
  return "fail_resumable";
}

Job::Job(JobId id, std::uint64_t seed, std::string model, Clock::time_point accepted_at)
    : id_(id), seed_(seed), model_(std::move(model)), accepted_at_(accepted_at), state_(Queued{}) {}

JobPhase Job::phase() const { return static_cast<JobPhase>(state_.index()); }

Status Job::illegal(std::string_view what) const {
  return tandem::fail(Errc::illegal_transition, "job " + std::to_string(id_) + ": cannot " + std::string(what) +
                                                    " from " + std::string(job_phase_name(phase())));
}

void Job::move_to(State s, std::string reason, Clock::time_point now) {
  JobPhase from = phase();
  state_ = std::move(s);
  history_.push_back(JobTransition{from, phase(), std::move(reason), now});
}

Checkpoint Job::make_checkpoint() const { return Checkpoint{seed_, tokens_, model_}; }

Status Job::start(Route route, Clock::time_point now) {
  if (!std::holds_alternative<Queued>(state_) && !std::holds_alternative<Retrying>(state_) &&
      !std::holds_alternative<Migrating>(state_)) {
    return illegal("start");
  }
  if (std::holds_alternative<Retrying>(state_) && route.device != Device::cpu) {
    return tandem::fail(Errc::illegal_transition, "job " + std::to_string(id_) + ": a retry runs on the cpu, not on " +
                                                      std::string(device_name(route.device)));
  }
  std::string reason = std::string(device_name(route.device));
  ++attempts_;
  move_to(Running{std::move(route)}, std::move(reason), now);
  return {};
}

Status Job::record_tokens(std::uint32_t delivered_total) {
  if (!std::holds_alternative<Running>(state_)) return illegal("deliver tokens");
  if (delivered_total < tokens_) {
    return tandem::fail(Errc::invalid_argument, "job " + std::to_string(id_) + ": delivered tokens went back from " +
                                                    std::to_string(tokens_) + " to " + std::to_string(delivered_total));
  }
  tokens_ = delivered_total;
  return {};
}

Status Job::complete(Clock::time_point now) {
  if (!std::holds_alternative<Running>(state_)) return illegal("complete");
  move_to(Completed{}, "completed", now);
  return {};
}

Status Job::begin_retry(std::string reason, Clock::time_point now) {
  if (!std::holds_alternative<Running>(state_)) return illegal("retry");
  if (tokens_ != 0) {
    return tandem::fail(Errc::illegal_transition, "job " + std::to_string(id_) + ": cannot retry after " +
                                                      std::to_string(tokens_) + " delivered tokens (migrate or fail)");
  }
  move_to(Retrying{}, std::move(reason), now);
  return {};
}

Status Job::begin_migration(std::string reason, Clock::time_point now) {
  if (!std::holds_alternative<Running>(state_)) return illegal("migrate");
  if (tokens_ == 0) {
    return tandem::fail(Errc::illegal_transition,
                        "job " + std::to_string(id_) + ": nothing delivered yet, retry instead of migrating");
  }
  move_to(Migrating{make_checkpoint()}, std::move(reason), now);
  return {};
}

Status Job::fail(Errc code, std::string reason, Clock::duration retry_after, Clock::time_point now) {
  if (terminal()) return illegal("fail");
  ResumableError e{code, reason, make_checkpoint(), retry_after};
  move_to(Failed{std::move(e)}, std::move(reason), now);
  return {};
}

Status Job::cancel(Clock::time_point now) {
  if (terminal()) return illegal("cancel");
  move_to(Cancelled{}, "cancelled", now);
  return {};
}

const Route* Job::route() const {
  auto* r = std::get_if<Running>(&state_);
  return r ? &r->route : nullptr;
}

const ResumableError* Job::failure() const {
  auto* f = std::get_if<Failed>(&state_);
  return f ? &f->error : nullptr;
}

const Checkpoint* Job::checkpoint() const {
  if (auto* m = std::get_if<Migrating>(&state_)) return &m->checkpoint;
  if (auto* f = std::get_if<Failed>(&state_)) return &f->error.checkpoint;
  return nullptr;
}

FailoverDecision FailoverPolicy::decide(const FailoverInput& in) const {
  if (in.tokens_delivered == 0) {
    if (in.cpu_route_available) return {FailoverAction::retry_on_cpu, "no_tokens_delivered"};
    return {FailoverAction::fail_resumable, "no_cpu_route"};
  }
  if (in.side_effects) return {FailoverAction::fail_resumable, "side_effects"};
  if (!in.sampling_reproducible) return {FailoverAction::fail_resumable, "sampling_not_reproducible"};
  if (!cfg_.allow_migration) return {FailoverAction::fail_resumable, "migration_disabled"};
  if (!in.cpu_route_available) return {FailoverAction::fail_resumable, "no_cpu_route"};
  return {FailoverAction::migrate_at_checkpoint, "checkpoint_reproducible"};
}

}  // namespace tandem::policy
