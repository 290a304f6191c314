// Transcription through a ring session (ABI 1.2; docs/rings.md "Transcribe"): a real Service over the FakeBackend's
// speech model "asr" (one window per 30 s, one segment " w<k>" per window), a RingHub, RingClient peers. A file in
// one record and a live stream in `audio` chunks both answer accepted, audio_info, segment/progress per window and
// finished; bad records and refused chunks are typed errors that leave the session open; a session that ends closes
// its streams, whose jobs finish over what arrived.
#include "daemon/transcribe_record.h"
#include "ring_hub_fixture.h"
#include "square_wav.h"

namespace tandem::daemon::ring_testing {
namespace {

using testing::square_wav;

class RingHubTranscribeTest : public RingHubTest {
 protected:
  RingHubTranscribeTest() {
    backend_->add_speech_model();
    ModelConfig asr;
    asr.name = "asr";
    asr.dir = "/nonexistent/asr";
    cfg_.models.push_back(asr);
  }
  Peer* open_big(const Caller& c) { return open(c, Dict{{"request_data_bytes", std::uint64_t{8u << 20}}}); }

  static std::vector<std::uint8_t> stream_record(std::uint64_t rate = 16000) {
    TranscribeRequest r;
    r.model = "asr";
    r.stream = audio::StreamFormat{static_cast<int>(rate), 1, audio::SampleFormat::s16le};
    return transcribe_record(r);
  }
  // Sends `seconds` of 16-kHz mono s16le at the stream's current end (pumping until the SQ takes it).
  void send(Peer& p, JobId job, double seconds, bool end, std::uint64_t ud = 900) {
    AudioChunk c;
    c.offset = sent_[job];
    c.pcm.assign(static_cast<std::size_t>(seconds * 16000) * 2, 0x02);
    c.end = end;
    ASSERT_TRUE(p.client->audio(ud, job, audio_record(c)));
    sent_[job] += c.pcm.size();
    pass();
  }
  // Opens a session for alice and starts a 16-kHz stream on it; the stream's job id, or 0 (the test has failed).
  JobId start_stream(Peer*& p) {
    p = open_big(alice_);
    if (p == nullptr) return 0;
    EXPECT_TRUE(p->client->transcribe(1, stream_record()));
    return wait_accepted(*p, 1);
  }
  std::string segments_text(const Peer& p, JobId job) const {
    std::string s;
    for (const auto& e : p.of_job(job))
      if (e.kind() == Kind::segment) s += field<std::string>(parse(e), "text");
    return s;
  }
  std::map<JobId, std::uint64_t> sent_;
};

TEST_F(RingHubTranscribeTest, AFileInOneRecordStreamsItsSegmentsAsCompletions) {
  start();
  Peer* p = open_big(alice_);
  ASSERT_NE(p, nullptr);
  TranscribeRequest r;
  r.model = "asr";
  r.audio = std::make_shared<const std::vector<std::uint8_t>>(square_wav(75));
  ASSERT_TRUE(p->client->transcribe(5, transcribe_record(r)));
  const JobId job = wait_accepted(*p, 5);
  ASSERT_NE(job, 0u);
  ASSERT_TRUE(wait_finished(*p, job));
  EXPECT_EQ(segments_text(*p, job), " w0 w1 w2");
  const std::string kinds = p->kinds_of_job(job);
  EXPECT_TRUE(kinds.starts_with("accepted,")) << kinds;
  EXPECT_TRUE(kinds.ends_with(",finished")) << kinds;
  EXPECT_NE(kinds.find("audio_info"), std::string::npos) << kinds;
  EXPECT_LT(kinds.find("audio_info"), kinds.find("segment")) << kinds;
  int progress = 0;
  for (const auto& e : p->of_job(job)) {
    EXPECT_EQ(e.entry.user_data, 5u);
    if (e.kind() == Kind::progress) {
      ++progress;
      EXPECT_EQ(field<std::uint64_t>(parse(e), "windows_done"), static_cast<std::uint64_t>(progress));
    }
    if (e.kind() == Kind::segment && field<std::uint64_t>(parse(e), "index") == 1) {
      EXPECT_EQ(field<std::uint64_t>(parse(e), "start_ms"), 30000u);
    }
    if (e.kind() == Kind::finished) {
      EXPECT_EQ(field<std::string>(parse(e), "finish_reason"), "end_of_audio");
    }
  }
  EXPECT_EQ(progress, 3);
  EXPECT_EQ(counter("ring_transcribes"), 1u);
}

TEST_F(RingHubTranscribeTest, ALiveStreamIsTranscribedWindowByWindowAsItsChunksArrive) {
  start();
  Peer* p = nullptr;
  const JobId job = start_stream(p);
  ASSERT_NE(job, 0u);
  for (int i = 0; i < 7; ++i) send(*p, job, 5, false);  // 35 s in 5-s chunks
  ASSERT_TRUE(pump_until([&] { return segments_text(*p, job) == " w0"; }));
  EXPECT_FALSE(terminal(job));
  send(*p, job, 30, false);
  send(*p, job, 10, true);  // 75 s
  ASSERT_TRUE(wait_finished(*p, job));
  EXPECT_EQ(segments_text(*p, job), " w0 w1 w2");
  EXPECT_EQ(p->find(Kind::error, 900), nullptr);  // every chunk was taken: none answered
  EXPECT_EQ(counter("ring_audio_chunks"), 9u);
  auto j = svc_->get_job(alice_, job);
  ASSERT_TRUE(j);
  EXPECT_EQ(std::get<std::uint64_t>(j->at("stream_bytes")), 75u * 32000u);
  EXPECT_TRUE(nop_round_trip(*p, 2));
}

TEST_F(RingHubTranscribeTest, RefusedRecordsAndChunksAreTypedErrorsAndTheSessionStaysOpen) {
  start();
  Peer* p = open_big(alice_);
  ASSERT_NE(p, nullptr);
  ASSERT_TRUE(p->client->transcribe(1, ring::RecordWriter().add("model", "asr").take()));  // no audio
  ASSERT_TRUE(p->client->transcribe(2, ring::RecordWriter().add("stream", true).take()));  // no rate
  ASSERT_TRUE(p->client->transcribe(3, ring::RecordWriter().add("stream", true).add("sample_rate", std::uint64_t{16000})
                                           .add("sample_format", "u8").take()));
  ASSERT_TRUE(p->client->transcribe(4, ring::RecordWriter().add("prompt", "x").take()));
  ASSERT_TRUE(p->client->transcribe(5, stream_record(100)));  // a rate no stream has
  const char* says[] = {"no audio", "needs 'sample_rate'", "is not one of s16le, f32le", "unknown key 'prompt'",
                        "sample_rate 100"};
  for (std::uint64_t ud = 1; ud <= 5; ++ud) {
    ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, ud) != nullptr; })) << ud;
    const auto* e = p->find(Kind::error, ud);
    EXPECT_EQ(rstr(*e, "error"), "InvalidArgument") << ud;
    EXPECT_THAT(rstr(*e, "message"), HasSubstr(says[ud - 1])) << ud;
  }
  // Chunks: for no job, for a job that is not a stream, at the wrong offset, a malformed record.
  ASSERT_TRUE(p->client->transcribe(6, stream_record()));
  const JobId job = wait_accepted(*p, 6);
  ASSERT_NE(job, 0u);
  AudioChunk c;
  c.pcm.assign(3200, 0);
  ASSERT_TRUE(p->client->audio(10, 424242, audio_record(c)));
  c.offset = 64;
  ASSERT_TRUE(p->client->audio(11, job, audio_record(c)));
  ASSERT_TRUE(p->client->audio(12, job, ring::RecordWriter().add("pcm", ring::ByteList{{1, 2}}).take()));
  ASSERT_TRUE(pump_until([&] { return p->find(Kind::error, 10) && p->find(Kind::error, 11) && p->find(Kind::error, 12); }));
  EXPECT_EQ(rstr(*p->find(Kind::error, 10), "error"), "UnknownJob");
  EXPECT_EQ(p->find(Kind::error, 10)->entry.job_id, 424242u);
  EXPECT_EQ(rstr(*p->find(Kind::error, 11), "error"), "InvalidArgument");
  EXPECT_THAT(rstr(*p->find(Kind::error, 11), "message"), HasSubstr("expects 0"));
  EXPECT_EQ(p->find(Kind::error, 11)->entry.job_id, job);
  EXPECT_THAT(rstr(*p->find(Kind::error, 12), "message"), HasSubstr("'offset' is required"));
  // Another user's chunk for this job.
  Peer* b = open_big(bob_);
  ASSERT_NE(b, nullptr);
  c.offset = 0;
  ASSERT_TRUE(b->client->audio(13, job, audio_record(c)));
  ASSERT_TRUE(pump_until([&] { return b->find(Kind::error, 13) != nullptr; }));
  EXPECT_EQ(rstr(*b->find(Kind::error, 13), "error"), "NotAuthorized");
  // The stream is as it was: its first chunk at 0 is taken.
  send(*p, job, 1, true);
  ASSERT_TRUE(wait_finished(*p, job));
  EXPECT_EQ(segments_text(*p, job), " w0");
  EXPECT_TRUE(nop_round_trip(*p, 20));
}

TEST_F(RingHubTranscribeTest, ASessionThatEndsClosesItsStreamAndTheJobFinishesOverWhatArrived) {
  start();
  Peer* p = nullptr;
  const JobId job = start_stream(p);
  ASSERT_NE(job, 0u);
  send(*p, job, 40, false);
  ASSERT_TRUE(pump_until([&] { return segments_text(*p, job) == " w0"; }));
  ASSERT_TRUE(hub_->close(alice_, p->id));
  ASSERT_TRUE(pump_until([&] { return terminal(job); }));
  auto j = svc_->get_job(alice_, job);
  ASSERT_TRUE(j);
  EXPECT_EQ(std::get<std::string>(j->at("state")), "completed");
  EXPECT_EQ(std::get<std::string>(j->at("finish_reason")), "stream_closed");
  EXPECT_EQ(std::get<std::string>(j->at("text")), " w0 w1");
}

TEST_F(RingHubTranscribeTest, RecordsRoundTrip) {
  TranscribeRequest r;
  r.model = "asr";
  r.stream = audio::StreamFormat{48000, 2, audio::SampleFormat::f32le};
  r.options.language = "en";
  r.options.temperature = 0.4;
  r.options.seed = 9;
  r.options.deadline_ms = 5000;
  r.options.timestamps = false;
  const auto bytes = transcribe_record(r);
  auto parsed = ring::parse_record(bytes);
  ASSERT_TRUE(parsed.ok());
  auto back = transcribe_from_record(parsed.fields);
  ASSERT_TRUE(back) << back.error().message;
  ASSERT_TRUE(back->stream);
  EXPECT_EQ(back->stream->rate, 48000);
  EXPECT_EQ(back->stream->channels, 2);
  EXPECT_EQ(back->stream->sample, audio::SampleFormat::f32le);
  EXPECT_EQ(back->options.language, "en");
  EXPECT_EQ(back->options.temperature, 0.4);
  EXPECT_EQ(back->options.seed, 9u);
  EXPECT_EQ(back->options.deadline_ms, 5000u);
  EXPECT_FALSE(back->options.timestamps);
  EXPECT_EQ(back->audio, nullptr);
  AudioChunk c{123, {1, 2, 3, 4}, true};
  auto pc = ring::parse_record(audio_record(c));
  ASSERT_TRUE(pc.ok());
  auto cb = audio_from_record(pc.fields);
  ASSERT_TRUE(cb);
  EXPECT_EQ(cb->offset, 123u);
  EXPECT_EQ(cb->pcm, c.pcm);
  EXPECT_TRUE(cb->end);
  // A file and a stream at once, stream keys without a stream, two files.
  auto both = ring::RecordWriter().add("audio", ring::ByteList{{1}}).add("stream", true).add("sample_rate", std::uint64_t{8000}).take();
  EXPECT_THAT(transcribe_from_record(ring::parse_record(both).fields).error().message, HasSubstr("not both"));
  auto stray = ring::RecordWriter().add("audio", ring::ByteList{{1}}).add("channels", std::uint64_t{2}).take();
  EXPECT_THAT(transcribe_from_record(ring::parse_record(stray).fields).error().message, HasSubstr("are for a stream"));
  auto two = ring::RecordWriter().add("audio", ring::ByteList{{1}, {2}}).take();
  EXPECT_THAT(transcribe_from_record(ring::parse_record(two).fields).error().message, HasSubstr("give one file"));
  auto empty = ring::RecordWriter().add("offset", std::uint64_t{0}).take();
  EXPECT_THAT(audio_from_record(ring::parse_record(empty).fields).error().message, HasSubstr("no 'pcm' and no 'end'"));
}

}  // namespace
}  // namespace tandem::daemon::ring_testing
