// Ring sessions vs D-Bus, as a client sees them; every figure is a ratio against a baseline from the same run:
//   1. hand-off: submit → `accepted` through the ring vs the D-Bus Submit call (same request, rounds interleaved),
//      plus the ring's own floor (nop → nop completion);
//   2. burst: 48 submissions in flight, submit → all accepted, ring vs D-Bus (calls one after another), and how many
//      journal fdatasyncs the daemon made meanwhile (group commit: one per loop iteration);
//   3. decode tokens/s streamed through the ring and through JobUpdate signals vs the engine loop in this process
//      (same model, same greedy request, best of 3);
//   4. idle CPU: the daemon's CPU time over 5 s with an open idle session vs 5 s with none, and this client's CPU
//      time while it waits on the idle session.
// Needs a running tandemd with a simulated accelerator (bench/ring/run.sh starts one) and its model directory:
//   bench_ring --address unix:path=... --model DIR --daemon-pid PID [--tokens N] [--rounds N]
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/ring_session.h"
#include "engine/generation.h"
#include "engine/model.h"

using namespace std::chrono;
using Clock = steady_clock;
namespace tc = tandem::client;

namespace {

double us_since(Clock::time_point t0) { return duration<double, std::micro>(Clock::now() - t0).count(); }

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_ring: %s\n", what.c_str());
  std::exit(1);
}

template <class T>
T must(tandem::Result<T> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().message);
  return std::move(r).value();
}
void must(tandem::Result<void> r, const char* what) {
  if (!r) die(std::string(what) + ": " + r.error().message);
}

// CPU seconds (user + system) of a process from /proc/<pid>/stat.
double cpu_seconds(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double own_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Events read from the ring but not yet asked for (a fast job's accepted and finished can come in one batch).
std::deque<tc::RingEvent> g_pending;

// Waits for the ring event matching pred; earlier non-matching events stay pending (or go to `others`).
template <class P>
tc::RingEvent ring_wait_for(tc::RingSession& s, P pred, std::vector<tc::RingEvent>* others = nullptr) {
  for (;;) {
    for (auto it = g_pending.begin(); it != g_pending.end(); ++it)
      if (pred(*it)) {
        tc::RingEvent hit = std::move(*it);
        if (others) {
          for (auto jt = g_pending.begin(); jt != it; ++jt) others->push_back(std::move(*jt));
          g_pending.erase(g_pending.begin(), std::next(it));
        } else {
          g_pending.erase(it);
        }
        return hit;
      }
    std::vector<tc::RingEvent> evs;
    must(s.wait(evs, seconds(30)), "ring wait");
    if (evs.empty() && !s.open()) die("ring session ended: " + s.state_text());
    for (auto& e : evs) g_pending.push_back(std::move(e));
  }
}

// D-Bus: waits until the job's finished JobUpdate arrived; returns its updates (tokens counted by the caller).
std::vector<tc::JobUpdate> dbus_wait_finished(tc::Client& c, std::uint64_t job, std::vector<Clock::time_point>* at) {
  std::vector<tc::JobUpdate> all;
  const auto deadline = Clock::now() + seconds(60);
  for (;;) {
    for (auto& u : c.take_job_updates(job)) {
      if (at) at->push_back(Clock::now());
      all.push_back(std::move(u));
    }
    if (!all.empty() && all.back().kind == "finished") return all;
    if (Clock::now() > deadline) die("no finished update for job " + std::to_string(job));
    must(c.process(milliseconds(100)), "process");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string address, model_dir;
  int tokens = 256, rounds = 300, daemon_pid = 0, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--address") address = argv[i + 1];
    else if (f == "--model") model_dir = argv[i + 1];
    else if (f == "--tokens") tokens = std::atoi(argv[i + 1]);
    else if (f == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (f == "--daemon-pid") daemon_pid = std::atoi(argv[i + 1]);
    else if (f == "--threads") threads = std::atoi(argv[i + 1]);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (address.empty() || model_dir.empty() || daemon_pid <= 0) {
    std::fprintf(stderr, "usage: bench_ring --address ADDR --model DIR --daemon-pid PID [--tokens N] [--rounds N]\n");
    return 2;
  }
  auto client = must(tc::Client::connect(tc::BusSpec{tc::BusKind::address, address}), "connect");
  must(client->subscribe(), "subscribe");
  auto ring = must(tc::RingSession::open(*client), "OpenSession");
  const std::string prompt = "This program is free software; you can";

  // 1. Hand-off latency, rounds interleaved (ring, D-Bus, ring nop), each job run to its end before the next.
  std::vector<double> ring_submit, dbus_submit, ring_nop;
  tc::Request one;
  one.prompt = prompt;
  one.options.max_tokens = 1;
  one.options.temperature = 0.0;
  one.options.stream = false;
  for (int i = 0; i < rounds; ++i) {
    const std::uint64_t ud = 1000 + static_cast<std::uint64_t>(i);
    auto t0 = Clock::now();
    must(ring->nop(ud), "nop");
    ring_wait_for(*ring, [&](const tc::RingEvent& e) { return e.user_data == ud && e.kind == "nop"; });
    ring_nop.push_back(us_since(t0));

    t0 = Clock::now();
    must(ring->submit(one, ud), "ring submit");
    auto acc = ring_wait_for(*ring, [&](const tc::RingEvent& e) { return e.user_data == ud && (e.accepted || e.error); });
    ring_submit.push_back(us_since(t0));
    if (acc.error) die("ring submit refused: " + acc.error->describe());
    const auto job = acc.job_id;
    ring_wait_for(*ring, [&](const tc::RingEvent& e) { return e.job_id == job && e.kind == "finished"; });

    t0 = Clock::now();
    auto sub = must(client->submit(one), "D-Bus Submit");
    dbus_submit.push_back(us_since(t0));
    dbus_wait_finished(*client, sub.job_id, nullptr);
  }
  std::printf("hand-off, %d rounds (max_tokens 1; each job finished before the next)   p50 µs   p99 µs   p50 speed-up\n",
              rounds);
  std::printf("  D-Bus Submit call → reply (baseline)                            %8.1f %8.1f   1.0×\n",
              pct(dbus_submit, .5), pct(dbus_submit, .99));
  std::printf("  ring submit → accepted completion                              %8.1f %8.1f   %.1f×\n",
              pct(ring_submit, .5), pct(ring_submit, .99), pct(dbus_submit, .5) / pct(ring_submit, .5));
  std::printf("  ring nop → nop completion (the ring's floor)                   %8.1f %8.1f   %.1f×\n",
              pct(ring_nop, .5), pct(ring_nop, .99), pct(dbus_submit, .5) / pct(ring_nop, .5));

  // 1b. An active client: back-to-back round trips, each sent as soon as the previous answer arrived (both sides
  // are then inside their spin windows).
  {
    std::vector<double> nop_hot, ring_hot, dbus_hot;
    for (int i = 0; i < 2000; ++i) {
      const std::uint64_t ud = 200000 + static_cast<std::uint64_t>(i);
      const auto t0 = Clock::now();
      must(ring->nop(ud), "nop");
      ring_wait_for(*ring, [&](const tc::RingEvent& e) { return e.user_data == ud && e.kind == "nop"; });
      nop_hot.push_back(us_since(t0));
    }
    const int n = 40;  // under [runtime] max_jobs_per_client (64): the jobs queue behind each other
    std::vector<tc::RingEvent> later;
    std::vector<std::uint64_t> ring_ids, dbus_ids;
    for (int i = 0; i < n; ++i) {
      const std::uint64_t ud = 300000 + static_cast<std::uint64_t>(i);
      const auto t0 = Clock::now();
      must(ring->submit(one, ud), "ring submit");
      auto acc = ring_wait_for(
          *ring, [&](const tc::RingEvent& e) { return e.user_data == ud && (e.accepted || e.error); }, &later);
      ring_hot.push_back(us_since(t0));
      if (acc.error) die("ring submit refused: " + acc.error->describe());
      ring_ids.push_back(acc.job_id);
    }
    std::set<std::uint64_t> open(ring_ids.begin(), ring_ids.end());
    for (auto& e : later)
      if (e.kind == "finished") open.erase(e.job_id);
    while (!open.empty()) {
      auto e = ring_wait_for(*ring, [&](const tc::RingEvent& x) { return x.kind == "finished" && open.count(x.job_id); });
      open.erase(e.job_id);
    }
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      dbus_ids.push_back(must(client->submit(one), "D-Bus Submit").job_id);
      dbus_hot.push_back(us_since(t0));
    }
    for (auto id : dbus_ids) dbus_wait_finished(*client, id, nullptr);
    std::printf("\nan active client: back to back, the next request as soon as the answer came   p50 µs   p99 µs   p50 speed-up\n");
    std::printf("  D-Bus Submit call → reply, %d in a row (baseline)                    %8.1f %8.1f   1.0×\n", n,
                pct(dbus_hot, .5), pct(dbus_hot, .99));
    std::printf("  ring submit → accepted, %d in a row                                   %8.1f %8.1f   %.1f×\n", n,
                pct(ring_hot, .5), pct(ring_hot, .99), pct(dbus_hot, .5) / pct(ring_hot, .5));
    std::printf("  ring nop → nop, 2000 in a row                                         %8.1f %8.1f   %.1f×\n",
                pct(nop_hot, .5), pct(nop_hot, .99), pct(dbus_hot, .5) / pct(nop_hot, .5));
  }

  // 2. Burst: 48 jobs submitted back to back; time until every one is accepted.
  {
    g_pending.clear();  // leftovers of earlier rounds (their jobs have finished)
    const int burst = 48;  // under [runtime] max_jobs_per_client (64)
    tc::Request r = one;
    auto t0 = Clock::now();
    std::vector<std::uint64_t> ids;
    for (int i = 0; i < burst; ++i) ids.push_back(must(client->submit(r), "D-Bus Submit").job_id);
    const double dbus_ms = us_since(t0) / 1000;
    for (auto id : ids) dbus_wait_finished(*client, id, nullptr);
    // The daemon's journal counters (Testing.GetCounters) around the ring burst: how many fdatasyncs it took.
    auto journal_counter = [&](const char* k) -> std::uint64_t {
      auto c = client->counters();
      if (!c) return 0;
      auto it = c->find(k);
      return it == c->end() ? 0 : it->second;
    };
    const std::uint64_t syncs_before = journal_counter("journal_fdatasyncs");
    t0 = Clock::now();
    int accepted = 0, sent = 0;
    std::vector<tc::RingEvent> evs;
    std::vector<std::uint64_t> rids;
    std::set<std::uint64_t> done;  // finished events can come in the same batch as accepted ones
    while (accepted < burst) {
      while (sent < burst) {
        auto st = ring->submit(r, 50000 + static_cast<std::uint64_t>(sent));
        if (!st) break;  // ring full: reap first
        ++sent;
      }
      evs.clear();
      must(ring->wait(evs, seconds(30)), "ring wait");
      for (auto& e : evs)
        if (e.accepted) {
          ++accepted;
          rids.push_back(e.job_id);
        } else if (e.error) {
          die("burst: " + e.error->describe());
        } else if (e.kind == "finished") {
          done.insert(e.job_id);
        }
    }
    const double ring_ms = us_since(t0) / 1000;
    const std::uint64_t burst_syncs = journal_counter("journal_fdatasyncs") - syncs_before;
    std::set<std::uint64_t> open;
    for (auto id : rids)
      if (!done.count(id)) open.insert(id);
    while (!open.empty()) {
      evs.clear();
      must(ring->wait(evs, seconds(30)), "ring wait");
      for (auto& e : evs)
        if (e.kind == "finished") open.erase(e.job_id);
    }
    std::printf("\nburst of %d submissions → all accepted              ms      per job µs   speed-up\n", burst);
    std::printf("  D-Bus Submit, one call after another (baseline)   %8.1f   %8.1f     1.0×\n", dbus_ms,
                dbus_ms * 1000 / burst);
    std::printf("  ring, pipelined                                   %8.1f   %8.1f     %.1f×\n", ring_ms,
                ring_ms * 1000 / burst, dbus_ms / ring_ms);
    std::printf("  journal fdatasyncs while the ring burst was accepted (group commit; its jobs' outcomes share them): "
                "%llu for %d accepts\n",
                static_cast<unsigned long long>(burst_syncs), burst);
  }

  // 3. Decode rate: the engine in this process (baseline) vs streamed through the ring and through D-Bus signals.
  // The three alternate, 5 rounds, best of each: this machine's speed drifts by up to 2x between runs.
  double engine_tps = 0;
  tandem::engine::LoadOptions lo;
  lo.threads = threads;
  auto model = tandem::engine::Model::load(model_dir, lo);
  if (!model) die(model.error().message);
  tandem::engine::GenerateRequest ereq;
  ereq.prompt = (*model)->encode_text(prompt);
  ereq.max_new_tokens = tokens;
  ereq.stop_at_eos = false;
  tc::Request longreq;
  longreq.prompt = prompt;
  longreq.options.max_tokens = static_cast<std::uint32_t>(tokens);
  longreq.options.temperature = 0.0;
  double ring_tps = 0, dbus_tps = 0;
  for (int r = 0; r < 5; ++r) {
    {
      const auto t0 = Clock::now();
      auto g = tandem::engine::generate(*model, ereq);
      const double secs = duration<double>(Clock::now() - t0).count();
      if (g) engine_tps = std::max(engine_tps, static_cast<double>((*g)->tokens().size()) / secs);
    }
    const std::uint64_t ud = 90000 + static_cast<std::uint64_t>(r);
    const auto t0 = Clock::now();
    must(ring->submit(longreq, ud), "ring submit");
    std::size_t n = 0;
    for (bool done = false; !done;) {
      std::vector<tc::RingEvent> evs;
      must(ring->wait(evs, seconds(30)), "ring wait");
      for (auto& e : evs) {
        if (e.user_data != ud) continue;
        if (e.error) die("ring: " + e.error->describe());
        if (e.update && e.update->tokens) n += e.update->tokens->size();
        if (e.kind == "finished") done = true;
      }
    }
    ring_tps = std::max(ring_tps, static_cast<double>(n) / duration<double>(Clock::now() - t0).count());

    const auto t1 = Clock::now();
    auto sub = must(client->submit(longreq), "D-Bus Submit");
    auto ups = dbus_wait_finished(*client, sub.job_id, nullptr);
    std::size_t m = 0;
    for (const auto& u : ups)
      if (u.tokens) m += u.tokens->size();
    dbus_tps = std::max(dbus_tps, static_cast<double>(m) / duration<double>(Clock::now() - t1).count());
  }
  std::printf("\ndecode, prompt + %d tokens, greedy, best of 5 alternating (submit → finished)      tok/s   ratio vs engine\n",
              tokens);
  std::printf("  engine loop in this process (baseline)                             %7.1f   1.00\n", engine_tps);
  std::printf("  tandemd → ring session                                             %7.1f   %.2f\n", ring_tps,
              ring_tps / engine_tps);
  std::printf("  tandemd → JobUpdate signals (D-Bus)                                %7.1f   %.2f\n", dbus_tps,
              dbus_tps / engine_tps);

  // 4. Idle CPU.
  {
    const double window = 5.0;
    ring.reset();  // no session
    std::this_thread::sleep_for(milliseconds(500));
    double d0 = cpu_seconds(daemon_pid);
    std::this_thread::sleep_for(duration<double>(window));
    const double none = cpu_seconds(daemon_pid) - d0;
    auto idle = must(tc::RingSession::open(*client), "OpenSession");
    std::this_thread::sleep_for(milliseconds(500));
    d0 = cpu_seconds(daemon_pid);
    const double c0 = own_cpu_seconds();
    std::vector<tc::RingEvent> evs;
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < duration<double>(window)) must(idle->wait(evs, milliseconds(1000)), "idle wait");
    const double with = cpu_seconds(daemon_pid) - d0;
    const double client_cpu = own_cpu_seconds() - c0;
    std::printf("\nidle CPU over %.0f s (tick resolution %.0f ms)             CPU ms   %% of one core\n", window,
                1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK)));
    std::printf("  tandemd, no session (baseline)                    %8.1f   %.3f\n", none * 1000, none / window * 100);
    std::printf("  tandemd, one idle open session                    %8.1f   %.3f\n", with * 1000, with / window * 100);
    std::printf("  this client, waiting on the idle session          %8.1f   %.3f\n", client_cpu * 1000,
                client_cpu / window * 100);
  }
  return 0;
}
