// Service: group commit (docs/journal.md, "Sync points and group commit") — one journal fdatasync per loop
// iteration for every accepted and outcome record written in it, and nothing about a job leaves the process before
// the commit that covers it: the front ends' acknowledgements (after_commit), held job updates, dispatch.
#include "daemon/service.h"

#include <signal.h>

#include <set>
#include <utility>

#include "daemon/service_internal.h"

namespace tandem::daemon {

// Only accepts and outcomes need a commit: transitions and checkpoints ride along with the next one (as before
// group commit), so an iteration that only dispatched or checkpointed does not sync.
bool Service::commit_pending() const {
  return !pending_accepts_.empty() || !pending_outcomes_.empty() ||
         (!outcome_retry_.empty() && clock_->now() >= outcome_retry_at_) || !waiters_.empty();
}

void Service::after_commit(std::function<void(const Status&)> then) {
  if (!group_commit_ || (!committing_ && pending_accepts_.empty() && pending_outcomes_.empty() &&
                         outcome_retry_.empty())) {
    then(Status{});  // everything it depends on is durable already
    return;
  }
  waiters_.push_back(std::move(then));
}

void Service::journal_outcome(JobRecord& j) {
  Status st = write_unwritten_transition(j);  // the route (and model) its tokens came from first
  if (st) st = journal_->outcome(j.id, phase_name(j.phase), j.reason, j.tokens, j.text, j.error_code, j.error_message,
                                static_cast<std::int64_t>(j.retry_after_ms), j.finish_reason, j.finished_unix_ms);
  if (st && !group_commit_) {
    st = journal_->commit();
    if (!st) resync_journaled_tokens();
  }
  if (!st) {
    journal_write_failed("outcome", j.id, st);
    // Not durable: as after a failed group commit, its updates (the `finished` one first) are held and the outcome is
    // written again at the next commit() — nothing about its end leaves the process before its record is durable.
    // Other errors (a record over the limits) cannot succeed later: logged, and the job's end goes out as before.
    if (st.error().code == Errc::io_error) {
      j.outcome_unwritten = true;
      if (std::find(outcome_retry_.begin(), outcome_retry_.end(), j.id) == outcome_retry_.end())
        outcome_retry_.push_back(j.id);
    }
    return;
  }
  j.outcome_unwritten = false;
  j.durable_at = journal_->appended_seq();
  if (group_commit_) pending_outcomes_.push_back(j.id);
}

Status Service::commit() {
  if (committing_) return {};  // from a callback of the commit in progress: that commit covers it
  if (!commit_pending()) return {};
  committing_ = true;
  // Outcomes a failed commit undid or a failed write left out are written again first (their `finished` updates are
  // still held); when one fails again, the next try waits a poll interval (no busy loop on a failing disk).
  if (!outcome_retry_.empty() && clock_->now() >= outcome_retry_at_) {
    for (JobId id : std::exchange(outcome_retry_, {}))
      if (JobRecord* j = find(id); j && j->terminal()) journal_outcome(*j);
    if (!outcome_retry_.empty())
      outcome_retry_at_ = clock_->now() + std::chrono::duration_cast<Clock::duration>(cfg_.device.poll_interval);
  }
  if (crash_at_commit_ > 0 && !pending_accepts_.empty() && --crash_at_commit_ == 0) {
    log::warn("testing: killing tandemd between the write and the sync of {} accept(s)", pending_accepts_.size());
    ::raise(SIGKILL);
  }
  Status result;
  std::vector<JobId> durable_now;
  if (Status st = journal_->commit(); st) {
    for (JobId id : pending_accepts_)
      if (JobRecord* j = find(id)) {
        j->accept_pending = false;
        durable_now.push_back(id);
      }
  } else {
    const std::string why = st.error().message;
    log::error("journal commit failed: {}; the {} job(s) accepted since the last commit are withdrawn", why,
               pending_accepts_.size());
    for (JobId id : pending_accepts_)
      if (JobRecord* j = find(id)) withdraw(*j);
    resync_journaled_tokens();  // checkpoints of the window are undone too
    // Outcomes of earlier jobs that the failure undid: written again at the next commit.
    for (JobId id : pending_outcomes_)
      if (JobRecord* j = find(id); j && j->durable_at > journal_->durable_seq()) {
        j->outcome_unwritten = true;  // held until written again (whatever later commits make durable)
        outcome_retry_.push_back(id);
      }
    result = fail(Errc::internal, "could not journal the job (" + why + "); it was not accepted");
  }
  pending_accepts_.clear();
  pending_outcomes_.clear();
  auto waiters = std::exchange(waiters_, {});
  for (auto& w : waiters) w(result);
  release_held();
  committing_ = false;
  // The jobs whose accept is durable now run (the ones pump() already gave a slot first, in order), after their
  // `accepted` and `routed` went out.
  for (JobId id : durable_now)
    if (JobRecord* j = find(id); j && j->deferred_route && !j->terminal()) {
      const policy::Route route = *j->deferred_route;
      j->deferred_route.reset();
      dispatch(*j, route);
    }
  pump();
  return result;
}

void Service::release_held() {
  std::deque<HeldUpdate> keep;
  std::set<JobId> waiting;
  for (auto& h : held_updates_) {
    const JobRecord* j = find(h.job);
    if (!j) continue;  // withdrawn (or pruned): nothing about it goes out
    if (j->accept_pending || j->outcome_unwritten || j->durable_at > journal_->durable_seq() || waiting.count(h.job)) {
      // Still waiting (an outcome to write again); the job's later updates stay behind it.
      waiting.insert(h.job);
      keep.push_back(std::move(h));
      continue;
    }
    if (observer_ && !j->owner.empty() && !j->muted)
      observer_->job_update(j->reply_to.empty() ? j->owner : j->reply_to, j->id, h.kind, h.data);
  }
  held_updates_ = std::move(keep);
}

void Service::withdraw(JobRecord& j) {
  // It was queued, never dispatched (pump() stops at a pending accept) and never announced: take it back whole.
  leave_queue(j);
  release_resources(j);
  active_.erase(j.id);
  if (!j.key.empty()) {  // the key is free for the client's retry (accept() hands a kNotAccepted key on)
    (void)idempotency_.record_outcome(j.key, j.id, {JobPhase::failed, kNotAccepted, clock_->now()});
  }
  for (auto& [id, other] : jobs_)  // a Resume that created it: that job may be resumed again
    if (other->resumed_by == j.id) other->resumed_by.reset();
  --counters_["jobs_accepted"];
  ++counters_["jobs_withdrawn"];
  log::warn("job {} withdrawn: its accept could not be made durable", j.id);
  if (j.embed) {  // the Embed calls waiting for it get the same answer as a Submit would
    auto waiters = std::move(j.embed->waiters);
    j.embed->waiters.clear();
    for (auto& w : waiters) w(fail(Errc::internal, "could not journal the job; it was not accepted"));
  }
  jobs_.erase(j.id);  // last: `j` is gone
}

}  // namespace tandem::daemon
