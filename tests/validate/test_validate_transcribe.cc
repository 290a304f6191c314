// tandem-validate's transcription workloads: scenario keys and their errors, the metrics and the rule
// transcribe_outcomes on recorded logs (tests/validate/data/transcribe*.jsonl, written by make_logs.py), the report.
#include <gtest/gtest.h>

#include <string>

#include "validate/events.h"
#include "validate/metrics.h"
#include "validate/report.h"
#include "validate/scenario.h"

namespace tandem::validate {
namespace {

std::string data(const std::string& name) { return std::string(TANDEM_VALIDATE_DATA) + "/" + name; }

struct Judged {
  Metrics overall;
  std::vector<PhaseResult> phases;
  Verdict verdict;
};

Judged judge_file(const std::string& name) {
  auto ev = read_events(data(name));
  EXPECT_TRUE(ev.ok()) << (ev.ok() ? "" : ev.error().message);
  Judged j;
  if (!ev.ok()) return j;
  j.overall = compute_metrics(*ev);
  j.phases = compute_phases(*ev);
  j.verdict = judge(j.overall, j.phases);
  return j;
}

const RuleResult* rule(const Verdict& v, const std::string& name) {
  for (const auto& r : v.rules)
    if (r.rule == name) return &r;
  return nullptr;
}

// --- scenarios ------------------------------------------------------------------------------------------------

TEST(ValidateTranscribeScenario, ParsesTheNewKeys) {
  auto r = parse_scenario(R"(
[daemon]
speech_preset = "whisper-test"
speech_name = "speech"
[[phase]]
[[phase.workload]]
kind = "transcribe"
models = ["speech", "default"]
requests = 2
audio_seconds = 40.5
sample_rate = 8000
language = "en"
audio_input = "memfd"
transport = "ring"
interval_ms = 100
[phase.expect]
min_transcribe_ok = 2
min_transcribe_gpu = 1
min_transcribe_cpu = 1
min_transcribe_migrated = 1
)", "t.toml");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->daemon.speech_preset, "whisper-test");
  EXPECT_EQ(r->daemon.speech_name, "speech");
  const Workload& w = r->phases[0].workloads[0];
  EXPECT_EQ(w.kind, WorkloadKind::transcribe);
  EXPECT_DOUBLE_EQ(w.audio_seconds, 40.5);
  EXPECT_EQ(w.sample_rate, 8000u);
  EXPECT_EQ(w.language, "en");
  EXPECT_EQ(w.audio_input, "memfd");
  EXPECT_EQ(w.transport, "ring");  // the ring's transcribe (ABI 1.2)
  const Expect& x = r->phases[0].expect;
  EXPECT_EQ(x.min_transcribe_ok, 2u);
  EXPECT_EQ(x.min_transcribe_gpu, 1u);
  EXPECT_EQ(x.min_transcribe_cpu, 1u);
  EXPECT_EQ(x.min_transcribe_migrated, 1u);
  // Defaults: 40 s of 16 kHz audio as bytes, the daemon's default speech model name "asr".
  auto d = parse_scenario("[[phase]]\n[[phase.workload]]\nkind = \"transcribe\"\n", "d.toml");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_DOUBLE_EQ(d->phases[0].workloads[0].audio_seconds, 40.0);
  EXPECT_EQ(d->phases[0].workloads[0].sample_rate, 16000u);
  EXPECT_EQ(d->phases[0].workloads[0].audio_input, "bytes");
  EXPECT_EQ(d->daemon.speech_name, "asr");
  EXPECT_EQ(workload_kind_name(WorkloadKind::transcribe), "transcribe");
}

struct BadTranscribe {
  const char* name;
  const char* text;
  const char* message;
};

class ValidateTranscribeScenarioErrors : public ::testing::TestWithParam<BadTranscribe> {};

TEST_P(ValidateTranscribeScenarioErrors, NameTheKey) {
  auto r = parse_scenario(GetParam().text, "s.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(GetParam().message), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().message.rfind("s.toml", 0), 0u) << r.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, ValidateTranscribeScenarioErrors,
    ::testing::Values(
        BadTranscribe{"audio_seconds_range", "[[phase]]\n[[phase.workload]]\nkind = 'transcribe'\naudio_seconds = 0\n",
                      "phase[0].workload[0].audio_seconds: must be in [0.1, 14400], got 0"},
        BadTranscribe{"audio_seconds_type", "[[phase]]\n[[phase.workload]]\nkind = 'transcribe'\naudio_seconds = '40'\n",
                      "phase[0].workload[0].audio_seconds: expected a number, got string \"40\""},
        BadTranscribe{"sample_rate", "[[phase]]\n[[phase.workload]]\nkind = 'transcribe'\nsample_rate = 100\n",
                      "phase[0].workload[0].sample_rate: must be in [4000, 48000], got 100"},
        BadTranscribe{"audio_input", "[[phase]]\n[[phase.workload]]\nkind = 'transcribe'\naudio_input = 'pipe'\n",
                      "phase[0].workload[0].audio_input: \"pipe\" is not one of bytes, memfd"},
        BadTranscribe{"language", "[[phase]]\n[[phase.workload]]\nkind = 'transcribe'\nlanguage = 'English'\n",
                      "phase[0].workload[0].language: \"English\" is not a language code"},
        BadTranscribe{"audio_on_generate", "[[phase]]\n[[phase.workload]]\naudio_seconds = 40\n",
                      "phase[0].workload[0].audio_seconds: only used by kind = \"transcribe\" (this workload is kind = "
                      "\"generate\")"},
        BadTranscribe{"texts_on_transcribe", "[[phase]]\n[[phase.workload]]\nkind = 'transcribe'\ntexts = 2\n",
                      "phase[0].workload[0].texts: only used by kind = \"embed\""},
        BadTranscribe{"max_tokens", "[[phase]]\n[[phase.workload]]\nkind = 'transcribe'\nmax_tokens = 5\n",
                      "phase[0].workload[0].max_tokens: not used by kind = \"transcribe\""},
        BadTranscribe{"resubmit", "[[phase]]\n[[phase.workload]]\nkind = 'transcribe'\nresubmit = true\n",
                      "resubmit and resume_failed are for kind = \"generate\""},
        BadTranscribe{"model", "[[phase]]\n[[phase.workload]]\nkind = 'transcribe'\nmodels = ['emb']\n",
                      "model \"emb\" is neither \"default\" nor daemon.speech_name (\"asr\")"},
        BadTranscribe{"preset", "[daemon]\nspeech_preset = 'whisper-tiny'\n[[phase]]\nduration_ms = 1\n",
                      "daemon.speech_preset: \"whisper-tiny\" is not one of whisper-test"},
        BadTranscribe{"speech_name", "[daemon]\nspeech_name = 'default'\n[[phase]]\nduration_ms = 1\n",
                      "daemon.speech_name: \"default\" is not a model name"},
        BadTranscribe{"same_name",
                      "[daemon]\nembedding_preset = 'clip-test'\nspeech_preset = 'whisper-test'\nspeech_name = 'emb'\n"
                      "[[phase]]\nduration_ms = 1\n",
                      "daemon.speech_name: \"emb\" is also the embedding_name"},
        BadTranscribe{"expect_type", "[[phase]]\nduration_ms = 1\n[phase.expect]\nmin_transcribe_migrated = true\n",
                      "phase[0].expect.min_transcribe_migrated: expected an integer, got boolean true"}),
    [](const ::testing::TestParamInfo<BadTranscribe>& i) { return std::string(i.param.name); });

// home-server.toml runs the three kinds: transcription on the GPU at baseline, on the CPU under critical pressure and
// after the faults, with expectations on each.
TEST(ValidateTranscribeScenario, HomeServerRunsAllThreeKinds) {
  auto home = load_scenario(std::string(TANDEM_SOURCE_ROOT) + "/config/validation/home-server.toml");
  ASSERT_TRUE(home.ok()) << home.error().message;
  EXPECT_EQ(home->daemon.speech_preset, "whisper-test");
  bool gpu = false, cpu = false, fault_phase = false, long_audio = false;
  for (const auto& p : home->phases) {
    bool transcribe = false, generate = false, embed = false;
    for (const auto& w : p.workloads) {
      transcribe = transcribe || w.kind == WorkloadKind::transcribe;
      generate = generate || w.kind == WorkloadKind::generate;
      embed = embed || w.kind == WorkloadKind::embed;
      long_audio = long_audio || (w.kind == WorkloadKind::transcribe && w.audio_seconds > 30);
    }
    EXPECT_TRUE(transcribe) << "phase " << p.name << " has no transcription workload";
    EXPECT_TRUE(generate || embed) << "phase " << p.name;
    gpu = gpu || p.expect.min_transcribe_gpu.value_or(0) > 0;
    cpu = cpu || p.expect.min_transcribe_cpu.value_or(0) > 0;
    fault_phase = fault_phase || (!p.faults.empty() && p.expect.min_transcribe_ok.value_or(0) > 0);
  }
  EXPECT_TRUE(gpu && cpu && fault_phase && long_audio);
}

// --- metrics and the rule -------------------------------------------------------------------------------------

TEST(ValidateTranscribeMetrics, CleanLogCountsRoutesWindowsAndPasses) {
  Judged j = judge_file("transcribe.jsonl");
  EXPECT_TRUE(j.verdict.pass) << ::testing::PrintToString(j.verdict.failure_lines());
  const TranscribeMetrics& t = j.overall.transcribe;
  EXPECT_EQ(t.calls, 5u);
  EXPECT_EQ(t.accepted, 3u);
  EXPECT_EQ(t.existing, 1u);
  EXPECT_EQ(t.rejected, 1u);
  EXPECT_EQ(t.rejected_by.at("InvalidArgument"), 1u);
  EXPECT_EQ(t.completed, 3u);
  EXPECT_EQ(t.failed, 0u);
  EXPECT_EQ(t.gpu, 1u);       // job 11
  EXPECT_EQ(t.cpu, 2u);       // job 12 (gpu>cpu) and job 13 (cpu)
  EXPECT_EQ(t.migrated, 1u);  // job 12
  EXPECT_EQ(t.retried, 0u);
  EXPECT_EQ(t.windows, 6u);
  EXPECT_EQ(t.windows_on_cpu, 3u);
  EXPECT_EQ(t.segments, 7u);
  EXPECT_TRUE(t.problems.empty());
  EXPECT_TRUE(t.unanswered.empty());
  // call -> finished update: job 11 10 -> 32 ms, job 12 40 -> 72 ms, job 13 80 -> 91 ms.
  EXPECT_DOUBLE_EQ(t.latency.at("gpu").max_ms, 22.0);
  EXPECT_DOUBLE_EQ(t.latency.at("gpu>cpu").p50_ms, 32.0);
  EXPECT_DOUBLE_EQ(t.latency.at("cpu").p50_ms, 11.0);
  // The LLM counts are untouched by transcription jobs.
  EXPECT_EQ(j.overall.accepted, 0u);
  EXPECT_TRUE(j.overall.lost.empty());
  // The migrated job's and the CPU job's results were announced first (migrated / routed(degraded=true)).
  EXPECT_EQ(j.overall.degraded_results, 2u);
  EXPECT_TRUE(j.overall.degraded_violations.empty());
  const RuleResult* r = rule(j.verdict, "transcribe_outcomes");
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->pass);
  EXPECT_NE(r->detail.find("5 Transcribe calls: 3 jobs (3 completed: 1 gpu, 2 cpu; 1 migrated"), std::string::npos)
      << r->detail;
  ASSERT_EQ(j.phases.size(), 1u);
  EXPECT_TRUE(j.phases[0].unmet.empty()) << ::testing::PrintToString(j.phases[0].unmet);
  EXPECT_EQ(to_json(j.overall)["transcribe"]["migrated"], 1);
}

struct BrokenTranscript {
  const char* file;
  const char* detail_contains;
};

class ValidateTranscribeBrokenLogs : public ::testing::TestWithParam<BrokenTranscript> {};

// A segment repeated or lost across the GPU fault fails transcribe_outcomes, and only it.
TEST_P(ValidateTranscribeBrokenLogs, FailTranscribeOutcomesOnly) {
  Judged j = judge_file(GetParam().file);
  EXPECT_FALSE(j.verdict.pass);
  const RuleResult* r = rule(j.verdict, "transcribe_outcomes");
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->pass);
  EXPECT_NE(r->detail.find(GetParam().detail_contains), std::string::npos) << r->detail;
  for (const auto& x : j.verdict.rules) {
    if (x.rule != "transcribe_outcomes") {
      EXPECT_TRUE(x.pass) << x.rule << ": " << x.detail;
    }
  }
  bool named = false;
  for (const auto& line : j.verdict.failure_lines()) named = named || line.rfind("FAIL transcribe_outcomes: ", 0) == 0;
  EXPECT_TRUE(named);
}

INSTANTIATE_TEST_SUITE_P(
    Logs, ValidateTranscribeBrokenLogs,
    ::testing::Values(
        BrokenTranscript{"transcribe_segment_repeated.jsonl",
                         "[segment_repeated] job 12 (req 12): segment 1 was streamed more than once"},
        BrokenTranscript{"transcribe_segment_lost.jsonl",
                         "[text_mismatch] job 12 (req 12): text ' a b c d' is not the concatenation of its 3 segments "
                         "' a b d'"}),
    [](const ::testing::TestParamInfo<BrokenTranscript>& i) {
      std::string n = i.param.file;
      return n.substr(0, n.find('.'));
    });

TEST(ValidateTranscribeMetrics, AJobStillRunningAfterTheDrainIsNotTerminal) {
  Judged j = judge_file("transcribe_not_terminal.jsonl");
  const RuleResult* r = rule(j.verdict, "transcribe_outcomes");
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->pass);
  EXPECT_NE(r->detail.find("[not_terminal] job 13 (req 13): still 'running' after the drain"), std::string::npos)
      << r->detail;
  // The phase's expectations see one completed job fewer.
  ASSERT_EQ(j.phases.size(), 1u);
  EXPECT_EQ(j.phases[0].metrics.transcribe.completed, 2u);
  ASSERT_FALSE(j.phases[0].unmet.empty());
  EXPECT_NE(j.phases[0].unmet.front().find("min_transcribe_ok: want >= 3"), std::string::npos) << j.phases[0].unmet.front();
}

// One recorded event of phase 0, client 0 (the synthetic logs below).
Event ev(std::int64_t t, const char* type, std::uint64_t job, nlohmann::json d) {
  Event e;
  e.t_us = t;
  e.type = type;
  e.phase = 0;
  e.client = 0;
  e.job = job;
  e.data = std::move(d);
  return e;
}

TEST(ValidateTranscribeMetrics, SyntheticEdgeCases) {
  using nlohmann::json;
  const json segs = json::array({{{"index", 0}, {"text", " x"}}, {{"index", 1}, {"text", " y"}}});
  auto final_ev = [&](std::int64_t t, std::uint64_t job, std::uint64_t req, const char* state, json extra = json::object()) {
    json d{{"req", req}, {"state", state}, {"routes", {"gpu"}}, {"history", {"queued", "running", state}},
           {"text", " x y"}, {"segments", segs}, {"windows_done", 2}, {"windows_on_cpu", 0}};
    d.update(extra);
    return ev(t, "transcribe_final", job, d);
  };
  // A call with no answer; a call answered twice; a failed job (Unavailable) keeping its windows' text; two
  // 'finished' updates for one job; a finished update whose state GetJob contradicts.
  std::vector<Event> log = {
      ev(1, "transcribe_call", 0, {{"req", 1}}),
      ev(2, "transcribe_call", 0, {{"req", 2}}),
      ev(3, "transcribe_accepted", 5, {{"req", 2}, {"existing", false}}),
      ev(4, "transcribe_rejected", 0, {{"req", 2}, {"error", "Busy"}}),
      ev(5, "update", 5, {{"kind", "segment"}, {"index", 0}, {"text", " x"}}),
      ev(6, "update", 5, {{"kind", "segment"}, {"index", 1}, {"text", " y"}}),
      ev(7, "update", 5, {{"kind", "finished"}, {"state", "completed"}}),
      ev(8, "update", 5, {{"kind", "finished"}, {"state", "completed"}}),
      final_ev(9, 5, 2, "completed"),
      ev(10, "transcribe_call", 0, {{"req", 3}}),
      ev(11, "transcribe_accepted", 6, {{"req", 3}, {"existing", false}}),
      ev(12, "update", 6, {{"kind", "finished"}, {"state", "failed"}}),
      final_ev(13, 6, 3, "failed", {{"error_code", "Unavailable"}, {"routes", {"gpu", "cpu"}}}),
      ev(14, "transcribe_call", 0, {{"req", 4}}),
      ev(15, "transcribe_accepted", 7, {{"req", 4}, {"existing", false}}),
      ev(16, "update", 7, {{"kind", "finished"}, {"state", "cancelled"}}),
      final_ev(17, 7, 4, "completed"),
  };
  Metrics m = compute_metrics(log);
  const TranscribeMetrics& t = m.transcribe;
  EXPECT_EQ(t.calls, 4u);
  EXPECT_EQ(t.unanswered, std::vector<std::uint64_t>{1});
  EXPECT_EQ(t.answered_twice, std::vector<std::uint64_t>{2});
  EXPECT_EQ(t.failed, 1u);
  EXPECT_EQ(t.failed_by.at("Unavailable"), 1u);
  EXPECT_EQ(t.completed, 2u);
  std::map<std::string, int> kinds;
  for (const auto& p : t.problems) ++kinds[p.kind];
  EXPECT_EQ(kinds["finished_twice"], 1);
  EXPECT_EQ(kinds["state_mismatch"], 1);
  EXPECT_EQ(kinds["segment_lost"], 2);  // job 7 completed, but its two segments never reached the caller
  EXPECT_EQ(kinds.size(), 3u) << ::testing::PrintToString(kinds);
  m.rss_samples = 1;
  m.host_budget = 1;
  Verdict v = judge(m, {});
  const RuleResult* r = rule(v, "transcribe_outcomes");
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->pass);
  EXPECT_NE(r->detail.find("unanswered (req 1)"), std::string::npos) << r->detail;
  EXPECT_NE(r->detail.find("answered twice (req 2)"), std::string::npos) << r->detail;
  // Expectations on the new keys.
  EXPECT_TRUE(check_expectations(json{{"min_transcribe_ok", 2}, {"min_transcribe_gpu", 1}}, m).empty());
  auto unmet = check_expectations(json{{"min_transcribe_cpu", 1}, {"min_transcribe_migrated", 1}}, m);
  ASSERT_EQ(unmet.size(), 2u);
  EXPECT_NE(unmet[0].find("min_transcribe_cpu: want >= 1 transcription jobs completed with windows on the CPU, got 0"),
            std::string::npos) << unmet[0];
  // No Transcribe calls: no such rule.
  EXPECT_EQ(rule(judge(Metrics{}, {}), "transcribe_outcomes"), nullptr);
}

// ETA accuracy of transcriptions (docs/validate.md "ETA accuracy"): only those placed with a measured ETA
// (eta_known) that ran to the end of their audio, under "transcribe <route>"; the others are left out or counted
// apart.
TEST(ValidateTranscribeMetrics, EtaAccuracyPerRouteOfTranscriptions) {
  using nlohmann::json;
  auto accepted = [&](std::int64_t t, std::uint64_t job, std::uint64_t eta, bool known) {
    return ev(t, "transcribe_accepted", job, {{"req", job}, {"existing", false}, {"eta_ms", eta}, {"eta_known", known}});
  };
  auto final_ev = [&](std::int64_t t, std::uint64_t job, const char* reason, json routes) {
    return ev(t, "transcribe_final", job, {{"req", job}, {"state", "completed"}, {"finish_reason", reason}, {"routes", routes}});
  };
  const std::vector<Event> log = {
      accepted(0, 1, 1500, true),                          // done after 1 s: +50 %
      ev(1'000'000, "update", 1, {{"kind", "finished"}, {"state", "completed"}}),
      final_ev(1'000'100, 1, "end_of_audio", {"gpu"}),
      accepted(0, 2, 3000, true),                          // moved to the CPU, done after 4 s: −25 %
      ev(4'000'000, "update", 2, {{"kind", "finished"}, {"state", "completed"}}),
      final_ev(4'000'100, 2, "end_of_audio", {"gpu", "cpu"}),
      accepted(0, 3, 100, false),                          // no measured ETA: left out
      ev(1'000'000, "update", 3, {{"kind", "finished"}, {"state", "completed"}}),
      final_ev(1'000'100, 3, "end_of_audio", {"gpu"}),
      accepted(0, 4, 5000, true),                          // a stream the producer closed: counted apart
      ev(1'000'000, "update", 4, {{"kind", "finished"}, {"state", "completed"}}),
      final_ev(1'000'100, 4, "stream_closed", {"cpu"}),
      // The runner's job_final of a tracked job says nothing more about a transcription.
      ev(5'000'000, "job_final", 1, {{"state", "completed"}, {"finish_reason", "end_of_audio"}, {"routes", {"cpu"}}}),
  };
  Metrics m;
  compute_eta_metrics(log, m);
  ASSERT_EQ(m.eta.count("transcribe gpu"), 1u);
  EXPECT_EQ(m.eta["transcribe gpu"].n, 1u);
  EXPECT_DOUBLE_EQ(m.eta["transcribe gpu"].median_signed_rel, 0.5);
  ASSERT_EQ(m.eta.count("transcribe gpu>cpu"), 1u);
  EXPECT_DOUBLE_EQ(m.eta["transcribe gpu>cpu"].median_signed_rel, -0.25);
  ASSERT_EQ(m.eta.count("transcribe cpu"), 1u);
  EXPECT_EQ(m.eta["transcribe cpu"].n, 0u);
  EXPECT_EQ(m.eta["transcribe cpu"].stopped_sooner, 1u);
  EXPECT_EQ(m.eta.size(), 3u);
}

TEST(ValidateTranscribeReport, MarkdownHasTheTranscriptionLines) {
  Judged j = judge_file("transcribe_segment_repeated.jsonl");
  ASSERT_EQ(j.phases.size(), 1u);
  const std::string md = phase_markdown(j.phases[0]);
  EXPECT_NE(md.find("| Transcribe calls: jobs / refused | 5: 3 / 1 InvalidArgument=1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| transcription jobs: completed (GPU / CPU) / failed / cancelled | 3 (1 / 2) / 0 / 0 |"),
            std::string::npos) << md;
  EXPECT_NE(md.find("| transcription jobs migrated at a window boundary / retried on the CPU | 1 / 0 |"), std::string::npos);
  EXPECT_NE(md.find("Transcription problems:"), std::string::npos);
  EXPECT_NE(md.find("`segment_repeated`"), std::string::npos);
}

}  // namespace
}  // namespace tandem::validate
