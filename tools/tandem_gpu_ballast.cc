// tandem-gpu-ballast: "the other program" for real-GPU tests. Commits N bytes of GPU memory (cudaMalloc +
// cudaMemset, so the pages are really backed), prints one line, and holds them until SIGTERM/SIGINT, EOF on stdin
// (when stdin is a pipe, socket or terminal), or --seconds. With --leave N instead of --bytes it commits what leaves
// N bytes free once its own CUDA context exists (hundreds of MiB on large GPUs, which a size computed beforehand
// would not know). Exit: 0 done, 1 CUDA failure (allocation refused, ...),
// 2 usage, 77 no GPU (the automake "skipped" code, so test harnesses can skip).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "cli_args.h"
#include "device/cuda.h"

namespace {

const char* kUsage =
    "usage: tandem-gpu-ballast --bytes N[K|M|G] | --leave N[K|M|G] [--device I] [--seconds S]\n"
    "  --bytes N     GPU memory to commit; K/M/G suffixes are powers of 1024\n"
    "  --leave N     commit what leaves N bytes free (after this program's own CUDA context)\n"
    "  --device I    CUDA device index (default 0)\n"
    "  --seconds S   release and exit after S seconds (default: hold until SIGTERM/SIGINT or stdin EOF)\n"
    "exit: 0 released, 1 CUDA error, 2 usage, 77 no GPU\n";

int g_wake_fd = -1;

void on_signal(int) {
  const char c = 's';
  [[maybe_unused]] auto n = write(g_wake_fd, &c, 1);
}

std::uint64_t parse_bytes(std::string_view flag, std::string_view text) {
  std::uint64_t mult = 1;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K': case 'k': mult = 1ull << 10; break;
      case 'M': case 'm': mult = 1ull << 20; break;
      case 'G': case 'g': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) text.remove_suffix(1);
  }
  const std::uint64_t limit = (1ull << 50) / mult;  // 1 PiB: far beyond any GPU, no overflow
  return tandem::cli::parse_number<std::uint64_t>(flag, text, 1, limit) * mult;
}

// EOF on stdin ends the hold only when stdin can deliver one meaningfully (a pipe from the test harness, a
// socket, a terminal); /dev/null or a file (a backgrounded shell job) would end it at once.
bool watch_stdin() {
  struct stat st {};
  if (fstat(STDIN_FILENO, &st) != 0) return false;
  return S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || isatty(STDIN_FILENO);
}

int cuda_fail(const char* what, cudaError_t e) {
  std::fprintf(stderr, "tandem-gpu-ballast: %s: %s\n", what, tandem::device::cuda_error_text(e).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  std::uint64_t bytes = 0, leave = 0;
  bool leave_given = false;
  int device = 0;
  int seconds = -1;
  try {
    cli::Args a(argc, argv);
    while (a.next()) {
      const auto f = a.flag();
      if (f == "--bytes") bytes = parse_bytes(f, a.value());
      else if (f == "--leave") {
        leave = parse_bytes(f, a.value());
        leave_given = true;
      }
      else if (f == "--device") device = cli::parse_number<int>(f, a.value(), 0, 1023);
      else if (f == "--seconds") seconds = cli::parse_number<int>(f, a.value(), 0, 365 * 24 * 3600);
      else if (f == "-h" || f == "--help") { std::fputs(kUsage, stdout); return 0; }
      else throw cli::ArgError{"unknown option " + std::string(f)};
    }
    if (bytes == 0 && !leave_given) throw cli::ArgError{"--bytes N or --leave N is required"};
    if (bytes != 0 && leave_given) throw cli::ArgError{"--bytes and --leave exclude each other"};
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-gpu-ballast: %s\n%s", e.message.c_str(), kUsage);
    return 2;
  }

  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess && device::cuda_error_means_no_device(e)) {
    std::fprintf(stderr, "tandem-gpu-ballast: no CUDA device: %s\n", device::cuda_error_text(e).c_str());
    return 77;
  }
  if (e != cudaSuccess) return cuda_fail("cudaGetDeviceCount", e);
  if (count == 0) {
    std::fprintf(stderr, "tandem-gpu-ballast: no CUDA device: the driver reports 0 devices\n");
    return 77;
  }
  if (device >= count) {
    std::fprintf(stderr, "tandem-gpu-ballast: --device %d: the driver reports %d device(s)\n", device, count);
    return 2;
  }

  // Signals go to a self-pipe the hold loop polls (installed before the allocation so an early SIGTERM is not lost).
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("tandem-gpu-ballast: pipe2");
    return 1;
  }
  g_wake_fd = pipe_fds[1];
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  if ((e = cudaSetDevice(device)) != cudaSuccess) {
    if (device::cuda_error_means_no_device(e)) {
      std::fprintf(stderr, "tandem-gpu-ballast: no CUDA device: %s\n", device::cuda_error_text(e).c_str());
      return 77;
    }
    return cuda_fail("cudaSetDevice", e);
  }
  std::size_t free_before = 0, free_after = 0, total = 0;
  if ((e = cudaMemGetInfo(&free_before, &total)) != cudaSuccess) return cuda_fail("cudaMemGetInfo", e);
  if (leave_given) {
    if (free_before <= leave + (2u << 20)) {  // less than 2 MiB (one driver page) to take: nothing to hold
      std::fprintf(stderr, "tandem-gpu-ballast: --leave %llu: only %zu bytes are free\n",
                   static_cast<unsigned long long>(leave), free_before);
      return 1;
    }
    bytes = (free_before - leave) & ~((std::uint64_t{2} << 20) - 1);  // whole 2 MiB pages
  }
  void* p = nullptr;
  if ((e = cudaMalloc(&p, bytes)) != cudaSuccess) {
    std::fprintf(stderr, "tandem-gpu-ballast: cudaMalloc of %llu bytes on device %d (%zu free of %zu): %s\n",
                 static_cast<unsigned long long>(bytes), device, free_before, total,
                 device::cuda_error_text(e).c_str());
    return 1;
  }
  if ((e = cudaMemset(p, 0x5A, bytes)) != cudaSuccess) return cuda_fail("cudaMemset", e);
  if ((e = cudaDeviceSynchronize()) != cudaSuccess) return cuda_fail("cudaDeviceSynchronize", e);
  if ((e = cudaMemGetInfo(&free_after, &total)) != cudaSuccess) return cuda_fail("cudaMemGetInfo", e);
  std::printf("holding %llu bytes on device %d (free before %zu, after %zu)\n", static_cast<unsigned long long>(bytes),
              device, free_before, free_after);
  std::fflush(stdout);

  const bool stdin_watched = watch_stdin();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds < 0 ? 0 : seconds);
  for (bool done = false; !done;) {
    pollfd fds[2] = {{pipe_fds[0], POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
    int timeout_ms = -1;
    if (seconds >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      timeout_ms = static_cast<int>(std::min<long long>(left.count(), 1 << 30));
    }
    const int n = poll(fds, stdin_watched ? 2 : 1, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::perror("tandem-gpu-ballast: poll");
      break;
    }
    if (fds[0].revents) done = true;  // a signal
    if (stdin_watched && fds[1].revents) {
      char buf[256];
      const ssize_t r = read(STDIN_FILENO, buf, sizeof buf);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) done = true;  // EOF (or stdin gone)
    }
  }
  if ((e = cudaFree(p)) != cudaSuccess) return cuda_fail("cudaFree", e);
  return 0;
}
