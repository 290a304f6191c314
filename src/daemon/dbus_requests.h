// Reading D-Bus call arguments into service requests: option values with strict types and ranges, file descriptors
// of regular files read with a bound, and the Transcribe call's request. Shared by the D-Bus front end's methods
// (dbus_server.cc). Every argument is untrusted: errors are InvalidArgument naming the option or argument.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <sdbus-c++/sdbus-c++.h>

#include "core/result.h"
#include "daemon/config.h"
#include "daemon/service.h"

namespace tandem::daemon {

// "option 'KEY' must be WANT, got D-Bus type 'GOT'".
Failure bad_type(const std::string& key, const char* want, const std::string& got);
// Any integer D-Bus type → uint64 in [0, max].
Result<std::uint64_t> get_uint(const std::string& key, const sdbus::Variant& v, std::uint64_t max);
// A file passed as a descriptor: read from its offset to the end, at most `max` bytes (one more is read to tell
// "too large" from "exactly max"); `limit_name` names the limit in the error ("[embedding] max_image_bytes"). Only
// regular files (a memfd is one): a pipe or socket could keep the loop thread waiting for ever. The daemon reads
// with its own privileges only what the caller opened.
Result<std::vector<std::uint8_t>> read_regular_fd(int fd, std::uint64_t max, const std::string& limit_name);
// Transcribe(model, audio_fd ah, audio ay, options a{sv}): exactly one of audio_fd (one descriptor) and audio
// (non-empty bytes); options language s, translate b, timestamps b, temperature d, temperature_fallback b, seed t,
// initial_prompt s, condition_on_previous_text b, idempotency_key s, allow_cpu b, deadline_ms t.
Result<TranscribeRequest> transcribe_request(std::string model, const std::vector<sdbus::UnixFd>& audio_fd,
                                             std::vector<std::uint8_t> audio,
                                             const std::map<std::string, sdbus::Variant>& options,
                                             const SpeechConfig& limits);

}  // namespace tandem::daemon
