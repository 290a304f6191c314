#include "daemon/model_catalog.h"

#include <set>

namespace tandem::daemon {

std::string_view model_presence_name(ModelPresence p) {
  switch (p) {
    case ModelPresence::adding: return "adding";
    case ModelPresence::serving: return "serving";
    case ModelPresence::removing: return "removing";
    case ModelPresence::failed: return "failed";
  }
  return "failed";
}

bool ModelCatalog::same_load(const ModelConfig& a, const ModelConfig& b) {
  ModelConfig x = a;
  x.keep_alive_s = b.keep_alive_s;
  x.priority = b.priority;
  return x == b;
}

void ModelCatalog::start(const std::vector<ModelConfig>& models, Clock::time_point now) {
  entries_.clear();
  for (const auto& m : models)
    entries_[m.name] = Entry{m.name, m, ModelPresence::serving, now, std::nullopt, false, {}};
}

ModelCatalog::Plan ModelCatalog::reconfigure(const std::vector<ModelConfig>& wanted, Clock::time_point now) {
  Plan plan;
  std::set<std::string> names;
  for (const auto& w : wanted) {
    names.insert(w.name);
    auto it = entries_.find(w.name);
    if (it == entries_.end()) {
      entries_[w.name] = Entry{w.name, w, ModelPresence::adding, now, std::nullopt, false, {}};
      plan.load.push_back(w);
      continue;
    }
    Entry& e = it->second;
    switch (e.presence) {
      case ModelPresence::failed:
        e.config = w;
        e.presence = ModelPresence::adding;
        e.since = now;
        e.error.clear();
        plan.load.push_back(w);
        break;
      case ModelPresence::adding:
        e.dropped = false;
        if (e.config == w) e.replace_with.reset();  // the load under way is the wanted one
        else e.replace_with = w;
        break;
      case ModelPresence::serving:
        if (e.config == w) break;
        if (same_load(e.config, w)) {
          e.config = w;
          plan.retune.push_back(w.name);
        } else {
          e.presence = ModelPresence::removing;
          e.since = now;
          e.replace_with = w;
          plan.remove.push_back(w.name);
        }
        break;
      case ModelPresence::removing:
        if (e.config == w) {
          e.presence = ModelPresence::serving;
          e.since = now;
          e.replace_with.reset();
          plan.kept.push_back(w.name);
        } else if (same_load(e.config, w)) {
          e.presence = ModelPresence::serving;
          e.since = now;
          e.replace_with.reset();
          e.config = w;
          plan.kept.push_back(w.name);
          plan.retune.push_back(w.name);
        } else {
          e.replace_with = w;
        }
        break;
    }
  }
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    if (names.count(e.name)) {
      ++it;
      continue;
    }
    switch (e.presence) {
      case ModelPresence::serving:
        e.presence = ModelPresence::removing;
        e.since = now;
        e.replace_with.reset();
        plan.remove.push_back(e.name);
        break;
      case ModelPresence::removing: e.replace_with.reset(); break;
      case ModelPresence::adding:
        e.dropped = true;
        e.replace_with.reset();
        break;
      case ModelPresence::failed: it = entries_.erase(it); continue;
    }
    ++it;
  }
  return plan;
}

ModelCatalog::LoadOutcome ModelCatalog::loaded(const std::string& name, const Status& st, Clock::time_point now) {
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.presence != ModelPresence::adding) return LoadOutcome::discard;
  Entry& e = it->second;
  if (e.dropped) {
    entries_.erase(it);
    return LoadOutcome::discard;
  }
  if (e.replace_with) {
    e.config = *e.replace_with;
    e.replace_with.reset();
    e.since = now;
    return LoadOutcome::reload;
  }
  e.since = now;
  if (!st) {
    e.presence = ModelPresence::failed;
    e.error = st.error().message;
    ++counters_.add_failures;
    return LoadOutcome::discard;
  }
  e.presence = ModelPresence::serving;
  ++counters_.added;
  return LoadOutcome::serve;
}

std::vector<std::string> ModelCatalog::removable(const std::function<bool(const std::string&)>& busy) const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_)
    if (e.presence == ModelPresence::removing && !busy(name)) out.push_back(name);
  return out;
}

std::optional<ModelConfig> ModelCatalog::removed(const std::string& name, Clock::time_point now) {
  auto it = entries_.find(name);
  if (it == entries_.end() || it->second.presence != ModelPresence::removing) return std::nullopt;
  Entry& e = it->second;
  if (!e.replace_with) {
    entries_.erase(it);
    ++counters_.removed;
    return std::nullopt;
  }
  e.config = *e.replace_with;
  e.replace_with.reset();
  e.presence = ModelPresence::adding;
  e.since = now;
  ++counters_.replaced;
  return e.config;
}

Status ModelCatalog::admits(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return {};
  const Entry& e = it->second;
  switch (e.presence) {
    case ModelPresence::serving: return {};
    case ModelPresence::adding:
      return fail(Errc::unavailable,
                  "model " + name + " is being loaded (added by a configuration reload); retry_after_ms=2000");
    case ModelPresence::failed:
      return fail(Errc::unavailable, "model " + name + " could not be loaded: " + e.error +
                                         " (fix it and reload the configuration)");
    case ModelPresence::removing:
      if (e.replace_with)
        return fail(Errc::unavailable, "model " + name + " is being replaced (its settings changed; its jobs finish "
                                                         "first); retry_after_ms=2000");
      return fail(Errc::not_found,
                  "model " + name + " is being removed (no longer in the configuration; its jobs finish)");
  }
  return {};
}

const ModelCatalog::Entry* ModelCatalog::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<ModelCatalog::Entry> ModelCatalog::list() const {
  std::vector<Entry> out;
  for (const auto& [n, e] : entries_) out.push_back(e);
  return out;
}

bool ModelCatalog::changing() const {
  for (const auto& [n, e] : entries_)
    if (e.presence == ModelPresence::adding || e.presence == ModelPresence::removing) return true;
  return false;
}

}  // namespace tandem::daemon
