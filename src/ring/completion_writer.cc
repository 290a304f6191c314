#include "ring/completion_writer.h"

#include <algorithm>
#include <cstring>

namespace tandem::ring {

Completion token_completion(std::uint64_t user_data, std::uint64_t job_id, std::uint32_t step,
                            const std::vector<std::int32_t>& ids, std::string_view text) {
  Completion c;
  c.entry.user_data = user_data;
  c.entry.job_id = job_id;
  c.entry.kind = static_cast<std::uint8_t>(Kind::tokens);
  c.entry.step = step;
  c.entry.count = static_cast<std::uint32_t>(ids.size());
  c.entry.text_length = static_cast<std::uint32_t>(text.size());
  c.data.resize(ids.size() * 4 + text.size());
  if (!ids.empty()) std::memcpy(c.data.data(), ids.data(), ids.size() * 4);
  if (!text.empty()) std::memcpy(c.data.data() + ids.size() * 4, text.data(), text.size());
  return c;
}

Completion record_completion(Kind kind, std::uint64_t user_data, std::uint64_t job_id, std::vector<std::uint8_t> record,
                             ErrorCode error) {
  Completion c;
  c.entry.user_data = user_data;
  c.entry.job_id = job_id;
  c.entry.kind = static_cast<std::uint8_t>(kind);
  c.entry.error = static_cast<std::uint16_t>(error);
  c.data = std::move(record);
  return c;
}

CompletionWriter::CompletionWriter(View view, std::uint64_t max_backlog_bytes)
    : view_(view),
      max_backlog_bytes_(max_backlog_bytes),
      ends_(view.layout.cq_entries, 0),
      arena_(view.layout.response_data_size) {}

Fault CompletionWriter::reap_head() {
  const std::uint32_t h = load_acquire(&view_.cq()->head);
  if (h == seen_head_) return Fault::none;
  if (h - seen_head_ > tail_ - seen_head_) return Fault::cq_index;  // outside [seen, tail]
  if (!arena_.release_to(ends_[(h - 1) & (view_.layout.cq_entries - 1)])) return Fault::internal;
  seen_head_ = h;
  return Fault::none;
}

bool CompletionWriter::write_one(Completion& c) {
  const Layout& l = view_.layout;
  if (tail_ - seen_head_ >= l.cq_entries) return false;
  auto off = arena_.allocate(c.data.size());
  if (!off) return false;
  if (!c.data.empty()) std::memcpy(view_.response_data() + *off, c.data.data(), c.data.size());
  c.entry.data_offset = c.data.empty() ? 0 : *off;
  c.entry.data_length = static_cast<std::uint32_t>(c.data.size());
  const std::uint32_t slot = tail_ & (l.cq_entries - 1);
  std::memcpy(view_.cqes() + slot, &c.entry, sizeof c.entry);
  ends_[slot] = arena_.end_position();
  ++tail_;
  store_release(&view_.cq()->tail, tail_);
  wrote_since_wakeup_ = true;
  ++stats_.written;
  return true;
}

void CompletionWriter::publish_flags() {
  std::uint32_t f = backlog_.empty() ? 0 : kCqBacklog;
  if (stats_.dropped_tokens > 0) f |= kCqOverflowed;
  if (f != published_flags_) {
    store_release(&view_.cq()->daemon_flags, f);
    published_flags_ = f;
  }
  store_relaxed64(&view_.cq()->backlog_entries, backlog_.size());
  store_relaxed64(&view_.cq()->overflow_tokens, stats_.dropped_tokens);
}

Fault CompletionWriter::flush() {
  if (!view_.base) return Fault::none;
  if (Fault f = reap_head(); f != Fault::none) return f;
  while (!backlog_.empty()) {
    auto& c = backlog_.front();
    const auto size = c.data.size();
    if (!write_one(c)) break;
    backlog_bytes_ -= size;
    backlog_.pop_front();
  }
  publish_flags();
  return Fault::none;
}

Fault CompletionWriter::post(Completion c) {
  if (!view_.base) return Fault::none;
  ++stats_.posted;
  if (Fault f = flush(); f != Fault::none) return f;
  const bool tokens = c.entry.kind == static_cast<std::uint8_t>(Kind::tokens);
  const std::uint64_t job = c.entry.job_id;
  if (tokens) {
    if (auto it = gap_.find(job); it != gap_.end()) c.entry.flags |= kCqeGap;
  } else if (c.entry.kind == static_cast<std::uint8_t>(Kind::finished)) {
    gap_.erase(job);
  }
  // One completion larger than the whole response area can never be written: keep the entry, drop the payload.
  if (c.data.size() > arena_.max_allocation() / 2) {
    if (tokens) {
      stats_.dropped_tokens += c.entry.count;
      gap_[job] = c.entry.step + c.entry.count;
      publish_flags();
      return Fault::none;
    }
    c.data.clear();  // records are small; this is a safety net (the entry still tells what happened)
  }
  if (backlog_.empty() && write_one(c)) {
    if (tokens) gap_.erase(job);
    publish_flags();
    return Fault::none;
  }
  if (tokens) {
    Completion* last = backlog_.empty() ? nullptr : &backlog_.back();
    if (last && last->entry.kind == c.entry.kind && last->entry.job_id == job &&
        last->entry.step + last->entry.count == c.entry.step && (c.entry.flags & kCqeGap) == 0 &&
        last->data.size() + c.data.size() <= arena_.max_allocation() / 4 &&
        backlog_bytes_ + c.data.size() <= max_backlog_bytes_) {
      auto& back = *last;
      // Merge: ids of both, then text of both.
      std::vector<std::uint8_t> d;
      d.reserve(back.data.size() + c.data.size());
      const auto ids_a = std::size_t{back.entry.count} * 4, ids_b = std::size_t{c.entry.count} * 4;
      d.insert(d.end(), back.data.begin(), back.data.begin() + ids_a);
      d.insert(d.end(), c.data.begin(), c.data.begin() + ids_b);
      d.insert(d.end(), back.data.begin() + ids_a, back.data.end());
      d.insert(d.end(), c.data.begin() + ids_b, c.data.end());
      backlog_bytes_ += c.data.size();
      back.data = std::move(d);
      back.entry.count += c.entry.count;
      back.entry.text_length += c.entry.text_length;
      ++stats_.merged;
      stats_.backlog_peak_bytes = std::max(stats_.backlog_peak_bytes, backlog_bytes_);
      publish_flags();
      return Fault::none;
    }
    if (backlog_bytes_ + c.data.size() > max_backlog_bytes_) {
      stats_.dropped_tokens += c.entry.count;
      gap_[job] = c.entry.step + c.entry.count;
      publish_flags();
      return Fault::none;
    }
    gap_.erase(job);
  }
  backlog_bytes_ += c.data.size();
  stats_.backlog_peak_bytes = std::max(stats_.backlog_peak_bytes, backlog_bytes_);
  backlog_.push_back(std::move(c));
  publish_flags();
  return Fault::none;
}

bool CompletionWriter::take_wakeup() {
  if (!wrote_since_wakeup_ || !view_.base) return false;
  wrote_since_wakeup_ = false;
  full_fence();
  return (load_relaxed(&view_.cq()->client_flags) & kCqNeedWakeup) != 0;
}

}  // namespace tandem::ring
