#include "policy/host_guard.h"

#include <algorithm>

#include "policy/estimator.h"
#include "policy/format.h"

namespace tandem::policy {

std::string_view host_bound_name(HostBound b) noexcept {
  switch (b) {
    case HostBound::configured: return "configured";
    case HostBound::cgroup: return "cgroup";
    case HostBound::mem_available: return "mem_available";
    case HostBound::no_reading: return "no_reading";
  }
  return "configured";
}

std::string_view host_fit_name(HostFit f) noexcept {
  switch (f) {
    case HostFit::fits: return "fits";
    case HostFit::wait: return "wait";
    case HostFit::never: return "never";
  }
  return "never";
}

HostJobEstimate estimate_host_job(const ModelShape& m, const RequestShape& r, const EstimatorConfig& est,
                                  const HostGuardConfig& cfg) {
  ModelShape cpu = m;
  cpu.act_elem_bytes = cfg.cpu_act_elem_bytes;
  cpu.kv_elem_bytes = m.cpu_kv_elem_bytes;
  MemoryBreakdown b = MemoryEstimator(est).estimate(cpu, r, /*weights_resident=*/true);
  HostJobEstimate e;
  e.model = m.name;
  e.mapped_weights_bytes = MemoryEstimator::weights_bytes(m);
  e.kv_bytes = b.kv_bytes;
  // Fragmentation allowance goes with the activations (malloc arenas).
  e.activation_bytes = sat_add(b.activation_bytes, b.fragmentation_bytes);
  return e;
}

std::uint64_t HostJobEstimate::job_bytes() const { return sat_add(kv_bytes, activation_bytes); }

HostJobEstimate estimate_host_hybrid(const ModelShape& m, const RequestShape& r, std::uint32_t gpu_layers,
                                     const EstimatorConfig& est, const HostGuardConfig& cfg) {
  gpu_layers = std::min(gpu_layers, m.layers);
  HostJobEstimate e;
  e.model = m.name;
  if (gpu_layers == m.layers) return e;  // nothing on the host
  const std::uint32_t host_layers = m.layers - gpu_layers;
  ModelShape cpu = m;
  cpu.layers = host_layers;
  cpu.act_elem_bytes = cfg.cpu_act_elem_bytes;
  cpu.kv_elem_bytes = m.cpu_kv_elem_bytes;
  MemoryBreakdown b = MemoryEstimator(est).estimate(cpu, r, /*weights_resident=*/true);  // logits included
  e.kv_bytes = b.kv_bytes;
  e.activation_bytes = sat_add(b.activation_bytes, b.fragmentation_bytes);
  // lm_head has the embedding's shape (and is the embedding when tied); the final norm is d weights.
  const std::uint64_t norm = (std::uint64_t{m.hidden} * m.weight_bits + 7) / 8;
  e.mapped_weights_bytes = sat_add(sat_add(sat_mul(host_layers, MemoryEstimator::layer_weights_bytes(m)),
                                           MemoryEstimator::embedding_bytes(m)),
                                   norm);
  return e;
}

HostBudget HostMemoryGuard::budget(const HostReading& r) const {
  HostBudget b{0, HostBound::no_reading};
  bool any = false;
  auto take = [&](std::uint64_t room, HostBound bound) {
    if (!any || room < b.bytes) b = {room, bound};
    any = true;
  };
  if (cfg_.budget_bytes != 0) take(cfg_.budget_bytes, HostBound::configured);
  if (r.cgroup_max && r.cgroup_current) {
    std::uint64_t room = *r.cgroup_max > *r.cgroup_current ? *r.cgroup_max - *r.cgroup_current : 0;
    take(sat_add(room, materialized_), HostBound::cgroup);
  }
  if (r.mem_available) {
    std::uint64_t room = *r.mem_available > cfg_.mem_available_reserve ? *r.mem_available - cfg_.mem_available_reserve : 0;
    take(sat_add(room, materialized_anon_), HostBound::mem_available);
  }
  return b;
}

HostCheck HostMemoryGuard::check(const HostJobEstimate& e, const HostReading& r) const {
  HostCheck c;
  c.budget = budget(r);
  c.committed_bytes = committed_;
  auto mit = models_.find(e.model);
  const std::uint64_t mapped = mit == models_.end() ? 0 : mit->second.bytes;
  // The mapping is counted once per model, at the largest size any of its jobs needs.
  const std::uint64_t extra_mapping = e.mapped_weights_bytes > mapped ? e.mapped_weights_bytes - mapped : 0;
  c.need_bytes = sat_add(e.job_bytes(), extra_mapping);
  const std::uint64_t alone = sat_add(e.job_bytes(), e.mapped_weights_bytes);
  if (sat_add(committed_, c.need_bytes) <= c.budget.bytes) {
    c.fit = HostFit::fits;
  } else if (alone <= c.budget.bytes) {
    c.fit = HostFit::wait;
  } else {
    c.fit = HostFit::never;
  }
  return c;
}

Result<HostCheck> HostMemoryGuard::admit(JobId job, const HostJobEstimate& e, const HostReading& r) {
  if (auto it = jobs_.find(job); it != jobs_.end()) {
    HostCheck c;
    c.fit = HostFit::fits;
    c.need_bytes = 0;
    c.committed_bytes = committed_;
    c.budget = budget(r);
    return c;
  }
  HostCheck c = check(e, r);
  std::uint64_t total = 0;
  if (c.fit == HostFit::fits && __builtin_add_overflow(committed_, c.need_bytes, &total)) {
    return fail(Errc::host_memory, "CPU job " + std::to_string(job) + " needs " + format_bytes(c.need_bytes) +
                                       " of host memory: the committed total would overflow");
  }
  if (c.fit != HostFit::fits) {
    return fail(Errc::host_memory, "CPU job " + std::to_string(job) + " needs " + format_bytes(c.need_bytes) +
                                       " of host memory; " + format_bytes(c.committed_bytes) + " of " +
                                       format_bytes(c.budget.bytes) + " (" +
                                       std::string(host_bound_name(c.budget.bound)) + ") already committed");
  }
  Mapping& map = models_[e.model];
  if (e.mapped_weights_bytes > map.bytes) {
    const std::uint64_t growth = e.mapped_weights_bytes - map.bytes;
    map.bytes = e.mapped_weights_bytes;
    if (map.materialized_jobs > 0) materialized_ += growth;  // the mapping is resident already: grows in place
  }
  ++map.jobs;
  jobs_.emplace(job, Entry{e.model, e.job_bytes(), false});
  committed_ = total;  // committed + job + mapping growth (= need), checked above
  return c;
}

Status HostMemoryGuard::materialize(JobId job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return fail(Errc::not_found, "no host reservation for job " + std::to_string(job));
  if (it->second.materialized) return {};
  it->second.materialized = true;
  materialized_ += it->second.bytes;  // ≤ committed_, which did not overflow
  materialized_anon_ += it->second.bytes;
  Mapping& map = models_[it->second.model];
  if (map.materialized_jobs++ == 0) materialized_ += map.bytes;
  return {};
}

bool HostMemoryGuard::release(JobId job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return false;
  committed_ -= it->second.bytes;
  auto mit = models_.find(it->second.model);
  if (it->second.materialized) {
    materialized_ -= it->second.bytes;
    materialized_anon_ -= it->second.bytes;
    if (--mit->second.materialized_jobs == 0) materialized_ -= mit->second.bytes;
  }
  if (--mit->second.jobs == 0) {
    committed_ -= mit->second.bytes;
    models_.erase(mit);
  }
  jobs_.erase(it);
  return true;
}

}  // namespace tandem::policy
