// tandem-validate's logic on recorded event logs: metrics, verdict rules, scenario parsing, and the report writers.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

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

TEST(ValidateMetrics, CleanLogPassesWithEveryMetric) {
  Judged j = judge_file("clean.jsonl");
  const Metrics& m = j.overall;
  EXPECT_TRUE(j.verdict.pass) << ::testing::PrintToString(j.verdict.failure_lines());
  EXPECT_EQ(m.submitted, 5u);
  EXPECT_EQ(m.accepted, 3u);
  EXPECT_EQ(m.existing, 1u);
  EXPECT_EQ(m.completed, 3u);
  EXPECT_EQ(m.rejected, 1u);
  EXPECT_EQ(m.rejected_by.at("QueueFull"), 1u);
  EXPECT_TRUE(m.lost.empty());
  EXPECT_TRUE(m.duplicates.empty());
  EXPECT_EQ(m.migrated, 1u);
  EXPECT_EQ(m.cpu_routed, 1u);
  EXPECT_EQ(m.gpu_routed, 2u);
  EXPECT_EQ(m.token_gaps, 0u);
  // Latency per final route: job 1 gpu 10->30 ms, job 2 gpu>cpu 40->65 ms, job 3 cpu 70->81 ms.
  ASSERT_EQ(m.latency.count("gpu"), 1u);
  EXPECT_DOUBLE_EQ(m.latency.at("gpu").p50_ms, 20.0);
  EXPECT_DOUBLE_EQ(m.latency.at("gpu>cpu").p99_ms, 25.0);
  EXPECT_DOUBLE_EQ(m.latency.at("cpu").p95_ms, 11.0);
  EXPECT_DOUBLE_EQ(m.ttft.at("gpu").p50_ms, 10.0);
  EXPECT_EQ(m.max_queue_depth.at("cpu"), 1u);
  EXPECT_EQ(m.max_oldest_age_ms.at("cpu"), 120u);
  EXPECT_EQ(m.peak_rss, 241ull << 20);
  EXPECT_EQ(m.host_budget, 2048ull << 20);
  EXPECT_EQ(m.rss_samples, 3u);
  // Degraded: jobs 2 (migrated) and 3 (routed to the CPU) were degraded results, both announced first.
  EXPECT_EQ(m.degraded_results, 2u);
  EXPECT_EQ(m.degraded_announced_first, 2u);
  EXPECT_EQ(m.degraded_job_notice_only, 0u);
  EXPECT_EQ(m.degraded_announcements, 1u);  // the monitor connection's own count
  // Recovery after the device loss at +51 ms: first CPU completion at +65 (job 2), breaker closed at +310.
  ASSERT_EQ(m.recoveries.size(), 1u);
  EXPECT_DOUBLE_EQ(*m.recoveries[0].to_cpu_completion_ms, 14.0);
  EXPECT_DOUBLE_EQ(*m.recoveries[0].to_breaker_closed_ms, 259.0);
  EXPECT_EQ(m.breaker_opened, 1u);
  EXPECT_EQ(m.breaker_closed, 1u);
  ASSERT_EQ(j.phases.size(), 1u);
  EXPECT_TRUE(j.phases[0].completed);
  EXPECT_TRUE(j.phases[0].unmet.empty());
}

// Each broken log fails exactly the rule it breaks, and the failure line names it.
struct BrokenCase {
  const char* file;
  const char* rule;
  const char* detail_contains;
};

class ValidateBrokenLogs : public ::testing::TestWithParam<BrokenCase> {};

TEST_P(ValidateBrokenLogs, FailsNamingItsRule) {
  const BrokenCase& c = GetParam();
  Judged j = judge_file(c.file);
  EXPECT_FALSE(j.verdict.pass);
  const RuleResult* r = rule(j.verdict, c.rule);
  ASSERT_NE(r, nullptr);
  EXPECT_FALSE(r->pass);
  EXPECT_NE(r->detail.find(c.detail_contains), std::string::npos) << r->detail;
  int failed = 0;
  for (const auto& x : j.verdict.rules) failed += x.pass ? 0 : 1;
  EXPECT_EQ(failed, 1) << ::testing::PrintToString(j.verdict.failure_lines());
  bool named = false;
  for (const auto& line : j.verdict.failure_lines()) named = named || line.rfind(std::string("FAIL ") + c.rule + ":", 0) == 0;
  EXPECT_TRUE(named);
}

INSTANTIATE_TEST_SUITE_P(
    Logs, ValidateBrokenLogs,
    ::testing::Values(BrokenCase{"lost_job.jsonl", "lost_jobs", "1 accepted job never reached a terminal state (job 4"},
                      BrokenCase{"duplicate_side_effect.jsonl", "duplicate_side_effects", "executed_twice"},
                      BrokenCase{"tokens_redelivered.jsonl", "duplicate_side_effects", "tokens_redelivered"},
                      BrokenCase{"degraded_late.jsonl", "degraded_announced", "job 2"},
                      BrokenCase{"ram_over_budget.jsonl", "host_ram_budget", "2100 MiB > budget 2048 MiB"}),
    [](const ::testing::TestParamInfo<BrokenCase>& i) {
      std::string n = i.param.file;
      return n.substr(0, n.find('.'));
    });

// Real phases recorded by a CI campaign: the daemon was SIGKILLed with two jobs in flight and restarted; a prefill
// allocation failure retried a job on the CPU.
TEST(ValidateMetrics, RecordedCampaignPhases) {
  Judged k = judge_file("recorded_daemon_kill.jsonl");
  EXPECT_TRUE(k.verdict.pass) << ::testing::PrintToString(k.verdict.failure_lines());
  EXPECT_EQ(k.overall.accepted, 4u);
  EXPECT_EQ(k.overall.resumable_failed, 2u);
  EXPECT_EQ(k.overall.failed_by.at("daemon_restart"), 2u);
  EXPECT_EQ(k.overall.completed, 2u);
  EXPECT_TRUE(k.overall.lost.empty());
  EXPECT_EQ(k.overall.faults_by.at("kill_daemon"), 1u);
  ASSERT_EQ(k.overall.recoveries.size(), 1u);
  ASSERT_TRUE(k.overall.recoveries[0].to_daemon_ready_ms);
  EXPECT_GT(*k.overall.recoveries[0].to_daemon_ready_ms, 0.0);
  ASSERT_EQ(k.phases.size(), 1u);
  EXPECT_EQ(k.phases[0].name, "daemon-kill");

  Judged a = judge_file("recorded_alloc_retry.jsonl");
  EXPECT_TRUE(a.verdict.pass) << ::testing::PrintToString(a.verdict.failure_lines());
  EXPECT_EQ(a.overall.retried, 1u);
  EXPECT_EQ(a.overall.latency.count("gpu>cpu"), 1u);
  EXPECT_EQ(a.overall.degraded_results, 1u);
  EXPECT_EQ(a.overall.degraded_job_notice_only, 1u);  // State stayed normal: the job's routed update said it

  Judged lost = judge_file("recorded_daemon_kill_lost.jsonl");
  EXPECT_FALSE(lost.verdict.pass);
  EXPECT_FALSE(rule(lost.verdict, "lost_jobs")->pass);
  EXPECT_NE(rule(lost.verdict, "lost_jobs")->detail.find("GetJob failed: UnknownJob"), std::string::npos)
      << rule(lost.verdict, "lost_jobs")->detail;
}

TEST(ValidateMetrics, DuplicateLogAlsoCountsTwoDeliveredResults) {
  Judged j = judge_file("duplicate_side_effect.jsonl");
  bool executed = false, delivered = false;
  for (const auto& d : j.overall.duplicates) {
    executed = executed || d.kind == "executed_twice";
    delivered = delivered || d.kind == "delivered_twice";
    EXPECT_EQ(d.key, "k3");
  }
  EXPECT_TRUE(executed);
  EXPECT_TRUE(delivered);
}

Event mk(std::int64_t t_ms, std::string type, std::int32_t client, std::uint64_t job, nlohmann::json d) {
  Event e;
  static std::uint64_t seq = 1;
  e.t_us = t_ms * 1000;
  e.seq = seq++;
  e.type = std::move(type);
  e.phase = 0;
  e.client = client;
  e.job = job;
  e.data = std::move(d);
  return e;
}

TEST(ValidateMetrics, ResumeChainIsNotADuplicateButASecondRootIs) {
  std::vector<Event> ev = {
      mk(1, "submit", 0, 0, {{"req", 1}, {"key", "k"}}),
      mk(2, "submit_ok", 0, 10, {{"req", 1}, {"key", "k"}, {"existing", false}, {"route", "gpu"}}),
      mk(3, "update", 0, 10, {{"kind", "started"}}),
      mk(4, "update", 0, 10, {{"kind", "finished"}, {"state", "failed"}, {"error_code", "Resumable"}}),
      mk(5, "submit", 0, 0, {{"req", 2}, {"key", "k"}}),
      mk(6, "resume_ok", 0, 11, {{"req", 2}, {"key", "k"}, {"from_job", 10}, {"route", "cpu"}}),
      mk(7, "update", 0, 11, {{"kind", "started"}}),
      mk(8, "update", 0, 11, {{"kind", "tokens"}, {"step", 5}, {"tokens", {1, 2}}}),  // resumed: starts at the checkpoint
      mk(9, "update", 0, 11, {{"kind", "finished"}, {"state", "completed"}}),
      mk(10, "job_final", -1, 10, {{"state", "failed"}, {"error_code", "Resumable"}, {"routes", {"gpu"}}, {"attempts", 1}}),
      mk(11, "job_final", -1, 11, {{"state", "completed"}, {"routes", {"cpu"}}, {"attempts", 1}}),
  };
  Metrics m = compute_metrics(ev);
  EXPECT_TRUE(m.duplicates.empty()) << m.duplicates.front().detail;
  EXPECT_EQ(m.token_gaps, 0u);
  EXPECT_EQ(m.resumable_failed, 1u);
  EXPECT_EQ(m.completed, 1u);
  // A second, independent job for the same key (not a Resume) that ran: executed twice.
  ev.push_back(mk(12, "submit", 1, 0, {{"req", 3}, {"key", "k"}}));
  ev.push_back(mk(13, "submit_ok", 1, 12, {{"req", 3}, {"key", "k"}, {"existing", false}}));
  ev.push_back(mk(14, "job_final", -1, 12, {{"state", "cancelled"}, {"routes", {"cpu"}}, {"attempts", 1}}));
  m = compute_metrics(ev);
  ASSERT_EQ(m.duplicates.size(), 1u);
  EXPECT_EQ(m.duplicates[0].kind, "executed_twice");
}

// A one-off GPU failure moves a job to the CPU while the service State stays normal: the job's own
// routed(degraded=true) update is its announcement; a silent move (no such update) is a violation.
TEST(ValidateMetrics, DegradedJobNoticeWithoutServiceStateChange) {
  std::vector<Event> ev = {
      mk(1, "state_seen", 0, 0, {{"state", "normal"}}),
      mk(2, "update", 0, 5, {{"kind", "routed"}, {"route", "gpu"}, {"degraded", false}}),
      mk(3, "update", 0, 5, {{"kind", "started"}, {"route", "gpu"}}),
      mk(4, "update", 0, 5, {{"kind", "routed"}, {"route", "cpu"}, {"degraded", true}}),
      mk(5, "update", 0, 5, {{"kind", "started"}, {"route", "cpu"}}),
      mk(6, "update", 0, 5, {{"kind", "tokens"}, {"step", 0}, {"tokens", {1}}}),
  };
  Metrics m = compute_metrics(ev);
  EXPECT_EQ(m.degraded_results, 1u);
  EXPECT_EQ(m.degraded_announced_first, 1u);
  EXPECT_EQ(m.degraded_job_notice_only, 1u);
  EXPECT_TRUE(m.degraded_violations.empty());
  ev[3].data["degraded"] = false;  // moved to the CPU without saying so
  m = compute_metrics(ev);
  ASSERT_EQ(m.degraded_violations.size(), 1u);
  EXPECT_EQ(m.degraded_violations[0].job, 5u);
}

// A breaker that opens only after the next fault is not the first fault's doing.
TEST(ValidateMetrics, RecoveryIsAttributedToTheFaultBeforeTheBreakerOpened) {
  std::vector<Event> ev = {
      mk(0, "sample", -1, 0, {{"breaker", "closed"}}),
      mk(100, "fault", -1, 0, {{"kind", "fail_allocations"}}),
      mk(200, "fault", -1, 0, {{"kind", "lose_device"}}),
      mk(210, "breaker", -1, 0, {{"state", "open"}}),
      mk(900, "breaker", -1, 0, {{"state", "half_open"}}),
      mk(950, "breaker", -1, 0, {{"state", "closed"}}),
  };
  Metrics m = compute_metrics(ev);
  ASSERT_EQ(m.recoveries.size(), 2u);
  EXPECT_FALSE(m.recoveries[0].breaker_opened);
  EXPECT_FALSE(m.recoveries[0].to_breaker_closed_ms);
  EXPECT_TRUE(m.recoveries[1].breaker_opened);
  EXPECT_DOUBLE_EQ(*m.recoveries[1].to_breaker_closed_ms, 750.0);
  EXPECT_FALSE(m.recoveries[1].to_cpu_completion_ms);  // no job completed on the CPU
}

// GPU residency (game.toml): replicas given back when the foreign load rises, the time until our bytes dropped,
// the time from the foreign load's fall until every replica was back, and the expectations on them.
TEST(ValidateMetrics, ResidencyTimesAndCountsFromSamplesAndMemorySteps) {
  auto sample = [](std::int64_t t_ms, std::uint64_t ours, std::uint64_t ev, std::uint64_t re) {
    return mk(t_ms, "sample", -1, 0,
              {{"mem_ours", ours}, {"gpu_evictions", ev}, {"gpu_pressure_evictions", ev}, {"gpu_restores", re},
               {"gpu_restore_failures", 0}});
  };
  std::vector<Event> ev = {
      mk(0, "memory_step", -1, 0, {{"foreign", 900}, {"observed_used", 300}, {"gpu_evictions", 1}, {"gpu_pressure_evictions", 1}, {"gpu_restores", 1}}),
      sample(50, 300, 3, 1),  // counted, but our bytes are still on the device (the reading lags)
      sample(150, 0, 3, 1),   // freed: 150 ms
      sample(250, 0, 3, 1),
      mk(3000, "memory_step", -1, 0, {{"foreign", 0}, {"observed_used", 0}, {"gpu_evictions", 3}, {"gpu_restores", 1}}),
      sample(4000, 100, 3, 2),
      sample(5100, 300, 3, 3),  // every replica back: 2100 ms
  };
  Metrics m = compute_metrics(ev);
  EXPECT_EQ(m.gpu_evictions, 2u) << "counted from the first step's counters";
  EXPECT_EQ(m.gpu_pressure_evictions, 2u);
  EXPECT_EQ(m.gpu_restores, 2u);
  ASSERT_EQ(m.time_to_free_ms.size(), 1u);
  EXPECT_DOUBLE_EQ(m.time_to_free_ms[0], 150.0);
  ASSERT_EQ(m.time_to_restore_ms.size(), 1u);
  EXPECT_DOUBLE_EQ(m.time_to_restore_ms[0], 2100.0);
  EXPECT_EQ(m.ours_before_bytes, 300u);
  EXPECT_EQ(m.ours_low_bytes, 0u);
  EXPECT_TRUE(check_expectations({{"min_pressure_evictions", 2}, {"max_pressure_evictions", 2}, {"min_gpu_restores", 2},
                                  {"restored_by_end", true}},
                                 m)
                  .empty());
  EXPECT_EQ(check_expectations({{"max_pressure_evictions", 1}}, m).size(), 1u);
  EXPECT_EQ(check_expectations({{"min_pressure_evictions", 3}}, m).size(), 1u);
  ev.pop_back();  // one replica never came back
  Metrics partial = compute_metrics(ev);
  EXPECT_TRUE(partial.time_to_restore_ms.empty());
  const auto unmet = check_expectations({{"restored_by_end", true}}, partial);
  ASSERT_EQ(unmet.size(), 1u);
  EXPECT_NE(unmet[0].find("restored_by_end"), std::string::npos);
}

// ETA accuracy: the placement's eta_ms against accepted → first finished update, per final route, over the jobs that
// ran their whole budget; the others are counted apart; resubmissions (existing) and jobs without an ETA do not count.
TEST(ValidateMetrics, EtaAccuracyPerRouteOverJobsThatRanTheirBudget) {
  auto job = [](std::vector<Event>& ev, std::uint64_t id, std::int64_t at_ms, std::uint64_t eta, std::int64_t took_ms,
                const std::string& route, const std::string& why = "max_tokens") {
    ev.push_back(mk(at_ms, "submit_ok", 0, id, {{"req", id}, {"existing", false}, {"route", route}, {"eta_ms", eta}}));
    ev.push_back(mk(at_ms + took_ms, "update", 0, id, {{"kind", "finished"}, {"state", "completed"}}));
    ev.push_back(mk(at_ms + took_ms + 1, "update", 1, id, {{"kind", "finished"}, {"state", "completed"}}));  // 2nd client
    ev.push_back(mk(at_ms + took_ms + 5, "job_final", -1, id,
                    {{"state", "completed"}, {"finish_reason", why}, {"routes", nlohmann::json::array({route})}}));
  };
  std::vector<Event> ev;
  job(ev, 1, 0, 100, 100, "gpu");     // exact
  job(ev, 2, 10, 150, 100, "gpu");    // +50 %
  job(ev, 3, 20, 50, 100, "gpu");     // −50 %
  job(ev, 4, 30, 1000, 100, "gpu", "eos");  // stopped sooner: not counted
  job(ev, 5, 40, 800, 400, "cpu");    // +100 %
  ev.push_back(mk(50, "submit_ok", 0, 6, {{"req", 6}, {"existing", true}, {"eta_ms", 1}}));  // a resubmission
  ev.push_back(mk(60, "submit_ok", 0, 7, {{"req", 7}, {"existing", false}}));              // no ETA
  ev.push_back(mk(90, "job_final", -1, 7, {{"state", "completed"}, {"finish_reason", "max_tokens"}, {"routes", nlohmann::json::array({"gpu"})}}));
  std::sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.t_us < b.t_us; });
  Metrics m = compute_metrics(ev);
  ASSERT_EQ(m.eta.count("gpu"), 1u);
  const EtaAccuracy& g = m.eta["gpu"];
  EXPECT_EQ(g.n, 3u);
  EXPECT_EQ(g.stopped_sooner, 1u);
  EXPECT_DOUBLE_EQ(g.median_rel, 0.5);
  EXPECT_DOUBLE_EQ(g.p90_rel, 0.5);
  EXPECT_DOUBLE_EQ(g.median_signed_rel, 0.0);
  EXPECT_DOUBLE_EQ(g.median_abs_ms, 50.0);
  ASSERT_EQ(m.eta.count("cpu"), 1u);
  EXPECT_DOUBLE_EQ(m.eta["cpu"].p90_rel, 1.0);
  EXPECT_DOUBLE_EQ(m.eta["cpu"].median_signed_rel, 1.0) << "the estimate was twice as long";
  EXPECT_TRUE(check_expectations({{"max_eta_p90_error", 1.0}, {"min_eta_jobs", 4}}, m).empty());
  const auto unmet = check_expectations({{"max_eta_p90_error", 0.6}, {"min_eta_jobs", 5}}, m);
  ASSERT_EQ(unmet.size(), 2u);
  EXPECT_NE(unmet[0].find("min_eta_jobs"), std::string::npos) << unmet[0];
  EXPECT_NE(unmet[1].find("route cpu"), std::string::npos) << unmet[1];
  const nlohmann::json j = to_json(m);
  EXPECT_EQ(j["eta"]["gpu"]["n"], 3);
  EXPECT_EQ(j["eta"]["cpu"]["median_signed_rel_error"], 1.0);
}

TEST(ValidateMetrics, EquivalenceRateAndFirstDivergence) {
  std::vector<Event> ev;
  auto pair = [&](std::uint64_t g, std::uint64_t c, std::vector<int> tg, std::vector<int> tc, std::string route_c) {
    ev.push_back(mk(1, "submit_ok", 0, g, {{"req", g}, {"existing", false}, {"route", "gpu"}}));
    ev.push_back(mk(2, "submit_ok", 0, c, {{"req", c}, {"existing", false}, {"route", route_c}}));
    ev.push_back(mk(3, "job_final", -1, g, {{"state", "completed"}, {"routes", {"gpu"}}, {"tokens", tg}}));
    ev.push_back(mk(4, "job_final", -1, c, {{"state", "completed"}, {"routes", {route_c}}, {"tokens", tc}}));
    ev.push_back(mk(5, "equiv_pair", 0, 0, {{"group", "g" + std::to_string(g)}, {"gpu_job", g}, {"cpu_job", c}}));
  };
  pair(1, 2, {1, 2, 3}, {1, 2, 3}, "cpu");
  pair(3, 4, {1, 2, 3, 4}, {1, 2, 9, 4}, "cpu");
  pair(5, 6, {1, 2}, {1, 2}, "gpu");  // the "CPU" run ran on the GPU: not comparable
  Metrics m = compute_metrics(ev);
  EXPECT_EQ(m.equiv_valid, 2u);
  EXPECT_EQ(m.equiv_equal, 1u);
  ASSERT_TRUE(m.equivalence_rate);
  EXPECT_DOUBLE_EQ(*m.equivalence_rate, 0.5);
  ASSERT_TRUE(m.first_divergence);
  EXPECT_EQ(*m.first_divergence, 2u);
  ASSERT_EQ(m.pairs.size(), 3u);
  EXPECT_FALSE(m.pairs[2].valid);
  auto unmet = check_expectations({{"min_equivalence_rate", 1.0}}, m);
  ASSERT_EQ(unmet.size(), 1u);
  EXPECT_NE(unmet[0].find("min_equivalence_rate"), std::string::npos);
}

TEST(ValidateMetrics, PercentilesNearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  Percentiles p = percentiles(v);
  EXPECT_EQ(p.n, 100u);
  EXPECT_DOUBLE_EQ(p.p50_ms, 50);
  EXPECT_DOUBLE_EQ(p.p95_ms, 95);
  EXPECT_DOUBLE_EQ(p.p99_ms, 99);
  EXPECT_DOUBLE_EQ(percentiles({7}).p99_ms, 7);
  EXPECT_EQ(percentiles({}).n, 0u);
}

TEST(ValidateVerdict, NoRssSampleOrNoBudgetFails) {
  Metrics m;
  Verdict v = judge(m, {});
  EXPECT_FALSE(rule(v, "host_ram_budget")->pass);
  m.rss_samples = 3;
  m.peak_rss = 100;
  v = judge(m, {});
  EXPECT_FALSE(rule(v, "host_ram_budget")->pass);
  EXPECT_NE(rule(v, "host_ram_budget")->detail.find("no host-memory budget"), std::string::npos);
  m.host_budget = 1000;
  v = judge(m, {});
  EXPECT_TRUE(v.pass) << ::testing::PrintToString(v.failure_lines());
}

TEST(ValidateVerdict, UnmetExpectationAndUnfinishedPhaseFail) {
  Metrics m;
  m.rss_samples = 1, m.peak_rss = 1, m.host_budget = 2;
  PhaseResult p;
  p.name = "probes";
  p.completed = true;
  p.expect = {{"breaker_cycle", true}, {"min_cancelled", 2}};
  p.unmet = check_expectations(p.expect, p.metrics);
  ASSERT_EQ(p.unmet.size(), 2u);
  Verdict v = judge(m, {p});
  EXPECT_FALSE(v.pass);
  EXPECT_NE(rule(v, "phase_expectations")->detail.find("breaker_cycle"), std::string::npos);
  p.unmet.clear();
  p.completed = false;
  v = judge(m, {p});
  EXPECT_NE(rule(v, "phase_expectations")->detail.find("did not finish"), std::string::npos);
}

TEST(ValidateEvents, JsonlRoundTripAndErrorsNameTheLine) {
  const std::string path = ::testing::TempDir() + "/events-roundtrip.jsonl";
  std::vector<Event> ev = {mk(1, "submit", 0, 0, {{"req", 1}}), mk(2, "submit_ok", 0, 7, {{"req", 1}})};
  ASSERT_TRUE(write_events(path, ev).ok());
  auto back = read_events(path);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].job, 7u);
  EXPECT_EQ((*back)[1].type, "submit_ok");
  {
    std::ofstream f(path, std::ios::app);
    f << "{\"t_us\": 5}\n";
  }
  auto bad = read_events(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find(":3:"), std::string::npos) << bad.error().message;
  std::remove(path.c_str());
}

// --- scenarios ------------------------------------------------------------------------------------------------

struct BadScenario {
  const char* name;
  const char* text;
  const char* message;  // must be in the error
};

class ValidateScenarioErrors : public ::testing::TestWithParam<BadScenario> {};

TEST_P(ValidateScenarioErrors, NameFileLineAndKey) {
  auto r = parse_scenario(GetParam().text, "s.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(GetParam().message), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().message.rfind("s.toml", 0), 0u) << r.error().message;
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, ValidateScenarioErrors,
    ::testing::Values(
        BadScenario{"unknown_key", "[[phase]]\nname='a'\nduratio_ms=5\n[[phase.workload]]\n",
                    "s.toml:3:12: phase[0].duratio_ms: unknown key"},
        BadScenario{"bad_type", "[[phase]]\nname='a'\n[[phase.workload]]\nclients='two'\n",
                    "phase[0].workload[0].clients: expected an integer, got string \"two\""},
        BadScenario{"range", "[[phase]]\nname='a'\n[[phase.workload]]\nclients=0\n",
                    "phase[0].workload[0].clients: must be in [1, 256], got 0"},
        BadScenario{"fault_kind", "[[phase]]\nname='a'\n[[phase.fault]]\nkind='explode'\n",
                    "phase[0].fault[0].kind: \"explode\" is not one of"},
        BadScenario{"site", "[[phase]]\nname='a'\n[[phase.fault]]\nkind='fail_allocations'\nsite='gpu'\n",
                    "phase[0].fault[0].site: \"gpu\" is not one of weights, kv_pool"},
        BadScenario{"key_for_other_kind", "[[phase]]\nname='a'\n[[phase.fault]]\nkind='lose_device'\nsite='decode'\n",
                    "phase[0].fault[0].site: not used by kind \"lose_device\""},
        BadScenario{"memory_both", "[[phase]]\nname='a'\n[[phase.memory]]\nforeign='1GiB'\navailable='1MiB'\n",
                    "phase[0].memory[0]: give exactly one of foreign or available"},
        BadScenario{"memory_size", "[[phase]]\nname='a'\n[[phase.memory]]\nforeign='lots'\n",
                    "phase[0].memory[0].foreign: \"lots\" is not a size"},
        BadScenario{"no_phase", "[scenario]\nname='x'\n", "no [[phase]]"},
        BadScenario{"dup_phase", "[[phase]]\nname='a'\nduration_ms=1\n[[phase.workload]]\n[[phase]]\nname='a'\n[[phase.workload]]\n",
                    "phase name \"a\" is used twice"},
        BadScenario{"unknown_model", "[[phase]]\nname='a'\n[[phase.workload]]\nmodels=['other']\n",
                    "model \"other\" is neither \"default\" nor in daemon.extra_models"},
        BadScenario{"toml_syntax", "[[phase]\n", "s.toml:1:"},
        BadScenario{"phase_name", "[[phase]]\nname='a b'\n[[phase.workload]]\n", "may only use"}),
    [](const ::testing::TestParamInfo<BadScenario>& i) { return std::string(i.param.name); });

TEST(ValidateScenario, ParsesEveryKeyAndExpandsRepeat) {
  auto r = parse_scenario(R"(
[scenario]
name = "t"
sample_interval_ms = 100
[daemon]
extra_models = ["second"]
host_budget = "1GiB"
[[phase]]
name = "cycle"
repeat = 3
drain_timeout_ms = 5000
[[phase.workload]]
clients = 2
requests = 3
burst = 2
prompt = "long"
models = ["default", "second"]
max_tokens = 32
side_effects = true
resubmit = true
[[phase.memory]]
at_ms = 100
available = "20MiB"
[[phase.fault]]
kind = "fail_allocations"
at_ms = 700
site = "decode"
when = "generating"
[phase.expect]
min_migrated = 1
breaker_cycle = true
)",
                          "t.toml");
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->phases.size(), 3u);
  EXPECT_EQ(r->phases[0].name, "cycle-01");
  EXPECT_EQ(r->phases[2].name, "cycle-03");
  EXPECT_EQ(r->daemon.host_budget, 1ull << 30);
  const Phase& p = r->phases[1];
  EXPECT_EQ(p.duration_ms, 700u);  // grows to the last scheduled step
  ASSERT_EQ(p.workloads.size(), 1u);
  EXPECT_EQ(p.workloads[0].models.size(), 2u);
  EXPECT_EQ(*p.memory[0].available_bytes, 20ull << 20);
  EXPECT_EQ(p.faults[0].site, "decode");
  EXPECT_EQ(*p.expect.min_migrated, 1u);
  EXPECT_EQ(r->fault_kinds(), std::vector<std::string>{"fail_allocations:decode"});
}

// The shipped scenarios parse, and ci.toml covers every fault kind the issue lists.
TEST(ValidateScenario, ShippedScenariosParseAndCiCoversEveryFault) {
  for (const char* f : {"ci.toml", "soak.toml", "pressure-ladder.toml", "home-server.toml", "game.toml"}) {
    auto r = load_scenario(std::string(TANDEM_SOURCE_ROOT) + "/config/validation/" + f);
    EXPECT_TRUE(r.ok()) << f << ": " << (r.ok() ? "" : r.error().message);
  }
  auto ci = load_scenario(std::string(TANDEM_SOURCE_ROOT) + "/config/validation/ci.toml");
  ASSERT_TRUE(ci.ok());
  const auto kinds = ci->fault_kinds();
  for (const char* k : {"fail_allocations:prefill", "fail_allocations:decode", "lose_device", "fail_probes",
                        "cancel_queued", "kill_client", "kill_daemon", "hold_gpu"})
    EXPECT_NE(std::find(kinds.begin(), kinds.end(), k), kinds.end()) << "ci.toml lacks " << k;
  bool side_effects = false, memory = false, long_prompt = false, mixed = false, equivalence = false;
  for (const auto& p : ci->phases) {
    memory = memory || !p.memory.empty();
    equivalence = equivalence || p.equivalence.prompts > 0;
    for (const auto& w : p.workloads) {
      side_effects = side_effects || w.side_effects;
      long_prompt = long_prompt || w.prompt == "long";
      mixed = mixed || w.models.size() > 1;
    }
  }
  EXPECT_TRUE(side_effects && memory && long_prompt && mixed && equivalence);
  auto soak = load_scenario(std::string(TANDEM_SOURCE_ROOT) + "/config/validation/soak.toml");
  ASSERT_TRUE(soak.ok());
  std::uint64_t total = 0;
  for (const auto& p : soak->phases) total += p.duration_ms;
  EXPECT_GE(total, 30u * 60u * 1000u) << "the soak must last at least 30 minutes";
}

TEST(ValidateScenario, EmbedWorkloadsAndTheHomeServerScenario) {
  auto r = parse_scenario(R"(
[daemon]
embedding_preset = "clip-test"
[[phase]]
[[phase.workload]]
kind = "embed"
transport = "ring"
models = ["emb"]
texts = 3
images = 2
image_size = 32
[phase.expect]
min_embed_ok = 1
min_embed_gpu = 1
min_embed_cpu = 0
)", "e.toml");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const Workload& w = r->phases[0].workloads[0];
  EXPECT_EQ(w.kind, WorkloadKind::embed);
  EXPECT_EQ(w.texts, 3u);
  EXPECT_EQ(w.images, 2u);
  EXPECT_EQ(w.image_size, 32u);
  EXPECT_EQ(r->daemon.embedding_preset, "clip-test");
  EXPECT_EQ(r->daemon.embedding_name, "emb");
  EXPECT_EQ(r->phases[0].expect.min_embed_gpu, 1u);
  for (const char* bad : {"[[phase]]\n[[phase.workload]]\nkind = \"x\"\n",
                          "[[phase]]\n[[phase.workload]]\nkind = \"embed\"\ntexts = 0\n",
                          "[[phase]]\n[[phase.workload]]\nkind = \"embed\"\nresubmit = true\n",
                          "[daemon]\nembedding_preset = \"clip-huge\"\n[[phase]]\nduration_ms = 1\n",
                          "[[phase]]\n[[phase.workload]]\nmodels = [\"emb\"]\n"}) {
    auto e = parse_scenario(bad, "bad.toml");
    EXPECT_FALSE(e.ok()) << bad;
  }
  auto home = load_scenario(std::string(TANDEM_SOURCE_ROOT) + "/config/validation/home-server.toml");
  ASSERT_TRUE(home.ok()) << home.error().message;
  bool dbus = false, ring = false, faults = false, memory = false, gpu_cpu = false;
  for (const auto& p : home->phases) {
    memory = memory || !p.memory.empty();
    faults = faults || !p.faults.empty();
    gpu_cpu = gpu_cpu || p.expect.min_embed_cpu.has_value();
    for (const auto& w : p.workloads) {
      dbus = dbus || (w.kind == WorkloadKind::embed && w.transport == "dbus");
      ring = ring || (w.kind == WorkloadKind::embed && w.transport == "ring");
    }
  }
  EXPECT_TRUE(dbus && ring && faults && memory && gpu_cpu);
}

TEST(ValidateVerdict, EveryEmbedCallGetsExactlyOneReply) {
  using nlohmann::json;
  auto ev = [](std::int64_t t, const char* type, json d) {
    Event e;
    e.t_us = t;
    e.type = type;
    e.phase = 0;
    e.data = std::move(d);
    return e;
  };
  std::vector<Event> log = {ev(1, "embed_call", {{"req", 1}}), ev(2, "embed_ok", {{"req", 1}, {"route", "gpu"}, {"count", 3}}),
                            ev(3, "embed_call", {{"req", 2}}), ev(4, "embed_error", {{"req", 2}, {"error", "QueueFull"}}),
                            ev(5, "embed_call", {{"req", 3}}), ev(6, "embed_ok", {{"req", 3}, {"route", "cpu"}, {"count", 1}})};
  Metrics m = compute_metrics(log);
  EXPECT_EQ(m.embed_calls, 3u);
  EXPECT_EQ(m.embed_ok, 2u);
  EXPECT_EQ(m.embed_gpu, 1u);
  EXPECT_EQ(m.embed_cpu, 1u);
  EXPECT_EQ(m.embed_errors_by["QueueFull"], 1u);
  m.rss_samples = 1;
  m.host_budget = 1;
  Verdict v = judge(m, {});
  ASSERT_NE(rule(v, "embed_replies"), nullptr);
  EXPECT_TRUE(rule(v, "embed_replies")->pass) << rule(v, "embed_replies")->detail;
  EXPECT_TRUE(check_expectations(json{{"min_embed_gpu", 1}, {"min_embed_cpu", 1}, {"min_embed_ok", 2}}, m).empty());
  EXPECT_EQ(check_expectations(json{{"min_embed_cpu", 2}}, m).size(), 1u);
  // A call without an answer, and one answered twice.
  log.push_back(ev(7, "embed_call", {{"req", 4}}));
  log.push_back(ev(8, "embed_error", {{"req", 3}, {"error", "Internal"}}));
  m = compute_metrics(log);
  m.rss_samples = 1;
  m.host_budget = 1;
  v = judge(m, {});
  EXPECT_FALSE(v.pass);
  EXPECT_FALSE(rule(v, "embed_replies")->pass);
  EXPECT_NE(rule(v, "embed_replies")->detail.find("unanswered (req 4)"), std::string::npos) << rule(v, "embed_replies")->detail;
  EXPECT_NE(rule(v, "embed_replies")->detail.find("answered twice (req 3)"), std::string::npos);
  // No Embed calls: no such rule (the other scenarios' verdicts are unchanged).
  EXPECT_EQ(rule(judge(Metrics{}, {}), "embed_replies"), nullptr);
}

// --- report ---------------------------------------------------------------------------------------------------

TEST(ValidateReport, WritesMarkdownJsonAndCharts) {
  auto ev = read_events(data("lost_job.jsonl"));
  ASSERT_TRUE(ev.ok());
  ReportInput in;
  in.scenario_name = "unit";
  in.scenario_file = "lost_job.jsonl";
  in.mode = "analyze";
  in.events = *ev;
  in.phases = compute_phases(*ev);
  in.overall = compute_metrics(*ev);
  in.verdict = judge(in.overall, in.phases);
  const std::string dir = ::testing::TempDir() + "/validate-report";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(write_report(dir, in).ok());
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  };
  const std::string md = slurp(dir + "/report.md");
  EXPECT_NE(md.find("## Verdict: FAIL"), std::string::npos);
  EXPECT_NE(md.find("| lost_jobs | **FAIL** |"), std::string::npos);
  EXPECT_NE(md.find("charts/latency_memory.svg"), std::string::npos);
  auto j = nlohmann::json::parse(slurp(dir + "/report.json"));
  EXPECT_FALSE(j["verdict"]["pass"].get<bool>());
  EXPECT_EQ(j["overall"]["lost"], nlohmann::json::array({4}));
  for (const char* c : {"latency_memory.svg", "queues.svg", "host_ram.svg"}) {
    const std::string svg = slurp(dir + "/charts/" + c);
    EXPECT_EQ(svg.rfind("<?xml", 0), 0u) << c;
    EXPECT_NE(svg.find("</svg>"), std::string::npos) << c;
  }
  // The RSS chart has the budget line and the RSS line.
  EXPECT_NE(slurp(dir + "/charts/host_ram.svg").find("host budget"), std::string::npos);
  // Phase outputs.
  ASSERT_TRUE(write_phase(dir + "/phase-01-mixed", in.phases.at(0)).ok());
  EXPECT_NE(slurp(dir + "/phase-01-mixed/summary.md").find("accepted but lost"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tandem::validate
