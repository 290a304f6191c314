// POST /v1/audio/transcriptions and /v1/audio/translations (docs/http.md): the upload goes to tandemd's Transcribe;
// segments stream as SSE events as their windows finish (stream=true), or the transcript comes back whole in the
// response_format asked for, with Tandem's state in the headers and the JSON formats' "tandem" member.
#include <algorithm>

#include "http/audio.h"
#include "http/gateway.h"
#include "http/job_flow.h"

namespace tandem::http {

using nlohmann::json;

namespace {

bool is_speech(const ModelEntry& m) { return m.info.kind.value_or("llm") == "speech"; }

class TranscriptionFlow : public JobFlow {
 public:
  TranscriptionFlow(Gateway& gw, std::shared_ptr<Exchange> ex, TranscriptionCall call, std::string endpoint)
      : JobFlow(gw, std::move(ex), std::move(endpoint), Flavor::openai), call_(std::move(call)) {}

  void start() {
    if (!begin()) return;
    auto self = std::static_pointer_cast<TranscriptionFlow>(shared_from_this());
    gw_.with_models([self](Outcome<std::vector<ModelEntry>> o) { self->with_models(std::move(o)); });
  }

 private:
  bool streams() const override { return call_.stream; }
  bool resumable() const override { return false; }  // tandemd keeps no audio

  void with_models(Outcome<std::vector<ModelEntry>> o) {
    if (gone_) return;
    if (!o.ok()) return fail(error_from_remote(o.error));
    const ModelEntry* m = nullptr;
    std::vector<std::string> names;
    for (const auto& e : *o.value) {
      if (!is_speech(e) || !e.info.name) continue;
      names.push_back(*e.info.name);
      const std::string& n = *e.info.name;
      if (n == call_.model || (call_.model.ends_with(":latest") && n == call_.model.substr(0, call_.model.size() - 7))) m = &e;
    }
    if (!m) {
      for (const auto& e : *o.value)
        if (e.info.name == call_.model)
          return fail(invalid_field("model", "'" + call_.model + "' is not a speech model"));
      return fail(unknown_model(call_.model, names));
    }
    client::TranscribeRequest r;
    r.model = *m->info.name;
    r.audio = std::move(call_.audio);
    r.options = call_.options;
    if (auto it = ex_->request().headers.find("idempotency-key"); it != ex_->request().headers.end()) {
      auto key = scoped_key(client_, it->second);
      if (!key.ok()) return fail(*key.error);
      r.options.idempotency_key = *key;
    }
    gw_.backend().transcribe(r, shared_from_this());
  }

  void on_accepted() override {
    if (call_.stream) start_stream("text/event-stream");
  }

  void on_update(const client::JobUpdate& u, bool changed) override {
    if (call_.stream) {
      if (changed) announce("change");
      if (u.kind == "segment") ex_->send(sse_data(transcript_delta(segment_from_update(u))));
    }
    if (u.kind != "finished") return;
    if (view_.state() != "completed") return fail(view_.failure(resumable()));
    // The segments (and the language, the duration) are GetJob's.
    auto self = std::static_pointer_cast<TranscriptionFlow>(shared_from_this());
    gw_.backend().get_job(view_.job(), [self](Outcome<client::JobInfo> j) { self->finish(std::move(j)); });
  }

  void finish(Outcome<client::JobInfo> j) {
    if (gone_ || done_) return;
    if (!j.ok()) return fail(error_from_remote(j.error));
    std::vector<client::TranscriptSegment> segs;
    if (j.value->segments_json) {
      auto s = client::segments_from_json(*j.value->segments_json);
      if (!s.ok()) return fail({500, "server_error", "internal", "", "tandemd's segments: " + s.error().message});
      segs = std::move(*s);
    }
    const std::string text = j.value->text.value_or(view_.text());
    done_ = true;
    gw_.metrics().request(endpoint_, view_.route(), 200);
    if (call_.stream) {
      ex_->send(sse_data(transcript_done(text, view_.tandem_json())));
      ex_->end_stream();
    } else {
      TranscriptBody b = transcript_body(call_, text, segs, *j.value, view_.tandem_json());
      Headers h = gw_.cors_headers(ex_->request());
      for (auto& kv : view_.headers()) h.push_back(std::move(kv));
      ex_->reply(200, b.content_type, std::move(b.body), std::move(h));
    }
    release();
  }

  TranscriptionCall call_;
};

}  // namespace

void Gateway::transcriptions(const std::shared_ptr<Exchange>& ex, bool translate) {
  const std::string endpoint = translate ? "/v1/audio/translations" : "/v1/audio/transcriptions";
  const auto& h = ex->request().headers;
  auto ct = h.find("content-type");
  auto call = parse_transcription(ct == h.end() ? "" : ct->second, ex->request().body, translate);
  if (!call.ok()) return error(ex, endpoint, Flavor::openai, *call.error);
  auto flow = std::make_shared<TranscriptionFlow>(*this, ex, std::move(*call), endpoint);
  flow->start();
}

}  // namespace tandem::http
