#include "device/device.h"

#include <fstream>
#include <sstream>

#include "policy/procfs.h"

namespace tandem::device {

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::cpu: return "cpu";
    case Kind::simulated: return "simulated";
    case Kind::cuda: return "cuda";
  }
  return "cpu";
}

std::string_view site_name(Site s) {
  switch (s) {
    case Site::weights: return "weights";
    case Site::kv_pool: return "kv_pool";
    case Site::prefill: return "prefill";
    case Site::decode: return "decode";
    case Site::probe: return "probe";
    case Site::other: return "other";
  }
  return "other";
}

Result<Site> parse_site(std::string_view s) {
  for (auto x : {Site::weights, Site::kv_pool, Site::prefill, Site::decode, Site::probe, Site::other})
    if (site_name(x) == s) return x;
  return fail(Errc::invalid_argument,
              "unknown allocation site '" + std::string(s) + "' (weights, kv_pool, prefill, decode, probe, other)");
}

Allocation::Allocation(Allocation&& o) noexcept
    : device_(std::move(o.device_)), bytes_(o.bytes_), site_(o.site_), epoch_(o.epoch_) {
  o.bytes_ = 0;
}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = std::move(o.device_);
    bytes_ = o.bytes_;
    site_ = o.site_;
    epoch_ = o.epoch_;
    o.bytes_ = 0;
  }
  return *this;
}

Allocation::~Allocation() { reset(); }

bool Allocation::valid() const { return device_ && device_->epoch() == epoch_; }

void Allocation::reset() {
  if (device_) device_->release(bytes_, epoch_);
  device_.reset();
  bytes_ = 0;
}

Result<Allocation> Device::allocate(std::uint64_t bytes, Site site) {
  std::uint64_t epoch = 0;
  {
    std::lock_guard lock(account_mu_);
    TANDEM_TRY(admit_allocation(bytes, site));
    accounted_ += bytes;
    epoch = epoch_;
    accounting_changed_locked();
  }
  return Allocation(shared_from_this(), bytes, site, epoch);
}

std::uint64_t Device::accounted_bytes() const {
  std::lock_guard lock(account_mu_);
  return accounted_;
}

std::uint64_t Device::epoch() const {
  std::lock_guard lock(account_mu_);
  return epoch_;
}

void Device::void_all_allocations() {
  accounted_ = 0;
  ++epoch_;
  accounting_changed_locked();
}

void Device::release(std::uint64_t bytes, std::uint64_t epoch) {
  std::lock_guard lock(account_mu_);
  if (epoch != epoch_) return;  // freed wholesale by a device loss
  accounted_ = bytes > accounted_ ? 0 : accounted_ - bytes;
  accounting_changed_locked();
}

Result<policy::MemorySnapshot> CpuDevice::memory() {
  std::ifstream f("/proc/meminfo");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  policy::MemorySnapshot s;
  s.taken_at = SteadyClock().now();
  auto avail = policy::parse_meminfo_available(text);
  if (!avail) return fail(std::move(avail).error());
  const auto pos = text.find("MemTotal:");
  if (pos == std::string::npos) return fail(Errc::parse_error, "/proc/meminfo: no MemTotal line");
  s.total_bytes = std::stoull(text.substr(pos + 9)) * 1024;
  s.free_bytes = *avail;
  std::lock_guard lock(account_mu_);
  s.reserved_bytes = s.allocated_bytes = accounted_;
  return s;
}

}  // namespace tandem::device
