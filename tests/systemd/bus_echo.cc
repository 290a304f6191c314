// tandem_test_bus_echo ADDRESS NAME [SECONDS]: a stand-in for tandemd on a private bus, for the D-Bus policy test
// (tests/systemd/dbus_policy.sh). busctl, gdbus and dbus-send cannot keep a well-known name, so this does: it
// connects to ADDRESS, requests NAME and prints "owned NAME" (exit 0 later) or "denied NAME: <error>" (exit 3).
// It then answers every method call addressed to it with an empty reply, so a caller sees either that reply (the bus
// delivered the call) or the bus's AccessDenied (the policy refused it). A call to io.tandem.Tandem1.ListModels also
// broadcasts io.tandem.Tandem1.DegradedModeChanged(false, "", {}) so the test can check that signals are received.
// Exits after SECONDS (default 60) or on SIGTERM/SIGINT.
#include <systemd/sd-bus.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>

namespace {

volatile std::sig_atomic_t g_stop = 0;

void on_signal(int) { g_stop = 1; }

std::uint64_t now_us() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000u + static_cast<std::uint64_t>(ts.tv_nsec) / 1000u;
}

int on_message(sd_bus_message* m, void*, sd_bus_error*) {
  if (sd_bus_message_is_method_call(m, nullptr, nullptr) <= 0) return 0;
  const char* iface = sd_bus_message_get_interface(m);
  const char* member = sd_bus_message_get_member(m);
  if (iface != nullptr && member != nullptr && std::string_view(iface) == "io.tandem.Tandem1" &&
      std::string_view(member) == "ListModels") {
    sd_bus* bus = sd_bus_message_get_bus(m);
    int r = sd_bus_emit_signal(bus, "/io/tandem/Tandem1", "io.tandem.Tandem1", "DegradedModeChanged", "bsa{sv}", 0,
                               "", 0);
    if (r < 0) std::fprintf(stderr, "emit: %s\n", std::strerror(-r));
  }
  int r = sd_bus_reply_method_return(m, nullptr);
  if (r < 0) std::fprintf(stderr, "reply: %s\n", std::strerror(-r));
  return 1;  // handled: nothing else in sd-bus answers it
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s ADDRESS NAME [SECONDS]\n", argv[0]);
    return 2;
  }
  const char* address = argv[1];
  const char* name = argv[2];
  const long seconds = argc == 4 ? std::strtol(argv[3], nullptr, 10) : 60;
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);

  sd_bus* bus = nullptr;
  int r = sd_bus_new(&bus);
  if (r >= 0) r = sd_bus_set_address(bus, address);
  if (r >= 0) r = sd_bus_set_bus_client(bus, 1);
  if (r >= 0) r = sd_bus_start(bus);
  if (r < 0) {
    std::fprintf(stderr, "connect %s: %s\n", address, std::strerror(-r));
    return 2;
  }
  r = sd_bus_add_filter(bus, nullptr, on_message, nullptr);
  if (r < 0) {
    std::fprintf(stderr, "filter: %s\n", std::strerror(-r));
    return 2;
  }
  r = sd_bus_request_name(bus, name, 0);
  if (r < 0) {
    std::printf("denied %s: %s\n", name, std::strerror(-r));
    std::fflush(stdout);
    sd_bus_flush_close_unref(bus);
    return 3;
  }
  std::printf("owned %s\n", name);
  std::fflush(stdout);

  const std::uint64_t deadline = now_us() + static_cast<std::uint64_t>(seconds) * 1000000u;
  while (!g_stop) {
    r = sd_bus_process(bus, nullptr);
    if (r < 0) {
      std::fprintf(stderr, "process: %s\n", std::strerror(-r));
      break;
    }
    if (r > 0) continue;
    const std::uint64_t t = now_us();
    if (t >= deadline) break;
    const std::uint64_t wait = deadline - t < 200000u ? deadline - t : 200000u;  // wake up to notice signals
    r = sd_bus_wait(bus, wait);
    if (r < 0 && r != -EINTR) {
      std::fprintf(stderr, "wait: %s\n", std::strerror(-r));
      break;
    }
  }
  sd_bus_flush_close_unref(bus);
  return r < 0 && r != -EINTR ? 1 : 0;
}
