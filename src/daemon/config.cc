// tandemd's configuration: TOML → DaemonConfig, key-by-key drop-in merging, validation and rendering.
//
// One table per root type (`daemon_schema()`, `model_schema()`) lists every key with its type, its range and the
// field it sets. Parsing, DaemonConfig::validate(), render_config() and docs/config.md all follow that table, so a
// key cannot be parsed but not rendered, or rendered but not validated. Policy keys only get a representability
// range here (an integer that fits, a duration of at most 365 d); their real ranges live in
// policy::PolicyConfig::validate(), whose messages are rewritten to name the TOML key (`kPolicyPaths`).
// The tables are in config_schema.cc, one value's conversion and checks in config_values.cc (config_schema.h).
#include "daemon/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>

#include "daemon/config_schema.h"

namespace tandem::daemon {

namespace fs = std::filesystem;

using namespace config_detail;

namespace {

// ---- policy messages → TOML keys --------------------------------------------------------------------------------

struct PathMap {
  std::string_view policy;
  std::string_view toml;
};
// Where policy::PolicyConfig::validate()'s dotted path differs from the TOML key (unit suffixes, [margin], [host]).
constexpr PathMap kPolicyPaths[] = {
    {"headroom.margin.bytes", "margin.bytes"},
    {"headroom.margin.fraction", "margin.fraction"},
    {"headroom.fresh_for", "headroom.fresh_for_ms"},
    {"headroom.max_age", "headroom.max_age_ms"},
    {"ladder.max_delay", "ladder.max_delay_ms"},
    {"ladder.default_retry_after", "ladder.default_retry_after_ms"},
    {"ladder.max_retry_after", "ladder.max_retry_after_ms"},
    {"breaker.window", "breaker.window_ms"},
    {"breaker.cooldown", "breaker.cooldown_ms"},
    {"breaker.max_cooldown", "breaker.max_cooldown_ms"},
    {"host_guard.budget_bytes", "host.budget"},
    {"host_guard.mem_available_reserve", "host.mem_available_reserve"},
    {"service.recover_after", "service.recover_after_ms"},
    {"replica.recovery_budget", "replica.recovery_budget_ms"},
    {"idempotency.retention", "idempotency.retention_s"},
};

bool is_ident_char(char c) { return is_name_char(c) && c != '-'; }

std::string_view section_of(std::string_view path) {
  const auto dot = path.rfind('.');
  return dot == std::string_view::npos ? std::string_view() : path.substr(0, dot);
}

std::string_view last_of(std::string_view path) {
  const auto dot = path.rfind('.');
  return dot == std::string_view::npos ? path : path.substr(dot + 1);
}

// Positions where `token` occurs as a whole dotted identifier.
std::vector<std::size_t> token_positions(std::string_view text, std::string_view token) {
  std::vector<std::size_t> out;
  for (std::size_t pos = text.find(token); pos != std::string_view::npos; pos = text.find(token, pos + 1)) {
    const bool before_ok = pos == 0 || (!is_ident_char(text[pos - 1]) && text[pos - 1] != '.');
    const std::size_t end = pos + token.size();
    const bool after_ok = end == text.size() || !is_ident_char(text[end]);
    if (before_ok && after_ok) out.push_back(pos);
  }
  return out;
}

std::string replace_token(std::string text, std::string_view from, std::string_view to) {
  const auto positions = token_positions(text, from);
  for (auto it = positions.rbegin(); it != positions.rend(); ++it) text.replace(*it, from.size(), to);
  return text;
}

// "headroom.max_age must be >= headroom.fresh_for (500ms), got 100ms"
//   → "headroom.max_age_ms: must be >= headroom.fresh_for_ms (500ms), got 100ms"
std::string map_policy_message(const std::string& msg) {
  const auto cut = msg.find(" must be ");
  if (cut == std::string::npos) return msg;
  const std::string path = msg.substr(0, cut);
  std::string rest = msg.substr(cut + 1);
  std::string key = path;
  for (const auto& m : kPolicyPaths) {
    if (m.policy == path) key = std::string(m.toml);
  }
  for (const auto& m : kPolicyPaths) {
    rest = replace_token(std::move(rest), m.policy, m.toml);
    if (section_of(m.policy) == section_of(path)) {
      rest = replace_token(std::move(rest), last_of(m.policy), last_of(m.toml));
    }
  }
  return key + ": " + rest;
}

// ---- models -----------------------------------------------------------------------------------------------------

std::string model_at(const ModelConfig& m, std::size_t index) {
  if (model_name_rule(m.name).empty()) return "model[\"" + m.name + "\"]";
  return "model[" + std::to_string(index) + "]";
}

std::string model_names(const std::vector<ModelConfig>& models, std::string_view except = {}) {
  std::vector<std::string_view> names;
  for (const auto& m : models) {
    if (m.name != except) names.push_back(m.name);
  }
  return names.empty() ? "none" : quoted_list(names);
}

// ---- loading ----------------------------------------------------------------------------------------------------

class Loader {
 public:
  explicit Loader(DaemonConfig& cfg) : cfg_(cfg) {}

  Status apply_document(std::string_view text, const std::string& file, fs::path base) {
    cfg_.sources.push_back(file);
    index_ = cfg_.sources.size() - 1;
    file_ = file;
    base_ = std::move(base);
    toml::table doc;
    try {
      doc = toml::parse(text, std::string_view(file));
    } catch (const toml::parse_error& e) {
      const auto& at = e.source().begin;
      return fail(Errc::parse_error, file + ":" + std::to_string(at.line) + ":" + std::to_string(at.column) + ": " +
                                         std::string(e.description()));
    }
    return apply_table(doc, daemon_schema(), "", "", cfg_);
  }

  // Cross-field validation of the merged result; the error names the file that set the offending key.
  Status finish() {
    Status s = cfg_.validate();
    if (s.ok()) return {};
    const std::string& msg = s.error().message;
    return fail(s.error().code, attribute(msg) + ": " + msg);
  }

 private:
  Failure bad(const std::string& key, const std::string& what) const {
    return fail(Errc::invalid_argument, file_ + ": " + key + ": " + what);
  }

  template <class Root>
  Status apply_table(const toml::table& t, const std::vector<Section<Root>>& schema, std::string_view sec,
                     const std::string& display, Root& root) {
    const Section<Root>* here = find_section(schema, sec);
    // Document order, so the first error reported is the first one in the file.
    std::vector<std::pair<std::string_view, const toml::node*>> items;
    for (auto&& [k, v] : t) items.emplace_back(k.str(), &v);
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
      const auto& pa = a.second->source().begin;
      const auto& pb = b.second->source().begin;
      return std::tie(pa.line, pa.column) < std::tie(pb.line, pb.column);
    });
    for (const auto& [key, node] : items) {
      const std::string path = join(display, key);
      if (here) {
        const auto f = std::find_if(here->fields.begin(), here->fields.end(),
                                    [&](const Field<Root>& x) { return x.key == key; });
        if (f != here->fields.end()) {
          TANDEM_TRY(apply_field(*f, *node, path, root));
          continue;
        }
      }
      const std::string child = join(sec, key);
      if (find_section(schema, child)) {
        if constexpr (std::is_same_v<Root, DaemonConfig>) {
          if (child == "model") {
            TANDEM_TRY(apply_models(*node));
            continue;
          }
        }
        const toml::table* sub = node->as_table();
        if (!sub) return bad(path, "must be a table, got " + describe(*node));
        TANDEM_TRY(apply_table(*sub, schema, child, path, root));
        continue;
      }
      return fail(Errc::invalid_argument,
                  file_ + ": unknown key '" + path + "' (allowed: " + allowed_keys(schema, sec) + ")");
    }
    return {};
  }

  template <class Root>
  Status apply_field(const Field<Root>& f, const toml::node& n, const std::string& path, Root& root) {
    Value v;
    if (auto b = convert(n, f.spec, v)) return bad(path + b->where, b->what);
    if (auto b = check(f.spec, v)) return bad(path + b->where, b->what);
    if (f.spec.path && !base_.empty()) {
      auto& s = std::get<std::string>(v);
      const fs::path p(s);
      if (p.is_relative()) s = (base_ / p).lexically_normal().string();
    }
    f.set(root, std::move(v));
    origins_[path] = index_;
    return {};
  }

  // [[model]]: every table needs a name; a name seen in an earlier file merges into that model, a new one appends.
  Status apply_models(const toml::node& n) {
    const toml::array* arr = n.as_array();
    if (!arr || !arr->is_array_of_tables()) {
      return bad("model", "must be an array of tables ([[model]] with name and dir), got " + describe(n));
    }
    const auto& name_field = model_schema().front().fields.front();
    std::vector<std::string> seen;
    for (std::size_t i = 0; i < arr->size(); ++i) {
      const toml::table& t = *(*arr)[i].as_table();
      const std::string at = "model[" + std::to_string(i) + "]";
      const toml::node* name_node = t.get("name");
      if (!name_node) return bad(at + ".name", "must be set (every [[model]] needs a name), got nothing");
      Value v;
      if (auto b = convert(*name_node, name_field.spec, v)) return bad(at + ".name", b->what);
      if (auto b = check(name_field.spec, v)) return bad(at + ".name", b->what);
      const std::string name = std::get<std::string>(v);
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
        return bad(at + ".name", "must be unique within a file, got " + quote(name) + " twice");
      }
      seen.push_back(name);
      auto it = std::find_if(cfg_.models.begin(), cfg_.models.end(),
                             [&](const ModelConfig& m) { return m.name == name; });
      if (it == cfg_.models.end()) {
        cfg_.models.emplace_back();
        cfg_.models.back().name = name;
        it = std::prev(cfg_.models.end());
      }
      TANDEM_TRY(apply_table(t, model_schema(), "", "model[\"" + name + "\"]", *it));
    }
    return {};
  }

  // The file to blame for a validation message "<key>: ...": the one that set the key, else the latest file that
  // set a key the rule mentions, else the one that last named the model, else the main file.
  std::string attribute(const std::string& msg) const {
    const std::string key = msg.substr(0, msg.find(": "));
    if (auto it = origins_.find(key); it != origins_.end()) return cfg_.sources[it->second];
    std::optional<std::size_t> best;
    for (const auto& [k, index] : origins_) {
      const bool mentioned = !token_positions(msg, k).empty() ||
                             (section_of(k) == section_of(key) && !token_positions(msg, last_of(k)).empty());
      if (mentioned && (!best || index > *best)) best = index;
    }
    if (best) return cfg_.sources[*best];
    if (key.rfind("model[\"", 0) == 0) {
      const auto close = key.find("\"]");
      if (auto it = origins_.find(key.substr(0, close + 2) + ".name"); it != origins_.end()) {
        return cfg_.sources[it->second];
      }
    }
    return cfg_.sources.empty() ? std::string("<config>") : cfg_.sources.front();
  }

  DaemonConfig& cfg_;
  std::map<std::string, std::size_t> origins_;  // rendered key → index in cfg_.sources of the file that set it last
  std::size_t index_ = 0;
  std::string file_;
  fs::path base_;  // relative paths resolve against this; empty = leave them relative
};

Result<std::string> read_text(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return fail(Errc::not_found, path + ": no such file");
  if (ec) return fail(Errc::io_error, path + ": " + ec.message());
  if (fs::is_directory(st)) return fail(Errc::io_error, path + ": is a directory, expected a TOML file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(Errc::io_error, path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return fail(Errc::io_error, path + ": read failed");
  return ss.str();
}

fs::path directory_of(const std::string& file) {
  std::error_code ec;
  fs::path abs = fs::absolute(file, ec);
  if (ec) abs = fs::path(file);
  return abs.lexically_normal().parent_path();
}

}  // namespace

// ---- public -----------------------------------------------------------------------------------------------------

std::string_view bus_kind_name(BusKind k) noexcept {
  switch (k) {
    case BusKind::system: return "system";
    case BusKind::session: return "session";
    case BusKind::address: return "address";
  }
  return "system";
}

std::string_view accel_kind_name(AccelKind k) noexcept {
  switch (k) {
    case AccelKind::none: return "none";
    case AccelKind::simulated: return "simulated";
    case AccelKind::cuda: return "cuda";
    case AccelKind::auto_detect: return "auto";
  }
  return "auto";
}

const ModelConfig* DaemonConfig::find_model(std::string_view name) const {
  for (const auto& m : models) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

Status DaemonConfig::validate() const {
  const auto bad = [](const std::string& key, const std::string& what) {
    return fail(Errc::invalid_argument, key + ": " + what);
  };
  // Every key's own range, as the loader checks it (for configurations built in code).
  for (const auto& sec : daemon_schema()) {
    for (const auto& f : sec.fields) {
      if (auto b = check(f.spec, f.get(*this))) return bad(join(sec.path, f.key) + b->where, b->what);
    }
  }
  if (models.empty()) return bad("model", "must be at least one [[model]] table with name and dir, got none");
  for (std::size_t i = 0; i < models.size(); ++i) {
    const ModelConfig& m = models[i];
    const std::string at = model_at(m, i);
    for (const auto& sec : model_schema()) {
      for (const auto& f : sec.fields) {
        if (auto b = check(f.spec, f.get(m))) return bad(join(at, join(sec.path, f.key)) + b->where, b->what);
      }
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (models[j].name == m.name) return bad(at + ".name", "must be unique, got " + quote(m.name) + " twice");
    }
  }
  for (std::size_t i = 0; i < models.size(); ++i) {
    const ModelConfig& m = models[i];
    if (!m.fallback.empty() && (m.fallback == m.name || !find_model(m.fallback))) {
      return bad(model_at(m, i) + ".fallback", "must be \"\" or the name of another [[model]] (" +
                                                   model_names(models, m.name) + "), got " + quote(m.fallback));
    }
  }
  if (rings.default_sq_entries > rings.max_sq_entries)
    return bad("rings.default_sq_entries", "must be at most rings.max_sq_entries (" +
                                               std::to_string(rings.max_sq_entries) + ")");
  if (rings.default_cq_entries > rings.max_cq_entries)
    return bad("rings.default_cq_entries", "must be at most rings.max_cq_entries (" +
                                               std::to_string(rings.max_cq_entries) + ")");
  if (rings.default_data_bytes > rings.max_data_bytes)
    return bad("rings.default_data_bytes", "must be at most rings.max_data_bytes (" +
                                               size_text(rings.max_data_bytes) + ")");
  if (!embedding.default_model.empty() && !find_model(embedding.default_model)) {
    return bad("embedding.default_model", "must be \"\" (the first embedding model) or the name of a [[model]] (" +
                                              model_names(models) + "), got " + quote(embedding.default_model));
  }
  if (!speech.default_model.empty() && !find_model(speech.default_model)) {
    return bad("speech.default_model", "must be \"\" (the first speech model) or the name of a [[model]] (" +
                                              model_names(models) + "), got " + quote(speech.default_model));
  }
  if (!default_model.empty() && !find_model(default_model)) {
    return bad("default_model", "must be \"\" (the first [[model]]) or the name of a [[model]] (" +
                                    model_names(models) + "), got " + quote(default_model));
  }
  if (bus.kind == BusKind::address && bus.address.empty()) {
    return bad("bus.address", "must be set when bus.kind = \"address\", got \"\"");
  }
  if (bus.kind != BusKind::address && !bus.address.empty()) {
    return bad("bus.address", "must be \"\" unless bus.kind = \"address\" (it is " + quote(bus_kind_name(bus.kind)) +
                                  "), got " + quote(bus.address));
  }
  if (Status p = policy.validate(); !p.ok()) return fail(p.error().code, map_policy_message(p.error().message));
  return {};
}

Result<std::uint64_t> parse_size(std::string_view text) {
  std::string why;
  if (auto v = parse_size_impl(text, why)) return *v;
  return fail(Errc::invalid_argument, "size " + quote(text) + ": " + why);
}

Result<DaemonConfig> parse_config(std::string_view toml_text, const std::string& origin) {
  DaemonConfig cfg;
  Loader loader(cfg);
  TANDEM_TRY(loader.apply_document(toml_text, origin, fs::path(origin).parent_path()));
  TANDEM_TRY(loader.finish());
  return cfg;
}

Result<DaemonConfig> load_config(const std::string& path, const std::string& dropin_dir) {
  DaemonConfig cfg;
  Loader loader(cfg);
  auto text = read_text(path);
  if (!text.ok()) return fail(std::move(text).error());
  TANDEM_TRY(loader.apply_document(*text, path, directory_of(path)));

  const fs::path dir = dropin_dir.empty() ? fs::path(path).parent_path() / "tandemd.d" : fs::path(dropin_dir);
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (st.type() != fs::file_type::not_found) {
    if (ec) return fail(Errc::io_error, dir.string() + ": " + ec.message());
    if (!fs::is_directory(st)) return fail(Errc::io_error, dir.string() + ": not a directory (drop-in directory)");
    std::vector<std::string> names;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      // Like the shell glob *.toml: hidden files (editor and package-manager leftovers) are not read.
      if (name.size() <= 5 || name[0] == '.' || name.compare(name.size() - 5, 5, ".toml") != 0) continue;
      std::error_code fec;
      if (!fs::is_regular_file(it->path(), fec)) continue;  // follows symlinks
      names.push_back(name);
    }
    if (ec) return fail(Errc::io_error, dir.string() + ": " + ec.message());
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      const std::string file = (dir / name).string();
      auto dropin = read_text(file);
      if (!dropin.ok()) return fail(std::move(dropin).error());
      TANDEM_TRY(loader.apply_document(*dropin, file, directory_of(file)));
    }
  }
  TANDEM_TRY(loader.finish());
  return cfg;
}

std::string render_config(const DaemonConfig& cfg) {
  std::string out = "# tandemd configuration as loaded (render_config); keys: docs/config.md\n";
  for (const auto& s : cfg.sources) out += "# source: " + s + "\n";
  const auto fields = [&out](const auto& sec, const auto& root) {
    for (const auto& f : sec.fields) out += std::string(f.key) + " = " + render_value(f.get(root)) + "\n";
  };
  for (const auto& sec : daemon_schema()) {
    if (sec.path == "model") {
      for (const auto& m : cfg.models) {
        for (const auto& msec : model_schema()) {
          out += msec.path.empty() ? "\n[[model]]\n" : "[model." + std::string(msec.path) + "]\n";
          fields(msec, m);
        }
      }
      continue;
    }
    if (!sec.path.empty()) out += "\n[" + std::string(sec.path) + "]\n";
    fields(sec, cfg);
  }
  return out;
}

}  // namespace tandem::daemon
