// read_host_memory (src/daemon/host_reading.cc) over fake /proc and /sys trees: the cgroup memory limit that
// systemd's MemoryMax= sets is found on cgroup v2, on cgroup v1 and on the hybrid layout (v1 controllers plus an
// empty v2 tree, where tests/system/run.sh found the guard blind to it), with the tightest ancestor winning.
#include "daemon/host_reading.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;
using tandem::daemon::read_host_memory;

namespace {

class FakeRoot : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("tandem-host-reading-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    put("proc/meminfo", "MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n");
  }
  void TearDown() override { fs::remove_all(root_); }
  void put(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string root() const { return root_.string(); }
  fs::path root_;
};

constexpr std::uint64_t kGiB = 1ull << 30;

TEST_F(FakeRoot, CgroupV2MemoryMax) {
  put("proc/self/cgroup", "0::/system.slice/tandemd.service\n");
  put("sys/fs/cgroup/system.slice/tandemd.service/memory.current", std::to_string(1 * kGiB) + "\n");
  put("sys/fs/cgroup/system.slice/tandemd.service/memory.max", std::to_string(12 * kGiB) + "\n");
  put("sys/fs/cgroup/system.slice/memory.current", std::to_string(3 * kGiB) + "\n");
  put("sys/fs/cgroup/system.slice/memory.max", "max\n");
  auto r = read_host_memory(root());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->cgroup_max, 12 * kGiB);
  EXPECT_EQ(r->cgroup_current, 1 * kGiB);
  EXPECT_EQ(r->mem_available, 8000000ull * 1024);
}

TEST_F(FakeRoot, CgroupV2TighterSlice) {
  put("proc/self/cgroup", "0::/system.slice/tandemd.service\n");
  put("sys/fs/cgroup/system.slice/tandemd.service/memory.current", std::to_string(1 * kGiB) + "\n");
  put("sys/fs/cgroup/system.slice/tandemd.service/memory.max", std::to_string(12 * kGiB) + "\n");
  put("sys/fs/cgroup/system.slice/memory.current", std::to_string(4 * kGiB) + "\n");
  put("sys/fs/cgroup/system.slice/memory.max", std::to_string(8 * kGiB) + "\n");
  auto r = read_host_memory(root());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->cgroup_max, 1 * kGiB + 4 * kGiB);  // own usage + the slice's room (8 − 4)
}

TEST_F(FakeRoot, HybridLayoutUsesTheV1MemoryController) {
  // systemd 252 on a hybrid host: every v1 controller plus name=systemd, and "0::" on an empty v2 tree.
  put("proc/self/cgroup",
      "9:name=systemd:/ct/system.slice/tandemd.service\n"
      "5:devices:/ct/system.slice/tandemd.service\n"
      "4:memory:/ct/system.slice/tandemd.service\n"
      "1:cpu,cpuacct:/ct/system.slice/tandemd.service\n"
      "0::/ct/system.slice/tandemd.service\n");
  put("sys/fs/cgroup/unified/ct/system.slice/tandemd.service/cgroup.procs", "1\n");
  const std::string m = "sys/fs/cgroup/memory/ct/system.slice/tandemd.service/";
  put(m + "memory.usage_in_bytes", std::to_string(2 * kGiB) + "\n");
  put(m + "memory.limit_in_bytes", std::to_string(19 * kGiB) + "\n");
  put("sys/fs/cgroup/memory/ct/system.slice/memory.usage_in_bytes", std::to_string(3 * kGiB) + "\n");
  put("sys/fs/cgroup/memory/ct/system.slice/memory.limit_in_bytes", "9223372036854771712\n");  // v1 "unlimited"
  put("sys/fs/cgroup/memory/memory.usage_in_bytes", std::to_string(5 * kGiB) + "\n");
  put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  auto r = read_host_memory(root());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->cgroup_max, 19 * kGiB);
  EXPECT_EQ(r->cgroup_current, 2 * kGiB);
}

TEST_F(FakeRoot, CgroupV1WithoutLimitIsNoLimit) {
  put("proc/self/cgroup", "4:memory:/system.slice/tandemd.service\n");
  put("sys/fs/cgroup/memory/system.slice/tandemd.service/memory.usage_in_bytes", "1000\n");
  put("sys/fs/cgroup/memory/system.slice/tandemd.service/memory.limit_in_bytes", "9223372036854771712\n");
  auto r = read_host_memory(root());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->cgroup_max, std::nullopt);
  EXPECT_EQ(r->cgroup_current, 1000u);
}

TEST_F(FakeRoot, NoCgroupFilesOnlyMemAvailable) {
  put("proc/self/cgroup", "0::/user.slice\n");
  auto r = read_host_memory(root());
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->cgroup_max, std::nullopt);
  EXPECT_EQ(r->cgroup_current, std::nullopt);
  EXPECT_EQ(r->mem_available, 8000000ull * 1024);
}

TEST_F(FakeRoot, GarbageLimitIsAnError) {
  put("proc/self/cgroup", "4:memory:/a\n");
  put("sys/fs/cgroup/memory/a/memory.usage_in_bytes", "1000\n");
  put("sys/fs/cgroup/memory/a/memory.limit_in_bytes", "lots\n");
  EXPECT_FALSE(read_host_memory(root()));
}

}  // namespace
