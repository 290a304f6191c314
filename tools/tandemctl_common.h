// tandemctl's shared pieces (tools/tandemctl*.cc): the global flags, output helpers, argument walking and
// parsing, the client connection, and the commands each file defines.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli_args.h"
#include "client/client.h"
#include "client/format.h"

namespace tandemctl {

namespace tc = tandem::client;
using nlohmann::json;
using tandem::cli::ArgError;
using SteadyTime = std::chrono::steady_clock::time_point;

enum Exit : int { kOk = 0, kUsage = 1, kFailed = 2, kCancelled = 3, kBusError = 4 };

struct Global {
  tc::BusSpec bus;
  std::string service = tc::kServiceName;
  bool json = false;

  // "tandemctl --session" etc., for commands printed ready to paste.
  std::string prefix() const {
    std::string p = "tandemctl";
    if (!(bus == tc::BusSpec{})) p += " " + bus.flag();
    if (service != tc::kServiceName) p += " --name " + service;
    return p;
  }
};

std::int64_t now_unix_ms();
std::string dump(const json& j);
void out_json(const json& j);
// {"event": name, ...rest}
json with_event(const char* name, const json& rest);
void out_text(std::string_view s);
void err_line(std::string_view s);
// A usage error: message on stderr, exit 1.
int usage_error(const std::string& msg);
json error_json(const tandem::Error& e, const std::optional<tc::RemoteError>& re);
// A bus/daemon error: message on stderr (and a JSON document on stdout with --json), exit 4.
int bus_error(const Global& g, const tandem::Error& e, const std::optional<tc::RemoteError>& re = std::nullopt);

// Walks the arguments of a subcommand.
class ArgList {
 public:
  explicit ArgList(std::vector<std::string> args) : args_(std::move(args)) {}
  bool done() const { return i_ >= args_.size(); }
  std::string next() { return args_[i_++]; }
  const std::string& peek() const { return args_[i_]; }
  std::string value(const std::string& flag) {
    if (done()) throw ArgError{flag + " needs a value"};
    return next();
  }

 private:
  std::vector<std::string> args_;
  std::size_t i_ = 0;
};

std::uint64_t parse_u64(const std::string& flag, const std::string& v);
std::uint64_t parse_job_id(const std::string& v);
double parse_double(const std::string& flag, const std::string& v, double lo, double hi);
std::uint64_t parse_size_arg(const std::string& flag, const std::string& v);
std::uint64_t parse_ms_arg(const std::string& flag, const std::string& v);
// Plain numbers are seconds here ("--timeout 30"); "500ms", "2min" work too.
std::uint64_t parse_seconds_arg(const std::string& flag, const std::string& v);
std::string read_stdin();
std::unique_ptr<tc::Client> open_client(const Global& g, int& exit_code);
// Replies may grow new keys (docs/dbus.md, compatibility): unknown ones are ignored, and listed only with
// TANDEMCTL_STRICT=1 (contract checks, e.g. tandem-validate).
void note_unparsed(const std::string& what, const tc::Unparsed& u);

// The commands. tandemctl_jobs.cc: run, resume, plan.
int submit_and_follow(Global& g, const std::string& cmd, ArgList& a);
int cmd_plan(Global& g, ArgList& a);
// tandemctl_commands.cc: the others.
int cmd_status(Global& g, ArgList& a);
int cmd_watch(Global& g, ArgList& a);
int cmd_cancel(Global& g, ArgList& a);
int cmd_job(Global& g, ArgList& a);
int cmd_policy(Global& g, ArgList& a);
int cmd_hold(Global& g, ArgList& a);
int cmd_release(Global& g, ArgList& a);
int cmd_models(Global& g, ArgList& a);
int cmd_testing(Global& g, ArgList& a);
// tandemctl_images.cc: image search.
int cmd_index(Global& g, ArgList& a);
int cmd_search(Global& g, ArgList& a);
int cmd_embed(Global& g, ArgList& a);
// tandemctl_transcribe.cc: speech.
int cmd_transcribe(Global& g, ArgList& a);

}  // namespace tandemctl
