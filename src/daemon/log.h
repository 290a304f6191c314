// tandemd's logging: spdlog to the systemd journal (when started by systemd: JOURNAL_STREAM is set) or to stderr.
// Job lines carry structured journal fields (TANDEM_JOB, TANDEM_MODEL, TANDEM_ROUTE, TANDEM_REASON,
// TANDEM_BREAKER) so `journalctl TANDEM_JOB=42` finds one job. Never one line per token.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <spdlog/spdlog.h>

namespace tandem::daemon::log {

enum class Target { auto_detect, stderr_only, journal };
// Sets the default spdlog logger. `level`: trace|debug|info|warn|error.
void init(Target t = Target::auto_detect, std::string_view level = "info");
bool to_journal();

template <class... A>
void debug(spdlog::format_string_t<A...> f, A&&... a) { spdlog::debug(f, std::forward<A>(a)...); }
template <class... A>
void info(spdlog::format_string_t<A...> f, A&&... a) { spdlog::info(f, std::forward<A>(a)...); }
template <class... A>
void warn(spdlog::format_string_t<A...> f, A&&... a) { spdlog::warn(f, std::forward<A>(a)...); }
template <class... A>
void error(spdlog::format_string_t<A...> f, A&&... a) { spdlog::error(f, std::forward<A>(a)...); }

// One line per job outcome, with structured fields in the journal.
void job_line(std::uint64_t job, std::string_view model, std::string_view route, std::string_view state,
              std::string_view reason, std::string_view breaker = "");

}  // namespace tandem::daemon::log
