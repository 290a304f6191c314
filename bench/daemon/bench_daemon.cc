// Figures of tandemd as a client sees them, each as a ratio against a baseline measured in the same run:
//   1. D-Bus round trip: Submit (accept + journal fdatasync + reply) vs org.freedesktop.DBus.Peer.Ping to the
//      same daemon (the bus's own floor) and vs GetJob (a method without the journal);
//   2. decode tokens/s through the daemon (JobUpdate signals, CPU route and GPU route) vs the engine in this
//      process on the same model, same threads, same greedy request;
//   3. recovery: device lost during a GPU job → the first token on the CPU (migration), and → a new job's first
//      token;
//   4. daemon RSS beyond the model weights.
// Needs a running tandemd with --testing on a simulated accelerator (bench/daemon/run.sh starts one) and the same
// model directory:  bench_daemon --address unix:path=... --model DIR [--tokens N] [--rounds N]
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sdbus-c++/sdbus-c++.h>

#include "engine/generation.h"
#include "engine/model.h"
#include "io_tandem_Tandem1_proxy.h"

using namespace std::chrono;
using Clock = steady_clock;

namespace {

struct Update {
  std::string kind;
  std::map<std::string, sdbus::Variant> data;
  Clock::time_point at;
};

class Client final : public sdbus::ProxyInterfaces<io::tandem::Tandem1_proxy> {
 public:
  Client(sdbus::IConnection& c) : ProxyInterfaces(c, "io.tandem.Tandem1", "/io/tandem/Tandem1") { registerProxy(); }
  ~Client() { unregisterProxy(); }

  std::vector<Update> wait_finished(std::uint64_t id, seconds timeout = seconds(120)) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, timeout, [&] {
      auto& v = updates_[id];
      return !v.empty() && v.back().kind == "finished";
    });
    return updates_[id];
  }
  Clock::time_point wait_kind(std::uint64_t id, const std::string& kind, seconds timeout = seconds(60)) {
    std::unique_lock lock(mu_);
    Clock::time_point at{};
    cv_.wait_for(lock, timeout, [&] {
      for (const auto& u : updates_[id])
        if (u.kind == kind) {
          at = u.at;
          return true;
        }
      return false;
    });
    return at;
  }
  std::vector<Update> updates(std::uint64_t id) {
    std::lock_guard lock(mu_);
    return updates_[id];
  }
  sdbus::IProxy& proxy() { return getProxy(); }

 private:
  void onJobUpdate(const uint64_t& id, const std::string& kind, const std::map<std::string, sdbus::Variant>& data) override {
    {
      std::lock_guard lock(mu_);
      updates_[id].push_back({kind, data, Clock::now()});
    }
    cv_.notify_all();
  }
  void onDegradedModeChanged(const bool&, const std::string&, const std::map<std::string, sdbus::Variant>&) override {}
  void onModelsChanged(const std::vector<std::string>&, const std::vector<std::string>&) override {}

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, std::vector<Update>> updates_;
};

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * (v.size() - 1) + 0.5))];
}

double us_since(Clock::time_point t0) { return duration<double, std::micro>(Clock::now() - t0).count(); }

using Opts = std::map<std::string, sdbus::Variant>;
using Msgs = std::vector<sdbus::Struct<std::string, std::string>>;

void testing_call(sdbus::IConnection& c, const char* method, auto... args) {
  auto p = sdbus::createProxy(c, "io.tandem.Tandem1", "/io/tandem/Tandem1");
  p->callMethod(method).onInterface("io.tandem.Tandem1.Testing").withArguments(args...);
}

}  // namespace

int main(int argc, char** argv) {
  std::string address, model_dir;
  int tokens = 128, rounds = 200, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--address") address = argv[i + 1];
    else if (f == "--model") model_dir = argv[i + 1];
    else if (f == "--tokens") tokens = std::atoi(argv[i + 1]);
    else if (f == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (f == "--threads") threads = std::atoi(argv[i + 1]);
  }
  if (address.empty() || model_dir.empty()) {
    std::fprintf(stderr, "usage: bench_daemon --address ADDR --model DIR [--tokens N] [--rounds N] [--threads N]\n");
    return 2;
  }
  auto conn = sdbus::createSessionBusConnectionWithAddress(address);
  Client client(*conn);
  conn->enterEventLoopAsync();
  const std::string prompt = "This program is free software; you can";

  // 1. Round trips.
  std::vector<double> ping, submit, getjob;
  std::uint64_t last = 0;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    client.proxy().callMethod("Ping").onInterface("org.freedesktop.DBus.Peer");
    ping.push_back(us_since(t0));
    Opts o{{"max_tokens", sdbus::Variant(std::uint32_t{1})}, {"stream", sdbus::Variant(false)}};
    t0 = Clock::now();
    auto [id, placement] = client.Submit("", prompt, Msgs{}, o);
    submit.push_back(us_since(t0));
    last = id;
    t0 = Clock::now();
    (void)client.GetJob(id);
    getjob.push_back(us_since(t0));
    client.wait_finished(id);
  }
  std::printf("round trip (%d rounds)        p50 µs   p99 µs   p50 ratio vs Ping\n", rounds);
  std::printf("  Peer.Ping (baseline)     %8.1f %8.1f   1.00\n", pct(ping, .5), pct(ping, .99));
  std::printf("  GetJob                   %8.1f %8.1f   %.2f\n", pct(getjob, .5), pct(getjob, .99), pct(getjob, .5) / pct(ping, .5));
  std::printf("  Submit (journal synced)  %8.1f %8.1f   %.2f\n", pct(submit, .5), pct(submit, .99), pct(submit, .5) / pct(ping, .5));
  (void)last;

  // 2. Decode rate: in-process engine (baseline) vs through the daemon.
  double engine_tps = 0;
  {
    tandem::engine::LoadOptions lo;
    lo.threads = threads;
    auto m = tandem::engine::Model::load(model_dir, lo);
    if (!m) {
      std::fprintf(stderr, "bench_daemon: %s\n", m.error().message.c_str());
      return 1;
    }
    tandem::engine::GenerateRequest req;
    req.prompt = (*m)->encode_text(prompt);
    req.max_new_tokens = tokens;
    req.stop_at_eos = false;
    double best = 0;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = Clock::now();
      auto g = tandem::engine::generate(*m, req);
      const double s = duration<double>(Clock::now() - t0).count();
      if (g) best = std::max(best, static_cast<double>((*g)->tokens().size()) / s);
    }
    engine_tps = best;
  }
  auto daemon_rate = [&](bool cpu) {
    double best = 0;
    for (int r = 0; r < 3; ++r) {
      Opts o{{"max_tokens", sdbus::Variant(std::uint32_t(tokens))}};
      if (cpu) o.emplace("allow_cpu", sdbus::Variant(true));
      const auto t0 = Clock::now();
      auto [id, placement] = client.Submit("", prompt, Msgs{}, o);
      auto ups = client.wait_finished(id);
      const double s = duration<double>(ups.back().at - t0).count();
      std::size_t n = 0;
      for (const auto& u : ups)
        if (u.kind == "tokens") n += u.data.at("tokens").get<std::vector<std::int32_t>>().size();
      if (n > 0) best = std::max(best, n / s);
    }
    return best;
  };
  const double gpu_tps = daemon_rate(false);
  // CPU route: hold the GPU so jobs go to the CPU.
  std::string cookie = client.HoldGpu("bench", "bench_daemon");
  const double cpu_tps = daemon_rate(true);
  client.ReleaseGpu(cookie);
  std::printf("\nend-to-end tokens/s (prompt + %d tokens, greedy, best of 3; submit → finished) tok/s   ratio vs engine\n", tokens);
  std::printf("  engine in this process (baseline)          %7.1f   1.00\n", engine_tps);
  std::printf("  tandemd, simulated-GPU route               %7.1f   %.2f\n", gpu_tps, gpu_tps / engine_tps);
  std::printf("  tandemd, CPU route (GPU held)              %7.1f   %.2f\n", cpu_tps, cpu_tps / engine_tps);

  // 3. Recovery from a device loss.
  {
    std::this_thread::sleep_for(milliseconds(1500));  // the hold's degraded state clears (recover_after)
    Opts o{{"max_tokens", sdbus::Variant(std::uint32_t(tokens))}};
    auto [id, placement] = client.Submit("", prompt, Msgs{}, o);
    client.wait_kind(id, "tokens");
    const auto lost_at = Clock::now();
    testing_call(*conn, "LoseDevice");
    // First token after the loss that came from the CPU run (after the "migrated" update).
    Clock::time_point migrated = client.wait_kind(id, "migrated");
    Clock::time_point first_cpu{};
    auto ups = client.wait_finished(id);
    bool after = false;
    for (const auto& u : ups) {
      if (u.kind == "migrated") after = true;
      if (after && u.kind == "tokens") {
        first_cpu = u.at;
        break;
      }
    }
    auto [id2, p2] = client.Submit("", prompt, Msgs{}, Opts{{"max_tokens", sdbus::Variant(std::uint32_t{4})}});
    const auto submit2 = Clock::now();
    const auto first2 = client.wait_kind(id2, "tokens");
    client.wait_finished(id2);
    std::printf("\nrecovery from a device loss (simulated driver reset)\n");
    if (migrated != Clock::time_point{} && first_cpu != Clock::time_point{})
      std::printf("  loss -> migrated update                    %8.1f ms\n  loss -> first CPU token of the running job %8.1f ms\n",
                  duration<double, std::milli>(migrated - lost_at).count(),
                  duration<double, std::milli>(first_cpu - lost_at).count());
    else
      std::printf("  the running job did not migrate (finished before the loss?)\n");
    std::printf("  new job after the loss: submit -> first token %.1f ms\n",
                duration<double, std::milli>(first2 - submit2).count());
    testing_call(*conn, "RecoverDevice");
  }

  // 4. RSS beyond the model.
  {
    auto hm = client.HostMemory();
    const auto rss = hm.at("daemon_rss").get<std::uint64_t>();
    std::uint64_t weights = 0;
    for (const auto& m : client.ListModels()) weights += m.at("weight_bytes").get<std::uint64_t>();
    std::printf("\ndaemon RSS %.1f MiB; model weights (mmap'd, GPU copy on the simulated device is host memory too) %.1f MiB\n",
                rss / 1048576.0, weights / 1048576.0);
  }
  conn->leaveEventLoop();
  return 0;
}
