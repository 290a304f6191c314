#include "validate/runner.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <filesystem>
#include <sstream>
#include <thread>

#include "validate/report.h"
#include "validate/runner_internal.h"

namespace tandem::validate {

using namespace detail;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// Campaign files

Result<std::vector<Event>> load_dir_events(const std::string& dir) {
  std::vector<std::string> files;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.rfind("phase-", 0) == 0 && exists(dir + "/" + n + "/events.jsonl")) files.push_back(dir + "/" + n + "/events.jsonl");
    }
    ::closedir(d);
  } else {
    return fail(Errc::io_error, dir + ": cannot open: " + std::strerror(errno));
  }
  std::sort(files.begin(), files.end());
  std::vector<Event> all;
  for (const auto& f : files) {
    auto ev = read_events(f);
    if (!ev) return fail(ev.error());
    all.insert(all.end(), ev->begin(), ev->end());
  }
  std::stable_sort(all.begin(), all.end(), [](const Event& a, const Event& b) {
    return a.t_us != b.t_us ? a.t_us < b.t_us : a.seq < b.seq;
  });
  return all;
}

int finish_report(const std::string& out, const std::vector<Event>& all, const std::string& name,
                  const std::string& file, const std::string& mode, bool quiet) {
  ReportInput in;
  in.scenario_name = name;
  in.scenario_file = file;
  in.mode = mode;
  in.events = all;
  in.phases = compute_phases(all);
  in.overall = compute_metrics(all);
  in.verdict = judge(in.overall, in.phases);
  if (!out.empty()) {
    if (auto s = write_report(out, in); !s) {
      std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
      return kExitRuntime;
    }
  }
  const Metrics& m = in.overall;
  std::printf("tandem-validate: %s: %zu phases, %lu accepted, %lu completed, %lu failed-resumable, %lu cancelled, "
              "%lu rejected, %zu lost, %zu duplicates, peak RSS %lu MiB / budget %lu MiB\n",
              name.c_str(), in.phases.size(), static_cast<unsigned long>(m.accepted),
              static_cast<unsigned long>(m.completed), static_cast<unsigned long>(m.resumable_failed),
              static_cast<unsigned long>(m.cancelled), static_cast<unsigned long>(m.rejected), m.lost.size(),
              m.duplicates.size(), static_cast<unsigned long>(m.peak_rss >> 20),
              static_cast<unsigned long>(m.host_budget >> 20));
  for (const auto& r : in.verdict.rules)
    std::printf("%s %s: %s\n", r.pass ? "pass" : "FAIL", r.rule.c_str(), r.detail.c_str());
  std::printf("verdict: %s%s\n", in.verdict.pass ? "PASS" : "FAIL",
              out.empty() ? "" : (" (report: " + out + "/report.md)").c_str());
  std::fflush(stdout);
  (void)quiet;
  return in.verdict.pass ? kExitPass : kExitVerdictFailed;
}

void cleanup(Campaign& c) {
  c.monitor_stop = true;
  if (c.ballast_pid > 0) stop_child(c.ballast_pid, 5000ms);
  if (c.opts.spawn) {
    stop_child(c.daemon_pid.load(), 15000ms);
    c.daemon_pid = 0;
    stop_child(c.bus_pid, 2000ms);
    if (!c.bus_dir.empty()) {
      std::remove((c.bus_dir + "/bus.sock").c_str());
      std::remove((c.bus_dir + "/bus.conf").c_str());
      ::rmdir(c.bus_dir.c_str());
    }
  }
}


}  // namespace

int run_campaign(const RunnerOptions& opts) {
  try {
    Campaign c;
    c.opts = opts;
    c.out = opts.out_dir;
    std::set<std::string> done_names;
    std::string scenario_path = opts.scenario_path;
    if (opts.resume) {
      std::ifstream f(c.out + "/campaign.json");
      json st = json::parse(f, nullptr, false);
      if (st.is_discarded() || !st.is_object()) {
        std::fprintf(stderr, "tandem-validate: --resume-from %s: no readable campaign.json there\n", c.out.c_str());
        return kExitUsage;
      }
      if (scenario_path.empty()) scenario_path = st.value("scenario_file", "");
      c.nonce = st.value("nonce", hex_nonce());
      for (const auto& n : st.value("completed", json::array())) done_names.insert(n.get<std::string>());
    }
    {
      std::error_code ec;
      auto abs = std::filesystem::absolute(scenario_path, ec);  // campaign.json must work from another directory
      if (!ec) scenario_path = abs.lexically_normal().string();
    }
    auto sc = load_scenario(scenario_path);
    if (!sc) {
      std::fprintf(stderr, "tandem-validate: %s\n", sc.error().message.c_str());
      return kExitUsage;
    }
    c.sc = std::move(*sc);
    if (c.nonce.empty()) c.nonce = hex_nonce();
    if (auto s = mkdir_p(c.out); !s) {
      std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
      return kExitRuntime;
    }
    if (!opts.resume) {  // a fresh campaign in a used directory: old phases and the old journal go
      std::error_code ec;
      if (std::filesystem::exists(c.out + "/campaign.json", ec)) {
        for (const auto& e : std::filesystem::directory_iterator(c.out, ec))
          if (e.path().filename().string().rfind("phase-", 0) == 0) std::filesystem::remove_all(e.path(), ec);
        std::filesystem::remove_all(c.out + "/run/state", ec);
        std::filesystem::remove_all(c.out + "/charts", ec);
        for (const char* f : {"report.md", "report.json", "events.jsonl"}) std::filesystem::remove(c.out + "/" + f, ec);
      }
    }
    c.run_dir = c.out + "/run";
    c.daemon_log = c.run_dir + "/tandemd.log";
    (void)mkdir_p(c.run_dir);
    auto save_state = [&]() {
      json st{{"scenario_file", c.sc.file}, {"scenario", c.sc.name}, {"nonce", c.nonce},
              {"mode", opts.spawn ? "spawn" : "attach"}, {"completed", std::vector<std::string>(done_names.begin(), done_names.end())}};
      return write_text(c.out + "/campaign.json", st.dump(2) + "\n");
    };
    if (auto s = save_state(); !s) {
      std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
      return kExitRuntime;
    }
    if (opts.spawn) {
      if (find_in_path("dbus-daemon").empty()) {
        std::fprintf(stderr, "tandem-validate: --spawn needs dbus-daemon in PATH; skipping (exit 77)\n");
        return kExitSkip;
      }
      auto fail_rt = [&](const Error& e) {
        std::fprintf(stderr, "tandem-validate: %s\n", e.message.c_str());
        cleanup(c);
        return kExitRuntime;
      };
      if (auto s = prepare_model(c); !s) return fail_rt(s.error());
      if (auto s = prepare_embedding_model(c); !s) return fail_rt(s.error());
      if (auto s = prepare_speech_model(c); !s) return fail_rt(s.error());
      if (auto s = start_bus(c); !s) return fail_rt(s.error());
      if (auto s = write_daemon_config(c); !s) return fail_rt(s.error());
      say(opts.quiet, "tandem-validate: starting tandemd (" + opts.tandemd + ") on " + c.bus.describe() + ", log " + c.daemon_log);
      if (auto s = start_daemon(c); !s) return fail_rt(s.error());
    } else {
      c.bus = opts.bus;
      if (auto s = wait_ready(c.bus, 0, 10s); !s) {
        std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
        return kExitRuntime;
      }
      c.daemon_pid = opts.daemon_pid;
      if (c.daemon_pid == 0)
        if (auto cl = connect_client(c.bus)) c.daemon_pid = daemon_pid_from_bus(**cl);
    }
    if (auto cl = connect_client(c.bus)) {
      if (auto models = (*cl)->list_models())
        for (const auto& m : *models) c.max_context[m.name.value_or("")] = m.max_context.value_or(0);
      if (auto st = (*cl)->status(); st && st->memory && st->memory->device && st->memory->device->rfind("cuda", 0) == 0) {
        c.cuda = true;
        say(opts.quiet, "tandem-validate: the accelerator is '" + *st->memory->device +
                            "': Testing faults are NotSupported there; memory steps run " +
                            (opts.ballast.empty() ? std::string("nowhere (no tandem-gpu-ballast found)") : opts.ballast));
      }
    }
    std::thread monitor([&c] { monitor_thread(c); });
    int rc = kExitPass;
    for (std::size_t i = 0; i < c.sc.phases.size(); ++i) {
      const Phase& ph = c.sc.phases[i];
      if (done_names.count(ph.name)) continue;
      if (interrupted()) {
        rc = kExitInterrupted;
        break;
      }
      const std::string dir = phase_dir(c, i);
      (void)mkdir_p(dir);
      std::remove((dir + "/events.jsonl").c_str());
      if (auto s = c.log.open(dir + "/events.jsonl"); !s) {
        std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
        rc = kExitRuntime;
        break;
      }
      say(opts.quiet, "tandem-validate: phase " + std::to_string(i + 1) + "/" + std::to_string(c.sc.phases.size()) + " " + ph.name);
      PhaseResult pr = run_phase(c, i);
      c.log.close();
      c.log.clear();
      if (interrupted()) {
        rc = kExitInterrupted;
        break;
      }
      if (auto s = write_phase(dir, pr); !s) {
        std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
        rc = kExitRuntime;
        break;
      }
      done_names.insert(ph.name);
      (void)save_state();
      const Metrics& m = pr.metrics;
      say(opts.quiet, "  " + ph.name + ": accepted " + std::to_string(m.accepted) + ", completed " + std::to_string(m.completed) +
                          ", failed-resumable " + std::to_string(m.resumable_failed) + ", cancelled " +
                          std::to_string(m.cancelled) + ", rejected " + std::to_string(m.rejected) + ", lost " +
                          std::to_string(m.lost.size()) + ", duplicates " + std::to_string(m.duplicates.size()) +
                          (pr.unmet.empty() ? "" : ", UNMET: " + pr.unmet.front()) + " -> " + dir + "/summary.md");
      if (opts.pause && i + 1 < c.sc.phases.size()) {
        std::fprintf(stderr, "phase %zu written to %s; press Enter for the next phase (Ctrl-D stops; --resume-from %s continues)\n",
                     i + 1, dir.c_str(), c.out.c_str());
        std::string line;
        if (!std::getline(std::cin, line)) {
          rc = kExitInterrupted;
          break;
        }
      }
    }
    cleanup(c);
    monitor.join();
    if (rc != kExitPass) {
      std::fprintf(stderr, "tandem-validate: stopped; phases done so far are in %s (continue with --resume-from %s)\n",
                   c.out.c_str(), c.out.c_str());
      return rc;
    }
    auto all = load_dir_events(c.out);
    if (!all) {
      std::fprintf(stderr, "tandem-validate: %s\n", all.error().message.c_str());
      return kExitRuntime;
    }
    (void)write_events(c.out + "/events.jsonl", *all);
    return finish_report(c.out, *all, c.sc.name, c.sc.file, opts.spawn ? "spawn" : "attach", opts.quiet);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-validate: internal error: %s\n", e.what());
    return kExitRuntime;
  }
}

int analyze(const std::string& input, const std::string& out_dir, bool quiet) {
  try {
    struct stat st{};
    if (::stat(input.c_str(), &st) != 0) {
      std::fprintf(stderr, "tandem-validate: --analyze %s: %s\n", input.c_str(), std::strerror(errno));
      return kExitUsage;
    }
    Result<std::vector<Event>> ev = S_ISDIR(st.st_mode) ? load_dir_events(input) : read_events(input);
    if (!ev) {
      std::fprintf(stderr, "tandem-validate: %s\n", ev.error().message.c_str());
      return kExitUsage;
    }
    if (!out_dir.empty())
      if (auto s = mkdir_p(out_dir); !s) {
        std::fprintf(stderr, "tandem-validate: %s\n", s.error().message.c_str());
        return kExitRuntime;
      }
    return finish_report(out_dir, *ev, input, input, "analyze", quiet);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-validate: internal error: %s\n", e.what());
    return kExitRuntime;
  }
}

int run_child_client(const client::BusSpec& bus, const std::string& prompt, std::uint32_t max_tokens,
                     const std::string& key) {
  auto cl = client::Client::connect(bus);
  if (!cl) {
    std::printf("rejected connect: %s\n", cl.error().message.c_str());
    return kExitRuntime;
  }
  if (auto s = (*cl)->subscribe(); !s) return kExitRuntime;
  client::Request r;
  r.prompt = prompt;
  r.options.max_tokens = max_tokens;
  r.options.temperature = 0.0;
  r.options.seed = 99;
  if (!key.empty()) r.options.idempotency_key = key;
  auto res = (*cl)->submit(r);
  if (!res) {
    std::printf("rejected %s\n", (*cl)->last_error() ? (*cl)->last_error()->short_name().c_str() : "error");
    std::fflush(stdout);
    return kExitRuntime;
  }
  std::printf("submitted %lu %s\n", static_cast<unsigned long>(res->job_id), res->placement.route.value_or("?").c_str());
  std::fflush(stdout);
  std::uint64_t n = 0;
  for (;;) {
    for (const auto& u : (*cl)->take_job_updates(res->job_id)) {
      if (u.kind == "tokens" && u.tokens) {
        n += u.tokens->size();
        std::printf("tokens %lu\n", static_cast<unsigned long>(n));
        std::fflush(stdout);
      }
      if (u.kind == "finished") {
        std::printf("finished %s\n", u.state.value_or("?").c_str());
        return kExitPass;
      }
    }
    if (!(*cl)->process(100ms)) return kExitRuntime;
  }
}

}  // namespace tandem::validate
