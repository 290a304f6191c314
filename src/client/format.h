// Plain views of what tandemd says on D-Bus, and pure functions that turn them into text and JSON (tandemctl's
// output) or parse what a user types (sizes, durations, policy settings). No D-Bus here: src/client/client.cc
// converts the a{sv} dictionaries into these structs, so everything below is testable with plain values.
//
// Every field of a dictionary is std::optional: a key the daemon did not send stays empty (never a made-up 0).
// Keys the converter did not know, or got with an unexpected D-Bus type, land in `unparsed` (key -> signature) so a
// contract drift is visible (tandemctl --json prints it as "_unparsed"; tandem-validate can assert it is empty).
// Field names are the XML's key names (dbus/io.tandem.Tandem1*.xml), and the JSON output uses exactly those names.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/result.h"

namespace tandem::client {

using Unparsed = std::map<std::string, std::string>;  // key -> D-Bus signature that was not understood

// ---------------------------------------------------------------------------------------------------------------
// Properties of io.tandem.Tandem1 (one GetAll call)

// Policy property (read/write). Writing sends only the keys given.
struct PolicySettings {
  std::optional<std::uint64_t> margin_bytes;
  std::optional<double> margin_fraction;
  std::optional<std::vector<std::string>> ladder_order;
  std::optional<std::uint64_t> max_delay_ms;
  std::optional<bool> offload_enabled;
  std::optional<bool> allow_migration;
  std::optional<std::uint32_t> gpu_concurrency;
  std::optional<std::uint32_t> cpu_concurrency;
  std::optional<std::uint64_t> host_budget_bytes;
  std::optional<std::uint64_t> breaker_cooldown_ms;
  Unparsed unparsed;
};

struct MemoryInfo {
  std::optional<std::string> device;
  std::optional<bool> present;
  std::optional<std::uint64_t> total;
  std::optional<std::uint64_t> free;
  std::optional<std::uint64_t> observed_used;   // this process's allocator reserved bytes ("used by us")
  std::optional<std::uint64_t> predicted_used;  // the ledger's prediction of the same
  std::optional<std::uint64_t> margin;
  std::optional<std::uint64_t> foreign;  // other programs and the driver
  std::optional<std::uint64_t> unmaterialized;
  std::optional<std::int64_t> headroom;
  std::optional<std::int64_t> prediction_error;
  std::optional<std::uint64_t> reading_age_ms;
  std::optional<std::string> trust;     // fresh | stale | expired
  std::optional<std::string> pressure;  // normal | elevated | critical
  Unparsed unparsed;
};

struct HostMemoryInfo {
  std::optional<std::uint64_t> budget;
  std::optional<std::string> bound;  // what sets the budget (the configured budget, cgroup memory.max, MemAvailable)
  std::optional<std::uint64_t> configured_budget;
  std::optional<std::uint64_t> cgroup_max;
  std::optional<std::uint64_t> mem_available;
  std::optional<std::uint64_t> used;
  std::optional<std::uint64_t> daemon_rss;
  Unparsed unparsed;
};

struct QueueInfo {
  std::string name;
  std::uint32_t depth = 0;
  std::uint32_t capacity = 0;
  std::uint32_t running = 0;
  std::uint32_t concurrency = 0;
  std::uint64_t oldest_age_ms = 0;
};

struct HoldInfo {
  std::string cookie;
  std::string app_id;
  std::string reason;
  std::int64_t since_unix_ms = 0;
};

// The whole property set of io.tandem.Tandem1 (named ServiceStatus, not Status: tandem::Status is Result<void>).
// Properties missing from the reply stay empty.
struct ServiceStatus {
  std::optional<std::string> state;            // normal | pressure | degraded | unavailable
  std::optional<std::string> degraded_reason;  // "" when normal
  std::optional<std::string> gpu_breaker;      // closed | open | half_open
  std::optional<PolicySettings> policy;
  std::optional<MemoryInfo> memory;
  std::optional<HostMemoryInfo> host_memory;
  std::optional<std::vector<QueueInfo>> queues;
  std::optional<std::map<std::string, std::uint32_t>> limits;
  std::optional<std::vector<HoldInfo>> holds;
  std::optional<std::string> fallback_model;
  std::optional<std::string> version;
  std::optional<std::map<std::string, std::uint64_t>> rings;  // property Rings: ring session counters
  Unparsed unparsed;  // properties not known or of an unexpected type

  // State is degraded or unavailable.
  bool degraded() const;
};

// One PropertiesChanged signal: the changed values as a partial ServiceStatus, plus the names.
struct PropertiesChange {
  ServiceStatus values;
  std::vector<std::string> changed;      // D-Bus property names with a value in `values`
  std::vector<std::string> invalidated;  // names announced without a value
};

// DegradedModeChanged signal.
struct DegradedChange {
  bool degraded = false;
  std::string reason;
  std::optional<std::string> level;
  std::optional<std::string> fallback_model;
  std::optional<std::map<std::string, std::uint32_t>> limits;
  std::optional<double> expected_slowdown;  // GPU decode rate / CPU decode rate
  std::optional<std::int64_t> since_unix_ms;
  Unparsed unparsed;
};

// ---------------------------------------------------------------------------------------------------------------
// Method results

// LoadModel / UnloadModel: the replica's state when the call returned (docs/residency.md).
struct ResidencyReply {
  std::optional<std::string> model;
  std::optional<std::string> device;        // gpu
  std::optional<std::string> state;         // draining | evicted | loading | loaded
  std::optional<std::string> reason;        // request | hold | pressure | idle ("" when loaded)
  std::optional<std::uint64_t> accel_bytes; // on the accelerator now
  Unparsed unparsed;
};

// Submit / Resume placement.
struct Placement {
  std::optional<std::uint64_t> job_id;  // also the first member of Submit's reply
  std::optional<std::string> state;
  std::optional<std::string> action;  // admit | delay | evict | reduce | offload | route_cpu
  std::optional<std::string> reason;
  std::optional<std::string> detail;
  std::optional<std::string> route;  // gpu | hybrid | cpu
  std::optional<std::string> queue;  // gpu | cpu
  std::optional<std::uint32_t> queue_position;
  std::optional<std::uint64_t> eta_ms;
  std::optional<bool> eta_known;  // false: eta_ms is the configured priors' guess (nothing measured yet)
  std::optional<std::string> model;
  std::optional<bool> fallback_model;
  std::optional<std::string> fingerprint;
  std::optional<std::uint32_t> max_new_tokens;
  std::optional<std::uint32_t> prefill_chunk;
  std::optional<std::uint32_t> gpu_layers;
  std::optional<bool> degraded;
  std::optional<double> expected_slowdown;   // GPU decode rate / this route's (1 on the GPU)
  std::optional<std::uint32_t> prompt_tokens;  // the prompt as tokenized (templated), resume tokens included
  std::optional<bool> existing;
  Unparsed unparsed;
};

struct SubmitResult {
  std::uint64_t job_id = 0;
  Placement placement;
};

struct SkippedRung {
  std::string rung;
  std::string why;
};

// Plan decision.
struct PlanDecision {
  std::optional<std::string> action;
  std::optional<std::string> reason;
  std::optional<std::string> detail;
  std::optional<std::string> route;
  std::optional<std::string> model;
  std::optional<bool> fallback_model;
  std::optional<std::uint32_t> max_new_tokens;
  std::optional<std::uint32_t> prefill_chunk;
  std::optional<std::uint32_t> gpu_layers;
  std::optional<std::uint64_t> eta_ms;
  std::optional<bool> eta_known;  // false: eta_ms is the configured priors' guess (nothing measured yet)
  std::optional<std::uint64_t> retry_after_ms;
  std::optional<bool> permanent;
  std::optional<std::string> pressure;
  std::optional<std::uint32_t> prompt_tokens;
  std::optional<std::vector<SkippedRung>> skipped;
  std::optional<std::map<std::string, std::uint64_t>>
      breakdown;                                                // weights, kv_cache, activations, fragmentation, total
  std::optional<std::map<std::string, std::int64_t>> headroom;  // total, margin, predicted_headroom, ...
  Unparsed unparsed;
};

struct HistoryEntry {
  std::string from;
  std::string to;
  std::string reason;
  std::int64_t at_unix_ms = 0;
};

struct Checkpoint {
  std::optional<std::uint64_t> seed;
  std::optional<std::uint32_t> tokens_delivered;
  std::optional<std::string> model;
  Unparsed unparsed;
};

// GetJob.
struct JobInfo {
  std::optional<std::uint64_t> id;
  std::optional<std::string> state;
  std::optional<std::string> model;
  std::optional<std::string> route;
  std::optional<std::string> reason;
  std::optional<std::uint32_t> attempts;
  std::optional<std::int64_t> accepted_unix_ms;
  std::optional<std::int64_t> finished_unix_ms;
  std::optional<std::vector<std::int32_t>> tokens;
  std::optional<std::string> text;
  std::optional<std::string> finish_reason;
  std::optional<std::string> queue;
  std::optional<std::uint32_t> queue_position;
  std::optional<std::uint64_t> eta_ms;
  std::optional<bool> eta_known;  // false: eta_ms is the configured priors' guess (nothing measured yet)
  std::optional<std::vector<HistoryEntry>> history;
  std::optional<std::vector<std::string>> routes;
  std::optional<std::string> error_code;
  std::optional<std::string> error_message;
  std::optional<std::uint64_t> retry_after_ms;
  std::optional<Checkpoint> checkpoint;
  std::optional<std::string> idempotency_key;
  std::optional<bool> side_effects;
  std::optional<bool> degraded;
  // kind generate | embed | transcribe; transcription jobs:
  std::optional<std::string> kind;
  std::optional<std::string> segments_json;  // segments_from_json() reads it
  std::optional<std::uint32_t> windows_done, windows_total, windows_on_cpu;
  std::optional<std::uint64_t> audio_ms, audio_done_ms;
  std::optional<std::string> language;
  std::optional<double> realtime_factor;
  std::optional<std::uint32_t> segments, windows_skipped, fallbacks;
  std::optional<std::string> audio_format;
  std::optional<std::uint64_t> queued_ms, run_ms;
  std::optional<bool> stream, stream_complete;  // a live stream's job
  std::optional<std::uint64_t> stream_bytes;    // where its next chunk's offset must be
  // Embedding jobs: the call's inputs, texts (token inputs included) and images, the vectors' width, texts cut to
  // the context, the text tower's tokens.
  std::optional<std::uint32_t> inputs, texts, images, dim, truncated;
  std::optional<std::uint64_t> text_tokens;
  // The placement as Submit answered it (GetJob repeats it).
  std::optional<std::string> action, detail, fingerprint;
  std::optional<bool> fallback_model;
  std::optional<double> expected_slowdown;
  std::optional<std::uint32_t> gpu_layers, max_new_tokens, prefill_chunk, prompt_tokens;
  Unparsed unparsed;
};

// States after which nothing changes any more (the job's own states; "failed" may still be resumed as a new job).
bool is_terminal_state(std::string_view state);

// ListModels entry.
struct ModelInfo {
  std::optional<std::string> name;
  std::optional<std::string> path;
  std::optional<bool> is_default;  // key "default"
  std::optional<std::string> fingerprint;
  std::optional<std::string> revision;
  std::optional<std::string> placement;
  std::optional<std::string> fallback;
  std::optional<std::uint32_t> max_context;
  std::optional<std::string> kind;  // llm | embedding (absent from daemons before Embed: llm)
  // Embedding models only.
  std::optional<std::uint32_t> dim;         // vector width
  std::optional<std::uint32_t> image_size;  // pixels per side of the image input
  std::optional<std::vector<std::string>> modalities;  // text, image
  std::optional<std::string> template_name;  // key "template"
  std::optional<std::string> dtype;
  std::optional<std::uint64_t> weight_bytes;
  std::optional<std::map<std::string, std::uint64_t>> placement_bytes;  // storage, host, gpu
  // Speech models only.
  std::optional<std::vector<std::string>> languages;
  std::optional<std::uint64_t> window_ms;
  std::optional<bool> translate;
  Unparsed unparsed;
};

// Embed's result dictionary (the vectors travel beside it).
struct EmbedInfo {
  std::optional<std::uint64_t> job_id;
  std::optional<std::string> model;
  std::optional<std::string> route;  // gpu | cpu
  std::optional<std::uint32_t> dim;
  std::optional<std::uint32_t> inputs, texts, images;
  std::optional<std::uint32_t> truncated;  // texts cut to the context
  std::optional<std::uint64_t> text_tokens;  // text-tower tokens read (BOS/EOS included, after truncation)
  std::optional<std::uint32_t> attempts;
  std::optional<bool> degraded;
  std::optional<std::string> fingerprint;
  std::optional<std::uint64_t> queued_ms, run_ms;
  std::optional<bool> existing;  // the idempotency key matched a finished job
  Unparsed unparsed;
};

// io.tandem.Tandem1.Model object (GetAll at the model's path).
struct ReplicaInfo {
  std::optional<std::string> device;  // gpu | hybrid | cpu
  std::optional<std::string> state;   // loaded | unloaded | draining | evicted | loading | lost | failed
  std::optional<std::string> reason;  // draining, evicted, loading: why it was given back (hold | pressure | idle |
                                      // request)
  std::optional<std::string> mode;    // warm | mmap | on_demand (CPU)
  std::optional<std::uint32_t> layers;
  std::optional<std::uint64_t> accel_bytes;  // weights + KV pool on the accelerator
  std::optional<std::uint64_t> host_bytes;   // resident on the host
  std::optional<std::string> fingerprint;
  std::optional<std::string> error;          // the last load error
  Unparsed unparsed;
};

struct ModelDetails {
  std::string path;  // the object path it was read from
  std::optional<std::string> name;
  std::optional<std::string> revision;
  std::optional<std::string> fingerprint;
  std::optional<std::vector<ReplicaInfo>> replicas;
  std::optional<std::map<std::string, std::uint64_t>> placement;  // storage, host, gpu bytes
  std::optional<std::string> fallback;
  std::optional<std::uint32_t> max_context;
  std::optional<std::string> template_name;  // property "Template"
  std::optional<std::string> kind;           // property "Kind"
  Unparsed unparsed;
};

// JobUpdate signal; which fields are set depends on kind (accepted, routed, started, tokens, migrated, finished).
struct JobUpdate {
  std::uint64_t job_id = 0;
  std::string kind;
  // routed / started / migrated
  std::optional<std::string> route;
  std::optional<std::string> reason;
  std::optional<std::string> model;
  std::optional<bool> fallback_model;
  std::optional<bool> degraded;
  std::optional<std::string> queue;
  std::optional<std::uint32_t> queue_position;
  std::optional<std::uint64_t> eta_ms;
  std::optional<bool> eta_known;  // routed: false while the route's rates are the configured priors
  std::optional<std::uint64_t> previous_eta_ms;  // eta: what was announced before, as time left now
  std::optional<std::uint32_t> attempt;
  // tokens
  std::optional<std::string> text;
  std::optional<std::vector<std::int32_t>> tokens;
  std::optional<std::uint32_t> step;
  // migrated
  std::optional<std::string> from;
  std::optional<std::string> to;
  std::optional<std::uint32_t> tokens_delivered;
  // finished
  std::optional<std::string> state;
  std::optional<std::string> finish_reason;
  std::optional<std::string> error_code;
  std::optional<std::string> error_message;
  std::optional<std::uint64_t> retry_after_ms;
  std::optional<std::uint32_t> tokens_total;
  // transcription jobs: audio / segment / progress (and finished)
  std::optional<double> seconds;                 // audio: the file's length
  std::optional<std::uint32_t> windows_total, windows_done, window, index, segments;
  std::optional<std::uint64_t> start_ms, end_ms, audio_done_ms, audio_ms;
  std::optional<std::string> language, format;
  std::optional<double> temperature, avg_logprob, no_speech_prob, realtime_factor;
  std::optional<bool> stream;  // audio/progress of a live stream (ring): true while it is open (no total, no ETA)
  Unparsed unparsed;
};

// Testing.GetCounters.
using Counters = std::map<std::string, std::uint64_t>;

// ---------------------------------------------------------------------------------------------------------------
// Parsing what users type

// "6GiB", "512 MiB", "1.5GiB", "100" (bytes), "4k"; units B, K/KiB, M/MiB, G/GiB, T/TiB (binary), KB/MB/GB/TB
// (decimal), case-insensitive. Fractions allowed with a unit; the result must fit 64 bits.
Result<std::uint64_t> parse_size(std::string_view text);
// "500" (ms), "500ms", "2s", "1.5s", "3m"/"3min", "1h" -> milliseconds.
Result<std::uint64_t> parse_duration_ms(std::string_view text);
// "true|false|yes|no|on|off|1|0".
Result<bool> parse_bool(std::string_view text);

// A value for one Policy key, typed as the XML says: t -> uint64, u -> uint32, d -> double, b -> bool, as -> list.
using PolicyValue = std::variant<bool, std::uint32_t, std::uint64_t, double, std::vector<std::string>>;
// "KEY=VALUE" for `tandemctl policy set`: the key must be one of the XML's Policy keys and the value is parsed by the
// key's type (sizes with units for *_bytes, durations for *_ms, comma-separated list for ladder_order).
Result<std::pair<std::string, PolicyValue>> parse_policy_setting(std::string_view assignment);
// The Policy keys with their D-Bus signature, in the XML's order.
const std::vector<std::pair<std::string, std::string>>& policy_keys();

// ---------------------------------------------------------------------------------------------------------------
// Text

std::string format_bytes(std::uint64_t bytes);        // "512 B", "12.0 MiB", "1.50 GiB"
std::string format_signed_bytes(std::int64_t bytes);  // "-12.0 MiB", "+300 MiB" (sign always shown)
std::string format_duration_ms(std::uint64_t ms);     // "250 ms", "1.5 s", "2 min 5 s", "1 h 2 min"
std::string format_count(double v);                   // "12", "3.5" (shortest sensible)
// Turns a service reason token into a phrase ("gpu-breaker-open" -> "the GPU circuit breaker is open ...");
// unknown tokens are returned as they are.
std::string describe_reason(std::string_view reason);

// `tandemctl status`. now_unix_ms ages the holds. Starts with a loud DEGRADED line when degraded.
std::string format_status(const ServiceStatus& s, std::int64_t now_unix_ms);
// One line per changed property for `tandemctl watch` (no timestamp; the caller prefixes it).
std::string format_properties_change(const PropertiesChange& c);
std::string format_degraded_change(const DegradedChange& d);
std::string format_policy(const PolicySettings& p);
// Placement printed on stderr by `run`/`resume`: route, model, queue position, ETA, and the DEGRADED banner.
// expected_slowdown: from the last DegradedModeChanged, if any was seen.
std::string format_placement(std::uint64_t job_id, const Placement& p, std::optional<double> expected_slowdown);
// "DEGRADED: running on the CPU because <reason> — expect ~Nx slower; Ctrl-C cancels"; empty when not degraded.
std::string degraded_banner(const Placement& p, std::optional<double> expected_slowdown,
                            std::string_view degraded_reason);
std::string format_plan(const PlanDecision& d);
std::string format_job(const JobInfo& j, std::int64_t now_unix_ms);
std::string format_models(const std::vector<ModelInfo>& models);
std::string format_model_details(const ModelDetails& m);
std::string format_counters(const Counters& c);
// A progress line for a non-token JobUpdate ("routed to cpu (gpu-breaker-open), queue cpu #2, ETA 3.0 s").
std::string format_job_update(const JobUpdate& u);
// "job 12 completed (stop): 57 tokens in 3.2 s, 17.8 tok/s, routes gpu -> cpu"
struct RunSummary {
  std::uint64_t job_id = 0;
  std::string state;
  std::string finish_reason;
  std::uint64_t tokens = 0;
  std::uint64_t elapsed_ms = 0;     // submit to finish, as seen by the client
  std::uint64_t generate_ms = 0;    // first "started" to finish (0 = unknown)
  std::vector<std::string> routes;  // route history
  std::string error_code;
  std::string error_message;
};
std::string format_run_summary(const RunSummary& s);
// The hint printed after a resumable failure: checkpoint and "tandemctl resume N".
std::string format_resume_hint(std::uint64_t job_id, const JobInfo& j, std::string_view ctl_prefix);

// ---------------------------------------------------------------------------------------------------------------
// JSON (keys are the XML's key names; absent optionals are omitted; `unparsed` goes to "_unparsed" when non-empty)

nlohmann::json to_json(const PolicySettings& p);
nlohmann::json to_json(const MemoryInfo& m);
nlohmann::json to_json(const HostMemoryInfo& h);
nlohmann::json to_json(const ServiceStatus& s);  // property names in snake_case plus "degraded": bool
nlohmann::json to_json(const PropertiesChange& c);
nlohmann::json to_json(const DegradedChange& d);
nlohmann::json to_json(const Placement& p);
nlohmann::json to_json(const PlanDecision& d);
nlohmann::json to_json(const JobInfo& j);
nlohmann::json to_json(const ModelInfo& m);
nlohmann::json to_json(const EmbedInfo& e);
nlohmann::json to_json(const ModelDetails& m);  // property names in snake_case ("template" for Template)
nlohmann::json to_json(const JobUpdate& u);     // {"job": id, "kind": ..., <data keys>}
nlohmann::json to_json(const RunSummary& s);
nlohmann::json policy_value_to_json(const PolicyValue& v);

// Property name (D-Bus CamelCase, e.g. "DegradedReason") -> JSON key ("degraded_reason").
std::string property_json_key(std::string_view dbus_name);

}  // namespace tandem::client
