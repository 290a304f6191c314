// Layout (src/ring/layout.cc): compute_layout rounding, limits and errors; initialize + read_header, and every way a
// header can be rejected; the CircularArena; the name tables.
#include "ring/layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <vector>

namespace tandem::ring {
namespace {

Layout must(const LayoutRequest& req, const LayoutLimits& lim = {}) {
  auto l = compute_layout(req, lim);
  EXPECT_TRUE(l.ok()) << l.error().message;
  return l.ok() ? *l : Layout{};
}

struct Area {
  std::uint64_t off, len;
};

std::vector<Area> areas_of(const Layout& l) {
  return {{0, sizeof(Header)},
          {l.sq_control_offset, sizeof(SqControl)},
          {l.cq_control_offset, sizeof(CqControl)},
          {l.sqes_offset, std::uint64_t{l.sq_entries} * kEntrySize},
          {l.cqes_offset, std::uint64_t{l.cq_entries} * kEntrySize},
          {l.request_data_offset, l.request_data_size},
          {l.response_data_offset, l.response_data_size}};
}

void expect_well_formed(const Layout& l) {
  const auto a = areas_of(l);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].off % kCacheLine, 0u) << "area " << i;
    EXPECT_LE(a[i].off + a[i].len, l.total_size) << "area " << i;
    for (std::size_t k = 0; k < i; ++k)
      EXPECT_TRUE(a[i].off >= a[k].off + a[k].len || a[k].off >= a[i].off + a[i].len) << i << " overlaps " << k;
  }
  EXPECT_EQ(l.request_data_offset % 4096, 0u);
  EXPECT_EQ(l.response_data_offset % 4096, 0u);
  EXPECT_EQ(l.total_size % 4096, 0u);
  EXPECT_EQ(l.max_request_bytes, l.request_data_size / 2);
}

TEST(ComputeLayout, Defaults) {
  const Layout l = must({});
  EXPECT_EQ(l.sq_entries, 256u);
  EXPECT_EQ(l.cq_entries, 1024u);
  EXPECT_EQ(l.request_data_size, 1u << 20);
  EXPECT_EQ(l.response_data_size, 1u << 20);
  EXPECT_EQ(l.sq_control_offset, 256u);
  EXPECT_EQ(l.cq_control_offset, 256u + sizeof(SqControl));
  expect_well_formed(l);
}

TEST(ComputeLayout, EntriesRoundUpToPowersOfTwoWithAMinimum) {
  struct { std::uint32_t asked, want; } cases[] = {{1, 8}, {7, 8}, {8, 8}, {9, 16}, {1000, 1024}, {4096, 4096}};
  for (auto c : cases) {
    const Layout l = must({c.asked, c.asked, 0, 0});
    EXPECT_EQ(l.sq_entries, c.want) << c.asked;
    EXPECT_EQ(l.cq_entries, c.want) << c.asked;
    expect_well_formed(l);
  }
}

TEST(ComputeLayout, DataAreasRoundUpToPagesWithAMinimum) {
  struct { std::uint64_t asked, want; } cases[] = {{1, 4096}, {4095, 4096}, {4096, 4096}, {4097, 8192},
                                                   {(1u << 20) + 1, (1u << 20) + 4096}};
  for (auto c : cases) {
    const Layout l = must({0, 0, c.asked, c.asked});
    EXPECT_EQ(l.request_data_size, c.want) << c.asked;
    EXPECT_EQ(l.response_data_size, c.want) << c.asked;
    expect_well_formed(l);
  }
}

TEST(ComputeLayout, SmallestSession) {
  const Layout l = must({8, 8, 4096, 4096});
  expect_well_formed(l);
  EXPECT_EQ(l.total_size, 3 * 4096u);  // header+controls+entries in one page, then the two data areas
  EXPECT_EQ(l.max_request_bytes, 2048u);
}

TEST(ComputeLayout, LimitsAreInvalidArgumentNamingTheOption) {
  const LayoutLimits lim;
  struct { LayoutRequest req; const char* name; } cases[] = {
      {{lim.max_sq_entries + 1, 0, 0, 0}, "sq_entries"},
      {{0xffffffffu, 0, 0, 0}, "sq_entries"},
      {{0, lim.max_cq_entries + 1, 0, 0}, "cq_entries"},
      {{0, 0xffffffffu, 0, 0}, "cq_entries"},
      {{0, 0, lim.max_request_data_bytes + 1, 0}, "request_data_bytes"},
      {{0, 0, ~std::uint64_t{0}, 0}, "request_data_bytes"},
      {{0, 0, 0, lim.max_response_data_bytes + 1}, "response_data_bytes"},
  };
  for (const auto& c : cases) {
    auto l = compute_layout(c.req, lim);
    ASSERT_FALSE(l.ok()) << c.name;
    EXPECT_EQ(l.error().code, Errc::invalid_argument);
    EXPECT_NE(l.error().message.find(c.name), std::string::npos) << l.error().message;
  }
  // Exactly at the limits is fine.
  const Layout l = must({lim.max_sq_entries, lim.max_cq_entries, lim.max_request_data_bytes,
                         lim.max_response_data_bytes});
  expect_well_formed(l);
}

// Config allows limits that are not powers of two / page multiples ([rings] max_data_bytes is any size >= 4 KiB):
// whatever compute_layout accepts must still respect them.
TEST(ComputeLayout, AcceptedSizesNeverExceedTheLimits) {
  LayoutLimits lim;
  lim.max_sq_entries = 100;
  lim.max_cq_entries = 1000;
  lim.max_request_data_bytes = 5000;
  lim.max_response_data_bytes = 10000;
  for (std::uint32_t n : {1u, 8u, 64u, 65u, 100u, 1000u})
    for (std::uint64_t b : {1ull, 4096ull, 4097ull, 5000ull, 8192ull, 10000ull}) {
      auto l = compute_layout({n, n, b, b}, lim);
      if (!l) continue;
      EXPECT_LE(l->sq_entries, lim.max_sq_entries) << n;
      EXPECT_LE(l->cq_entries, lim.max_cq_entries) << n;
      EXPECT_LE(l->request_data_size, lim.max_request_data_bytes) << "asked " << b;
      EXPECT_LE(l->response_data_size, lim.max_response_data_bytes) << "asked " << b;
    }
}

TEST(ComputeLayout, DefaultsComeFromTheLimits) {
  LayoutLimits lim;
  lim.default_sq_entries = 32;
  lim.default_cq_entries = 64;
  lim.default_request_data_bytes = 8192;
  lim.default_response_data_bytes = 16384;
  const Layout l = must({}, lim);
  EXPECT_EQ(l.sq_entries, 32u);
  EXPECT_EQ(l.cq_entries, 64u);
  EXPECT_EQ(l.request_data_size, 8192u);
  EXPECT_EQ(l.response_data_size, 16384u);
}

// --- initialize / read_header ----------------------------------------------------------------------------------------

class HeaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout = must({8, 16, 4096, 8192});
    layout.session_id = 42;
    mem.assign(layout.total_size, 0xAB);  // initialize() must clear the control blocks
    initialize(mem.data(), layout);
  }
  Header& h() { return *reinterpret_cast<Header*>(mem.data()); }
  Result<Layout> read() { return read_header(mem.data(), mem.size()); }
  void expect_rejected(Errc code, const char* what) {
    auto r = read();
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.error().code, code) << what << ": " << r.error().message;
  }
  Layout layout;
  std::vector<std::uint8_t> mem;
};

TEST_F(HeaderTest, RoundTrip) {
  auto r = read();
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->sq_entries, layout.sq_entries);
  EXPECT_EQ(r->cq_entries, layout.cq_entries);
  EXPECT_EQ(r->sq_control_offset, layout.sq_control_offset);
  EXPECT_EQ(r->cq_control_offset, layout.cq_control_offset);
  EXPECT_EQ(r->sqes_offset, layout.sqes_offset);
  EXPECT_EQ(r->cqes_offset, layout.cqes_offset);
  EXPECT_EQ(r->request_data_offset, layout.request_data_offset);
  EXPECT_EQ(r->request_data_size, layout.request_data_size);
  EXPECT_EQ(r->response_data_offset, layout.response_data_offset);
  EXPECT_EQ(r->response_data_size, layout.response_data_size);
  EXPECT_EQ(r->max_request_bytes, layout.max_request_bytes);
  EXPECT_EQ(r->total_size, layout.total_size);
  EXPECT_EQ(r->session_id, 42u);
  EXPECT_EQ(std::memcmp(h().magic, kMagic, 8), 0);
  EXPECT_EQ(h().abi_major, kAbiMajor);
  EXPECT_EQ(h().abi_minor, kAbiMinor);
  // Control blocks zeroed, reserved header bytes zero.
  View v{mem.data(), layout};
  EXPECT_EQ(v.sq()->tail, 0u);
  EXPECT_EQ(v.sq()->head, 0u);
  EXPECT_EQ(v.sq()->state, static_cast<std::uint32_t>(SessionState::open));
  EXPECT_EQ(v.cq()->head, 0u);
  EXPECT_EQ(v.cq()->daemon_flags, 0u);
  for (auto b : h().reserved) EXPECT_EQ(b, 0);
}

TEST_F(HeaderTest, NewerMinorAndUnknownFeaturesAreAccepted) {
  h().abi_minor = kAbiMinor + 5;
  h().features = 1ull << 40;
  EXPECT_TRUE(read().ok());
}

TEST_F(HeaderTest, BadMagic) {
  h().magic[7] = 'X';
  expect_rejected(Errc::incompatible, "magic");
}

TEST_F(HeaderTest, OtherAbiMajor) {
  h().abi_major = kAbiMajor + 1;
  expect_rejected(Errc::incompatible, "major+1");
  h().abi_major = 0;
  expect_rejected(Errc::incompatible, "major 0");
}

TEST_F(HeaderTest, MappingSmallerThanHeader) {
  auto r = read_header(mem.data(), sizeof(Header) - 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::format_error);
}

TEST_F(HeaderTest, SizeMismatch) {
  auto r = read_header(mem.data(), mem.size() - 4096);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::format_error);
  h().total_size += 4096;
  expect_rejected(Errc::format_error, "total_size larger than the mapping");
}

TEST_F(HeaderTest, HeaderAndEntrySizes) {
  h().header_size = 128;
  expect_rejected(Errc::format_error, "header_size");
  SetUp();
  h().sqe_size = 32;
  expect_rejected(Errc::format_error, "sqe_size");
  SetUp();
  h().cqe_size = 128;
  expect_rejected(Errc::format_error, "cqe_size");
}

TEST_F(HeaderTest, CapacitiesMustBePowersOfTwoAtLeastTheMinimum) {
  h().sq_entries = 12;
  expect_rejected(Errc::format_error, "sq 12");
  SetUp();
  h().cq_entries = 4;
  h().cqes_offset = layout.cqes_offset;  // 4 entries would still fit
  expect_rejected(Errc::format_error, "cq 4");
  SetUp();
  h().sq_entries = 0;
  expect_rejected(Errc::format_error, "sq 0");
}

TEST_F(HeaderTest, AreasOutsideTheMapping) {
  h().response_data_size += 64;
  expect_rejected(Errc::format_error, "response past the end");
  SetUp();
  h().request_data_offset = ~std::uint64_t{0} - 63;  // offset + size wraps around 2^64
  expect_rejected(Errc::format_error, "wrapping offset");
  SetUp();
  h().request_data_size = ~std::uint64_t{0};
  expect_rejected(Errc::format_error, "huge size");
  SetUp();
  h().sq_entries = 1u << 31;  // sq_entries * 64 overflows 32 bits
  expect_rejected(Errc::format_error, "huge sq");
}

TEST_F(HeaderTest, OverlappingAreas) {
  h().cqes_offset = layout.sqes_offset;
  expect_rejected(Errc::format_error, "cqes on sqes");
  SetUp();
  h().sq_control_offset = 128;  // inside the header
  expect_rejected(Errc::format_error, "sq control in header");
  SetUp();
  h().cq_control_offset = layout.sq_control_offset + 64;  // overlaps SQ control
  expect_rejected(Errc::format_error, "cq control on sq control");
  SetUp();
  h().response_data_offset = layout.request_data_offset + 64;
  h().response_data_size = 4096;
  expect_rejected(Errc::format_error, "response inside request");
}

TEST_F(HeaderTest, MisalignedArea) {
  h().sqes_offset += 8;
  expect_rejected(Errc::format_error, "sqes misaligned");
}

TEST_F(HeaderTest, MaxRequestBytes) {
  h().max_request_bytes = 0;
  expect_rejected(Errc::format_error, "0");
  SetUp();
  h().max_request_bytes = static_cast<std::uint32_t>(layout.request_data_size) + 1;
  expect_rejected(Errc::format_error, "> area");
}

// --- CircularArena -------------------------------------------------------------------------------------------------

TEST(CircularArena, EmptyArenaAllocatesNothing) {
  CircularArena a(0);
  EXPECT_FALSE(a.allocate(1).has_value());
  EXPECT_FALSE(a.allocate(0).has_value());
}

TEST(CircularArena, SequentialAndZeroSized) {
  CircularArena a(1000);
  EXPECT_EQ(a.allocate(100), 0u);
  EXPECT_EQ(a.allocate(0), 100u);  // n == 0: the tail's offset, nothing taken
  EXPECT_EQ(a.used(), 100u);
  EXPECT_EQ(a.allocate(200), 100u);
  EXPECT_EQ(a.end_position(), 300u);
  EXPECT_EQ(a.max_allocation(), 1000u);
}

TEST(CircularArena, FullThenReleased) {
  CircularArena a(1000);
  EXPECT_EQ(a.allocate(1000), 0u);
  EXPECT_FALSE(a.allocate(1).has_value());
  EXPECT_TRUE(a.release_to(1000));
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.allocate(1), 0u);
  EXPECT_FALSE(a.allocate(1000).has_value());  // 999 free bytes in two pieces
  EXPECT_FALSE(a.allocate(1001).has_value());
}

TEST(CircularArena, WrapSkipsTheEnd) {
  CircularArena a(100);
  EXPECT_EQ(a.allocate(60), 0u);
  EXPECT_EQ(a.allocate(30), 60u);
  EXPECT_FALSE(a.allocate(20).has_value());  // would straddle the end; the start is still in use
  EXPECT_TRUE(a.release_to(60));
  EXPECT_EQ(a.allocate(20), 0u);  // skipped [90, 100)
  EXPECT_EQ(a.end_position(), 120u);
  EXPECT_EQ(a.used(), 60u);  // 30 + 10 skipped + 20
  EXPECT_EQ(a.allocate(40), 20u);
  EXPECT_FALSE(a.allocate(1).has_value());  // [60, 90) still used
  EXPECT_TRUE(a.release_to(90));
  EXPECT_EQ(a.allocate(30), 60u);
}

TEST(CircularArena, ReleaseOutOfRangeIsRefusedAndChangesNothing) {
  CircularArena a(100);
  ASSERT_EQ(a.allocate(50), 0u);
  ASSERT_TRUE(a.release_to(20));
  EXPECT_FALSE(a.release_to(51));  // past the tail
  EXPECT_FALSE(a.release_to(19));  // before the head
  EXPECT_FALSE(a.release_to(~std::uint64_t{0}));
  EXPECT_EQ(a.used(), 30u);
  EXPECT_TRUE(a.release_to(20));  // the head itself
  EXPECT_TRUE(a.release_to(50));  // the tail itself
  EXPECT_EQ(a.used(), 0u);
}

// Free-running positions across many wraps: every allocation lies inside the area and never overlaps a live one.
TEST(CircularArena, RandomWorkloadNeverOverlaps) {
  constexpr std::uint64_t kSize = 4096;
  CircularArena a(kSize);
  std::mt19937 rng(7);
  struct Live { std::uint64_t off, n, end; };
  std::deque<Live> live;
  std::uint64_t allocations = 0;
  for (int i = 0; i < 200000; ++i) {
    if (rng() % 3 != 0) {
      const std::uint64_t n = rng() % (kSize / 2) + 1;
      auto off = a.allocate(n);
      if (!off) {
        // Must genuinely not fit: used + (skip) + n > size.
        ASSERT_FALSE(live.empty()) << "an empty arena must fit any allocation up to size/2";
        continue;
      }
      ++allocations;
      ASSERT_LE(*off + n, kSize);
      for (const auto& l : live) ASSERT_TRUE(*off >= l.off + l.n || l.off >= *off + n) << "overlap at " << i;
      live.push_back({*off, n, a.end_position()});
    } else if (!live.empty()) {
      const std::size_t k = rng() % live.size() + 1;  // release a prefix, as both rings do
      ASSERT_TRUE(a.release_to(live[k - 1].end));
      live.erase(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    ASSERT_LE(a.used(), kSize);
  }
  EXPECT_GT(allocations, 50000u);
  EXPECT_GT(a.end_position(), 100 * kSize);  // wrapped many times
}

// --- names ---------------------------------------------------------------------------------------------------------

TEST(Names, ErrorCodesRoundTrip) {
  for (std::uint16_t i = 1; i <= 15; ++i) {
    const auto e = static_cast<ErrorCode>(i);
    EXPECT_FALSE(error_code_name(e).empty());
    EXPECT_EQ(error_code_from_name(error_code_name(e)), e);
  }
  EXPECT_EQ(error_code_name(ErrorCode::none), "");
  EXPECT_EQ(error_code_name(ErrorCode::queue_full), "QueueFull");
  EXPECT_EQ(error_code_name(static_cast<ErrorCode>(999)), "Internal");
  EXPECT_EQ(error_code_from_name("NoSuchError"), ErrorCode::internal);
}

TEST(Names, FaultsKindsStates) {
  EXPECT_EQ(fault_name(Fault::sq_index), "sq_index");
  EXPECT_EQ(fault_name(Fault::utf8), "utf8");
  EXPECT_EQ(fault_name(static_cast<Fault>(77)), "unknown");
  EXPECT_EQ(kind_name(Kind::cancel_result), "cancel_result");
  EXPECT_EQ(kind_name(static_cast<Kind>(0)), "unknown");
  EXPECT_EQ(session_state_name(SessionState::failed), "failed");
}

}  // namespace
}  // namespace tandem::ring
