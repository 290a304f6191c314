#include "daemon/submit_options.h"

#include <limits>
#include <string>

namespace tandem::daemon {

void SubmitOptions::override_with(const SubmitOptions& o) {
#define TANDEM_OVR(f) \
  if (o.f) f = o.f;
  TANDEM_OVR(max_tokens) TANDEM_OVR(temperature) TANDEM_OVR(top_k) TANDEM_OVR(top_p) TANDEM_OVR(repetition_penalty)
  TANDEM_OVR(seed) TANDEM_OVR(stop) TANDEM_OVR(idempotency_key) TANDEM_OVR(side_effects) TANDEM_OVR(allow_cpu)
  TANDEM_OVR(allow_reduce) TANDEM_OVR(allow_fallback_model) TANDEM_OVR(deadline_ms) TANDEM_OVR(prefill_chunk)
  TANDEM_OVR(resume_tokens) TANDEM_OVR(stream) TANDEM_OVR(enable_thinking)
#undef TANDEM_OVR
}

std::map<std::string, bool> SubmitOptions::template_flags() const {
  std::map<std::string, bool> f;
  if (enable_thinking) f["enable_thinking"] = *enable_thinking;
  return f;
}

namespace {

enum class Kind { u32, u64, f64, boolean, string, string_list, int32_list };

struct Spec {
  std::string_view name;
  Kind kind;
  std::uint64_t max;  // integers: inclusive upper bound; strings: bytes; lists: elements
};

constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();

constexpr Spec kSpecs[] = {
    {"max_tokens", Kind::u32, 1u << 20},
    {"temperature", Kind::f64, 0},
    {"top_k", Kind::u32, 1000000},
    {"top_p", Kind::f64, 0},
    {"repetition_penalty", Kind::f64, 0},
    {"seed", Kind::u64, kU64Max},
    {"stop", Kind::string_list, 0},  // count and lengths: the service (they depend on the model)
    {"idempotency_key", Kind::string, 256},
    {"side_effects", Kind::boolean, 0},
    {"allow_cpu", Kind::boolean, 0},
    {"allow_reduce", Kind::boolean, 0},
    {"allow_fallback_model", Kind::boolean, 0},
    {"deadline_ms", Kind::u64, 7ull * 24 * 3600 * 1000},
    {"prefill_chunk", Kind::u32, 1u << 20},
    {"resume_tokens", Kind::int32_list, 1u << 20},
    {"stream", Kind::boolean, 0},
    {"enable_thinking", Kind::boolean, 0},
};

const Spec* spec_of(std::string_view key) {
  for (const auto& s : kSpecs)
    if (s.name == key) return &s;
  return nullptr;
}

std::string got(const OptionValue& v, std::string_view got_type) {
  if (!got_type.empty()) return std::string(got_type);
  return std::string(ring::field_type_name(v));
}

Failure bad_type(std::string_view key, const char* want, const OptionValue& v, std::string_view got_type) {
  return fail(Errc::invalid_argument,
              "option '" + std::string(key) + "' must be " + want + ", got " + got(v, got_type));
}

Result<std::uint64_t> as_uint(std::string_view key, const OptionValue& v, std::uint64_t max, std::string_view got_type) {
  std::uint64_t u = 0;
  if (const auto* p = std::get_if<std::uint64_t>(&v)) {
    u = *p;
  } else if (const auto* s = std::get_if<std::int64_t>(&v)) {
    if (*s < 0)
      return fail(Errc::invalid_argument, "option '" + std::string(key) + "' must be >= 0, got " + std::to_string(*s));
    u = static_cast<std::uint64_t>(*s);
  } else {
    return bad_type(key, "an integer", v, got_type);
  }
  if (u > max)
    return fail(Errc::invalid_argument, "option '" + std::string(key) + "' must be in [0," + std::to_string(max) +
                                            "], got " + std::to_string(u));
  return u;
}

}  // namespace

std::string_view known_options() {
  return "max_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop, idempotency_key, side_effects, "
         "allow_cpu, allow_reduce, allow_fallback_model, deadline_ms, prefill_chunk, resume_tokens, stream, "
         "enable_thinking";
}

bool is_option(std::string_view key) { return spec_of(key) != nullptr; }

Status apply_option(SubmitOptions& o, std::string_view key, const OptionValue& v, std::string_view got_type) {
  const Spec* spec = spec_of(key);
  if (!spec)
    return fail(Errc::invalid_argument, "unknown option '" + std::string(key.substr(0, 64)) + "' (known: " +
                                            std::string(known_options()) + ")");
  switch (spec->kind) {
    case Kind::u32:
    case Kind::u64: {
      auto x = as_uint(key, v, spec->max, got_type);
      if (!x) return fail(std::move(x).error());
      if (key == "max_tokens") o.max_tokens = static_cast<std::uint32_t>(*x);
      else if (key == "top_k") o.top_k = static_cast<std::uint32_t>(*x);
      else if (key == "prefill_chunk") o.prefill_chunk = static_cast<std::uint32_t>(*x);
      else if (key == "seed") o.seed = *x;
      else o.deadline_ms = *x;
      return {};
    }
    case Kind::f64: {
      double d;
      if (const auto* p = std::get_if<double>(&v)) {
        d = *p;
      } else if (const auto* u = std::get_if<std::uint64_t>(&v)) {
        d = static_cast<double>(*u);  // the range is the service's (it knows each option's bounds)
      } else if (const auto* i = std::get_if<std::int64_t>(&v)) {
        d = static_cast<double>(*i);
      } else {
        return bad_type(key, "a number", v, got_type);
      }
      (key == "temperature" ? o.temperature : key == "top_p" ? o.top_p : o.repetition_penalty) = d;
      return {};
    }
    case Kind::boolean: {
      const auto* b = std::get_if<bool>(&v);
      if (!b) return bad_type(key, "a boolean", v, got_type);
      (key == "side_effects"           ? o.side_effects
       : key == "allow_cpu"            ? o.allow_cpu
       : key == "allow_reduce"         ? o.allow_reduce
       : key == "allow_fallback_model" ? o.allow_fallback_model
       : key == "enable_thinking"      ? o.enable_thinking
                                       : o.stream) = *b;
      return {};
    }
    case Kind::string: {
      const auto* s = std::get_if<std::string>(&v);
      if (!s) return bad_type(key, "a string", v, got_type);
      if (s->size() > spec->max)
        return fail(Errc::invalid_argument,
                    "option '" + std::string(key) + "' must be at most " + std::to_string(spec->max) + " bytes");
      o.idempotency_key = *s;
      return {};
    }
    case Kind::string_list: {
      const auto* s = std::get_if<std::vector<std::string>>(&v);
      if (!s) return bad_type(key, "an array of strings", v, got_type);
      o.stop = *s;
      return {};
    }
    case Kind::int32_list: {
      const auto* s = std::get_if<std::vector<std::int32_t>>(&v);
      if (!s) return bad_type(key, "an array of int32", v, got_type);
      if (s->size() > spec->max) return fail(Errc::invalid_argument, "resume_tokens: too many tokens");
      o.resume_tokens = *s;
      return {};
    }
  }
  return fail(Errc::internal, "option table");
}

Result<RecordRequest> request_from_record(const std::vector<ring::Field>& fields) {
  RecordRequest r;
  std::size_t options = 0;
  for (const auto& f : fields) {
    if (f.key == "model" || f.key == "prompt") {
      const auto* s = std::get_if<std::string>(&f.value);
      if (!s)
        return fail(Errc::invalid_argument, "'" + f.key + "' must be a string, got " +
                                                std::string(ring::field_type_name(f.value)));
      (f.key == "model" ? r.model : r.prompt) = *s;
    } else if (f.key == "messages") {
      const auto* l = std::get_if<std::vector<std::string>>(&f.value);
      if (!l)
        return fail(Errc::invalid_argument, "'messages' must be a string_list (role, content, role, content, ...)");
      if (l->size() % 2 != 0)
        return fail(Errc::invalid_argument, "'messages' must hold role/content pairs, got an odd count");
      for (std::size_t i = 0; i < l->size(); i += 2) r.messages.emplace_back((*l)[i], (*l)[i + 1]);
    } else {
      if (++options > kMaxOptions) return fail(Errc::invalid_argument, "at most 64 options");
      TANDEM_TRY(apply_option(r.options, f.key, f.value));
    }
  }
  return r;
}

}  // namespace tandem::daemon
