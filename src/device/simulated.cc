#include "device/simulated.h"

#include "core/text.h"

namespace tandem::device {

SimulatedDevice::SimulatedDevice(SimulatedConfig cfg, std::shared_ptr<const Clock> clock)
    : cfg_(std::move(cfg)), clock_(std::move(clock)) {
  std::lock_guard lock(account_mu_);
  record_locked();
}

std::uint64_t SimulatedDevice::true_free_locked() const {
  // Saturating: a foreign load near 2^64 (a test knob) must read as "full", not wrap to "empty".
  const std::uint64_t used = foreign_ > ~std::uint64_t{0} - accounted_ ? ~std::uint64_t{0} : accounted_ + foreign_;
  return used >= cfg_.capacity_bytes ? 0 : cfg_.capacity_bytes - used;
}

void SimulatedDevice::record_locked() {
  const auto now = clock_->now();
  history_.emplace_back(now, true_free_locked());
  // Keep what a lagged reading may still need: everything newer than now - lag, plus one older sample.
  while (history_.size() > 2 && history_[1].first <= now - cfg_.reading_lag) history_.pop_front();
}

Result<policy::MemorySnapshot> SimulatedDevice::memory() {
  std::lock_guard lock(account_mu_);
  if (lost_) return fail(Errc::device_lost, cfg_.name + ": device lost (driver reset); no memory reading");
  const auto now = clock_->now();
  policy::MemorySnapshot s;
  s.total_bytes = cfg_.capacity_bytes;
  s.reserved_bytes = s.allocated_bytes = accounted_;
  s.taken_at = now;
  // The newest sample at least `lag` old; the oldest one if none is that old yet.
  s.free_bytes = history_.front().second;
  for (const auto& [t, free] : history_)
    if (t <= now - cfg_.reading_lag) s.free_bytes = free;
  return s;
}

Status SimulatedDevice::admit_allocation(std::uint64_t bytes, Site site) {
  if (lost_) return fail(Errc::device_lost, cfg_.name + ": device lost (driver reset)");
  auto& at_site = fail_site_[static_cast<std::size_t>(site)];
  if (fail_next_ > 0 || at_site > 0) {
    if (fail_next_ > 0) --fail_next_;
    else --at_site;
    ++counters_.refused_injected;
    return fail(Errc::out_of_memory, cfg_.name + ": injected allocation failure at " + std::string(site_name(site)) +
                                         " (" + format_mib(bytes) + ")");
  }
  const std::uint64_t free = true_free_locked();
  if (bytes > free) {
    ++counters_.refused_capacity;
    return fail(Errc::out_of_memory, cfg_.name + ": out of memory at " + std::string(site_name(site)) + ": asked " +
                                         format_mib(bytes) + ", " + format_mib(free) + " free of " + format_mib(cfg_.capacity_bytes) +
                                         " (" + format_mib(accounted_) + " ours, " + format_mib(foreign_) + " foreign)");
  }
  ++counters_.allocations;
  return {};
}

Status SimulatedDevice::check(Site site) {
  std::lock_guard lock(account_mu_);
  if (lost_) {
    ++counters_.lost_checks;
    return fail(Errc::device_lost, cfg_.name + ": device lost (driver reset) during " + std::string(site_name(site)));
  }
  return {};
}

Status SimulatedDevice::health_probe(std::chrono::milliseconds deadline) {
  std::lock_guard lock(account_mu_);
  ++counters_.probes;
  if (lost_) {
    ++counters_.probes_failed;
    return fail(Errc::device_lost, cfg_.name + ": health probe: device lost");
  }
  if (fail_probes_ > 0) {
    --fail_probes_;
    ++counters_.probes_failed;
    return fail(Errc::timeout, cfg_.name + ": health probe did not finish within " +
                                   std::to_string(deadline.count()) + " ms (injected)");
  }
  return {};
}

bool SimulatedDevice::lost() const {
  std::lock_guard lock(account_mu_);
  return lost_;
}

void SimulatedDevice::set_foreign_bytes(std::uint64_t bytes) {
  std::lock_guard lock(account_mu_);
  foreign_ = bytes;
  record_locked();
}

std::uint64_t SimulatedDevice::foreign_bytes() const {
  std::lock_guard lock(account_mu_);
  return foreign_;
}

void SimulatedDevice::set_reading_lag(std::chrono::nanoseconds lag) {
  std::lock_guard lock(account_mu_);
  cfg_.reading_lag = lag;
}

void SimulatedDevice::fail_next_allocations(int n) {
  std::lock_guard lock(account_mu_);
  fail_next_ = n < 0 ? 0 : n;
}

void SimulatedDevice::fail_at_site(Site site, int n) {
  std::lock_guard lock(account_mu_);
  fail_site_[static_cast<std::size_t>(site)] = n < 0 ? 0 : n;
}

void SimulatedDevice::fail_probes(int n) {
  std::lock_guard lock(account_mu_);
  fail_probes_ = n < 0 ? 0 : n;
}

void SimulatedDevice::lose() {
  std::lock_guard lock(account_mu_);
  if (lost_) return;
  lost_ = true;
  ++counters_.losses;
  history_.clear();
  void_all_allocations();
}

void SimulatedDevice::recover() {
  std::lock_guard lock(account_mu_);
  lost_ = false;
  record_locked();
}

SimulatedDevice::Counters SimulatedDevice::counters() const {
  std::lock_guard lock(account_mu_);
  return counters_;
}

}  // namespace tandem::device
