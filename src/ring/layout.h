// Ring layout: sizes → offsets (the daemon, at OpenSession), header check (the client, after mapping), a typed view
// over a mapping, the atomic index accessors both sides use, and the circular byte arena that manages a data area
// (the client's request area, the daemon's response area). Pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/result.h"
#include "ring/abi.h"

namespace tandem::ring {

// What a client asks for (0 = the default) and the daemon's bounds (config [rings]).
struct LayoutRequest {
  std::uint32_t sq_entries = 0;
  std::uint32_t cq_entries = 0;
  std::uint64_t request_data_bytes = 0;
  std::uint64_t response_data_bytes = 0;
};

struct LayoutLimits {
  std::uint32_t default_sq_entries = 256;
  std::uint32_t default_cq_entries = 1024;
  std::uint64_t default_request_data_bytes = 1u << 20;
  std::uint64_t default_response_data_bytes = 1u << 20;
  std::uint32_t max_sq_entries = 4096;
  std::uint32_t max_cq_entries = 16384;
  std::uint64_t max_request_data_bytes = 16u << 20;
  std::uint64_t max_response_data_bytes = 16u << 20;
};

struct Layout {
  std::uint32_t sq_entries = 0, cq_entries = 0;
  std::uint64_t sq_control_offset = 0, cq_control_offset = 0, sqes_offset = 0, cqes_offset = 0;
  std::uint64_t request_data_offset = 0, request_data_size = 0;
  std::uint64_t response_data_offset = 0, response_data_size = 0;
  std::uint32_t max_request_bytes = 0;
  std::uint64_t total_size = 0;
  std::uint64_t features = 0;
  std::uint64_t session_id = 0;
};

inline constexpr std::uint32_t kMinEntries = 8;
inline constexpr std::uint64_t kMinDataBytes = 4096;

// Entries round up to a power of two, data areas up to a multiple of 4 KiB; values past the limits are
// invalid_argument naming the option. Every area starts on a cache line; the total is a multiple of 4 KiB.
Result<Layout> compute_layout(const LayoutRequest& req, const LayoutLimits& limits);

// Writes the header and zeroes the control blocks of a fresh mapping of layout.total_size bytes.
void initialize(void* base, const Layout& layout);

// The client's check of a mapping it was handed: magic, ABI major, header size, entry sizes, powers of two, every
// area inside `mapped_size` and non-overlapping. Errors: incompatible (magic/ABI), format_error (the rest).
Result<Layout> read_header(const void* base, std::size_t mapped_size);

// Typed access to a mapping. Does not own it.
struct View {
  std::uint8_t* base = nullptr;
  Layout layout;

  Header* header() const { return reinterpret_cast<Header*>(base); }
  SqControl* sq() const { return reinterpret_cast<SqControl*>(base + layout.sq_control_offset); }
  CqControl* cq() const { return reinterpret_cast<CqControl*>(base + layout.cq_control_offset); }
  SubmissionEntry* sqes() const { return reinterpret_cast<SubmissionEntry*>(base + layout.sqes_offset); }
  CompletionEntry* cqes() const { return reinterpret_cast<CompletionEntry*>(base + layout.cqes_offset); }
  std::uint8_t* request_data() const { return base + layout.request_data_offset; }
  std::uint8_t* response_data() const { return base + layout.response_data_offset; }
};

// Atomic access to a shared uint32/uint64 (the memory is shared with another process: plain std::atomic objects
// cannot be placed there portably; these are the GCC/Clang builtins that std::atomic_ref uses).
inline std::uint32_t load_acquire(const std::uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline std::uint32_t load_relaxed(const std::uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void store_release(std::uint32_t* p, std::uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void store_relaxed(std::uint32_t* p, std::uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline void store_relaxed64(std::uint64_t* p, std::uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline std::uint64_t load_relaxed64(const std::uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void fetch_or(std::uint32_t* p, std::uint32_t v) { __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
inline void fetch_and(std::uint32_t* p, std::uint32_t v) { __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
// The store-then-load fence of the wake-up protocol (docs/rings.md "Doorbells"): publish tail / set NEED_WAKEUP,
// full fence, then read the other side's flag / tail.
inline void full_fence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// A byte ring over [0, size): allocations are contiguous (one that would straddle the end skips to offset 0) and are
// released in allocation order by end position. Positions are free-running 64-bit counters.
class CircularArena {
 public:
  explicit CircularArena(std::uint64_t size = 0) : size_(size) {}
  // Offset of n contiguous bytes, or nullopt when they do not fit now. n == 0 always fits (offset of the tail).
  std::optional<std::uint64_t> allocate(std::uint64_t n);
  std::uint64_t end_position() const { return tail_; }  // after the last allocation
  // Everything allocated before `end` is free again. `end` must lie in [released, end_position()].
  bool release_to(std::uint64_t end);
  std::uint64_t used() const { return tail_ - head_; }
  std::uint64_t size() const { return size_; }
  // The largest single allocation that can ever succeed.
  std::uint64_t max_allocation() const { return size_; }

 private:
  std::uint64_t size_ = 0;
  std::uint64_t head_ = 0;
  std::uint64_t tail_ = 0;
};

std::string_view fault_name(Fault f);
std::string_view kind_name(Kind k);
std::string_view error_code_name(ErrorCode e);  // "Busy", ... ("" for none)
ErrorCode error_code_from_name(std::string_view name);
std::string_view session_state_name(SessionState s);

}  // namespace tandem::ring
