#include "policy/queue.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <queue>

namespace tandem::policy {

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// LoopJob::fixed_s of a queue entry's fixed duration: 0 for a step-loop job, else at least a nanosecond.
double fixed_seconds(Clock::duration d) { return d > Clock::duration::zero() ? std::max(seconds(d), 1e-9) : 0.0; }

constexpr double kFitSlowdown = 8;         // the line's sums decay at ewma_alpha / 8 per step
constexpr double kShrink = 0.01;           // pseudo-variance (token², sequence²) pulling the fit toward the prior
constexpr double kMinStepSeconds = 1e-6;   // no step is free
constexpr double kMinRate = 1e-9;          // unvalidated rates must not divide by zero

Clock::duration from_seconds(double s) {
  constexpr double kMax = 1e9;  // ~31 years: "effectively never", and no overflow
  return std::chrono::round<Clock::duration>(std::chrono::duration<double>(std::min(s, kMax)));  // nearest ns
}

}  // namespace

void ServiceRates::observe_prefill(std::uint64_t tokens, Clock::duration took) {
  if (tokens == 0 || took <= Clock::duration::zero()) return;
  observed_ = true;
  prefill_tps_ = cfg_.ewma_alpha * (static_cast<double>(tokens) / seconds(took)) + (1 - cfg_.ewma_alpha) * prefill_tps_;
}

void ServiceRates::observe_decode(std::uint64_t tokens, Clock::duration took) {
  if (tokens == 0 || took <= Clock::duration::zero()) return;
  observed_ = true;
  decode_tps_ = cfg_.ewma_alpha * (static_cast<double>(tokens) / seconds(took)) + (1 - cfg_.ewma_alpha) * decode_tps_;
}

void ServiceRates::set_measured(double prefill_tps, double decode_tps) {
  if (prefill_tps > 0) prefill_tps_ = prefill_tps;
  if (decode_tps > 0) decode_tps_ = decode_tps;
  measured_ = measured_ || prefill_tps > 0 || decode_tps > 0;
}

Clock::duration ServiceRates::service_time(std::uint64_t prompt_tokens, std::uint64_t new_tokens) const {
  return from_seconds(static_cast<double>(prompt_tokens) / prefill_tps_ + static_cast<double>(new_tokens) / decode_tps_);
}

void ServiceRates::observe_step(std::uint32_t batch, std::uint32_t tokens, Clock::duration took) {
  if (batch == 0 || tokens == 0 || took <= Clock::duration::zero()) return;
  observed_ = true;
  batch = std::min(batch, kMaxBatch);
  const double x = tokens, b = batch, y = seconds(took);
  const double f = cfg_.ewma_alpha / kFitSlowdown;
  auto decay = [f](double& sum, double sample) { sum = (1 - f) * sum + f * sample; };
  decay(w_, 1);
  decay(sx_, x);
  decay(sb_, b);
  decay(sy_, y);
  decay(sxx_, x * x);
  decay(sxb_, x * b);
  decay(sbb_, b * b);
  decay(sxy_, x * y);
  decay(sby_, b * y);
  // The batch size's ratio to the plane as it stands with this sample.
  const double ratio = y / std::max(kMinStepSeconds, line().at(b, x));
  auto [it, fresh] = buckets_.try_emplace(batch, ratio);
  if (!fresh) it->second = cfg_.ewma_alpha * ratio + (1 - cfg_.ewma_alpha) * it->second;
  ++steps_;
}

StepLine ServiceRates::prior_line() const {
  const double per_token = 1.0 / std::max(prefill_tps_, kMinRate);
  const double one_decode = 1.0 / std::max(decode_tps_, kMinRate);
  return StepLine{std::max(0.0, one_decode - per_token), per_token, 0.0};
}

StepLine ServiceRates::line() const {
  const StepLine prior = prior_line();
  if (!(w_ > 0)) return prior;
  const double mx = sx_ / w_, mb = sb_ / w_, my = sy_ / w_;
  // Centred (co)variances, with the shrinkage toward the prior on the diagonal: with no spread in a regressor its
  // coefficient is the prior's, and the plane goes through the observed mean.
  const double vxx = std::max(0.0, sxx_ / w_ - mx * mx) + kShrink, vbb = std::max(0.0, sbb_ / w_ - mb * mb) + kShrink;
  const double vxb = sxb_ / w_ - mx * mb;
  const double vxy = sxy_ / w_ - mx * my + kShrink * prior.per_token_s;
  const double vby = sby_ / w_ - mb * my + kShrink * prior.per_seq_s;
  const double det = vxx * vbb - vxb * vxb;  // > 0: both diagonals exceed the off-diagonal (Cauchy-Schwarz + shrink)
  double c = (vxy * vbb - vby * vxb) / det, s = (vby * vxx - vxy * vxb) / det;
  if (c < 0) { c = 0; s = std::max(0.0, vby / vbb); }  // a negative cost is noise: refit without it
  if (s < 0) { s = 0; c = std::max(0.0, vxy / vxx); }
  return StepLine{std::max(0.0, my - c * mx - s * mb), c, s};
}

double ServiceRates::ratio(std::uint32_t batch) const {
  if (buckets_.empty()) return 1;
  auto hi = buckets_.lower_bound(batch);
  if (hi == buckets_.end()) return std::prev(hi)->second;  // beyond the largest seen size: its ratio
  if (hi->first == batch || hi == buckets_.begin()) return hi->second;
  auto lo = std::prev(hi);
  const double f = static_cast<double>(batch - lo->first) / static_cast<double>(hi->first - lo->first);
  return lo->second + f * (hi->second - lo->second);
}

double ServiceRates::step_seconds(std::uint32_t batch, std::uint32_t tokens) const {
  const StepLine l = line();
  batch = std::clamp<std::uint32_t>(batch, 1, kMaxBatch);
  return std::max(kMinStepSeconds, l.at(batch, tokens) * ratio(batch));
}

Clock::duration ServiceRates::step_time(std::uint32_t batch, std::uint32_t tokens) const {
  return from_seconds(step_seconds(batch, tokens));
}

void LoopOccupancy::observe_step(std::uint32_t batch, Clock::duration took, Clock::time_point end) {
  if (tau_ <= Clock::duration::zero()) return;
  if (took < Clock::duration::zero()) took = Clock::duration::zero();
  if (!any_) {
    value_ = batch;
    last_ = end;
    any_ = true;
    return;
  }
  if (end < last_) end = last_;
  const double tau = seconds(tau_);
  const double idle = std::max(0.0, seconds((end - took) - last_));
  const double busy = std::min(seconds(took), seconds(end - last_));
  value_ *= std::exp(-idle / tau);
  value_ = batch + (value_ - batch) * std::exp(-busy / tau);
  last_ = end;
}

double LoopOccupancy::at(Clock::time_point now) const {
  if (!any_ || tau_ <= Clock::duration::zero()) return 0.0;
  const double idle = now > last_ ? seconds(now - last_) : 0.0;
  return value_ * std::exp(-idle / seconds(tau_));
}

LoopTimeline simulate_step_loop(const LoopPlan& plan, const ServiceRates& rates) {
  constexpr Clock::duration kNever = Clock::duration::max();
  LoopTimeline out;
  out.queued_start.assign(plan.queued.size(), kNever);
  out.queued_finish.assign(plan.queued.size(), kNever);
  out.running_finish.assign(plan.running.size(), kNever);
  using Kind = LoopStop::Kind;
  if (plan.stop.kind == Kind::all_running_finished && plan.running.empty()) return out;

  const std::uint64_t max_batch = std::max<std::uint32_t>(plan.max_batch, 1);
  const std::uint64_t budget = std::max<std::uint32_t>(plan.step_tokens, 1);
  const std::uint64_t background =
      plan.background > 0 ? static_cast<std::uint64_t>(std::llround(std::min(plan.background, 1e9))) : 0;
  // A sequence is named by ref = index << 1 | queued.
  struct Prefilling {
    std::uint64_t ref;
    std::uint64_t prompt_left;
    std::uint32_t new_left;
    std::uint64_t cap;  // most prompt tokens per step
  };
  std::deque<Prefilling> prefilling;  // in start order
  using Decoding = std::pair<std::uint64_t, std::uint64_t>;  // (step after which it has its last token, ref)
  std::priority_queue<Decoding, std::vector<Decoding>, std::greater<>> decoding;
  double t = 0;        // seconds from now
  std::uint64_t step = 0;  // steps done
  bool stopped = false;
  std::size_t running_left = plan.running.size();
  std::size_t next_queued = 0;

  // Fixed-duration jobs: (finish time, ref), soonest first; when each lane is free.
  using Timed = std::pair<double, std::uint64_t>;
  std::priority_queue<Timed, std::vector<Timed>, std::greater<>> timed;
  std::vector<std::pair<std::uint32_t, double>> lane_free;

  auto finished_at = [&](std::uint64_t ref, double when) {
    const std::size_t i = ref >> 1;
    const bool queued = (ref & 1) != 0;
    (queued ? out.queued_finish : out.running_finish)[i] = from_seconds(when);
    if (!queued) --running_left;
    if ((queued && plan.stop.kind == Kind::queued_finished && i == plan.stop.index) ||
        (!queued && plan.stop.kind == Kind::running_finished && i == plan.stop.index) ||
        (!queued && plan.stop.kind == Kind::all_running_finished && running_left == 0)) {
      stopped = true;
    }
  };
  auto finished = [&](std::uint64_t ref) { finished_at(ref, t); };
  auto enter = [&](std::uint64_t ref, const LoopJob& j) {
    if (j.fixed_s > 0) {
      auto lane = std::find_if(lane_free.begin(), lane_free.end(), [&](const auto& l) { return l.first == j.lane; });
      if (lane == lane_free.end()) lane = lane_free.insert(lane_free.end(), {j.lane, t});
      lane->second = std::max(lane->second, t) + j.fixed_s;
      timed.emplace(lane->second, ref);
    } else if (j.prompt_left > 0) {
      prefilling.push_back(Prefilling{ref, j.prompt_left, j.new_left,
                                      j.chunk_cap == 0 ? std::numeric_limits<std::uint64_t>::max() : j.chunk_cap});
    } else if (j.new_left > 0) {
      decoding.emplace(step + j.new_left, ref);
    } else {
      finished(ref);  // nothing left: its slot is free now
    }
  };
  auto fill = [&] {
    while (!stopped && next_queued < plan.queued.size() &&
           prefilling.size() + decoding.size() + timed.size() < max_batch) {
      const std::size_t i = next_queued++;
      out.queued_start[i] = from_seconds(t);
      if (plan.stop.kind == Kind::queued_started && i == plan.stop.index) stopped = true;
      enter(std::uint64_t{i} << 1 | 1, plan.queued[i]);
    }
  };

  for (std::size_t i = 0; i < plan.running.size(); ++i) enter(std::uint64_t{i} << 1, plan.running[i]);
  fill();
  std::vector<std::uint64_t> chunks;
  std::vector<Prefilling> kept;
  // Fixed-duration jobs whose time is up leave (at their own finish time) and free their slots.
  auto timed_done = [&] {
    while (!stopped && !timed.empty() && timed.top().first <= t) {
      finished_at(timed.top().second, timed.top().first);
      timed.pop();
    }
  };
  while (!stopped && !(prefilling.empty() && decoding.empty() && timed.empty())) {
    if (prefilling.empty() && decoding.empty()) {  // only fixed-duration jobs: on to the next one's end
      t = std::max(t, timed.top().first);
      ++out.phases;
      timed_done();
      fill();
      continue;
    }
    // One run of identical steps: the decoding sequences one token each, the budget left to the prefilling ones,
    // oldest first.
    const std::uint64_t decoders = decoding.size();
    std::uint64_t left = budget > decoders ? budget - decoders : 0;
    std::uint64_t tokens = decoders;
    chunks.clear();
    for (const Prefilling& p : prefilling) {
      if (left == 0) break;
      const std::uint64_t c = std::min({p.prompt_left, left, p.cap});
      chunks.push_back(c);
      left -= c;
      tokens += c;
    }
    // Steps until the next event: a decoder's last token, a prompt's last chunk, or a chunk that no longer fits
    // what a prompt has left (then the allocation changes).
    std::uint64_t k = std::numeric_limits<std::uint64_t>::max();
    if (decoders > 0) k = decoding.top().first - step;
    for (std::size_t i = 0; i < chunks.size(); ++i) k = std::min(k, prefilling[i].prompt_left / chunks[i]);
    std::uint64_t batch = decoders + chunks.size();
    // The load expected to join meanwhile: decoders of jobs not placed yet, up to the background and the batch.
    if (background > batch && max_batch > batch) {
      const std::uint64_t extra = std::min(background - batch, max_batch - batch);
      batch += extra;
      tokens += extra;
    }
    const double each = rates.step_seconds(static_cast<std::uint32_t>(std::min<std::uint64_t>(batch, UINT32_MAX)),
                                           static_cast<std::uint32_t>(std::min<std::uint64_t>(tokens, UINT32_MAX)));
    // A fixed-duration job ending sooner is an event too: its slot frees at the step boundary after its end.
    if (!timed.empty() && each > 0) {
      const double until = timed.top().first - t;
      if (until < static_cast<double>(k) * each)
        k = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(std::ceil(std::max(0.0, until) / each)));
    }
    t += static_cast<double>(k) * each;
    step += k;
    out.steps += k;
    ++out.phases;
    for (std::size_t i = 0; i < chunks.size(); ++i) prefilling[i].prompt_left -= k * chunks[i];
    // Completed prompts (among the served ones; a capped chunk may leave an older prompt unfinished) start decoding:
    // the step that completes a prompt also yields its first token. The others keep their order.
    kept.clear();
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const Prefilling& p = prefilling[i];
      if (p.prompt_left > 0) {
        kept.push_back(p);
        continue;
      }
      const std::uint32_t new_left = p.new_left > 0 ? p.new_left - 1 : 0;
      if (new_left == 0) {
        finished(p.ref);
      } else {
        decoding.emplace(step + new_left, p.ref);
      }
    }
    prefilling.erase(prefilling.begin(), prefilling.begin() + static_cast<std::ptrdiff_t>(chunks.size()));
    prefilling.insert(prefilling.begin(), kept.begin(), kept.end());
    while (!decoding.empty() && decoding.top().first <= step) {
      finished(decoding.top().second);
      decoding.pop();
    }
    timed_done();
    fill();
  }
  return out;
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
  return {};
}

void JobQueue::add_running(const QueueEntry& e) {
  running_.emplace(e.id, Running{e.prompt_tokens, e.max_new_tokens, 0, 0, 0, next_order_++, e.fixed, e.lane});
}

std::optional<QueueEntry> JobQueue::start_next() {
  if (queued_.empty() || !has_free_slot()) return std::nullopt;
  auto it = queued_.begin();
  QueueEntry e = it->second;
  index_.erase(e.id);
  queued_.erase(it);
  add_running(e);
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
  add_running(e);
  return {};
}

void JobQueue::update_progress(JobId id, bool prefill_done, std::uint32_t generated) {
  auto it = running_.find(id);
  if (it == running_.end()) return;
  Running& r = it->second;
  if (prefill_done) r.prefilled = r.prompt_tokens;
  r.generated = std::max(r.generated, std::min(generated, r.max_new_tokens));
}

void JobQueue::update_prefill(JobId id, std::uint32_t prefilled) {
  auto it = running_.find(id);
  if (it == running_.end()) return;
  Running& r = it->second;
  r.prefilled = std::max(r.prefilled, std::min(prefilled, r.prompt_tokens));
}

void JobQueue::set_prefill_chunk(JobId id, std::uint32_t chunk) {
  auto it = running_.find(id);
  if (it != running_.end()) it->second.chunk_cap = chunk;
}

void JobQueue::set_fixed_left(JobId id, Clock::duration left) {
  left = std::max(left, Clock::duration{1});  // stays a fixed-duration job
  if (auto it = running_.find(id); it != running_.end()) {
    if (it->second.fixed > Clock::duration::zero()) it->second.fixed = left;
    return;
  }
  if (auto it = index_.find(id); it != index_.end()) {
    QueueEntry& e = queued_.at(it->second);
    if (e.fixed > Clock::duration::zero()) e.fixed = left;
  }
}

Removed JobQueue::finish(JobId id) { return running_.erase(id) != 0 ? Removed::running : Removed::none; }

Removed JobQueue::cancel(JobId id) { return remove(id); }

Removed JobQueue::remove(JobId id) {
  auto it = index_.find(id);
  if (it == index_.end()) return finish(id);
  queued_.erase(it->second);
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

LoopPlan JobQueue::plan(std::size_t queued_limit) const {
  LoopPlan p;
  p.max_batch = cfg_.concurrency;
  p.step_tokens = cfg_.step_tokens;
  p.background = background_;
  std::vector<std::pair<std::uint64_t, JobId>> order;
  order.reserve(running_.size());
  for (const auto& [id, r] : running_) order.emplace_back(r.order, id);
  std::sort(order.begin(), order.end());
  p.running.reserve(order.size());
  for (const auto& [o, id] : order) {
    const Running& r = running_.at(id);
    p.running.push_back(LoopJob{id, r.prompt_tokens - r.prefilled, r.max_new_tokens - r.generated, r.chunk_cap,
                                fixed_seconds(r.fixed), r.lane});
  }
  p.queued.reserve(std::min(queued_limit, queued_.size()) + 1);
  for (auto q = queued_.begin(); q != queued_.end() && p.queued.size() < queued_limit; ++q) {
    const QueueEntry& e = q->second;
    p.queued.push_back(LoopJob{e.id, e.prompt_tokens, e.max_new_tokens, 0, fixed_seconds(e.fixed), e.lane});
  }
  return p;
}

Clock::duration JobQueue::eta_start_for_new() const {
  LoopPlan p = plan(queued_.size());
  p.queued.push_back(LoopJob{0, 1, 1});  // its own size does not change when it joins
  p.stop = LoopStop{LoopStop::Kind::queued_started, p.queued.size() - 1};
  return simulate_step_loop(p, rates_).queued_start.back();
}

Clock::duration JobQueue::eta_done_for_new(std::uint32_t prompt_tokens, std::uint32_t max_new_tokens) const {
  LoopPlan p = plan(queued_.size());
  p.queued.push_back(LoopJob{0, prompt_tokens, max_new_tokens});
  p.stop = LoopStop{LoopStop::Kind::queued_finished, p.queued.size() - 1};
  return simulate_step_loop(p, rates_).queued_finish.back();
}

std::optional<Clock::duration> JobQueue::eta_start(JobId id) const {
  const std::optional<std::size_t> pos = position(id);
  if (!pos) return std::nullopt;
  LoopPlan p = plan(*pos + 1);  // the jobs behind it join later: they cannot change when it joins
  p.stop = LoopStop{LoopStop::Kind::queued_started, *pos};
  return simulate_step_loop(p, rates_).queued_start[*pos];
}

std::optional<Clock::duration> JobQueue::eta_done(JobId id) const {
  LoopPlan p = plan(queued_.size());
  if (const std::optional<std::size_t> pos = position(id)) {
    p.stop = LoopStop{LoopStop::Kind::queued_finished, *pos};
    return simulate_step_loop(p, rates_).queued_finish[*pos];
  }
  for (std::size_t i = 0; i < p.running.size(); ++i) {
    if (p.running[i].id != id) continue;
    p.stop = LoopStop{LoopStop::Kind::running_finished, i};
    return simulate_step_loop(p, rates_).running_finish[i];
  }
  return std::nullopt;
}

std::vector<QueuedEta> JobQueue::eta_starts() const {
  LoopPlan p = plan(queued_.size());
  std::vector<QueuedEta> out;
  if (p.queued.empty()) return out;
  p.stop = LoopStop{LoopStop::Kind::queued_started, p.queued.size() - 1};
  const LoopTimeline tl = simulate_step_loop(p, rates_);
  out.reserve(p.queued.size());
  for (std::size_t i = 0; i < p.queued.size(); ++i) out.push_back(QueuedEta{p.queued[i].id, tl.queued_start[i]});
  return out;
}

std::vector<RunningWork> JobQueue::running_work() const {
  LoopPlan p = plan(queued_.size());
  p.stop = LoopStop{LoopStop::Kind::all_running_finished, 0};
  const LoopTimeline tl = simulate_step_loop(p, rates_);
  std::vector<RunningWork> out;
  out.reserve(p.running.size());
  for (std::size_t i = 0; i < p.running.size(); ++i) out.push_back(RunningWork{p.running[i].id, tl.running_finish[i]});
  std::sort(out.begin(), out.end(), [](const RunningWork& a, const RunningWork& b) {
    return a.remaining != b.remaining ? a.remaining < b.remaining : a.id < b.id;
  });
  return out;
}

std::vector<RunningWork> JobQueue::finish_etas() const {
  const LoopPlan p = plan(queued_.size());
  const LoopTimeline tl = simulate_step_loop(p, rates_);
  std::vector<RunningWork> out;
  out.reserve(p.running.size() + p.queued.size());
  for (std::size_t i = 0; i < p.running.size(); ++i) out.push_back(RunningWork{p.running[i].id, tl.running_finish[i]});
  for (std::size_t i = 0; i < p.queued.size(); ++i) out.push_back(RunningWork{p.queued[i].id, tl.queued_finish[i]});
  return out;
}

std::optional<Clock::time_point> JobQueue::accepted_at(JobId id) const {
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return it->second.first;
}

}  // namespace tandem::policy
