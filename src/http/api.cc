// Typed API errors, the strict field reader and tandemd error -> HTTP status (api.h).
#include "http/api.h"

#include <cmath>
#include <limits>

#include "client/requests.h"
#include "core/text.h"

namespace tandem::http {

using nlohmann::json;

ApiError invalid_field(std::string param, std::string message) {
  ApiError e;
  e.status = 400;
  e.type = "invalid_request_error";
  e.code = "invalid_value";
  e.message = param.empty() ? std::move(message) : "'" + param + "': " + message;
  e.param = std::move(param);
  return e;
}

ApiError unsupported_field(std::string param, std::string why) {
  ApiError e;
  e.status = 400;
  e.type = "invalid_request_error";
  e.code = "unsupported_parameter";
  e.message = "'" + param + "' is not supported by Tandem" + (why.empty() ? "" : ": " + why) +
              " (it is refused rather than ignored; see docs/http.md)";
  e.param = std::move(param);
  return e;
}

ApiError unknown_model(const std::string& name, const std::vector<std::string>& known) {
  ApiError e;
  e.status = 404;
  e.type = "not_found_error";
  e.code = "model_not_found";
  e.param = "model";
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  e.message = "the model '" + name + "' does not exist on this Tandem" +
              (list.empty() ? std::string(" (it serves no model of this kind)") : " (it serves: " + list + ")");
  return e;
}

ApiError error_from_remote(const client::RemoteError& r) {
  ApiError e;
  e.message = r.message.empty() ? r.short_name() : r.message;
  e.retry_after_ms = r.retry_after_ms;
  if (r.daemon_missing()) {
    e.status = 503;
    e.type = "server_error";
    e.code = "tandemd_unavailable";
    e.message = "tandemd is not running or not reachable on its bus (" + r.short_name() + ")";
    if (!e.retry_after_ms) e.retry_after_ms = 1000;
    return e;
  }
  const std::string n = r.is_tandem() ? r.short_name() : std::string();
  struct Row {
    const char* name;
    int status;
    const char* type;
    const char* code;
  };
  static const Row rows[] = {
      {"InvalidArgument", 400, "invalid_request_error", "invalid_value"},
      {"NotSupported", 400, "invalid_request_error", "unsupported"},
      {"UnknownModel", 404, "not_found_error", "model_not_found"},
      {"UnknownJob", 404, "not_found_error", "job_not_found"},
      {"NotAuthorized", 403, "permission_error", "not_authorized"},
      {"Busy", 503, "server_error", "busy"},
      {"QueueFull", 503, "server_error", "queue_full"},
      {"HostMemory", 503, "server_error", "host_memory"},
      {"Unavailable", 503, "server_error", "unavailable"},
      {"Resumable", 503, "server_error", "resumable"},
      {"Incompatible", 409, "invalid_request_error", "incompatible"},
      {"Duplicate", 409, "invalid_request_error", "duplicate"},
      {"IllegalState", 409, "invalid_request_error", "illegal_state"},
      {"Timeout", 504, "server_error", "timeout"},
      {"Internal", 500, "server_error", "internal"},
  };
  for (const auto& row : rows) {
    if (n == row.name) {
      e.status = row.status;
      e.type = row.type;
      e.code = row.code;
      if (n == "Resumable") e.job = r.job;
      if (e.status == 503 && !e.retry_after_ms) e.retry_after_ms = 1000;
      return e;
    }
  }
  // A bus or library error that is not the daemon missing (a timeout, access denied by the bus policy, ...).
  e.status = r.name == "org.freedesktop.DBus.Error.AccessDenied" ? 403 : r.name.find("Timeout") != std::string::npos ||
                                                                              r.name.find("NoReply") != std::string::npos
                                                                          ? 504
                                                                          : 500;
  e.type = e.status == 403 ? "permission_error" : "server_error";
  e.code = e.status == 403 ? "access_denied" : e.status == 504 ? "timeout" : "internal";
  e.message = r.describe();
  return e;
}

std::string resume_path(std::uint64_t job) { return "/tandem/v1/jobs/" + std::to_string(job) + "/resume"; }

namespace {

// Error texts can quote request bytes (a JSON parser's "last read: ..." cut inside a character, a multipart field
// name): invalid UTF-8 becomes U+FFFD so the error itself can always be written as JSON.
std::string utf8_clean(const std::string& s) {
  if (valid_utf8(s)) return s;
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = 1;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0xf0) n = 4;
    else if (c >= 0xe0) n = 3;
    else if (c >= 0xc0) n = 2;
    if (c < 0x80 || (i + n <= s.size() && valid_utf8(std::string_view(s).substr(i, n)))) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace

json error_json(const ApiError& e, Flavor flavor) {
  json tandem = json::object();
  if (e.retry_after_ms) tandem["retry_after_ms"] = *e.retry_after_ms;
  if (e.job) {
    tandem["job"] = *e.job;
    tandem["resume"] = resume_path(*e.job);
  }
  json out;
  const std::string message = utf8_clean(e.message);
  if (flavor == Flavor::ollama) {
    out = {{"error", message}};
  } else {
    json err = {{"message", message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(utf8_clean(e.param))},
                {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
    out = {{"error", std::move(err)}};
  }
  if (!tandem.empty()) out["tandem"] = std::move(tandem);
  return out;
}

std::string retry_after_seconds(std::uint64_t ms) {
  const std::uint64_t s = ms / 1000 + (ms % 1000 ? 1 : 0);
  return std::to_string(s == 0 ? 1 : s);
}

ApiResult<json> parse_json_object(std::string_view body, const BodyLimits& limits) {
  if (body.empty()) return invalid_field("", "the request body is empty (a JSON object is expected)");
  if (!valid_utf8(body)) return invalid_field("", "the request body is not valid UTF-8");
  if (json_nesting_depth(body, limits.max_json_depth) > limits.max_json_depth)
    return invalid_field("", "the request body nests deeper than " + std::to_string(limits.max_json_depth) + " levels");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& ex) {  // parse_error, and out_of_range for a number beyond double
    return invalid_field("", std::string("the request body is not valid JSON (") + ex.what() + ")");
  }
  if (!j.is_object()) return invalid_field("", "the request body must be a JSON object");
  return j;
}

// ---------------------------------------------------------------------------------------------------------------
// FieldReader

FieldReader::FieldReader(const json& object, std::string where) : obj_(object), where_(std::move(where)) {}

void FieldReader::fail(ApiError e) {
  if (!error_) error_ = std::move(e);
}

const json* FieldReader::take(const char* key) {
  read_.insert(key);
  if (error_) return nullptr;
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

void FieldReader::ignore(const char* key) { read_.insert(key); }

std::optional<std::string> FieldReader::str(const char* key, bool allow_empty) {
  const json* v = take(key);
  if (!v) return std::nullopt;
  if (!v->is_string()) {
    fail(invalid_field(name(key), "expected a string"));
    return std::nullopt;
  }
  auto s = v->get<std::string>();
  if (!allow_empty && s.empty()) {
    fail(invalid_field(name(key), "must not be empty"));
    return std::nullopt;
  }
  return s;
}

std::optional<bool> FieldReader::boolean(const char* key) {
  const json* v = take(key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) {
    fail(invalid_field(name(key), "expected true or false"));
    return std::nullopt;
  }
  return v->get<bool>();
}

std::optional<double> FieldReader::number(const char* key, double lo, double hi) {
  const json* v = take(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) {
    fail(invalid_field(name(key), "expected a number"));
    return std::nullopt;
  }
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    fail(invalid_field(name(key), "must be between " + client::format_count(lo) + " and " + client::format_count(hi)));
    return std::nullopt;
  }
  return d;
}

std::optional<std::uint64_t> FieldReader::uint(const char* key, std::uint64_t lo, std::uint64_t hi) {
  const json* v = take(key);
  if (!v) return std::nullopt;
  std::optional<std::uint64_t> u;
  if (v->is_number_unsigned()) {
    u = v->get<std::uint64_t>();
  } else if (v->is_number_integer()) {
    const auto i = v->get<std::int64_t>();
    if (i >= 0) u = static_cast<std::uint64_t>(i);
  } else if (v->is_number_float()) {
    const double d = v->get<double>();  // 16.0 is an integer to JavaScript clients
    if (std::isfinite(d) && d >= 0 && d == std::floor(d) && d < 1.8e19) u = static_cast<std::uint64_t>(d);
  }
  if (!u || *u < lo || *u > hi) {
    fail(invalid_field(name(key), "expected an integer between " + std::to_string(lo) + " and " + std::to_string(hi)));
    return std::nullopt;
  }
  return u;
}

std::optional<std::vector<std::string>> FieldReader::str_or_list(const char* key, std::size_t max,
                                                                 std::size_t max_bytes) {
  const json* v = take(key);
  if (!v) return std::nullopt;
  std::vector<std::string> out;
  auto add = [&](const json& e) {
    if (!e.is_string()) {
      fail(invalid_field(name(key), "expected a string or an array of strings"));
      return false;
    }
    auto s = e.get<std::string>();
    if (s.empty() || s.size() > max_bytes) {
      fail(invalid_field(name(key), "each entry must be 1 to " + std::to_string(max_bytes) + " bytes"));
      return false;
    }
    out.push_back(std::move(s));
    return true;
  };
  if (v->is_array()) {
    if (v->size() > max) {
      fail(invalid_field(name(key), "at most " + std::to_string(max) + " entries"));
      return std::nullopt;
    }
    for (const auto& e : *v)
      if (!add(e)) return std::nullopt;
  } else if (!add(*v)) {
    return std::nullopt;
  }
  return out;
}

void FieldReader::only(const char* key, const json& allowed, const char* why) {
  const json* v = take(key);
  if (!v) return;
  if (*v != allowed) fail(unsupported_field(name(key), why));
}

std::optional<ApiError> FieldReader::finish(const std::set<std::string>& known_unsupported) {
  if (error_) return error_;
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    if (read_.count(it.key()) || it->is_null()) continue;  // null is absent, whatever the member
    if (known_unsupported.count(it.key())) return unsupported_field(name(it.key().c_str()));
    ApiError e = invalid_field(name(it.key().c_str()), "unknown field (Tandem refuses what it does not know rather than ignore it)");
    e.code = "unknown_parameter";
    return e;
  }
  return std::nullopt;
}

}  // namespace tandem::http
