// A model replica kept in one of three modes, chosen by the policy core's ReplicaModePolicy from the recovery-time
// budget and the times measured here:
//   warm       loaded, every weight page faulted in, one warm-up forward done: serves at once;
//   mmap       loaded (mapped), pages come in on demand: the first request pays the page-in;
//   on_demand  not loaded; the first get() loads it (measured at creation, then dropped).
// All replicas built from the same files and settings have the same fingerprint (it is computed at creation, so
// even an on-demand replica can be compared before it is loaded).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "engine/model.h"
#include "policy/replica_mode.h"

namespace tandem::engine {

struct ReplicaTimes {  // milliseconds; negative = not measured yet
  double load_ms = -1;     // Model::load without prefault (validate + map + place)
  double page_in_ms = -1;  // touching every page of the weight mapping
  double warm_up_ms = -1;  // the first forward of a short prompt after load
};

class Replica {
 public:
  static Result<std::unique_ptr<Replica>> create(std::string dir, LoadOptions opts, policy::ReplicaMode mode);

  // The loaded model; loads it first in on_demand mode (and records the time). Errors: those of Model::load.
  Result<std::shared_ptr<Model>> get();
  // Switches mode: warm loads/prefaults/warms now, mmap loads without prefault, on_demand drops this replica's
  // reference (a generation still running keeps its own until it ends).
  Status set_mode(policy::ReplicaMode mode);

  policy::ReplicaMode mode() const;
  bool loaded() const;
  ReplicaTimes times() const;
  const gen::Fingerprint& fingerprint() const { return fingerprint_; }
  const std::string& dir() const { return dir_; }
  // The measurements the policy core decides on.
  policy::ReplicaMeasurements measurements(std::uint64_t host_budget_bytes) const;

 private:
  Replica(std::string dir, LoadOptions opts) : dir_(std::move(dir)), opts_(std::move(opts)) {}
  Status load_locked(bool prefault);  // needs mu_
  Status warm_up_locked();

  std::string dir_;
  LoadOptions opts_;
  mutable std::mutex mu_;
  policy::ReplicaMode mode_ = policy::ReplicaMode::on_demand;
  std::shared_ptr<Model> model_;
  bool prefaulted_ = false;
  ReplicaTimes times_;
  gen::Fingerprint fingerprint_;
  std::uint64_t weight_bytes_ = 0;
};

}  // namespace tandem::engine
