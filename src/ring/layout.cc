#include "ring/layout.h"

#include <bit>
#include <cstring>

namespace tandem::ring {

namespace {

constexpr std::uint64_t kPage = 4096;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

Result<std::uint32_t> entries(const char* name, std::uint32_t asked, std::uint32_t dflt, std::uint32_t max) {
  std::uint64_t n = asked == 0 ? dflt : asked;
  if (n < kMinEntries) n = kMinEntries;
  n = std::bit_ceil(n);
  if (n > max)
    return fail(Errc::invalid_argument, std::string(name) + " must be at most " + std::to_string(max) + ", got " +
                                            std::to_string(asked));
  return static_cast<std::uint32_t>(n);
}

Result<std::uint64_t> bytes(const char* name, std::uint64_t asked, std::uint64_t dflt, std::uint64_t max) {
  // The limit counts whole pages: a limit that is not a multiple of 4 KiB is rounded down (never below one page).
  const std::uint64_t limit = std::max<std::uint64_t>(max / kPage * kPage, kMinDataBytes);
  std::uint64_t n = asked == 0 ? std::min(dflt, limit) : asked;
  if (n > limit)  // before rounding: limit is a page multiple, so what passes rounds up to at most the limit
    return fail(Errc::invalid_argument, std::string(name) + " must be at most " + std::to_string(limit) + ", got " +
                                            std::to_string(asked));
  if (n < kMinDataBytes) n = kMinDataBytes;
  return align_up(n, kPage);
}

bool inside(std::uint64_t off, std::uint64_t len, std::uint64_t total) { return off <= total && len <= total - off; }

}  // namespace

Result<Layout> compute_layout(const LayoutRequest& req, const LayoutLimits& limits) {
  Layout l;
  auto sq = entries("sq_entries", req.sq_entries, limits.default_sq_entries, limits.max_sq_entries);
  if (!sq) return fail(std::move(sq).error());
  auto cq = entries("cq_entries", req.cq_entries, limits.default_cq_entries, limits.max_cq_entries);
  if (!cq) return fail(std::move(cq).error());
  auto rq = bytes("request_data_bytes", req.request_data_bytes, limits.default_request_data_bytes,
                  limits.max_request_data_bytes);
  if (!rq) return fail(std::move(rq).error());
  auto rs = bytes("response_data_bytes", req.response_data_bytes, limits.default_response_data_bytes,
                  limits.max_response_data_bytes);
  if (!rs) return fail(std::move(rs).error());
  l.sq_entries = *sq;
  l.cq_entries = *cq;
  std::uint64_t off = align_up(sizeof(Header), kCacheLine);
  l.sq_control_offset = off;
  off += sizeof(SqControl);
  l.cq_control_offset = off;
  off += sizeof(CqControl);
  l.sqes_offset = align_up(off, kCacheLine);
  off = l.sqes_offset + std::uint64_t{l.sq_entries} * kEntrySize;
  l.cqes_offset = align_up(off, kCacheLine);
  off = l.cqes_offset + std::uint64_t{l.cq_entries} * kEntrySize;
  l.request_data_offset = align_up(off, kPage);
  l.request_data_size = *rq;
  off = l.request_data_offset + l.request_data_size;
  l.response_data_offset = align_up(off, kPage);
  l.response_data_size = *rs;
  l.total_size = align_up(l.response_data_offset + l.response_data_size, kPage);
  // One submission may use half the request area (the arena then always has room for the next one after it).
  l.max_request_bytes = static_cast<std::uint32_t>(std::min<std::uint64_t>(l.request_data_size / 2, 0xffffffffu));
  return l;
}

void initialize(void* base, const Layout& l) {
  auto* b = static_cast<std::uint8_t*>(base);
  std::memset(b, 0, l.sqes_offset);  // header and control blocks
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof h.magic);
  h.abi_major = kAbiMajor;
  h.abi_minor = kAbiMinor;
  h.header_size = sizeof(Header);
  h.features = l.features;
  h.session_id = l.session_id;
  h.total_size = l.total_size;
  h.sq_entries = l.sq_entries;
  h.cq_entries = l.cq_entries;
  h.sqe_size = kEntrySize;
  h.cqe_size = kEntrySize;
  h.sq_control_offset = l.sq_control_offset;
  h.cq_control_offset = l.cq_control_offset;
  h.sqes_offset = l.sqes_offset;
  h.cqes_offset = l.cqes_offset;
  h.request_data_offset = l.request_data_offset;
  h.request_data_size = l.request_data_size;
  h.response_data_offset = l.response_data_offset;
  h.response_data_size = l.response_data_size;
  h.max_request_bytes = l.max_request_bytes;
  std::memcpy(b, &h, sizeof h);
}

Result<Layout> read_header(const void* base, std::size_t mapped_size) {
  if (mapped_size < sizeof(Header)) return fail(Errc::format_error, "mapping smaller than the ring header");
  Header h;
  std::memcpy(&h, base, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof h.magic) != 0) return fail(Errc::incompatible, "not a Tandem ring (bad magic)");
  if (h.abi_major != kAbiMajor)
    return fail(Errc::incompatible, "ring ABI " + std::to_string(h.abi_major) + "." + std::to_string(h.abi_minor) +
                                        ", this client speaks " + std::to_string(kAbiMajor) + ".x");
  if (h.header_size < sizeof(Header)) return fail(Errc::format_error, "ring header too small");
  if (h.sqe_size != kEntrySize || h.cqe_size != kEntrySize) return fail(Errc::format_error, "unexpected entry size");
  if (h.sq_entries < kMinEntries || !std::has_single_bit(h.sq_entries) || h.cq_entries < kMinEntries ||
      !std::has_single_bit(h.cq_entries))
    return fail(Errc::format_error, "ring capacities are not powers of two");
  if (h.total_size != mapped_size) return fail(Errc::format_error, "ring size differs from the mapping");
  struct Area { std::uint64_t off, len; };
  const Area areas[] = {
      {0, sizeof(Header)},
      {h.sq_control_offset, sizeof(SqControl)},
      {h.cq_control_offset, sizeof(CqControl)},
      {h.sqes_offset, std::uint64_t{h.sq_entries} * kEntrySize},
      {h.cqes_offset, std::uint64_t{h.cq_entries} * kEntrySize},
      {h.request_data_offset, h.request_data_size},
      {h.response_data_offset, h.response_data_size},
  };
  for (std::size_t i = 0; i < std::size(areas); ++i) {
    if (!inside(areas[i].off, areas[i].len, mapped_size)) return fail(Errc::format_error, "ring area outside the mapping");
    if (i > 0 && areas[i].off % kCacheLine != 0) return fail(Errc::format_error, "ring area not cache-line aligned");
    for (std::size_t k = 0; k < i; ++k)
      if (areas[i].off < areas[k].off + areas[k].len && areas[k].off < areas[i].off + areas[i].len)
        return fail(Errc::format_error, "ring areas overlap");
  }
  if (h.max_request_bytes == 0 || h.max_request_bytes > h.request_data_size)
    return fail(Errc::format_error, "bad max_request_bytes");
  Layout l;
  l.sq_entries = h.sq_entries;
  l.cq_entries = h.cq_entries;
  l.sq_control_offset = h.sq_control_offset;
  l.cq_control_offset = h.cq_control_offset;
  l.sqes_offset = h.sqes_offset;
  l.cqes_offset = h.cqes_offset;
  l.request_data_offset = h.request_data_offset;
  l.request_data_size = h.request_data_size;
  l.response_data_offset = h.response_data_offset;
  l.response_data_size = h.response_data_size;
  l.max_request_bytes = h.max_request_bytes;
  l.total_size = h.total_size;
  l.features = h.features;
  l.session_id = h.session_id;
  return l;
}

std::optional<std::uint64_t> CircularArena::allocate(std::uint64_t n) {
  if (size_ == 0) return std::nullopt;
  const std::uint64_t pos = tail_ % size_;
  if (n == 0) return pos;
  if (n > size_) return std::nullopt;
  const std::uint64_t skip = pos + n > size_ ? size_ - pos : 0;
  if (used() + skip + n > size_) return std::nullopt;
  tail_ += skip + n;
  return skip ? 0 : pos;
}

bool CircularArena::release_to(std::uint64_t end) {
  if (end - head_ > tail_ - head_) return false;  // outside [head, tail] (unsigned wrap makes "before head" huge)
  head_ = end;
  return true;
}

std::string_view fault_name(Fault f) {
  switch (f) {
    case Fault::none: return "none";
    case Fault::sq_index: return "sq_index";
    case Fault::cq_index: return "cq_index";
    case Fault::opcode: return "opcode";
    case Fault::reserved: return "reserved";
    case Fault::length: return "length";
    case Fault::offset: return "offset";
    case Fault::record: return "record";
    case Fault::utf8: return "utf8";
    case Fault::internal: return "internal";
  }
  return "unknown";
}

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::accepted: return "accepted";
    case Kind::routed: return "routed";
    case Kind::started: return "started";
    case Kind::tokens: return "tokens";
    case Kind::migrated: return "migrated";
    case Kind::finished: return "finished";
    case Kind::error: return "error";
    case Kind::cancel_result: return "cancel_result";
    case Kind::nop: return "nop";
    case Kind::degraded_mode: return "degraded_mode";
    case Kind::embedded: return "embedded";
    case Kind::segment: return "segment";
    case Kind::progress: return "progress";
    case Kind::audio_info: return "audio_info";
  }
  return "unknown";
}

namespace {
constexpr std::string_view kErrorNames[] = {"",           "InvalidArgument", "UnknownModel", "UnknownJob",
                                            "Busy",       "QueueFull",       "HostMemory",   "Resumable",
                                            "NotAuthorized", "Unavailable",  "Incompatible", "Duplicate",
                                            "IllegalState", "NotSupported",  "Timeout",      "Internal"};
}

std::string_view error_code_name(ErrorCode e) {
  const auto i = static_cast<std::size_t>(e);
  return i < std::size(kErrorNames) ? kErrorNames[i] : "Internal";
}

ErrorCode error_code_from_name(std::string_view name) {
  for (std::size_t i = 1; i < std::size(kErrorNames); ++i)
    if (kErrorNames[i] == name) return static_cast<ErrorCode>(i);
  return ErrorCode::internal;
}

std::string_view session_state_name(SessionState s) {
  switch (s) {
    case SessionState::open: return "open";
    case SessionState::failed: return "failed";
    case SessionState::closed: return "closed";
  }
  return "unknown";
}

}  // namespace tandem::ring
