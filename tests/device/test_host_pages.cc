// device::HostPages, the simulated accelerator's "device memory" (torch-free).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "device/host_pages.h"

using namespace tandem;
using device::HostPages;

namespace {
constexpr std::uint64_t kHuge = HostPages::kHugePage;

// Pages of [p, p + n) resident (mincore); -1 when the range is not mapped.
long resident_pages(const void* p, std::uint64_t n) {
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> v((n + page - 1) / page);
  if (::mincore(const_cast<void*>(p), n, v.data()) != 0) return -1;
  long r = 0;
  for (unsigned char c : v) r += c & 1;
  return r;
}
}  // namespace

TEST(HostPages, SizesRoundToWholeHugePagesAtAHugePageBoundaryZeroedAndWritable) {
  struct Case {
    std::uint64_t bytes, mapped;
  };
  for (const Case& c : std::vector<Case>{{1, kHuge}, {4096, kHuge}, {kHuge, kHuge}, {kHuge + 1, 2 * kHuge},
                                         {(9ull << 20) / 4, 2 * kHuge}, {7 * kHuge - 64, 7 * kHuge}}) {
    auto h = HostPages::map(c.bytes);
    ASSERT_TRUE(h.ok()) << c.bytes << ": " << h.error().message;
    EXPECT_EQ(h->size(), c.bytes);
    EXPECT_EQ(h->mapped_bytes(), c.mapped) << c.bytes;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(h->data()) % kHuge, 0u) << c.bytes;
    const auto* b = static_cast<const unsigned char*>(h->data());
    for (std::uint64_t i = 0; i < h->mapped_bytes(); i += 4093) ASSERT_EQ(b[i], 0) << c.bytes << " @" << i;
    std::memset(h->data(), 0x5a, h->mapped_bytes());  // all of it, the rounding included, is ours to write
    EXPECT_EQ(b[h->mapped_bytes() - 1], 0x5a);
    if (h->backed()) {
      EXPECT_EQ(resident_pages(h->data(), h->mapped_bytes()),
                static_cast<long>(h->mapped_bytes() / static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE))));
    }
  }
  auto h = HostPages::map(3 * kHuge);
  ASSERT_TRUE(h.ok());
  // What this kernel took (not asserted: THP may be compiled out or set to never, MADV_POPULATE_WRITE needs 5.14).
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  std::printf("[ info ] huge-page advice taken: %s (THP: %s); backed at map: %s\n", h->huge() ? "yes" : "no",
              mode.empty() ? "unknown" : mode.c_str(), h->backed() ? "yes" : "no (first touch)");
}

TEST(HostPages, FreeingUnmapsAndMovesHandOverTheMapping) {
  auto a = HostPages::map(kHuge + 5);
  ASSERT_TRUE(a.ok());
  void* p = a->data();
  const std::uint64_t n = a->mapped_bytes();
  static_cast<unsigned char*>(p)[0] = 1;
  HostPages b = std::move(a).value();
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), kHuge + 5);
  HostPages c;
  EXPECT_EQ(c.data(), nullptr);
  EXPECT_EQ(c.size(), 0u);
  c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty, as documented
  EXPECT_EQ(b.mapped_bytes(), 0u);
  EXPECT_EQ(static_cast<unsigned char*>(c.data())[0], 1);
  EXPECT_GE(resident_pages(p, n), 1);
  c = HostPages();  // the old mapping goes
  EXPECT_EQ(resident_pages(p, n), -1) << "unmapped: given back to the host";
  {
    auto d = HostPages::map(1);
    ASSERT_TRUE(d.ok());
    p = d->data();
  }
  EXPECT_EQ(resident_pages(p, kHuge), -1);
}

TEST(HostPages, BadSizesAndRefusedMemoryAreTypedErrors) {
  auto zero = HostPages::map(0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().code, Errc::invalid_argument);
  auto huge = HostPages::map(std::uint64_t{1} << 60);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().code, Errc::invalid_argument);
  EXPECT_NE(huge.error().message.find("address space"), std::string::npos) << huge.error().message;
  // An address-space limit 256 MiB above what is mapped now (sanitizers map terabytes of shadow) and a 2 GiB request:
  // the mapping is refused, out_of_memory (in a child: the limit stays there).
  EXPECT_EXIT(
      {
        std::ifstream statm("/proc/self/statm");
        std::uint64_t pages = 0;
        statm >> pages;
        struct rlimit lim {};
        ::getrlimit(RLIMIT_AS, &lim);
        lim.rlim_cur = pages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE)) + (256ull << 20);
        ::setrlimit(RLIMIT_AS, &lim);
        auto r = HostPages::map(2ull << 30);
        std::exit(r.ok() ? 1 : r.error().code == Errc::out_of_memory ? 0 : 2);
      },
      ::testing::ExitedWithCode(0), "");
}
