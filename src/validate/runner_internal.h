// Internals of the tandem-validate runner, shared by its files (not an interface): the campaign's state, the helper
// functions (processes, files, JSON of updates), and the pieces each file implements —
//   runner_util.cc     processes, files, interrupts, JSON of jobs and updates, the prompt words
//   runner_daemon.cc   --spawn: the private bus, the model, tandemd's config, start / kill / restart; the monitor
//   runner_worker.cc   the workload clients (one thread and one Transport each)
//   runner_embed.cc    the embedding workload clients (kind = "embed")
//   runner_clip.cc     the scenario's embedding model, generated at run time
//   runner_transcribe.cc  the transcription workload clients (kind = "transcribe") and the speech model
//   runner_faults.cc   faults and the memory schedule
//   runner_phase.cc    one phase: clients, equivalence runs, drain, settle, its results
//   runner.cc          run_campaign, analyze, the kill_client child
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/client.h"
#include "core/result.h"
#include "validate/events.h"
#include "validate/metrics.h"
#include "validate/runner.h"
#include "validate/scenario.h"
#include "validate/transport.h"

namespace tandem::validate::detail {

using nlohmann::json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

extern std::atomic<bool> g_stop;
extern const char* kShortPrompts[8];
extern const char* kWords[14];

// runner_util.cc
void say(bool quiet, const std::string& s);
bool exists(const std::string& p);
Status mkdir_p(const std::string& path);
bool interrupted();
// Sleeps until `until`, in small steps so an interrupt ends it. Returns false when interrupted.
bool sleep_until(Clock::time_point until);
std::string find_in_path(const std::string& name);
// posix_spawn with stdout/stderr to `log` (appended) or inherited, stdin from /dev/null.
Result<pid_t> spawn(const std::vector<std::string>& argv, const std::string& log);
void stop_child(pid_t pid, std::chrono::milliseconds grace);
std::uint64_t proc_rss(int pid);
std::string quote_toml(const std::string& s);
std::string hex_nonce();
std::string error_name(Transport& t, const Error& e);
json job_final_json(const client::JobInfo& j);
json update_json(const client::JobUpdate& u);

// ---------------------------------------------------------------------------------------------------------------

struct Tracked {
  std::int32_t phase = -1;
  std::int32_t client = -1;
  bool queued_cpu = false;
  bool started = false;
  bool tokens = false;
  bool finished = false;
  bool child = false;
};

struct Campaign {
  RunnerOptions opts;
  Scenario sc;
  std::string out;
  std::string nonce;
  client::BusSpec bus;
  EventLog log;
  std::atomic<int> daemon_pid{0};
  std::atomic<std::int32_t> phase{-1};
  std::atomic<std::uint64_t> next_req{1};
  std::atomic<std::int32_t> next_child{1000};
  std::map<std::string, std::uint32_t> max_context;  // model -> context
  std::mutex reg_mu;
  std::map<std::uint64_t, Tracked> reg;
  std::mutex daemon_mu;  // serializes kill/restart
  // spawn mode
  std::string bus_dir, run_dir, config_path, daemon_log, model_dir;
  std::string embedding_dir;  // daemon.embedding_preset: the generated CLIP model (runner_clip.cc)
  std::string speech_dir;     // daemon.speech_preset: the generated Whisper model (runner_transcribe.cc)
  pid_t bus_pid = 0;
  std::atomic<bool> monitor_stop{false};
  bool cuda = false;          // the accelerator is real: memory steps go to the ballast program
  pid_t ballast_pid = 0;
  std::uint64_t ballast_bytes = 0;

  Event rec(const std::string& type, std::int32_t client, std::uint64_t job, json data = json::object()) {
    return log.record(type, phase.load(), client, job, std::move(data));
  }
  void track(std::uint64_t job, std::int32_t client, bool child = false) {
    std::lock_guard lk(reg_mu);
    Tracked& t = reg[job];
    t.phase = phase.load();
    t.client = client;
    t.child = child;
  }

  std::string prompt_for(const std::string& kind, const std::string& text, const std::string& model,
                         std::uint32_t max_tokens, std::uint64_t n) const {
    if (kind == "text") return text;
    if (kind == "short") return kShortPrompts[n % (sizeof kShortPrompts / sizeof *kShortPrompts)];
    auto it = max_context.find(model.empty() ? "default" : model);
    const std::uint32_t ctx = it != max_context.end() && it->second > 0 ? it->second : 1024;
    const std::int64_t words = static_cast<std::int64_t>(ctx) - static_cast<std::int64_t>(max_tokens) - 12;
    std::string p = "Summarize:";
    for (std::int64_t i = 0; i < std::max<std::int64_t>(8, words); ++i)
      p += std::string(" ") + kWords[(static_cast<std::size_t>(i) + n) % (sizeof kWords / sizeof *kWords)];
    return p;
  }
};


// runner_daemon.cc
Result<std::unique_ptr<client::Client>> connect_client(const client::BusSpec& bus);
Status wait_ready(const client::BusSpec& bus, int pid, std::chrono::milliseconds timeout);
int daemon_pid_from_bus(client::Client& c);
Status start_bus(Campaign& c);
Status prepare_model(Campaign& c);
// runner_clip.cc: writes daemon.embedding_preset's model once (no-op without one).
Status prepare_embedding_model(Campaign& c);
// runner_transcribe.cc: writes daemon.speech_preset's model once (no-op without one).
Status prepare_speech_model(Campaign& c);
Status write_daemon_config(Campaign& c);
Status start_daemon(Campaign& c);
Result<int> kill_and_restart(Campaign& c, bool restart);
void monitor_thread(Campaign& c);

// runner_worker.cc: a workload client (its own Transport), run in its own thread; destroyed after the phase.
class WorkloadClient {
 public:
  virtual ~WorkloadClient() = default;
  virtual void run(Clock::time_point phase_t0) = 0;
};
// runner_embed.cc: kind = "embed" (make_workload_client hands those to it).
std::unique_ptr<WorkloadClient> make_embed_client(Campaign& c, const Phase& ph, const Workload& w, std::int32_t id,
                                                  std::uint32_t index_in_workload);
// runner_transcribe.cc: kind = "transcribe".
std::unique_ptr<WorkloadClient> make_transcribe_client(Campaign& c, const Phase& ph, const Workload& w, std::int32_t id,
                                                       std::uint32_t index_in_workload);
std::unique_ptr<WorkloadClient> make_workload_client(Campaign& c, const Phase& ph, const Workload& w, std::int32_t id,
                                                     std::uint32_t index_in_workload);

// runner_faults.cc
bool wait_generating(Campaign& c, std::uint64_t wait_ms);
void child_client_fault(Campaign& c, client::Client& ctl, const Fault& f);
void fault_thread(Campaign& c, const Fault& f, Clock::time_point t0);
// Replaces the ballast: holds `bytes` (0: none), or with `leave` what leaves that many bytes free once its own CUDA
// context exists (an `available = X` step).
void set_ballast(Campaign& c, std::uint64_t bytes, std::optional<std::uint64_t> leave = std::nullopt);
void memory_thread(Campaign& c, const Phase& ph, Clock::time_point t0);

// runner_phase.cc
std::uint64_t run_one(Campaign& c, client::Client& cl, std::int32_t id, const client::Request& r, const std::string& group,
                      std::uint64_t timeout_ms);
void equivalence_thread(Campaign& c, const Phase& ph, std::int32_t id);
void drain(Campaign& c, const Phase& ph);
void reset_and_settle(Campaign& c, const Phase& ph);
json expect_json(const Expect& x);
std::string phase_dir(const Campaign& c, std::size_t i);
PhaseResult run_phase(Campaign& c, std::size_t i);

}  // namespace tandem::validate::detail
