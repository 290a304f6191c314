// The runner of tandem-validate: starts (--spawn) or attaches to tandemd, runs a scenario's phases with one thread
// per workload client (each with its own connection through a Transport), applies the memory schedule and the
// faults through io.tandem.Tandem1.Testing, records every observation as an Event, writes each phase's results
// before the next phase starts, and the report at the end (docs/validate.md).
#pragma once

#include <string>
#include <vector>

#include "client/client.h"
#include "validate/scenario.h"

namespace tandem::validate {

// Exit codes of tandem-validate (also in docs/validate.md and the man page).
inline constexpr int kExitPass = 0;
inline constexpr int kExitVerdictFailed = 1;
inline constexpr int kExitUsage = 2;     // bad command line or scenario
inline constexpr int kExitRuntime = 3;   // could not start or reach tandemd, could not write the output
inline constexpr int kExitInterrupted = 4;
inline constexpr int kExitSkip = 77;     // --spawn without dbus-daemon (meson's "skipped")

struct RunnerOptions {
  std::string scenario_path;
  std::string out_dir;
  bool spawn = false;
  std::string tandemd;       // --spawn: the daemon binary
  std::string mkmodel;       // --spawn: tandem-mkmodel, to write the model once
  std::string model_cache;   // --spawn: where the generated model is kept (default /tmp/tandem-validate-model-<preset>)
  bool cuda = false;         // --spawn --device cuda: the daemon's accelerator is GPU 0 instead of a simulated one
  client::BusSpec bus;       // attach mode
  std::string restart_cmd;   // attach mode: how to start tandemd again after kill_daemon
  int daemon_pid = 0;        // attach mode: tandemd's pid (for VmRSS and kill_daemon); 0 = HostMemory.daemon_rss
  bool pause = false;
  bool resume = false;       // --resume-from: continue the campaign in out_dir
  std::string ballast;       // tandem-gpu-ballast: applies the memory schedule on a CUDA accelerator
  std::string self_exe;      // for child clients (kill_client)
  bool quiet = false;
};

// Runs the campaign; returns one of the exit codes above. Never throws.
int run_campaign(const RunnerOptions& opts);

// Offline analysis of an event log (a file, or a campaign directory with phase-*/events.jsonl): prints the verdict,
// writes the report to out_dir when given. Returns kExitPass / kExitVerdictFailed / kExitUsage.
int analyze(const std::string& input, const std::string& out_dir, bool quiet);

// The child client of a kill_client fault: submits one request, prints "submitted <job>" and "tokens <n>" lines on
// stdout as they happen, and waits for the end (the parent SIGKILLs it before that).
int run_child_client(const client::BusSpec& bus, const std::string& prompt, std::uint32_t max_tokens,
                     const std::string& key);

}  // namespace tandem::validate
