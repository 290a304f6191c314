// The predicted view of device memory: resident model weights plus the reservations of admitted jobs.
// Every operation is idempotent and no total can go negative (unsigned, and only ever reduced by what was added) or
// wrap: an operation that would overflow a total is refused with Errc::invalid_argument and changes nothing.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "core/result.h"
#include "policy/types.h"

namespace tandem::policy {

struct Reservation {
  std::uint64_t bytes = 0;
  bool materialized = false;  // the job has allocated its memory (the device reading now includes it)

  friend bool operator==(const Reservation&, const Reservation&) = default;
};

class ReservationLedger {
 public:
  // Reserve `bytes` for `job`. Repeating the same reservation is a no-op; a different size is Errc::duplicate
  // (use resize). 0 bytes is allowed (a job that needs nothing beyond resident weights).
  Status reserve(JobId job, std::uint64_t bytes);
  // Change a job's reservation (e.g. after `reduce`); keeps the materialized flag. Errc::not_found if absent.
  Status resize(JobId job, std::uint64_t bytes);
  // Mark the reservation as allocated on the device. Idempotent; Errc::not_found if absent.
  Status materialize(JobId job);
  // Drop the reservation (finish, cancel, failover). Returns false if there was none (idempotent).
  bool release(JobId job);

  // Weights of a model resident on this device, counted once per model. 0 bytes = not resident.
  // Errc::invalid_argument (nothing changed) if the resident total would overflow.
  Status set_resident(const std::string& model, std::uint64_t bytes);
  bool is_resident(const std::string& model) const { return resident_.count(model) != 0; }

  const Reservation* find(JobId job) const;
  std::size_t jobs() const { return jobs_.size(); }
  std::uint64_t reserved_bytes() const { return reserved_; }            // all job reservations
  std::uint64_t unmaterialized_bytes() const { return reserved_ - materialized_; }
  std::uint64_t materialized_bytes() const { return materialized_; }
  std::uint64_t resident_bytes() const { return resident_total_; }      // model weights
  std::uint64_t predicted_bytes() const;                                // resident + reserved, saturating

 private:
  std::unordered_map<JobId, Reservation> jobs_;
  std::unordered_map<std::string, std::uint64_t> resident_;
  std::uint64_t reserved_ = 0;
  std::uint64_t materialized_ = 0;
  std::uint64_t resident_total_ = 0;
};

}  // namespace tandem::policy
