// Helpers shared by the journal tests (test_journal.cc, test_journal_commit.cc): a temporary state directory,
// options without fsync, a job record, a completed job.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>

#include "core/temp_dir.h"
#include "daemon/journal.h"

namespace tandem::daemon::journal_test {

namespace fs = std::filesystem;

// Scratch space for a journal (removed with its contents, read-only parts included, when the test ends).
class TempDir : public ::tandem::core::TempDir {
 public:
  TempDir() : ::tandem::core::TempDir("tandem-journal") {}
  std::string journal() const { return path() + "/journal"; }
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_file(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// The error code of a failed Status, nullopt when it succeeded.
inline std::optional<Errc> code_of(const Status& s) {
  if (s.ok()) return std::nullopt;
  return s.error().code;
}

inline JobJournal::Options opts_for(const TempDir& d) {
  JobJournal::Options o;
  o.dir = d.path();
  o.fsync = false;  // tests check contents, not durability; the timing test syncs
  return o;
}

inline std::unique_ptr<JobJournal> open_ok(const JobJournal::Options& o) {
  auto r = JobJournal::open(o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok()) return nullptr;
  return std::move(r).value();
}

inline JournalJob make_job(std::uint64_t id, std::int64_t at = 1000, std::string key = "") {
  JournalJob j;
  j.id = id;
  j.model = "tiny";
  j.idempotency_key = std::move(key);
  j.request_digest = 0xfeedface00000000ull + id;
  j.owner_uid = 1000 + static_cast<std::uint32_t>(id);
  j.request_json = R"({"prompt":"hello","max_new_tokens":8})";
  j.accepted_unix_ms = at;
  return j;
}

// accepted + running + completed at `done_at`.
inline void run_to_completion(JobJournal& jr, std::uint64_t id, std::int64_t done_at, std::string key = "") {
  ASSERT_TRUE(jr.accepted(make_job(id, done_at - 10, std::move(key))).ok());
  ASSERT_TRUE(jr.transition(id, "running", "admitted", R"({"device":"gpu"})", done_at - 5, 1).ok());
  ASSERT_TRUE(jr.outcome(id, "completed", "done", {1, 2, 3}, "abc", "", "", 0, "eos", done_at).ok());
}

}  // namespace tandem::daemon::journal_test
