// The Wyoming protocol: framing and the speech-to-text session (wyoming.h).
#include "http/wyoming.h"

#include <cmath>

#include "core/text.h"

namespace tandem::http {

using nlohmann::json;

Result<void> WyomingReader::feed(std::string_view bytes) {
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {  // compact what was consumed
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(bytes);
  return {};
}

Result<std::optional<WyomingEvent>> WyomingReader::next() {
  const std::size_t nl = buf_.find('\n', pos_);
  if (nl == std::string::npos) {
    if (buf_.size() - pos_ > limits_.max_header_bytes)
      return fail(Errc::invalid_argument, "a header line longer than " + std::to_string(limits_.max_header_bytes) +
                                              " bytes (or without its newline)");
    return std::optional<WyomingEvent>{};
  }
  const std::string_view line(buf_.data() + pos_, nl - pos_);
  if (line.size() > limits_.max_header_bytes)
    return fail(Errc::invalid_argument, "a header line longer than " + std::to_string(limits_.max_header_bytes) + " bytes");
  if (!valid_utf8(line) || json_nesting_depth(line, 16) > 16) return fail(Errc::invalid_argument, "the header is not UTF-8 JSON of sane depth");
  json h;
  try {
    h = json::parse(line);
  } catch (const json::exception&) {  // parse_error, and out_of_range for a number beyond double
    return fail(Errc::invalid_argument, "the header line is not JSON");
  }
  if (!h.is_object() || !h.contains("type") || !h["type"].is_string() || h["type"].get<std::string>().empty())
    return fail(Errc::invalid_argument, "the header has no \"type\"");
  auto length = [&](const char* key, std::size_t max) -> Result<std::size_t> {
    if (!h.contains(key) || h[key].is_null()) return std::size_t{0};
    if (!h[key].is_number_unsigned() && !(h[key].is_number_integer() && h[key].get<std::int64_t>() >= 0))
      return fail(Errc::invalid_argument, std::string("\"") + key + "\" is not a length");
    const auto v = h[key].get<std::uint64_t>();
    if (v > max) return fail(Errc::invalid_argument, std::string("\"") + key + "\" " + std::to_string(v) + " is over the limit of " + std::to_string(max));
    return static_cast<std::size_t>(v);
  };
  auto dl = length("data_length", limits_.max_data_bytes);
  if (!dl.ok()) return fail(dl.error());
  auto pl = length("payload_length", limits_.max_payload_bytes);
  if (!pl.ok()) return fail(pl.error());
  const std::size_t need = (nl + 1 - pos_) + *dl + *pl;
  if (buf_.size() - pos_ < need) return std::optional<WyomingEvent>{};
  WyomingEvent e;
  e.type = h["type"].get<std::string>();
  if (h.contains("data") && !h["data"].is_null()) {
    if (!h["data"].is_object()) return fail(Errc::invalid_argument, "\"data\" is not an object");
    e.data = h["data"];
  }
  if (*dl) {
    const std::string_view extra(buf_.data() + nl + 1, *dl);
    json x;
    try {
      if (!valid_utf8(extra) || json_nesting_depth(extra, 16) > 16) throw std::runtime_error("depth");
      x = json::parse(extra);
    } catch (const std::exception&) {
      return fail(Errc::invalid_argument, "the extra data is not JSON");
    }
    if (!x.is_object()) return fail(Errc::invalid_argument, "the extra data is not a JSON object");
    for (auto it = x.begin(); it != x.end(); ++it) e.data[it.key()] = it.value();
  }
  e.payload.assign(buf_.data() + nl + 1 + *dl, *pl);
  pos_ += need;
  return std::optional<WyomingEvent>(std::move(e));
}

std::string wyoming_encode(const WyomingEvent& e) {
  const std::string data = e.data.is_object() && !e.data.empty() ? e.data.dump() : std::string();
  json h = {{"type", e.type}, {"version", "1.5.4"}};
  if (!data.empty()) h["data_length"] = data.size();
  if (!e.payload.empty()) h["payload_length"] = e.payload.size();
  return h.dump() + "\n" + data + e.payload;
}

WyomingEvent wyoming_error(const std::string& text, const std::string& code) {
  return {"error", {{"text", text}, {"code", code}}, {}};
}

WyomingEvent wyoming_info(const std::vector<client::ModelInfo>& models, const std::string& version) {
  const json attribution = {{"name", "Tandem"}, {"url", "https://github.com/tandem"}};
  json ms = json::array();
  for (const auto& m : models) {
    if (m.kind.value_or("") != "speech" || !m.name) continue;
    ms.push_back({{"name", *m.name},
                  {"languages", m.languages.value_or(std::vector<std::string>{})},
                  {"attribution", attribution},
                  {"installed", true},
                  {"description", "Whisper-layout speech model served by tandemd (GPU with CPU fail-over)"},
                  {"version", m.revision.value_or(version)}});
  }
  json asr = json::array({{{"name", "tandem"},
                           {"attribution", attribution},
                           {"installed", true},
                           {"description", "Tandem speech-to-text"},
                           {"version", version},
                           {"models", ms}}});
  return {"info", {{"asr", asr}, {"tts", json::array()}, {"handle", json::array()}, {"intent", json::array()},
                   {"wake", json::array()}},
          {}};
}

namespace {

WyomingAction send(WyomingEvent e) {
  WyomingAction a;
  a.kind = WyomingAction::Kind::send;
  a.event = std::move(e);
  return a;
}

WyomingAction close_with(const std::string& text, const std::string& code) {
  WyomingAction a;
  a.kind = WyomingAction::Kind::close;
  a.event = wyoming_error(text, code);
  return a;
}

// rate, width, channels of audio-start / audio-chunk.
bool read_format(const json& d, std::uint32_t& rate, std::uint32_t& width, std::uint32_t& channels) {
  auto u = [&](const char* k, std::uint32_t& out) {
    if (!d.contains(k) || !d[k].is_number_integer() || d[k].get<std::int64_t>() < 0) return false;
    const auto v = d[k].get<std::uint64_t>();
    if (v > 1000000) return false;
    out = static_cast<std::uint32_t>(v);
    return true;
  };
  return u("rate", rate) && u("width", width) && u("channels", channels);
}

}  // namespace

std::vector<WyomingAction> WyomingSession::on_event(const WyomingEvent& e) {
  const json& d = e.data;
  if (e.type == "describe") {
    WyomingAction a;
    a.kind = WyomingAction::Kind::describe;
    return {a};
  }
  if (e.type == "ping") return {send({"pong", d.contains("text") ? json{{"text", d["text"]}} : json::object(), {}})};
  if (e.type == "transcribe") {
    if (streaming()) return {close_with("transcribe during an utterance (send audio-stop first)", "protocol")};
    model_ = d.contains("name") && d["name"].is_string() ? d["name"].get<std::string>() : "";
    language_ = d.contains("language") && d["language"].is_string() ? d["language"].get<std::string>() : "";
    context_ = d.contains("context") && d["context"].is_object() ? d["context"] : json::object();
    state_ = State::armed;
    return {};
  }
  if (e.type == "audio-start") {
    if (streaming()) return {close_with("a second audio-start during an utterance", "protocol")};
    std::uint32_t width = 0;
    if (!read_format(d, rate_, width, channels_)) return {close_with("audio-start needs rate, width and channels", "protocol")};
    if (width != 2) return {close_with("only 16-bit PCM (width 2) is supported", "unsupported_audio")};
    if (rate_ < 1000 || rate_ > 768000 || channels_ < 1 || channels_ > 32)
      return {close_with("rate must be 1000..768000 Hz and channels 1..32", "unsupported_audio")};
    WyomingAction a;
    a.kind = WyomingAction::Kind::start_stream;
    a.request.model = model_;
    a.request.stream = client::AudioStreamFormat{rate_, channels_, "s16le"};
    if (!language_.empty()) a.request.options.language = language_;
    // Tandem's decoding options ride in the transcribe event's context (docs/http.md "Wyoming").
    if (context_.contains("tandem") && context_["tandem"].is_object()) {
      const json& t = context_["tandem"];
      if (t.contains("temperature")) {
        if (!t["temperature"].is_number() || t["temperature"].get<double>() < 0 || t["temperature"].get<double>() > 1)
          return {close_with("context.tandem.temperature must be a number from 0 to 1", "invalid")};
        a.request.options.temperature = t["temperature"].get<double>();
      }
      if (t.contains("seed")) {
        if (!t["seed"].is_number_integer() || t["seed"].get<std::int64_t>() < 0)
          return {close_with("context.tandem.seed must be a non-negative integer", "invalid")};
        a.request.options.seed = t["seed"].get<std::uint64_t>();
      }
      if (t.contains("temperature_fallback")) {
        if (!t["temperature_fallback"].is_boolean()) return {close_with("context.tandem.temperature_fallback must be true or false", "invalid")};
        a.request.options.temperature_fallback = t["temperature_fallback"].get<bool>();
      }
    }
    state_ = State::streaming;
    sent_start_ = false;
    return {a};
  }
  if (e.type == "audio-chunk") {
    if (state_ != State::streaming) return {close_with("audio-chunk before audio-start", "protocol")};
    std::uint32_t r = 0, w = 0, c = 0;
    if (read_format(d, r, w, c) && (r != rate_ || w != 2 || c != channels_))
      return {close_with("the audio format changed within an utterance", "protocol")};
    if (e.payload.size() % (2 * channels_) != 0) return {close_with("an audio-chunk holds a partial frame", "protocol")};
    if (e.payload.empty()) return {};
    WyomingAction a;
    a.kind = WyomingAction::Kind::audio;
    a.pcm = e.payload;
    return {a};
  }
  if (e.type == "audio-stop") {
    if (state_ != State::streaming) return {close_with("audio-stop before audio-start", "protocol")};
    state_ = State::stopped;
    WyomingAction a;
    a.kind = WyomingAction::Kind::audio;
    a.end = true;
    return {a};
  }
  return {};  // events of other programs (wake, tts, ...) are not for speech-to-text: ignored, as Wyoming peers do
}

std::vector<WyomingAction> WyomingSession::on_segment(const std::string& text) {
  std::vector<WyomingAction> out;
  if (!sent_start_) {
    json d = json::object();
    if (!language_.empty()) d["language"] = language_;
    out.push_back(send({"transcript-start", d, {}}));
    sent_start_ = true;
  }
  out.push_back(send({"transcript-chunk", {{"text", text}}, {}}));
  return out;
}

std::vector<WyomingAction> WyomingSession::on_finished(const std::string& text, const std::string& language) {
  std::vector<WyomingAction> out;
  std::string t = text;
  while (!t.empty() && t.front() == ' ') t.erase(0, 1);
  json d = {{"text", t}};
  if (!language.empty()) d["language"] = language;
  out.push_back(send({"transcript", d, {}}));
  if (sent_start_) out.push_back(send({"transcript-stop", json::object(), {}}));
  state_ = State::idle;
  sent_start_ = false;
  return out;
}

std::vector<WyomingAction> WyomingSession::on_failed(const std::string& message, const std::string& code) {
  state_ = State::idle;
  return {close_with(message, code)};
}

}  // namespace tandem::http
