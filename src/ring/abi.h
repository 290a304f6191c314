// The shared-memory ring ABI between tandemd and a local client (docs/rings.md is the language-neutral description;
// this header is its C++ rendering and must stay in step with it). One memfd holds, at offsets the header gives:
//
//   header | SQ control | CQ control | submission entries | completion entries | request data | response data
//
// Rules (liburing / iceoryx style):
// - Every field is fixed-width, little-endian (the host's order; tandemd runs on x86-64 and aarch64 only) and at a
//   fixed offset; reserved bytes are zero when written and must be zero when read.
// - Head/tail indices are free-running uint32 counters (they wrap at 2^32); capacities are powers of two and the slot
//   of index i is i & (entries - 1). The producer publishes its tail with a release store after writing the entry;
//   the consumer reads the tail with an acquire load, copies entries out, then publishes its head with a release store.
// - Each index lives on its own 64-byte cache line; the side that writes a line is the only writer of it.
// - Offsets, never pointers. Sizes of the areas are in the header; a reader checks them against the mapping size.
// - Versioning: kAbiMajor changes when a field moves or changes meaning (a client must refuse another major);
//   kAbiMinor grows when something is added in reserved space or behind a feature bit (a client ignores features it
//   does not know, and the daemon only uses a feature the client asked for).
//
// The daemon treats everything in this memory as hostile: it reads the client's tail and head once per pass, copies
// each entry and its data out before validating them, and keeps its own indices in private memory (the copies in
// shared memory are for the client). A bad index, entry or payload ends that session, never the daemon.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::ring {

inline constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'R', 'I', 'N', 'G'};
inline constexpr std::uint16_t kAbiMajor = 1;
inline constexpr std::uint16_t kAbiMinor = 2;  // 1.1: Opcode::embed, Kind::embedded, float32_list, bytes_list;
                                                // 1.2: Opcode::transcribe/audio, Kind::segment/progress/audio_info
inline constexpr std::size_t kCacheLine = 64;
inline constexpr std::uint32_t kEntrySize = 64;  // both rings

// Feature bits (Header::features). None are defined in ABI 1.0; the field exists so the layout can grow.
inline constexpr std::uint64_t kKnownFeatures = 0;

// ---------------------------------------------------------------------------------------------------------------
// Header: offset 0, 256 bytes, written once by the daemon before the memfd is handed out, never changed after.
struct Header {
  char magic[8];                   // "TNDMRING"
  std::uint16_t abi_major;         // kAbiMajor
  std::uint16_t abi_minor;         // kAbiMinor
  std::uint32_t header_size;       // sizeof(Header)
  std::uint64_t features;          // feature bits in force for this session
  std::uint64_t session_id;        // as returned by OpenSession
  std::uint64_t total_size;        // bytes of the memfd (sealed: it cannot shrink or grow)
  std::uint32_t sq_entries;        // power of two
  std::uint32_t cq_entries;        // power of two
  std::uint32_t sqe_size;          // kEntrySize
  std::uint32_t cqe_size;          // kEntrySize
  std::uint64_t sq_control_offset; // SqControl
  std::uint64_t cq_control_offset; // CqControl
  std::uint64_t sqes_offset;       // sq_entries SubmissionEntry
  std::uint64_t cqes_offset;       // cq_entries CompletionEntry
  std::uint64_t request_data_offset;   // written only by the client
  std::uint64_t request_data_size;
  std::uint64_t response_data_offset;  // written only by the daemon
  std::uint64_t response_data_size;
  std::uint32_t max_request_bytes;     // largest data_length one submission may have
  std::uint32_t reserved0;
  std::uint8_t reserved[128];
};
static_assert(sizeof(Header) == 256);
static_assert(offsetof(Header, features) == 16);
static_assert(offsetof(Header, sq_entries) == 40);
static_assert(offsetof(Header, sq_control_offset) == 56);
static_assert(offsetof(Header, response_data_size) == 112);
static_assert(offsetof(Header, max_request_bytes) == 120);

// ---------------------------------------------------------------------------------------------------------------
// Control blocks. Each uint32 index is accessed atomically (std::atomic_ref / __atomic builtins / C11 atomics).

// SqControl::flags (daemon-written)
inline constexpr std::uint32_t kSqNeedWakeup = 1u << 0;  // the daemon sleeps: write a byte to the SQ doorbell

// Session state (SqControl::state, daemon-written). Once not `open`, it never changes again.
enum class SessionState : std::uint32_t { open = 0, failed = 1, closed = 2 };

// Why a session failed (SqControl::fault, daemon-written with state = failed).
enum class Fault : std::uint32_t {
  none = 0,
  sq_index = 1,         // the client's SQ tail ran ahead of capacity (or behind the daemon's head)
  cq_index = 2,         // the client's CQ head is outside [consumed, tail]
  opcode = 3,           // unknown opcode
  reserved = 4,         // a reserved field or flag bit is not zero
  length = 5,           // data_length is 0 where data is needed, non-zero where none is, or > max_request_bytes
  offset = 6,           // data_offset + data_length is outside the request data area
  record = 7,           // the payload is not a well-formed record (framing, key syntax, duplicate key, type size)
  utf8 = 8,             // a string in the payload is not UTF-8
  internal = 9,         // the daemon could not serve the session
};

struct SqControl {
  // Line 0: client-written.
  std::uint32_t tail;              // next index the client will fill
  std::uint8_t pad0[kCacheLine - 4];
  // Line 1: daemon-written.
  std::uint32_t head;              // next index the daemon will read (entries before it may be reused)
  std::uint8_t pad1[kCacheLine - 4];
  // Line 2: daemon-written.
  std::uint32_t flags;             // kSqNeedWakeup
  std::uint32_t state;             // SessionState
  std::uint32_t fault;             // Fault, with state == failed
  std::uint32_t reserved0;
  std::uint64_t entries_consumed;  // submissions read so far (statistics)
  std::uint8_t pad2[kCacheLine - 24];
};
static_assert(sizeof(SqControl) == 3 * kCacheLine);
static_assert(offsetof(SqControl, head) == kCacheLine);
static_assert(offsetof(SqControl, flags) == 2 * kCacheLine);

// CqControl::daemon_flags (daemon-written)
inline constexpr std::uint32_t kCqBacklog = 1u << 0;     // completions wait in the daemon: after consuming, ring the SQ doorbell
inline constexpr std::uint32_t kCqOverflowed = 1u << 1;  // token data was dropped at least once (see overflow_tokens)
// CqControl::client_flags (client-written)
inline constexpr std::uint32_t kCqNeedWakeup = 1u << 0;  // the client sleeps: the daemon writes a byte to the CQ doorbell

struct CqControl {
  // Line 0: daemon-written.
  std::uint32_t tail;
  std::uint8_t pad0[kCacheLine - 4];
  // Line 1: client-written.
  std::uint32_t head;
  std::uint8_t pad1[kCacheLine - 4];
  // Line 2: client-written.
  std::uint32_t client_flags;      // kCqNeedWakeup
  std::uint8_t pad2[kCacheLine - 4];
  // Line 3: daemon-written.
  std::uint32_t daemon_flags;      // kCqBacklog | kCqOverflowed
  std::uint32_t reserved0;
  std::uint64_t overflow_tokens;   // tokens not streamed because the backlog was full (GetJob has them)
  std::uint64_t backlog_entries;   // completions waiting in the daemon now
  std::uint8_t pad3[kCacheLine - 24];
};
static_assert(sizeof(CqControl) == 4 * kCacheLine);
static_assert(offsetof(CqControl, head) == kCacheLine);
static_assert(offsetof(CqControl, client_flags) == 2 * kCacheLine);
static_assert(offsetof(CqControl, daemon_flags) == 3 * kCacheLine);

// ---------------------------------------------------------------------------------------------------------------
// Submission entries (client → daemon)

enum class Opcode : std::uint8_t {
  nop = 1,     // no data; answered with a `nop` completion (liveness and latency probes)
  submit = 2,  // data: a request record (docs/rings.md "Submit record"); answered with accepted or error
  cancel = 3,  // no data; job_id: the job; answered with `cancel_result` or error
  embed = 4,   // ABI 1.1. data: an embed record (docs/rings.md "Embed record"); answered with ONE `embedded` or error
  transcribe = 5,  // ABI 1.2. data: a transcribe record (a file, or a live stream's format); answered like submit:
                   // accepted or error, then audio_info, segment, progress, ..., finished
  audio = 6,       // ABI 1.2. job_id: a streamed transcription; data: an audio record (offset, pcm, end). Answered
                   // only when refused (`error`, job_id set); docs/rings.md "Audio record"
};

struct SubmissionEntry {
  std::uint8_t opcode;         // Opcode
  std::uint8_t flags;          // 0 in ABI 1.0
  std::uint16_t reserved0;
  std::uint32_t data_length;   // bytes of the payload in the request data area
  std::uint64_t user_data;     // echoed in every completion about this submission (and the job it created)
  std::uint64_t data_offset;   // from the start of the request data area
  std::uint64_t job_id;        // cancel: the job; others: 0
  std::uint8_t reserved[32];
};
static_assert(sizeof(SubmissionEntry) == kEntrySize);
static_assert(offsetof(SubmissionEntry, user_data) == 8);
static_assert(offsetof(SubmissionEntry, data_offset) == 16);
static_assert(offsetof(SubmissionEntry, job_id) == 24);

// ---------------------------------------------------------------------------------------------------------------
// Completion entries (daemon → client)

enum class Kind : std::uint8_t {
  accepted = 1,       // submit accepted: record = the placement (job_id, route, queue, eta_ms, degraded, ...)
  routed = 2,         // record: route, reason, model, fallback_model, degraded, queue, eta_ms
  started = 3,        // record: route, attempt, ...
  tokens = 4,         // payload: `count` int32 token ids, then `text_length` bytes of UTF-8 text; `step` = first index
  migrated = 5,       // record: from, to, reason, resume_from
  finished = 6,       // terminal: record: state (completed|failed|cancelled), reason, finish_reason, tokens_total,
                      // error_code/error_message/retry_after_ms when failed. The last completion of a job.
  error = 7,          // a submission failed: record: error (name as the D-Bus error's last part), message,
                      // retry_after_ms (when retrying can help). `error` field of the entry: ErrorCode.
  cancel_result = 8,  // record: state (the job's state after the cancel)
  nop = 9,            // answer to a nop
  degraded_mode = 10, // degraded mode changed (user_data 0, job_id 0): record degraded (boolean), reason, and the
                      // details of the D-Bus DegradedModeChanged signal. Sent to every open session before the first
                      // completion of a job placed under the new mode (ABI 1.0: a reader ignores kinds it does not
                      // know).
  embedded = 11,      // ABI 1.1, the answer to an `embed` (job_id: its job): record = the Embed result (job_id,
                      // model, route, dim, inputs, ...) + count (uint64), dim (uint64) and vectors (float32_list,
                      // count × dim, input order). The only completion of an embed job.
  segment = 12,       // ABI 1.2, a transcription's segment: record index, start_ms, end_ms, text, window, temperature,
                      // avg_logprob, no_speech_prob (the JobUpdate "segment")
  progress = 13,      // ABI 1.2: windows_done, windows_total, audio_done_ms, audio_ms, eta_ms, route, language,
                      // realtime_factor, stream (the JobUpdate "progress")
  audio_info = 14,    // ABI 1.2, once before the first segment: seconds, windows_total, format, route, stream,
                      // eta_ms, eta_known (added keys of the same record: no ABI change)
};

// CompletionEntry::flags
inline constexpr std::uint8_t kCqeGap = 1u << 0;  // tokens: tokens before `step` were not all streamed (overflow)

// CompletionEntry::error (kind == error); the names are those of io.tandem.Tandem1.Error.*.
enum class ErrorCode : std::uint16_t {
  none = 0,
  invalid_argument = 1,  // InvalidArgument
  unknown_model = 2,     // UnknownModel
  unknown_job = 3,       // UnknownJob
  busy = 4,              // Busy (retry_after_ms)
  queue_full = 5,        // QueueFull (retry_after_ms)
  host_memory = 6,       // HostMemory (retry_after_ms)
  resumable = 7,         // Resumable
  not_authorized = 8,    // NotAuthorized
  unavailable = 9,       // Unavailable
  incompatible = 10,     // Incompatible
  duplicate = 11,        // Duplicate
  illegal_state = 12,    // IllegalState
  not_supported = 13,    // NotSupported
  timeout = 14,          // Timeout
  internal = 15,         // Internal
};

struct CompletionEntry {
  std::uint64_t user_data;     // of the submission
  std::uint64_t job_id;        // 0 for nop and for a submit that failed
  std::uint8_t kind;           // Kind
  std::uint8_t flags;          // kCqeGap
  std::uint16_t error;         // ErrorCode (kind == error)
  std::uint32_t data_length;   // bytes at data_offset in the response data area (0: none)
  std::uint64_t data_offset;   // from the start of the response data area
  std::uint32_t step;          // tokens: index of the first token of this batch in the job's output
  std::uint32_t count;         // tokens: number of token ids
  std::uint32_t text_length;   // tokens: bytes of text after the ids
  std::uint32_t reserved0;
  std::uint8_t reserved[16];
};
static_assert(sizeof(CompletionEntry) == kEntrySize);
static_assert(offsetof(CompletionEntry, kind) == 16);
static_assert(offsetof(CompletionEntry, data_offset) == 24);
static_assert(offsetof(CompletionEntry, step) == 32);

// ---------------------------------------------------------------------------------------------------------------
// Records: the payload of submit and of most completions, a flat list of typed fields (docs/rings.md "Records").
//   field := type:u8 key_length:u8 reserved:u16(0) value_length:u32 key[key_length] value[value_length]
// Keys are [a-z0-9_]{1,64}, unique within a record. No padding between fields.
enum class FieldType : std::uint8_t {
  boolean = 1,      // 1 byte, 0 or 1
  uint64 = 2,       // 8 bytes
  int64 = 3,        // 8 bytes
  float64 = 4,      // 8 bytes IEEE-754, finite
  string = 5,       // UTF-8, value_length bytes, no terminator
  string_list = 6,  // repeated (length:u32, UTF-8 bytes)
  int32_list = 7,   // value_length / 4 int32
  float32_list = 8, // ABI 1.1: value_length / 4 IEEE-754 binary32, finite (embedded: vectors)
  bytes_list = 9,   // ABI 1.1: repeated (length:u32, raw bytes) (embed: images)
};
inline constexpr std::size_t kFieldHeaderSize = 8;
inline constexpr std::size_t kMaxKeyLength = 64;

}  // namespace tandem::ring
