#include "policy/admission.h"

#include <algorithm>
#include <cmath>

#include "policy/format.h"

namespace tandem::policy {

std::string_view reason_name(Reason r) noexcept {
  switch (r) {
    case Reason::fits: return "fits";
    case Reason::waiting_for_memory: return "waiting_for_memory";
    case Reason::waiting_for_slot: return "waiting_for_slot";
    case Reason::waiting_for_fresh_reading: return "waiting_for_fresh_reading";
    case Reason::queued_behind: return "queued_behind";
    case Reason::waiting_for_replica: return "waiting_for_replica";
    case Reason::fits_reduced: return "fits_reduced";
    case Reason::fits_offloaded: return "fits_offloaded";
    case Reason::routed_cpu: return "routed_cpu";
    case Reason::routed_fallback: return "routed_fallback";
    case Reason::invalid_request: return "invalid_request";
    case Reason::gpu_absent: return "gpu_absent";
    case Reason::breaker_open: return "breaker_open";
    case Reason::reading_expired: return "reading_expired";
    case Reason::exceeds_gpu_limits: return "exceeds_gpu_limits";
    case Reason::critical_pressure: return "critical_pressure";
    case Reason::does_not_fit: return "does_not_fit";
    case Reason::queued_ahead: return "queued_ahead";
    case Reason::no_free_slot: return "no_free_slot";
    case Reason::exceeds_device: return "exceeds_device";
    case Reason::gpu_queue_full: return "gpu_queue_full";
    case Reason::wait_too_long: return "wait_too_long";
    case Reason::wait_unknown: return "wait_unknown";
    case Reason::reduce_not_allowed: return "reduce_not_allowed";
    case Reason::reduce_insufficient: return "reduce_insufficient";
    case Reason::offload_disabled: return "offload_disabled";
    case Reason::offload_unsupported: return "offload_unsupported";
    case Reason::offload_insufficient: return "offload_insufficient";
    case Reason::cpu_not_allowed: return "cpu_not_allowed";
    case Reason::cpu_unavailable: return "cpu_unavailable";
    case Reason::cpu_incompatible: return "cpu_incompatible";
    case Reason::exceeds_cpu_limits: return "exceeds_cpu_limits";
    case Reason::cpu_queue_full: return "cpu_queue_full";
    case Reason::host_memory: return "host_memory";
    case Reason::host_guard_missing: return "host_guard_missing";
    case Reason::replica_loading: return "replica_loading";
    case Reason::cpu_sooner: return "cpu_sooner";
    case Reason::evicting_idle: return "evicting_idle";
    case Reason::waiting_for_eviction: return "waiting_for_eviction";
    case Reason::memory_not_short: return "memory_not_short";
    case Reason::no_idle_replica: return "no_idle_replica";
    case Reason::eviction_insufficient: return "eviction_insufficient";
    case Reason::eviction_capped: return "eviction_capped";
    case Reason::no_rung: return "no_rung";
  }
  return "no_rung";
}

std::optional<std::vector<std::string>> choose_evictions(std::vector<EvictCandidate> c, std::uint64_t missing) {
  std::stable_sort(c.begin(), c.end(), [](const EvictCandidate& a, const EvictCandidate& b) {
    if (a.priority != b.priority) return a.priority < b.priority;
    if (a.last_used != b.last_used) return a.last_used < b.last_used;
    return a.model < b.model;
  });
  std::vector<std::string> out;
  std::uint64_t freed = 0;
  for (const auto& e : c) {
    if (freed >= missing) break;
    if (e.bytes == 0) continue;  // gives nothing back
    out.push_back(e.model);
    freed = sat_add(freed, e.bytes);
  }
  if (freed < missing) return std::nullopt;
  return out;
}

Error Decision::to_error() const {
  if (permanent) return make_error(Errc::invalid_argument, std::string(reason_name(reason)) + ": " + detail);
  return make_error(Errc::rejected, std::string(reason_name(reason)) + ": " + detail + "; retry after " +
                                        format_duration(retry_after));
}

namespace {

bool within(std::uint64_t prompt, std::uint64_t max_new, std::uint32_t max_context, std::uint32_t max_new_limit) {
  return max_new <= max_new_limit && prompt + max_new <= max_context;
}

std::int64_t as_signed(std::uint64_t v) {
  return v > static_cast<std::uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<std::int64_t>(v);
}

bool fits(const MemoryBreakdown& b, std::int64_t headroom) { return as_signed(b.total_bytes) <= headroom; }

std::int64_t ssub(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b > 0 ? INT64_MIN : INT64_MAX;
}

std::string signed_bytes(std::int64_t v) {
  return v < 0 ? "-" + format_bytes(static_cast<std::uint64_t>(-(v + 1)) + 1) : format_bytes(static_cast<std::uint64_t>(v));
}

// When enough of our running GPU jobs will have finished to free `missing` bytes (soonest first); nullopt if all of
// them together do not free that much (the memory is held by someone else: the wait cannot be estimated).
std::optional<Clock::duration> memory_wait(const std::vector<RunningGpuJob>& running, std::int64_t missing) {
  if (missing <= 0) return Clock::duration::zero();
  std::vector<const RunningGpuJob*> order;
  order.reserve(running.size());
  for (const auto& r : running) order.push_back(&r);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->remaining < b->remaining; });
  std::uint64_t freed = 0;
  for (const RunningGpuJob* r : order) {
    freed = sat_add(freed, r->bytes);
    if (freed >= static_cast<std::uint64_t>(missing)) return std::max(r->remaining, Clock::duration::zero());
  }
  return std::nullopt;
}

// The prefill chunk a job may take in a step loop with a budget of `step_tokens` shared with `others` sequences
// (one token each while they decode): capped at max(1, step_tokens − others). Returns the request's own chunk when
// there is no loop (step_tokens = 0) or the cap does not bind.
std::uint32_t step_chunk(const RequestShape& r, std::uint32_t step_tokens, std::uint32_t others) {
  if (step_tokens == 0) return r.prefill_chunk;
  const std::uint32_t share = step_tokens > others ? step_tokens - others : 1;
  const std::uint32_t chunk = r.prefill_chunk == 0 ? r.prompt_tokens : std::min(r.prefill_chunk, r.prompt_tokens);
  return chunk <= share ? r.prefill_chunk : share;
}

// Why the GPU cannot take new work at all (nullopt = it can, subject to memory).
std::optional<Reason> gpu_blocked(const GpuView& g, bool for_delay) {
  if (!g.present) return Reason::gpu_absent;
  if (!g.breaker_allows) return Reason::breaker_open;
  if (!for_delay && g.replica_loading) return Reason::replica_loading;
  if (!for_delay && g.headroom.trust == ReadingTrust::expired) return Reason::reading_expired;
  return std::nullopt;
}

// Common checks of the rungs that start a job on the GPU now (admit, reduce, offload).
std::optional<Reason> gpu_start_blocked(const GpuView& g) {
  if (auto r = gpu_blocked(g, false)) return r;
  if (g.pressure == Pressure::critical) return Reason::critical_pressure;
  if (g.jobs_ahead > 0) return Reason::queued_ahead;
  if (!g.slot_free) return Reason::no_free_slot;
  return std::nullopt;
}

}  // namespace

Decision AdmissionPolicy::decide(const AdmissionSnapshot& s) const {
  const GpuView& g = s.gpu;
  RequestShape req = s.request;  // with the GPU step loop's chunk cap (after validation)
  Decision d;
  d.headroom = g.headroom;
  d.pressure = g.pressure;
  d.max_new_tokens = req.max_new_tokens;
  d.prefill_chunk = req.prefill_chunk;
  d.route = Route{Device::gpu, s.model.layers, false, s.model.name};

  std::string why;  // accumulated "rung: reason" text of skipped rungs
  bool all_permanent = true;  // every rung so far failed for a reason resubmitting the same request cannot change
  std::optional<Clock::duration> gpu_wait;  // the delay rung's estimate, for the retry hint
  auto skip = [&](Rung rung, Reason r, std::string text = {}, bool permanent = false) {
    all_permanent = all_permanent && permanent;
    d.skipped.push_back(RungNote{rung, r});
    if (!why.empty()) why += "; ";
    why += rung_name(rung);
    why += ": ";
    why += reason_name(r);
    if (!text.empty()) why += " (" + text + ")";
  };
  auto reject = [&](Reason r, std::string text, bool permanent) {
    d.action = Rung::reject;
    d.reason = r;
    d.route = Route{Device::gpu, 0, false, s.model.name};
    d.permanent = permanent;
    d.detail = std::move(text);
    if (permanent) {
      d.retry_after = Clock::duration::zero();  // retrying the same request cannot help
      return d;
    }
    Clock::duration hint = ladder_.default_retry_after;
    if (!g.breaker_allows && g.breaker_retry_in > Clock::duration::zero()) {
      hint = g.breaker_retry_in;
    } else if (gpu_wait && *gpu_wait > Clock::duration::zero()) {
      hint = *gpu_wait;
    } else if (g.queue_wait > Clock::duration::zero()) {
      hint = g.queue_wait;
    }
    d.retry_after = std::min(hint, ladder_.max_retry_after);
    return d;
  };

  if (auto st = s.model.validate(); !st) return reject(Reason::invalid_request, st.error().message, true);
  if (auto st = req.validate(); !st) return reject(Reason::invalid_request, st.error().message, true);
  req.prefill_chunk = step_chunk(req, g.step_tokens, g.running_sequences);
  d.prefill_chunk = req.prefill_chunk;

  d.breakdown = estimator_.estimate(s.model, req, g.weights_resident);
  const MemoryBreakdown& full = d.breakdown;
  const std::int64_t room = g.headroom.headroom;
  const bool gpu_limits_ok = within(req.prompt_tokens, req.max_new_tokens, g.max_context, g.max_new_tokens);
  const std::string need = "needs " + format_bytes(full.total_bytes) + ", headroom " + signed_bytes(room);
  // What this device could ever give a job of this model: everything but the margin and the model's own resident
  // weights. A plan larger than that can never run here, whatever else finishes.
  const std::int64_t capacity =
      ssub(ssub(as_signed(g.headroom.total_bytes), as_signed(g.headroom.margin_bytes)),
           g.weights_resident ? as_signed(MemoryEstimator::weights_bytes(s.model)) : 0);
  auto never_fits = [&](const MemoryBreakdown& b) { return g.headroom.total_bytes > 0 && !fits(b, capacity); };

  for (Rung rung : ladder_.order) {
    switch (rung) {
      case Rung::admit: {
        if (auto r = gpu_start_blocked(g)) { skip(rung, *r); break; }
        if (!gpu_limits_ok) { skip(rung, Reason::exceeds_gpu_limits, {}, true); break; }
        if (never_fits(full)) {
          skip(rung, Reason::exceeds_device, need + ", device capacity " + signed_bytes(capacity), true);
          break;
        }
        if (!fits(full, room)) { skip(rung, Reason::does_not_fit, need); break; }
        d.action = Rung::admit;
        d.reason = Reason::fits;
        d.detail = "admit on gpu: " + need;
        return d;
      }
      case Rung::delay: {
        if (auto r = gpu_blocked(g, true)) { skip(rung, *r); break; }
        if (!gpu_limits_ok) { skip(rung, Reason::exceeds_gpu_limits, {}, true); break; }
        if (as_signed(full.total_bytes) > g.headroom.drained_headroom) {
          skip(rung, Reason::exceeds_device, "needs " + format_bytes(full.total_bytes) + " even once our other jobs finished",
               never_fits(full));
          break;
        }
        if (g.queue_full) { skip(rung, Reason::gpu_queue_full); break; }
        // The wait is bounded in total: time already waited + the estimated wait ≤ max_delay.
        const Clock::duration left = ladder_.max_delay - g.waited;
        auto too_long = [&](Clock::duration wait, const char* what) {
          skip(rung, Reason::wait_too_long,
               "waited " + format_duration(g.waited) + " + " + what + " " + format_duration(wait) + " > " +
                   format_duration(ladder_.max_delay));
        };
        if (g.waited > ladder_.max_delay || g.queue_wait > left) { too_long(g.queue_wait, "slot wait"); break; }
        if (g.replica_loading) {
          // Wait for the replica, or start on the CPU now: the earlier finish (an unknown run time waits).
          const Clock::duration gpu_finish = std::max(g.queue_wait, *g.replica_loading) + g.gpu_run;
          const Clock::duration cpu_finish = s.cpu.queue_wait + g.cpu_run;
          const bool cpu_possible = req.allow_cpu && s.cpu.replica_present && !s.cpu.queue_full;
          if (cpu_possible && g.cpu_run > Clock::duration::zero() && g.gpu_run > Clock::duration::zero() &&
              cpu_finish < gpu_finish) {
            skip(rung, Reason::cpu_sooner,
                 "the CPU finishes in ~" + format_duration(cpu_finish) + ", the GPU after its load in ~" +
                     format_duration(gpu_finish));
            break;
          }
          if (*g.replica_loading > left) { too_long(*g.replica_loading, "replica load"); break; }
        }
        const bool expired = g.headroom.trust == ReadingTrust::expired;
        const bool short_of_memory = !fits(full, room) || g.pressure == Pressure::critical;
        Clock::duration eta = g.queue_wait;
        if (short_of_memory && !expired) {
          // Memory: enough running jobs must finish to free what is missing (and, under critical pressure, to lift
          // the headroom above the critical exit level), at their remaining work and the service rates.
          std::int64_t target = as_signed(full.total_bytes);
          if (g.pressure == Pressure::critical) {
            const double exit = std::ceil(ladder_.pressure.critical_exit_fraction * static_cast<double>(g.headroom.total_bytes));
            target = std::max(target, as_signed(static_cast<std::uint64_t>(exit)));
          }
          const std::int64_t missing = ssub(target, room);
          std::optional<Clock::duration> mw = memory_wait(g.running, missing);
          if (!mw) {
            skip(rung, Reason::wait_unknown,
                 "missing " + signed_bytes(missing) + " that no running job of ours frees");
            break;
          }
          eta = std::max(eta, *mw);
          gpu_wait = eta;
          if (eta > left) { too_long(eta, "memory wait"); break; }
        }
        if (g.replica_loading) {
          eta = std::max(eta, *g.replica_loading);
          gpu_wait = eta;
        }
        d.action = Rung::delay;
        d.reason = g.replica_loading     ? Reason::waiting_for_replica
                   : expired             ? Reason::waiting_for_fresh_reading
                   : g.jobs_ahead > 0    ? Reason::queued_behind
                   : short_of_memory     ? Reason::waiting_for_memory
                                         : Reason::waiting_for_slot;
        d.eta = eta;
        d.detail = "delay in gpu queue (" + std::string(reason_name(d.reason)) + "), eta " + format_duration(d.eta) +
                   (g.waited > Clock::duration::zero() ? ", waited " + format_duration(g.waited) : "");
        return d;
      }
      case Rung::evict: {
        // Foreign pressure (docs/residency.md): rather than degrading the job while idle weights of other models sit
        // on the device, give those back (lowest priority, least recently used first) and wait in the GPU queue for
        // the bytes. Only what is missing; never past the cap on evictions per minute.
        if (auto r = gpu_blocked(g, true)) { skip(rung, *r); break; }
        if (g.headroom.trust == ReadingTrust::expired) { skip(rung, Reason::reading_expired); break; }
        // Its own replica is coming back: the delay rung decided between waiting for it and the CPU.
        if (g.replica_loading) { skip(rung, Reason::replica_loading); break; }
        if (!gpu_limits_ok) { skip(rung, Reason::exceeds_gpu_limits, {}, true); break; }
        // Only the head evicts: what it frees goes to the head first, so a job behind would give back more than is
        // missing and spend the cap twice for one shortfall.
        if (g.jobs_ahead > 0) { skip(rung, Reason::queued_ahead); break; }
        if (g.waited > ladder_.max_delay || g.queue_wait > ladder_.max_delay - g.waited) {
          skip(rung, Reason::wait_too_long,
               "waited " + format_duration(g.waited) + " + slot wait " + format_duration(g.queue_wait) + " > " +
                   format_duration(ladder_.max_delay));
          break;
        }
        if (never_fits(full)) {
          skip(rung, Reason::exceeds_device, need + ", device capacity " + signed_bytes(capacity), true);
          break;
        }
        if (g.queue_full) { skip(rung, Reason::gpu_queue_full); break; }
        std::int64_t target = as_signed(full.total_bytes);
        if (g.pressure == Pressure::critical) {
          const double exit = std::ceil(ladder_.pressure.critical_exit_fraction * static_cast<double>(g.headroom.total_bytes));
          target = std::max(target, as_signed(static_cast<std::uint64_t>(exit)));
        }
        const std::int64_t missing = ssub(target, room);
        if (missing <= 0) { skip(rung, Reason::memory_not_short); break; }
        std::vector<std::string> chosen;
        std::uint64_t chosen_bytes = 0;
        if (static_cast<std::uint64_t>(missing) > g.evicting_bytes) {
          const std::uint64_t rest = static_cast<std::uint64_t>(missing) - g.evicting_bytes;
          if (g.evictable.empty()) { skip(rung, Reason::no_idle_replica, "missing " + format_bytes(rest)); break; }
          auto pick = choose_evictions(g.evictable, rest);
          if (!pick) {
            std::uint64_t idle = 0;
            for (const auto& e : g.evictable) idle = sat_add(idle, e.bytes);
            skip(rung, Reason::eviction_insufficient,
                 "idle replicas hold " + format_bytes(idle) + " of the missing " + format_bytes(rest));
            break;
          }
          if (pick->size() > g.evict_budget) {
            skip(rung, Reason::eviction_capped,
                 std::to_string(pick->size()) + " eviction(s) needed, " + std::to_string(g.evict_budget) +
                     " left this minute");
            break;
          }
          chosen = std::move(*pick);
          for (const auto& m : chosen)
            for (const auto& e : g.evictable)
              if (e.model == m) chosen_bytes = sat_add(chosen_bytes, e.bytes);
        }
        d.action = Rung::evict;
        d.reason = chosen.empty() ? Reason::waiting_for_eviction : Reason::evicting_idle;
        d.eta = g.queue_wait;
        std::string names;
        for (const auto& m : chosen) names += (names.empty() ? "" : ", ") + m;
        d.detail = chosen.empty()
                       ? "wait in the gpu queue for the replicas being given back (" + format_bytes(g.evicting_bytes) +
                             "): " + need
                       : "give back the idle gpu replica(s) of " + names + " (" + format_bytes(chosen_bytes) +
                             ") and wait in the gpu queue: " + need;
        d.evict = std::move(chosen);
        return d;
      }
      case Rung::reduce: {
        if (!req.allow_reduce) { skip(rung, Reason::reduce_not_allowed, {}, true); break; }
        if (auto r = gpu_start_blocked(g)) { skip(rung, *r); break; }
        std::uint32_t limit_new = std::min(req.max_new_tokens, g.max_new_tokens);
        if (req.prompt_tokens >= g.max_context) { skip(rung, Reason::exceeds_gpu_limits, {}, true); break; }
        limit_new = std::min<std::uint32_t>(limit_new, g.max_context - req.prompt_tokens);
        const std::uint32_t floor_new = std::min(ladder_.min_reduced_new_tokens, req.max_new_tokens);
        if (limit_new < floor_new) { skip(rung, Reason::exceeds_gpu_limits, {}, true); break; }
        RequestShape r2 = req;
        r2.max_new_tokens = limit_new;
        const std::uint32_t min_chunk = std::min(ladder_.min_prefill_chunk, req.prompt_tokens);
        std::uint32_t chunk = req.prefill_chunk == 0 ? req.prompt_tokens : std::min(req.prefill_chunk, req.prompt_tokens);
        r2.prefill_chunk = chunk;
        MemoryBreakdown b = estimator_.estimate(s.model, r2, g.weights_resident);
        while (!fits(b, room) && chunk > min_chunk) {
          chunk = std::max(min_chunk, chunk / 2);
          r2.prefill_chunk = chunk;
          b = estimator_.estimate(s.model, r2, g.weights_resident);
        }
        if (!fits(b, room)) {
          // Smallest chunk; find the largest max_new_tokens in [floor_new, limit_new] that fits (monotone).
          std::uint32_t lo = floor_new, hi = limit_new;
          r2.max_new_tokens = lo;
          const MemoryBreakdown smallest = estimator_.estimate(s.model, r2, g.weights_resident);
          if (!fits(smallest, room)) {
            skip(rung, Reason::reduce_insufficient,
                 "even " + std::to_string(floor_new) + " tokens with chunk " + std::to_string(chunk) + " do not fit",
                 never_fits(smallest));
            break;
          }
          while (lo < hi) {
            std::uint32_t mid = lo + (hi - lo + 1) / 2;
            r2.max_new_tokens = mid;
            if (fits(estimator_.estimate(s.model, r2, g.weights_resident), room)) lo = mid; else hi = mid - 1;
          }
          r2.max_new_tokens = lo;
          b = estimator_.estimate(s.model, r2, g.weights_resident);
        }
        d.action = Rung::reduce;
        d.reason = Reason::fits_reduced;
        d.breakdown = b;
        d.max_new_tokens = r2.max_new_tokens;
        d.prefill_chunk = r2.prefill_chunk == req.prompt_tokens && req.prefill_chunk == 0 ? 0 : r2.prefill_chunk;
        d.detail = "reduce on gpu: max_new_tokens " + std::to_string(req.max_new_tokens) + " -> " +
                   std::to_string(d.max_new_tokens) + ", prefill chunk " + std::to_string(b.prefill_chunk_tokens) +
                   ", needs " + format_bytes(b.total_bytes);
        return d;
      }
      case Rung::offload: {
        if (!ladder_.offload_enabled) { skip(rung, Reason::offload_disabled, {}, true); break; }
        if (!g.offload_supported) { skip(rung, Reason::offload_unsupported, {}, true); break; }
        if (auto r = gpu_start_blocked(g)) { skip(rung, *r); break; }
        if (!gpu_limits_ok) { skip(rung, Reason::exceeds_gpu_limits, {}, true); break; }
        const std::uint32_t k = estimator_.layers_that_fit(s.model, req, g.weights_resident, room);
        if (k < ladder_.min_gpu_layers) {
          const bool never = g.headroom.total_bytes > 0 &&
                             estimator_.layers_that_fit(s.model, req, g.weights_resident, capacity) < ladder_.min_gpu_layers;
          skip(rung, Reason::offload_insufficient,
               std::to_string(k) + " layers fit, " + std::to_string(ladder_.min_gpu_layers) + " needed", never);
          break;
        }
        // The layers left on the host (with lm_head, their KV and the activations) must pass the host guard: the
        // job starts now, so it must fit now.
        std::optional<HostJobEstimate> he;
        if (k < s.model.layers) {
          if (s.cpu.host == nullptr) { skip(rung, Reason::host_guard_missing); break; }
          he = estimate_host_hybrid(s.model, req, k, estimator_.config(), host_cfg_);
          HostCheck hc = s.cpu.host->check(*he, s.cpu.host_reading);
          if (hc.fit != HostFit::fits) {
            skip(rung, Reason::host_memory,
                 std::to_string(s.model.layers - k) + " layers on the host need " + format_bytes(hc.need_bytes) +
                     ", committed " + format_bytes(hc.committed_bytes) + " of " + format_bytes(hc.budget.bytes) +
                     " (" + std::string(host_bound_name(hc.budget.bound)) + ")");
            break;
          }
        }
        d.action = Rung::offload;
        d.reason = Reason::fits_offloaded;
        d.breakdown = estimator_.estimate_hybrid(s.model, req, g.weights_resident, k);
        d.route = Route{k < s.model.layers ? Device::hybrid : Device::gpu, k, false, s.model.name};
        d.host = he;
        d.detail = "offload: " + std::to_string(k) + " of " + std::to_string(s.model.layers) +
                   " layers on gpu, needs " + format_bytes(d.breakdown.total_bytes) +
                   (he ? ", host " + format_bytes(sat_add(he->job_bytes(), he->mapped_weights_bytes)) : "");
        return d;
      }
      case Rung::route_cpu: {
        const CpuView& c = s.cpu;
        if (!req.allow_cpu) { skip(rung, Reason::cpu_not_allowed, {}, true); break; }
        const ModelShape* target = nullptr;
        bool fallback = false;
        if (c.replica_present && c.fingerprint_compatible) {
          target = &s.model;
        } else if (c.fallback && req.allow_fallback_model) {
          target = &*c.fallback;
          fallback = true;
        }
        if (target == nullptr) {
          skip(rung, c.replica_present || c.fallback ? Reason::cpu_incompatible : Reason::cpu_unavailable,
               c.replica_present ? "replica fingerprint differs" : "");
          break;
        }
        RequestShape r2 = s.request;
        r2.prefill_chunk = step_chunk(s.request, c.step_tokens, c.running_sequences);
        if (!within(req.prompt_tokens, req.max_new_tokens, c.max_context, c.max_new_tokens)) {
          const std::uint32_t floor_new = std::min(ladder_.min_reduced_new_tokens, req.max_new_tokens);
          std::uint32_t capped = 0;
          if (req.prompt_tokens < c.max_context) {
            capped = std::min({req.max_new_tokens, c.max_new_tokens, c.max_context - req.prompt_tokens});
          }
          if (!req.allow_reduce || capped < floor_new || capped == 0) {
            skip(rung, Reason::exceeds_cpu_limits,
                 "cpu limits: context " + std::to_string(c.max_context) + ", max_new " + std::to_string(c.max_new_tokens),
                 true);
            break;
          }
          r2.max_new_tokens = capped;
        }
        if (c.queue_full) { skip(rung, Reason::cpu_queue_full); break; }
        if (c.host == nullptr) { skip(rung, Reason::host_guard_missing); break; }
        HostJobEstimate he = estimate_host_job(*target, r2, estimator_.config(), host_cfg_);
        HostCheck hc = c.host->check(he, c.host_reading);
        if (hc.fit == HostFit::never) {
          skip(rung, Reason::host_memory,
               "needs " + format_bytes(hc.need_bytes) + " of host memory, budget " + format_bytes(hc.budget.bytes) +
                   " (" + std::string(host_bound_name(hc.budget.bound)) + ")");
          break;
        }
        d.action = Rung::route_cpu;
        d.reason = fallback ? Reason::routed_fallback : Reason::routed_cpu;
        d.route = Route{Device::cpu, 0, fallback, target->name};
        d.max_new_tokens = r2.max_new_tokens;
        d.prefill_chunk = r2.prefill_chunk;
        d.host = he;
        d.waits_for_host_memory = hc.fit == HostFit::wait;
        d.eta = c.queue_wait;
        d.detail = std::string(fallback ? "route to fallback model " + target->name + " on cpu" : "route to cpu replica") +
                   (r2.max_new_tokens != req.max_new_tokens ? ", max_new_tokens " + std::to_string(r2.max_new_tokens) : "") +
                   ", host " + format_bytes(hc.need_bytes) + (d.waits_for_host_memory ? " (waits for host memory)" : "") +
                   ", eta " + format_duration(d.eta) + (why.empty() ? "" : "; gpu: " + why);
        return d;
      }
      case Rung::reject: {
        Reason r = d.skipped.empty() ? Reason::no_rung : d.skipped.front().reason;
        return reject(r, why.empty() ? "rejected by the ladder order" : why, all_permanent && !d.skipped.empty());
      }
    }
  }
  Reason r = d.skipped.empty() ? Reason::no_rung : d.skipped.front().reason;
  return reject(r, why, all_permanent && !d.skipped.empty());  // unreachable with a validated order
}

GpuView make_gpu_view(const Headroom& h, Pressure p, const CircuitBreaker& breaker, const JobQueue& q,
                      const ReservationLedger& ledger, Clock::time_point now, bool weights_resident,
                      bool offload_supported, std::optional<JobId> self) {
  GpuView g;
  g.breaker_allows = breaker.allows_gpu();
  g.breaker_retry_in = breaker.retry_in(now);
  g.headroom = h;
  g.pressure = p;
  g.weights_resident = weights_resident;
  g.offload_supported = offload_supported;
  std::optional<std::size_t> pos = self ? q.position(*self) : std::nullopt;
  g.jobs_ahead = pos ? *pos : q.depth();
  g.slot_free = q.has_free_slot();
  g.queue_full = pos ? false : q.full();
  g.queue_wait = pos ? q.eta_start(*self).value_or(Clock::duration::zero()) : q.eta_start_for_new();
  for (const RunningWork& w : q.running_work()) {
    const Reservation* r = ledger.find(w.id);
    g.running.push_back(RunningGpuJob{r ? r->bytes : 0, w.remaining});
  }
  if (self) {
    if (auto t = q.accepted_at(*self)) g.waited = now > *t ? now - *t : Clock::duration::zero();
  }
  g.max_context = q.config().max_context;
  g.max_new_tokens = q.config().max_new_tokens;
  g.running_sequences = static_cast<std::uint32_t>(q.running());
  return g;
}

CpuView make_cpu_view(const JobQueue& q, const HostMemoryGuard& host, const HostReading& reading, bool replica_present,
                      bool fingerprint_compatible, std::optional<ModelShape> fallback, std::optional<JobId> self) {
  CpuView c;
  c.replica_present = replica_present;
  c.fingerprint_compatible = fingerprint_compatible;
  c.fallback = std::move(fallback);
  const bool queued = self && q.position(*self).has_value();
  c.queue_full = queued ? false : q.full();
  c.queue_wait = queued ? q.eta_start(*self).value_or(Clock::duration::zero()) : q.eta_start_for_new();
  c.max_context = q.config().max_context;
  c.max_new_tokens = q.config().max_new_tokens;
  c.running_sequences = static_cast<std::uint32_t>(q.running());
  c.host = &host;
  c.host_reading = reading;
  return c;
}

}  // namespace tandem::policy
