#include "validate/scenario.h"

#include <toml++/toml.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

namespace tandem::validate {

namespace {

std::string where(std::string_view file, const toml::node& n) {
  const auto& src = n.source();
  std::string out(file);
  if (src.begin.line > 0) out += ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
  return out;
}

std::string describe(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string \"" + n.as_string()->get() + "\"";
    case toml::node_type::integer: return "integer " + std::to_string(n.as_integer()->get());
    case toml::node_type::floating_point: {
      std::ostringstream o;
      o << n.as_floating_point()->get();
      return "float " + o.str();
    }
    case toml::node_type::boolean: return n.as_boolean()->get() ? "boolean true" : "boolean false";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

// "6GiB", "512MiB", "100" (bytes), "1.5GiB", or an integer.
std::optional<std::uint64_t> parse_size_text(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  double v = 0;
  try {
    v = std::stod(std::string(s.substr(0, i)));
  } catch (...) {
    return std::nullopt;
  }
  std::string unit;
  for (char c : s.substr(i))
    if (c != ' ') unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> units = {
      {"", 1},        {"b", 1},          {"k", 1024.0},     {"kib", 1024.0},     {"m", 1048576.0},
      {"mib", 1048576.0}, {"g", 1073741824.0}, {"gib", 1073741824.0}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9},
      {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12}};
  auto it = units.find(unit);
  if (it == units.end()) return std::nullopt;
  const double bytes = v * it->second;
  if (!std::isfinite(bytes) || bytes < 0 || bytes > 1.8e19) return std::nullopt;
  return static_cast<std::uint64_t>(std::llround(bytes));
}

struct Bad {
  std::string msg;
};

// Reads one table's keys; every key must be read (unknown keys are errors, with their position).
class Table {
 public:
  Table(const toml::table& t, std::string path, std::string_view file) : t_(t), path_(std::move(path)), file_(file) {}

  std::string key_path(std::string_view k) const { return path_.empty() ? std::string(k) : path_ + "." + std::string(k); }
  [[noreturn]] void bad(const toml::node& n, std::string_view k, const std::string& why) const {
    throw Bad{where(file_, n) + ": " + key_path(k) + ": " + why};
  }
  const toml::node* get(std::string_view k) {
    seen_.insert(std::string(k));
    return t_.get(k);
  }

  void str(std::string_view k, std::string& out, std::initializer_list<std::string_view> allowed = {}) {
    const toml::node* n = get(k);
    if (!n) return;
    if (!n->is_string()) bad(*n, k, "expected a string, got " + describe(*n));
    std::string v = n->as_string()->get();
    if (allowed.size() > 0) {
      bool ok = false;
      std::string list;
      for (auto a : allowed) {
        ok = ok || a == v;
        list += (list.empty() ? "" : ", ") + std::string(a);
      }
      if (!ok) bad(*n, k, "\"" + v + "\" is not one of " + list);
    }
    out = std::move(v);
  }
  template <class T>
  void integer(std::string_view k, T& out, std::uint64_t lo, std::uint64_t hi) {
    const toml::node* n = get(k);
    if (!n) return;
    if (!n->is_integer()) bad(*n, k, "expected an integer, got " + describe(*n));
    const std::int64_t v = n->as_integer()->get();
    if (v < 0 || static_cast<std::uint64_t>(v) < lo || static_cast<std::uint64_t>(v) > hi)
      bad(*n, k, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
    out = static_cast<T>(v);
  }
  template <class T>
  void integer(std::string_view k, std::optional<T>& out, std::uint64_t lo, std::uint64_t hi) {
    T v{};
    if (!t_.get(k)) {
      seen_.insert(std::string(k));
      return;
    }
    integer(k, v, lo, hi);
    out = v;
  }
  void number(std::string_view k, double& out, double lo, double hi) {
    const toml::node* n = get(k);
    if (!n) return;
    double v = 0;
    if (n->is_integer())
      v = static_cast<double>(n->as_integer()->get());
    else if (n->is_floating_point())
      v = n->as_floating_point()->get();
    else
      bad(*n, k, "expected a number, got " + describe(*n));
    if (!(v >= lo && v <= hi)) {
      std::ostringstream o;
      o << "must be in [" << lo << ", " << hi << "], got " << v;
      bad(*n, k, o.str());
    }
    out = v;
  }
  void number(std::string_view k, std::optional<double>& out, double lo, double hi) {
    if (!t_.get(k)) {
      seen_.insert(std::string(k));
      return;
    }
    double v = 0;
    number(k, v, lo, hi);
    out = v;
  }
  void boolean(std::string_view k, bool& out) {
    const toml::node* n = get(k);
    if (!n) return;
    if (!n->is_boolean()) bad(*n, k, "expected a boolean, got " + describe(*n));
    out = n->as_boolean()->get();
  }
  void boolean(std::string_view k, std::optional<bool>& out) {
    if (!t_.get(k)) {
      seen_.insert(std::string(k));
      return;
    }
    bool v = false;
    boolean(k, v);
    out = v;
  }
  // A size: an integer (bytes) or a string with a unit ("512MiB").
  void size(std::string_view k, std::optional<std::uint64_t>& out) {
    const toml::node* n = get(k);
    if (!n) return;
    if (n->is_integer()) {
      if (n->as_integer()->get() < 0) bad(*n, k, "a size must be >= 0, got " + describe(*n));
      out = static_cast<std::uint64_t>(n->as_integer()->get());
      return;
    }
    if (!n->is_string()) bad(*n, k, "expected a size (integer bytes or a string like \"512MiB\"), got " + describe(*n));
    auto v = parse_size_text(n->as_string()->get());
    if (!v) bad(*n, k, "\"" + n->as_string()->get() + "\" is not a size (e.g. \"512MiB\", \"1.5GiB\", 1048576)");
    out = v;
  }
  void size(std::string_view k, std::uint64_t& out) {
    std::optional<std::uint64_t> v;
    size(k, v);
    if (v) out = *v;
  }
  void strings(std::string_view k, std::vector<std::string>& out) {
    const toml::node* n = get(k);
    if (!n) return;
    const toml::array* a = n->as_array();
    if (!a) bad(*n, k, "expected an array of strings, got " + describe(*n));
    out.clear();
    for (const auto& e : *a) {
      if (!e.is_string()) bad(e, k, "expected an array of strings, found " + describe(e));
      out.push_back(e.as_string()->get());
    }
  }
  // Array of tables.
  template <class F>
  void tables(std::string_view k, F each) {
    const toml::node* n = get(k);
    if (!n) return;
    const toml::array* a = n->as_array();
    if (!a) bad(*n, k, "expected an array of tables ([[" + key_path(k) + "]]), got " + describe(*n));
    for (std::size_t i = 0; i < a->size(); ++i) {
      const toml::node& e = (*a)[i];
      if (!e.is_table()) bad(e, k, "element " + std::to_string(i) + " is " + describe(e) + ", expected a table");
      Table sub(*e.as_table(), key_path(k) + "[" + std::to_string(i) + "]", file_);
      each(sub, i);
      sub.finish();
    }
  }
  template <class F>
  void table(std::string_view k, F fill) {
    const toml::node* n = get(k);
    if (!n) return;
    if (!n->is_table()) bad(*n, k, "expected a table ([" + key_path(k) + "]), got " + describe(*n));
    Table sub(*n->as_table(), key_path(k), file_);
    fill(sub);
    sub.finish();
  }
  void finish() const {
    for (const auto& [k, v] : t_)
      if (!seen_.count(std::string(k.str())))
        throw Bad{where(file_, v) + ": " + key_path(k.str()) + ": unknown key"};
  }
  const toml::table& raw() const { return t_; }
  [[noreturn]] void bad_table(const std::string& why) const { throw Bad{where(file_, t_) + ": " + path_ + ": " + why}; }
  const std::string& path() const { return path_; }

 private:
  const toml::table& t_;
  std::string path_;
  std::string_view file_;
  std::set<std::string> seen_;
};

constexpr std::uint64_t kDay = 86400000;

void read_workload(Table& t, Workload& w) {
  t.str("name", w.name);
  std::string kind = "generate";
  t.str("kind", kind, {"generate", "embed", "transcribe"});
  w.kind = kind == "embed" ? WorkloadKind::embed : kind == "transcribe" ? WorkloadKind::transcribe : WorkloadKind::generate;
  t.number("audio_seconds", w.audio_seconds, 0.1, 14400.0);
  t.integer("sample_rate", w.sample_rate, 4000, 48000);
  t.str("language", w.language);
  t.str("audio_input", w.audio_input, {"bytes", "memfd"});
  t.integer("texts", w.texts, 0, 4096);
  t.integer("images", w.images, 0, 4096);
  t.integer("image_size", w.image_size, 8, 1024);
  t.integer("clients", w.clients, 1, 256);
  t.str("transport", w.transport, {"dbus", "ring"});
  t.integer("requests", w.requests, 1, 100000);
  t.integer("burst", w.burst, 1, 64);
  t.str("prompt", w.prompt, {"short", "long", "text"});
  t.str("prompt_text", w.prompt_text);
  t.strings("models", w.models);
  t.integer("max_tokens", w.max_tokens, 1, 1048576);
  t.number("temperature", w.temperature, 0.0, 100.0);
  std::optional<std::uint64_t> seed;
  t.integer("seed", seed, 0, std::numeric_limits<std::int64_t>::max());
  w.seed = seed;
  t.boolean("side_effects", w.side_effects);
  t.boolean("idempotency_keys", w.idempotency_keys);
  t.boolean("resubmit", w.resubmit);
  t.boolean("resume_failed", w.resume_failed);
  t.boolean("allow_cpu", w.allow_cpu);
  t.integer("start_ms", w.start_ms, 0, kDay);
  t.integer("interval_ms", w.interval_ms, 0, kDay);
  if (w.prompt == "text" && w.prompt_text.empty())
    t.bad_table("prompt = \"text\" needs a non-empty prompt_text");
  if (w.prompt != "text" && !w.prompt_text.empty())
    t.bad_table("prompt_text is only used with prompt = \"text\"");
  if ((w.resubmit || w.resume_failed) && !w.idempotency_keys)
    t.bad_table("resubmit and resume_failed need idempotency_keys = true");
  if (w.kind == WorkloadKind::embed && w.texts + w.images == 0) t.bad_table("kind = \"embed\" needs texts or images > 0");
  if (w.kind != WorkloadKind::generate && (w.resubmit || w.resume_failed))
    t.bad_table("resubmit and resume_failed are for kind = \"generate\"");
  // Keys of one kind given to another are mistakes worth naming.
  auto only = [&](std::string_view key, WorkloadKind k) {
    const toml::node* n = t.raw().get(key);
    if (n && w.kind != k)
      t.bad(*n, key, "only used by kind = \"" + std::string(workload_kind_name(k)) + "\" (this workload is kind = \"" + kind + "\")");
  };
  for (auto key : {"audio_seconds", "sample_rate", "language", "audio_input"}) only(key, WorkloadKind::transcribe);
  for (auto key : {"texts", "images", "image_size"}) only(key, WorkloadKind::embed);
  if (w.kind == WorkloadKind::transcribe) {
    for (auto key : {"prompt", "prompt_text", "max_tokens", "temperature", "side_effects", "burst"})
      if (const toml::node* n = t.raw().get(key)) t.bad(*n, key, "not used by kind = \"transcribe\"");
    for (char c : w.language)
      if (!std::islower(static_cast<unsigned char>(c)) || w.language.size() > 8)
        t.bad(*t.raw().get("language"), "language", "\"" + w.language + "\" is not a language code (e.g. \"en\")");
  }
}

void read_fault(Table& t, Fault& f) {
  std::string kind;
  t.str("kind", kind);
  if (kind.empty())
    t.bad_table("kind: missing (one of fail_allocations, lose_device, fail_probes, cancel_queued, kill_client, "
                "kill_daemon, hold_gpu, reading_lag)");
  auto k = parse_fault_kind(kind);
  if (!k) {
    const toml::node* n = t.raw().get("kind");
    t.bad(*n, "kind", "\"" + kind + "\" is not one of fail_allocations, lose_device, fail_probes, cancel_queued, "
                      "kill_client, kill_daemon, hold_gpu, reading_lag");
  }
  f.kind = *k;
  t.integer("at_ms", f.at_ms, 0, kDay);
  t.str("when", f.when, {"at", "generating"});
  t.integer("wait_ms", f.wait_ms, 0, kDay);
  t.integer("count", f.count, 1, 1000);
  t.str("site", f.site, {"weights", "kv_pool", "prefill", "decode", "probe", "other", "any"});
  t.integer("recover_after_ms", f.recover_after_ms, 0, kDay);
  t.integer("duration_ms", f.duration_ms, 0, kDay);
  t.integer("lag_ms", f.lag_ms, 0, 60000);
  t.integer("max_tokens", f.max_tokens, 1, 1048576);
  t.str("prompt", f.prompt, {"short", "long"});
  t.boolean("restart", f.restart);
  // Keys that mean nothing for this kind are mistakes worth naming.
  auto only = [&](std::string_view key, std::initializer_list<FaultKind> kinds) {
    if (!t.raw().get(key)) return;
    for (FaultKind x : kinds)
      if (x == f.kind) return;
    t.bad(*t.raw().get(key), key, "not used by kind \"" + kind + "\"");
  };
  only("count", {FaultKind::fail_allocations, FaultKind::fail_probes, FaultKind::cancel_queued});
  only("site", {FaultKind::fail_allocations});
  only("recover_after_ms", {FaultKind::lose_device});
  only("duration_ms", {FaultKind::hold_gpu, FaultKind::reading_lag});
  only("lag_ms", {FaultKind::reading_lag});
  only("max_tokens", {FaultKind::kill_client});
  only("prompt", {FaultKind::kill_client});
  only("restart", {FaultKind::kill_daemon});
}

void read_phase(Table& t, Phase& p, std::size_t index) {
  t.str("name", p.name);
  if (p.name.empty()) p.name = "phase" + std::to_string(index + 1);
  for (char c : p.name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'))
      t.bad(*t.raw().get("name"), "name", "\"" + p.name + "\" may only use [A-Za-z0-9_-] (it names a directory)");
  t.integer("duration_ms", p.duration_ms, 0, kDay);
  t.integer("drain_timeout_ms", p.drain_timeout_ms, 0, kDay);
  t.integer("settle_ms", p.settle_ms, 0, kDay);
  t.integer("repeat", p.repeat, 1, 10000);
  t.tables("workload", [&](Table& w, std::size_t i) {
    Workload wl;
    wl.name = "w" + std::to_string(i + 1);
    read_workload(w, wl);
    p.workloads.push_back(std::move(wl));
  });
  t.tables("memory", [&](Table& m, std::size_t) {
    MemoryStep s;
    m.integer("at_ms", s.at_ms, 0, kDay);
    m.size("foreign", s.foreign_bytes);
    m.size("available", s.available_bytes);
    if (s.foreign_bytes.has_value() == s.available_bytes.has_value())
      m.bad_table("give exactly one of foreign or available");
    p.memory.push_back(s);
  });
  t.tables("fault", [&](Table& f, std::size_t) {
    Fault fault;
    read_fault(f, fault);
    p.faults.push_back(std::move(fault));
  });
  t.table("equivalence", [&](Table& e) {
    e.integer("prompts", p.equivalence.prompts, 0, 1000);
    e.integer("max_tokens", p.equivalence.max_tokens, 1, 4096);
  });
  t.table("expect", [&](Table& e) {
    Expect& x = p.expect;
    e.integer("min_completed", x.min_completed, 0, 1000000);
    e.integer("min_cpu_routed", x.min_cpu_routed, 0, 1000000);
    e.integer("min_migrated", x.min_migrated, 0, 1000000);
    e.integer("min_retried", x.min_retried, 0, 1000000);
    e.integer("min_cancelled", x.min_cancelled, 0, 1000000);
    e.integer("min_resumable_failed", x.min_resumable_failed, 0, 1000000);
    e.integer("min_rejected", x.min_rejected, 0, 1000000);
    e.boolean("breaker_cycle", x.breaker_cycle);
    e.number("min_equivalence_rate", x.min_equivalence_rate, 0.0, 1.0);
    e.boolean("degraded_seen", x.degraded_seen);
    e.integer("min_embed_ok", x.min_embed_ok, 0, 1000000);
    e.integer("min_embed_gpu", x.min_embed_gpu, 0, 1000000);
    e.integer("min_embed_cpu", x.min_embed_cpu, 0, 1000000);
    e.integer("min_transcribe_ok", x.min_transcribe_ok, 0, 1000000);
    e.integer("min_transcribe_gpu", x.min_transcribe_gpu, 0, 1000000);
    e.integer("min_transcribe_cpu", x.min_transcribe_cpu, 0, 1000000);
    e.integer("min_pressure_evictions", x.min_pressure_evictions, 0, 1000000);
    e.integer("min_gpu_restores", x.min_gpu_restores, 0, 1000000);
    e.integer("max_pressure_evictions", x.max_pressure_evictions, 0, 1000000);
    e.boolean("restored_by_end", x.restored_by_end);
    e.number("max_eta_p90_error", x.max_eta_p90_error, 0.0, 1000.0);
    e.integer("min_eta_jobs", x.min_eta_jobs, 0, 1000000);
    e.integer("min_transcribe_migrated", x.min_transcribe_migrated, 0, 1000000);
  });
  for (const auto& s : p.memory)
    if (p.duration_ms < s.at_ms) p.duration_ms = s.at_ms;
  for (const auto& f : p.faults)
    if (p.duration_ms < f.at_ms) p.duration_ms = f.at_ms;
}

}  // namespace

std::string_view workload_kind_name(WorkloadKind k) {
  switch (k) {
    case WorkloadKind::generate: return "generate";
    case WorkloadKind::embed: return "embed";
    case WorkloadKind::transcribe: return "transcribe";
  }
  return "?";
}

std::string_view fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::fail_allocations: return "fail_allocations";
    case FaultKind::lose_device: return "lose_device";
    case FaultKind::fail_probes: return "fail_probes";
    case FaultKind::cancel_queued: return "cancel_queued";
    case FaultKind::kill_client: return "kill_client";
    case FaultKind::kill_daemon: return "kill_daemon";
    case FaultKind::hold_gpu: return "hold_gpu";
    case FaultKind::reading_lag: return "reading_lag";
  }
  return "?";
}

std::optional<FaultKind> parse_fault_kind(std::string_view s) {
  for (FaultKind k : {FaultKind::fail_allocations, FaultKind::lose_device, FaultKind::fail_probes,
                      FaultKind::cancel_queued, FaultKind::kill_client, FaultKind::kill_daemon, FaultKind::hold_gpu,
                      FaultKind::reading_lag})
    if (fault_kind_name(k) == s) return k;
  return std::nullopt;
}

std::vector<std::string> Scenario::fault_kinds() const {
  std::set<std::string> kinds;
  for (const auto& p : phases)
    for (const auto& f : p.faults) {
      std::string k(fault_kind_name(f.kind));
      if (f.kind == FaultKind::fail_allocations) k += ":" + f.site;
      kinds.insert(k);
    }
  return {kinds.begin(), kinds.end()};
}

Result<Scenario> parse_scenario(std::string_view text, std::string_view file) {
  toml::table doc;
  try {
    doc = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return fail(Errc::parse_error, std::string(file) + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                                       ": " + std::string(e.description()));
  }
  Scenario s;
  s.file = std::string(file);
  try {
    Table root(doc, "", file);
    root.table("scenario", [&](Table& t) {
      t.str("name", s.name);
      t.str("description", s.description);
      t.integer("sample_interval_ms", s.sample_interval_ms, 20, 60000);
    });
    root.table("daemon", [&](Table& t) {
      DaemonSettings& d = s.daemon;
      t.str("model_preset", d.model_preset, {"test", "tiny", "134m"});
      t.str("model_dir", d.model_dir);
      t.strings("extra_models", d.extra_models);
      t.str("sim_capacity", d.sim_capacity);
      if (!parse_size_text(d.sim_capacity)) t.bad(*t.raw().get("sim_capacity"), "sim_capacity", "not a size");
      t.size("host_budget", d.host_budget);
      t.integer("gpu_concurrency", d.gpu_concurrency, 1, 64);
      t.integer("cpu_concurrency", d.cpu_concurrency, 1, 64);
      t.integer("cpu_queue_capacity", d.cpu_queue_capacity, 1, 100000);
      t.integer("breaker_cooldown_ms", d.breaker_cooldown_ms, 1, kDay);
      t.integer("recover_after_ms", d.recover_after_ms, 0, kDay);
      t.integer("evict_recover_after_ms", d.evict_recover_after_ms, 0, 3'600'000);
      t.integer("max_pressure_evictions_per_minute", d.max_pressure_evictions_per_minute, 0, 600);
      t.str("config_extra", d.config_extra);
      t.str("embedding_preset", d.embedding_preset, {"", "clip-test", "clip-small"});
      t.str("embedding_name", d.embedding_name);
      t.str("speech_preset", d.speech_preset, {"", "whisper-test"});
      t.str("speech_name", d.speech_name);
      auto model_name = [](const std::string& m) {
        bool ok = !m.empty() && m != "default" && m.size() <= 64;
        for (char c : m) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-');
        return ok;
      };
      if (!model_name(d.speech_name))
        t.bad(*t.raw().get("speech_name"), "speech_name",
              "\"" + d.speech_name + "\" is not a model name ([A-Za-z0-9_.-], 1-64 characters, not \"default\")");
      if (!d.speech_preset.empty() && !d.embedding_preset.empty() && d.speech_name == d.embedding_name)
        t.bad(*t.raw().get("speech_name"), "speech_name", "\"" + d.speech_name + "\" is also the embedding_name");
      for (const auto& m : d.extra_models) {
        bool ok = !m.empty() && m != "default" && m.size() <= 64;
        for (char c : m) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-');
        if (!ok)
          t.bad(*t.raw().get("extra_models"), "extra_models",
                "\"" + m + "\" is not a model name ([A-Za-z0-9_.-], 1-64 characters, not \"default\")");
      }
    });
    std::vector<Phase> raw;
    root.tables("phase", [&](Table& t, std::size_t i) {
      Phase p;
      read_phase(t, p, i);
      raw.push_back(std::move(p));
    });
    root.finish();
    if (raw.empty()) return fail(Errc::invalid_argument, std::string(file) + ": no [[phase]]: a scenario needs at least one");
    std::set<std::string> names;
    for (auto& p : raw) {
      if (!names.insert(p.name).second)
        return fail(Errc::invalid_argument, std::string(file) + ": phase name \"" + p.name + "\" is used twice");
      if (p.workloads.empty() && p.equivalence.prompts == 0 && p.faults.empty() && p.memory.empty())
        return fail(Errc::invalid_argument,
                    std::string(file) + ": phase \"" + p.name + "\" has no workload, equivalence, memory or fault");
      for (const auto& w : p.workloads)
        for (const auto& m : w.models) {
          if (w.kind == WorkloadKind::transcribe) {
            if (m != "default" && m != s.daemon.speech_name)
              return fail(Errc::invalid_argument, std::string(file) + ": phase \"" + p.name + "\" workload \"" + w.name +
                                                      "\": model \"" + m + "\" is neither \"default\" nor daemon.speech_name (\"" +
                                                      s.daemon.speech_name + "\")");
            continue;
          }
          bool known = m == "default" || (w.kind == WorkloadKind::embed && m == s.daemon.embedding_name);
          for (const auto& e : s.daemon.extra_models) known = known || e == m;
          if (!known)
            return fail(Errc::invalid_argument, std::string(file) + ": phase \"" + p.name + "\" workload \"" + w.name +
                                                    "\": model \"" + m + "\" is neither \"default\" nor in daemon.extra_models");
        }
      if (p.repeat == 1) {
        s.phases.push_back(std::move(p));
        continue;
      }
      for (std::uint32_t r = 1; r <= p.repeat; ++r) {
        Phase c = p;
        char suffix[16];
        std::snprintf(suffix, sizeof suffix, "-%02u", r);
        c.name = p.name + suffix;
        c.repeat = 1;
        s.phases.push_back(std::move(c));
      }
    }
    if (s.name.empty()) s.name = std::string(file);
  } catch (const Bad& b) {
    return fail(Errc::invalid_argument, b.msg);
  }
  return s;
}

Result<Scenario> load_scenario(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(Errc::io_error, path + ": cannot read: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_scenario(ss.str(), path);
}

}  // namespace tandem::validate
