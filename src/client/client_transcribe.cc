// Client::transcribe (io.tandem.Tandem1.Transcribe) and the transcript formats (SRT, WebVTT) tandemctl writes.
#include <cmath>
#include <cstdio>
#include <utility>

#include <nlohmann/json.hpp>

#include "client/client_impl.h"

namespace tandem::client {

namespace {

// A change of Transcribe's signature in the XML breaks the build here.
static_assert(std::is_same_v<decltype(std::declval<io::tandem::Tandem1_proxy&>().Transcribe(
                                 std::string{}, std::vector<sdbus::UnixFd>{}, std::vector<std::uint8_t>{},
                                 VariantMap{})),
                             std::tuple<std::uint64_t, VariantMap>>,
              "io.tandem.Tandem1.Transcribe changed: update Client::transcribe");

}  // namespace

VariantMap to_dbus(const TranscribeOptions& o) {
  VariantMap m;
  if (o.language) m["language"] = sdbus::Variant(*o.language);
  if (o.translate) m["translate"] = sdbus::Variant(*o.translate);
  if (o.timestamps) m["timestamps"] = sdbus::Variant(*o.timestamps);
  if (o.temperature) m["temperature"] = sdbus::Variant(*o.temperature);
  if (o.temperature_fallback) m["temperature_fallback"] = sdbus::Variant(*o.temperature_fallback);
  if (o.seed) m["seed"] = sdbus::Variant(*o.seed);
  if (o.initial_prompt) m["initial_prompt"] = sdbus::Variant(*o.initial_prompt);
  if (o.condition_on_previous_text) m["condition_on_previous_text"] = sdbus::Variant(*o.condition_on_previous_text);
  if (o.idempotency_key) m["idempotency_key"] = sdbus::Variant(*o.idempotency_key);
  if (o.allow_cpu) m["allow_cpu"] = sdbus::Variant(*o.allow_cpu);
  if (o.deadline_ms) m["deadline_ms"] = sdbus::Variant(*o.deadline_ms);
  return m;
}

Result<SubmitResult> Client::transcribe(const TranscribeRequest& r) {
  if (r.stream)
    return fail(Errc::invalid_argument, "Transcribe: a live stream goes through a ring session (RingSession::transcribe)");
  if ((r.audio_fd >= 0) == !r.audio.empty())
    return fail(Errc::invalid_argument, "Transcribe: give an audio fd or the audio bytes (exactly one)");
  return impl_->guarded<SubmitResult>("Transcribe", [&] {
    std::vector<sdbus::UnixFd> fds;
    if (r.audio_fd >= 0) fds.emplace_back(r.audio_fd);  // dups: the caller keeps its own
    auto [id, placement] = impl_->methods->Transcribe(r.model, fds, r.audio, to_dbus(r.options));
    return SubmitResult{id, placement_from_dbus(placement)};
  });
}

}  // namespace tandem::client
