// One HTTP request that follows one tandemd job (internal to the gateway): the per-client slot, cancel when the
// client goes away (while queued, running or streaming), Tandem's state as headers and stream events, typed errors
// before and after the stream started, resumable errors when tandemd is lost. GenerationFlow (gateway.cc) and
// TranscriptionFlow (gateway_audio.cc) add what their API answers.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "http/gateway.h"

namespace tandem::http {

class JobFlow : public JobSink, public std::enable_shared_from_this<JobFlow> {
 public:
  JobFlow(Gateway& gw, std::shared_ptr<Exchange> ex, std::string endpoint, Flavor flavor);
  ~JobFlow() override;

  void accepted(const client::SubmitResult& s) override;
  void update(const client::JobUpdate& u) override;
  void degraded(const client::DegradedChange& d) override;
  void refused(const client::RemoteError& e) override { fail(error_from_remote(e)); }
  void lost(const std::string& why) override;

 protected:
  // Takes the client's slot and watches the connection; false (answered 429) when the client has too many.
  bool begin();
  // Hooks: the job was accepted (streams start here); an update arrived (after the view took it).
  virtual void on_accepted() = 0;
  virtual void on_update(const client::JobUpdate& u, bool changed) = 0;
  virtual bool streams() const = 0;
  // Whether tandemd can resume the job after a failure (generation: from its checkpoint; transcription: no, its
  // audio is not kept): errors then name POST /tandem/v1/jobs/{id}/resume, or say to send the request again.
  virtual bool resumable() const { return true; }

  // Starts the stream (headers with Tandem's state) and announces the placement.
  void start_stream(const std::string& content_type);
  // A state event: SSE comment ": tandem {...}" (OpenAI flavor) or an NDJSON line with a "tandem" key (made by
  // ndjson_state, Ollama flavor).
  void announce(const char* event);
  virtual nlohmann::json ndjson_state(nlohmann::json tandem) const { return {{"tandem", std::move(tandem)}}; }
  // An error: as the reply before a stream started, as the stream's last event after.
  void fail(const ApiError& e);
  // The answer is complete: the slot and the stream gauge go back.
  void release();
  // An Idempotency-Key named an earlier job: its outcome comes from GetJob (polled while it runs).
  void follow_existing();
  Gateway& gw_;
  std::shared_ptr<Exchange> ex_;
  std::string endpoint_;
  Flavor flavor_;
  JobView view_;
  std::string client_;
  bool streaming_ = false, done_ = false, gone_ = false;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();

 private:
  void client_gone();
  void cancel_job();
  std::weak_ptr<void> life_;
  bool slot_ = false, cancelled_ = false, stream_counted_ = false;
};

}  // namespace tandem::http
