// Fakes for the gateway's tests: a Backend that records calls and lets the test play tandemd's events, and an
// Exchange that records what would go on the wire.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "http/gateway.h"

namespace tandem::http::testing {

class FakeBackend : public Backend {
 public:
  struct Submitted {
    client::Request request;
    std::shared_ptr<JobSink> sink;
    std::uint64_t resume_of = 0;
  };
  std::vector<Submitted> submitted;
  std::vector<std::uint64_t> cancelled;
  std::vector<std::pair<client::TranscribeRequest, std::shared_ptr<JobSink>>> transcribed;
  std::optional<std::string> segments_json;  // what get_job answers
  std::vector<std::pair<client::EmbedRequest, std::function<void(Outcome<client::EmbedReply>)>>> embeds;
  std::vector<ModelEntry> model_list;
  std::optional<client::ServiceStatus> service_status;
  bool up = true;
  int models_calls = 0;

  void submit(const client::Request& r, std::shared_ptr<JobSink> sink) override { submitted.push_back({r, sink, 0}); }
  void resume(std::uint64_t job, const client::SubmitOptions& o, std::shared_ptr<JobSink> sink) override {
    client::Request r;
    r.options = o;
    submitted.push_back({r, sink, job});
  }
  void transcribe(const client::TranscribeRequest& r, std::shared_ptr<JobSink> sink) override {
    transcribed.push_back({r, sink});
  }
  void transcribe_stream(const client::TranscribeRequest& r, std::shared_ptr<JobSink> sink) override {
    transcribed.push_back({r, sink});
  }
  void audio(std::uint64_t job, std::string pcm, bool end) override { audio_sent.push_back({job, pcm, end}); }
  struct Audio {
    std::uint64_t job;
    std::string pcm;
    bool end;
  };
  std::vector<Audio> audio_sent;
  void cancel(std::uint64_t job) override { cancelled.push_back(job); }
  void embed(const client::EmbedRequest& r, std::function<void(Outcome<client::EmbedReply>)> done) override {
    embeds.emplace_back(r, std::move(done));
  }
  void models(std::function<void(Outcome<std::vector<ModelEntry>>)> done) override {
    ++models_calls;
    done(Outcome<std::vector<ModelEntry>>::success(model_list));
  }
  void status(std::function<void(Outcome<client::ServiceStatus>)> done) override {
    if (service_status) done(Outcome<client::ServiceStatus>::success(*service_status));
    else done(Outcome<client::ServiceStatus>::failure(client::parse_remote_error("org.freedesktop.DBus.Error.ServiceUnknown", "gone")));
  }
  void get_job(std::uint64_t job, std::function<void(Outcome<client::JobInfo>)> done) override {
    client::JobInfo j;
    j.id = job;
    j.state = "completed";
    j.segments_json = segments_json;
    j.language = "en";
    j.audio_ms = 2500;
    done(Outcome<client::JobInfo>::success(j));
  }
  bool connected() const override { return up; }
};

class FakeExchange : public Exchange {
 public:
  explicit FakeExchange(RequestInfo r) : req_(std::move(r)) {}
  const RequestInfo& request() const override { return req_; }
  void reply(int s, std::string ct, std::string b, Headers h) override {
    status = s;
    content_type = std::move(ct);
    body = std::move(b);
    headers = std::move(h);
    replied = true;
    on_close_ = nullptr;
  }
  void start_stream(int s, std::string ct, Headers h) override {
    status = s;
    content_type = std::move(ct);
    headers = std::move(h);
    streaming = true;
  }
  void send(std::string d) override { chunks.push_back(std::move(d)); }
  void end_stream() override {
    ended = true;
    on_close_ = nullptr;
  }
  void on_close(std::function<void()> cb) override { on_close_ = std::move(cb); }
  bool closed() const override { return closed_; }
  // The client goes away.
  void close() {
    closed_ = true;
    if (auto cb = std::move(on_close_)) cb();
  }
  std::string header(const std::string& name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return {};
  }

  int status = 0;
  std::string content_type, body;
  Headers headers;
  std::vector<std::string> chunks;
  bool replied = false, streaming = false, ended = false;

 private:
  RequestInfo req_;
  std::function<void()> on_close_;
  bool closed_ = false;
};

inline std::shared_ptr<FakeExchange> post(const std::string& path, const std::string& body, std::string client = "local") {
  RequestInfo r;
  r.method = "POST";
  r.path = path;
  r.body = body;
  r.client = std::move(client);
  return std::make_shared<FakeExchange>(std::move(r));
}

inline std::shared_ptr<FakeExchange> get(const std::string& path) {
  RequestInfo r;
  r.method = "GET";
  r.path = path;
  r.client = "local";
  return std::make_shared<FakeExchange>(std::move(r));
}

}  // namespace tandem::http::testing
