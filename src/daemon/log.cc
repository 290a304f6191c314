#include "daemon/log.h"

#include <systemd/sd-journal.h>

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/sinks/systemd_sink.h>

namespace tandem::daemon::log {

namespace {
bool g_journal = false;

// systemd sets JOURNAL_STREAM=dev:ino for the stream it connected to stderr; an inherited variable whose stream is
// not our stderr (a shell started from a service) does not mean journald is listening.
bool stderr_is_journal() {
  const char* js = std::getenv("JOURNAL_STREAM");
  if (!js) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(js, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  if (fstat(2, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev && static_cast<unsigned long long>(st.st_ino) == ino;
}
}  // namespace

void init(Target t, std::string_view level) {
  g_journal = t == Target::journal || (t == Target::auto_detect && stderr_is_journal());
  std::shared_ptr<spdlog::logger> logger;
  if (g_journal) {
    logger = std::make_shared<spdlog::logger>("tandemd", std::make_shared<spdlog::sinks::systemd_sink_mt>("tandemd"));
    logger->set_pattern("%v");
  } else {
    logger = std::make_shared<spdlog::logger>("tandemd", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e tandemd[%P] %^%l%$: %v");
  }
  logger->set_level(spdlog::level::from_str(std::string(level)));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

bool to_journal() { return g_journal; }

void job_line(std::uint64_t job, std::string_view model, std::string_view route, std::string_view state,
              std::string_view reason, std::string_view breaker) {
  if (g_journal) {
    const std::string msg = "job " + std::to_string(job) + " " + std::string(state) + " (" + std::string(reason) +
                            ") on " + std::string(route) + ", model " + std::string(model);
    sd_journal_send("MESSAGE=%s", msg.c_str(), "PRIORITY=6", "SYSLOG_IDENTIFIER=tandemd", "TANDEM_JOB=%llu",
                    static_cast<unsigned long long>(job), "TANDEM_MODEL=%.*s", static_cast<int>(model.size()),
                    model.data(), "TANDEM_ROUTE=%.*s", static_cast<int>(route.size()), route.data(),
                    "TANDEM_STATE=%.*s", static_cast<int>(state.size()), state.data(), "TANDEM_REASON=%.*s",
                    static_cast<int>(reason.size()), reason.data(), "TANDEM_BREAKER=%.*s",
                    static_cast<int>(breaker.size()), breaker.data(), nullptr);
    return;
  }
  spdlog::info("job {} {} ({}) on {}, model {}", job, state, reason, route, model);
}

}  // namespace tandem::daemon::log
