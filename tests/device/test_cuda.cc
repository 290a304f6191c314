// The CUDA device and the GPU ballast tool. Tests that need a GPU skip (not fail) when CudaDevice::open() finds
// none; the "no GPU" tests skip where there is one. See docs/cuda.md and tests/gpu/run.sh.
#include "device/cuda.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#ifndef TANDEM_GPU_BALLAST
#error "TANDEM_GPU_BALLAST must name the built tandem-gpu-ballast"
#endif

namespace tandem::device {
namespace {

constexpr std::uint64_t kMiB = 1ull << 20;
constexpr std::uint64_t kGiB = 1ull << 30;

std::shared_ptr<const Clock> make_clock() { return std::make_shared<SteadyClock>(); }

// A child process with its stdout+stderr on one pipe and (optionally) its stdin on another.
struct Child {
  pid_t pid = -1;
  int stdin_w = -1;
  int out_r = -1;

  static Child spawn(const std::vector<std::string>& args, bool pipe_stdin) {
    int out[2], in[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0) return {};
    if (pipe_stdin && pipe2(in, O_CLOEXEC) != 0) return {};
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      const int in_fd = pipe_stdin ? in[0] : open("/dev/null", O_RDONLY);
      dup2(in_fd, STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      dup2(out[1], STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    if (pipe_stdin) close(in[0]);
    return Child{pid, pipe_stdin ? in[1] : -1, out[0]};
  }

  // Reads until `stop` is in the output, EOF, or the timeout; returns everything read.
  std::string read_until(const std::string& stop, std::chrono::milliseconds timeout) {
    std::string got;
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (!stop.empty() && got.find(stop) != std::string::npos) return got;
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
      if (left <= 0) return got;
      pollfd p{out_r, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[512];
      const ssize_t n = read(out_r, buf, sizeof buf);
      if (n <= 0) return got;
      got.append(buf, static_cast<std::size_t>(n));
    }
  }

  int wait_exit() {
    if (stdin_w >= 0) close(stdin_w);
    stdin_w = -1;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    close(out_r);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

struct Run {
  int exit_code;
  std::string output;
};

Run run_ballast(std::vector<std::string> args) {
  args.insert(args.begin(), TANDEM_GPU_BALLAST);
  Child c = Child::spawn(args, false);
  if (c.pid <= 0) return {-1, "spawn failed"};
  std::string out = c.read_until("", std::chrono::seconds(60));
  return {c.wait_exit(), out};
}

bool gpu_present() { return CudaDevice::open(0, make_clock()).ok(); }

// --- tests that run everywhere ---------------------------------------------------------------------------------------

TEST(CudaErrors, ClassificationTable) {
  struct Case {
    cudaError_t err;
    Errc code;
    bool sticky;
  };
  const Case cases[] = {
      {cudaErrorNoDevice, Errc::not_found, false},
      {cudaErrorInitializationError, Errc::not_found, false},
      {cudaErrorInsufficientDriver, Errc::unsupported, false},
      {cudaErrorMemoryAllocation, Errc::out_of_memory, false},
      {cudaErrorIllegalAddress, Errc::device_lost, true},
      {cudaErrorLaunchFailure, Errc::device_lost, true},
      {cudaErrorDevicesUnavailable, Errc::device_lost, true},
      {cudaErrorECCUncorrectable, Errc::device_lost, true},
      {cudaErrorUnknown, Errc::device_lost, true},
      {cudaErrorTimeout, Errc::timeout, false},
      {cudaErrorInvalidValue, Errc::internal, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(cuda_error_text(c.err));
    const auto got = classify_cuda_error(c.err);
    EXPECT_EQ(got.code, c.code);
    EXPECT_EQ(got.sticky, c.sticky);
  }
  EXPECT_TRUE(cuda_error_means_no_device(cudaErrorNoDevice));
  EXPECT_TRUE(cuda_error_means_no_device(cudaErrorInsufficientDriver));
  EXPECT_FALSE(cuda_error_means_no_device(cudaErrorIllegalAddress));
  EXPECT_EQ(cuda_error_text(cudaSuccess), "cudaSuccess");
  EXPECT_NE(cuda_error_text(cudaErrorNoDevice).find("cudaErrorNoDevice"), std::string::npos);
}

TEST(CudaDeviceOpen, NegativeIndexIsInvalidArgument) {
  auto d = CudaDevice::open(-1, make_clock());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, Errc::invalid_argument);
}

TEST(CudaDeviceOpen, IndexPastTheDevicesIsTypedError) {
  auto d = CudaDevice::open(1023, make_clock());
  ASSERT_FALSE(d.ok());
  EXPECT_TRUE(d.error().code == Errc::not_found || d.error().code == Errc::unsupported) << d.error().message;
}

TEST(CudaDeviceOpen, WithoutGpuIsTypedError) {
  auto d = CudaDevice::open(0, make_clock());
  if (d.ok()) GTEST_SKIP() << "a GPU is present: " << (*d)->name();
  EXPECT_TRUE(d.error().code == Errc::not_found || d.error().code == Errc::unsupported)
      << errc_name(d.error().code) << ": " << d.error().message;
  EXPECT_EQ(d.error().message.rfind("no CUDA device: ", 0), 0u) << d.error().message;
  std::printf("open(0) here: %s: %s\n", std::string(errc_name(d.error().code)).c_str(), d.error().message.c_str());
}

TEST(GpuBallast, ExitsWith77WithoutGpu) {
  if (gpu_present()) GTEST_SKIP() << "a GPU is present";
  const auto r = run_ballast({"--bytes", "1M"});
  EXPECT_EQ(r.exit_code, 77) << r.output;
  EXPECT_NE(r.output.find("no CUDA device"), std::string::npos) << r.output;
}

TEST(GpuBallast, RejectsBadArguments) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {}, {"--bytes"}, {"--bytes", "0"}, {"--bytes", "12X"}, {"--bytes", "1G", "--device", "-1"},
           {"--bytes", "1G", "--seconds", "x"}, {"--bytes", "1M", "--frobnicate"}, {"--bytes", "2000000T"}, {"--bytes", "2000000G"},
           {"--leave"}, {"--leave", "0"}, {"--leave", "1Q"}, {"--bytes", "1M", "--leave", "1M"}}) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    SCOPED_TRACE(joined);
    const auto r = run_ballast(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("usage:"), std::string::npos) << r.output;
  }
}

// --- tests that need a GPU -------------------------------------------------------------------------------------------

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = CudaDevice::open(0, make_clock());
    if (!d.ok()) {
      if (d.error().code == Errc::not_found || d.error().code == Errc::unsupported)
        GTEST_SKIP() << "no GPU: " << d.error().message;
      FAIL() << errc_name(d.error().code) << ": " << d.error().message;
    }
    dev_ = std::move(d).value();
  }
  std::shared_ptr<CudaDevice> dev_;
};

TEST_F(CudaDeviceTest, Identity) {
  EXPECT_EQ(dev_->kind(), Kind::cuda);
  EXPECT_EQ(dev_->torch_index(), 0);
  EXPECT_EQ(dev_->name().rfind("cuda:0 (", 0), 0u) << dev_->name();
  EXPECT_FALSE(dev_->lost());
}

TEST_F(CudaDeviceTest, MemoryReadingIsSane) {
  auto m = dev_->memory();
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_GT(m->total_bytes, 0u);
  EXPECT_LE(m->free_bytes, m->total_bytes);
  EXPECT_EQ(m->total_bytes, dev_->total_bytes());
  EXPECT_EQ(m->reserved_bytes, 0u);
  EXPECT_EQ(m->allocated_bytes, 0u);
  EXPECT_TRUE(m->validate().ok());
  std::printf("%s: total %" PRIu64 " free %" PRIu64 "\n", dev_->name().c_str(), m->total_bytes, m->free_bytes);
}

TEST_F(CudaDeviceTest, AllocationsAreAccountedAndRefusedPastFree) {
  {
    auto a = dev_->allocate(64 * kMiB, Site::weights);
    ASSERT_TRUE(a.ok()) << a.error().message;
    EXPECT_EQ(dev_->accounted_bytes(), 64 * kMiB);
    auto m = dev_->memory();
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->reserved_bytes, 64 * kMiB);  // no allocator hook: the accounted bytes
  }
  EXPECT_EQ(dev_->accounted_bytes(), 0u);
  auto m = dev_->memory();
  ASSERT_TRUE(m.ok());
  auto a = dev_->allocate(m->free_bytes + kGiB, Site::kv_pool);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code, Errc::out_of_memory);
  EXPECT_NE(a.error().message.find("asked"), std::string::npos) << a.error().message;
  EXPECT_NE(a.error().message.find("kv_pool"), std::string::npos) << a.error().message;
  EXPECT_EQ(dev_->accounted_bytes(), 0u);
  EXPECT_FALSE(dev_->lost());
}

TEST_F(CudaDeviceTest, AllocatorStatsHookFeedsTheReading) {
  dev_->set_allocator_stats([] { return std::pair<std::uint64_t, std::uint64_t>{300 * kMiB, 200 * kMiB}; });
  auto m = dev_->memory();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->reserved_bytes, 300 * kMiB);
  EXPECT_EQ(m->allocated_bytes, 200 * kMiB);
  // Cached bytes (reserved - allocated) count as usable for admission: 100 MiB more than the driver reports free.
  {
    auto ok = dev_->allocate(m->free_bytes + 50 * kMiB, Site::kv_pool);
    EXPECT_TRUE(ok.ok()) << ok.error().message;
  }
  auto refused = dev_->allocate(m->free_bytes + 1024 * kMiB, Site::kv_pool);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("cached by the allocator"), std::string::npos) << refused.error().message;
  dev_->set_allocator_stats({});
  m = dev_->memory();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->reserved_bytes, 0u);
}

TEST_F(CudaDeviceTest, HealthProbeFinishesWithinOneSecond) {
  for (int i = 0; i < 3; ++i) {
    const auto s = dev_->health_probe(std::chrono::milliseconds(1000));
    EXPECT_TRUE(s.ok()) << s.error().message;
  }
  EXPECT_EQ(dev_->probes_leaked(), 0u);
  EXPECT_TRUE(dev_->check(Site::decode).ok());
}

TEST_F(CudaDeviceTest, CheckIsOk) {
  EXPECT_TRUE(dev_->check(Site::prefill).ok());
  EXPECT_TRUE(dev_->check(Site::decode).ok());
  EXPECT_FALSE(dev_->lost());
}

TEST_F(CudaDeviceTest, ConcurrentReadingsAndAllocations) {
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto a = dev_->allocate(kMiB, Site::decode);
        EXPECT_TRUE(a.ok());
        EXPECT_TRUE(dev_->memory().ok());
        EXPECT_TRUE(dev_->check(Site::decode).ok());
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(dev_->accounted_bytes(), 0u);
}

// The ballast's one line: "holding N bytes on device D (free before B, after A)".
struct Holding {
  unsigned long long held = 0;
  int dev = -1;
  unsigned long long free_before = 0, free_after = 0;
};
std::optional<Holding> parse_holding(const std::string& line) {
  Holding h;
  if (std::sscanf(line.c_str(), "holding %llu bytes on device %d (free before %llu, after %llu)", &h.held, &h.dev,
                  &h.free_before, &h.free_after) != 4)
    return std::nullopt;
  return h;
}

// The ballast holds 1 GiB: the device-wide free reading drops by at least that (plus the ballast's own CUDA
// context, which is why only a loose upper bound), and comes back when it exits on stdin EOF.
TEST_F(CudaDeviceTest, BallastLowersTheFreeReading) {
  auto before = dev_->memory();
  ASSERT_TRUE(before.ok());
  ASSERT_GT(before->free_bytes, 2 * kGiB) << "not enough free GPU memory for the test";
  Child c = Child::spawn({TANDEM_GPU_BALLAST, "--bytes", "1G", "--device", "0"}, true);
  ASSERT_GT(c.pid, 0);
  const std::string line = c.read_until("\n", std::chrono::seconds(60));
  const auto h = parse_holding(line);
  ASSERT_TRUE(h) << line;
  const auto [held, dev, fb, fa] = *h;
  EXPECT_EQ(held, kGiB);
  EXPECT_EQ(dev, 0);
  EXPECT_NEAR(static_cast<double>(fb - fa), static_cast<double>(kGiB), 64.0 * kMiB) << line;

  auto during = dev_->memory();
  ASSERT_TRUE(during.ok());
  const double drop = static_cast<double>(before->free_bytes) - static_cast<double>(during->free_bytes);
  std::printf("ballast: free %" PRIu64 " -> %" PRIu64 " (drop %.0f MiB)\n", before->free_bytes, during->free_bytes,
              drop / kMiB);
  EXPECT_GE(drop, static_cast<double>(kGiB - 64 * kMiB));
  EXPECT_LE(drop, static_cast<double>(2 * kGiB));
  // Our own admission sees it: asking for everything that was free before now fails.
  auto a = dev_->allocate(before->free_bytes, Site::weights);
  EXPECT_FALSE(a.ok());

  EXPECT_EQ(c.wait_exit(), 0);  // closes its stdin: EOF ends the hold
  std::uint64_t after = 0;
  for (int i = 0; i < 50; ++i) {  // the driver returns the memory shortly after the process exits
    auto m = dev_->memory();
    ASSERT_TRUE(m.ok());
    after = m->free_bytes;
    if (after + 64 * kMiB >= before->free_bytes) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(after + 64 * kMiB, before->free_bytes);
  EXPECT_TRUE(dev_->check(Site::other).ok());
}

TEST_F(CudaDeviceTest, BallastReleasesOnSigterm) {
  Child c = Child::spawn({TANDEM_GPU_BALLAST, "--bytes", "64M"}, true);
  ASSERT_GT(c.pid, 0);
  const std::string line = c.read_until("\n", std::chrono::seconds(60));
  ASSERT_EQ(line.rfind("holding 67108864 bytes on device 0", 0), 0u) << line;
  kill(c.pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(c.pid, &status, 0), c.pid);
  c.pid = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(c.stdin_w);
  close(c.out_r);
}

// --leave N: the ballast takes what leaves N free once its own context exists (tandem-validate's `available = X`).
TEST_F(CudaDeviceTest, BallastLeavesWhatItIsAskedToLeave) {
  Child c = Child::spawn({TANDEM_GPU_BALLAST, "--leave", "1G"}, true);
  ASSERT_GT(c.pid, 0);
  const std::string line = c.read_until("\n", std::chrono::seconds(60));
  const auto h = parse_holding(line);
  ASSERT_TRUE(h) << line;
  const auto [held, dev, fb, fa] = *h;
  EXPECT_EQ(held % (2 * kMiB), 0u);
  EXPECT_NEAR(static_cast<double>(fa), static_cast<double>(kGiB), 64.0 * kMiB) << line;
  auto during = dev_->memory();
  ASSERT_TRUE(during.ok());
  EXPECT_NEAR(static_cast<double>(during->free_bytes), static_cast<double>(kGiB), 64.0 * kMiB);
  EXPECT_EQ(c.wait_exit(), 0);
  const auto r = run_ballast({"--leave", std::to_string(dev_->total_bytes() + kGiB), "--seconds", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("bytes are free"), std::string::npos) << r.output;
}

TEST_F(CudaDeviceTest, BallastRefusesMoreThanTheDeviceHas) {
  const auto r = run_ballast({"--bytes", std::to_string(dev_->total_bytes() + kGiB), "--seconds", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cudaErrorMemoryAllocation"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tandem::device
