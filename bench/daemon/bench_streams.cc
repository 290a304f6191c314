// Continuous batching through the daemon, as clients see it: S concurrent streams (S = 1, 2, 4, 8, 16 by default)
// of the same greedy request submitted at once on one route; aggregate decode tokens/s and p50/p95 inter-token
// latency, each as a ratio to 1 stream measured in the same run. Then a long prompt arriving among 4 decoding
// streams: their worst inter-token gap before, during and after its prefill. Tokens are timed when their JobUpdate
// arrives: run the daemon with [runtime] token_flush_interval_ms = 0 (bench/daemon/streams.sh does).
//   bench_streams --address ADDR [--route cpu|gpu] [--streams 1,2,4,8,16] [--tokens N] [--long N]
//     --per-job 1: each job's placement ETA and actual finish as well
#include <algorithm>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <sdbus-c++/sdbus-c++.h>

#include "io_tandem_Tandem1_proxy.h"

using namespace std::chrono;
using Clock = steady_clock;

namespace {

struct Arrival {
  std::size_t tokens;
  Clock::time_point at;
};

class Client final : public sdbus::ProxyInterfaces<io::tandem::Tandem1_proxy> {
 public:
  explicit Client(sdbus::IConnection& c) : ProxyInterfaces(c, "io.tandem.Tandem1", "/io/tandem/Tandem1") { registerProxy(); }
  ~Client() { unregisterProxy(); }
  bool wait_finished(const std::vector<std::uint64_t>& ids, seconds timeout = seconds(900)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      for (auto id : ids)
        if (!finished_.count(id)) return false;
      return true;
    });
  }
  std::vector<Arrival> arrivals(std::uint64_t id) {
    std::lock_guard lock(mu_);
    return arrivals_[id];
  }
  // The job's "eta" updates: (when, eta_ms).
  std::vector<std::pair<Clock::time_point, double>> etas(std::uint64_t id) {
    std::lock_guard lock(mu_);
    return etas_[id];
  }
  std::string state(std::uint64_t id) {
    std::lock_guard lock(mu_);
    return finished_.count(id) ? finished_[id] : "";
  }

 private:
  void onJobUpdate(const uint64_t& id, const std::string& kind, const std::map<std::string, sdbus::Variant>& data) override {
    const auto now = Clock::now();
    {
      std::lock_guard lock(mu_);
      if (kind == "tokens") arrivals_[id].push_back({data.at("tokens").get<std::vector<std::int32_t>>().size(), now});
      if (kind == "eta") etas_[id].emplace_back(now, static_cast<double>(data.at("eta_ms").get<std::uint64_t>()));
      if (kind == "finished") {
        auto it = data.find("state");
        finished_[id] = it != data.end() ? it->second.get<std::string>() : "finished";
      }
    }
    cv_.notify_all();
  }
  void onDegradedModeChanged(const bool&, const std::string&, const std::map<std::string, sdbus::Variant>&) override {}
  void onModelsChanged(const std::vector<std::string>&, const std::vector<std::string>&) override {}
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, std::vector<Arrival>> arrivals_;
  std::map<std::uint64_t, std::string> finished_;
  std::map<std::uint64_t, std::vector<std::pair<Clock::time_point, double>>> etas_;
};

using Opts = std::map<std::string, sdbus::Variant>;
using Msgs = std::vector<sdbus::Struct<std::string, std::string>>;

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * (v.size() - 1) + 0.5))];
}

// Inter-token gaps of one stream (ms), a multi-token update counted as that many equal gaps.
void gaps(const std::vector<Arrival>& a, std::vector<double>& out, Clock::time_point from = {}, Clock::time_point to = Clock::time_point::max()) {
  for (std::size_t i = 1; i < a.size(); ++i) {
    if (a[i].at < from || a[i].at > to) continue;
    const double g = duration<double, std::milli>(a[i].at - a[i - 1].at).count() / static_cast<double>(a[i].tokens);
    for (std::size_t k = 0; k < a[i].tokens; ++k) out.push_back(g);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string address, route = "cpu", streams_arg = "1,2,4,8,16";
  int tokens = 64, long_prompt = 1500;
  bool per_job = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--address") address = argv[i + 1];
    else if (f == "--route") route = argv[i + 1];
    else if (f == "--streams") streams_arg = argv[i + 1];
    else if (f == "--tokens") tokens = std::atoi(argv[i + 1]);
    else if (f == "--long") long_prompt = std::atoi(argv[i + 1]);
    else if (f == "--per-job") per_job = std::atoi(argv[i + 1]) != 0;
  }
  if (address.empty() || (route != "cpu" && route != "gpu")) {
    std::fprintf(stderr, "usage: bench_streams --address ADDR [--route cpu|gpu] [--streams 1,2,4,8,16] [--tokens N] [--long N] [--per-job 1]\n");
    return 2;
  }
  std::vector<int> streams;
  {
    std::stringstream ss(streams_arg);
    for (std::string t; std::getline(ss, t, ',');) streams.push_back(std::atoi(t.c_str()));
  }
  auto bus = sdbus::createSessionBusConnectionWithAddress(address);
  bus->enterEventLoopAsync();
  Client client(*bus);
  std::string cookie;
  if (route == "cpu") cookie = client.HoldGpu("bench", "bench_streams");  // every job goes to the CPU route
  std::map<std::uint64_t, std::pair<Clock::time_point, double>> eta;  // job → (submitted, predicted finish ms)
  auto submit = [&](const std::string& prompt, int max_tokens) {
    Opts o{{"max_tokens", sdbus::Variant(std::uint32_t(max_tokens))}, {"stop", sdbus::Variant(std::vector<std::string>{})}};
    if (route == "cpu") o.emplace("allow_cpu", sdbus::Variant(true));
    const auto t = Clock::now();
    auto [id, placement] = client.Submit("", prompt, Msgs{}, o);
    auto it = placement.find("eta_ms");
    eta[id] = {t, it != placement.end() ? static_cast<double>(it->second.get<std::uint64_t>()) : -1.0};
    return id;
  };
  const std::string prompt = "Once upon a time";
  (void)client.wait_finished({submit(prompt, 8)});  // warm-up
  std::printf("route %s, %d new tokens per stream, greedy; aggregate = all streams' tokens / (first submit → last finish)\n",
              route.c_str(), tokens);
  std::printf("%8s %12s %8s %12s %8s %12s %8s\n", "streams", "agg tok/s", "ratio", "p50 gap ms", "ratio", "p95 gap ms", "ratio");
  double base_tps = 0, base_p50 = 0, base_p95 = 0;
  for (int s : streams) {
    std::vector<std::uint64_t> ids;
    const auto t0 = Clock::now();
    for (int i = 0; i < s; ++i) ids.push_back(submit(prompt, tokens));
    const auto placed = Clock::now();  // the whole burst is placed
    if (!client.wait_finished(ids)) {
      std::fprintf(stderr, "timed out at %d streams\n", s);
      return 1;
    }
    Clock::time_point last{};
    std::size_t n = 0;
    std::vector<double> g;
    for (auto id : ids) {
      const auto a = client.arrivals(id);
      for (const auto& x : a) n += x.tokens;
      if (!a.empty()) last = std::max(last, a.back().at);
      gaps(a, g);
    }
    const double tps = static_cast<double>(n) / duration<double>(last - t0).count();
    const double p50 = pct(g, .5), p95 = pct(g, .95);
    if (base_tps == 0) base_tps = tps, base_p50 = p50, base_p95 = p95;
    // The placement's eta_ms (finish at the latest, from the step-loop simulation) against the actual finish.
    std::vector<double> err, err_placed;
    for (auto id : ids) {
      const auto a = client.arrivals(id);
      if (a.empty() || eta[id].second < 0) continue;
      const double actual = duration<double, std::milli>(a.back().at - eta[id].first).count();
      if (actual > 0) err.push_back((eta[id].second - actual) / actual * 100.0);
      // The finish the job was told once the whole burst was placed (250 ms after the last submit): its placement's,
      // or the last "eta" update by then.
      auto told = eta[id].first + duration_cast<Clock::duration>(duration<double, std::milli>(eta[id].second));
      for (const auto& [at, ms] : client.etas(id))
        if (at <= placed + milliseconds(250)) told = at + duration_cast<Clock::duration>(duration<double, std::milli>(ms));
      if (actual > 0)
        err_placed.push_back(duration<double, std::milli>(told - a.back().at).count() / actual * 100.0);
      if (per_job && actual > 0)
        std::printf("    job %llu: eta %.0f ms, actual %.0f ms (%+.0f %%)\n", static_cast<unsigned long long>(id),
                    eta[id].second, actual, (eta[id].second - actual) / actual * 100.0);
    }
    auto mean_abs_of = [](const std::vector<double>& v) {
      double m = 0;
      for (double e : v) m += std::abs(e);
      return v.empty() ? 0.0 : m / static_cast<double>(v.size());
    };
    const double mean_abs = mean_abs_of(err);
    std::printf("%8d %12.1f %8.2f %12.2f %8.2f %12.2f %8.2f   ETA error at submit: mean |%.0f %%|, median %+.0f %%; "
                "once the burst is placed: mean |%.0f %%|, median %+.0f %%\n",
                s, tps, tps / base_tps, p50, p50 / base_p50, p95, p95 / base_p95, mean_abs, pct(err, .5),
                mean_abs_of(err_placed), pct(err_placed, .5));
    std::fflush(stdout);
  }
  if (long_prompt > 0) {
    // 4 streams decoding; once each has tokens, a prompt of ~long_prompt tokens arrives.
    std::vector<std::uint64_t> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(submit(prompt, tokens * 2));
    for (int tries = 0; tries < 2000; ++tries) {
      bool all = true;
      for (auto id : ids) all = all && client.arrivals(id).size() >= 4;
      if (all) break;
      std::this_thread::sleep_for(milliseconds(5));
    }
    std::string big;
    while (static_cast<int>(big.size()) < long_prompt * 4) big += " the quick brown fox jumps over the lazy dog";
    big = big.substr(0, static_cast<std::size_t>(long_prompt) * 4);
    const auto t_long = Clock::now();
    const auto lid = submit(big, 4);
    if (!client.wait_finished(ids) || !client.wait_finished({lid})) {
      std::fprintf(stderr, "long-prompt run timed out\n");
      return 1;
    }
    const auto la = client.arrivals(lid);
    const auto first_long = la.empty() ? Clock::now() : la.front().at;
    std::vector<double> before, during;
    for (auto id : ids) {
      const auto a = client.arrivals(id);
      gaps(a, before, {}, t_long);
      gaps(a, during, t_long, first_long);
    }
    const double worst_before = before.empty() ? 0 : *std::max_element(before.begin(), before.end());
    const double worst_during = during.empty() ? 0 : *std::max_element(during.begin(), during.end());
    std::printf("\nlong prompt (%s, ~%d tokens of text) among 4 decoding streams: its first token after %.0f ms (%s)\n",
                client.state(lid).c_str(), long_prompt,
                duration<double, std::milli>(first_long - t_long).count(), "prefilled in step-budget chunks");
    std::printf("  the 4 streams' worst inter-token gap: before it arrived %.1f ms, while it prefilled %.1f ms (ratio %.2f),"
                " p50 while it prefilled %.1f ms\n", worst_before, worst_during,
                worst_before > 0 ? worst_during / worst_before : 0, pct(during, .5));
  }
  if (!cookie.empty()) client.ReleaseGpu(cookie);
  return 0;
}
