// The gateway's flows against a fake tandemd: model resolution, plain and streamed answers in both APIs, Tandem's
// state on the wire, cancel when the client goes away in each phase (queued, prefill, decode), refusals and lost
// links as typed errors, per-client limits, embeddings in request order.
#include <gtest/gtest.h>

#include <cstring>

#include "fakes.h"

namespace tandem::http {
namespace {

using nlohmann::json;
using testing::FakeBackend;
using testing::FakeExchange;

ModelEntry model(const std::string& name, const std::string& kind = "llm", bool dflt = false) {
  ModelEntry m;
  m.info.name = name;
  m.info.kind = kind;
  m.info.is_default = dflt;
  if (kind == "embedding") {
    m.info.dim = 4;
    m.info.modalities = std::vector<std::string>{"text", "image"};
  }
  client::ModelDetails d;
  d.placement = std::map<std::string, std::uint64_t>{{"storage", 1000}, {"host", 600}, {"gpu", 400}};
  m.details = d;
  return m;
}

client::SubmitResult accepted(std::uint64_t job, const std::string& route = "gpu", bool degraded = false) {
  client::SubmitResult s;
  s.job_id = job;
  s.placement.route = route;
  s.placement.queue = route == "gpu" ? "gpu" : "cpu";
  s.placement.queue_position = 2;
  s.placement.eta_ms = 1500;
  s.placement.model = "tiny";
  s.placement.degraded = degraded;
  s.placement.reason = degraded ? "routed_cpu" : "fits";
  s.placement.prompt_tokens = 5;
  return s;
}

client::JobUpdate upd(std::uint64_t job, const std::string& kind) {
  client::JobUpdate u;
  u.job_id = job;
  u.kind = kind;
  return u;
}

client::JobUpdate tokens(std::uint64_t job, const std::string& text, int n) {
  auto u = upd(job, "tokens");
  u.text = text;
  u.tokens = std::vector<std::int32_t>(static_cast<std::size_t>(n), 1);
  return u;
}

client::JobUpdate finished(std::uint64_t job, const std::string& text, const std::string& state = "completed",
                           std::uint32_t n = 3) {
  auto u = upd(job, "finished");
  u.state = state;
  u.finish_reason = state == "completed" ? "max_tokens" : "";
  u.text = text;
  u.tokens_total = n;
  return u;
}

struct GatewayTest : ::testing::Test {
  FakeBackend be;
  GatewayConfig cfg;
  std::unique_ptr<Gateway> gw;
  void SetUp() override {
    be.model_list = {model("tiny", "llm", true), model("clip", "embedding")};
    cfg.max_streams_per_client = 2;
    gw = std::make_unique<Gateway>(be, cfg);
  }
  const std::string chat = R"({"model":"tiny:latest","messages":[{"role":"user","content":"Hi"}],"max_tokens":3})";
  const std::string chat_stream =
      R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true}})";
};

TEST_F(GatewayTest, PlainChatAnswersWithTextUsageHeadersAndTandemObject) {
  auto ex = testing::post("/v1/chat/completions", chat);
  gw->handle(ex);
  ASSERT_EQ(be.submitted.size(), 1u);
  EXPECT_EQ(be.submitted[0].request.model, "tiny");  // ":latest" resolved
  EXPECT_EQ(be.submitted[0].request.options.max_tokens, 3u);
  EXPECT_EQ(be.submitted[0].request.options.stream, true);  // tokens even for a plain reply: timings are measured
  auto sink = be.submitted[0].sink;
  sink->accepted(accepted(7));
  EXPECT_FALSE(ex->replied);
  sink->update(finished(7, " one two three"));
  ASSERT_TRUE(ex->replied);
  EXPECT_EQ(ex->status, 200);
  auto b = json::parse(ex->body);
  EXPECT_EQ(b["choices"][0]["message"]["content"], " one two three");
  EXPECT_EQ(b["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(b["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(b["usage"]["completion_tokens"], 3);
  EXPECT_EQ(b["tandem"]["job"], 7);
  EXPECT_EQ(b["tandem"]["route"], "gpu");
  EXPECT_EQ(b["model"], "tiny:latest");  // the name the client used
  EXPECT_EQ(ex->header("Tandem-Job"), "7");
  EXPECT_EQ(ex->header("Tandem-Route"), "gpu");
  EXPECT_EQ(ex->header("Tandem-Queue-Position"), "2");
  EXPECT_EQ(ex->header("Tandem-ETA-Ms"), "1500");
  EXPECT_EQ(ex->header("Tandem-Degraded"), "");
}

TEST_F(GatewayTest, OpenAiStreamHasPlacementCommentChunksUsageAndDone) {
  auto ex = testing::post("/v1/chat/completions", chat_stream);
  gw->handle(ex);
  ASSERT_EQ(be.submitted.size(), 1u);
  EXPECT_EQ(be.submitted[0].request.options.stream, true);
  auto sink = be.submitted[0].sink;
  sink->accepted(accepted(9));
  ASSERT_TRUE(ex->streaming);
  EXPECT_EQ(ex->content_type, "text/event-stream");
  EXPECT_EQ(ex->header("Tandem-Job"), "9");
  ASSERT_EQ(ex->chunks.size(), 1u);
  ASSERT_EQ(ex->chunks[0].rfind(": tandem ", 0), 0u);
  EXPECT_EQ(json::parse(ex->chunks[0].substr(9))["event"], "placement");
  sink->update(upd(9, "started"));
  sink->update(tokens(9, " a", 1));
  sink->update(tokens(9, " b", 1));
  sink->update(finished(9, " a b c"));  // " c" arrived only in finished (a ring gap): sent before the end
  ASSERT_TRUE(ex->ended);
  std::string text;
  int usage = 0;
  bool done = false, role = false;
  for (const auto& c : ex->chunks) {
    if (c == "data: [DONE]\n\n") {
      done = true;
      continue;
    }
    if (c.rfind("data: ", 0) != 0) continue;
    auto j = json::parse(c.substr(6));
    if (j.contains("usage")) {
      ++usage;
      EXPECT_EQ(j["usage"]["completion_tokens"], 3);
      continue;
    }
    auto& d = j["choices"][0]["delta"];
    if (d.contains("role")) role = true;
    if (d.contains("content")) text += d["content"].get<std::string>();
  }
  EXPECT_EQ(text, " a b c");
  EXPECT_EQ(usage, 1);
  EXPECT_TRUE(done);
  EXPECT_TRUE(role);
}

TEST_F(GatewayTest, OllamaStreamIsNdjsonWithTandemKeyAndFinalCounts) {
  auto ex = testing::post("/api/chat", R"({"model":"tiny","messages":[{"role":"user","content":"Hi"}]})");
  gw->handle(ex);
  ASSERT_EQ(be.submitted.size(), 1u);
  auto sink = be.submitted[0].sink;
  sink->accepted(accepted(3));
  sink->update(tokens(3, "x", 1));
  sink->update(finished(3, "x", "completed", 1));
  ASSERT_TRUE(ex->ended);
  EXPECT_EQ(ex->content_type, "application/x-ndjson");
  auto first = json::parse(ex->chunks.front());
  EXPECT_EQ(first["tandem"]["event"], "placement");
  EXPECT_EQ(first["done"], false);
  auto last = json::parse(ex->chunks.back());
  EXPECT_EQ(last["done"], true);
  EXPECT_EQ(last["done_reason"], "length");
  EXPECT_EQ(last["eval_count"], 1);
  EXPECT_EQ(last["prompt_eval_count"], 5);
}

TEST_F(GatewayTest, DegradedPlacementAndChangeAreAnnounced) {
  auto ex = testing::post("/v1/chat/completions", chat_stream);
  gw->handle(ex);
  auto sink = be.submitted[0].sink;
  client::DegradedChange d;
  d.degraded = true;
  d.reason = "gpu-lost";
  d.expected_slowdown = 6.5;
  sink->degraded(d);  // before accepted: the link tells the service's mode first
  sink->accepted(accepted(4, "cpu", true));
  EXPECT_EQ(ex->header("Tandem-Route"), "cpu");
  EXPECT_EQ(ex->header("Tandem-Degraded"), "gpu-lost");
  auto t = json::parse(ex->chunks[0].substr(9));
  EXPECT_EQ(t["degraded_reason"], "gpu-lost");
  EXPECT_EQ(t["expected_slowdown"], 6.5);
  // A job that migrates mid-stream: a "change" event before the next token.
  auto ex2 = testing::post("/v1/chat/completions", chat_stream);
  gw->handle(ex2);
  auto s2 = be.submitted[1].sink;
  s2->accepted(accepted(5));
  s2->update(tokens(5, "a", 1));
  auto m = upd(5, "migrated");
  m.from = "gpu";
  m.to = "cpu";
  m.reason = "DeviceLost";
  s2->update(m);
  s2->update(tokens(5, "b", 1));
  bool change = false;
  for (const auto& c : ex2->chunks)
    if (c.rfind(": tandem ", 0) == 0 && json::parse(c.substr(9))["event"] == "change") {
      change = true;
      EXPECT_EQ(json::parse(c.substr(9))["route"], "cpu");
    }
  EXPECT_TRUE(change);
}

// The client going away cancels its job in every phase.
TEST_F(GatewayTest, ClosedWhileQueuedCancelsOnAcceptance) {
  auto ex = testing::post("/v1/chat/completions", chat_stream);
  gw->handle(ex);
  ex->close();  // before tandemd even answered the submission
  EXPECT_TRUE(be.cancelled.empty());
  be.submitted[0].sink->accepted(accepted(11));
  ASSERT_EQ(be.cancelled, std::vector<std::uint64_t>{11});
}

TEST_F(GatewayTest, ClosedWhileQueuedOrInPrefillCancels) {
  for (const char* phase : {"queued", "started"}) {
    be.cancelled.clear();
    auto ex = testing::post("/v1/chat/completions", chat);  // a plain request: nothing is written until the end
    gw->handle(ex);
    auto sink = be.submitted.back().sink;
    sink->accepted(accepted(20));
    if (std::strcmp(phase, "started") == 0) sink->update(upd(20, "started"));
    ex->close();
    EXPECT_EQ(be.cancelled, std::vector<std::uint64_t>{20}) << phase;
    sink->update(finished(20, "", "cancelled", 0));
    EXPECT_FALSE(ex->replied) << phase;
  }
}

TEST_F(GatewayTest, ClosedDuringDecodeCancelsOnce) {
  auto ex = testing::post("/api/generate", R"({"model":"tiny","prompt":"Hi"})");
  gw->handle(ex);
  auto sink = be.submitted[0].sink;
  sink->accepted(accepted(30));
  sink->update(tokens(30, "a", 1));
  ex->close();
  ex->close();
  EXPECT_EQ(be.cancelled, std::vector<std::uint64_t>{30});
  const auto n = ex->chunks.size();
  sink->update(tokens(30, "b", 1));
  EXPECT_EQ(ex->chunks.size(), n);  // nothing more is written
}

TEST_F(GatewayTest, RefusalsAreTypedErrorsWithRetryAfter) {
  auto ex = testing::post("/v1/chat/completions", chat);
  gw->handle(ex);
  be.submitted[0].sink->refused(client::parse_remote_error("io.tandem.Tandem1.Error.QueueFull", "the CPU queue is full; retry_after_ms=2500"));
  EXPECT_EQ(ex->status, 503);
  EXPECT_EQ(ex->header("Retry-After"), "3");
  auto b = json::parse(ex->body);
  EXPECT_EQ(b["error"]["code"], "queue_full");
  EXPECT_EQ(b["error"]["type"], "server_error");
  EXPECT_EQ(b["tandem"]["retry_after_ms"], 2500);
  // Ollama's shape for the same refusal.
  auto ex2 = testing::post("/api/chat", R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"stream":false})");
  gw->handle(ex2);
  be.submitted[1].sink->refused(client::parse_remote_error("io.tandem.Tandem1.Error.InvalidArgument", "max_tokens must be in [1,1024]"));
  EXPECT_EQ(ex2->status, 400);
  EXPECT_TRUE(json::parse(ex2->body)["error"].is_string());
}

TEST_F(GatewayTest, LostMidStreamEndsWithResumableErrorEvent) {
  auto ex = testing::post("/v1/chat/completions", chat_stream);
  gw->handle(ex);
  auto sink = be.submitted[0].sink;
  sink->accepted(accepted(42));
  sink->update(tokens(42, "a", 1));
  sink->lost("tandemd restarted");
  ASSERT_TRUE(ex->ended);
  const std::string& last = ex->chunks.back();
  ASSERT_EQ(last.rfind("data: ", 0), 0u);
  auto e = json::parse(last.substr(6));
  EXPECT_EQ(e["error"]["code"], "resumable");
  EXPECT_EQ(e["tandem"]["job"], 42);
  EXPECT_EQ(e["tandem"]["resume"], "/tandem/v1/jobs/42/resume");
  for (const auto& c : ex->chunks) EXPECT_NE(c, "data: [DONE]\n\n");
}

TEST_F(GatewayTest, FailedJobIsResumableError) {
  auto ex = testing::post("/v1/completions", R"({"model":"tiny","prompt":"x"})");
  gw->handle(ex);
  auto sink = be.submitted[0].sink;
  sink->accepted(accepted(50));
  auto f = finished(50, "partial", "failed");
  f.error_code = "DeviceLost";
  sink->update(f);
  EXPECT_EQ(ex->status, 503);
  auto b = json::parse(ex->body);
  EXPECT_EQ(b["tandem"]["job"], 50);
  EXPECT_EQ(b["error"]["code"], "resumable");
}

TEST_F(GatewayTest, PerClientLimitIs429AndSlotsReturn) {
  auto a = testing::post("/v1/chat/completions", chat, "alice");
  auto b = testing::post("/v1/chat/completions", chat, "alice");
  auto c = testing::post("/v1/chat/completions", chat, "alice");
  auto d = testing::post("/v1/chat/completions", chat, "bob");
  gw->handle(a);
  gw->handle(b);
  gw->handle(c);
  gw->handle(d);
  EXPECT_EQ(c->status, 429);
  EXPECT_EQ(c->header("Retry-After"), "1");
  EXPECT_EQ(be.submitted.size(), 3u);  // alice twice, bob once
  be.submitted[0].sink->accepted(accepted(1));
  be.submitted[0].sink->update(finished(1, "x"));
  be.submitted.erase(be.submitted.begin());  // the backend lets go of the finished job's sink
  auto e = testing::post("/v1/chat/completions", chat, "alice");
  gw->handle(e);
  EXPECT_EQ(be.submitted.size(), 3u);  // a slot came back
  EXPECT_FALSE(e->replied);
}

TEST_F(GatewayTest, ModelsAreResolvedByKind) {
  auto ex = testing::post("/v1/chat/completions", R"({"model":"nope","messages":[{"role":"user","content":"x"}]})");
  gw->handle(ex);
  EXPECT_EQ(ex->status, 404);
  EXPECT_NE(json::parse(ex->body)["error"]["message"].get<std::string>().find("tiny"), std::string::npos);
  auto ex2 = testing::post("/v1/chat/completions", R"({"model":"clip","messages":[{"role":"user","content":"x"}]})");
  gw->handle(ex2);
  EXPECT_EQ(ex2->status, 400);
  EXPECT_EQ(json::parse(ex2->body)["error"]["param"], "model");
  auto ex3 = testing::post("/v1/embeddings", R"({"model":"tiny","input":"x"})");
  gw->handle(ex3);
  EXPECT_EQ(ex3->status, 400);
  EXPECT_TRUE(be.submitted.empty());
  EXPECT_LE(be.models_calls, 1);  // cached within models_ttl
}

TEST_F(GatewayTest, OllamaEmptyChatIsALoadAnsweredWithoutAJob) {
  auto ex = testing::post("/api/chat", R"({"model":"tiny","messages":[]})");
  gw->handle(ex);
  EXPECT_TRUE(be.submitted.empty());
  EXPECT_EQ(ex->status, 200);
  EXPECT_EQ(json::parse(ex->body)["done_reason"], "load");
}

TEST_F(GatewayTest, EmbeddingsKeepRequestOrderAndEncodeBase64) {
  // A text, an image, a text: tandemd gets texts first, then images.
  const std::string png = "data:image/png;base64,iVBORw0KGgo=";
  auto ex = testing::post("/v1/embeddings", R"({"model":"clip","encoding_format":"base64","input":["a",{"type":"image_url","image_url":{"url":")" +
                                                png + R"("}},"b"]})");
  gw->handle(ex);
  ASSERT_EQ(be.embeds.size(), 1u);
  const auto& req = be.embeds[0].first;
  EXPECT_EQ(req.texts, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(req.images.size(), 1u);
  client::EmbedReply rep;
  rep.vectors = {{1, 0, 0, 0}, {0, 0, 1, 0}, {0, 1, 0, 0}};  // texts a, b, then the image
  rep.info.job_id = 8;
  rep.info.route = "gpu";
  be.embeds[0].second(Outcome<client::EmbedReply>::success(rep));
  ASSERT_EQ(ex->status, 200);
  auto b = json::parse(ex->body);
  auto vec = [&](int i) {
    auto bytes = base64_decode(b["data"][i]["embedding"].get<std::string>());
    std::vector<float> v(bytes->size() / 4);
    std::memcpy(v.data(), bytes->data(), bytes->size());
    return v;
  };
  EXPECT_EQ(vec(0), (std::vector<float>{1, 0, 0, 0}));  // "a"
  EXPECT_EQ(vec(1), (std::vector<float>{0, 1, 0, 0}));  // the image (tandemd's third vector)
  EXPECT_EQ(vec(2), (std::vector<float>{0, 0, 1, 0}));  // "b" (tandemd's second)
  EXPECT_EQ(ex->header("Tandem-Job"), "8");
}

TEST_F(GatewayTest, TokenArraysGoToTandemdAsTokenInputsAndUsageCountsTokens) {
  auto ex = testing::post("/v1/embeddings", R"({"model":"clip","input":[[5,6],"a",[7]]})");
  gw->handle(ex);
  ASSERT_EQ(be.embeds.size(), 1u);
  const auto& req = be.embeds[0].first;
  EXPECT_EQ(req.texts, (std::vector<std::string>{"a"}));
  EXPECT_EQ(req.tokens, (std::vector<std::vector<std::uint32_t>>{{5, 6}, {7}}));
  client::EmbedReply rep;
  rep.vectors = {{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}};  // "a", then [5,6], then [7]
  rep.info.text_tokens = 10;
  be.embeds[0].second(Outcome<client::EmbedReply>::success(rep));
  ASSERT_EQ(ex->status, 200) << ex->body;
  auto b = json::parse(ex->body);
  EXPECT_EQ(b["data"][0]["embedding"], json({0, 1, 0, 0}));
  EXPECT_EQ(b["data"][1]["embedding"], json({1, 0, 0, 0}));
  EXPECT_EQ(b["data"][2]["embedding"], json({0, 0, 1, 0}));
  EXPECT_EQ(b["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(b["usage"]["total_tokens"], 10);
  EXPECT_EQ(b["tandem"]["text_tokens"], 10);
  // tandemd names a bad input by its place in the Embed call; the answer names it by its place in the request.
  auto bad = testing::post("/v1/embeddings", R"({"model":"clip","input":["a",[5],[99999]]})");
  gw->handle(bad);
  ASSERT_EQ(be.embeds.size(), 2u);
  be.embeds[1].second(Outcome<client::EmbedReply>::failure(client::parse_remote_error(
      "io.tandem.Tandem1.Error.InvalidArgument", "tokens[1]: token 0 is 99999; model clip has ids 0..590")));
  ASSERT_EQ(bad->status, 400);
  auto e = json::parse(bad->body)["error"];
  EXPECT_EQ(e["param"], "input[2]");
  EXPECT_EQ(e["message"], "input[2]: token 0 is 99999; model clip has ids 0..590");
}

TEST_F(GatewayTest, EmbeddingDimensionsCutAndRenormalise) {
  auto ex = testing::post("/api/embed", R"({"model":"clip","input":"a","dimensions":2})");
  gw->handle(ex);
  client::EmbedReply rep;
  rep.vectors = {{3, 4, 12, 0}};
  be.embeds[0].second(Outcome<client::EmbedReply>::success(rep));
  auto v = json::parse(ex->body)["embeddings"][0];
  ASSERT_EQ(v.size(), 2u);
  EXPECT_NEAR(v[0].get<double>(), 0.6, 1e-6);
  EXPECT_NEAR(v[1].get<double>(), 0.8, 1e-6);
  auto too_many = testing::post("/api/embed", R"({"model":"clip","input":"a","dimensions":5})");
  gw->handle(too_many);
  EXPECT_EQ(too_many->status, 400);
}

TEST_F(GatewayTest, HealthAndMetricsFollowTandemd) {
  auto h = testing::get("/health");
  gw->handle(h);
  EXPECT_EQ(h->status, 503);  // no status: tandemd unreachable
  client::ServiceStatus st;
  st.state = "degraded";
  st.degraded_reason = "gpu-lost";
  st.queues = std::vector<client::QueueInfo>{{"cpu", 3, 8, 1, 1, 250}};
  be.service_status = st;
  auto h2 = testing::get("/health");
  gw->handle(h2);
  EXPECT_EQ(h2->status, 200);
  EXPECT_EQ(json::parse(h2->body)["status"], "degraded");
  auto m = testing::get("/metrics");
  gw->handle(m);
  EXPECT_NE(m->body.find("tandem_degraded{reason=\"gpu-lost\"} 1"), std::string::npos);
  EXPECT_NE(m->body.find("tandem_queue_depth{queue=\"cpu\"} 3"), std::string::npos);
  EXPECT_NE(m->body.find("tandem_http_requests_total{endpoint=\"/health\",route=\"\",status=\"503\"} 1"), std::string::npos);
  // The models' replicas, from ListModels and each model's Replicas.
  client::ReplicaInfo r;
  r.device = "gpu";
  r.state = "draining";
  r.reason = "hold";
  r.accel_bytes = 400;
  be.model_list[0].details->replicas = std::vector<client::ReplicaInfo>{r};
  auto m2 = testing::get("/metrics");
  gw->handle(m2);
  EXPECT_NE(m2->body.find("tandem_replica_info{model=\"tiny\",device=\"gpu\",state=\"draining\",reason=\"hold\"} 1"),
            std::string::npos) << m2->body;
  EXPECT_NE(m2->body.find("tandem_replica_bytes{model=\"tiny\",device=\"gpu\",on=\"accelerator\"} 400"), std::string::npos);
  EXPECT_EQ(m2->body.find("model=\"clip\""), std::string::npos) << "a model without Replicas has no series";
}

TEST_F(GatewayTest, UnknownPathsAndMethods) {
  auto a = testing::get("/v2/nothing");
  gw->handle(a);
  EXPECT_EQ(a->status, 404);
  auto b = testing::get("/v1/chat/completions");
  gw->handle(b);
  EXPECT_EQ(b->status, 405);
}

TEST_F(GatewayTest, AnExistingJobIsFollowedThroughGetJob) {
  // An Idempotency-Key that names a finished job: tandemd answers with that job (existing), whose updates went to
  // its first submitter; the outcome is read with GetJob.
  std::vector<std::function<void()>> deferred;
  gw->set_defer([&](std::chrono::milliseconds, std::function<void()> fn) { deferred.push_back(std::move(fn)); });
  auto chat_ex = testing::post("/v1/chat/completions", chat);
  gw->handle(chat_ex);
  auto s = accepted(60);
  s.placement.existing = true;
  be.submitted[0].sink->accepted(s);
  // The fake's GetJob says completed: the reply comes from it.
  ASSERT_TRUE(chat_ex->replied);
  EXPECT_EQ(chat_ex->status, 200);
  EXPECT_EQ(json::parse(chat_ex->body)["tandem"]["job"], 60);
  EXPECT_TRUE(deferred.empty());
}

TEST_F(GatewayTest, TranscriptionFailureIsNotResumable) {
  ModelEntry asr;
  asr.info.name = "asr";
  asr.info.kind = "speech";
  be.model_list.push_back(asr);
  const std::string body = "--B0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\r\n"
                           "--B0\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nasr\r\n--B0--\r\n";
  auto ex = testing::post("/v1/audio/transcriptions", body);
  const_cast<RequestInfo&>(ex->request()).headers["content-type"] = "multipart/form-data; boundary=B0";
  gw->handle(ex);
  ASSERT_EQ(be.transcribed.size(), 1u);
  EXPECT_EQ(be.transcribed[0].first.model, "asr");
  EXPECT_EQ(be.transcribed[0].first.audio.size(), 4u);
  be.transcribed[0].second->accepted(accepted(70));
  auto f = finished(70, "", "failed");
  f.error_code = "DeviceLost";
  be.transcribed[0].second->update(f);
  EXPECT_EQ(ex->status, 503);
  auto b = json::parse(ex->body);
  EXPECT_EQ(b["error"]["code"], "failed");
  EXPECT_FALSE(b.contains("tandem") && b["tandem"].contains("resume"));
  // tandemd lost while a transcription runs: not resumable either.
  auto ex2 = testing::post("/v1/audio/transcriptions", body);
  const_cast<RequestInfo&>(ex2->request()).headers["content-type"] = "multipart/form-data; boundary=B0";
  gw->handle(ex2);
  be.transcribed[1].second->accepted(accepted(71));
  be.transcribed[1].second->lost("tandemd restarted");
  EXPECT_EQ(ex2->status, 503);
  EXPECT_EQ(json::parse(ex2->body)["error"]["code"], "failed");
  EXPECT_FALSE(json::parse(ex2->body)["tandem"].contains("resume"));
  // A speech model named for a chat: 400 saying what it is.
  auto c = testing::post("/v1/chat/completions", R"({"model":"asr","messages":[{"role":"user","content":"x"}]})");
  gw->handle(c);
  EXPECT_EQ(c->status, 400);
  EXPECT_NE(json::parse(c->body)["error"]["message"].get<std::string>().find("speech model"), std::string::npos);
}

TEST_F(GatewayTest, IdempotencyKeyIsScopedByClient) {
  auto ex = testing::post("/v1/chat/completions", chat, "alice");
  const_cast<RequestInfo&>(ex->request()).headers["idempotency-key"] = "k1";
  gw->handle(ex);
  EXPECT_EQ(be.submitted[0].request.options.idempotency_key, "http:alice:k1");
  auto bad = testing::post("/v1/chat/completions", chat);
  const_cast<RequestInfo&>(bad->request()).headers["idempotency-key"] = std::string(300, 'k');
  gw->handle(bad);
  EXPECT_EQ(bad->status, 400);
}

}  // namespace
}  // namespace tandem::http
