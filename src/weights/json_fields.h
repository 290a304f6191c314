// Private to src/weights: typed access to the keys of untrusted JSON objects, shared by the config parsers
// (model_config.cc) and the directory reader (model_dir.cc). Everything is in an anonymous namespace: each
// including file gets its own copy. Not installed.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include "core/result.h"
#include "weights/json_util.h"
#include "weights/model_limits.h"

namespace tandem::weights {
namespace {

using detail::Json;
using namespace limits;  // the bounds shared with GGUF metadata (weights/model_limits.h)

std::string num_str(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string show(const Json& v) {
  if (v.is_number() || v.is_boolean() || v.is_null()) return v.dump();
  if (v.is_string() && v.get_ref<const std::string&>().size() <= 64) return v.dump();
  return std::string(detail::json_kind(v));
}

// Typed access to the keys of one JSON object, with messages "<origin>: <key> ...".
class Fields {
 public:
  Fields(const Json& obj, std::string origin, std::string prefix = "")
      : obj_(obj), origin_(std::move(origin)), prefix_(std::move(prefix)) {}

  const std::string& origin() const { return origin_; }
  std::string key_name(const char* key) const { return prefix_ + key; }

  // Present and not null.
  const Json* get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  // Present, null or not.
  bool present(const char* key) const { return obj_.find(key) != obj_.end(); }

  Failure error(Errc code, const char* key, const std::string& what) const {
    return fail(code, origin_ + ": " + key_name(key) + " " + what);
  }

  Result<std::int64_t> integer(const char* key, std::int64_t lo, std::int64_t hi) const {
    const Json* v = get(key);
    if (v == nullptr) return error(Errc::format_error, key, "is missing");
    return integer_value(key, *v, lo, hi);
  }
  Result<std::optional<std::int64_t>> opt_integer(const char* key, std::int64_t lo, std::int64_t hi) const {
    const Json* v = get(key);
    if (v == nullptr) return std::optional<std::int64_t>{};
    auto r = integer_value(key, *v, lo, hi);
    if (!r) return fail(std::move(r).error());
    return std::optional<std::int64_t>{*r};
  }
  Result<std::int64_t> integer_value(const char* key, const Json& v, std::int64_t lo, std::int64_t hi) const {
    const auto i = detail::json_int(v);
    if (!i || *i < lo || *i > hi) {
      return error(Errc::format_error, key,
                   "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + show(v));
    }
    return *i;
  }

  // A finite number with lo (<|<=) x <= hi.
  Result<std::optional<double>> opt_number(const char* key, double lo, bool lo_inclusive, double hi) const {
    const Json* v = get(key);
    if (v == nullptr) return std::optional<double>{};
    const double x = v->is_number() ? v->get<double>() : NAN;
    if (!v->is_number() || !std::isfinite(x) || (lo_inclusive ? x < lo : x <= lo) || x > hi) {
      return error(Errc::format_error, key,
                   std::string("must be a number in ") + (lo_inclusive ? "[" : "(") + num_str(lo) + ", " + num_str(hi) +
                       "], got " + show(*v));
    }
    return std::optional<double>{x};
  }
  Result<double> number(const char* key, double lo, bool lo_inclusive, double hi) const {
    auto r = opt_number(key, lo, lo_inclusive, hi);
    if (!r) return fail(std::move(r).error());
    if (!r->has_value()) return error(Errc::format_error, key, "is missing");
    return **r;
  }

  Result<std::optional<bool>> opt_bool(const char* key) const {
    const Json* v = get(key);
    if (v == nullptr) return std::optional<bool>{};
    if (!v->is_boolean()) return error(Errc::format_error, key, "must be a boolean, got " + show(*v));
    return std::optional<bool>{v->get<bool>()};
  }

  Result<std::optional<std::string>> opt_string(const char* key) const {
    const Json* v = get(key);
    if (v == nullptr) return std::optional<std::string>{};
    if (!v->is_string()) return error(Errc::format_error, key, "must be a string, got " + show(*v));
    return std::optional<std::string>{v->get<std::string>()};
  }

  // An int, an array of ints, or null/absent (empty).
  Result<std::vector<int>> token_ids(const char* key, std::int64_t max_id) const {
    std::vector<int> out;
    const Json* v = get(key);
    if (v == nullptr) return out;
    auto one = [&](const Json& x) -> Status {
      const auto i = detail::json_int(x);
      if (!i || *i < 0 || *i > max_id) {
        return error(Errc::format_error, key,
                     "must be token ids in [0, " + std::to_string(max_id) + "], got " + show(x));
      }
      out.push_back(static_cast<int>(*i));
      return {};
    };
    if (v->is_array()) {
      for (const auto& x : *v) TANDEM_TRY(one(x));
    } else {
      TANDEM_TRY(one(*v));
    }
    return out;
  }

 private:
  const Json& obj_;
  std::string origin_;
  std::string prefix_;
};

#define ASSIGN_OR_RETURN(lhs, expr)                        \
  do {                                                     \
    auto _r = (expr);                                      \
    if (!_r) return ::tandem::fail(std::move(_r).error()); \
    lhs = std::move(*_r);                                  \
  } while (0)

Result<Json> parse_object(std::string_view text, const std::string& origin) {
  auto j = detail::parse_json(text, origin);
  if (!j) return fail(std::move(j).error());
  if (!j->is_object()) {
    return fail(Errc::format_error, origin + ": must be a JSON object, got " + std::string(detail::json_kind(*j)));
  }
  return std::move(*j);
}

}  // namespace
}  // namespace tandem::weights
