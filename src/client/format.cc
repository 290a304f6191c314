#include "client/format.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>

namespace tandem::client {

namespace {

using nlohmann::json;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

template <class T>
std::string opt_str(const std::optional<T>& v, std::string_view none = "?") {
  if (!v) return std::string(none);
  if constexpr (std::is_same_v<T, std::string>) {
    return *v;
  } else if constexpr (std::is_same_v<T, bool>) {
    return *v ? "yes" : "no";
  } else {
    return std::to_string(*v);
  }
}

std::string opt_bytes(const std::optional<std::uint64_t>& v) { return v ? format_bytes(*v) : "?"; }
std::string opt_sbytes(const std::optional<std::int64_t>& v) {
  if (!v) return "?";
  if (*v < 0) return "-" + format_bytes(static_cast<std::uint64_t>(-(*v + 1)) + 1);
  return format_bytes(static_cast<std::uint64_t>(*v));
}

std::string mib(std::uint64_t bytes) { return fmt("%.1f MiB", static_cast<double>(bytes) / 1048576.0); }

constexpr std::size_t kLabel = 14;
void line(std::string& out, std::string_view label, std::string_view text, std::size_t width = kLabel) {
  std::string l(label);
  if (l.size() < width)
    l.resize(width, ' ');
  else
    l += ' ';
  out += l;
  out += text;
  out += '\n';
}
void cont(std::string& out, std::string_view text) {
  out += std::string(kLabel, ' ');
  out += text;
  out += '\n';
}

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string o;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) o += sep;
    o += v[i];
  }
  return o;
}

std::string ago(std::int64_t then_unix_ms, std::int64_t now_unix_ms) {
  if (then_unix_ms <= 0) return "?";
  std::int64_t d = now_unix_ms - then_unix_ms;
  if (d < 0) return "in " + format_duration_ms(static_cast<std::uint64_t>(-d));
  return format_duration_ms(static_cast<std::uint64_t>(d)) + " ago";
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------

bool ServiceStatus::degraded() const { return state && (*state == "degraded" || *state == "unavailable"); }

bool is_terminal_state(std::string_view state) {
  return state == "completed" || state == "failed" || state == "cancelled";
}

// ---------------------------------------------------------------------------------------------------------------
// Text

std::string format_bytes(std::uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) return std::to_string(bytes) + " B";
  if (bytes < (1ull << 20)) return fmt("%.1f KiB", b / 1024.0);
  if (bytes < (1ull << 30)) return fmt("%.1f MiB", b / 1048576.0);
  if (bytes < (1ull << 40)) return fmt("%.2f GiB", b / 1073741824.0);
  return fmt("%.2f TiB", b / 1099511627776.0);
}

std::string format_signed_bytes(std::int64_t bytes) {
  if (bytes < 0) return "-" + format_bytes(static_cast<std::uint64_t>(-(bytes + 1)) + 1);
  return "+" + format_bytes(static_cast<std::uint64_t>(bytes));
}

std::string format_duration_ms(std::uint64_t ms) {
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms < 60000) return fmt("%.1f s", static_cast<double>(ms) / 1000.0);
  if (ms < 3600000) {
    std::uint64_t s = ms / 1000;
    return std::to_string(s / 60) + " min " + std::to_string(s % 60) + " s";
  }
  std::uint64_t m = ms / 60000;
  if (m < 48 * 60) return std::to_string(m / 60) + " h " + std::to_string(m % 60) + " min";
  return std::to_string(m / (60 * 24)) + " d " + std::to_string((m / 60) % 24) + " h";
}

std::string format_count(double v) {
  if (std::isfinite(v) && std::fabs(v - std::round(v)) < 1e-9 && std::fabs(v) < 1e15)
    return std::to_string(static_cast<long long>(std::llround(v)));
  if (std::fabs(v) >= 10) return fmt("%.0f", v);
  return fmt("%.1f", v);
}

std::string describe_reason(std::string_view reason) {
  static const std::map<std::string_view, std::string_view> phrases = {
      {"gpu-breaker-open", "the GPU circuit breaker is open after GPU failures"},
      {"gpu-breaker-half-open", "the GPU is being probed after failures (circuit breaker half-open)"},
      {"gpu-held", "an application holds the GPU"},
      {"gpu-given-back", "GPU replicas were given back to other programs that need the memory"},
      {"gpu-absent", "no GPU is available"},
      {"fallback-model", "a fallback model is in use"},
      {"memory-pressure", "GPU memory is under pressure"},
      {"memory-critical", "GPU memory is critically low"},
      {"memory-reading-stale", "the GPU memory reading is stale"},
      {"breaker_open", "the GPU circuit breaker is open"},
      {"gpu_absent", "no GPU is available"},
      {"does_not_fit", "the request does not fit in GPU memory now"},
      {"critical_pressure", "GPU memory is critically low"},
      {"reading_expired", "the GPU memory reading expired"},
      {"exceeds_gpu_limits", "the request exceeds the GPU limits"},
      {"held", "an application holds the GPU"},
      {"device_lost", "the GPU was lost (driver reset)"},
      {"device-lost", "the GPU was lost (driver reset)"},
      {"out_of_memory", "the GPU ran out of memory"},
      {"kv_exhausted", "the GPU's KV cache is full"},
      {"gpu_held", "an application holds the GPU"},
  };
  auto it = phrases.find(reason);
  if (it != phrases.end()) return std::string(it->second);
  return std::string(reason);
}

std::string format_status(const ServiceStatus& s, std::int64_t now_unix_ms) {
  std::string out;
  const std::string state = s.state.value_or("?");
  const std::string reason = s.degraded_reason.value_or("");
  if (state == "degraded") {
    std::string l = "!!! DEGRADED: " + (reason.empty() ? std::string("reason unknown") : describe_reason(reason)) +
                    " — new work runs on the CPU";
    if (s.fallback_model && !s.fallback_model->empty()) l += " with fallback model " + *s.fallback_model;
    l += ", expect it to be slower !!!";
    out += l + "\n";
  } else if (state == "unavailable") {
    out += "!!! UNAVAILABLE: " + (reason.empty() ? std::string("reason unknown") : describe_reason(reason)) +
           " — no route can take new jobs !!!\n";
  }
  if (s.version) line(out, "Version", "tandemd " + *s.version);
  std::string st = state;
  if (!reason.empty()) st += " (" + reason + ")";
  line(out, "State", st);
  line(out, "GPU breaker", opt_str(s.gpu_breaker));

  if (s.memory) {
    const MemoryInfo& m = *s.memory;
    std::string dev = m.device.value_or("accelerator");
    if (m.present && !*m.present) {
      line(out, "GPU memory", dev + ": not present");
    } else {
      line(out, "GPU memory", dev + ": total " + opt_bytes(m.total) + ", free " + opt_bytes(m.free) + " (driver)");
      std::string us = "used by us " + opt_bytes(m.observed_used) + ", predicted " + opt_bytes(m.predicted_used);
      if (m.prediction_error) us += " (error " + format_signed_bytes(*m.prediction_error) + ")";
      cont(out, us);
      cont(out, "foreign " + opt_bytes(m.foreign) + ", margin " + opt_bytes(m.margin) + ", unmaterialized " +
                    opt_bytes(m.unmaterialized));
      cont(out, "headroom " + opt_sbytes(m.headroom) + ", pressure " + opt_str(m.pressure));
      std::string age = m.reading_age_ms ? format_duration_ms(*m.reading_age_ms) + " old" : std::string("age ?");
      std::string trust = m.trust.value_or("?");
      if (trust != "fresh" && trust != "?") trust = trust + " — NOT TRUSTED AS IS";
      cont(out, "reading " + age + " (" + trust + ")");
    }
  }
  if (s.host_memory) {
    const HostMemoryInfo& h = *s.host_memory;
    std::string t = "budget " + opt_bytes(h.budget) + ", used " + opt_bytes(h.used);
    if (h.budget && h.used && *h.budget > 0)
      t += fmt(" (%.0f%%)", 100.0 * static_cast<double>(*h.used) / static_cast<double>(*h.budget));
    line(out, "Host memory", t);
    std::vector<std::string> more;
    // 0 = not set (no configured budget, no cgroup limit).
    more.push_back("configured " + (h.configured_budget && *h.configured_budget ? format_bytes(*h.configured_budget) : std::string("none")));
    more.push_back("cgroup max " + (h.cgroup_max && *h.cgroup_max ? format_bytes(*h.cgroup_max) : std::string("none")));
    if (h.mem_available) more.push_back("available " + format_bytes(*h.mem_available));
    if (h.daemon_rss) more.push_back("tandemd RSS " + format_bytes(*h.daemon_rss));
    if (!more.empty()) cont(out, join(more, ", "));
  }
  if (s.queues) {
    bool first = true;
    for (const QueueInfo& q : *s.queues) {
      std::string name = q.name;
      if (name.size() < 5) name.resize(5, ' ');
      std::string t = name + std::to_string(q.depth) + "/" + std::to_string(q.capacity) + " queued, " +
                      std::to_string(q.running) + "/" + std::to_string(q.concurrency) + " running";
      if (q.depth > 0 || q.oldest_age_ms > 0) t += ", oldest " + format_duration_ms(q.oldest_age_ms);
      if (q.capacity > 0 && q.depth >= q.capacity) t += " (FULL)";
      if (first)
        line(out, "Queues", t);
      else
        cont(out, t);
      first = false;
    }
    if (first) line(out, "Queues", "none");
  }
  if (s.limits) {
    std::vector<std::string> parts;
    std::set<std::string> done;
    for (const char* dev : {"gpu", "cpu"}) {
      std::string c = std::string(dev) + "_max_context", n = std::string(dev) + "_max_new_tokens";
      auto ic = s.limits->find(c), in = s.limits->find(n);
      if (ic == s.limits->end() && in == s.limits->end()) continue;
      std::string p = std::string(dev) + ": context " +
                      (ic != s.limits->end() ? std::to_string(ic->second) : std::string("?")) + ", new tokens " +
                      (in != s.limits->end() ? std::to_string(in->second) : std::string("?"));
      parts.push_back(p);
      done.insert(c);
      done.insert(n);
    }
    for (const auto& [k, v] : *s.limits)
      if (!done.count(k)) parts.push_back(k + " " + std::to_string(v));
    line(out, "Limits", parts.empty() ? "none" : join(parts, "; "));
  }
  if (s.holds) {
    if (s.holds->empty()) line(out, "GPU holds", "none");
    bool first = true;
    for (const HoldInfo& h : *s.holds) {
      std::string t = (h.app_id.empty() ? std::string("(no app id)") : h.app_id) + ": " + h.reason + " (cookie " +
                      h.cookie + ", since " + ago(h.since_unix_ms, now_unix_ms) + ")";
      if (first)
        line(out, "GPU holds", t);
      else
        cont(out, t);
      first = false;
    }
  }
  if (s.fallback_model)
    line(out, "Fallback", s.fallback_model->empty() ? std::string("none") : *s.fallback_model + " (in use)");
  return out;
}

namespace {

std::string queue_summary(const std::vector<QueueInfo>& qs) {
  std::vector<std::string> parts;
  for (const auto& q : qs)
    parts.push_back(q.name + " " + std::to_string(q.depth) + "/" + std::to_string(q.capacity) + " run " +
                    std::to_string(q.running) + "/" + std::to_string(q.concurrency));
  return join(parts, ", ");
}

std::string policy_inline(const PolicySettings& p) {
  std::vector<std::string> parts;
  if (p.margin_bytes) parts.push_back("margin_bytes=" + format_bytes(*p.margin_bytes));
  if (p.margin_fraction) parts.push_back("margin_fraction=" + fmt("%g", *p.margin_fraction));
  if (p.ladder_order) parts.push_back("ladder_order=" + join(*p.ladder_order, ","));
  if (p.max_delay_ms) parts.push_back("max_delay_ms=" + std::to_string(*p.max_delay_ms));
  if (p.offload_enabled) parts.push_back(std::string("offload_enabled=") + (*p.offload_enabled ? "true" : "false"));
  if (p.allow_migration) parts.push_back(std::string("allow_migration=") + (*p.allow_migration ? "true" : "false"));
  if (p.gpu_concurrency) parts.push_back("gpu_concurrency=" + std::to_string(*p.gpu_concurrency));
  if (p.cpu_concurrency) parts.push_back("cpu_concurrency=" + std::to_string(*p.cpu_concurrency));
  if (p.host_budget_bytes) parts.push_back("host_budget_bytes=" + format_bytes(*p.host_budget_bytes));
  if (p.breaker_cooldown_ms) parts.push_back("breaker_cooldown_ms=" + std::to_string(*p.breaker_cooldown_ms));
  return join(parts, " ");
}

}  // namespace

std::string format_properties_change(const PropertiesChange& c) {
  const ServiceStatus& s = c.values;
  std::vector<std::string> parts;
  static const std::vector<std::string> order = {"State",  "DegradedReason", "GpuBreaker", "FallbackModel",
                                                 "Memory", "HostMemory",     "Queues",     "Limits",
                                                 "Holds",  "Policy",         "Version"};
  std::vector<std::string> names = c.changed;
  auto rank = [&](const std::string& n) {
    auto it = std::find(order.begin(), order.end(), n);
    return it - order.begin();
  };
  std::stable_sort(names.begin(), names.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  for (const std::string& name : names) {
    if (name == "State" && s.state)
      parts.push_back("State=" + *s.state);
    else if (name == "DegradedReason" && s.degraded_reason)
      parts.push_back("DegradedReason=" + (s.degraded_reason->empty() ? std::string("\"\"") : *s.degraded_reason));
    else if (name == "GpuBreaker" && s.gpu_breaker)
      parts.push_back("GpuBreaker=" + *s.gpu_breaker);
    else if (name == "FallbackModel" && s.fallback_model)
      parts.push_back("FallbackModel=" + (s.fallback_model->empty() ? std::string("\"\"") : *s.fallback_model));
    else if (name == "Version" && s.version)
      parts.push_back("Version=" + *s.version);
    else if (name == "Memory" && s.memory) {
      const MemoryInfo& m = *s.memory;
      parts.push_back("Memory{headroom " + opt_sbytes(m.headroom) + ", ours " + opt_bytes(m.observed_used) +
                      ", foreign " + opt_bytes(m.foreign) + ", pressure " + opt_str(m.pressure) + ", trust " +
                      opt_str(m.trust) + "}");
    } else if (name == "HostMemory" && s.host_memory) {
      parts.push_back("HostMemory{used " + opt_bytes(s.host_memory->used) + " of " + opt_bytes(s.host_memory->budget) +
                      "}");
    } else if (name == "Queues" && s.queues) {
      parts.push_back("Queues{" + queue_summary(*s.queues) + "}");
    } else if (name == "Limits" && s.limits) {
      std::vector<std::string> l;
      for (const auto& [k, v] : *s.limits) l.push_back(k + "=" + std::to_string(v));
      parts.push_back("Limits{" + join(l, " ") + "}");
    } else if (name == "Holds" && s.holds) {
      std::vector<std::string> h;
      for (const auto& x : *s.holds) h.push_back(x.app_id.empty() ? x.cookie : x.app_id);
      parts.push_back("Holds{" + (h.empty() ? std::string("none") : join(h, ", ")) + "}");
    } else if (name == "Policy" && s.policy) {
      parts.push_back("Policy{" + policy_inline(*s.policy) + "}");
    } else {
      parts.push_back(name + "=?");
    }
  }
  for (const std::string& name : c.invalidated) parts.push_back(name + " (invalidated)");
  return "properties: " + join(parts, " ");
}

std::string format_degraded_change(const DegradedChange& d) {
  std::string t;
  if (d.degraded) {
    t = "DEGRADED: " + describe_reason(d.reason);
    if (d.reason != describe_reason(d.reason)) t += " [" + d.reason + "]";
    if (d.level) t += ", level " + *d.level;
    if (d.fallback_model && !d.fallback_model->empty()) t += ", fallback model " + *d.fallback_model;
    if (d.expected_slowdown) t += ", expect ~" + format_count(*d.expected_slowdown) + "x slower";
    if (d.limits && !d.limits->empty()) {
      std::vector<std::string> l;
      for (const auto& [k, v] : *d.limits) l.push_back(k + "=" + std::to_string(v));
      t += ", limits " + join(l, " ");
    }
  } else {
    t = "degraded mode ended";
    if (!d.reason.empty()) t += " (" + d.reason + ")";
    if (d.level) t += ", level " + *d.level;
  }
  return t;
}

std::string format_policy(const PolicySettings& p) {
  std::string out;
  auto line = [&out](std::string_view label, std::string_view text) { ::tandem::client::line(out, label, text, 21); };
  if (p.margin_bytes)
    line("margin_bytes", std::to_string(*p.margin_bytes) + " (" + format_bytes(*p.margin_bytes) + ")");
  if (p.margin_fraction) line("margin_fraction", fmt("%g", *p.margin_fraction));
  if (p.ladder_order) line("ladder_order", join(*p.ladder_order, ","));
  if (p.max_delay_ms)
    line("max_delay_ms", std::to_string(*p.max_delay_ms) + " (" + format_duration_ms(*p.max_delay_ms) + ")");
  if (p.offload_enabled) line("offload_enabled", *p.offload_enabled ? "true" : "false");
  if (p.allow_migration) line("allow_migration", *p.allow_migration ? "true" : "false");
  if (p.gpu_concurrency) line("gpu_concurrency", std::to_string(*p.gpu_concurrency));
  if (p.cpu_concurrency) line("cpu_concurrency", std::to_string(*p.cpu_concurrency));
  if (p.host_budget_bytes)
    line("host_budget_bytes", std::to_string(*p.host_budget_bytes) + " (" + format_bytes(*p.host_budget_bytes) + ")");
  if (p.breaker_cooldown_ms)
    line("breaker_cooldown_ms",
         std::to_string(*p.breaker_cooldown_ms) + " (" + format_duration_ms(*p.breaker_cooldown_ms) + ")");
  for (const auto& [k, sig] : p.unparsed) line(k, "(unexpected type " + sig + ")");
  if (out.empty()) out = "(no policy keys reported)\n";
  return out;
}

namespace {

std::string route_phrase(std::string_view route) {
  if (route == "cpu") return "on the CPU";
  if (route == "hybrid") return "partly on the CPU (hybrid GPU+CPU)";
  if (route == "gpu") return "on the GPU";
  return "on route " + std::string(route);
}

}  // namespace

// "ETA 1.2 s", or — while the route's rates are still the configured priors (no copy of it has run yet) — what the
// daemon cannot know yet instead of a made-up number.
static std::string eta_text(std::uint64_t eta_ms, std::optional<bool> known, const std::optional<std::string>& route) {
  if (known && !*known)
    return "ETA unavailable until the " + std::string(route && *route == "cpu" ? "CPU" : "GPU") +
           " copy has run (not measured yet)";
  return "ETA " + format_duration_ms(eta_ms);
}

std::string degraded_banner(const Placement& p, std::optional<double> expected_slowdown,
                            std::string_view degraded_reason) {
  const bool degraded = p.degraded.value_or(false);
  const bool fallback = p.fallback_model.value_or(false);
  if (!degraded && !fallback) return "";
  std::string why(degraded_reason);
  if (why.empty()) why = p.reason.value_or("");
  std::string t = "DEGRADED: running " + route_phrase(p.route.value_or("cpu"));
  if (fallback) t += " with fallback model " + p.model.value_or("?");
  t += " because " + (why.empty() ? std::string("the GPU is not usable") : describe_reason(why));
  if (expected_slowdown && *expected_slowdown > 1.0)
    t += " — expect ~" + format_count(*expected_slowdown) + "x slower";
  else
    t += " — expect it to be slower";
  t += "; Ctrl-C cancels";
  return t;
}

std::string format_placement(std::uint64_t job_id, const Placement& p, std::optional<double> expected_slowdown) {
  std::string out;
  if (p.existing.value_or(false))
    out += "job " + std::to_string(job_id) +
           " already exists for this idempotency key: attaching to it (nothing runs again)\n";
  std::string t = "job " + std::to_string(job_id) + ": " + p.action.value_or("?");
  std::vector<std::string> parts;
  if (p.route) parts.push_back("route " + *p.route);
  if (p.model) parts.push_back("model " + *p.model + (p.fallback_model.value_or(false) ? " (fallback)" : ""));
  if (p.queue) {
    std::string q = "queue " + *p.queue;
    if (p.queue_position) q += " #" + std::to_string(*p.queue_position);
    parts.push_back(q);
  }
  if (p.eta_ms) parts.push_back(eta_text(*p.eta_ms, p.eta_known, p.route));
  if (p.gpu_layers && p.route && *p.route == "hybrid")
    parts.push_back(std::to_string(*p.gpu_layers) + " layers on the GPU");
  if (p.max_new_tokens) parts.push_back("max new tokens " + std::to_string(*p.max_new_tokens));
  if (p.prefill_chunk && *p.prefill_chunk > 0) parts.push_back("prefill chunk " + std::to_string(*p.prefill_chunk));
  if (!parts.empty()) t += " → " + join(parts, ", ");
  if (p.reason && !p.reason->empty()) t += " (" + *p.reason + ")";
  out += t + "\n";
  if (p.detail && !p.detail->empty()) out += "  " + *p.detail + "\n";
  std::string banner = degraded_banner(p, expected_slowdown, "");
  if (!banner.empty()) out += banner + "\n";
  return out;
}

std::string format_plan(const PlanDecision& d) {
  std::string out;
  std::string action = d.action.value_or("?");
  if (d.reason && !d.reason->empty()) action += " (" + *d.reason + ")";
  line(out, "Decision", action);
  std::vector<std::string> route;
  if (d.route) route.push_back(*d.route);
  if (d.model) route.push_back("model " + *d.model + (d.fallback_model.value_or(false) ? " (fallback)" : ""));
  if (d.gpu_layers) route.push_back(std::to_string(*d.gpu_layers) + " GPU layers");
  if (!route.empty()) line(out, "Route", join(route, ", "));
  std::vector<std::string> lim;
  if (d.max_new_tokens) lim.push_back("max new tokens " + std::to_string(*d.max_new_tokens));
  if (d.prefill_chunk) lim.push_back("prefill chunk " + std::to_string(*d.prefill_chunk));
  if (d.prompt_tokens) lim.push_back("prompt " + std::to_string(*d.prompt_tokens) + " tokens");
  if (!lim.empty()) line(out, "Request", join(lim, ", "));
  if (d.eta_ms)
    line(out, "ETA", d.eta_known.value_or(true) ? format_duration_ms(*d.eta_ms) : eta_text(*d.eta_ms, d.eta_known, d.route).substr(4));
  if (d.retry_after_ms && *d.retry_after_ms > 0) line(out, "Retry after", format_duration_ms(*d.retry_after_ms));
  if (d.permanent && *d.permanent) line(out, "Permanent", "yes: retrying the same request will not help");
  if (d.pressure) line(out, "Pressure", *d.pressure);
  if (d.breakdown) {
    std::vector<std::string> parts;
    std::set<std::string> done;
    for (const char* k : {"weights", "kv_cache", "activations", "fragmentation", "total"}) {
      auto it = d.breakdown->find(k);
      if (it == d.breakdown->end()) continue;
      parts.push_back(std::string(k) + " " + mib(it->second));
      done.insert(k);
    }
    for (const auto& [k, v] : *d.breakdown)  // counts, not bytes (kv_blocks, layers) and any newer key as is
      if (!done.count(k)) parts.push_back(k + " " + std::to_string(v));
    line(out, "Estimate", join(parts, ", "));
  }
  if (d.headroom) {
    std::vector<std::string> parts;
    std::set<std::string> done;
    for (const char* k : {"total", "margin", "predicted_headroom", "observed_headroom", "headroom", "unmaterialized"}) {
      auto it = d.headroom->find(k);
      if (it == d.headroom->end()) continue;
      parts.push_back(std::string(k) + " " + opt_sbytes(it->second));
      done.insert(k);
    }
    for (const auto& [k, v] : *d.headroom)
      if (!done.count(k)) parts.push_back(k + " " + opt_sbytes(v));
    line(out, "Headroom",
         join(std::vector<std::string>(parts.begin(), parts.begin() + std::min<std::size_t>(3, parts.size())), ", "));
    if (parts.size() > 3) cont(out, join(std::vector<std::string>(parts.begin() + 3, parts.end()), ", "));
  }
  if (d.skipped) {
    if (d.skipped->empty()) line(out, "Skipped", "none");
    bool first = true;
    for (const auto& s : *d.skipped) {
      std::string t = s.rung + ": " + s.why;
      if (first)
        line(out, "Skipped", t);
      else
        cont(out, t);
      first = false;
    }
  }
  if (d.detail && !d.detail->empty()) line(out, "Detail", *d.detail);
  return out;
}

std::string format_job(const JobInfo& j, std::int64_t now_unix_ms) {
  std::string out;
  std::string st = j.state.value_or("?");
  if (j.finish_reason && !j.finish_reason->empty()) st += " (" + *j.finish_reason + ")";
  if (j.degraded.value_or(false)) st += ", degraded";
  line(out, "Job", opt_str(j.id) + ": " + st);
  if (j.model) line(out, "Model", *j.model);
  std::string route = j.route.value_or("?");
  if (j.routes && !j.routes->empty()) route += " (routes " + join(*j.routes, " → ") + ")";
  if (j.reason && !j.reason->empty()) route += "; " + *j.reason;
  line(out, "Route", route);
  if (j.attempts) line(out, "Attempts", std::to_string(*j.attempts));
  if (j.accepted_unix_ms) {
    std::string t = "accepted " + ago(*j.accepted_unix_ms, now_unix_ms);
    if (j.finished_unix_ms && *j.finished_unix_ms > 0) {
      t += ", finished " + ago(*j.finished_unix_ms, now_unix_ms);
      if (*j.finished_unix_ms >= *j.accepted_unix_ms)
        t +=
            " (took " + format_duration_ms(static_cast<std::uint64_t>(*j.finished_unix_ms - *j.accepted_unix_ms)) + ")";
    }
    line(out, "Time", t);
  }
  if (j.state && !is_terminal_state(*j.state) && (j.queue || j.eta_ms)) {
    std::string q = j.queue.value_or("?");
    if (j.queue_position) q += " #" + std::to_string(*j.queue_position);
    if (j.eta_ms) q += ", " + eta_text(*j.eta_ms, j.eta_known, j.route);
    line(out, "Queue", q);
  }
  if (j.idempotency_key && !j.idempotency_key->empty()) line(out, "Idempotency", "key '" + *j.idempotency_key + "'");
  if (j.side_effects)
    line(out, "Side effects", *j.side_effects ? "yes (never migrated or retried after output)" : "no");
  if (j.history && !j.history->empty()) {
    bool first = true;
    const std::int64_t base = j.accepted_unix_ms.value_or(j.history->front().at_unix_ms);
    for (const auto& h : *j.history) {
      std::string when = h.at_unix_ms >= base
                             ? "+" + format_duration_ms(static_cast<std::uint64_t>(h.at_unix_ms - base))
                             : ago(h.at_unix_ms, now_unix_ms);
      std::string t = when + "  " + (h.from.empty() ? std::string("(new)") : h.from) + " → " + h.to;
      if (!h.reason.empty()) t += " (" + h.reason + ")";
      if (first)
        line(out, "History", t);
      else
        cont(out, t);
      first = false;
    }
  }
  if ((j.error_code && !j.error_code->empty()) || (j.error_message && !j.error_message->empty())) {
    std::string e = j.error_code.value_or("");
    if (j.error_message && !j.error_message->empty()) e += (e.empty() ? "" : ": ") + *j.error_message;
    if (j.retry_after_ms && *j.retry_after_ms > 0) e += " (retry after " + format_duration_ms(*j.retry_after_ms) + ")";
    line(out, "Error", e);
  }
  if (j.checkpoint) {
    const Checkpoint& c = *j.checkpoint;
    line(out, "Checkpoint",
         "seed " + opt_str(c.seed) + ", " + opt_str(c.tokens_delivered) + " tokens delivered, model " +
             opt_str(c.model) + " (resumable: tandemctl resume " + opt_str(j.id) + ")");
  }
  if (j.tokens) line(out, "Tokens", std::to_string(j.tokens->size()));
  if (j.text) {
    out += "Text:\n";
    out += *j.text;
    if (j.text->empty() || j.text->back() != '\n') out += "\n";
  }
  return out;
}

std::string format_models(const std::vector<ModelInfo>& models) {
  if (models.empty()) return "no models configured\n";
  std::vector<std::vector<std::string>> rows;
  // KIND and DIM only when the daemon has embedding models (the LLM-only table is unchanged).
  bool kinds = std::any_of(models.begin(), models.end(), [](const ModelInfo& m) { return m.kind && *m.kind != "llm"; });
  rows.push_back({"NAME", "DEFAULT", "PLACEMENT", "FALLBACK", "MAX_CONTEXT", "REVISION", "FINGERPRINT"});
  if (kinds) rows[0].insert(rows[0].begin() + 2, {"KIND", "DIM"});
  for (const auto& m : models) {
    std::string fp = m.fingerprint.value_or("");
    if (fp.size() > 12) fp = fp.substr(0, 12);
    rows.push_back({m.name.value_or("?"), m.is_default.value_or(false) ? "*" : "", m.placement.value_or(""),
                    m.fallback.value_or(""), m.max_context ? std::to_string(*m.max_context) : "",
                    m.revision.value_or(""), fp});
    if (kinds)
      rows.back().insert(rows.back().begin() + 2, {m.kind.value_or("llm"), m.dim ? std::to_string(*m.dim) : ""});
  }
  std::vector<std::size_t> w(rows[0].size(), 0);
  for (const auto& r : rows)
    for (std::size_t i = 0; i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
  std::string out;
  for (const auto& r : rows) {
    std::string l;
    for (std::size_t i = 0; i < r.size(); ++i) {
      std::string c = r[i];
      if (i + 1 < r.size()) c.resize(w[i] + 2, ' ');
      l += c;
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l + "\n";
  }
  return out;
}

std::string format_model_details(const ModelDetails& m) {
  std::string out;
  line(out, "Model", m.name.value_or("?") + "  (" + m.path + ")");
  if (m.revision) line(out, "Revision", *m.revision);
  if (m.fingerprint) line(out, "Fingerprint", *m.fingerprint);
  if (m.max_context) line(out, "Max context", std::to_string(*m.max_context));
  if (m.template_name) line(out, "Template", m.template_name->empty() ? std::string("(none)") : *m.template_name);
  if (m.fallback) line(out, "Fallback", m.fallback->empty() ? std::string("none") : *m.fallback);
  if (m.placement) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : *m.placement) parts.push_back(k + " " + format_bytes(v));
    line(out, "Placement", parts.empty() ? std::string("none") : join(parts, ", "));
  }
  if (m.replicas) {
    if (m.replicas->empty()) line(out, "Replicas", "none");
    bool first = true;
    for (const auto& r : *m.replicas) {
      std::string t = r.device.value_or("?") + ": " + r.state.value_or("?");
      if (r.reason && !r.reason->empty()) t += " (given back: " + *r.reason + ")";
      if (r.mode) t += ", mode " + *r.mode;
      if (r.layers) t += ", " + std::to_string(*r.layers) + " layers on the accelerator";
      if (r.accel_bytes && *r.accel_bytes) t += ", " + format_bytes(*r.accel_bytes) + " on the accelerator";
      if (r.host_bytes && *r.host_bytes) t += ", " + format_bytes(*r.host_bytes) + " on the host";
      if (r.error && !r.error->empty()) t += ", error: " + *r.error;
      if (r.fingerprint && m.fingerprint && *r.fingerprint != *m.fingerprint)
        t += ", FINGERPRINT DIFFERS " + *r.fingerprint;
      if (first)
        line(out, "Replicas", t);
      else
        cont(out, t);
      first = false;
    }
  }
  return out;
}

std::string format_counters(const Counters& c) {
  std::string out;
  std::size_t w = 0;
  for (const auto& [k, v] : c) w = std::max(w, k.size());
  for (const auto& [k, v] : c) {
    std::string key = k;
    key.resize(w + 2, ' ');
    out += key + std::to_string(v) + "\n";
  }
  if (out.empty()) out = "(no counters)\n";
  return out;
}

std::string format_job_update(const JobUpdate& u) {
  std::string t;
  if (u.kind == "accepted") {
    t = "accepted";
  } else if (u.kind == "routed") {
    t = "routed to " + u.route.value_or("?");
    if (u.reason && !u.reason->empty()) t += " (" + *u.reason + ")";
    if (u.model) t += ", model " + *u.model + (u.fallback_model.value_or(false) ? " (fallback)" : "");
    if (u.queue) {
      t += ", queue " + *u.queue;
      if (u.queue_position) t += " #" + std::to_string(*u.queue_position);
    }
    if (u.eta_ms) t += ", " + eta_text(*u.eta_ms, u.eta_known, u.route);
    if (u.degraded.value_or(false)) t += ", DEGRADED";
  } else if (u.kind == "eta") {
    t = "now " + (u.eta_ms ? eta_text(*u.eta_ms, u.eta_known, u.route) : std::string("ETA ?"));
    if (u.previous_eta_ms) t += " (was " + format_duration_ms(*u.previous_eta_ms) + ": the load changed)";
  } else if (u.kind == "started") {
    t = "started on " + u.route.value_or("?");
    if (u.attempt) t += " (attempt " + std::to_string(*u.attempt) + ")";
  } else if (u.kind == "migrated") {
    t = "migrated " + u.from.value_or("?") + " → " + u.to.value_or("?");
    if (u.reason && !u.reason->empty()) t += " (" + *u.reason + ")";
    if (u.tokens_delivered) t += " after " + std::to_string(*u.tokens_delivered) + " tokens";
  } else if (u.kind == "finished") {
    t = "finished: " + u.state.value_or("?");
    if (u.finish_reason && !u.finish_reason->empty()) t += " (" + *u.finish_reason + ")";
    if (u.error_code && !u.error_code->empty()) t += "; " + *u.error_code;
    if (u.error_message && !u.error_message->empty()) t += ": " + *u.error_message;
    if (u.retry_after_ms && *u.retry_after_ms > 0) t += " (retry after " + format_duration_ms(*u.retry_after_ms) + ")";
    if (u.tokens_total) t += ", " + std::to_string(*u.tokens_total) + " tokens";
  } else if (u.kind == "tokens") {
    t = "tokens";
    if (u.tokens) t += " +" + std::to_string(u.tokens->size());
    if (u.step) t += " (step " + std::to_string(*u.step) + ")";
  } else {
    t = u.kind;
  }
  return "job " + std::to_string(u.job_id) + ": " + t;
}

std::string format_run_summary(const RunSummary& s) {
  std::string t = "job " + std::to_string(s.job_id) + " " + (s.state.empty() ? std::string("?") : s.state);
  if (!s.finish_reason.empty()) t += " (" + s.finish_reason + ")";
  t += ": " + std::to_string(s.tokens) + " tokens in " + format_duration_ms(s.elapsed_ms);
  std::uint64_t gen = s.generate_ms > 0 ? s.generate_ms : s.elapsed_ms;
  if (gen > 0 && s.tokens > 0)
    t += ", " + fmt("%.1f", static_cast<double>(s.tokens) * 1000.0 / static_cast<double>(gen)) + " tok/s";
  if (!s.routes.empty()) t += ", route " + join(s.routes, " → ");
  if (!s.error_code.empty() || !s.error_message.empty()) {
    t += "; error " + s.error_code;
    if (!s.error_message.empty()) t += (s.error_code.empty() ? "" : ": ") + s.error_message;
  }
  return t;
}

std::string format_resume_hint(std::uint64_t job_id, const JobInfo& j, std::string_view ctl_prefix) {
  std::string t = "job " + std::to_string(job_id) + " failed but can be resumed from its checkpoint";
  if (j.checkpoint) {
    const Checkpoint& c = *j.checkpoint;
    t += ": seed " + opt_str(c.seed) + ", " + opt_str(c.tokens_delivered) + " tokens delivered, model " +
         opt_str(c.model);
  }
  t += "\n  resume with: " + std::string(ctl_prefix) + " resume " + std::to_string(job_id);
  return t;
}

}  // namespace tandem::client
