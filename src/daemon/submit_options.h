// The options of Submit/Plan/Resume (docs/dbus.md "Submit options"), shared by the two front ends: the D-Bus a{sv}
// and the ring's submit record (docs/rings.md) both turn each option into an OptionValue and call apply_option, so
// one table decides names, accepted types and ranges. Torch-free and D-Bus-free; the service validates what depends
// on the model (max_tokens against the context, stop strings, ...).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "ring/record.h"

namespace tandem::daemon {

// Unset = the model's default.
struct SubmitOptions {
  std::optional<std::uint32_t> max_tokens;
  std::optional<double> temperature;
  std::optional<std::uint32_t> top_k;
  std::optional<double> top_p;
  std::optional<double> repetition_penalty;
  std::optional<std::uint64_t> seed;
  std::optional<std::vector<std::string>> stop;
  std::optional<std::string> idempotency_key;
  std::optional<bool> side_effects;
  std::optional<bool> allow_cpu;
  std::optional<bool> allow_reduce;
  std::optional<bool> allow_fallback_model;
  std::optional<std::uint64_t> deadline_ms;
  std::optional<std::uint32_t> prefill_chunk;
  std::optional<std::vector<std::int32_t>> resume_tokens;
  std::optional<bool> stream;
  // The chat template's enable_thinking variable (Qwen3: false closes an empty <think> block, so the model answers
  // without reasoning); unset = undefined in the template, the model's default.
  std::optional<bool> enable_thinking;

  // Boolean template variables these options set (for ChatTemplateOptions::flag_vars).
  std::map<std::string, bool> template_flags() const;

  void override_with(const SubmitOptions& o);
};

// A value as a front end decoded it: booleans, unsigned and signed integers, doubles, strings, string lists, int32
// lists (the ring's field types; D-Bus y/q/u/t → uint64, n/i/x → int64).
using OptionValue = ring::FieldValue;

inline constexpr std::size_t kMaxOptions = 64;

// Sets one option. Integers are accepted for integer options when >= 0 and in range, and for double options;
// errors (invalid_argument) name the option, what it must be and what it got ("a string" / "D-Bus type 's'" is
// given by `got_type` when the caller knows better than the value's alternative).
Status apply_option(SubmitOptions& o, std::string_view key, const OptionValue& v, std::string_view got_type = {});

// The option names, for "unknown option" messages and docs.
std::string_view known_options();
bool is_option(std::string_view key);

// A ring submit record (docs/rings.md "Submit record"): model and prompt strings, messages as a string list of
// role/content pairs, every other field an option. Errors: invalid_argument naming the field.
struct RecordRequest {
  std::string model;
  std::string prompt;
  std::vector<std::pair<std::string, std::string>> messages;
  SubmitOptions options;
};
Result<RecordRequest> request_from_record(const std::vector<ring::Field>& fields);

}  // namespace tandem::daemon
