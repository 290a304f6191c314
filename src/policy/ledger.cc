#include "policy/ledger.h"

#include "policy/estimator.h"

namespace tandem::policy {

namespace {

// a − old + fresh without wrapping; false if the result does not fit in 64 bits.
bool replace_checked(std::uint64_t total, std::uint64_t old, std::uint64_t fresh, std::uint64_t* out) {
  return !__builtin_add_overflow(total - old, fresh, out);  // old ≤ total always holds (it was added before)
}

Status overflow(const std::string& what, std::uint64_t bytes) {
  return fail(Errc::invalid_argument, what + ": " + std::to_string(bytes) + " bytes would overflow the ledger total");
}

}  // namespace

Status ReservationLedger::reserve(JobId job, std::uint64_t bytes) {
  if (auto it = jobs_.find(job); it != jobs_.end()) {
    if (it->second.bytes == bytes) return {};
    return fail(Errc::duplicate, "job " + std::to_string(job) + " already holds a reservation of " +
                                     std::to_string(it->second.bytes) + " bytes (asked " + std::to_string(bytes) +
                                     "); use resize");
  }
  std::uint64_t total;
  if (__builtin_add_overflow(reserved_, bytes, &total)) return overflow("job " + std::to_string(job), bytes);
  jobs_.emplace(job, Reservation{bytes, false});
  reserved_ = total;
  return {};
}

Status ReservationLedger::resize(JobId job, std::uint64_t bytes) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return fail(Errc::not_found, "no reservation for job " + std::to_string(job));
  std::uint64_t reserved, materialized = materialized_;
  if (!replace_checked(reserved_, it->second.bytes, bytes, &reserved)) {
    return overflow("job " + std::to_string(job), bytes);
  }
  // materialized ≤ reserved, so it cannot overflow when reserved does not.
  if (it->second.materialized) materialized = materialized_ - it->second.bytes + bytes;
  reserved_ = reserved;
  materialized_ = materialized;
  it->second.bytes = bytes;
  return {};
}

Status ReservationLedger::materialize(JobId job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return fail(Errc::not_found, "no reservation for job " + std::to_string(job));
  if (!it->second.materialized) {
    it->second.materialized = true;
    materialized_ += it->second.bytes;  // ≤ reserved_
  }
  return {};
}

bool ReservationLedger::release(JobId job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return false;
  reserved_ -= it->second.bytes;
  if (it->second.materialized) materialized_ -= it->second.bytes;
  jobs_.erase(it);
  return true;
}

Status ReservationLedger::set_resident(const std::string& model, std::uint64_t bytes) {
  auto it = resident_.find(model);
  const std::uint64_t old = it == resident_.end() ? 0 : it->second;
  std::uint64_t total;
  if (!replace_checked(resident_total_, old, bytes, &total)) return overflow("resident weights of " + model, bytes);
  resident_total_ = total;
  if (bytes == 0) {
    if (it != resident_.end()) resident_.erase(it);
  } else if (it != resident_.end()) {
    it->second = bytes;
  } else {
    resident_.emplace(model, bytes);
  }
  return {};
}

std::uint64_t ReservationLedger::predicted_bytes() const { return sat_add(resident_total_, reserved_); }

const Reservation* ReservationLedger::find(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : &it->second;
}

}  // namespace tandem::policy
