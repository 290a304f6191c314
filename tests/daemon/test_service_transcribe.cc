// The transcribe workload in the service core: Transcribe requests validated and typed (the audio's header is read
// at the call), admitted and queued like Submit's jobs, segments streamed window by window, a GPU fault continuing
// on the CPU at the last finished window (nothing repeated, nothing lost), cancellation mid-file, idempotency, and
// what a restart leaves. FakeBackend's "asr" model: one window per 30 s of audio, one segment " w<k>" per window.
#include <nlohmann/json.hpp>

#include "service_fixture.h"
#include "square_wav.h"

namespace tandem::daemon::testing {
namespace {

using fake::TranscribeScript;

// A mono 16-bit PCM WAV of `seconds` of a quiet square wave at `rate` Hz (a real file: the service reads its header).
std::shared_ptr<const std::vector<std::uint8_t>> wav(double seconds, std::uint32_t rate = 1000, std::uint16_t tone = 1) {
  return std::make_shared<const std::vector<std::uint8_t>>(square_wav(seconds, rate, tone));
}

TranscribeRequest transcribe_request(double seconds = 75) {
  TranscribeRequest r;
  r.model = "asr";
  r.audio = wav(seconds);
  r.audio_name = "audio_fd[0]";
  return r;
}

class TranscribeTest : public ServiceTest {
 protected:
  TranscribeTest() {
    backend_->add_speech_model();
    ModelConfig asr;
    asr.name = "asr";
    asr.dir = "/nonexistent/asr";
    cfg_.models.push_back(asr);
  }
  JobId transcribe_ok(const Caller& c, const TranscribeRequest& r, Dict* placement = nullptr) {
    auto p = svc_->transcribe(c, r);
    EXPECT_TRUE(p) << describe(p);
    if (!p) return 0;
    if (placement) *placement = *p;
    return u64(*p, "job_id");
  }
  std::string segments_text(JobId id) const {
    std::string s;
    for (const auto& u : rec_.of(id))
      if (u.kind == "segment") s += str(u.data, "text");
    return s;
  }
};

TEST_F(TranscribeTest, SegmentsStreamWindowByWindowAndGetJobHasTheTranscript) {
  start();
  Dict placement;
  const JobId id = transcribe_ok(alice_, transcribe_request(75), &placement);  // 75 s: 3 windows
  EXPECT_EQ(str(placement, "route"), "gpu");
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(segments_text(id), " w0 w1 w2");
  EXPECT_EQ(rec_.count(id, "segment"), 3);
  EXPECT_EQ(rec_.count(id, "progress"), 3);
  EXPECT_EQ(rec_.count(id, "audio"), 1);
  // Progress counts up to the total; segments carry their times.
  std::vector<std::uint32_t> done;
  for (const auto& u : rec_.of(id)) {
    if (u.kind == "progress") {
      done.push_back(u32(u.data, "windows_done"));
      EXPECT_EQ(u32(u.data, "windows_total"), 3u);
      EXPECT_EQ(u64(u.data, "audio_ms"), 75000u);
    }
    if (u.kind == "segment" && u32(u.data, "index") == 2) {
      EXPECT_EQ(u64(u.data, "start_ms"), 60000u);
      EXPECT_EQ(u64(u.data, "end_ms"), 62000u);
      EXPECT_EQ(u32(u.data, "window"), 2u);
    }
  }
  EXPECT_EQ(done, (std::vector<std::uint32_t>{1, 2, 3}));
  // The order a client sees: accepted, ..., audio before the first segment, finished last.
  const auto kinds = rec_.kinds(id);
  ASSERT_FALSE(kinds.empty());
  EXPECT_EQ(kinds.back(), "finished");
  const auto audio_at = std::find(kinds.begin(), kinds.end(), "audio");
  const auto seg_at = std::find(kinds.begin(), kinds.end(), "segment");
  EXPECT_LT(audio_at - kinds.begin(), seg_at - kinds.begin());
  Dict j = job(id);
  EXPECT_EQ(str(j, "kind"), "transcribe");
  EXPECT_EQ(str(j, "text"), " w0 w1 w2");
  EXPECT_EQ(u32(j, "windows_done"), 3u);
  EXPECT_EQ(u32(j, "windows_on_cpu"), 0u);
  EXPECT_EQ(str(j, "language"), "en");  // an English-only model: its one language
  auto segs = nlohmann::json::parse(str(j, "segments_json"));
  ASSERT_EQ(segs.size(), 3u);
  EXPECT_EQ(segs[1]["text"], " w1");
  EXPECT_DOUBLE_EQ(segs[1]["start"].get<double>(), 30.0);
  // The run started at the beginning with the request's options.
  const auto specs = backend_->transcribes();
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].from.windows_done, 0u);
  EXPECT_EQ(specs[0].from.seek, 0u);
  EXPECT_EQ(specs[0].options.language, "en");
  EXPECT_EQ(specs[0].options.temperatures, (std::vector<double>{0.0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_EQ(specs[0].audio_name, "audio_fd[0]");
  // Every journal record was written (the outcome's finish_reason end_of_audio included).
  EXPECT_EQ(svc_->counters()["journal_write_errors"], 0u);
  // The finished update carries the transcript's facts.
  for (const auto& u : rec_.of(id))
    if (u.kind == "finished") {
      EXPECT_EQ(str(u.data, "text"), " w0 w1 w2");
      EXPECT_EQ(u32(u.data, "segments"), 3u);
      EXPECT_EQ(u64(u.data, "audio_ms"), 75000u);
    }
}

TEST_F(TranscribeTest, GpuFaultMidFileContinuesOnTheCpuAtTheWindowBoundary) {
  TranscribeScript s;
  s.gpu_fail_at = 2;  // windows 0 and 1 finish on the GPU, then the device is lost
  backend_->set_transcribe_script(s);
  start();
  const JobId id = transcribe_ok(alice_, transcribe_request(110));  // 4 windows
  ASSERT_TRUE(wait_terminal(id, /*tick=*/true));
  EXPECT_EQ(phase(id), "completed");
  // Nothing repeated, nothing lost.
  EXPECT_EQ(segments_text(id), " w0 w1 w2 w3");
  EXPECT_EQ(str(job(id), "text"), " w0 w1 w2 w3");
  const auto specs = backend_->transcribes();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].route.device, policy::Device::gpu);
  EXPECT_EQ(specs[1].route.device, policy::Device::cpu);
  EXPECT_EQ(specs[1].from.windows_done, 2u);
  EXPECT_EQ(specs[1].from.seek, 2u * 480000u);
  EXPECT_EQ(rec_.count(id, "migrated"), 1);
  Dict j = job(id);
  EXPECT_TRUE(flag(j, "degraded"));
  EXPECT_EQ(u32(j, "windows_on_cpu"), 2u);
  EXPECT_EQ(at<std::vector<std::string>>(j, "routes"), (std::vector<std::string>{"gpu", "cpu"}));
  bool migrated = false;
  for (const auto& h : at<std::vector<HistoryRow>>(j, "history")) migrated = migrated || std::get<1>(h) == "migrating";
  EXPECT_TRUE(migrated);
}

// Measured at load: the speech replicas' warm-ups (time per window) give a transcription its ETA before its first
// window — at placement and in its "audio" update — and after a failover, its windows left at the CPU's time
// (docs/policy.md §6, "Fixed-duration jobs").
TEST_F(TranscribeTest, TheEtaIsTheWindowsAtTheMeasuredTimePerWindow) {
  WarmupReport gpu, cpu;
  gpu.model = cpu.model = "asr";
  gpu.route = policy::Device::gpu;
  gpu.units = {{policy::WorkUnit::window, 1, 2s}};
  cpu.route = policy::Device::cpu;
  cpu.units = {{policy::WorkUnit::window, 1, 6s}};
  backend_->warmups = {gpu, cpu};
  TranscribeScript s;
  s.gpu_fail_at = 2;
  backend_->set_transcribe_script(s);
  start();
  Dict placement;
  const JobId id = transcribe_ok(alice_, transcribe_request(110), &placement);  // 4 windows
  EXPECT_EQ(u64(placement, "eta_ms"), 8000u);
  EXPECT_TRUE(flag(placement, "eta_known"));
  ASSERT_TRUE(wait_terminal(id, /*tick=*/true));
  EXPECT_EQ(phase(id), "completed");
  std::vector<std::uint64_t> audio_eta, resumed_eta;
  for (const auto& u : rec_.of(id)) {
    if (u.kind == "audio" && str(u.data, "route") == "gpu") {
      audio_eta.push_back(u64(u.data, "eta_ms"));
      EXPECT_TRUE(flag(u.data, "eta_known"));
    }
    if (u.kind == "progress" && str(u.data, "route") == "cpu" && u32(u.data, "windows_done") == 2)
      resumed_eta.push_back(u64(u.data, "eta_ms"));
  }
  EXPECT_EQ(audio_eta, (std::vector<std::uint64_t>{8000}));
  // Resumed on the CPU at window 2: two windows left at 6 s (the CPU figure; the GPU windows moved only the GPU's).
  ASSERT_FALSE(resumed_eta.empty());
  EXPECT_EQ(resumed_eta.front(), 12000u);
}

// No warm-up: the placement says the ETA is not known rather than pass an LLM's token estimate off as one.
TEST_F(TranscribeTest, NoWarmUpNoKnownEta) {
  start();
  Dict placement;
  const JobId id = transcribe_ok(alice_, transcribe_request(40), &placement);
  EXPECT_FALSE(flag(placement, "eta_known"));
  ASSERT_TRUE(wait_terminal(id));
  for (const auto& u : rec_.of(id))
    if (u.kind == "audio") {
      EXPECT_FALSE(flag(u.data, "eta_known"));
    }
}

TEST_F(TranscribeTest, GpuFaultBeforeTheFirstWindowRetriesOnTheCpu) {
  TranscribeScript s;
  s.gpu_fail_at = 0;
  s.gpu_fail = Errc::out_of_memory;
  backend_->set_transcribe_script(s);
  start();
  const JobId id = transcribe_ok(alice_, transcribe_request(20));
  ASSERT_TRUE(wait_terminal(id, true));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(segments_text(id), " w0");
  const auto specs = backend_->transcribes();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[1].route.device, policy::Device::cpu);
  EXPECT_EQ(specs[1].from.windows_done, 0u);
  EXPECT_EQ(rec_.count(id, "migrated"), 0);
  bool retried = false;
  for (const auto& h : at<std::vector<HistoryRow>>(job(id), "history")) retried = retried || std::get<1>(h) == "retrying";
  EXPECT_TRUE(retried);
}

TEST_F(TranscribeTest, NoCpuAllowedFailsUnavailableKeepingTheFinishedWindows) {
  TranscribeScript s;
  s.gpu_fail_at = 1;
  backend_->set_transcribe_script(s);
  start();
  TranscribeRequest r = transcribe_request(75);
  r.options.allow_cpu = false;
  const JobId id = transcribe_ok(alice_, r);
  ASSERT_TRUE(wait_terminal(id, true));
  Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "failed");
  EXPECT_EQ(str(j, "error_code"), code(Errc::unavailable));  // not resumable: the audio is not kept
  EXPECT_EQ(str(j, "text"), " w0");
  EXPECT_EQ(segments_text(id), " w0");
  // Resume refuses it with a reason.
  auto res = svc_->resume(alice_, id, {});
  ASSERT_FALSE(res);
  EXPECT_EQ(res.error().code, Errc::illegal_transition);
  EXPECT_THAT(res.error().message, HasSubstr("call Transcribe again"));
}

TEST_F(TranscribeTest, CancelMidFileEndsCancelledWithTheWindowsDone) {
  TranscribeScript s;
  s.block_at = 1;
  backend_->set_transcribe_script(s);
  start();
  const JobId id = transcribe_ok(alice_, transcribe_request(75));
  ASSERT_TRUE(wait_blocked(id));
  ASSERT_TRUE(pump_until([&] { return rec_.count(id, "segment") == 1; }));
  auto c = svc_->cancel(alice_, id);
  ASSERT_TRUE(c) << describe(c);
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "cancelled");
  EXPECT_EQ(str(job(id), "text"), " w0");
  EXPECT_EQ(u32(job(id), "windows_done"), 1u);
}

struct BadCase {
  const char* name;
  std::function<void(TranscribeRequest&, DaemonConfig&)> edit;
  Errc code;
  const char* message;
};

TEST_F(TranscribeTest, BadRequestsGetTypedErrorsAndRunNothing) {
  const std::vector<BadCase> cases = {
      {"no audio", [](TranscribeRequest& r, DaemonConfig&) { r.audio.reset(); }, Errc::invalid_argument,
       "audio_fd[0] is empty"},
      {"empty audio",
       [](TranscribeRequest& r, DaemonConfig&) { r.audio = std::make_shared<const std::vector<std::uint8_t>>(); },
       Errc::invalid_argument, "is empty"},
      {"not audio",
       [](TranscribeRequest& r, DaemonConfig&) {
         const std::string t = "this is not a sound file, just text";
         r.audio = std::make_shared<const std::vector<std::uint8_t>>(t.begin(), t.end());
       },
       Errc::invalid_argument, "audio_fd[0]: "},
      {"too long", [](TranscribeRequest& r, DaemonConfig& c) { c.speech.max_audio_seconds = 60; r.audio = wav(61); },
       Errc::invalid_argument, "audio_fd[0]: "},
      {"too many bytes", [](TranscribeRequest&, DaemonConfig& c) { c.speech.max_audio_bytes = 1024; },
       Errc::invalid_argument, "([speech] max_audio_bytes)"},
      {"unknown language", [](TranscribeRequest& r, DaemonConfig&) { r.options.language = "xx"; },
       Errc::invalid_argument, "language 'xx' is not one of model asr's (en)"},
      {"translate on an English-only model", [](TranscribeRequest& r, DaemonConfig&) { r.options.translate = true; },
       Errc::unsupported, "has no translate task"},
      {"temperature", [](TranscribeRequest& r, DaemonConfig&) { r.options.temperature = 3.0; },
       Errc::invalid_argument, "temperature must be in [0,2]"},
      {"an LLM", [](TranscribeRequest& r, DaemonConfig&) { r.model = "tiny"; }, Errc::unsupported,
       "model tiny is not a speech model (kind llm): call Submit"},
      {"unknown model", [](TranscribeRequest& r, DaemonConfig&) { r.model = "nope"; }, Errc::not_found,
       "unknown model 'nope'"},
      {"bad key", [](TranscribeRequest& r, DaemonConfig&) { r.options.idempotency_key = ""; },
       Errc::invalid_argument, "idempotency_key"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    TranscribeRequest r = transcribe_request(10);
    DaemonConfig cfg = cfg_;
    c.edit(r, cfg);
    cfg_ = cfg;
    restart();
    auto p = svc_->transcribe(alice_, r);
    ASSERT_FALSE(p);
    EXPECT_EQ(p.error().code, c.code) << p.error().message;
    EXPECT_THAT(p.error().message, HasSubstr(c.message));
    cfg_ = base_config(dir_.path());
    ModelConfig asr;
    asr.name = "asr";
    asr.dir = "/nonexistent/asr";
    cfg_.models.push_back(asr);
  }
  settle();
  EXPECT_TRUE(backend_->transcribes().empty());
  // Submit on a speech model says what to call.
  SubmitRequest sr = request();
  sr.model = "asr";
  auto s = svc_->submit(alice_, sr);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::unsupported);
  EXPECT_THAT(s.error().message, HasSubstr("is a speech model: call Transcribe"));
}

TEST_F(TranscribeTest, ABodyThatDoesNotDecodeFailsTheJobInvalidArgument) {
  TranscribeScript s;
  s.fail = Errc::invalid_argument;
  backend_->set_transcribe_script(s);
  start();
  const JobId id = transcribe_ok(alice_, transcribe_request(10));
  ASSERT_TRUE(wait_terminal(id));
  Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "failed");
  EXPECT_EQ(str(j, "error_code"), code(Errc::invalid_argument));
  EXPECT_EQ(backend_->transcribes().size(), 1u);  // never retried elsewhere
}

TEST_F(TranscribeTest, IdempotencyKeyReturnsTheSameJobAndRefusesOtherAudio) {
  start();
  TranscribeRequest r = transcribe_request(40);
  r.options.idempotency_key = "meeting-1";
  const JobId id = transcribe_ok(alice_, r);
  ASSERT_TRUE(wait_terminal(id));
  Dict again;
  EXPECT_EQ(transcribe_ok(alice_, r, &again), id);
  EXPECT_TRUE(flag(again, "existing"));
  EXPECT_EQ(backend_->transcribes().size(), 1u);
  TranscribeRequest other = transcribe_request(41);
  other.options.idempotency_key = "meeting-1";
  auto p = svc_->transcribe(alice_, other);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::duplicate);
  // Another user's "meeting-1" is another job.
  EXPECT_NE(transcribe_ok(bob_, r), id);
}

TEST_F(TranscribeTest, LanguageDetectionIsLeftToTheModelAndGivenLanguagesAreChecked) {
  backend_ = std::make_shared<FakeBackend>(sim_);
  backend_->add_speech_model(/*multilingual=*/true);
  start();
  TranscribeRequest r = transcribe_request(5);
  const JobId a = transcribe_ok(alice_, r);
  r.options.language = "de";
  r.options.translate = true;
  r.options.temperature = 0.6;
  const JobId b = transcribe_ok(alice_, r);
  ASSERT_TRUE(wait_terminal(a));
  ASSERT_TRUE(wait_terminal(b));
  const auto specs = backend_->transcribes();
  ASSERT_EQ(specs.size(), 2u);
  const auto& sa = specs[0].job == a ? specs[0] : specs[1];
  const auto& sb = specs[0].job == b ? specs[0] : specs[1];
  EXPECT_EQ(sa.options.language, "");  // detected per file
  EXPECT_EQ(sb.options.language, "de");
  EXPECT_EQ(sb.options.task, speech::Task::translate);
  EXPECT_EQ(sb.options.temperatures, (std::vector<double>{0.6, 0.8, 1.0}));
}

TEST_F(TranscribeTest, ARestartLeavesAnUnfinishedJobFailedWithItsText) {
  TranscribeScript s;
  s.block_at = 1;
  backend_->set_transcribe_script(s);
  start();
  const JobId id = transcribe_ok(alice_, transcribe_request(75));
  ASSERT_TRUE(wait_blocked(id));
  ASSERT_TRUE(pump_until([&] { return rec_.count(id, "segment") == 1; }));
  backend_->release_all();
  svc_.reset();  // the journal holds the accept and the first window's checkpoint (fsync off: written, not synced)
  backend_ = std::make_shared<FakeBackend>(sim_);
  backend_->add_speech_model();
  ASSERT_NO_FATAL_FAILURE(start());
  Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "failed");
  EXPECT_EQ(str(j, "kind"), "transcribe");
  EXPECT_EQ(str(j, "error_code"), code(Errc::unavailable));
  EXPECT_THAT(str(j, "error_message"), HasSubstr("call Transcribe again"));
  EXPECT_THAT(str(j, "text"), ::testing::StartsWith(" w0"));
}


// ---------------------------------------------------------------------------------------------------------------
// Live streams (ring `transcribe` with stream = true; the ring side is in test_ring_hub_transcribe.cc)

TranscribeRequest stream_request(int rate = 16000, int channels = 1) {
  TranscribeRequest r;
  r.model = "asr";
  r.stream = audio::StreamFormat{rate, channels, audio::SampleFormat::s16le};
  return r;
}

// `seconds` of 16-kHz mono s16le.
std::vector<std::uint8_t> pcm(double seconds) {
  return std::vector<std::uint8_t>(static_cast<std::size_t>(seconds * 16000) * 2, 0x01);
}

class StreamTest : public TranscribeTest {
 protected:
  // Appends `seconds` at the stream's current end; returns the status.
  Status send(JobId id, double seconds, bool end = false) {
    const auto b = pcm(seconds);
    auto st = svc_->append_audio(alice_, id, sent_[id], b, end);
    if (st) sent_[id] += b.size();
    return st;
  }
  std::map<JobId, std::uint64_t> sent_;
};

TEST_F(StreamTest, WindowsAreTranscribedAsTheirAudioArrivesAndTheEndFinishesTheJob) {
  start();
  const JobId id = transcribe_ok(alice_, stream_request());
  ASSERT_TRUE(send(id, 20));
  settle();
  EXPECT_EQ(rec_.count(id, "segment"), 0);  // 20 s: not a whole 30-s window yet
  ASSERT_TRUE(send(id, 15));
  ASSERT_TRUE(pump_until([&] { return rec_.count(id, "segment") == 1; }));
  EXPECT_FALSE(terminal(id));  // the stream is open: the job waits for more
  Dict mid = job(id);
  EXPECT_TRUE(flag(mid, "stream"));
  EXPECT_FALSE(flag(mid, "stream_complete"));
  EXPECT_EQ(u64(mid, "stream_bytes"), 35u * 32000u);
  EXPECT_EQ(str(mid, "state"), "running");
  ASSERT_TRUE(send(id, 40, /*end=*/true));  // 75 s in all: windows 1 and 2
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(segments_text(id), " w0 w1 w2");
  Dict j = job(id);
  EXPECT_EQ(str(j, "finish_reason"), "end_of_audio");
  EXPECT_EQ(u64(j, "audio_ms"), 75000u);
  EXPECT_TRUE(flag(j, "stream_complete"));
  EXPECT_EQ(str(j, "audio_format"), "s16le 16000 Hz 1 ch");
  // While open, progress says "stream" and gives no ETA; the last one has the total.
  std::vector<bool> live;
  for (const auto& u : rec_.of(id))
    if (u.kind == "progress") live.push_back(flag(u.data, "stream"));
  ASSERT_EQ(live.size(), 3u);
  EXPECT_TRUE(live[0]);
  EXPECT_FALSE(live[2]);
  for (const auto& u : rec_.of(id))
    if (u.kind == "audio") {
      EXPECT_TRUE(flag(u.data, "stream"));
    }
  ASSERT_EQ(backend_->transcribes().size(), 1u);
  EXPECT_EQ(backend_->transcribes()[0].audio, nullptr);
}

TEST_F(StreamTest, TheEndAfterTheLastWholeWindowCompletesWithoutAnotherWindow) {
  start();
  const JobId id = transcribe_ok(alice_, stream_request());
  ASSERT_TRUE(send(id, 30));
  ASSERT_TRUE(pump_until([&] { return rec_.count(id, "segment") == 1; }));
  ASSERT_TRUE(send(id, 0, /*end=*/true));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(segments_text(id), " w0");
  EXPECT_EQ(u32(job(id), "windows_done"), 1u);
}

TEST_F(StreamTest, ChunksAreRefusedTypedAndLeaveTheStreamAsItWas) {
  start();
  const JobId id = transcribe_ok(alice_, stream_request());
  ASSERT_TRUE(send(id, 1));
  const auto b = pcm(1);
  auto wrong = svc_->append_audio(alice_, id, 0, b, false);  // a repeat
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.error().code, Errc::invalid_argument);
  EXPECT_THAT(wrong.error().message, HasSubstr("expects 32000"));
  auto odd = svc_->append_audio(alice_, id, 32000, std::vector<std::uint8_t>(3), false);
  ASSERT_FALSE(odd);
  EXPECT_THAT(odd.error().message, HasSubstr("whole frames"));
  auto other = svc_->append_audio(bob_, id, 32000, b, false);
  ASSERT_FALSE(other);
  EXPECT_EQ(other.error().code, Errc::permission_denied);
  auto none = svc_->append_audio(alice_, 9999, 0, b, false);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.error().code, Errc::not_found);
  const JobId file = transcribe_ok(alice_, transcribe_request(5));
  auto not_stream = svc_->append_audio(alice_, file, 0, b, false);
  ASSERT_FALSE(not_stream);
  EXPECT_EQ(not_stream.error().code, Errc::illegal_transition);
  EXPECT_THAT(not_stream.error().message, HasSubstr("not a streamed transcription"));
  EXPECT_EQ(u64(job(id), "stream_bytes"), 32000u);
  ASSERT_TRUE(send(id, 1, true));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(segments_text(id), " w0");
  auto late = svc_->append_audio(alice_, id, 64000, b, false);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, Errc::illegal_transition);
  EXPECT_THAT(late.error().message, HasSubstr("has ended (completed)"));
}

TEST_F(StreamTest, BadStreamRequestsAreRefusedAtTheCall) {
  start();
  TranscribeRequest r = stream_request(500);
  auto p = svc_->transcribe(alice_, r);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::invalid_argument);
  EXPECT_THAT(p.error().message, HasSubstr("sample_rate 500"));
  r = stream_request(16000, 0);
  p = svc_->transcribe(alice_, r);
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message, HasSubstr("channels 0"));
  r = stream_request();
  r.audio = wav(1);
  p = svc_->transcribe(alice_, r);
  ASSERT_FALSE(p);
  EXPECT_THAT(p.error().message, HasSubstr("carries no file"));
}

TEST_F(StreamTest, AProducerThatGoesAwayEndsTheStreamWhereItIs) {
  start();
  const JobId id = transcribe_ok(alice_, stream_request());
  ASSERT_TRUE(send(id, 40));
  ASSERT_TRUE(pump_until([&] { return rec_.count(id, "segment") == 1; }));
  svc_->close_audio_stream(id);
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(segments_text(id), " w0 w1");  // the 10 s after the last whole window are transcribed too
  EXPECT_EQ(str(job(id), "finish_reason"), "stream_closed");
}

TEST_F(StreamTest, AStreamWithoutAudioFailsTimeoutKeepingItsText) {
  cfg_.speech.stream_idle_seconds = 1;
  start();
  const JobId id = transcribe_ok(alice_, stream_request());
  ASSERT_TRUE(send(id, 30));
  ASSERT_TRUE(pump_until([&] { return rec_.count(id, "segment") == 1; }));
  ASSERT_TRUE(wait_terminal(id));
  Dict j = job(id);
  EXPECT_EQ(str(j, "state"), "failed");
  EXPECT_EQ(str(j, "error_code"), code(Errc::timeout));
  EXPECT_THAT(str(j, "error_message"), HasSubstr("no audio arrived for 1 s"));
  EXPECT_EQ(str(j, "text"), " w0");
  auto late = svc_->append_audio(alice_, id, sent_[id], pcm(1), false);
  EXPECT_EQ(late.error().code, Errc::illegal_transition);
}

TEST_F(StreamTest, AGpuFaultMidStreamContinuesOnTheCpuAtTheWindowBoundary) {
  TranscribeScript s;
  s.gpu_fail_at = 1;
  backend_->set_transcribe_script(s);
  start();
  const JobId id = transcribe_ok(alice_, stream_request());
  ASSERT_TRUE(send(id, 30));
  ASSERT_TRUE(pump_until([&] { return rec_.count(id, "segment") == 1; }));
  ASSERT_TRUE(send(id, 45, true));
  ASSERT_TRUE(wait_terminal(id, /*tick=*/true));
  EXPECT_EQ(phase(id), "completed");
  EXPECT_EQ(segments_text(id), " w0 w1 w2");
  const auto specs = backend_->transcribes();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[1].route.device, policy::Device::cpu);
  EXPECT_EQ(specs[1].from.seek, 480000u);
  EXPECT_EQ(specs[1].stream, specs[0].stream);  // the same stream: its samples from the checkpoint on were kept
  EXPECT_EQ(rec_.count(id, "migrated"), 1);
}

TEST_F(StreamTest, AStreamFarAheadOfItsTranscriptionIsHeldBack) {
  cfg_.speech.max_stream_ahead_seconds = 5;
  TranscribeScript s;
  s.block_at = 0;  // the decoder is stuck before its first window
  backend_->set_transcribe_script(s);
  start();
  const JobId id = transcribe_ok(alice_, stream_request());
  ASSERT_TRUE(send(id, 5));
  auto full = send(id, 1);
  ASSERT_FALSE(full);
  EXPECT_EQ(full.error().code, Errc::queue_full);
  EXPECT_THAT(full.error().message, HasSubstr("retry_after_ms="));
  EXPECT_EQ(u64(job(id), "stream_bytes"), 5u * 32000u);
  ASSERT_TRUE(svc_->cancel(alice_, id));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "cancelled");
}

TEST_F(StreamTest, CancelWhileWaitingForAudio) {
  start();
  const JobId id = transcribe_ok(alice_, stream_request());
  ASSERT_TRUE(send(id, 10));
  ASSERT_TRUE(pump_until([&] { return backend_->transcribes().size() == 1; }));
  ASSERT_TRUE(svc_->cancel(alice_, id));
  ASSERT_TRUE(wait_terminal(id));
  EXPECT_EQ(phase(id), "cancelled");
}

}  // namespace
}  // namespace tandem::daemon::testing
