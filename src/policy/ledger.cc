#include "policy/ledger.h"

namespace tandem::policy {

Status ReservationLedger::reserve(JobId job, std::uint64_t bytes) {
  auto [it, inserted] = jobs_.try_emplace(job, Reservation{bytes, false});
  if (!inserted) {
    if (it->second.bytes == bytes) return {};
    return fail(Errc::duplicate, "job " + std::to_string(job) + " already holds a reservation of " +
                                     std::to_string(it->second.bytes) + " bytes (asked " + std::to_string(bytes) +
                                     "); use resize");
  }
  reserved_ += bytes;
  return {};
}

Status ReservationLedger::resize(JobId job, std::uint64_t bytes) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return fail(Errc::not_found, "no reservation for job " + std::to_string(job));
  reserved_ = reserved_ - it->second.bytes + bytes;
  if (it->second.materialized) materialized_ = materialized_ - it->second.bytes + bytes;
  it->second.bytes = bytes;
  return {};
}

Status ReservationLedger::materialize(JobId job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return fail(Errc::not_found, "no reservation for job " + std::to_string(job));
  if (!it->second.materialized) {
    it->second.materialized = true;
    materialized_ += it->second.bytes;
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

void ReservationLedger::set_resident(const std::string& model, std::uint64_t bytes) {
  auto it = resident_.find(model);
  if (it != resident_.end()) {
    resident_total_ -= it->second;
    if (bytes == 0) {
      resident_.erase(it);
      return;
    }
    it->second = bytes;
  } else {
    if (bytes == 0) return;
    resident_.emplace(model, bytes);
  }
  resident_total_ += bytes;
}

const Reservation* ReservationLedger::find(JobId job) const {
  auto it = jobs_.find(job);
  return it == jobs_.end() ? nullptr : &it->second;
}

}  // namespace tandem::policy
