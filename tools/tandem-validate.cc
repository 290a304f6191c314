// tandem-validate: the failover campaign under controlled memory pressure (docs/validate.md, man/tandem-validate.1).
// Runs a scenario against tandemd over D-Bus, writes each phase's results before the next, a report at the end, and
// exits 0 only when the verdict passes. Never links LibTorch.
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cli_args.h"
#include "client/client.h"
#include "validate/runner.h"
#include "validate/scenario.h"

namespace {

const char* kUsage =
    "usage: tandem-validate --spawn SCENARIO.toml [--out DIR] [--tandemd PATH] [--mkmodel PATH] [--model-cache DIR]\n"
    "                       [--device sim|cuda] [--ballast PATH]\n"
    "       tandem-validate [--bus system|session|address=ADDR] SCENARIO.toml [--out DIR] [--restart-cmd CMD]\n"
    "                       [--daemon-pid PID] [--ballast PATH]\n"
    "       tandem-validate --resume-from DIR [--spawn ...|--bus ...] [--pause]\n"
    "       tandem-validate --analyze EVENTS.jsonl|DIR [--out DIR]\n"
    "       tandem-validate --check SCENARIO.toml\n"
    "options: --pause (wait for Enter between phases), --quiet\n"
    "exit: 0 verdict passed, 1 verdict failed (each failed rule is printed as 'FAIL <rule>: ...'), 2 usage or\n"
    "scenario error, 3 tandemd could not be started/reached or output not written, 4 stopped (interrupt, Ctrl-D at\n"
    "--pause), 77 --spawn without dbus-daemon (skipped)\n";

std::string self_exe(const char* argv0) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) return std::string(buf, static_cast<std::size_t>(n));
  return argv0;
}

std::string sibling(const std::string& exe, const std::string& rel) {
  const auto slash = exe.rfind('/');
  if (slash == std::string::npos) return "";
  const std::string p = exe.substr(0, slash) + "/" + rel;
  return ::access(p.c_str(), X_OK) == 0 ? p : "";
}

std::string in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string all = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= all.size()) {
    std::size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    const std::string p = all.substr(start, end - start) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
    start = end + 1;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  validate::RunnerOptions o;
  std::string analyze, resume_dir, check;
  bool child = false, bus_given = false, device_given = false;
  std::string child_prompt, child_key;
  std::uint32_t child_tokens = 16;
  try {
    cli::Args a(argc, argv);
    while (a.next()) {
      const std::string_view f = a.flag();
      if (f == "--help" || f == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (f == "--spawn") {
        o.spawn = true;
      } else if (f == "--tandemd") {
        o.tandemd = a.value();
      } else if (f == "--mkmodel") {
        o.mkmodel = a.value();
      } else if (f == "--model-cache") {
        o.model_cache = a.value();
      } else if (f == "--out") {
        o.out_dir = a.value();
      } else if (f == "--bus") {
        auto b = client::parse_bus_spec(a.value());
        if (!b) throw cli::ArgError{"--bus: " + b.error().message};
        o.bus = *b;
        bus_given = true;
      } else if (f == "--restart-cmd") {
        o.restart_cmd = a.value();
      } else if (f == "--device") {
        const std::string_view v = a.value();
        if (v != "sim" && v != "cuda") throw cli::ArgError{"--device: sim or cuda, not '" + std::string(v) + "'"};
        o.cuda = v == "cuda";
        device_given = true;
      } else if (f == "--ballast") {
        o.ballast = a.value();
      } else if (f == "--daemon-pid") {
        o.daemon_pid = cli::parse_number<int>("--daemon-pid", a.value(), 1, 1 << 30);
      } else if (f == "--pause") {
        o.pause = true;
      } else if (f == "--resume-from") {
        resume_dir = a.value();
      } else if (f == "--analyze") {
        analyze = a.value();
      } else if (f == "--check") {
        check = a.value();
      } else if (f == "--quiet") {
        o.quiet = true;
      } else if (f == "--child-client") {
        child = true;
      } else if (f == "--prompt") {
        child_prompt = a.value();
      } else if (f == "--max-tokens") {
        child_tokens = cli::parse_number<std::uint32_t>("--max-tokens", a.value(), 1, 1u << 20);
      } else if (f == "--key") {
        child_key = a.value();
      } else if (!f.empty() && f[0] == '-') {
        throw cli::ArgError{"unknown option " + std::string(f)};
      } else if (o.scenario_path.empty()) {
        o.scenario_path = f;
      } else {
        throw cli::ArgError{"more than one scenario given ('" + o.scenario_path + "', '" + std::string(f) + "')"};
      }
    }
  } catch (const cli::ArgError& e) {
    std::fprintf(stderr, "tandem-validate: %s\n%s", e.message.c_str(), kUsage);
    return validate::kExitUsage;
  }

  try {
    if (child) return validate::run_child_client(o.bus, child_prompt, child_tokens, child_key);
    if (!check.empty()) {
      auto sc = validate::load_scenario(check);
      if (!sc) {
        std::fprintf(stderr, "tandem-validate: %s\n", sc.error().message.c_str());
        return validate::kExitUsage;
      }
      std::printf("%s: scenario '%s', %zu phases; fault kinds:", check.c_str(), sc->name.c_str(), sc->phases.size());
      for (const auto& k : sc->fault_kinds()) std::printf(" %s", k.c_str());
      std::printf("\n");
      return 0;
    }
    if (!analyze.empty()) return validate::analyze(analyze, o.out_dir, o.quiet);
    if (!resume_dir.empty()) {
      o.resume = true;
      o.out_dir = resume_dir;
    }
    if (o.scenario_path.empty() && !o.resume) {
      std::fprintf(stderr, "tandem-validate: no scenario given\n%s", kUsage);
      return validate::kExitUsage;
    }
    if (device_given && !o.spawn) {
      std::fprintf(stderr, "tandem-validate: --device chooses the accelerator of the daemon --spawn starts\n");
      return validate::kExitUsage;
    }
    if (o.spawn && bus_given) {
      std::fprintf(stderr, "tandem-validate: --spawn starts its own bus; --bus is for attach mode\n");
      return validate::kExitUsage;
    }
    if (!bus_given && !o.spawn) {
      auto b = client::bus_spec_from_env();
      if (!b) {
        std::fprintf(stderr, "tandem-validate: %s\n", b.error().message.c_str());
        return validate::kExitUsage;
      }
      o.bus = *b;
    }
    o.self_exe = self_exe(argv[0]);
    if (o.ballast.empty()) o.ballast = sibling(o.self_exe, "tandem-gpu-ballast");
    if (o.ballast.empty()) o.ballast = in_path("tandem-gpu-ballast");
    if (o.spawn) {
      if (o.tandemd.empty()) o.tandemd = sibling(o.self_exe, "../src/daemon/tandemd");
      if (o.tandemd.empty()) o.tandemd = in_path("tandemd");
      if (o.tandemd.empty()) o.tandemd = "/usr/sbin/tandemd";
      if (::access(o.tandemd.c_str(), X_OK) != 0) {
        std::fprintf(stderr, "tandem-validate: tandemd not found (give --tandemd PATH)\n");
        return validate::kExitUsage;
      }
      if (o.mkmodel.empty()) o.mkmodel = sibling(o.self_exe, "tandem-mkmodel");
      if (o.mkmodel.empty()) o.mkmodel = in_path("tandem-mkmodel");
    }
    if (o.out_dir.empty()) {
      std::string base = o.scenario_path;
      const auto slash = base.rfind('/');
      if (slash != std::string::npos) base = base.substr(slash + 1);
      if (base.size() > 5 && base.ends_with(".toml")) base.resize(base.size() - 5);
      o.out_dir = "tandem-validate-" + base;
    }
    if (auto s = client::install_interrupt_handler(); !s)
      std::fprintf(stderr, "tandem-validate: %s (Ctrl-C will not stop cleanly)\n", s.error().message.c_str());
    return validate::run_campaign(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem-validate: internal error: %s\n", e.what());
    return validate::kExitRuntime;
  }
}
