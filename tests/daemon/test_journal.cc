#include "daemon/journal.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>

#include "test_journal_util.h"

namespace tandem::daemon {
namespace {

using namespace journal_test;

// --- framing ----------------------------------------------------------------------------------------------------

TEST(JournalFrame, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c("56789", crc32c("1234")), 0xE3069283u);  // continuation
}

// Bit-at-a-time reference for the table-driven (slicing-by-8) implementation.
std::uint32_t crc32c_bitwise(std::string_view data) {
  std::uint32_t crc = ~0u;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

TEST(JournalFrame, Crc32cMatchesBitwiseReferenceAtEveryLengthAndAlignment) {
  std::mt19937 rng(7);
  std::string buf(300, '\0');
  for (char& c : buf) c = static_cast<char>(rng());
  for (std::size_t off = 0; off < 8; ++off) {
    for (std::size_t len = 0; off + len <= 120; ++len) {
      const std::string_view v(buf.data() + off, len);
      ASSERT_EQ(crc32c(v), crc32c_bitwise(v)) << off << " " << len;
    }
  }
  EXPECT_EQ(crc32c(std::string_view(buf).substr(100), crc32c(std::string_view(buf).substr(0, 100))),
            crc32c(buf));
}

TEST(JournalFrame, HeaderLayoutByteByByte) {
  const std::string f = frame_journal_record(2, "{}");
  ASSERT_EQ(f.size(), kJournalHeaderBytes + 2);
  EXPECT_EQ(f.substr(0, 4), "TJR1");
  EXPECT_EQ(f[4], 2);
  EXPECT_EQ(f[5], 0);
  EXPECT_EQ(f[6], 0);
  EXPECT_EQ(f[7], 0);
  const std::uint32_t crc = crc32c("{}", crc32c(std::string("\x02\0\0\0", 4)));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(static_cast<unsigned char>(f[8 + i]), (crc >> (8 * i)) & 0xffu) << i;
  EXPECT_EQ(f[12], 2);
  EXPECT_EQ(f.substr(13, 3), std::string(3, '\0'));
  EXPECT_EQ(f.substr(16), "{}");
  // The example in docs/journal.md.
  EXPECT_EQ(frame_journal_record(7, R"({"max_job_id":9})"),
            std::string("\x54\x4a\x52\x31\x10\x00\x00\x00\xef\xdd\xa5\xd2\x07\x00\x00\x00", 16) +
                R"({"max_job_id":9})");
}

// --- typed layer: round trip and fold rules ---------------------------------------------------------------------

TEST(JobJournal, RoundTripOfEveryRecordKind) {
  TempDir d;
  std::map<std::uint64_t, JournalJob> before;
  {
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr);
    EXPECT_EQ(jr->jobs().size(), 0u);
    EXPECT_EQ(jr->file_bytes(), 0u);
    ASSERT_TRUE(jr->accepted(make_job(1, 100, "key-1")).ok());
    ASSERT_TRUE(jr->transition(1, "running", "admitted", R"({"device":"gpu","replica":0})", 110, 1).ok());
    ASSERT_TRUE(jr->checkpoint(1, {5, 6}, "he").ok());
    ASSERT_TRUE(jr->transition(1, "migrating", "device_lost", "", 120, 1).ok());
    ASSERT_TRUE(jr->transition(1, "running", "migrated", R"({"device":"cpu"})", 130, 2).ok());
    ASSERT_TRUE(jr->outcome(1, "completed", "done", {5, 6, 7}, "hey", "", "", 0, "max_tokens", 140).ok());

    ASSERT_TRUE(jr->accepted(make_job(2, 200)).ok());
    ASSERT_TRUE(jr->outcome(2, "failed", "device_lost", {}, "", "rejected", "GPU gone", 2500, "", 210).ok());

    JournalJob odd = make_job(3, 300);
    odd.model = "m\xff";  // not UTF-8: stored base64, byte-exact
    ASSERT_TRUE(jr->accepted(odd).ok());
    ASSERT_TRUE(jr->checkpoint(3, {-1, 2147483647, -2147483647 - 1}, std::string("\xe2\x82", 2)).ok());  // cut UTF-8
    ASSERT_TRUE(jr->transition(3, "retrying", "oom", "", 310, 1).ok());

    ASSERT_TRUE(jr->accepted(make_job(4, 400)).ok());
    ASSERT_TRUE(jr->outcome(4, "cancelled", "client", {9}, "x", "", "", 0, "", 410).ok());
    ASSERT_TRUE(jr->sync().ok());
    before = jr->jobs();
    EXPECT_EQ(jr->max_job_id(), 4u);
  }
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->jobs(), before);
  const auto& s = jr->replay_stats();
  EXPECT_EQ(s.records, 13u);
  EXPECT_EQ(s.jobs, 4u);
  EXPECT_EQ(s.recovered_nonterminal, 1u);  // job 3
  EXPECT_EQ(s.corrupt_records + s.unknown_records + s.torn_tail_bytes + s.stale_tmp_removed, 0u);
  EXPECT_EQ(jr->max_job_id(), 4u);
  EXPECT_EQ(jr->file_bytes(), fs::file_size(d.journal()));

  const JournalJob& j1 = jr->jobs().at(1);
  EXPECT_EQ(j1.phase, "completed");
  EXPECT_TRUE(j1.terminal());
  EXPECT_EQ(j1.idempotency_key, "key-1");
  EXPECT_EQ(j1.request_digest, 0xfeedface00000001ull);
  EXPECT_EQ(j1.owner_uid, 1001u);
  EXPECT_EQ(j1.accepted_unix_ms, 100);
  EXPECT_EQ(j1.route_json, R"({"device":"cpu"})");
  EXPECT_EQ(j1.tokens, (std::vector<std::int32_t>{5, 6, 7}));
  EXPECT_EQ(j1.text, "hey");
  EXPECT_EQ(j1.finish_reason, "max_tokens");
  EXPECT_EQ(j1.finished_unix_ms, 140);
  EXPECT_EQ(j1.attempts, 2u);
  ASSERT_EQ(j1.history_json.size(), 4u);  // three transitions + the outcome
  EXPECT_NE(j1.history_json[1].find("device_lost"), std::string::npos);
  EXPECT_NE(j1.history_json[3].find("completed"), std::string::npos);

  const JournalJob& j2 = jr->jobs().at(2);
  EXPECT_EQ(j2.phase, "failed");
  EXPECT_EQ(j2.error_code, "rejected");
  EXPECT_EQ(j2.error_message, "GPU gone");
  EXPECT_EQ(j2.retry_after_ms, 2500);
  EXPECT_EQ(j2.reason, "device_lost");

  const JournalJob& j3 = jr->jobs().at(3);
  EXPECT_EQ(j3.model, "m\xff");
  EXPECT_EQ(j3.text, std::string("\xe2\x82", 2));
  EXPECT_EQ(j3.tokens, (std::vector<std::int32_t>{-1, 2147483647, -2147483647 - 1}));
  EXPECT_EQ(j3.phase, "retrying");
  EXPECT_FALSE(j3.terminal());
  EXPECT_EQ(j3.finished_unix_ms, 0);
  EXPECT_EQ(jr->jobs().at(4).phase, "cancelled");
}

TEST(JobJournal, FoldRules) {
  TempDir d;
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  ASSERT_TRUE(jr->accepted(make_job(7)).ok());
  const JournalJob* j = &jr->jobs().at(7);
  EXPECT_EQ(j->phase, "queued");
  EXPECT_TRUE(j->route_json.empty());
  EXPECT_TRUE(j->history_json.empty());
  // A route is kept until a transition brings a new one.
  ASSERT_TRUE(jr->transition(7, "running", "admitted", R"({"r":1})", 1, 1).ok());
  ASSERT_TRUE(jr->transition(7, "retrying", "oom", "", 2, 1).ok());
  EXPECT_EQ(j->route_json, R"({"r":1})");
  EXPECT_EQ(j->reason, "oom");
  EXPECT_EQ(j->phase, "retrying");
  // The history entry is the transition record's JSON.
  EXPECT_EQ(j->history_json.back(), R"({"at":2,"attempts":1,"id":7,"phase":"retrying","reason":"oom","route":""})");
  // Checkpoints replace tokens and text.
  ASSERT_TRUE(jr->checkpoint(7, {1, 2, 3}, "abc").ok());
  ASSERT_TRUE(jr->checkpoint(7, {1}, "a").ok());
  EXPECT_EQ(j->tokens, std::vector<std::int32_t>{1});
  EXPECT_EQ(j->text, "a");
  // History keeps the last 64.
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(jr->transition(7, i % 2 ? "running" : "migrating", "r" + std::to_string(i), "", 10 + i, 2).ok());
  }
  ASSERT_EQ(j->history_json.size(), kJournalHistoryLimit);
  EXPECT_NE(j->history_json.front().find("\"r36\""), std::string::npos);
  EXPECT_NE(j->history_json.back().find("\"r99\""), std::string::npos);
  EXPECT_EQ(j->attempts, 2u);
  ASSERT_TRUE(jr->outcome(7, "completed", "done", {4}, "d", "", "", 0, "stop_string", 500).ok());
  EXPECT_EQ(j->history_json.size(), kJournalHistoryLimit);
  EXPECT_EQ(j->history_json.back(), R"({"at":500,"id":7,"phase":"completed","reason":"done"})");
  EXPECT_EQ(j->tokens, std::vector<std::int32_t>{4});
  auto before = jr->jobs();
  jr.reset();
  jr = open_ok(opts_for(d));
  EXPECT_EQ(jr->jobs(), before);
}

TEST(JobJournal, AppendErrors) {
  TempDir d;
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->accepted(make_job(0)).error().code, Errc::invalid_argument);
  ASSERT_TRUE(jr->accepted(make_job(1)).ok());
  EXPECT_EQ(jr->accepted(make_job(1)).error().code, Errc::duplicate);
  // Unknown id.
  EXPECT_EQ(jr->transition(9, "running", "", "", 0, 1).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->checkpoint(9, {}, "").error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->outcome(9, "cancelled", "", {}, "", "", "", 0, "", 0).error().code, Errc::invalid_argument);
  // Phases of the wrong kind and fields out of range.
  EXPECT_EQ(jr->transition(1, "completed", "", "", 0, 1).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->transition(1, "paused", "", "", 0, 1).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->transition(1, "running", std::string(4097, 'r'), "", 0, 1).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->transition(1, "running", "", std::string(65537, ' '), 0, 1).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->outcome(1, "running", "", {}, "", "", "", 0, "", 0).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->outcome(1, "completed", "", {}, "", "", "", 0, "", 0).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->outcome(1, "completed", "", {}, "", "", "", 0, "tired", 0).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->outcome(1, "failed", "", {}, "", "", "", 0, "", 0).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->outcome(1, "cancelled", "", {}, "", "", "", 0, "eos", 0).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->outcome(1, "failed", "", {}, "", "x", "", -1, "", 0).error().code, Errc::invalid_argument);
  JournalJob long_model = make_job(2);
  long_model.model = std::string(1025, 'm');
  EXPECT_EQ(jr->accepted(long_model).error().code, Errc::invalid_argument);
  // None of the refused appends reached the file or the state.
  EXPECT_EQ(jr->jobs().size(), 1u);
  EXPECT_TRUE(jr->jobs().at(1).history_json.empty());
  const auto size_one = jr->file_bytes();
  EXPECT_EQ(size_one, fs::file_size(d.journal()));

  // An outcome is final; the same outcome again is a no-op (also with another timestamp).
  ASSERT_TRUE(jr->outcome(1, "failed", "oom", {1}, "a", "out_of_memory", "no KV", 100, "", 50).ok());
  const auto size_two = jr->file_bytes();
  EXPECT_GT(size_two, size_one);
  EXPECT_TRUE(jr->outcome(1, "failed", "oom", {1}, "a", "out_of_memory", "no KV", 100, "", 60).ok());
  EXPECT_EQ(jr->file_bytes(), size_two);
  EXPECT_EQ(jr->jobs().at(1).finished_unix_ms, 50);
  EXPECT_EQ(jr->outcome(1, "completed", "", {1}, "a", "", "", 0, "eos", 60).error().code,
            Errc::illegal_transition);
  EXPECT_EQ(jr->outcome(1, "failed", "oom", {1, 2}, "a", "out_of_memory", "no KV", 100, "", 60).error().code,
            Errc::illegal_transition);
  EXPECT_EQ(jr->transition(1, "running", "", "", 0, 2).error().code, Errc::illegal_transition);
  EXPECT_EQ(jr->checkpoint(1, {1, 2}, "ab").error().code, Errc::illegal_transition);
  EXPECT_EQ(jr->file_bytes(), size_two);
  EXPECT_EQ(fs::file_size(d.journal()), size_two);
}

TEST(JobJournal, RejectsBadOptions) {
  TempDir d;
  auto o = opts_for(d);
  o.dir = "";
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::invalid_argument);
  o = opts_for(d);
  o.max_jobs = 0;
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::invalid_argument);
  o = opts_for(d);
  o.max_bytes = 1000;
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::invalid_argument);
  o = opts_for(d);
  o.retention = std::chrono::seconds(-1);
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::invalid_argument);
}

TEST(JobJournal, CreatesDirectoryAndFileWithPrivateModes) {
  TempDir d;
  auto o = opts_for(d);
  o.dir = d.path() + "/state/tandem";
  o.fsync = true;
  auto jr = open_ok(o);
  ASSERT_TRUE(jr);
  struct stat st {};
  ASSERT_EQ(::stat(o.dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((o.dir + "/journal").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

// --- damage ------------------------------------------------------------------------------------------------------

// Three jobs' worth of records; returns the file size before the last record.
std::uint64_t write_three(const TempDir& d, std::map<std::uint64_t, JournalJob>* before_last) {
  auto jr = open_ok(opts_for(d));
  run_to_completion(*jr, 1, 1000);
  run_to_completion(*jr, 2, 2000);
  EXPECT_TRUE(jr->accepted(make_job(3, 3000)).ok());
  const std::uint64_t cut = jr->file_bytes();
  *before_last = jr->jobs();
  EXPECT_TRUE(jr->transition(3, "running", "admitted", R"({"device":"gpu"})", 3010, 1).ok());
  return cut;
}

TEST(JobJournal, TornTailAtEveryByteOfTheLastRecord) {
  TempDir d;
  std::map<std::uint64_t, JournalJob> before_last;
  const std::uint64_t start = write_three(d, &before_last);
  const std::string full = read_file(d.journal());
  ASSERT_GT(full.size(), start + kJournalHeaderBytes);
  for (std::uint64_t len = start; len < full.size(); ++len) {
    SCOPED_TRACE("cut at " + std::to_string(len));
    write_file(d.journal(), full.substr(0, len));
    {
      auto jr = open_ok(opts_for(d));
      ASSERT_TRUE(jr);
      EXPECT_EQ(jr->jobs(), before_last);
      const auto& s = jr->replay_stats();
      EXPECT_EQ(s.torn_tail_bytes, len - start);
      EXPECT_EQ(s.torn_tail_offset, len == start ? 0u : start);
      EXPECT_EQ(s.corrupt_records, 0u);
      EXPECT_EQ(jr->file_bytes(), start);
      EXPECT_EQ(fs::file_size(d.journal()), start);  // truncated before any new append
      if (len > start) {
        EXPECT_EQ(read_file(d.path() + "/journal.torn"), full.substr(start, len - start));
      }
      // New appends after the cut work and survive the next open.
      ASSERT_TRUE(jr->transition(3, "running", "again", "", 3020, 1).ok());
    }
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr);
    EXPECT_EQ(jr->replay_stats().torn_tail_bytes, 0u);
    EXPECT_EQ(jr->jobs().at(3).reason, "again");
    EXPECT_EQ(jr->jobs().at(1).phase, "completed");
  }
}

TEST(JobJournal, BadCrcAtTheTailIsCutOff) {
  TempDir d;
  std::map<std::uint64_t, JournalJob> before_last;
  const std::uint64_t start = write_three(d, &before_last);
  std::string f = read_file(d.journal());
  const std::uint64_t full = f.size();
  f[f.size() - 3] ^= 0x20;  // inside the payload of the last record
  write_file(d.journal(), f);
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->jobs(), before_last);
  EXPECT_EQ(jr->replay_stats().torn_tail_bytes, full - start);
  EXPECT_EQ(jr->replay_stats().torn_tail_offset, start);
  EXPECT_EQ(fs::file_size(d.journal()), start);
}

// Offsets of the records in a journal file (valid frames only, from the start).
std::vector<std::size_t> record_offsets(const std::string& f) {
  std::vector<std::size_t> out;
  std::size_t pos = 0;
  while (pos + kJournalHeaderBytes <= f.size()) {
    out.push_back(pos);
    std::uint32_t len = 0;
    for (int i = 0; i < 4; ++i) len |= std::uint32_t{static_cast<unsigned char>(f[pos + 4 + i])} << (8 * i);
    pos += kJournalHeaderBytes + len;
  }
  return out;
}

TEST(JobJournal, BadRecordInTheMiddleIsSkippedAndLaterRecordsKept) {
  // Damage to the payload, the CRC, the length and the magic of record #4 (job 2's running transition); each time
  // every later record must survive.
  struct Case {
    const char* what;
    std::size_t offset_in_record;  // byte to flip
  };
  for (Case c : {Case{"payload", kJournalHeaderBytes + 5}, Case{"crc", 9}, Case{"length", 5}, Case{"magic", 0},
                 Case{"type", 12}, Case{"reserved", 14}}) {
    SCOPED_TRACE(c.what);
    TempDir d;
    {
      auto jr = open_ok(opts_for(d));
      run_to_completion(*jr, 1, 1000);
      run_to_completion(*jr, 2, 2000);
      run_to_completion(*jr, 3, 3000);
    }
    std::string f = read_file(d.journal());
    const auto offs = record_offsets(f);
    ASSERT_EQ(offs.size(), 9u);
    f[offs[4] + c.offset_in_record] ^= 0x41;
    write_file(d.journal(), f);
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr);
    const auto& s = jr->replay_stats();
    EXPECT_EQ(s.corrupt_records, 1u);
    EXPECT_EQ(s.corrupt_bytes, offs[5] - offs[4]);
    EXPECT_EQ(s.records, 8u);
    EXPECT_EQ(s.torn_tail_bytes, 0u);
    EXPECT_EQ(fs::file_size(d.journal()), f.size());  // nothing cut: the damage is not at the tail
    ASSERT_EQ(jr->jobs().size(), 3u);
    EXPECT_EQ(jr->jobs().at(2).phase, "completed");  // its outcome came after the damage
    EXPECT_EQ(jr->jobs().at(2).history_json.size(), 1u);  // the running transition is gone
    EXPECT_EQ(jr->jobs().at(3).phase, "completed");
    // Appends still work and the next replay sees the same.
    ASSERT_TRUE(jr->accepted(make_job(4)).ok());
    jr.reset();
    jr = open_ok(opts_for(d));
    EXPECT_EQ(jr->jobs().size(), 4u);
    EXPECT_EQ(jr->replay_stats().corrupt_records, 1u);
  }
}

TEST(JobJournal, LostAcceptedRecordMakesLaterRecordsUnknownNotFatal) {
  TempDir d;
  {
    auto jr = open_ok(opts_for(d));
    run_to_completion(*jr, 1, 1000);
    run_to_completion(*jr, 2, 2000);
  }
  std::string f = read_file(d.journal());
  const auto offs = record_offsets(f);
  f[offs[3] + kJournalHeaderBytes + 2] ^= 1;  // job 2's accepted record
  write_file(d.journal(), f);
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->replay_stats().corrupt_records, 1u);
  EXPECT_EQ(jr->replay_stats().unknown_records, 2u);  // its transition and outcome
  EXPECT_EQ(jr->jobs().size(), 1u);
  EXPECT_EQ(jr->transition(2, "running", "", "", 0, 1).error().code, Errc::invalid_argument);
}

TEST(JobJournal, GarbageFileIsCutToNothingAndSavedAside) {
  TempDir d;
  std::mt19937 rng(42);
  std::string garbage(10000, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  garbage.replace(5000, 4, "TJR1");  // a stray magic with nothing valid behind it
  write_file(d.journal(), garbage);
  {
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr);
    EXPECT_TRUE(jr->jobs().empty());
    EXPECT_EQ(jr->replay_stats().torn_tail_bytes, garbage.size());
    EXPECT_EQ(jr->replay_stats().torn_tail_offset, 0u);
    EXPECT_EQ(jr->replay_stats().records, 0u);
    EXPECT_EQ(fs::file_size(d.journal()), 0u);
    EXPECT_EQ(read_file(d.path() + "/journal.torn"), garbage);
    ASSERT_TRUE(jr->accepted(make_job(1)).ok());
  }
  auto jr = open_ok(opts_for(d));
  EXPECT_EQ(jr->jobs().size(), 1u);
}

TEST(JobJournal, EmptyFileAndMissingFile) {
  TempDir d;
  write_file(d.journal(), "");
  {
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr);
    EXPECT_TRUE(jr->jobs().empty());
    EXPECT_EQ(jr->replay_stats().records, 0u);
    EXPECT_EQ(jr->replay_stats().torn_tail_bytes, 0u);
    EXPECT_EQ(jr->max_job_id(), 0u);
  }
  fs::remove(d.journal());
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_TRUE(fs::exists(d.journal()));
}

TEST(JobJournal, MaxPayload) {
  TempDir d;
  auto jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  JournalJob big = make_job(1);
  big.request_json = std::string(kJournalMaxPayload, 'a');
  EXPECT_EQ(jr->accepted(big).error().code, Errc::invalid_argument);
  EXPECT_EQ(jr->file_bytes(), 0u);
  big.request_json.resize(kJournalMaxPayload - 200);  // fits with the other fields
  ASSERT_TRUE(jr->accepted(big).ok());
  ASSERT_TRUE(jr->accepted(make_job(2)).ok());
  jr.reset();
  jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->jobs().at(1).request_json.size(), kJournalMaxPayload - 200);
  EXPECT_EQ(jr->jobs().size(), 2u);
  jr.reset();

  // On read, a record claiming more than 16 MiB is corruption, even with a matching CRC: skipped in the middle ...
  std::string f = read_file(d.journal());
  const std::string huge = frame_journal_record(2, std::string(kJournalMaxPayload + 1, ' '));
  const std::string good = frame_journal_record(2, R"({"at":5,"attempts":1,"id":2,"phase":"running","reason":"r","route":""})");
  write_file(d.journal(), f + huge + good);
  jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->replay_stats().corrupt_records, 1u);
  EXPECT_EQ(jr->replay_stats().corrupt_bytes, huge.size());
  EXPECT_EQ(jr->jobs().at(2).reason, "r");
  jr.reset();
  // ... and cut off at the tail.
  write_file(d.journal(), f + huge);
  jr = open_ok(opts_for(d));
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->replay_stats().torn_tail_bytes, huge.size());
  EXPECT_EQ(fs::file_size(d.journal()), f.size());
}

TEST(JobJournal, ReplayValidatesFields) {
  TempDir d;
  {
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr->accepted(make_job(1)).ok());
  }
  const std::string base = read_file(d.journal());
  struct Case {
    std::uint8_t type;
    std::string payload;
    int corrupt, unknown;
  };
  const std::vector<Case> cases = {
      {2, R"({"id":"1","phase":"running","reason":"","route":"","at":0,"attempts":1})", 1, 0},  // id as string
      {2, R"({"id":1,"phase":"running","reason":"","route":"","at":0,"attempts":-1})", 1, 0},   // negative u32
      {2, R"({"id":1,"phase":"completed","reason":"","route":"","at":0,"attempts":1})", 1, 0},  // terminal phase
      {2, R"({"id":1,"phase":"running","reason":"","at":0,"attempts":1})", 1, 0},               // missing route
      {2, R"({"id":1,"phase":"running","reason":"","route":"","route_b64":"","at":0,"attempts":1})", 1, 0},
      {2, R"({"id":1,"phase":"running","reason":"","route_b64":"!!","at":0,"attempts":1})", 1, 0},
      {2, R"({"id":1,"phase":"running","reason":"","route":"","at":1.5,"attempts":1})", 1, 0},
      {3, R"({"id":1,"tokens":[1,2147483648],"text":""})", 1, 0},  // token out of int32
      {3, R"({"id":1,"tokens":[1,"2"],"text":""})", 1, 0},
      {3, R"({"id":1,"tokens":[[[[[1]]]]],"text":""})", 1, 0},  // deeper than any record we write
      {3, R"([1,2,3])", 1, 0},
      {3, "not json", 1, 0},
      {3, R"({"id":1,"tokens":[1],"text":"\u00e9"} trailing)", 1, 0},
      {1, R"({"id":1,"model":"m","key":"","digest":1,"uid":1,"request":"","at":0})", 1, 0},  // duplicate accept
      {4, R"({"id":1,"phase":"completed","reason":"","tokens":[],"text":"","error_code":"","error_message":"",)"
          R"("retry_after_ms":0,"finish_reason":"bored","at":9})", 1, 0},
      {2, R"({"id":77,"phase":"running","reason":"","route":"","at":0,"attempts":1})", 0, 1},  // unknown job
      {99, R"({"anything":true})", 0, 1},                                                       // unknown type
      {0, R"({})", 0, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.payload);
    const std::string tail =
        frame_journal_record(3, R"({"id":1,"tokens":[4,5],"text":"after"})");  // must still apply
    write_file(d.journal(), base + frame_journal_record(c.type, c.payload) + tail);
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr);
    EXPECT_EQ(jr->replay_stats().corrupt_records, static_cast<std::uint64_t>(c.corrupt));
    EXPECT_EQ(jr->replay_stats().unknown_records, static_cast<std::uint64_t>(c.unknown));
    EXPECT_EQ(jr->replay_stats().records, 3u);
    const JournalJob& j = jr->jobs().at(1);
    EXPECT_EQ(j.phase, "queued");
    EXPECT_EQ(j.text, "after");
  }
}

TEST(JobJournal, RecordsAfterAnOutcomeAreCorruptOnReplay) {
  TempDir d;
  {
    auto jr = open_ok(opts_for(d));
    run_to_completion(*jr, 1, 1000);
  }
  const std::string f = read_file(d.journal());
  write_file(d.journal(), f + frame_journal_record(2, R"({"id":1,"phase":"running","reason":"zombie","route":"",)"
                                                     R"("at":0,"attempts":1})"));
  auto jr = open_ok(opts_for(d));
  EXPECT_EQ(jr->replay_stats().corrupt_records, 1u);
  EXPECT_EQ(jr->jobs().at(1).phase, "completed");
}

// --- compaction --------------------------------------------------------------------------------------------------

TEST(JobJournal, CompactionKeepsLiveAndRecentDropsOld) {
  TempDir d;
  auto o = opts_for(d);
  o.retention = std::chrono::seconds(100);
  std::map<std::uint64_t, JournalJob> expected;
  {
    auto jr = open_ok(o);
    run_to_completion(*jr, 1, 10'000, "old");      // finished 190 s before "now": dropped
    run_to_completion(*jr, 2, 150'000, "recent");  // finished 50 s before: kept
    ASSERT_TRUE(jr->accepted(make_job(3, 5'000, "live")).ok());  // accepted long ago, still running: kept
    ASSERT_TRUE(jr->transition(3, "running", "admitted", R"({"device":"cpu"})", 6'000, 1).ok());
    ASSERT_TRUE(jr->checkpoint(3, {1, 2}, "\xff partial").ok());
    ASSERT_TRUE(jr->accepted(make_job(4, 7'000)).ok());  // queued: kept
    run_to_completion(*jr, 5, 20'000);                   // highest id, old: dropped, but its id stays used
    const auto size_before = jr->file_bytes();
    ASSERT_TRUE(jr->compact(200'000).ok());
    EXPECT_LT(jr->file_bytes(), size_before);
    EXPECT_EQ(jr->file_bytes(), fs::file_size(d.journal()));
    EXPECT_FALSE(fs::exists(d.path() + "/journal.tmp"));
    EXPECT_EQ(jr->jobs().size(), 3u);
    EXPECT_EQ(jr->jobs().count(1), 0u);
    EXPECT_EQ(jr->jobs().count(5), 0u);
    EXPECT_EQ(jr->max_job_id(), 5u);
    // Appends go to the new file.
    ASSERT_TRUE(jr->transition(4, "running", "admitted", "", 200'001, 1).ok());
    expected = jr->jobs();
  }
  auto jr = open_ok(o);
  ASSERT_TRUE(jr);
  EXPECT_EQ(jr->jobs(), expected);  // history, tokens, non-UTF-8 text, routes: all survive the rewrite
  EXPECT_EQ(jr->max_job_id(), 5u);
  EXPECT_EQ(jr->replay_stats().recovered_nonterminal, 2u);
  EXPECT_EQ(jr->replay_stats().corrupt_records + jr->replay_stats().unknown_records, 0u);
  EXPECT_EQ(jr->jobs().at(2).idempotency_key, "recent");
  EXPECT_EQ(jr->jobs().at(3).text, "\xff partial");
  // Compaction with nothing to drop is a fixed point: same jobs, and a second one writes the same bytes.
  ASSERT_TRUE(jr->compact(200'000).ok());
  const std::string once = read_file(d.journal());
  ASSERT_TRUE(jr->compact(200'000).ok());
  EXPECT_EQ(read_file(d.journal()), once);
  EXPECT_EQ(jr->jobs(), expected);
}

TEST(JobJournal, CompactionRespectsMaxJobsOldestTerminalFirst) {
  TempDir d;
  auto o = opts_for(d);
  o.max_jobs = 4;
  o.retention = std::chrono::seconds(1'000'000);
  auto jr = open_ok(o);
  run_to_completion(*jr, 1, 5000);
  run_to_completion(*jr, 2, 1000);  // finished first: dropped first
  run_to_completion(*jr, 3, 3000);
  for (std::uint64_t id : {4, 5, 6}) ASSERT_TRUE(jr->accepted(make_job(id)).ok());  // live: never dropped
  ASSERT_TRUE(jr->compact(6000).ok());
  std::vector<std::uint64_t> ids;
  for (const auto& [id, j] : jr->jobs()) ids.push_back(id);
  EXPECT_EQ(ids, (std::vector<std::uint64_t>{1, 4, 5, 6}));
  // More live jobs than max_jobs: all stay.
  for (std::uint64_t id : {7, 8}) ASSERT_TRUE(jr->accepted(make_job(id)).ok());
  ASSERT_TRUE(jr->compact(6000).ok());
  EXPECT_EQ(jr->jobs().size(), 5u);
  EXPECT_EQ(jr->jobs().count(1), 0u);
  jr.reset();
  jr = open_ok(o);
  EXPECT_EQ(jr->jobs().size(), 5u);
}

TEST(JobJournal, AutomaticCompactionBoundsTheFile) {
  TempDir d;
  auto o = opts_for(d);
  o.max_bytes = 64 << 10;
  o.retention = std::chrono::seconds(1);
  auto jr = open_ok(o);
  ASSERT_TRUE(jr);
  std::uint64_t peak = 0;
  const std::string text(200, 't');
  for (std::uint64_t id = 1; id <= 2000; ++id) {
    const auto t = static_cast<std::int64_t>(id) * 100;  // 10 jobs a second
    ASSERT_TRUE(jr->accepted(make_job(id, t)).ok());
    ASSERT_TRUE(jr->transition(id, "running", "admitted", R"({"device":"gpu"})", t + 1, 1).ok());
    ASSERT_TRUE(jr->outcome(id, "completed", "done", {1, 2, 3}, text, "", "", 0, "eos", t + 2).ok());
    peak = std::max(peak, jr->file_bytes());
    ASSERT_TRUE(jr->auto_compact_status().ok()) << jr->auto_compact_status().error().message;
  }
  // Never more than max_bytes plus the half that may be appended before the next compaction (plus one job).
  EXPECT_LE(peak, o.max_bytes + o.max_bytes / 2 + 2048);
  EXPECT_LT(jr->jobs().size(), 100u);  // only the last second or so of jobs is kept
  EXPECT_EQ(jr->max_job_id(), 2000u);
  auto expected = jr->jobs();
  jr.reset();
  jr = open_ok(o);
  EXPECT_EQ(jr->jobs(), expected);
  EXPECT_EQ(jr->max_job_id(), 2000u);
}

TEST(JobJournal, AutomaticCompactionByJobCount) {
  TempDir d;
  auto o = opts_for(d);
  o.max_jobs = 10;
  o.retention = std::chrono::seconds(1'000'000);
  auto jr = open_ok(o);
  for (std::uint64_t id = 1; id <= 100; ++id) {
    run_to_completion(*jr, id, static_cast<std::int64_t>(id) * 1000);
    EXPECT_LE(jr->jobs().size(), 15u);
  }
  EXPECT_EQ(jr->jobs().rbegin()->first, 100u);
}

TEST(JobJournal, StaleTmpFromAnInterruptedCompactionIsRemoved) {
  TempDir d;
  std::map<std::uint64_t, JournalJob> expected;
  {
    auto jr = open_ok(opts_for(d));
    run_to_completion(*jr, 1, 1000);
    ASSERT_TRUE(jr->accepted(make_job(2)).ok());
    expected = jr->jobs();
  }
  // A complete-looking tmp (a compaction that died before its rename) and a half-written one.
  for (const std::string& tmp : {frame_journal_record(7, R"({"max_job_id":9})"), std::string("TJR1\x05\x00", 6)}) {
    write_file(d.path() + "/journal.tmp", tmp);
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr);
    EXPECT_EQ(jr->replay_stats().stale_tmp_removed, 1u);
    EXPECT_FALSE(fs::exists(d.path() + "/journal.tmp"));
    EXPECT_EQ(jr->jobs(), expected);
    EXPECT_EQ(jr->max_job_id(), 2u);
  }
}

// --- idempotency across restarts ---------------------------------------------------------------------------------

TEST(JobJournal, IdempotencyFieldsSurviveRestart) {
  TempDir d;
  auto o = opts_for(d);
  o.fsync = true;
  {
    auto jr = open_ok(o);
    JournalJob j = make_job(41, 1000, "client-key-🔑");
    j.request_digest = 0xffffffffffffffffull;
    j.owner_uid = 4294967295u;
    ASSERT_TRUE(jr->accepted(j).ok());
    ASSERT_TRUE(jr->outcome(41, "completed", "done", {10, 11}, "answer", "", "", 0, "eos", 2000).ok());
    ASSERT_TRUE(jr->accepted(make_job(42, 1500, "other")).ok());
    // No explicit sync and no clean close of job 42's transition: accepted/outcome are synced by themselves.
  }
  auto jr = open_ok(o);
  ASSERT_TRUE(jr);
  const JournalJob& j = jr->jobs().at(41);
  EXPECT_EQ(j.idempotency_key, "client-key-🔑");
  EXPECT_EQ(j.request_digest, 0xffffffffffffffffull);
  EXPECT_EQ(j.owner_uid, 4294967295u);
  EXPECT_EQ(j.phase, "completed");
  EXPECT_EQ(j.text, "answer");
  EXPECT_EQ(j.tokens, (std::vector<std::int32_t>{10, 11}));
  EXPECT_EQ(jr->jobs().at(42).idempotency_key, "other");
  EXPECT_FALSE(jr->jobs().at(42).terminal());
}

// --- I/O errors --------------------------------------------------------------------------------------------------

TEST(JobJournal, IoErrorWhenTheDirectoryIsNotWritable) {
  if (::geteuid() == 0) GTEST_SKIP() << "root bypasses directory permissions";
  TempDir d;
  auto o = opts_for(d);
  o.dir = d.path() + "/state";
  ASSERT_EQ(::chmod(d.path().c_str(), 0500), 0);
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::io_error);  // cannot create the state dir
  ASSERT_EQ(::chmod(d.path().c_str(), 0700), 0);
  ASSERT_EQ(::mkdir(o.dir.c_str(), 0500), 0);
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::io_error);  // cannot create the journal
  ASSERT_EQ(::chmod(o.dir.c_str(), 0700), 0);
  {
    auto jr = open_ok(o);
    run_to_completion(*jr, 1, 1000);
    // The directory turns read-only: appends still work (the file is open), compaction cannot make journal.tmp.
    ASSERT_EQ(::chmod(o.dir.c_str(), 0500), 0);
    EXPECT_EQ(jr->compact(1'000'000'000).error().code, Errc::io_error);
    EXPECT_EQ(jr->jobs().size(), 1u);  // nothing dropped when the rewrite failed
  }
  ASSERT_EQ(::chmod(o.dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod((o.dir + "/journal").c_str(), 0400), 0);
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::io_error);  // cannot open the journal for writing
}

TEST(JobJournal, IoErrorWhenTheStatePathIsNotADirectory) {
  TempDir d;
  auto o = opts_for(d);
  o.dir = d.path() + "/file";
  write_file(o.dir, "x");
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::io_error);
  o.dir = d.path() + "/file/below";
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::io_error);
  // A journal that is not a regular file.
  o.dir = d.path() + "/state";
  ASSERT_EQ(::mkdir(o.dir.c_str(), 0700), 0);
  ASSERT_EQ(::mkdir((o.dir + "/journal").c_str(), 0700), 0);
  EXPECT_EQ(JobJournal::open(o).error().code, Errc::io_error);
}

TEST(JobJournal, SecondJournalOnTheSameDirectoryIsRefused) {
  TempDir d;
  auto first = open_ok(opts_for(d));
  ASSERT_TRUE(first);
  auto second = JobJournal::open(opts_for(d));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, Errc::io_error);
  EXPECT_NE(second.error().message.find("in use"), std::string::npos);
  first.reset();
  EXPECT_TRUE(JobJournal::open(opts_for(d)).ok());
}

// A file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) stands in for a full disk: writes past it fail with EFBIG, or
// come back short, like ENOSPC. Works as root too.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit r = old_;
    r.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = nullptr;
};

TEST(JobJournal, DiskFullOnAppendIsIoErrorAndChangesNothing) {
  TempDir d;
  std::map<std::uint64_t, JournalJob> expected;
  {
    auto jr = open_ok(opts_for(d));
    ASSERT_TRUE(jr);
    run_to_completion(*jr, 1, 1000);
    ASSERT_TRUE(jr->accepted(make_job(2)).ok());
    expected = jr->jobs();
    const auto size = jr->file_bytes();
    for (rlim_t room : {rlim_t{0}, rlim_t{20}}) {  // no byte fits / the record is cut short
      SCOPED_TRACE(room);
      Status a, t, o, c;
      {
        FileSizeLimit limit(size + room);
        a = jr->accepted(make_job(3));
        t = jr->transition(2, "running", "admitted", "", 2000, 1);
        o = jr->outcome(2, "cancelled", "client", {}, "", "", "", 0, "", 2001);
      }
      {
        FileSizeLimit limit(room + 100);  // journal.tmp cannot be written either
        c = jr->compact(1'000'000'000);
      }
      EXPECT_EQ(code_of(a), Errc::io_error);
      EXPECT_EQ(code_of(t), Errc::io_error);
      EXPECT_EQ(code_of(o), Errc::io_error);
      EXPECT_EQ(code_of(c), Errc::io_error);
      EXPECT_EQ(jr->jobs(), expected);
      EXPECT_EQ(jr->file_bytes(), size);
      EXPECT_EQ(fs::file_size(d.journal()), size);  // a short write is cut back
      EXPECT_FALSE(fs::exists(d.path() + "/journal.tmp"));
    }
    ASSERT_TRUE(jr->accepted(make_job(3)).ok());  // room again
    expected = jr->jobs();
  }
  auto jr = open_ok(opts_for(d));
  EXPECT_EQ(jr->jobs(), expected);
  EXPECT_EQ(jr->replay_stats().torn_tail_bytes + jr->replay_stats().corrupt_records, 0u);
}

}  // namespace
}  // namespace tandem::daemon
