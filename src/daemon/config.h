// tandemd's configuration: /etc/tandem/tandemd.toml plus drop-ins (tandemd.d/*.toml next to it, read in name order,
// later files override earlier ones key by key; [[model]] entries are merged by `name`). Every key is validated;
// an unknown key or a bad value is an error naming the file, the dotted key and the allowed range. Torch-free and
// D-Bus-free: the daemon, `tandemd --check-config` and the tests share this. Keys: docs/config.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "policy/config.h"
#include "policy/replica_mode.h"

namespace tandem::daemon {

enum class BusKind { system, session, address };
std::string_view bus_kind_name(BusKind k) noexcept;

struct BusConfig {
  BusKind kind = BusKind::system;
  std::string address;                   // required for kind = address ("unix:path=..."), empty otherwise
  std::string name = "io.tandem.Tandem1";  // well-known name to own
};

struct AuthConfig {
  std::string submit_group = "tandem";       // members may Submit/Plan/Cancel/Resume their jobs
  bool allow_any_local_user = false;         // true: any local uid may submit
  std::string admin_group = "tandem-admin";  // members (and uid 0) may set Policy, hold the GPU, use Testing
};

enum class AccelKind { none, simulated, cuda, auto_detect };  // auto_detect: cuda if a GPU answers, else none
std::string_view accel_kind_name(AccelKind k) noexcept;

struct DeviceConfig {
  AccelKind kind = AccelKind::auto_detect;
  int cuda_index = 0;                                      // [0, 63]
  std::uint64_t sim_capacity_bytes = 8ull << 30;           // [64 MiB, 1 PiB]
  std::chrono::milliseconds sim_reading_lag{0};            // [0, 60 s]
  std::chrono::milliseconds poll_interval{250};            // memory readings, [10 ms, 60 s]
  std::chrono::milliseconds idle_poll_interval{2000};      // readings while idle (Service::idle()), [10 ms, 60 s];
                                                           // below poll_interval means poll_interval
  std::chrono::milliseconds probe_interval{30000};         // routine health probe while closed, [100 ms, 1 h]
  std::chrono::milliseconds probe_timeout{2000};           // deadline of one probe, [10 ms, 60 s]
  // GPU residency (docs/residency.md).
  bool evict_on_hold = true;                               // HoldGpu gives the GPU replicas back (and release restores)
  std::chrono::milliseconds drain{5000};                   // how long running jobs may keep a replica being given
                                                           // back before they move to the CPU, [0, 1 h]
  std::uint32_t max_pressure_evictions_per_minute = 4;     // replicas given back for foreign pressure in any minute,
                                                           // [0, 600]; 0 = never for pressure
  std::chrono::milliseconds recover_after{30000};          // one given back for pressure returns after there was room
                                                           // for it this long without a break, [0, 1 h]
};

struct SamplingDefaults {
  double temperature = 0.0;          // [0, 100]
  int top_k = 0;                     // [0, 1000000]
  double top_p = 1.0;                // (0, 1]
  double repetition_penalty = 1.0;   // (0, 10]
  std::uint32_t max_new_tokens = 256;  // [1, 1048576]
  std::vector<std::string> stop;     // at most 16, each 1..256 bytes
  bool operator==(const SamplingDefaults&) const = default;
};

struct ModelConfig {
  std::string name;                  // [A-Za-z0-9_.-]{1,64}, unique; also the D-Bus object path element (escaped)
  std::string dir;                   // model directory (HF layout); absolute, or relative to the config file's dir
  std::string revision;              // label, part of the fingerprint; <= 128 bytes
  std::string dtype = "auto";        // auto | f32 | bf16 | f16 (how float weights are held; engine/model.h)
  std::string kv_cache = "f16";      // f16 | f32: the CPU layers' KV cache (engine/model.h KvCacheType)
  std::string template_name;         // "" = the model's own chat_template (raw if none); raw | llama2 | chatml | zephyr
  SamplingDefaults sampling;
  // CPU replica mode: warm | mmap | on_demand, or auto (ReplicaModePolicy from measured times).
  std::optional<policy::ReplicaMode> replica_mode;  // nullopt = auto
  bool gpu = true;                   // also load a replica on the accelerator (when there is one)
  int gpu_layers = -1;               // -1 = all layers on the accelerator; else [0, layers]
  std::string fallback;              // name of another [[model]] the CPU may serve instead ("" = none)
  int cpu_threads = 1;               // [1, 256] intra-op threads of the CPU replica
  std::int64_t keep_alive_s = -1;    // GPU replica given back after this long without a job: -1 = never (default),
                                     // 0 = after each job, [1, 2592000] s (docs/residency.md)
  int priority = 0;                  // [-100, 100]: foreign pressure gives back the lower priority's replica first
  int gpu_threads = 1;               // [1, 256] (simulated accelerator computes on the CPU)
  std::uint32_t max_context = 0;     // 0 = the model's; else [16, 1048576]
  std::uint32_t max_sequences = 0;   // KV pool sized for this many sequences; 0 = the queue's concurrency
  bool operator==(const ModelConfig&) const = default;
};

struct JournalConfig {
  std::string dir = "/var/lib/tandem";  // the state directory; the journal is <dir>/journal
  std::uint64_t max_bytes = 64ull << 20;  // compact when the file grows past this, [1 MiB, 64 GiB]
  std::chrono::seconds retention{86400};  // terminal jobs kept this long, [0, 365 d]
  std::uint32_t max_jobs = 10000;         // terminal jobs kept at most, [1, 10000000]
  bool fsync = true;                      // fsync before acknowledging (false only for tests)
};

struct RuntimeConfig {
  std::chrono::milliseconds drain_timeout{30000};      // SIGTERM: finish/checkpoint in-flight jobs, [0, 1 h]
  std::chrono::milliseconds status_interval{1000};     // sd_notify STATUS refresh, [100 ms, 1 h]
  std::uint32_t max_prompt_bytes = 1u << 20;           // [1, 64 MiB]
  std::uint32_t max_messages = 256;                    // chat messages per request, [1, 65536]
  std::uint32_t max_jobs_per_client = 64;              // non-terminal jobs per bus name, [1, 1000000]
  std::chrono::milliseconds token_flush_interval{20};  // coalesce token signals, [0, 10 s]
};

// Shared-memory ring sessions (OpenSession; docs/rings.md).
struct RingConfig {
  bool enabled = true;
  std::uint32_t max_sessions = 64;                 // all users, [0, 4096]
  std::uint32_t max_sessions_per_user = 8;         // per uid, [0, 4096]
  std::uint32_t default_sq_entries = 256;          // [8, max_sq_entries] (rounded up to a power of two)
  std::uint32_t default_cq_entries = 1024;         // [8, max_cq_entries]
  std::uint32_t max_sq_entries = 4096;             // [8, 65536]
  std::uint32_t max_cq_entries = 16384;            // [8, 262144]
  std::uint64_t default_data_bytes = 1ull << 20;   // each data area when the client asks for none, [4 KiB, max]
  std::uint64_t max_data_bytes = 16ull << 20;      // each data area at most, [4 KiB, 1 GiB]
  std::uint64_t max_backlog_bytes = 4ull << 20;    // completions waiting in the daemon per session, [64 KiB, 1 GiB]
  std::uint32_t max_entries_per_pass = 256;        // submissions read from one session per loop pass, [1, 65536]
  std::chrono::microseconds max_spin{200};         // the loop's busy-poll budget after ring activity, [0, 10 ms]
};

// Embed requests (embedding models; docs/embeddings.md). Every input is untrusted: these bound what one call may
// make the daemon hold and decode.
struct EmbeddingConfig {
  std::string default_model;                      // "" = the first embedding model
  std::uint32_t max_inputs = 64;                  // texts + images per call, [1, 1024]
  std::uint64_t max_image_bytes = 32ull << 20;    // one image's file, [1 KiB, 1 GiB]
  std::uint64_t max_image_pixels = 40'000'000;    // one image decoded (width × height), [1, 1e9]
  std::uint32_t max_text_bytes = 64 << 10;        // one text, [1, 16 MiB]
};

// Transcribe requests (speech models; docs/transcription.md). The audio is untrusted: these bound what one call may
// make the daemon hold and decode.
struct SpeechConfig {
  std::string default_model;                      // "" = the first speech model
  std::uint64_t max_audio_bytes = 512ull << 20;   // one audio file, [1 KiB, 4 GiB]
  std::uint32_t max_audio_seconds = 4 * 3600;     // decoded duration, [1, 86400]
  // Live streams (ring `transcribe` with stream = true, docs/rings.md):
  std::uint32_t stream_idle_seconds = 30;         // no chunk for this long while a window waits: the job fails
                                                  // (Timeout), [1, 3600]
  std::uint32_t max_stream_ahead_seconds = 600;   // audio held ahead of the transcription (64 KB/s of memory); past
                                                  // it a chunk is refused QueueFull, [5, 14400]
};

struct DaemonConfig {
  BusConfig bus;
  AuthConfig auth;
  DeviceConfig device;
  std::vector<ModelConfig> models;   // at least one
  std::string default_model;         // "" = the first [[model]]
  policy::PolicyConfig policy;
  JournalConfig journal;
  RuntimeConfig runtime;
  RingConfig rings;
  EmbeddingConfig embedding;
  SpeechConfig speech;
  std::vector<std::string> sources;  // files read, in order (main file, then drop-ins)

  const ModelConfig* find_model(std::string_view name) const;
  // Cross-field checks (unique names, fallback refers to another model, default_model exists, policy.validate()).
  Status validate() const;
};

// Reads `path` and then every `*.toml` in `dropin_dir` (sorted by file name). dropin_dir "" = <dir of path>/tandemd.d;
// a missing drop-in directory is fine, a missing main file is not_found. Errors: parse_error / invalid_argument,
// message "<file>: <dotted.key>: <what is allowed>, got <value>" (parse errors with line:column).
Result<DaemonConfig> load_config(const std::string& path, const std::string& dropin_dir = "");
// Parses one TOML document (for tests and the embedded demo config); `origin` names it in errors.
Result<DaemonConfig> parse_config(std::string_view toml_text, const std::string& origin = "<string>");
// The effective configuration as TOML that load_config() reads back to an equal configuration.
std::string render_config(const DaemonConfig& cfg);

// Parses "8GiB", "512 MiB", "1024" (bytes), "1.5GiB" (units B, KiB, MiB, GiB, TiB, KB, MB, GB, TB).
Result<std::uint64_t> parse_size(std::string_view text);

}  // namespace tandem::daemon
