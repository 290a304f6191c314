// The ring's embed operation in the daemon (src/daemon/ring_hub_embed.cc; docs/rings.md "Embed (ABI 1.1)"): a real
// Service over the FakeBackend's embedding model "emb", a RingHub, RingClient peers. One `embedded` completion per
// embed with count × dim vectors and the result keys; typed errors for bad records and unknown models; a reply too
// large for the response area is an error that says so; a session that ends before the job does drops the answer.
#include <algorithm>
#include <cmath>

#include "ring_hub_fixture.h"

namespace tandem::daemon::ring_testing {
namespace {

class RingHubEmbedTest : public RingHubTest {
 protected:
  RingHubEmbedTest() {
    backend_->add_embedding_model();
    cfg_.embedding.max_inputs = 1024;
    bool have = false;
    for (const auto& m : cfg_.models) have = have || m.name == "emb";
    if (!have) {
      ModelConfig emb;
      emb.name = "emb";
      emb.dir = "/nonexistent/emb";
      cfg_.models.push_back(emb);
    }
  }

  static std::vector<std::uint8_t> embed_record(const std::vector<std::string>& texts, const std::string& model = "emb",
                                                const std::string& key = "") {
    ring::RecordWriter w;
    if (!model.empty()) w.add("model", std::string_view(model));
    w.add("texts", texts);
    if (!key.empty()) w.add("idempotency_key", std::string_view(key));
    return w.take();
  }

  // Waits for the one answer of embed `ud`.
  const ring::Event* answer(Peer& p, std::uint64_t ud) {
    const bool got = pump_until([&] { return p.find(Kind::embedded, ud) || p.find(Kind::error, ud); });
    EXPECT_TRUE(got) << "no embedded/error for user_data " << ud;
    if (const auto* e = p.find(Kind::embedded, ud)) return e;
    return p.find(Kind::error, ud);
  }
};

TEST_F(RingHubEmbedTest, OneEmbeddedCompletionWithTheVectors) {
  start();
  Peer* p = open(alice_);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->client->embed(7, embed_record({"a red circle", "two blue squares", "x"})));
  const ring::Event* e = answer(*p, 7);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->kind(), Kind::embedded) << (e->kind() == Kind::error ? rstr(*e, "message") : kind_name(*e));
  const JobId job = e->entry.job_id;
  EXPECT_NE(job, 0u);
  const auto rec = parse(*e);
  ASSERT_TRUE(rec.ok());
  const auto count = field<std::uint64_t>(rec, "count");
  const auto dim = field<std::uint64_t>(rec, "dim");
  EXPECT_EQ(count, 3u);
  EXPECT_GT(dim, 0u);
  EXPECT_EQ(field<std::uint64_t>(rec, "job_id"), job);
  EXPECT_EQ(field<std::string>(rec, "model"), "emb");
  EXPECT_FALSE(field<std::string>(rec, "route").empty());
  const auto vectors = field<std::vector<float>>(rec, "vectors");
  ASSERT_EQ(vectors.size(), count * dim);
  for (float x : vectors) EXPECT_TRUE(std::isfinite(x));
  // Exactly one completion for this embed: no accepted/routed/started/finished of its job follow.
  pump_until([] { return false; }, 100ms);
  EXPECT_EQ(p->of_user(7).size(), 1u);
  EXPECT_EQ(p->kinds_of_job(job), "embedded");
  EXPECT_TRUE(terminal(job)) << phase(job);
  EXPECT_EQ(counter("ring_embeds"), 1u);
  EXPECT_TRUE(nop_round_trip(*p, 8));
}

TEST_F(RingHubEmbedTest, TheSameVectorsAsTheServiceAndTheClientDecodesThem) {
  start();
  Peer* p = open(alice_);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->client->embed(1, embed_record({"hello"})));
  ASSERT_TRUE(p->client->embed(2, embed_record({"hello"})));
  ASSERT_NE(answer(*p, 1), nullptr);
  ASSERT_NE(answer(*p, 2), nullptr);
  // Both answers are in; no pump runs past this point, so the pointers into the events stay valid.
  const ring::Event* a = p->find(Kind::embedded, 1) ? p->find(Kind::embedded, 1) : p->find(Kind::error, 1);
  const ring::Event* b = p->find(Kind::embedded, 2) ? p->find(Kind::embedded, 2) : p->find(Kind::error, 2);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->kind(), Kind::embedded);
  ASSERT_EQ(b->kind(), Kind::embedded);
  EXPECT_NE(a->entry.job_id, b->entry.job_id);
  EXPECT_EQ(field<std::vector<float>>(parse(*a), "vectors"), field<std::vector<float>>(parse(*b), "vectors"));
}

TEST_F(RingHubEmbedTest, TokenInputsReachTheServiceAfterTheTexts) {
  start();
  Peer* p = open(alice_);
  ASSERT_NE(p, nullptr);
  // The fake tokenizer gives 3 + byte % 200 per byte: "ab" is {100, 101}.
  ring::RecordWriter w;
  w.add("model", "emb")
      .add("texts", std::vector<std::string>{"ab"})
      .add("tokens", std::vector<std::int32_t>{100, 101, 9})
      .add("token_lengths", std::vector<std::int32_t>{2, 1});
  ASSERT_TRUE(p->client->embed(1, w.take()));
  const ring::Event* e = answer(*p, 1);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->kind(), Kind::embedded) << rstr(*e, "message");
  const auto v = field<std::vector<float>>(parse(*e), "vectors");
  ASSERT_EQ(v.size(), 3u * 4u);  // three inputs of the fake's 4 dimensions
  EXPECT_TRUE(std::equal(v.begin(), v.begin() + 4, v.begin() + 4)) << "a text and its ids embed alike";
  EXPECT_FALSE(std::equal(v.begin(), v.begin() + 4, v.begin() + 8));
  const auto specs = backend_->embeds();
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].texts[2], (std::vector<TokenId>{1, 9, 2}));
}

TEST_F(RingHubEmbedTest, BadRecordsAreInvalidArgumentAndTheSessionStaysOpen) {
  start();
  Peer* p = open(alice_);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->client->embed(1, ring::RecordWriter().add("model", "emb").take()));  // no inputs
  ASSERT_TRUE(p->client->embed(2, ring::RecordWriter().add("texts", "one").take()));  // wrong type
  ASSERT_TRUE(p->client->embed(3, ring::RecordWriter().add("texts", std::vector<std::string>{"a"}).add("prompt", "p").take()));
  for (std::uint64_t ud : {1, 2, 3}) {
    const ring::Event* e = answer(*p, ud);
    ASSERT_NE(e, nullptr);
    ASSERT_EQ(e->kind(), Kind::error);
    EXPECT_EQ(rstr(*e, "error"), "InvalidArgument");
    EXPECT_EQ(e->entry.error, static_cast<std::uint16_t>(ring::ErrorCode::invalid_argument));
    EXPECT_EQ(e->entry.job_id, 0u);
  }
  EXPECT_THAT(rstr(*p->find(Kind::error, 1), "message"), HasSubstr("no inputs"));
  EXPECT_THAT(rstr(*p->find(Kind::error, 2), "message"), HasSubstr("'texts' must be a string_list"));
  EXPECT_THAT(rstr(*p->find(Kind::error, 3), "message"), HasSubstr("unknown key 'prompt'"));
  EXPECT_EQ(p->state(), SessionState::open);
  EXPECT_TRUE(nop_round_trip(*p, 9));
}

TEST_F(RingHubEmbedTest, UnknownAndNonEmbeddingModelsAreTypedErrors) {
  start();
  Peer* p = open(alice_);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->client->embed(1, embed_record({"a"}, "nope")));
  ASSERT_TRUE(p->client->embed(2, embed_record({"a"}, "tiny")));  // an LLM
  const ring::Event* e1 = answer(*p, 1);
  const ring::Event* e2 = answer(*p, 2);
  ASSERT_TRUE(e1 && e2);
  ASSERT_EQ(e1->kind(), Kind::error);
  EXPECT_EQ(rstr(*e1, "error"), "UnknownModel");
  ASSERT_EQ(e2->kind(), Kind::error);
  EXPECT_FALSE(rstr(*e2, "error").empty());
  EXPECT_EQ(p->state(), SessionState::open);
}

TEST_F(RingHubEmbedTest, AReplyLargerThanTheResponseAreaIsAnError) {
  start();
  Peer* p = open(alice_, Dict{{"response_data_bytes", std::uint64_t{4096}}});
  ASSERT_NE(p, nullptr);
  // Find the dim with one input, then send enough inputs that count × dim × 4 passes 2 KiB.
  ASSERT_TRUE(p->client->embed(1, embed_record({"probe"})));
  const ring::Event* e = answer(*p, 1);
  ASSERT_TRUE(e && e->kind() == Kind::embedded);
  const auto dim = ru64(*e, "dim");
  ASSERT_GT(dim, 0u);
  const std::size_t n = 2048 / (dim * 4) + 8;
  ASSERT_GT(n * dim * 4, 2048u) << "the fake model's dim is too small for [embedding] max_inputs";
  std::vector<std::string> texts;
  for (std::size_t i = 0; i < n; ++i) texts.push_back("t" + std::to_string(i));
  ASSERT_TRUE(p->client->embed(2, embed_record(texts)));
  const ring::Event* big = answer(*p, 2);
  ASSERT_NE(big, nullptr);
  ASSERT_EQ(big->kind(), Kind::error);
  EXPECT_EQ(rstr(*big, "error"), "InvalidArgument");
  EXPECT_THAT(rstr(*big, "message"), HasSubstr("does not fit this ring session's response area"));
  EXPECT_NE(big->entry.job_id, 0u);
  EXPECT_EQ(ru64(*big, "job"), big->entry.job_id);
  EXPECT_TRUE(terminal(big->entry.job_id));
  EXPECT_TRUE(nop_round_trip(*p, 3));
}

TEST_F(RingHubEmbedTest, ASessionThatEndsFirstDropsTheAnswer) {
  start();
  Peer* p = open(alice_);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->client->embed(1, embed_record({"a", "b"})));
  // The hub reads the embed and starts the job, then the session closes before the job's answer is posted.
  svc_->process_events();
  hub_->process();
  (void)svc_->commit();
  ASSERT_TRUE(hub_->close(alice_, p->id));
  Peer* other = open(bob_);
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(nop_round_trip(*other, 2));  // the loop runs on; the dropped answer reaches no one
  for (const auto& ev : other->events) EXPECT_NE(ev.kind(), Kind::embedded);
  EXPECT_EQ(counter("ring_sessions_closed"), 1u);
}

TEST_F(RingHubEmbedTest, AGpuFaultMovesTheJobToTheCpu) {
  start();
  fake::EmbedScript fault;
  fault.gpu_fail = Errc::device_lost;
  backend_->set_embed_script(fault);
  Peer* p = open(alice_);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->client->embed(1, embed_record({"a", "b"})));
  const ring::Event* e = answer(*p, 1);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->kind(), Kind::embedded) << rstr(*e, "message");
  EXPECT_EQ(rstr(*e, "route"), "cpu");
  EXPECT_TRUE(rbool(*e, "degraded"));
  EXPECT_EQ(ru64(*e, "count"), 2u);
  // Degraded mode was announced in the ring before this degraded result.
  std::size_t announced = p->events.size(), answered = p->events.size();
  for (std::size_t i = 0; i < p->events.size(); ++i) {
    if (p->events[i].kind() == Kind::degraded_mode && announced == p->events.size()) announced = i;
    if (p->events[i].kind() == Kind::embedded && p->events[i].entry.user_data == 1) answered = i;
  }
  ASSERT_LT(answered, p->events.size());
  EXPECT_LT(announced, answered) << "the degraded result came before the degraded_mode announcement";
}

TEST_F(RingHubEmbedTest, ASessionThatEndsWhileTheJobRunsDropsItsAnswer) {
  start();
  fake::EmbedScript block;
  block.block = true;
  backend_->set_embed_script(block);
  Peer* p = open(alice_);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->client->embed(1, embed_record({"a"})));
  ASSERT_TRUE(pump_until([&] { return backend_->blocked() == 1; }));
  ASSERT_TRUE(hub_->close(alice_, p->id));
  p->reading = false;
  backend_->release_all();
  Peer* other = open(bob_);
  ASSERT_NE(other, nullptr);
  // The job ends with no session to answer; the loop and the other session go on.
  pump_until([] { return false; }, 200ms);
  EXPECT_TRUE(nop_round_trip(*other, 2));
  for (const auto& ev : other->events) EXPECT_NE(ev.kind(), Kind::embedded);
  EXPECT_TRUE(p->of_user(1).empty());
}

TEST_F(RingHubEmbedTest, IdempotencyKeyAnswersWithTheSameJob) {
  start();
  Peer* p = open(alice_);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->client->embed(1, embed_record({"a"}, "emb", "k-1")));
  const ring::Event* a = answer(*p, 1);
  ASSERT_TRUE(a && a->kind() == Kind::embedded);
  const auto first_job = a->entry.job_id;  // `a` points into the events, which the next pumps may move
  ASSERT_TRUE(p->client->embed(2, embed_record({"a"}, "emb", "k-1")));
  const ring::Event* b = answer(*p, 2);
  ASSERT_NE(b, nullptr);
  // The same job, answered with its held vectors (existing): never a second job and never silence.
  ASSERT_EQ(b->kind(), Kind::embedded);
  EXPECT_EQ(b->entry.job_id, first_job);
  EXPECT_TRUE(rbool(*b, "existing"));
}

}  // namespace
}  // namespace tandem::daemon::ring_testing
