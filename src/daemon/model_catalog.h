// The served model set at run time (docs/residency.md, "Adding and removing models"): which configured models serve,
// which are being loaded because a configuration reload added them, which are being taken out (their jobs finish
// first), which are replaced (settings changed: taken out, then loaded with the new settings) and which could not be
// loaded. A concern of its own, out of Service: the service tells it the configuration's [[model]] list and what
// happened (a load ended, nothing of a model runs any more), and carries out what it answers (load this model's
// replicas on a worker, remove that one from the backend). Pure: no backend, no clock of its own, no logging.
//
// A model's presence: (absent) → adding → serving → removing → (absent); adding → failed when its load did not
// succeed (a later reload tries it again); removing → adding when it is replaced.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "daemon/config.h"

namespace tandem::daemon {

enum class ModelPresence : std::uint8_t { adding, serving, removing, failed };
std::string_view model_presence_name(ModelPresence p);

class ModelCatalog {
 public:
  struct Entry {
    std::string name;
    ModelConfig config;                      // the settings it serves (adding: is being loaded) with
    ModelPresence presence = ModelPresence::serving;
    Clock::time_point since{};               // when it entered `presence`
    std::optional<ModelConfig> replace_with; // removing / adding: load these settings once it is out (replace)
    bool dropped = false;                    // adding: no longer wanted; the load's result is thrown away
    std::string error;                       // failed: why the load did not succeed
  };

  // What a reconfiguration asks the service to do.
  struct Plan {
    std::vector<ModelConfig> load;      // load these models' replicas (adding)
    std::vector<std::string> remove;    // began removing: refuse new jobs, remove once none of theirs is left
    std::vector<std::string> retune;    // serving, only keep_alive / priority changed: applied at once
    std::vector<std::string> kept;      // were removing and are wanted again with the same settings: serving again
  };

  // What to do with a finished load's result.
  enum class LoadOutcome : std::uint8_t {
    serve,    // add it to the backend: the model serves (adding → serving)
    discard,  // throw it away: no longer wanted (entry gone), or it failed (→ failed)
    reload,   // throw it away and load `entry.config` (settings changed while it was loading)
  };

  // The models serving at start (the daemon's configuration).
  void start(const std::vector<ModelConfig>& models, Clock::time_point now);
  // A reloaded configuration's [[model]] list (validated: unique names). New names and failed ones → adding;
  // names gone → removing; a serving model whose settings changed beyond keep_alive and priority → removing with
  // replace_with (loaded with the new settings once its jobs finished); keep_alive / priority alone → retune; a
  // removing model wanted again unchanged → serving; an adding one no longer wanted → dropped when its load ends.
  Plan reconfigure(const std::vector<ModelConfig>& wanted, Clock::time_point now);
  // A load of `name` ended. ok: serve it (or discard/reload when the configuration changed meanwhile); an error:
  // failed with its message.
  LoadOutcome loaded(const std::string& name, const Status& st, Clock::time_point now);
  // The removing models none of whose jobs is left (`busy(name)` false): the service removes them from the backend
  // and calls removed() for each.
  std::vector<std::string> removable(const std::function<bool(const std::string&)>& busy) const;
  // `name` is out of the backend. Returns the settings to load when it is replaced (→ adding), else nullopt (gone).
  std::optional<ModelConfig> removed(const std::string& name, Clock::time_point now);

  // May a new job name `name`? ok for serving models and for names the catalog does not know (the backend's lookup
  // then says unknown). adding: unavailable ("being loaded"), failed: unavailable with the load error, removing:
  // not_found ("being removed") — unavailable when it is being replaced.
  Status admits(const std::string& name) const;
  const Entry* find(const std::string& name) const;
  std::vector<Entry> list() const;  // in name order
  bool changing() const;            // a model is being added or removed
  // Counters: models added at run time, removed, replaced, loads that failed.
  struct Counters {
    std::uint64_t added = 0, removed = 0, replaced = 0, add_failures = 0;
  };
  const Counters& counters() const { return counters_; }

 private:
  static bool same_load(const ModelConfig& a, const ModelConfig& b);  // equal but for keep_alive_s and priority
  std::map<std::string, Entry> entries_;
  Counters counters_;
};

}  // namespace tandem::daemon
