// tandemctl's other commands: status, watch, cancel, job, policy, hold, release, models, testing.
#include "tandemctl_common.h"

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
#include <thread>
#include <variant>
#include <vector>

#include "cli_args.h"
#include "client/client.h"
#include "client/ring_session.h"
#include "client/format.h"

namespace tandemctl {

// ---------------------------------------------------------------------------------------------------------------
// Other commands

int cmd_status(Global& g, ArgList& a) {
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else
      throw ArgError{"status: unexpected argument " + f};
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto s = c->status();
  if (!s.ok()) return bus_error(g, s.error(), c->last_error());
  if (g.json) {
    out_json(tc::to_json(*s));
  } else {
    out_text(tc::format_status(*s, now_unix_ms()));
    note_unparsed("the property set", s->unparsed);
    if (s->memory) note_unparsed("Memory", s->memory->unparsed);
    if (s->host_memory) note_unparsed("HostMemory", s->host_memory->unparsed);
    if (s->policy) note_unparsed("Policy", s->policy->unparsed);
  }
  return kOk;
}

std::string clock_prefix() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03d ", tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

int cmd_watch(Global& g, ArgList& a) {
  std::uint64_t count = 0, timeout_ms = 0;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--count")
      count = tandem::cli::parse_number<std::uint64_t>(f, a.value(f), 1, UINT64_MAX);
    else if (f == "--timeout")
      timeout_ms = parse_seconds_arg(f, a.value(f));
    else
      throw ArgError{"watch: unexpected argument " + f};
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  if (auto s = tc::install_interrupt_handler(-1); !s.ok()) return bus_error(g, s.error());

  std::uint64_t seen = 0;
  // Both kinds in arrival order; printed after process() returns (filling invalidated properties needs a call).
  std::vector<std::variant<tc::PropertiesChange, tc::DegradedChange>> pending;
  c->on_properties_change([&](const tc::PropertiesChange& p) { pending.emplace_back(p); });
  c->on_degraded_change([&](const tc::DegradedChange& d) { pending.emplace_back(d); });
  if (auto s = c->subscribe(); !s.ok()) return bus_error(g, s.error(), c->last_error());
  // Make sure tandemd is there (and say so) before waiting.
  auto st = c->status();
  if (!st.ok()) return bus_error(g, st.error(), c->last_error());
  if (!g.json)
    err_line("watching tandemd on " + g.bus.describe() + " (state " + st->state.value_or("?") + "); Ctrl-C stops");

  const SteadyTime t0 = std::chrono::steady_clock::now();
  while (count == 0 || seen < count) {
    std::chrono::milliseconds wait(1000);
    if (timeout_ms > 0) {
      auto left = std::chrono::milliseconds(timeout_ms) -
                  std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      if (left.count() <= 0) {
        if (count > 0) {
          err_line("tandemctl: watch timed out after " + tc::format_duration_ms(timeout_ms) + " with " +
                   std::to_string(seen) + " of " + std::to_string(count) + " events");
          return kBusError;
        }
        return kOk;
      }
      wait = std::min(wait, left);
    }
    auto w = c->process(wait, tc::interrupt_fd());
    if (!w.ok()) return bus_error(g, w.error());
    if (*w == tc::Wake::interrupted) {
      tc::take_interrupts();
      return kOk;
    }
    for (auto& ev : pending) {
      if (count > 0 && seen >= count) break;
      ++seen;
      if (auto* p = std::get_if<tc::PropertiesChange>(&ev)) {
        (void)c->fill_invalidated(*p);
        if (g.json) {
          json j = with_event("properties", tc::to_json(*p));
          j["time_unix_ms"] = now_unix_ms();
          out_json(j);
        } else
          out_text(clock_prefix() + tc::format_properties_change(*p) + "\n");
      } else {
        const auto& d = std::get<tc::DegradedChange>(ev);
        if (g.json) {
          json j = with_event("degraded", tc::to_json(d));
          j["time_unix_ms"] = now_unix_ms();
          out_json(j);
        } else
          out_text(clock_prefix() + tc::format_degraded_change(d) + "\n");
      }
    }
    pending.clear();
  }
  return kOk;
}

std::uint64_t one_job_arg(const std::string& cmd, ArgList& a, Global& g) {
  std::optional<std::uint64_t> job;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (!job && !f.empty() && f[0] != '-')
      job = parse_job_id(f);
    else
      throw ArgError{cmd + ": unexpected argument " + f};
  }
  if (!job) throw ArgError{cmd + ": JOB is missing"};
  return *job;
}

int cmd_cancel(Global& g, ArgList& a) {
  std::uint64_t job = one_job_arg("cancel", a, g);
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto r = c->cancel(job);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json)
    out_json({{"job", job}, {"state", *r}});
  else
    out_text("job " + std::to_string(job) + ": " + *r + "\n");
  return kOk;
}

int cmd_job(Global& g, ArgList& a) {
  std::uint64_t job = one_job_arg("job", a, g);
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto r = c->get_job(job);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json) {
    out_json(tc::to_json(*r));
  } else {
    out_text(tc::format_job(*r, now_unix_ms()));
    note_unparsed("the job", r->unparsed);
  }
  return kOk;
}

int cmd_policy(Global& g, ArgList& a) {
  std::vector<std::string> rest;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else
      rest.push_back(f);
  }
  std::map<std::string, tc::PolicyValue> values;
  if (!rest.empty()) {
    if (rest[0] != "set")
      throw ArgError{"policy: unknown subcommand '" + rest[0] + "' (policy | policy set KEY=VALUE...)"};
    if (rest.size() < 2) throw ArgError{"policy set: give at least one KEY=VALUE"};
    for (std::size_t i = 1; i < rest.size(); ++i) {
      auto p = tc::parse_policy_setting(rest[i]);
      if (!p.ok()) throw ArgError{p.error().message};
      if (values.count(p->first)) throw ArgError{"policy set: " + p->first + " given twice"};
      values.insert(std::move(p).value());
    }
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  if (!values.empty()) {
    auto s = c->set_policy(values);
    if (!s.ok()) return bus_error(g, s.error(), c->last_error());
  }
  auto p = c->policy();
  if (!p.ok()) return bus_error(g, p.error(), c->last_error());
  if (g.json)
    out_json(tc::to_json(*p));
  else
    out_text(tc::format_policy(*p));
  return kOk;
}

int cmd_hold(Global& g, ArgList& a) {
  std::string app_id;
  std::uint64_t for_ms = 0;
  std::vector<std::string> words;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--app-id")
      app_id = a.value(f);
    else if (f == "--for")
      for_ms = parse_seconds_arg(f, a.value(f));
    else if (!f.empty() && f[0] == '-' && f != "-")
      throw ArgError{"hold: unknown option " + f};
    else
      words.push_back(f);
  }
  if (words.empty()) throw ArgError{"hold: REASON is missing (e.g. tandemctl hold \"game running\")"};
  std::string reason;
  for (const auto& w : words) reason += (reason.empty() ? "" : " ") + w;

  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  if (auto s = tc::install_interrupt_handler(-1); !s.ok()) return bus_error(g, s.error());
  auto cookie = c->hold_gpu(reason, app_id);
  if (!cookie.ok()) return bus_error(g, cookie.error(), c->last_error());
  if (g.json) {
    out_json({{"event", "held"}, {"cookie", *cookie}});
  } else {
    out_text(*cookie + "\n");
    err_line("holding the GPU (cookie " + *cookie + ")" +
             (for_ms ? " for " + tc::format_duration_ms(for_ms) : std::string("")) +
             "; Ctrl-C releases it (so does tandemctl exiting)");
  }
  const SteadyTime t0 = std::chrono::steady_clock::now();
  while (true) {
    std::chrono::milliseconds wait(1000);
    if (for_ms > 0) {
      auto left = std::chrono::milliseconds(for_ms) -
                  std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      if (left.count() <= 0) break;
      wait = std::min(wait, left);
    }
    auto w = c->process(wait, tc::interrupt_fd());
    if (!w.ok()) return bus_error(g, w.error());
    if (*w == tc::Wake::interrupted) {
      tc::take_interrupts();
      break;
    }
  }
  auto r = c->release_gpu(*cookie);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json)
    out_json({{"event", "released"}, {"cookie", *cookie}});
  else
    err_line("released the GPU hold " + *cookie);
  return kOk;
}

int cmd_release(Global& g, ArgList& a) {
  std::optional<std::string> cookie;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (!cookie)
      cookie = f;
    else
      throw ArgError{"release: unexpected argument " + f};
  }
  if (!cookie || cookie->empty()) throw ArgError{"release: COOKIE is missing"};
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto r = c->release_gpu(*cookie);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json)
    out_json({{"released", *cookie}});
  else
    out_text("released " + *cookie + "\n");
  return kOk;
}

// tandemctl models load|unload NAME: LoadModel / UnloadModel, then (unless --no-wait) the model object's Replicas
// until the GPU replica is loaded (or failed) / evicted.
int cmd_models_residency(Global& g, ArgList& a, const std::string& verb) {
  std::optional<std::string> name;
  std::string device = "gpu";
  bool wait = true;
  std::uint64_t timeout_ms = 120000;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--device")
      device = a.value(f);
    else if (f == "--no-wait")
      wait = false;
    else if (f == "--timeout")
      timeout_ms = parse_seconds_arg(f, a.value(f));
    else if (!name && !f.empty() && f[0] != '-')
      name = f;
    else
      throw ArgError{"models " + verb + ": unexpected argument " + f};
  }
  if (!name) throw ArgError{"models " + verb + ": NAME is missing (tandemctl models " + verb + " NAME)"};
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto r = verb == "load" ? c->load_model(*name, device) : c->unload_model(*name, device);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  std::string state = r->state.value_or("?");
  std::optional<tc::ReplicaInfo> last;
  const auto t0 = std::chrono::steady_clock::now();
  auto settled = [&](const std::string& s) {
    return verb == "load" ? (s == "loaded" || s == "failed") : (s == "evicted" || s == "failed" || s == "lost");
  };
  while (wait && !settled(state)) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(timeout_ms)) {
      err_line("tandemctl: " + *name + "'s GPU replica is still " + state + " after " +
               tc::format_duration_ms(timeout_ms));
      if (g.json) out_json({{"event", "timeout"}, {"model", *name}, {"state", state}});
      return kBusError;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto d = c->model_details(tc::model_object_path(*name));
    if (!d.ok()) return bus_error(g, d.error(), c->last_error());
    for (const auto& x : d->replicas.value_or(std::vector<tc::ReplicaInfo>{}))
      if (x.device.value_or("cpu") != "cpu") {
        last = x;
        state = x.state.value_or("?");
      }
  }
  const std::uint64_t bytes = last ? last->accel_bytes.value_or(0) : r->accel_bytes.value_or(0);
  if (g.json) {
    json j = {{"event", verb == "load" ? "loaded" : "unloaded"}, {"model", *name}, {"device", device},
              {"state", state}, {"accel_bytes", bytes}, {"waited", wait}};
    if (last && last->error) j["error"] = *last->error;
    out_json(j);
  } else if (state == "failed") {
    err_line("tandemctl: " + *name + "'s GPU replica could not be loaded" +
             (last && last->error ? ": " + *last->error : std::string("")) + "; it serves on the CPU");
  } else {
    out_text(*name + ": GPU replica " + state + (verb == "load" && state == "loaded" ? ", " + tc::format_bytes(bytes) +
                                                                                          " on the accelerator"
                                                                                    : std::string("")) +
             "\n");
  }
  return state == "failed" ? kBusError : kOk;
}

int cmd_models(Global& g, ArgList& a) {
  if (!a.done() && (a.peek() == "load" || a.peek() == "unload")) {
    const std::string verb = a.next();
    return cmd_models_residency(g, a, verb);
  }
  bool details = false;
  std::optional<std::string> only;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else if (f == "--details")
      details = true;
    else if (!only && !f.empty() && f[0] != '-')
      only = f, details = true;
    else
      throw ArgError{"models: unexpected argument " + f};
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  auto m = c->list_models();
  if (!m.ok()) return bus_error(g, m.error(), c->last_error());
  std::vector<tc::ModelInfo> models;
  for (const auto& x : *m)
    if (!only || x.name.value_or("") == *only) models.push_back(x);
  if (only && models.empty()) {
    err_line("tandemctl: no model named '" + *only + "'");
    if (g.json)
      out_json({{"event", "error"}, {"error", {{"code", "not_found"}, {"message", "no model named " + *only}}}});
    return kBusError;
  }
  json arr = json::array();
  std::string text = details ? "" : tc::format_models(models);
  for (const auto& x : models) {
    json j = tc::to_json(x);
    if (details) {
      std::string path = x.path.value_or(tc::model_object_path(x.name.value_or("")));
      auto d = c->model_details(path);
      if (!d.ok()) return bus_error(g, d.error(), c->last_error());
      j["details"] = tc::to_json(*d);
      text += (text.empty() ? "" : "\n") + tc::format_model_details(*d);
    }
    arr.push_back(j);
  }
  if (g.json)
    out_json(arr);
  else
    out_text(text);
  return kOk;
}

int cmd_testing(Global& g, ArgList& a) {
  std::vector<std::string> w;
  while (!a.done()) {
    std::string f = a.next();
    if (f == "--json")
      g.json = true;
    else
      w.push_back(f);
  }
  if (w.empty())
    throw ArgError{
        "testing: what? (foreign-load, fail-alloc, fail-probes, lose-device, recover-device, "
        "reading-lag, counters)"};
  const std::string what = w[0];
  auto want = [&](std::size_t n, const char* usage) {
    if (w.size() != n + 1) throw ArgError{"usage: tandemctl testing " + what + (n ? " " : "") + usage};
  };
  std::function<tandem::Result<void>(tc::Client&)> act;
  std::string done_text;
  if (what == "foreign-load") {
    want(1, "BYTES");
    std::uint64_t bytes = parse_size_arg("foreign-load", w[1]);
    act = [bytes](tc::Client& c) { return c.set_foreign_load(bytes); };
    done_text = "foreign load set to " + tc::format_bytes(bytes);
  } else if (what == "fail-alloc") {
    want(2, "N SITE");
    std::uint32_t n = tandem::cli::parse_number<std::uint32_t>("fail-alloc N", w[1], 0, UINT32_MAX);
    std::string site = w[2];
    static const std::vector<std::string> sites = {"weights", "kv_pool", "prefill", "decode", "probe", "other", "any"};
    if (std::find(sites.begin(), sites.end(), site) == sites.end())
      throw ArgError{"fail-alloc: SITE '" + site +
                     "' is not one of weights, kv_pool, prefill, decode, probe, other, any"};
    act = [n, site](tc::Client& c) { return c.fail_allocations(n, site); };
    done_text = "the next " + std::to_string(n) + " allocations at " + site + " will fail";
  } else if (what == "fail-probes") {
    want(1, "N");
    std::uint32_t n = tandem::cli::parse_number<std::uint32_t>("fail-probes N", w[1], 0, UINT32_MAX);
    act = [n](tc::Client& c) { return c.fail_probes(n); };
    done_text = "the next " + std::to_string(n) + " health probes will fail";
  } else if (what == "lose-device") {
    want(0, "");
    act = [](tc::Client& c) { return c.lose_device(); };
    done_text = "device lost";
  } else if (what == "recover-device") {
    want(0, "");
    act = [](tc::Client& c) { return c.recover_device(); };
    done_text = "device recovered";
  } else if (what == "reading-lag") {
    want(1, "MS");
    std::uint64_t ms = parse_ms_arg("reading-lag", w[1]);
    act = [ms](tc::Client& c) { return c.set_reading_lag(ms); };
    done_text = "memory readings lag by " + tc::format_duration_ms(ms);
  } else if (what == "counters") {
    want(0, "");
  } else {
    throw ArgError{"testing: unknown action '" + what + "'"};
  }
  int rc = kOk;
  auto c = open_client(g, rc);
  if (!c) return rc;
  if (what == "counters") {
    auto r = c->counters();
    if (!r.ok()) return bus_error(g, r.error(), c->last_error());
    if (g.json)
      out_json(json(*r));
    else
      out_text(tc::format_counters(*r));
    return kOk;
  }
  auto r = act(*c);
  if (!r.ok()) return bus_error(g, r.error(), c->last_error());
  if (g.json)
    out_json({{"ok", true}, {"action", what}});
  else
    out_text(done_text + "\n");
  return kOk;
}

}  // namespace tandemctl
