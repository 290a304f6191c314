// tandem-validate scenarios: the campaign a run replays against tandemd (docs/validate.md, "Scenario format").
// A scenario is a TOML file: [scenario] (name, description), [daemon] (what --spawn starts), [[phase]] with
// [[phase.workload]], [[phase.memory]], [[phase.fault]], [phase.equivalence] and [phase.expect].
// Parsing is strict: an unknown key, a wrong type or a value out of range is an error naming the file, the line and
// the key's full path (e.g. "ci.toml:41:11: phase[3].fault[0].site: ..."). No D-Bus, no LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace tandem::validate {

// One step of a phase's memory schedule, applied at `at_ms` after the phase started: either the foreign load in
// bytes (Testing.SetForeignLoad), or the device memory that should remain available ("available"), converted to a
// foreign load from the Memory property read at that moment: foreign = total - observed_used - available.
struct MemoryStep {
  std::uint64_t at_ms = 0;
  std::optional<std::uint64_t> foreign_bytes;
  std::optional<std::uint64_t> available_bytes;
};

enum class FaultKind {
  fail_allocations,  // Testing.FailAllocations(count, site): before generation (prefill/kv_pool) or during decode
  lose_device,       // Testing.LoseDevice (a driver reset), then RecoverDevice after recover_after_ms
  fail_probes,       // Testing.FailProbes(count): the breaker opens, then closes through half-open
  cancel_queued,     // Cancel up to `count` jobs that wait in the CPU queue (not started yet)
  kill_client,       // a child client process is SIGKILLed after its first tokens; its job must still finish
  kill_daemon,       // SIGKILL tandemd with jobs in flight, then restart it (spawn mode or --restart-cmd)
  hold_gpu,          // HoldGpu for duration_ms, then ReleaseGpu
  reading_lag,       // Testing.SetReadingLag(lag_ms) for duration_ms, then 0
};
std::string_view fault_kind_name(FaultKind k);
std::optional<FaultKind> parse_fault_kind(std::string_view s);

struct Fault {
  FaultKind kind = FaultKind::fail_allocations;
  std::uint64_t at_ms = 0;
  // "at": fire at at_ms. "generating": at at_ms or later, as soon as a job of this phase has delivered tokens and
  // is still running (up to wait_ms; if none comes, the fault fires anyway and the event says so).
  std::string when = "at";
  std::uint64_t wait_ms = 10000;
  std::uint32_t count = 1;          // fail_allocations, fail_probes, cancel_queued
  std::string site = "any";         // fail_allocations: weights|kv_pool|prefill|decode|probe|other|any
  std::uint64_t recover_after_ms = 1000;  // lose_device: RecoverDevice after this long
  std::uint64_t duration_ms = 1000;       // hold_gpu, reading_lag
  std::uint64_t lag_ms = 2000;            // reading_lag
  std::uint32_t max_tokens = 200;         // kill_client: the child's request
  std::string prompt = "short";           // kill_client
  bool restart = true;                    // kill_daemon: start it again
};

// generate: Submit (LLM jobs). embed: Embed calls (docs/validate.md "Embedding workloads"): each request is one call
// with `texts` texts and `images` PNG images, generated deterministically from (workload, client, request).
// transcribe: Transcribe calls over D-Bus (docs/validate.md "Transcription workloads"): each request is one WAV of
// `audio_seconds` (tones and noise, deterministic from the request), followed through its JobUpdates to its end.
enum class WorkloadKind { generate, embed, transcribe };
std::string_view workload_kind_name(WorkloadKind k);

struct Workload {
  std::string name;
  WorkloadKind kind = WorkloadKind::generate;
  std::uint32_t texts = 4;        // embed: texts per call
  std::uint32_t images = 0;       // embed: images per call (PNG, rendered with src/image/draw.h)
  std::uint32_t image_size = 64;  // embed: pixels per side
  double audio_seconds = 40;          // transcribe: length of each call's audio (> 30 s = more than one window)
  std::uint32_t sample_rate = 16000;  // transcribe: the WAV's rate (the daemon resamples to 16 kHz)
  std::string language;               // transcribe: "" = detected by the model
  std::string audio_input = "bytes";  // transcribe: bytes (the `audio` argument) | memfd (an `audio_fd`)
  std::uint32_t clients = 1;    // threads, each with its own bus connection
  std::string transport = "dbus";  // dbus (Submit + JobUpdate signals) | ring (a shared-memory ring session each)
  std::uint32_t requests = 1;   // per client
  std::uint32_t burst = 1;      // jobs a client keeps in flight at once
  std::string prompt = "short"; // short | long (near the context limit) | text
  std::string prompt_text;      // prompt = "text"
  std::vector<std::string> models;  // round robin; empty = the daemon's default model
  std::uint32_t max_tokens = 16;
  double temperature = 0.0;
  std::optional<std::uint64_t> seed;  // default: a per-request seed
  bool side_effects = false;
  bool idempotency_keys = true;  // each request gets a unique key
  bool resubmit = false;         // after the job ended, submit the same key once more (must return the same job)
  bool resume_failed = false;    // Resume a failed-resumable job once (continues the same key's chain)
  bool allow_cpu = true;
  std::uint64_t start_ms = 0;     // first submit this long after the phase started
  std::uint64_t interval_ms = 0;  // between a client's submits
};

struct Equivalence {
  std::uint32_t prompts = 0;  // 0 = off. Each prompt runs greedy on the GPU route and again under a GPU hold (CPU)
  std::uint32_t max_tokens = 32;
};

// Phase expectations: checked by the rule "phase_expectations" (a fault that did not bite fails the verdict).
struct Expect {
  std::optional<std::uint32_t> min_completed;
  std::optional<std::uint32_t> min_cpu_routed;  // jobs placed on the CPU at admission (route before admission)
  std::optional<std::uint32_t> min_migrated;
  std::optional<std::uint32_t> min_retried;
  std::optional<std::uint32_t> min_cancelled;
  std::optional<std::uint32_t> min_resumable_failed;
  std::optional<std::uint32_t> min_rejected;
  std::optional<bool> breaker_cycle;  // the breaker opened and was closed again within the phase
  std::optional<double> min_equivalence_rate;
  std::optional<bool> degraded_seen;  // at least one DegradedModeChanged(degraded=true) in the phase
  std::optional<std::uint32_t> min_embed_ok;   // Embed calls answered with vectors
  std::optional<std::uint32_t> min_embed_gpu;  // ... on the GPU route
  std::optional<std::uint32_t> min_embed_cpu;  // ... on the CPU route
  std::optional<std::uint32_t> min_transcribe_ok;        // transcription jobs completed
  std::optional<std::uint32_t> min_transcribe_gpu;       // ... every window on the GPU
  std::optional<std::uint32_t> min_transcribe_cpu;       // ... some window on the CPU (routed, retried or migrated)
  std::optional<std::uint32_t> min_transcribe_migrated;  // transcription jobs moved gpu -> cpu at a window boundary
  // GPU residency (docs/residency.md): replicas given back for foreign pressure, loaded again, and every one given
  // back within the phase loaded again by its end.
  std::optional<std::uint32_t> min_pressure_evictions;
  std::optional<std::uint32_t> min_gpu_restores;
  std::optional<std::uint32_t> max_pressure_evictions;  // the cap held: at most this many within the phase
  std::optional<bool> restored_by_end;
  // ETA accuracy: the p90 of |eta − actual| / actual of every final route with a measured job stays at most this
  // (docs/validate.md "ETA accuracy"); min_eta_jobs: at least this many measured jobs in the phase.
  std::optional<double> max_eta_p90_error;
  std::optional<std::uint32_t> min_eta_jobs;
};

struct Phase {
  std::string name;
  std::uint64_t duration_ms = 0;  // the phase lasts at least this long (schedule steps and faults fire inside it)
  std::uint64_t drain_timeout_ms = 60000;  // after the workload: wait this long for every accepted job to end
  std::uint64_t settle_ms = 0;    // after the drain: wait until the breaker is closed and State normal (0 = no)
  std::uint32_t repeat = 1;       // the phase runs this many times (soak); names get -01, -02, ...
  std::vector<Workload> workloads;
  std::vector<MemoryStep> memory;
  std::vector<Fault> faults;
  Equivalence equivalence;
  Expect expect;
};

// What --spawn starts: a private dbus-daemon and tandemd with a generated config (docs/validate.md).
struct DaemonSettings {
  std::string model_preset = "tiny";  // tandem-mkmodel --preset (written once into the model cache)
  std::string model_dir;              // use this model directory instead of generating one
  std::vector<std::string> extra_models;  // more [[model]] names served from the same files ("mixed models")
  std::string sim_capacity = "1GiB";
  std::uint64_t host_budget = 2ull << 30;  // [policy] host.budget; also what the RSS rule compares against
  std::uint32_t gpu_concurrency = 2;
  std::uint32_t cpu_concurrency = 1;
  std::uint32_t cpu_queue_capacity = 16;
  std::uint64_t breaker_cooldown_ms = 1500;
  std::uint64_t recover_after_ms = 300;
  // GPU residency ([device] of tandemd.toml; unset: the daemon's defaults).
  std::optional<std::uint64_t> evict_recover_after_ms;            // [device] recover_after_ms
  std::optional<std::uint32_t> max_pressure_evictions_per_minute;  // [device] max_pressure_evictions_per_minute
  std::string config_extra;  // appended verbatim to the generated tandemd.toml
  // An embedding model next to the LLM: modelgen::clip_preset name ("clip-test", "clip-small"), random weights and a
  // small trained tokenizer, written once into the model cache; served as [[model]] `embedding_name`. "" = none.
  std::string embedding_preset;
  std::string embedding_name = "emb";
  // A speech model next to the LLM: "whisper-test" (modelgen::write_whisper_test_model: random weights and a small
  // Whisper tokenizer), written once into the model cache; served as [[model]] `speech_name` with a GPU and a CPU
  // replica. "" = none.
  std::string speech_preset;
  std::string speech_name = "asr";
};

struct Scenario {
  std::string file;  // where it was read from
  std::string name;
  std::string description;
  std::uint64_t sample_interval_ms = 250;  // status/RSS sampling
  DaemonSettings daemon;
  std::vector<Phase> phases;  // after expanding `repeat`

  // The fault kinds present in some phase (for the docs' coverage table and the CI check).
  std::vector<std::string> fault_kinds() const;
};

Result<Scenario> parse_scenario(std::string_view text, std::string_view file);
Result<Scenario> load_scenario(const std::string& path);

}  // namespace tandem::validate
