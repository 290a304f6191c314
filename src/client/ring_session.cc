#include "client/ring_session.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstring>

#include "ring/record.h"

namespace tandem::client {

namespace {

VariantMap to_variants(const std::vector<ring::Field>& fields) {
  VariantMap m;
  for (const auto& f : fields) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          // D-Bus has no float32; the embedded vectors are decoded apart (decode_embedded).
          if constexpr (!std::is_same_v<T, std::vector<float>>) m.emplace(f.key, sdbus::Variant(x));
        },
        f.value);
  }
  return m;
}

template <class T>
std::optional<T> get(const VariantMap& m, const char* key) {
  auto it = m.find(key);
  if (it == m.end()) return std::nullopt;
  try {
    return it->second.get<T>();
  } catch (const sdbus::Error&) {
    return std::nullopt;
  }
}

// An `embedded` completion: count × dim float32 vectors beside the result keys. Every size is checked (the client
// trusts the daemon, but a mismatch must not become an out-of-range read or a silently short reply).
std::optional<std::string> decode_embedded(const ring::ParsedRecord& rec, const VariantMap& m, EmbedReply& out) {
  const auto count = get<std::uint64_t>(m, "count");
  const auto dim = get<std::uint64_t>(m, "dim");
  const auto* f = rec.find("vectors");
  const auto* v = f ? std::get_if<std::vector<float>>(&f->value) : nullptr;
  if (!count || !dim || !v) return "embedded without count, dim or vectors";
  if (*dim == 0 || *dim > (1u << 20) || *count > (1u << 20) || *count * *dim != v->size())
    return "embedded sizes disagree: count " + std::to_string(*count) + " × dim " + std::to_string(*dim) + " vs " +
           std::to_string(v->size()) + " values";
  VariantMap info = m;
  info.erase("count");
  out.info = embed_info_from_dbus(info);
  out.info.dim = static_cast<std::uint32_t>(*dim);
  out.vectors.resize(*count);
  for (std::uint64_t i = 0; i < *count; ++i)
    out.vectors[i].assign(v->begin() + static_cast<std::ptrdiff_t>(i * *dim),
                          v->begin() + static_cast<std::ptrdiff_t>((i + 1) * *dim));
  return std::nullopt;
}

}  // namespace

Result<std::vector<std::uint8_t>> embed_record(const EmbedRequest& r) {
  if (r.texts.empty() && r.tokens.empty() && r.images.empty() && r.image_fds.empty())
    return fail(Errc::invalid_argument, "Embed: no inputs");
  std::vector<std::int32_t> ids, lengths;  // the ring's int32 lists: all ids one after another, and each length
  for (const auto& t : r.tokens) {
    if (t.empty()) return fail(Errc::invalid_argument, "Embed: a token input is empty");
    for (auto id : t) {
      if (id > static_cast<std::uint32_t>(INT32_MAX))
        return fail(Errc::invalid_argument, "Embed: token id " + std::to_string(id) + " is over 2^31-1");
      ids.push_back(static_cast<std::int32_t>(id));
    }
    lengths.push_back(static_cast<std::int32_t>(t.size()));
  }
  ring::ByteList images = r.images;
  for (int fd : r.image_fds) {
    if (fd < 0) return fail(Errc::invalid_argument, "Embed: an image fd is negative");
    std::vector<std::uint8_t> bytes;
    std::uint8_t buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return fail(Errc::io_error, std::string("Embed: cannot read an image fd: ") + std::strerror(errno));
      if (n == 0) break;
      bytes.insert(bytes.end(), buf, buf + n);
    }
    images.push_back(std::move(bytes));
  }
  ring::RecordWriter w;
  if (!r.model.empty()) w.add("model", std::string_view(r.model));
  if (!r.texts.empty()) w.add("texts", r.texts);
  if (!ids.empty()) {
    w.add("tokens", ids);
    w.add("token_lengths", lengths);
  }
  if (!images.empty()) w.add("images", images);
  const auto& o = r.options;
  if (o.idempotency_key) w.add("idempotency_key", std::string_view(*o.idempotency_key));
  if (o.allow_cpu) w.add("allow_cpu", *o.allow_cpu);
  if (o.deadline_ms) w.add("deadline_ms", std::uint64_t{*o.deadline_ms});
  if (o.truncate) w.add("truncate", *o.truncate);
  return w.take();
}

Result<std::vector<std::uint8_t>> transcribe_record(const TranscribeRequest& r) {
  const bool file = r.audio_fd >= 0 || !r.audio.empty();
  if (file == r.stream.has_value())
    return fail(Errc::invalid_argument, file ? "Transcribe: a file or a stream, not both"
                                             : "Transcribe: no audio (a file, its fd, or a stream's format)");
  ring::RecordWriter w;
  if (!r.model.empty()) w.add("model", std::string_view(r.model));
  if (r.stream) {
    w.add("stream", true);
    w.add("sample_rate", std::uint64_t{r.stream->sample_rate});
    w.add("channels", std::uint64_t{r.stream->channels});
    w.add("sample_format", std::string_view(r.stream->sample_format));
  } else {
    std::vector<std::uint8_t> bytes = r.audio;
    if (r.audio_fd >= 0) {
      bytes.clear();
      std::uint8_t buf[65536];
      for (;;) {
        const ssize_t n = ::read(r.audio_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail(Errc::io_error, std::string("Transcribe: cannot read audio_fd: ") + std::strerror(errno));
        if (n == 0) break;
        bytes.insert(bytes.end(), buf, buf + n);
      }
    }
    w.add("audio", ring::ByteList{std::move(bytes)});
  }
  const auto& o = r.options;
  if (o.language && !o.language->empty()) w.add("language", std::string_view(*o.language));
  if (o.translate) w.add("translate", *o.translate);
  if (o.timestamps) w.add("timestamps", *o.timestamps);
  if (o.temperature) w.add("temperature", *o.temperature);
  if (o.temperature_fallback) w.add("temperature_fallback", *o.temperature_fallback);
  if (o.seed) w.add("seed", *o.seed);
  if (o.initial_prompt) w.add("initial_prompt", std::string_view(*o.initial_prompt));
  if (o.condition_on_previous_text) w.add("condition_on_previous_text", *o.condition_on_previous_text);
  if (o.idempotency_key) w.add("idempotency_key", std::string_view(*o.idempotency_key));
  if (o.allow_cpu) w.add("allow_cpu", *o.allow_cpu);
  if (o.deadline_ms) w.add("deadline_ms", *o.deadline_ms);
  return w.take();
}

std::vector<std::uint8_t> audio_record(std::uint64_t offset, std::span<const std::uint8_t> pcm, bool end) {
  ring::RecordWriter w;
  w.add("offset", offset);
  if (!pcm.empty()) w.add("pcm", ring::ByteList{std::vector<std::uint8_t>(pcm.begin(), pcm.end())});
  if (end) w.add("end", true);
  return w.take();
}

std::vector<std::uint8_t> submit_record(const Request& r) {
  ring::RecordWriter w;
  if (!r.model.empty()) w.add("model", std::string_view(r.model));
  if (!r.prompt.empty() || r.messages.empty()) w.add("prompt", std::string_view(r.prompt));
  if (!r.messages.empty()) {
    std::vector<std::string> flat;
    flat.reserve(r.messages.size() * 2);
    for (const auto& m : r.messages) {
      flat.push_back(m.role);
      flat.push_back(m.content);
    }
    w.add("messages", flat);
  }
  const auto& o = r.options;
  if (o.max_tokens) w.add("max_tokens", std::uint64_t{*o.max_tokens});
  if (o.temperature) w.add("temperature", *o.temperature);
  if (o.top_k) w.add("top_k", std::uint64_t{*o.top_k});
  if (o.top_p) w.add("top_p", *o.top_p);
  if (o.repetition_penalty) w.add("repetition_penalty", *o.repetition_penalty);
  if (o.seed) w.add("seed", *o.seed);
  if (o.stop) w.add("stop", *o.stop);
  if (o.idempotency_key) w.add("idempotency_key", std::string_view(*o.idempotency_key));
  if (o.side_effects) w.add("side_effects", *o.side_effects);
  if (o.allow_cpu) w.add("allow_cpu", *o.allow_cpu);
  if (o.allow_reduce) w.add("allow_reduce", *o.allow_reduce);
  if (o.allow_fallback_model) w.add("allow_fallback_model", *o.allow_fallback_model);
  if (o.enable_thinking) w.add("enable_thinking", *o.enable_thinking);
  if (o.deadline_ms) w.add("deadline_ms", *o.deadline_ms);
  if (o.prefill_chunk) w.add("prefill_chunk", std::uint64_t{*o.prefill_chunk});
  if (o.resume_tokens) w.add("resume_tokens", *o.resume_tokens);
  if (o.stream) w.add("stream", *o.stream);
  return w.take();
}

RingEvent decode_event(const ring::Event& e) {
  RingEvent ev;
  ev.user_data = e.entry.user_data;
  ev.job_id = e.entry.job_id;
  ev.kind = std::string(ring::kind_name(e.kind()));
  auto internal = [&](std::string why) {
    ev.kind = "error";
    ev.error = parse_remote_error(std::string(kErrorPrefix) + "Internal", "malformed ring completion: " + why);
    return ev;
  };
  if (e.kind() == ring::Kind::tokens) {
    JobUpdate u;
    u.job_id = ev.job_id;
    u.kind = "tokens";
    std::vector<std::int32_t> ids(e.entry.count);
    if (e.data.size() != std::size_t{e.entry.count} * 4 + e.entry.text_length) return internal("token sizes");
    if (!ids.empty()) std::memcpy(ids.data(), e.data.data(), ids.size() * 4);
    u.tokens = std::move(ids);
    u.text = std::string(reinterpret_cast<const char*>(e.data.data()) + std::size_t{e.entry.count} * 4,
                         e.entry.text_length);
    u.step = e.entry.step;
    ev.gap = (e.entry.flags & ring::kCqeGap) != 0;
    ev.update = std::move(u);
    return ev;
  }
  auto rec = ring::parse_record(e.data);
  if (!rec.ok()) return internal(rec.error->message);
  const VariantMap m = to_variants(rec.fields);
  switch (e.kind()) {
    case ring::Kind::accepted:
      ev.accepted = SubmitResult{ev.job_id, placement_from_dbus(m)};
      break;
    case ring::Kind::routed:
    case ring::Kind::started:
    case ring::Kind::migrated:
    case ring::Kind::finished:
    case ring::Kind::segment:
    case ring::Kind::progress:
      ev.update = job_update_from_dbus(ev.job_id, ev.kind, m);
      break;
    case ring::Kind::audio_info:  // the D-Bus JobUpdate "audio"
      ev.kind = "audio";
      ev.update = job_update_from_dbus(ev.job_id, ev.kind, m);
      break;
    case ring::Kind::error: {
      const auto name = get<std::string>(m, "error").value_or("Internal");
      std::string message = get<std::string>(m, "message").value_or("");
      // Same shape as a D-Bus error: the facts ride at the end of the message.
      for (const char* fact : {"retry_after_ms", "job", "tokens"})
        if (auto v = get<std::uint64_t>(m, fact)) message += std::string("; ") + fact + "=" + std::to_string(*v);
      ev.error = parse_remote_error(std::string(kErrorPrefix) + name, message);
      break;
    }
    case ring::Kind::cancel_result:
      ev.cancel_state = get<std::string>(m, "state").value_or("");
      break;
    case ring::Kind::nop:
      break;
    case ring::Kind::embedded: {
      EmbedReply reply;
      if (auto why = decode_embedded(rec, m, reply)) return internal(*why);
      ev.embedded = std::move(reply);
      break;
    }
    case ring::Kind::degraded_mode: {
      VariantMap details = m;
      details.erase("degraded");
      details.erase("reason");
      ev.degraded = degraded_from_dbus(get<bool>(m, "degraded").value_or(false), get<std::string>(m, "reason").value_or(""),
                                       details);
      break;
    }
    default:
      return internal("unknown kind " + std::to_string(e.entry.kind));
  }
  return ev;
}

Result<std::unique_ptr<RingSession>> RingSession::open(Client& client, const Client::SessionOptions& options,
                                                      ring::SpinPolicy spin) {
  auto h = client.open_session(options);
  if (!h) return fail(std::move(h).error());
  const std::uint64_t id = h->session_id;
  auto ring = ring::RingClient::attach(std::exchange(h->memfd, -1), std::exchange(h->submit_doorbell, -1),
                                       std::exchange(h->completion_doorbell, -1), spin);
  if (!ring) {
    (void)client.close_session(id);
    return fail(std::move(ring).error());
  }
  std::unique_ptr<RingSession> s(new RingSession());
  s->client_ = &client;
  s->ring_ = std::move(ring).value();
  return s;
}

RingSession::~RingSession() {
  if (ring_ && client_ && ring_->state() == ring::SessionState::open) (void)client_->close_session(ring_->session_id());
}

Result<void> RingSession::submit(const Request& r, std::uint64_t user_data) {
  return ring_->submit(user_data, submit_record(r));
}

Result<void> RingSession::embed(const EmbedRequest& r, std::uint64_t user_data) {
  auto rec = embed_record(r);
  if (!rec) return fail(std::move(rec).error());
  return ring_->embed(user_data, *rec);
}

Result<void> RingSession::transcribe(const TranscribeRequest& r, std::uint64_t user_data) {
  auto rec = transcribe_record(r);
  if (!rec) return fail(std::move(rec).error());
  return ring_->transcribe(user_data, *rec);
}

Result<void> RingSession::audio(std::uint64_t job, std::uint64_t offset, std::span<const std::uint8_t> pcm, bool end,
                                std::uint64_t user_data) {
  return ring_->audio(user_data, job, audio_record(offset, pcm, end));
}

Result<void> RingSession::cancel(std::uint64_t job_id, std::uint64_t user_data) {
  return ring_->cancel(user_data, job_id);
}

Result<void> RingSession::nop(std::uint64_t user_data) { return ring_->nop(user_data); }

Result<std::size_t> RingSession::poll(std::vector<RingEvent>& out) {
  raw_.clear();
  auto n = ring_->reap(raw_);
  if (!n) return n;
  for (const auto& e : raw_) out.push_back(decode_event(e));
  return n;
}

Result<std::size_t> RingSession::wait(std::vector<RingEvent>& out, std::chrono::nanoseconds timeout, int extra_fd) {
  raw_.clear();
  auto n = ring_->wait(raw_, timeout, extra_fd);
  if (!n) return n;
  for (const auto& e : raw_) out.push_back(decode_event(e));
  return n;
}

std::string RingSession::state_text() const {
  const auto st = ring_->state();
  std::string s(ring::session_state_name(st));
  if (st == ring::SessionState::failed) s += " (" + std::string(ring::fault_name(ring_->fault())) + ")";
  return s;
}

}  // namespace tandem::client
