// The embed workload in the service core: Embed requests validated and typed, admitted and queued like Submit's
// jobs, answered with the vectors in input order, failed over to the CPU on a GPU fault, idempotent by key, kept
// apart from the LLM on one memory budget, and what a restart leaves. FakeBackend's "emb" model (dim 4).
#include "service_fixture.h"

namespace tandem::daemon::testing {
namespace {

const std::vector<std::uint8_t> kPngMagic{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

std::shared_ptr<const std::vector<std::uint8_t>> png(const std::string& payload) {
  auto v = kPngMagic;
  v.insert(v.end(), payload.begin(), payload.end());
  return std::make_shared<const std::vector<std::uint8_t>>(std::move(v));
}

EmbedRequest embed_request(std::vector<std::string> texts, std::vector<std::string> images = {}) {
  EmbedRequest r;
  r.model = "emb";
  r.texts = std::move(texts);
  for (const auto& i : images) r.images.push_back(png(i));
  return r;
}

class EmbedTest : public ServiceTest {
 protected:
  EmbedTest() {
    backend_->add_embedding_model();
    ModelConfig emb;
    emb.name = "emb";
    emb.dir = "/nonexistent/emb";
    cfg_.models.push_back(emb);
  }

  struct Call {
    bool done = false;
    Result<EmbedReply> reply = fail(Errc::internal, "not answered");
  };
  // Starts an Embed call; the returned record fills in when it is answered.
  std::shared_ptr<Call> call(const Caller& c, EmbedRequest r) {
    auto out = std::make_shared<Call>();
    svc_->embed(c, std::move(r), [out](Result<EmbedReply> rep) {
      EXPECT_FALSE(out->done) << "answered twice";
      out->done = true;
      out->reply = std::move(rep);
    });
    return out;
  }
  Result<EmbedReply> run(const Caller& c, EmbedRequest r) {
    auto k = call(c, std::move(r));
    EXPECT_TRUE(pump_until([&] { return k->done; })) << "no answer";
    return k->reply;
  }
};

TEST_F(EmbedTest, VectorsComeBackInInputOrderFromTheGpu) {
  start();
  auto r = run(alice_, embed_request({"a red circle", "a blue square"}, {"img-1"}));
  ASSERT_TRUE(r) << describe(r);
  ASSERT_EQ(r->vectors.size(), 3u);
  const auto specs = backend_->embeds();
  ASSERT_EQ(specs.size(), 1u);  // one run for the whole call (a batch)
  EXPECT_EQ(r->vectors[0], FakeBackend::vector_of_ids(specs[0].texts[0]));
  EXPECT_EQ(r->vectors[1], FakeBackend::vector_of_ids(specs[0].texts[1]));
  EXPECT_EQ(r->vectors[2], FakeBackend::vector_of(*png("img-1")));
  EXPECT_EQ(str(r->result, "route"), "gpu");
  EXPECT_EQ(str(r->result, "model"), "emb");
  EXPECT_EQ(u32(r->result, "dim"), 4u);
  EXPECT_EQ(u32(r->result, "inputs"), 3u);
  EXPECT_EQ(u32(r->result, "texts"), 2u);
  EXPECT_EQ(u32(r->result, "images"), 1u);
  EXPECT_EQ(u32(r->result, "attempts"), 1u);
  EXPECT_FALSE(flag(r->result, "degraded"));
  EXPECT_FALSE(flag(r->result, "existing"));
  const JobId id = u64(r->result, "job_id");
  Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "completed");
  EXPECT_EQ(str(j, "kind"), "embed");
  EXPECT_EQ(u32(j, "inputs"), 3u);
  // An Embed call's answer is its reply: no JobUpdate signals.
  EXPECT_TRUE(rec_.of(id).empty());
  // The texts were tokenized on the loop with BOS/EOS.
  EXPECT_EQ(specs[0].texts[0].front(), 1);
  EXPECT_EQ(specs[0].texts[0].back(), 2);
}

TEST_F(EmbedTest, TokenInputsComeAfterTheTextsAndEmbedLikeTheirText) {
  start();
  // The fake tokenizer gives 3 + byte % 200 per byte: "ab" is {100, 101}.
  EmbedRequest req = embed_request({"ab"}, {"img-1"});
  req.tokens = {{100, 101}, {7}};
  auto r = run(alice_, req);
  ASSERT_TRUE(r) << describe(r);
  ASSERT_EQ(r->vectors.size(), 4u);  // texts, token inputs, images
  const auto specs = backend_->embeds();
  ASSERT_EQ(specs.size(), 1u);
  ASSERT_EQ(specs[0].texts.size(), 3u);
  EXPECT_EQ(specs[0].texts[1], (std::vector<TokenId>{1, 100, 101, 2}));  // BOS/EOS added as for a text
  EXPECT_EQ(r->vectors[1], r->vectors[0]) << "a text and its ids embed alike";
  EXPECT_EQ(r->vectors[2], FakeBackend::vector_of_ids({1, 7, 2}));
  EXPECT_EQ(r->vectors[3], FakeBackend::vector_of(*png("img-1")));
  EXPECT_EQ(u32(r->result, "inputs"), 4u);
  EXPECT_EQ(u32(r->result, "texts"), 3u);  // texts and token inputs: the text tower's inputs
  EXPECT_EQ(u64(r->result, "text_tokens"), 4u + 4u + 3u);
  EXPECT_EQ(u64(job(u64(r->result, "job_id")), "text_tokens"), 11u);
  // An empty token input, a special or unknown id: typed errors naming the input, nothing run.
  for (const auto& [tokens, message] : std::vector<std::pair<std::vector<std::vector<std::int64_t>>, std::string>>{
           {{{}}, "tokens[0] is empty"},
           {{{5}, {2}}, "tokens[1]: fake: id 2"},
           {{{203}}, "tokens[0]: fake: id 203"},
           {{{-1}}, "tokens[0]: fake: id -1"}}) {
    EmbedRequest bad = embed_request({});
    bad.tokens = tokens;
    auto e = run(alice_, bad);
    ASSERT_FALSE(e) << message;
    EXPECT_EQ(e.error().code, Errc::invalid_argument);
    EXPECT_THAT(e.error().message, HasSubstr(message));
  }
  EXPECT_EQ(backend_->embeds().size(), 1u);
  // Token inputs are cut like texts (BOS first, EOS last).
  EmbedRequest longer = embed_request({});
  longer.tokens = {{3, 4, 5, 6, 7, 8, 9, 10, 11}};
  auto t = run(alice_, longer);
  ASSERT_TRUE(t) << describe(t);
  EXPECT_EQ(u32(t->result, "truncated"), 1u);
  EXPECT_EQ(backend_->embeds().back().texts[0], (std::vector<TokenId>{1, 3, 4, 5, 6, 7, 8, 2}));
}

TEST_F(EmbedTest, AKeyNamesItsTokenInputsToo) {
  start();
  EmbedRequest a = embed_request({});
  a.tokens = {{10, 11}};
  a.options.idempotency_key = "k";
  ASSERT_TRUE(run(alice_, a));
  EmbedRequest b = a;
  b.tokens = {{10, 12}};
  auto r = run(alice_, b);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::duplicate) << "the same key with other token ids is another request";
  auto again = run(alice_, a);
  ASSERT_TRUE(again) << describe(again);
  EXPECT_TRUE(flag(again->result, "existing"));
}

TEST_F(EmbedTest, DefaultModelIsTheFirstEmbeddingModelAndSubmitKeepsTheLlm) {
  start();
  EmbedRequest r = embed_request({"x"});
  r.model.clear();
  auto rep = run(alice_, r);
  ASSERT_TRUE(rep) << describe(rep);
  EXPECT_EQ(str(rep->result, "model"), "emb");
  const JobId id = submit_ok(alice_, request());  // "" = the first LLM, not the embedding model
  EXPECT_EQ(str(job(id), "model"), "tiny");
  // The models say what they are.
  for (const auto& m : svc_->list_models()) {
    const std::string name = str(m, "name");
    EXPECT_EQ(str(m, "kind"), name == "emb" ? "embedding" : "llm") << name;
    if (name == "emb") {
      EXPECT_EQ(u32(m, "dim"), 4u);
      EXPECT_EQ(at<std::vector<std::string>>(m, "modalities"), (std::vector<std::string>{"text", "image"}));
    }
  }
}

struct BadCase {
  const char* name;
  std::function<void(EmbedRequest&, DaemonConfig&)> edit;
  Errc code;
  const char* message;
};

TEST_F(EmbedTest, BadRequestsGetTypedErrorsAndRunNothing) {
  const std::vector<BadCase> cases = {
      {"no inputs", [](EmbedRequest& r, DaemonConfig&) { r.texts.clear(); }, Errc::invalid_argument, "no inputs"},
      {"too many", [](EmbedRequest& r, DaemonConfig& c) { c.embedding.max_inputs = 2; r.texts = {"a", "b", "c"}; },
       Errc::invalid_argument, "at most 2 inputs per call, got 3"},
      {"not an image", [](EmbedRequest& r, DaemonConfig&) {
         r.images.push_back(std::make_shared<const std::vector<std::uint8_t>>(std::vector<std::uint8_t>{'h', 'i'}));
       }, Errc::invalid_argument, "images[0]: not a JPEG or PNG image"},
      {"empty image", [](EmbedRequest& r, DaemonConfig&) {
         r.images.push_back(std::make_shared<const std::vector<std::uint8_t>>());
       }, Errc::invalid_argument, "images[0] is empty"},
      {"huge image", [](EmbedRequest& r, DaemonConfig& c) {
         c.embedding.max_image_bytes = 1024;
         r.images.push_back(png(std::string(2000, 'x')));
       }, Errc::invalid_argument, "at most 1024 ([embedding] max_image_bytes)"},
      {"text bytes", [](EmbedRequest& r, DaemonConfig& c) { c.embedding.max_text_bytes = 4; r.texts = {"hello"}; },
       Errc::invalid_argument, "texts[0] is 5 bytes; at most 4"},
      {"invalid utf-8", [](EmbedRequest& r, DaemonConfig&) { r.texts = {std::string("\xff\xfe")}; },
       Errc::invalid_argument, "texts[0] is not valid UTF-8"},
      {"too long, no truncate", [](EmbedRequest& r, DaemonConfig&) {
         r.texts = {"a long text over eight tokens"};
         r.options.truncate = false;
       }, Errc::invalid_argument, "texts[0]: fake: text over 8 tokens"},
      {"unknown model", [](EmbedRequest& r, DaemonConfig&) { r.model = "nope"; }, Errc::not_found, "unknown model 'nope'"},
      {"an llm", [](EmbedRequest& r, DaemonConfig&) { r.model = "tiny"; }, Errc::unsupported,
       "model tiny is not an embedding model (kind llm): call Submit"},
      {"bad key", [](EmbedRequest& r, DaemonConfig&) { r.options.idempotency_key = ""; }, Errc::invalid_argument,
       "idempotency_key must be 1..240 bytes"},
      {"bad deadline", [](EmbedRequest& r, DaemonConfig&) { r.options.deadline_ms = 0; }, Errc::invalid_argument,
       "deadline_ms must be in"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EmbedRequest r = embed_request({"ok"});
    DaemonConfig cfg = base_config(dir_.path());
    cfg.models = cfg_.models;
    c.edit(r, cfg);
    cfg_ = cfg;
    ASSERT_NO_FATAL_FAILURE(restart());
    auto k = call(alice_, r);
    ASSERT_TRUE(k->done) << "a refused call is answered at once";
    ASSERT_FALSE(k->reply);
    EXPECT_EQ(k->reply.error().code, c.code) << k->reply.error().message;
    EXPECT_THAT(k->reply.error().message, HasSubstr(c.message));
  }
  EXPECT_TRUE(backend_->embeds().empty());
  // And Submit to the embedding model is refused the same way.
  SubmitRequest s = request();
  s.model = "emb";
  auto p = svc_->submit(alice_, s);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::unsupported);
}

TEST_F(EmbedTest, AnImageTheWorkerCannotDecodeFailsTheJobTyped) {
  start();
  auto r = run(alice_, embed_request({"fine"}, {"BROKEN bytes"}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::invalid_argument);
  EXPECT_THAT(r.error().message, HasSubstr("image 0: fake: corrupt"));
  const JobId id = 1;
  EXPECT_EQ(str(job(id), "state"), "failed");
  EXPECT_EQ(str(job(id), "reason"), "invalid_request");
}

TEST_F(EmbedTest, LongTextsAreTruncatedAndCounted) {
  start();
  auto r = run(alice_, embed_request({"a long text over eight tokens", "ok"}));
  ASSERT_TRUE(r) << describe(r);
  EXPECT_EQ(u32(r->result, "truncated"), 1u);
  const auto spec = backend_->embeds().at(0);
  EXPECT_EQ(spec.texts[0].size(), 8u);
  EXPECT_EQ(spec.texts[0].back(), 2);  // EOS kept last
}

TEST_F(EmbedTest, AGpuFaultReRunsTheJobOnTheCpu) {
  start();
  fake::EmbedScript s;
  s.gpu_fail = Errc::device_lost;
  backend_->set_embed_script(s);
  auto r = run(alice_, embed_request({"a"}, {"img"}));
  ASSERT_TRUE(r) << describe(r);
  EXPECT_EQ(str(r->result, "route"), "cpu");
  EXPECT_EQ(u32(r->result, "attempts"), 2u);
  EXPECT_TRUE(flag(r->result, "degraded"));
  const auto specs = backend_->embeds();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].route.device, policy::Device::gpu);
  EXPECT_EQ(specs[1].route.device, policy::Device::cpu);
  EXPECT_EQ(specs[1].texts, specs[0].texts);  // the same inputs, run again
  EXPECT_EQ(r->vectors[1], FakeBackend::vector_of(*png("img")));
  EXPECT_EQ(svc_->counters().at("retries"), 1u);
  // The next call goes to the CPU while the device is lost.
  auto again = run(alice_, embed_request({"b"}));
  ASSERT_TRUE(again) << describe(again);
  EXPECT_EQ(str(again->result, "route"), "cpu");
}

TEST_F(EmbedTest, OutOfMemoryOnTheGpuAlsoMovesToTheCpu) {
  start();
  fake::EmbedScript s;
  s.gpu_fail = Errc::out_of_memory;
  backend_->set_embed_script(s);
  auto r = run(alice_, embed_request({"a", "b"}));
  ASSERT_TRUE(r) << describe(r);
  EXPECT_EQ(str(r->result, "route"), "cpu");
  EXPECT_EQ(r->vectors.size(), 2u);
}

TEST_F(EmbedTest, AnIdempotencyKeyNamesOneJobAndItsVectors) {
  start();
  fake::EmbedScript s;
  s.block = true;
  backend_->set_embed_script(s);
  EmbedRequest r = embed_request({"same"}, {"img"});
  r.options.idempotency_key = "k1";
  auto first = call(alice_, r);
  ASSERT_TRUE(pump_until([&] { return backend_->blocked() == 1; }));
  auto second = call(alice2_, r);  // the same user retries on another connection while it runs
  EXPECT_FALSE(second->done);
  EmbedRequest other = r;
  other.texts = {"different"};
  auto dup = call(alice_, other);
  ASSERT_TRUE(dup->done);
  ASSERT_FALSE(dup->reply);
  EXPECT_EQ(dup->reply.error().code, Errc::duplicate);
  backend_->release_all();
  ASSERT_TRUE(pump_until([&] { return first->done && second->done; }));
  ASSERT_TRUE(first->reply) << describe(first->reply);
  ASSERT_TRUE(second->reply) << describe(second->reply);
  EXPECT_EQ(first->reply->vectors, second->reply->vectors);
  EXPECT_EQ(u64(first->reply->result, "job_id"), u64(second->reply->result, "job_id"));
  EXPECT_EQ(backend_->embeds().size(), 1u);  // one run for both calls
  // After it completed: the held vectors, no new run.
  auto third = run(alice_, r);
  ASSERT_TRUE(third) << describe(third);
  EXPECT_TRUE(flag(third->result, "existing"));
  EXPECT_EQ(third->vectors, first->reply->vectors);
  EXPECT_EQ(backend_->embeds().size(), 1u);
  // Keys are per user: bob's "k1" is another job.
  auto bobs = run(bob_, r);
  ASSERT_TRUE(bobs) << describe(bobs);
  EXPECT_FALSE(flag(bobs->result, "existing"));
  EXPECT_EQ(backend_->embeds().size(), 2u);
}

TEST_F(EmbedTest, AFailedKeyedJobRunsAgainWithTheKey) {
  start();
  auto r0 = embed_request({"x"}, {"BROKEN"});
  r0.options.idempotency_key = "k2";
  auto bad = run(alice_, r0);
  ASSERT_FALSE(bad);
  // The same request again: the key's job failed, so it runs again (nothing was delivered, no side effects).
  auto again = run(alice_, r0);
  ASSERT_FALSE(again);
  EXPECT_EQ(backend_->embeds().size(), 2u);
}

TEST_F(EmbedTest, TheCpuServesWhenTheGpuIsHeld) {
  start();
  auto cookie = svc_->hold_gpu(admin_, "a game", "org.example.Game");
  ASSERT_TRUE(cookie) << describe(cookie);
  auto r = run(alice_, embed_request({"held"}));
  ASSERT_TRUE(r) << describe(r);
  EXPECT_EQ(str(r->result, "route"), "cpu");
  EXPECT_TRUE(flag(r->result, "degraded"));
  // allow_cpu = false under a hold: refused with a retry hint, as Submit is.
  EmbedRequest g = embed_request({"gpu only"});
  g.options.allow_cpu = false;
  auto k = call(alice_, g);
  ASSERT_TRUE(k->done);
  ASSERT_FALSE(k->reply);
  EXPECT_THAT(k->reply.error().message, HasSubstr("retry_after_ms="));
  ASSERT_TRUE(svc_->release_gpu(admin_, *cookie));
  // The hold gave the GPU replica back (evict_on_hold): it is loaded again before the GPU serves.
  ASSERT_TRUE(pump_until([&] { return svc_->residency().find("emb")->state == ReplicaState::loaded; }));
  auto after = run(alice_, g);
  ASSERT_TRUE(after) << describe(after);
  EXPECT_EQ(str(after->result, "route"), "gpu");
}

// A second GPU job waits in the GPU queue behind a running one (allow_cpu = false keeps it there).
class EmbedQueueTest : public EmbedTest {
 protected:
  EmbedQueueTest() { cfg_.policy.gpu_queue.concurrency = 1; }
  std::shared_ptr<Call> queue_behind_a_running_job(EmbedRequest g) {
    fake::EmbedScript s;
    s.block = true;
    backend_->set_embed_script(s);
    first_ = call(alice_, embed_request({"first"}));
    EXPECT_TRUE(pump_until([&] { return backend_->blocked() == 1; }));
    g.options.allow_cpu = false;
    auto k = call(alice_, g);
    settle();
    EXPECT_FALSE(k->done) << (k->done ? describe(k->reply) : "");
    return k;
  }
  std::shared_ptr<Call> first_;
};

// The job queued behind the running one (an Embed call has no job id until it is answered): the first job after the
// running one's id that GetJob shows queued.
JobId queued_job(const Service& svc, const Caller& c, JobId running) {
  for (JobId id = running + 1; id < running + 8; ++id)
    if (auto v = svc.get_job(c, id); v && str(*v, "state") == "queued") return id;
  return 0;
}

// Measured at load: the embedding replica's warm-up times per text and per image give an embedding job an ETA of its
// own kind — its inputs at those times, after the job ahead of it on the replica — not an LLM's token estimate
// (docs/policy.md §6, "Fixed-duration jobs"); a run then moves the figures.
TEST_F(EmbedQueueTest, TheEtaIsTheInputsAtTheirMeasuredTimes) {
  WarmupReport w;
  w.model = "emb";
  w.route = policy::Device::gpu;
  w.units = {{policy::WorkUnit::text, 4, 160ms}, {policy::WorkUnit::image, 2, 200ms}};
  backend_->warmups = {w};
  start();
  auto k = queue_behind_a_running_job(embed_request({"a", "b"}, {"one"}));
  auto view = svc_->get_job(alice_, queued_job(*svc_, alice_, backend_->embeds().front().job));
  ASSERT_TRUE(view) << describe(view);
  // The first job (one text, 40 ms) runs; this one waits for the slot, then 2 texts (80 ms) and an image (100 ms).
  EXPECT_EQ(u64(*view, "eta_ms"), 220u);
  EXPECT_TRUE(flag(*view, "eta_known"));
  backend_->set_embed_script({});
  backend_->release_all();
  ASSERT_TRUE(pump_until([&] { return first_->done && k->done; }, true));
  ASSERT_TRUE(k->reply) << describe(k->reply);
}

// Without a warm-up (it failed, or the replica has not loaded) the ETA is not a number pretending to be measured.
TEST_F(EmbedQueueTest, NoWarmUpNoKnownEta) {
  start();
  auto k = queue_behind_a_running_job(embed_request({"a"}));
  auto view = svc_->get_job(alice_, queued_job(*svc_, alice_, backend_->embeds().front().job));
  ASSERT_TRUE(view) << describe(view);
  EXPECT_FALSE(flag(*view, "eta_known"));
  backend_->set_embed_script({});
  backend_->release_all();
  ASSERT_TRUE(pump_until([&] { return first_->done && k->done; }, true));
}

TEST_F(EmbedQueueTest, ADeadlineWhileQueuedIsATimeout) {
  start();
  EmbedRequest g = embed_request({"late"});
  g.options.deadline_ms = 50;
  auto k = queue_behind_a_running_job(g);
  clock_->advance(100ms);
  ASSERT_TRUE(pump_until([&] { return k->done; }, /*tick=*/true));
  ASSERT_FALSE(k->reply);
  EXPECT_EQ(k->reply.error().code, Errc::timeout) << k->reply.error().message;
  backend_->release_all();
  ASSERT_TRUE(pump_until([&] { return first_->done; }));
  EXPECT_TRUE(first_->reply);
}

TEST_F(EmbedQueueTest, DrainingRefusesNewCallsAndEndsQueuedOnes) {
  start();
  auto k = queue_behind_a_running_job(embed_request({"queued"}));
  svc_->begin_drain();
  ASSERT_TRUE(pump_until([&] { return k->done; }, true));
  ASSERT_FALSE(k->reply);
  EXPECT_EQ(k->reply.error().code, Errc::unavailable) << k->reply.error().message;
  auto late = call(alice_, embed_request({"late"}));
  ASSERT_TRUE(late->done);
  EXPECT_EQ(late->reply.error().code, Errc::unavailable);
  backend_->release_all();
  ASSERT_TRUE(pump_until([&] { return first_->done; }));
  EXPECT_TRUE(first_->reply) << describe(first_->reply);  // the running one finishes
}

TEST_F(EmbedQueueTest, AQueuedJobRunsWhenTheSlotFrees) {
  start();
  auto k = queue_behind_a_running_job(embed_request({"second"}));
  backend_->set_embed_script({});
  backend_->release_all();
  ASSERT_TRUE(pump_until([&] { return first_->done && k->done; }, true));
  ASSERT_TRUE(k->reply) << describe(k->reply);
  EXPECT_EQ(str(k->reply->result, "route"), "gpu");
}

// A backend that answers with the wrong number of vectors: the job fails Internal (never a short answer), and
// GetJob says so, as the caller heard it.
TEST_F(EmbedTest, AResultOfTheWrongShapeFailsTheJobInternal) {
  start();
  fake::EmbedScript s;
  s.drop = 1;
  backend_->set_embed_script(s);
  auto r = run(alice_, embed_request({"one", "two"}, {"img"}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::internal);
  EXPECT_THAT(r.error().message, HasSubstr("2 vectors for 3 inputs"));
  EXPECT_EQ(str(job(1), "state"), "failed");
  EXPECT_EQ(str(job(1), "reason"), "run_failed");
  EXPECT_EQ(str(job(1), "error_code"), code(Errc::internal));
  backend_->set_embed_script({});
  EXPECT_TRUE(run(alice_, embed_request({"one"})));
}

// Messages name an image as its caller passed it (the D-Bus front end names fds image_fds[i]).
TEST_F(EmbedTest, ErrorsNameTheImageAsTheCallerPassedIt) {
  start();
  EmbedRequest r = embed_request({}, {"fine"});
  r.images.push_back(std::make_shared<const std::vector<std::uint8_t>>(std::vector<std::uint8_t>{'G', 'I', 'F', '8'}));
  r.image_names = {"image_fds[0]", "image_fds[1]"};
  auto bad = run(alice_, r);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  EXPECT_THAT(bad.error().message, HasSubstr("image_fds[1]"));
  r.image_names.clear();
  bad = run(alice_, r);
  ASSERT_FALSE(bad);
  EXPECT_THAT(bad.error().message, HasSubstr("images[1]"));
}

// A run failure that is not an accelerator fault: Unavailable for the caller and in GetJob (an embedding job is
// never Resumable: the caller calls again).
TEST_F(EmbedTest, ARunFailureIsUnavailableNotResumable) {
  start();
  fake::EmbedScript s;
  s.fail = Errc::io_error;
  backend_->set_embed_script(s);
  auto r = run(alice_, embed_request({"one"}));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_EQ(str(job(1), "state"), "failed");
  EXPECT_EQ(str(job(1), "error_code"), code(Errc::unavailable));
}

// Under group commit a job waits for its accept to be durable; a second call with the same key meanwhile attaches
// to it (one job, one run, both answered), and if the accept cannot be made durable both get the typed error.
TEST_F(EmbedTest, ASecondCallWhileTheAcceptIsPendingAttachesToTheJob) {
  cfg_.journal.fsync = true;  // syncs go through the hook testing_fail_journal_syncs uses
  start();
  svc_->set_group_commit(true);
  EmbedRequest req = embed_request({"keyed"}, {"img"});
  req.options.idempotency_key = "k-pending";
  auto a = call(alice_, req);
  auto b = call(alice_, req);
  ASSERT_TRUE(svc_->commit());
  ASSERT_TRUE(pump_until([&] { return a->done && b->done; }));
  ASSERT_TRUE(a->reply) << describe(a->reply);
  ASSERT_TRUE(b->reply) << describe(b->reply);
  EXPECT_EQ(a->reply->vectors, b->reply->vectors);
  EXPECT_EQ(backend_->embeds().size(), 1u) << "one run for both calls";

  req.options.idempotency_key = "k-lost";
  auto c = call(alice_, req);
  auto d = call(alice_, req);
  svc_->testing_fail_journal_syncs(1);  // the sync that would make the accept durable fails: the job is withdrawn
  (void)svc_->commit();
  ASSERT_TRUE(pump_until([&] { return c->done && d->done; }));
  ASSERT_FALSE(c->reply);
  ASSERT_FALSE(d->reply);
  EXPECT_EQ(c->reply.error().code, Errc::internal);
  EXPECT_EQ(d->reply.error().code, Errc::internal);
}

TEST_F(EmbedTest, ARestartLeavesAnUnfinishedEmbeddingJobFailedAndNotResumable) {
  start();
  fake::EmbedScript s;
  s.block = true;
  backend_->set_embed_script(s);
  auto k = call(alice_, embed_request({"in flight"}, {"img"}));
  ASSERT_TRUE(pump_until([&] { return backend_->blocked() == 1; }));
  backend_->release_all();
  svc_.reset();  // a crash-like stop: the journal holds the accept only
  backend_->set_embed_script({});
  ASSERT_NO_FATAL_FAILURE(start());
  Dict j = job(1);
  EXPECT_EQ(str(j, "state"), "failed");
  EXPECT_EQ(str(j, "reason"), "daemon_restart");
  EXPECT_EQ(str(j, "kind"), "embed");
  EXPECT_EQ(u32(j, "inputs"), 2u);
  EXPECT_EQ(str(j, "error_code"), code(Errc::unavailable));
  auto res = svc_->resume(alice_, 1, {});
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, Errc::illegal_transition);
  EXPECT_THAT(res.error().message, HasSubstr("call Embed again"));
}

// One budget: a long prompt that does not fit next to the resident weights routes to the CPU while an embedding
// job (a small forward, no KV) still fits and keeps the GPU.
TEST_F(EmbedTest, ALongPromptRoutesToTheCpuWhileEmbeddingsKeepTheGpu) {
  // A tight budget at normal pressure: no margin, pressure levels far below what is left free.
  cfg_.policy.headroom.margin.bytes = 0;
  cfg_.policy.headroom.margin.fraction = 0;
  cfg_.policy.ladder.pressure = {0.0004, 0.0005, 0.0001, 0.0002};
  start();
  SubmitRequest big = request(std::string(400, 'x'), 100);
  auto plan = svc_->plan(alice_, big);
  ASSERT_TRUE(plan) << describe(plan);
  const auto need = at<std::map<std::string, std::uint64_t>>(*plan, "breakdown").at("total");
  const auto head = at<std::map<std::string, std::int64_t>>(*plan, "headroom").at("headroom");
  ASSERT_GT(head, static_cast<std::int64_t>(need));
  // Foreign load leaves room for the embedding forward but not for the prompt's KV cache and activations (set in
  // two steps: the device's own reading decides what is free).
  std::uint64_t foreign = static_cast<std::uint64_t>(head) - need;
  ASSERT_TRUE(svc_->testing_foreign_load(foreign));
  auto headroom_now = [&] {
    auto p2 = svc_->plan(alice_, big);
    return at<std::map<std::string, std::int64_t>>(*p2, "headroom").at("headroom");
  };
  foreign += static_cast<std::uint64_t>(headroom_now()) - need / 4;
  ASSERT_TRUE(svc_->testing_foreign_load(foreign));
  ASSERT_LT(headroom_now(), static_cast<std::int64_t>(need));
  Dict placed;
  const JobId llm = submit_ok(alice_, big, &placed);
  EXPECT_EQ(str(placed, "route"), "cpu") << str(placed, "reason");
  auto r = run(alice_, embed_request({"a small forward"}));
  ASSERT_TRUE(r) << describe(r);
  EXPECT_EQ(str(r->result, "route"), "gpu") << str(job(u64(r->result, "job_id")), "detail") << " / " << str(job(u64(r->result, "job_id")), "action");
  EXPECT_FALSE(flag(r->result, "degraded"));
  ASSERT_TRUE(wait_terminal(llm));
}


// And the other way round: an embedding batch too large for what is left goes to the CPU while a short LLM job
// still fits and keeps the GPU.
TEST_F(EmbedTest, ALargeEmbeddingBatchRoutesToTheCpuWhileAShortPromptKeepsTheGpu) {
  cfg_.policy.headroom.margin.bytes = 0;
  cfg_.policy.headroom.margin.fraction = 0;
  cfg_.policy.ladder.pressure = {1e-9, 2e-9, 0.0, 1e-9};  // a few hundred KiB free is not "critical" here
  // Without the evict rung (else the idle LLM replica would be given back for the batch: test_service_residency.cc).
  cfg_.policy.ladder.order = ladder_without_evict();
  start();
  SubmitRequest small = request("hi", 4);
  auto plan = svc_->plan(alice_, small);
  ASSERT_TRUE(plan) << describe(plan);
  const auto need = at<std::map<std::string, std::uint64_t>>(*plan, "breakdown").at("total");
  auto headroom_now = [&] {
    auto p2 = svc_->plan(alice_, small);
    return at<std::map<std::string, std::int64_t>>(*p2, "headroom").at("headroom");
  };
  // Leave twice what the short prompt needs (two steps: the device's own reading decides what is free).
  std::uint64_t foreign = static_cast<std::uint64_t>(headroom_now()) - 2 * need;
  ASSERT_TRUE(svc_->testing_foreign_load(foreign));
  foreign += static_cast<std::uint64_t>(headroom_now()) - 2 * need;
  ASSERT_TRUE(svc_->testing_foreign_load(foreign));
  ASSERT_GE(headroom_now(), static_cast<std::int64_t>(need));
  ASSERT_LT(headroom_now(), static_cast<std::int64_t>(3 * need));
  std::vector<std::string> texts, images;
  for (int i = 0; i < 32; ++i) texts.push_back("a long caption of a picture, number " + std::to_string(i));
  for (int i = 0; i < 32; ++i) images.push_back("img-" + std::to_string(i));
  auto big = run(alice_, embed_request(texts, images));
  ASSERT_TRUE(big) << describe(big);
  EXPECT_EQ(str(big->result, "route"), "cpu") << str(job(u64(big->result, "job_id")), "detail");
  Dict placed;
  const JobId llm = submit_ok(alice_, small, &placed);
  EXPECT_EQ(str(placed, "route"), "gpu") << str(placed, "reason");
  ASSERT_TRUE(wait_terminal(llm));
}

}  // namespace
}  // namespace tandem::daemon::testing
