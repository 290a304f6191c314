#include "daemon/gpu_holds.h"

#include <unistd.h>

#include "core/sha256.h"
#include "core/text.h"

namespace tandem::daemon {

Result<std::string> GpuHolds::add(const std::string& owner, const std::string& reason, const std::string& app_id,
                                  std::int64_t now_unix_ms) {
  if (reason.size() > kMaxTextBytes || app_id.size() > kMaxTextBytes || !valid_utf8(reason) || !valid_utf8(app_id))
    return fail(Errc::invalid_argument, "reason and app_id must be at most 256 bytes of UTF-8");
  if (holds_.size() >= kMaxHolds) return fail(Errc::queue_full, "at most 64 GPU holds; retry_after_ms=1000");
  const auto raw = Sha256::hex(Sha256::of(owner + "|" + std::to_string(++counter_) + "|" +
                                          std::to_string(now_unix_ms) + "|" + std::to_string(::getpid())));
  const std::string cookie = "hold-" + raw.substr(0, 24);
  holds_[cookie] = Hold{cookie, owner, app_id, reason, now_unix_ms};
  return cookie;
}

Result<GpuHolds::Hold> GpuHolds::release(const std::string& cookie, const std::string& who, bool any_owner) {
  auto it = holds_.find(cookie);
  if (it == holds_.end()) return fail(Errc::not_found, "no GPU hold with that cookie");
  if (it->second.owner != who && !any_owner) return fail(Errc::permission_denied, "only the holder may release a GPU hold");
  Hold h = std::move(it->second);
  holds_.erase(it);
  return h;
}

std::vector<GpuHolds::Hold> GpuHolds::release_owner(const std::string& owner) {
  std::vector<Hold> gone;
  for (auto it = holds_.begin(); it != holds_.end();) {
    if (it->second.owner == owner) {
      gone.push_back(std::move(it->second));
      it = holds_.erase(it);
    } else {
      ++it;
    }
  }
  return gone;
}

std::vector<GpuHolds::Hold> GpuHolds::list() const {
  std::vector<Hold> out;
  out.reserve(holds_.size());
  for (const auto& [cookie, h] : holds_) out.push_back(h);
  return out;
}

}  // namespace tandem::daemon
