#include "generation/stop.h"

#include <algorithm>

namespace tandem::gen {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopMatcher::Out StopMatcher::push(std::string_view text) {
  Out out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  held_.append(text);
  // Earliest complete match wins; among matches at the same position, the longest.
  std::size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const std::size_t pos = held_.find(s);
    if (pos != std::string::npos && (pos < best || (pos == best && s.size() > matched_.size()))) {
      best = pos;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    out.stopped = true;
    out.emit = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix of held_ that is a proper prefix of some stop string.
  std::size_t hold = 0;
  for (const auto& s : stops_) {
    const std::size_t max_k = std::min(s.size() - 1, held_.size());
    for (std::size_t k = max_k; k > hold; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  out.emit = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string rest;
  rest.swap(held_);
  return stopped_ ? std::string{} : rest;
}

}  // namespace tandem::gen
