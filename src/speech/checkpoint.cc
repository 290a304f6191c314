// The job's checkpoint as compact JSON for the journal, read back as untrusted text.
#include <limits>
#include <nlohmann/json.hpp>

#include "core/text.h"
#include "speech/transcriber.h"

namespace tandem::speech {
namespace {

using nlohmann::json;

constexpr int kVersion = 1;
constexpr std::size_t kMaxPromptTokens = 4096;

Failure key_error(std::string_view key, std::string_view what) {
  return fail(Errc::format_error, "checkpoint: \"" + std::string(key) + "\" " + std::string(what));
}

Result<std::uint64_t> read_unsigned(const json& doc, const char* key, std::uint64_t max) {
  if (!doc.contains(key)) return key_error(key, "is missing");
  const json& v = doc[key];
  if (!v.is_number_integer()) return key_error(key, "is not an integer");
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > max) return key_error(key, "is out of range");
    return u;
  }
  const auto i = v.get<std::int64_t>();
  if (i < 0 || static_cast<std::uint64_t>(i) > max) return key_error(key, "is out of range");
  return static_cast<std::uint64_t>(i);
}

}  // namespace

std::string encode_checkpoint(const Checkpoint& ck) {
  json j = json::object();
  j["v"] = kVersion;
  j["seek"] = ck.seek;
  j["prompt"] = ck.prompt;
  j["language"] = ck.language;
  j["windows_done"] = ck.windows_done;
  j["segments_done"] = ck.segments_done;
  j["finished"] = ck.finished;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<Checkpoint> decode_checkpoint(std::string_view text) {
  if (json_nesting_depth(text, 16) > 4) return fail(Errc::parse_error, "checkpoint: nested too deep");
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return fail(Errc::parse_error, "checkpoint: not valid JSON");
  if (!doc.is_object()) return fail(Errc::parse_error, "checkpoint: not a JSON object");
  Checkpoint ck;
  auto v = read_unsigned(doc, "v", std::numeric_limits<std::uint32_t>::max());
  if (!v.ok()) return fail(std::move(v).error());
  if (*v != kVersion) return key_error("v", "= " + std::to_string(*v) + " is not a version this build reads (1)");
  auto seek = read_unsigned(doc, "seek", std::numeric_limits<std::uint64_t>::max() / 2);
  if (!seek.ok()) return fail(std::move(seek).error());
  ck.seek = *seek;
  auto windows = read_unsigned(doc, "windows_done", std::numeric_limits<std::uint32_t>::max());
  if (!windows.ok()) return fail(std::move(windows).error());
  ck.windows_done = static_cast<std::uint32_t>(*windows);
  auto segments = read_unsigned(doc, "segments_done", std::numeric_limits<std::uint32_t>::max());
  if (!segments.ok()) return fail(std::move(segments).error());
  ck.segments_done = static_cast<std::uint32_t>(*segments);

  if (!doc.contains("prompt")) return key_error("prompt", "is missing");
  const json& prompt = doc["prompt"];
  if (!prompt.is_array()) return key_error("prompt", "is not an array of token ids");
  if (prompt.size() > kMaxPromptTokens) return key_error("prompt", "holds more than 4096 tokens");
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    const json& e = prompt[i];
    if (!e.is_number_integer() || e.get<std::int64_t>() < 0 ||
        e.get<std::int64_t>() > std::numeric_limits<TokenId>::max()) {
      return key_error("prompt", "element " + std::to_string(i) + " is not a token id");
    }
    ck.prompt.push_back(static_cast<TokenId>(e.get<std::int64_t>()));
  }
  if (!doc.contains("language")) return key_error("language", "is missing");
  if (!doc["language"].is_string()) return key_error("language", "is not a string");
  ck.language = doc["language"].get<std::string>();
  if (ck.language.size() > 16 || !valid_utf8(ck.language)) return key_error("language", "is not a language code");
  if (!doc.contains("finished")) return key_error("finished", "is missing");
  if (!doc["finished"].is_boolean()) return key_error("finished", "is not a boolean");
  ck.finished = doc["finished"].get<bool>();
  return ck;
}

}  // namespace tandem::speech
