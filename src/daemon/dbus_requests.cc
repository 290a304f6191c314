#include "daemon/dbus_requests.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>

namespace tandem::daemon {

Failure bad_type(const std::string& key, const char* want, const std::string& got) {
  return fail(Errc::invalid_argument, "option '" + key + "' must be " + want + ", got D-Bus type '" + got + "'");
}

Result<std::uint64_t> get_uint(const std::string& key, const sdbus::Variant& v, std::uint64_t max) {
  const std::string t = v.peekValueType();
  std::int64_t s = 0;
  std::uint64_t u = 0;
  bool is_signed = false;
  if (t == "y") u = v.get<std::uint8_t>();
  else if (t == "q") u = v.get<std::uint16_t>();
  else if (t == "u") u = v.get<std::uint32_t>();
  else if (t == "t") u = v.get<std::uint64_t>();
  else if (t == "n") { s = v.get<std::int16_t>(); is_signed = true; }
  else if (t == "i") { s = v.get<std::int32_t>(); is_signed = true; }
  else if (t == "x") { s = v.get<std::int64_t>(); is_signed = true; }
  else return bad_type(key, "an integer", t);
  if (is_signed) {
    if (s < 0) return fail(Errc::invalid_argument, "option '" + key + "' must be >= 0, got " + std::to_string(s));
    u = static_cast<std::uint64_t>(s);
  }
  if (u > max)
    return fail(Errc::invalid_argument, "option '" + key + "' must be in [0," + std::to_string(max) + "], got " +
                                            std::to_string(u));
  return u;
}

Result<std::vector<std::uint8_t>> read_regular_fd(int fd, std::uint64_t max, const std::string& limit_name) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return fail(Errc::invalid_argument, std::string("cannot stat it: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return fail(Errc::invalid_argument, "not a regular file (pipes and sockets are refused)");
  std::vector<std::uint8_t> out;
  std::uint8_t buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(Errc::invalid_argument, std::string("cannot read it: ") + std::strerror(errno));
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
    if (out.size() > max)
      return fail(Errc::invalid_argument, "over " + limit_name + " (" + std::to_string(max) + " bytes)");
  }
  if (out.empty()) return fail(Errc::invalid_argument, "it is empty (0 bytes from its offset)");
  return out;
}

Result<TranscribeRequest> transcribe_request(std::string model, const std::vector<sdbus::UnixFd>& audio_fd,
                                             std::vector<std::uint8_t> audio,
                                             const std::map<std::string, sdbus::Variant>& options,
                                             const SpeechConfig& limits) {
  TranscribeRequest r;
  r.model = std::move(model);
  auto& o = r.options;
  for (const auto& [k, v] : options) {
    const std::string t = v.peekValueType();
    if (k == "idempotency_key" || k == "language" || k == "initial_prompt") {
      if (t != "s") return bad_type(k, "a string", t);
      const std::string s = v.get<std::string>();
      if (k == "idempotency_key") o.idempotency_key = s;
      else if (k == "language") o.language = s;
      else o.initial_prompt = s;
    } else if (k == "allow_cpu" || k == "translate" || k == "timestamps" || k == "temperature_fallback" ||
               k == "condition_on_previous_text") {
      if (t != "b") return bad_type(k, "a boolean", t);
      const bool b = v.get<bool>();
      if (k == "allow_cpu") o.allow_cpu = b;
      else if (k == "translate") o.translate = b;
      else if (k == "timestamps") o.timestamps = b;
      else if (k == "temperature_fallback") o.temperature_fallback = b;
      else o.condition_on_previous_text = b;
    } else if (k == "temperature") {
      if (t != "d") return bad_type(k, "a double", t);
      const double d = v.get<double>();
      if (!std::isfinite(d) || d < 0 || d > 2)
        return fail(Errc::invalid_argument, "option 'temperature' must be in [0,2], got " + std::to_string(d));
      o.temperature = d;
    } else if (k == "seed") {
      auto u = get_uint(k, v, std::numeric_limits<std::uint64_t>::max());
      if (!u) return fail(std::move(u).error());
      o.seed = *u;
    } else if (k == "deadline_ms") {
      auto u = get_uint(k, v, 7ull * 24 * 3600 * 1000);
      if (!u) return fail(std::move(u).error());
      o.deadline_ms = *u;
    } else {
      return fail(Errc::invalid_argument,
                  "unknown Transcribe option '" + k.substr(0, 64) +
                      "' (allowed: language, translate, timestamps, temperature, temperature_fallback, seed, "
                      "initial_prompt, condition_on_previous_text, idempotency_key, allow_cpu, deadline_ms)");
    }
  }
  if (audio_fd.size() > 1)
    return fail(Errc::invalid_argument, "audio_fd holds " + std::to_string(audio_fd.size()) + " descriptors; give one");
  if (audio_fd.empty() == audio.empty())
    return fail(Errc::invalid_argument, audio_fd.empty() ? "no audio: give audio_fd (one descriptor) or audio (bytes)"
                                                         : "give audio_fd or audio, not both");
  if (!audio_fd.empty()) {
    auto bytes = read_regular_fd(audio_fd[0].get(), limits.max_audio_bytes, "[speech] max_audio_bytes");
    if (!bytes) return fail(Errc::invalid_argument, "audio_fd[0]: " + bytes.error().message);
    r.audio = std::make_shared<const std::vector<std::uint8_t>>(std::move(bytes).value());
    r.audio_name = "audio_fd[0]";
  } else {
    r.audio = std::make_shared<const std::vector<std::uint8_t>>(std::move(audio));
    r.audio_name = "audio";
  }
  return r;
}

}  // namespace tandem::daemon
