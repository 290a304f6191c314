// Bounded job queues (one for the GPU, one for the CPU), each with its own concurrency and limits, and ETAs from
// observed service rates. Fairness rule: strict FIFO by acceptance time (ties by job id); a job moved between
// queues keeps its acceptance time; nothing overtakes the head. See docs/policy.md §6.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "policy/config.h"
#include "policy/types.h"

namespace tandem::policy {

// EWMA-smoothed service rates of one route.
class ServiceRates {
 public:
  explicit ServiceRates(RateConfig cfg = {})
      : cfg_(cfg), prefill_tps_(cfg.prior_prefill_tps), decode_tps_(cfg.prior_decode_tps) {}

  // Samples with no tokens or no time are ignored (they carry no rate).
  void observe_prefill(std::uint64_t tokens, Clock::duration took);
  void observe_decode(std::uint64_t tokens, Clock::duration took);

  double prefill_tps() const { return prefill_tps_; }
  double decode_tps() const { return decode_tps_; }
  Clock::duration service_time(std::uint64_t prompt_tokens, std::uint64_t new_tokens) const;

 private:
  RateConfig cfg_;
  double prefill_tps_;
  double decode_tps_;
};

struct QueueEntry {
  JobId id = 0;
  std::uint32_t prompt_tokens = 0;
  std::uint32_t max_new_tokens = 0;
  Clock::time_point accepted_at{};  // orders the queue; keep it when moving a job between queues
};

enum class Removed { none, queued, running };

// A running job and its remaining service time at the route's rates (prompt until its prefill is done, then
// max_new − generated). A running job holds one slot, so this is when it finishes at the latest (max_new is an
// upper bound: EOS ends it sooner).
struct RunningWork {
  JobId id = 0;
  Clock::duration remaining{};
};

class JobQueue {
 public:
  JobQueue(std::string name, QueueConfig cfg, RateConfig rates = {});

  // Checks the limits: Errc::invalid_argument (over max_context / max_new_tokens), Errc::duplicate, Errc::queue_full.
  Status check_limits(std::uint32_t prompt_tokens, std::uint32_t max_new_tokens) const;
  Status enqueue(const QueueEntry& e);
  // Moves the head to running if a concurrency slot is free.
  std::optional<QueueEntry> start_next();
  // Runs a job without queueing (admitted at once). Only when nothing is queued (FIFO) and a slot is free.
  Status start_direct(const QueueEntry& e);
  // Token progress of a running job (for ETAs).
  void update_progress(JobId id, bool prefill_done, std::uint32_t tokens_generated);
  Removed finish(JobId id);  // a running job ended
  Removed cancel(JobId id);  // removes the job in any state (same as remove; named for the caller's intent)
  Removed remove(JobId id);  // e.g. moving a queued job to the other queue

  std::size_t depth() const { return queued_.size(); }
  std::size_t running() const { return running_.size(); }
  bool full() const { return queued_.size() >= cfg_.capacity; }
  bool has_free_slot() const { return running_.size() < cfg_.concurrency; }
  bool contains(JobId id) const { return index_.count(id) != 0 || running_.count(id) != 0; }
  const QueueEntry* head() const { return queued_.empty() ? nullptr : &queued_.begin()->second; }
  std::optional<std::size_t> position(JobId id) const;  // 0 = head; O(position)
  Clock::duration oldest_age(Clock::time_point now) const;

  // Time until a job appended now would start, and until it would finish.
  Clock::duration eta_start_for_new() const;
  Clock::duration eta_done_for_new(std::uint32_t prompt_tokens, std::uint32_t max_new_tokens) const;
  // Time until a queued job starts (work ahead of it / concurrency). nullopt if not queued. Slots only: whether the
  // device has memory for it is the admission policy's part (GpuView::running, docs/policy.md §4).
  std::optional<Clock::duration> eta_start(JobId id) const;
  // Every running job with its remaining service time, soonest first. O(running · log running).
  std::vector<RunningWork> running_work() const;
  // Acceptance time of a queued job; nullopt if it is not queued.
  std::optional<Clock::time_point> accepted_at(JobId id) const;

  ServiceRates& rates() { return rates_; }
  const ServiceRates& rates() const { return rates_; }
  const QueueConfig& config() const { return cfg_; }
  const std::string& name() const { return name_; }

 private:
  using Key = std::pair<Clock::time_point, JobId>;
  struct Running {
    std::uint32_t prompt_tokens = 0;
    std::uint32_t max_new_tokens = 0;
    bool prefill_done = false;
    std::uint32_t generated = 0;
  };
  Clock::duration divide(Clock::duration work) const;

  std::string name_;
  QueueConfig cfg_;
  ServiceRates rates_;
  std::map<Key, QueueEntry> queued_;
  std::unordered_map<JobId, Key> index_;
  std::unordered_map<JobId, Running> running_;
  // Token sums, so the ETA of a new job is O(1).
  std::uint64_t q_prompt_ = 0, q_new_ = 0, run_prompt_ = 0, run_new_ = 0;
};

}  // namespace tandem::policy
