// tandem-http: the OpenAI- and Ollama-compatible HTTP gateway in front of tandemd (docs/http.md, tandem-http(8)).
// A client of tandemd (D-Bus + a ring session), so tandemd's own attack surface stays D-Bus. Socket-activated by
// tandem-http.socket, or listening where its configuration says.
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <utility>  // before Boost.Asio: 1.74's awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <toml++/toml.h>
#include <vector>

#include "client/format.h"
#include "http/auth.h"
#include "http/gateway.h"
#include "http/server.h"
#include "http/tandem_link.h"
#include "http/wyoming_server.h"

namespace th = tandem::http;
namespace tc = tandem::client;

namespace {

constexpr const char* kDefaultConfig = "/etc/tandem/tandem-http.toml";
constexpr std::uint16_t kDefaultPort = 11435;

struct Config {
  std::vector<std::string> listen = {"127.0.0.1:" + std::to_string(kDefaultPort)};
  std::string unix_socket;
  std::string api_keys_file;
  bool loopback_without_key = true;
  std::vector<std::string> cors_origins;
  std::string bus = "system";
  std::vector<std::string> wyoming_listen;  // Home Assistant's Wyoming speech-to-text (none by default)
  bool wyoming_allow_remote = false;        // Wyoming has no authentication: a non-loopback address needs this
  th::WyomingServerLimits wyoming;
  th::ServerLimits limits;
  th::GatewayConfig gateway;
};

int usage(int rc) {
  std::printf(
      "usage: tandem-http [--config FILE] [--listen HOST:PORT]... [--unix PATH] [--wyoming HOST:PORT]...\n"
      "                   [--bus system|session|address=ADDR]\n"
      "       tandem-http --check-config [--config FILE]\n"
      "       tandem-http --hash-key NAME     (reads a key on stdin, prints the key file's line for it)\n"
      "       tandem-http --version\n"
      "Default config %s; default listen 127.0.0.1:%u. Under systemd, tandem-http.socket passes the sockets.\n",
      kDefaultConfig, kDefaultPort);
  return rc;
}

// Reads [http] and [tandem] of the TOML file; every key checked, unknown keys refused.
tandem::Result<void> load_config(const std::string& path, Config& c) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    return tandem::fail(tandem::Errc::parse_error, path + ": " + std::string(e.description()));
  }
  auto bad = [&](const std::string& key, const std::string& why) {
    return tandem::fail(tandem::Errc::invalid_argument, path + ": " + key + ": " + why);
  };
  for (auto&& [k, v] : t)
    if (k != "http" && k != "tandem" && k != "wyoming")
      return bad(std::string(k.str()), "unknown section (expected [http], [tandem], [wyoming])");
  if (auto* tb = t["tandem"].as_table()) {
    for (auto&& [k, v] : *tb) {
      if (k == "bus" && v.is_string()) c.bus = *v.value<std::string>();
      else return bad("tandem." + std::string(k.str()), "unknown key or wrong type (known: bus)");
    }
  }
  if (auto* w = t["wyoming"].as_table()) {
    for (auto&& [kk, v] : *w) {
      const std::string k(kk.str());
      if (k == "listen" && v.is_array()) {
        for (auto&& e : *v.as_array()) {
          auto s = e.value<std::string>();
          if (!s) return bad("wyoming.listen", "expected strings \"HOST:PORT\"");
          c.wyoming_listen.push_back(*s);
        }
      } else if (k == "allow_remote" && v.is_boolean()) {
        c.wyoming_allow_remote = *v.value<bool>();
      } else if (k == "max_connections" && v.is_integer() && *v.value<std::int64_t>() >= 1 && *v.value<std::int64_t>() <= 4096) {
        c.wyoming.max_connections = static_cast<std::size_t>(*v.value<std::int64_t>());
      } else if (k == "idle_timeout" && v.is_string() && tc::parse_duration_ms(*v.value<std::string>()).ok()) {
        c.wyoming.idle_timeout = std::chrono::milliseconds(*tc::parse_duration_ms(*v.value<std::string>()));
      } else {
        return bad("wyoming." + k, "unknown key or wrong value (known: listen, allow_remote, max_connections 1..4096, idle_timeout)");
      }
    }
  }
  auto* h = t["http"].as_table();
  if (!h) return {};
  auto ms = [&](const toml::node& v, std::chrono::milliseconds& out, const std::string& key) -> tandem::Result<void> {
    auto s = v.value<std::string>();
    if (!s) return bad(key, "expected a duration string (\"10s\", \"500ms\")");
    auto d = tc::parse_duration_ms(*s);
    if (!d.ok() || *d == 0 || *d > 3600000) return bad(key, "expected a duration from 1 ms to 1 h");
    out = std::chrono::milliseconds(*d);
    return {};
  };
  auto bytes = [&](const toml::node& v, std::size_t& out, const std::string& key, std::uint64_t lo, std::uint64_t hi) -> tandem::Result<void> {
    std::optional<std::uint64_t> b;
    if (auto s = v.value<std::string>()) {
      auto p = tc::parse_size(*s);
      if (p.ok()) b = *p;
    } else if (auto i = v.value<std::int64_t>(); i && *i >= 0) {
      b = static_cast<std::uint64_t>(*i);
    }
    if (!b || *b < lo || *b > hi) return bad(key, "expected a size from " + tc::format_bytes(lo) + " to " + tc::format_bytes(hi));
    out = static_cast<std::size_t>(*b);
    return {};
  };
  auto count = [&](const toml::node& v, std::size_t& out, const std::string& key, std::int64_t lo, std::int64_t hi) -> tandem::Result<void> {
    auto i = v.value<std::int64_t>();
    if (!i || *i < lo || *i > hi) return bad(key, "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
    out = static_cast<std::size_t>(*i);
    return {};
  };
  for (auto&& [kk, v] : *h) {
    const std::string k(kk.str());
    const std::string key = "http." + k;
    tandem::Result<void> r{};
    if (k == "listen") {
      auto* a = v.as_array();
      if (!a) return bad(key, "expected an array of \"HOST:PORT\"");
      c.listen.clear();
      for (auto&& e : *a) {
        auto s = e.value<std::string>();
        if (!s) return bad(key, "expected strings");
        c.listen.push_back(*s);
      }
    } else if (k == "unix_socket" && v.is_string()) {
      c.unix_socket = *v.value<std::string>();
    } else if (k == "api_keys_file" && v.is_string()) {
      c.api_keys_file = *v.value<std::string>();
    } else if (k == "loopback_without_key" && v.is_boolean()) {
      c.loopback_without_key = *v.value<bool>();
    } else if (k == "cors_origins") {
      auto* a = v.as_array();
      if (!a) return bad(key, "expected an array of origins");
      for (auto&& e : *a) {
        auto s = e.value<std::string>();
        if (!s || s->empty()) return bad(key, "expected non-empty strings");
        c.cors_origins.push_back(*s);
      }
    } else if (k == "max_body_bytes") {
      r = bytes(v, c.gateway.max_body_bytes, key, 1024, 1ull << 30);
    } else if (k == "max_audio_bytes") {
      r = bytes(v, c.gateway.max_audio_bytes, key, 1024, 4ull << 30);
    } else if (k == "max_header_bytes") {
      r = bytes(v, c.limits.header_bytes, key, 1024, 1u << 20);
    } else if (k == "max_pending_bytes") {
      r = bytes(v, c.limits.max_pending_bytes, key, 64 * 1024, 1ull << 30);
    } else if (k == "header_timeout") {
      r = ms(v, c.limits.header_timeout, key);
    } else if (k == "body_timeout") {
      r = ms(v, c.limits.body_timeout, key);
    } else if (k == "idle_timeout") {
      r = ms(v, c.limits.idle_timeout, key);
    } else if (k == "write_timeout") {
      r = ms(v, c.limits.write_timeout, key);
    } else if (k == "max_connections") {
      r = count(v, c.limits.max_connections, key, 1, 65536);
    } else if (k == "max_streams_per_client") {
      r = count(v, c.gateway.max_streams_per_client, key, 1, 65536);
    } else {
      return bad(key, "unknown key or wrong type (tandem-http(8) lists the keys)");
    }
    if (!r.ok()) return r;
  }
  return {};
}

bool split_host_port(const std::string& hp, std::string& host, std::uint16_t& port) {
  const auto colon = hp.rfind(':');
  if (colon == std::string::npos) return false;
  host = hp.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string p = hp.substr(colon + 1);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  const unsigned long v = std::stoul(p);
  if (v == 0 || v > 65535) return false;
  port = static_cast<std::uint16_t>(v);
  return !host.empty();
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_path;
  bool config_given = false, check_only = false;
  std::vector<std::string> listen_args, wyoming_args;
  std::optional<std::string> unix_arg, bus_arg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "tandem-http: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--config") config_path = next(), config_given = true;
    else if (a == "--listen") listen_args.push_back(next());
    else if (a == "--unix") unix_arg = next();
    else if (a == "--wyoming") wyoming_args.push_back(next());
    else if (a == "--bus") bus_arg = next();
    else if (a == "--check-config") check_only = true;
    else if (a == "--version") return std::printf("tandem-http %s\n", TANDEM_VERSION), 0;
    else if (a == "--help" || a == "-h") return usage(0);
    else if (a == "--hash-key") {
      const std::string name = next();
      std::string key;
      std::getline(std::cin, key);
      if (key.empty()) return std::fprintf(stderr, "tandem-http: no key on standard input\n"), 2;
      if (!th::KeyRing::parse(th::KeyRing::line_for(name, key)).ok())
        return std::fprintf(stderr, "tandem-http: the name must be 1 to 64 of A-Z a-z 0-9 . _ -\n"), 2;
      std::printf("%s\n", th::KeyRing::line_for(name, key).c_str());
      return 0;
    } else {
      std::fprintf(stderr, "tandem-http: unknown argument %s\n", a.c_str());
      return usage(2);
    }
  }
  Config cfg;
  if (!config_given && ::access(kDefaultConfig, R_OK) == 0) config_path = kDefaultConfig;
  if (!config_path.empty()) {
    if (auto r = load_config(config_path, cfg); !r.ok()) {
      std::fprintf(stderr, "tandem-http: %s\n", r.error().message.c_str());
      return 1;
    }
  }
  if (!listen_args.empty()) cfg.listen = listen_args;
  if (unix_arg) cfg.unix_socket = *unix_arg;
  if (!wyoming_args.empty()) cfg.wyoming_listen = wyoming_args;
  if (bus_arg) cfg.bus = *bus_arg;
  auto bus = tc::parse_bus_spec(cfg.bus);
  if (!bus.ok()) return std::fprintf(stderr, "tandem-http: bus: %s\n", bus.error().message.c_str()), 1;
  if (const char* env = std::getenv("TANDEM_BUS"); env && !bus_arg && config_path.empty()) {
    auto b = tc::parse_bus_spec(env);
    if (!b.ok()) return std::fprintf(stderr, "tandem-http: TANDEM_BUS: %s\n", b.error().message.c_str()), 1;
    bus = b;
  }
  std::optional<th::KeyRing> keys;
  if (!cfg.api_keys_file.empty()) {
    auto k = th::KeyRing::load(cfg.api_keys_file);
    if (!k.ok()) return std::fprintf(stderr, "tandem-http: %s\n", k.error().message.c_str()), 1;
    keys = std::move(*k);
  }

  // Listening sockets: from systemd (tandem-http.socket), else bound here.
  std::vector<int> fds, wyoming_fds;
  char** names = nullptr;
  const int passed = sd_listen_fds_with_names(1, &names);
  for (int i = 0; i < passed; ++i) {
    // tandem-wyoming.socket names its socket "wyoming" (FileDescriptorName=); every other one is HTTP.
    const bool wy = names && names[i] && std::string(names[i]) == "wyoming";
    (wy ? wyoming_fds : fds).push_back(SD_LISTEN_FDS_START + i);
  }
  if (names) {
    for (int i = 0; i < passed; ++i) std::free(names[i]);
    std::free(names);
  }
  if (passed <= 0 && !check_only) {
    for (const auto& hp : cfg.wyoming_listen) {
      std::string host;
      std::uint16_t port = 0;
      if (!split_host_port(hp, host, port))
        return std::fprintf(stderr, "tandem-http: wyoming.listen: expected HOST:PORT, got '%s'\n", hp.c_str()), 1;
      auto fd = th::listen_tcp(host, port);
      if (!fd.ok()) return std::fprintf(stderr, "tandem-http: %s\n", fd.error().message.c_str()), 1;
      wyoming_fds.push_back(*fd);
    }
  }
  if (passed <= 0 && !check_only) {
    for (const auto& hp : cfg.listen) {
      std::string host;
      std::uint16_t port = 0;
      if (!split_host_port(hp, host, port))
        return std::fprintf(stderr, "tandem-http: listen: expected HOST:PORT, got '%s'\n", hp.c_str()), 1;
      auto fd = th::listen_tcp(host, port);
      if (!fd.ok()) return std::fprintf(stderr, "tandem-http: %s\n", fd.error().message.c_str()), 1;
      fds.push_back(*fd);
    }
    if (!cfg.unix_socket.empty()) {
      auto fd = th::listen_unix(cfg.unix_socket);
      if (!fd.ok()) return std::fprintf(stderr, "tandem-http: %s\n", fd.error().message.c_str()), 1;
      fds.push_back(*fd);
    }
  }
  // Beyond loopback, keys are required: an open port on the LAN must not serve anyone who finds it.
  for (int fd : wyoming_fds) {
    if (!th::is_loopback_listener(fd) && !cfg.wyoming_allow_remote) {
      std::fprintf(stderr,
                   "tandem-http: refusing to serve Wyoming on a non-loopback address: the protocol has no "
                   "authentication; set wyoming.allow_remote = true to accept that\n");
      return 1;
    }
  }
  for (int fd : fds) {
    if (!th::is_loopback_listener(fd) && (!keys || keys->empty())) {
      std::fprintf(stderr,
                   "tandem-http: refusing to serve a non-loopback address without API keys: set http.api_keys_file "
                   "(tandem-http --hash-key NAME makes a line for it)\n");
      return 1;
    }
  }
  // The configured addresses (what --check-config can judge without binding): their form, and the rules for
  // addresses beyond loopback (keys for HTTP, allow_remote for Wyoming).
  auto loopback_host = [](const std::string& h) {
    return h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0;
  };
  for (const auto& [list, what] : {std::pair{&cfg.listen, "listen"}, std::pair{&cfg.wyoming_listen, "wyoming.listen"}}) {
    for (const auto& hp : *list) {
      std::string host;
      std::uint16_t port = 0;
      if (!split_host_port(hp, host, port))
        return std::fprintf(stderr, "tandem-http: %s: expected HOST:PORT, got '%s'\n", what, hp.c_str()), 1;
      if (loopback_host(host)) continue;
      if (list == &cfg.listen && (!keys || keys->empty()))
        return std::fprintf(stderr, "tandem-http: listen: %s is not loopback: set http.api_keys_file (API keys)\n", hp.c_str()), 1;
      if (list == &cfg.wyoming_listen && !cfg.wyoming_allow_remote)
        return std::fprintf(stderr, "tandem-http: wyoming.listen: %s is not loopback and Wyoming has no authentication: "
                                    "set wyoming.allow_remote = true to accept that\n", hp.c_str()), 1;
    }
  }
  if (check_only) {
    std::printf("tandem-http: %s is valid\n", config_path.empty() ? "the default configuration" : config_path.c_str());
    return 0;
  }
  if (fds.empty() && wyoming_fds.empty()) return std::fprintf(stderr, "tandem-http: nothing to listen on\n"), 1;

  ::signal(SIGPIPE, SIG_IGN);
  boost::asio::io_context io;
  th::TandemLink::Options lo;
  lo.bus = *bus;
  th::TandemLink link(lo, [&io](std::function<void()> f) { boost::asio::post(io, std::move(f)); });
  cfg.gateway.cors_origins = cfg.cors_origins;
  cfg.gateway.version = TANDEM_VERSION;
  th::Gateway gateway(link, cfg.gateway);
  gateway.set_defer([&io](std::chrono::milliseconds d, std::function<void()> fn) {
    auto t = std::make_shared<boost::asio::steady_timer>(io, d);
    t->async_wait([t, fn = std::move(fn)](const boost::system::error_code& ec) {
      if (!ec) fn();
    });
  });
  th::AuthPolicy auth;
  auth.keys = keys ? &*keys : nullptr;
  auth.loopback_without_key = cfg.loopback_without_key;
  th::Server server(io, gateway, auth, cfg.limits);
  for (int fd : fds) {
    if (auto r = server.add_listener(fd); !r.ok())
      return std::fprintf(stderr, "tandem-http: %s\n", r.error().message.c_str()), 1;
  }
  th::WyomingServer wyoming(io, link, cfg.wyoming, TANDEM_VERSION);
  for (int fd : wyoming_fds) {
    if (auto r = wyoming.add_listener(fd); !r.ok())
      return std::fprintf(stderr, "tandem-http: wyoming: %s\n", r.error().message.c_str()), 1;
  }
  link.start();
  link.wait_connected(std::chrono::seconds(2));  // READY does not wait for tandemd: /health says 503 until then
  boost::asio::signal_set signals(io, SIGTERM, SIGINT, SIGHUP);
  std::function<void(const boost::system::error_code&, int)> on_signal = [&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {  // no reload: the configuration is read at start (restart the unit to apply changes)
      std::fprintf(stderr, "tandem-http: SIGHUP ignored: restart tandem-http to apply a changed configuration\n");
      return signals.async_wait(on_signal);
    }
    sd_notify(0, "STOPPING=1");
    server.stop();
    wyoming.stop();
    io.stop();
  };
  signals.async_wait(on_signal);
  // STATUS follows the link to tandemd.
  boost::asio::steady_timer status_timer(io);
  bool shown = link.connected();
  std::function<void(const boost::system::error_code&)> on_status = [&](const boost::system::error_code& ec) {
    if (ec) return;
    if (link.connected() != shown) {
      shown = link.connected();
      sd_notifyf(0, "STATUS=serving; tandemd %s", shown ? "connected" : "not reachable (reconnecting)");
      std::fprintf(stderr, "tandem-http: tandemd %s\n", shown ? "connected" : "not reachable (reconnecting)");
    }
    status_timer.expires_after(std::chrono::seconds(1));
    status_timer.async_wait(on_status);
  };
  status_timer.expires_after(std::chrono::seconds(1));
  status_timer.async_wait(on_status);
  std::fprintf(stderr, "tandem-http: serving HTTP on %zu socket(s) and Wyoming on %zu, tandem on %s (%s)\n", fds.size(),
               wyoming_fds.size(),
               bus->describe().c_str(), link.connected() ? "connected" : "not reachable yet");
  sd_notifyf(0, "READY=1\nSTATUS=serving; tandemd %s", link.connected() ? "connected" : "not reachable yet");
  // A handler that throws (a bug: handlers answer errors, they do not throw) is logged and the loop goes on, so one
  // request cannot take the gateway down for everyone.
  while (true) {
    try {
      io.run();
      break;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem-http: internal error in a handler (a bug, please report): %s\n", e.what());
    }
  }
  return 0;
}
