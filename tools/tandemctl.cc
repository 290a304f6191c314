// tandemctl: the command-line client of tandemd (docs/tandemctl.md). Torch-free: src/client + sdbus-c++ only.
//
// Exit codes: 0 ok/completed, 1 usage (bad flags or values), 2 job failed, 3 job cancelled (also Ctrl-C),
// 4 bus or daemon error (cannot connect, tandemd not running, an error reply, a timeout), 5 the image index file
// cannot be used (index/search: corrupt, another model, missing).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <iostream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cli_args.h"
#include "client/client.h"
#include "client/ring_session.h"
#include "client/format.h"
#include "tandemctl_common.h"


#ifndef TANDEM_VERSION
#define TANDEM_VERSION "unknown"
#endif


using namespace tandemctl;

namespace {

constexpr const char* kUsageText =
    R"(usage: tandemctl [--system|--session|--address ADDR] [--name NAME] [--json] COMMAND [ARGS]

Commands:
  status                         service state, degraded reason, breaker, memory, queues, limits, holds
  watch [--count N] [--timeout S]
                                 one line per property change / degraded-mode change, until Ctrl-C
  run [OPTIONS] PROMPT           submit a job and stream its text (PROMPT "-" reads stdin)
  resume JOB [OPTIONS]           resume a failed job from its checkpoint and stream it
  plan [OPTIONS] PROMPT          the admission decision a submit would get now (changes nothing)
  cancel JOB                     cancel a job
  job JOB                        a job's state, route history, text so far, error and checkpoint
  policy                         show the runtime policy
  policy set KEY=VALUE...        change policy keys (admin)
  hold [--app-id ID] [--for S] REASON
                                 keep new work off the GPU until Ctrl-C (or S seconds); prints the cookie
  release COOKIE                 release a GPU hold
  models [NAME] [--details]      configured models (--details / NAME: replicas, placement, template)
  models unload|load NAME        give a model's GPU replica back / load it again (admin; docs/residency.md)
  index DIR [--model M] [--index FILE] [--rebuild] [--batch N]
                                 add DIR's JPEG/PNG images to the image index (new and changed files only)
  search TEXT | --image FILE [-n N] [--model M] [--index FILE]
                                 the indexed images closest to a text or an image
  embed [--model M] [--image FILE]... [--image-bytes FILE]... [--key K] [--no-cpu] [--no-truncate]
        [--deadline-ms N] [TEXT]...
                                 embedding vectors (one line each: texts, then images; --json: with the result)
  transcribe [--language L] [--translate] [--srt|--vtt] [OPTIONS] FILE
                                 timestamped text of an audio file (WAV, FLAC, Ogg; "-" reads stdin), segments
                                 as they are decoded, progress and ETA on a terminal
  testing foreign-load BYTES | fail-alloc N SITE | fail-probes N | lose-device | recover-device |
          reading-lag MS | counters
                                 fault injection (tandemd must run with testing enabled)

Job options (run, resume, plan):
  --model M  --max-tokens N  --temperature T  --top-k K  --top-p P  --repetition-penalty R  --seed S
  --stop STR (repeatable)  --key IDEMPOTENCY_KEY  --side-effects  --no-cpu  --allow-reduce  --allow-fallback
  --deadline MS  --prefill-chunk N  --chat  --system-prompt TEXT  --no-thinking | --thinking
  run/resume only: --timeout S (give up: cancel the job, exit 4)  --detach (print the job id and exit)

Global: --system (default, or TANDEM_BUS=system|session|address=ADDR), --session, --address ADDR,
  --name NAME (tandemd's bus name, default io.tandem.Tandem1), --json (machine-readable output), --help, --version
Sizes take units (6GiB, 512MiB); durations take ms, s, min, h (plain numbers: seconds for --timeout/--for, ms
otherwise). Exit codes: 0 ok, 1 usage, 2 job failed, 3 cancelled, 4 bus/daemon error, 5 image index unusable.
)";

std::optional<std::string> help_for(const std::string& cmd) {
  if (cmd == "run" || cmd == "plan" || cmd == "resume")
    return "usage: tandemctl " + cmd + (cmd == "resume" ? " JOB" : "") +
           " [--model M] [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]\n"
           "         [--repetition-penalty R] [--seed S] [--stop STR]... [--key IDEMPOTENCY_KEY] [--side-effects]\n"
           "         [--no-cpu] [--allow-reduce] [--allow-fallback] [--deadline MS] [--prefill-chunk N] [--chat]\n"
           "         [--system-prompt TEXT] [--no-thinking | --thinking]" +
           (cmd == "plan" ? std::string("") : std::string(" [--timeout S] [--detach]")) +
           (cmd == "run" ? std::string(" [--no-ring]") : std::string("")) +
           (cmd == "resume" ? std::string("") : std::string(" PROMPT")) + "\n";
  if (cmd == "watch") return std::string("usage: tandemctl watch [--count N] [--timeout S]\n");
  if (cmd == "hold") return std::string("usage: tandemctl hold [--app-id ID] [--for S] REASON\n");
  if (cmd == "policy") return std::string("usage: tandemctl policy | tandemctl policy set KEY=VALUE...\n");
  if (cmd == "models")
    return std::string(
        "usage: tandemctl models [--details] [NAME]\n"
        "       tandemctl models unload|load NAME [--device gpu] [--no-wait] [--timeout S]\n"
        "         (gives the model's GPU replica back / loads it again; waits until it is evicted / loaded)\n");
  if (cmd == "index")
    return std::string("usage: tandemctl index DIR [--model M] [--index FILE] [--rebuild] [--batch N] [--json]\n");
  if (cmd == "search")
    return std::string("usage: tandemctl search TEXT | --image FILE [-n N] [--model M] [--index FILE] [--json]\n");
  if (cmd == "embed")
    return std::string(
        "usage: tandemctl embed [--model M] [--image FILE]... [--image-bytes FILE]... [--key K] [--no-cpu]\n"
        "                       [--no-truncate] [--deadline-ms N] [--json] [--] [TEXT]...\n");
  if (cmd == "transcribe")
    return std::string(
        "usage: tandemctl transcribe [--model M] [--language L] [--translate] [--no-timestamps] [--temperature T]\n"
        "                            [--no-fallback] [--seed N] [--prompt TEXT] [--no-condition] [--key K] [--no-cpu]\n"
        "                            [--deadline MS] [--timeout S] [--detach] [--srt|--vtt|--json] FILE\n"
        "       tandemctl transcribe --raw RATE[:CHANNELS[:s16le|f32le]] [OPTIONS] FILE|-\n"
        "                            (raw PCM streamed through a ring session as it is read: a microphone pipe)\n");
  if (cmd == "testing")
    return std::string(
        "usage: tandemctl testing foreign-load BYTES | fail-alloc N SITE | fail-probes N | lose-device |\n"
        "                         recover-device | reading-lag MS | counters\n");
  return std::nullopt;
}

int dispatch(Global& g, const std::string& cmd, ArgList& a) {
  if (cmd == "status") return cmd_status(g, a);
  if (cmd == "watch") return cmd_watch(g, a);
  if (cmd == "run" || cmd == "resume") return submit_and_follow(g, cmd, a);
  if (cmd == "plan") return cmd_plan(g, a);
  if (cmd == "cancel") return cmd_cancel(g, a);
  if (cmd == "job") return cmd_job(g, a);
  if (cmd == "policy") return cmd_policy(g, a);
  if (cmd == "hold") return cmd_hold(g, a);
  if (cmd == "release") return cmd_release(g, a);
  if (cmd == "models") return cmd_models(g, a);
  if (cmd == "testing") return cmd_testing(g, a);
  if (cmd == "index") return cmd_index(g, a);
  if (cmd == "search") return cmd_search(g, a);
  if (cmd == "embed") return cmd_embed(g, a);
  if (cmd == "transcribe") return cmd_transcribe(g, a);
  throw ArgError{"unknown command '" + cmd + "'"};
}

}  // namespace

int main(int argc, char** argv) {
  Global g;
  try {
    auto env = tc::bus_spec_from_env();
    if (!env.ok()) return usage_error(env.error().message);
    g.bus = *env;

    int i = 1;
    for (; i < argc; ++i) {
      std::string f = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw ArgError{f + " needs a value"};
        return argv[++i];
      };
      if (f == "--system")
        g.bus = tc::BusSpec{tc::BusKind::system, ""};
      else if (f == "--session")
        g.bus = tc::BusSpec{tc::BusKind::session, ""};
      else if (f == "--address") {
        auto b = tc::parse_bus_spec("address=" + value());
        if (!b.ok()) throw ArgError{"--address: " + b.error().message};
        g.bus = *b;
      } else if (f == "--bus") {
        auto b = tc::parse_bus_spec(value());
        if (!b.ok()) throw ArgError{"--bus: " + b.error().message};
        g.bus = *b;
      } else if (f == "--name") {
        g.service = value();
        if (g.service.empty()) throw ArgError{"--name must not be empty"};
      } else if (f == "--json")
        g.json = true;
      else if (f == "-h" || f == "--help") {
        out_text(kUsageText);
        return kOk;
      } else if (f == "--version") {
        out_text(std::string("tandemctl ") + TANDEM_VERSION + "\n");
        return kOk;
      } else if (!f.empty() && f[0] == '-')
        throw ArgError{"unknown option " + f};
      else
        break;
    }
    if (i >= argc) return usage_error("a COMMAND is missing");
    std::string cmd = argv[i++];
    if (cmd == "help") {
      if (i < argc) {
        if (auto h = help_for(argv[i])) {
          out_text(*h);
          return kOk;
        }
      }
      out_text(kUsageText);
      return kOk;
    }
    std::vector<std::string> rest(argv + i, argv + argc);
    for (const auto& r : rest) {
      if (r == "--") break;
      if (r == "-h" || r == "--help") {
        out_text(help_for(cmd).value_or(kUsageText));
        return kOk;
      }
    }
    ArgList a(std::move(rest));
    return dispatch(g, cmd, a);
  } catch (const ArgError& e) {
    return usage_error(e.message);
  }
}
