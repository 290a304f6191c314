// What the HTTP gateway needs from tandemd, as a narrow asynchronous interface: submit/resume/cancel a generation
// job and follow it, embed, and read models, status and jobs. The real one is TandemLink (tandem_link.h: a thread
// with a D-Bus client and a ring session); tests use a fake (tests/http/fake_backend.h). Every callback runs on the
// gateway's I/O thread (the implementation posts them there), so handlers need no locks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/format.h"
#include "client/requests.h"

namespace tandem::http {

// A value, or tandemd's error (a D-Bus error name and message; the bus's own when tandemd is not there).
template <class T>
struct Outcome {
  std::optional<T> value;
  client::RemoteError error;
  bool ok() const { return value.has_value(); }
  static Outcome success(T v) { return Outcome{std::move(v), {}}; }
  static Outcome failure(client::RemoteError e) { return Outcome{std::nullopt, std::move(e)}; }
};

// Receives one job's events, in order: accepted (or refused), then updates until "finished" (or lost).
class JobSink {
 public:
  virtual ~JobSink() = default;
  virtual void accepted(const client::SubmitResult& s) = 0;
  virtual void update(const client::JobUpdate& u) = 0;          // routed, started, tokens, migrated, finished
  virtual void degraded(const client::DegradedChange& d) = 0;   // the service's degraded mode changed
  virtual void refused(const client::RemoteError& e) = 0;       // not accepted: nothing runs
  // The link to tandemd ended while the job was open (tandemd restarted, the bus went away): the job survives in
  // tandemd's journal, its outcome is read with GetJob, and a failed job is resumed.
  virtual void lost(const std::string& why) = 0;
};

// A model with what the gateway shows of it: ListModels' entry and the model object's details (placement bytes).
struct ModelEntry {
  client::ModelInfo info;
  std::optional<client::ModelDetails> details;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void submit(const client::Request& r, std::shared_ptr<JobSink> sink) = 0;
  virtual void resume(std::uint64_t job, const client::SubmitOptions& overrides, std::shared_ptr<JobSink> sink) = 0;
  // A transcription of one audio file (r.audio): accepted or refused, then the job's audio/segment/progress
  // updates and "finished" (whose text is the whole transcript; GetJob has the segments).
  virtual void transcribe(const client::TranscribeRequest& r, std::shared_ptr<JobSink> sink) = 0;
  // A live transcription (r.stream set; the Wyoming server's): accepted or refused like transcribe; then audio()
  // appends PCM to the accepted job in order (the implementation keeps the offsets and resends what tandemd refused
  // for backpressure); `end` closes the stream.
  virtual void transcribe_stream(const client::TranscribeRequest& r, std::shared_ptr<JobSink> sink) = 0;
  virtual void audio(std::uint64_t job, std::string pcm, bool end) = 0;
  // Cancel (fire and forget: the job's own "finished" update follows when it was running for a sink).
  virtual void cancel(std::uint64_t job) = 0;
  virtual void embed(const client::EmbedRequest& r, std::function<void(Outcome<client::EmbedReply>)> done) = 0;
  virtual void models(std::function<void(Outcome<std::vector<ModelEntry>>)> done) = 0;
  virtual void status(std::function<void(Outcome<client::ServiceStatus>)> done) = 0;
  virtual void get_job(std::uint64_t job, std::function<void(Outcome<client::JobInfo>)> done) = 0;
  // Whether the link to tandemd is up now (tandemd owns its name and a ring session is open).
  virtual bool connected() const = 0;
};

}  // namespace tandem::http
