#include "daemon/transcribe_record.h"

#include <cmath>
#include <string_view>

namespace tandem::daemon {

namespace {

Failure bad_type(const char* record, const ring::Field& f, const char* want) {
  return fail(Errc::invalid_argument, std::string(record) + " record: '" + f.key + "' must be " + want + ", got " +
                                          std::string(ring::field_type_name(f.value)));
}

// uint64, or int64 >= 0 (clients in languages without unsigned integers).
Result<std::uint64_t> unsigned_value(const char* record, const ring::Field& f) {
  if (const auto* u = std::get_if<std::uint64_t>(&f.value)) return *u;
  if (const auto* i = std::get_if<std::int64_t>(&f.value)) {
    if (*i < 0)
      return fail(Errc::invalid_argument,
                  std::string(record) + " record: '" + f.key + "' must be >= 0, got " + std::to_string(*i));
    return static_cast<std::uint64_t>(*i);
  }
  return bad_type(record, f, "an unsigned integer");
}

}  // namespace

Result<TranscribeRequest> transcribe_from_record(const std::vector<ring::Field>& fields) {
  constexpr const char* R = "transcribe";
  TranscribeRequest r;
  r.audio_name = "audio";
  auto& o = r.options;
  bool stream = false;
  std::optional<std::uint64_t> rate, channels;
  std::optional<std::string> sample_format;
  for (const auto& f : fields) {
    const std::string_view k = f.key;
    if (k == "model" || k == "language" || k == "initial_prompt" || k == "idempotency_key" || k == "sample_format") {
      const auto* s = std::get_if<std::string>(&f.value);
      if (!s) return bad_type(R, f, "a string");
      if (k == "model") r.model = *s;
      else if (k == "language") o.language = *s;
      else if (k == "initial_prompt") o.initial_prompt = *s;
      else if (k == "idempotency_key") o.idempotency_key = *s;
      else sample_format = *s;
    } else if (k == "audio") {
      const auto* l = std::get_if<ring::ByteList>(&f.value);
      if (!l) return bad_type(R, f, "a bytes_list");
      if (l->size() != 1)
        return fail(Errc::invalid_argument, "transcribe record: 'audio' holds " + std::to_string(l->size()) +
                                                " elements; give one file");
      r.audio = std::make_shared<const std::vector<std::uint8_t>>(l->front());
    } else if (k == "stream" || k == "translate" || k == "timestamps" || k == "temperature_fallback" ||
               k == "condition_on_previous_text" || k == "allow_cpu") {
      const auto* b = std::get_if<bool>(&f.value);
      if (!b) return bad_type(R, f, "a boolean");
      if (k == "stream") stream = *b;
      else if (k == "translate") o.translate = *b;
      else if (k == "timestamps") o.timestamps = *b;
      else if (k == "temperature_fallback") o.temperature_fallback = *b;
      else if (k == "condition_on_previous_text") o.condition_on_previous_text = *b;
      else o.allow_cpu = *b;
    } else if (k == "temperature") {
      const auto* d = std::get_if<double>(&f.value);
      if (!d) return bad_type(R, f, "a float64");
      o.temperature = *d;
    } else if (k == "seed" || k == "deadline_ms" || k == "sample_rate" || k == "channels") {
      auto u = unsigned_value(R, f);
      if (!u) return fail(std::move(u).error());
      if (k == "seed") o.seed = *u;
      else if (k == "deadline_ms") o.deadline_ms = *u;
      else if (k == "sample_rate") rate = *u;
      else channels = *u;
    } else {
      return fail(Errc::invalid_argument,
                  "transcribe record: unknown key '" + f.key +
                      "' (known: model, audio, stream, sample_rate, channels, sample_format, language, translate, "
                      "timestamps, temperature, temperature_fallback, seed, initial_prompt, "
                      "condition_on_previous_text, idempotency_key, allow_cpu, deadline_ms)");
    }
  }
  if (stream) {
    if (r.audio) return fail(Errc::invalid_argument, "transcribe record: give 'audio' (a file) or 'stream', not both");
    if (!rate) return fail(Errc::invalid_argument, "transcribe record: a stream needs 'sample_rate'");
    audio::StreamFormat fmt;
    fmt.rate = static_cast<int>(std::min<std::uint64_t>(*rate, 1u << 30));
    fmt.channels = static_cast<int>(std::min<std::uint64_t>(channels.value_or(1), 1u << 30));
    if (sample_format) {
      auto sf = audio::parse_sample_format(*sample_format);
      if (!sf) return fail(Errc::invalid_argument, "transcribe record: " + sf.error().message);
      fmt.sample = *sf;
    }
    r.stream = fmt;
  } else {
    if (rate || channels || sample_format)
      return fail(Errc::invalid_argument,
                  "transcribe record: sample_rate, channels and sample_format are for a stream (stream = true)");
    if (!r.audio) return fail(Errc::invalid_argument, "transcribe record: no audio (give 'audio' or 'stream')");
  }
  return r;
}

Result<AudioChunk> audio_from_record(const std::vector<ring::Field>& fields) {
  constexpr const char* R = "audio";
  AudioChunk c;
  bool has_offset = false;
  for (const auto& f : fields) {
    const std::string_view k = f.key;
    if (k == "offset") {
      auto u = unsigned_value(R, f);
      if (!u) return fail(std::move(u).error());
      c.offset = *u;
      has_offset = true;
    } else if (k == "pcm") {
      const auto* l = std::get_if<ring::ByteList>(&f.value);
      if (!l) return bad_type(R, f, "a bytes_list");
      if (l->size() > 1)
        return fail(Errc::invalid_argument,
                    "audio record: 'pcm' holds " + std::to_string(l->size()) + " elements; give one");
      if (!l->empty()) c.pcm = l->front();
    } else if (k == "end") {
      const auto* b = std::get_if<bool>(&f.value);
      if (!b) return bad_type(R, f, "a boolean");
      c.end = *b;
    } else {
      return fail(Errc::invalid_argument, "audio record: unknown key '" + f.key + "' (known: offset, pcm, end)");
    }
  }
  if (!has_offset) return fail(Errc::invalid_argument, "audio record: 'offset' is required");
  if (c.pcm.empty() && !c.end) return fail(Errc::invalid_argument, "audio record: no 'pcm' and no 'end'");
  return c;
}

std::vector<std::uint8_t> transcribe_record(const TranscribeRequest& r) {
  ring::RecordWriter w;
  const auto& o = r.options;
  if (!r.model.empty()) w.add("model", std::string_view(r.model));
  if (r.stream) {
    w.add("stream", true);
    w.add("sample_rate", static_cast<std::uint64_t>(r.stream->rate));
    w.add("channels", static_cast<std::uint64_t>(r.stream->channels));
    w.add("sample_format", audio::sample_format_name(r.stream->sample));
  } else if (r.audio) {
    w.add("audio", ring::ByteList{*r.audio});
  }
  if (!o.language.empty()) w.add("language", std::string_view(o.language));
  if (o.translate) w.add("translate", true);
  if (!o.timestamps) w.add("timestamps", false);
  if (o.temperature) w.add("temperature", *o.temperature);
  if (!o.temperature_fallback) w.add("temperature_fallback", false);
  if (o.seed != 0) w.add("seed", o.seed);
  if (!o.initial_prompt.empty()) w.add("initial_prompt", std::string_view(o.initial_prompt));
  if (!o.condition_on_previous_text) w.add("condition_on_previous_text", false);
  if (o.idempotency_key) w.add("idempotency_key", std::string_view(*o.idempotency_key));
  if (o.allow_cpu) w.add("allow_cpu", *o.allow_cpu);
  if (o.deadline_ms) w.add("deadline_ms", *o.deadline_ms);
  return w.take();
}

std::vector<std::uint8_t> audio_record(const AudioChunk& c) {
  ring::RecordWriter w;
  w.add("offset", c.offset);
  if (!c.pcm.empty()) w.add("pcm", ring::ByteList{c.pcm});
  if (c.end) w.add("end", true);
  return w.take();
}

}  // namespace tandem::daemon
