#include "daemon/embed_record.h"

#include <string_view>

namespace tandem::daemon {

namespace {

Failure bad_type(const ring::Field& f, const char* want) {
  return fail(Errc::invalid_argument, "embed record: '" + f.key + "' must be " + want + ", got " +
                                          std::string(ring::field_type_name(f.value)));
}

}  // namespace

Result<EmbedRecord> embed_from_record(const std::vector<ring::Field>& fields) {
  EmbedRecord r;
  for (const auto& f : fields) {
    const std::string_view k = f.key;
    if (k == "model" || k == "idempotency_key") {
      const auto* s = std::get_if<std::string>(&f.value);
      if (!s) return bad_type(f, "a string");
      if (k == "model") r.model = *s;
      else r.idempotency_key = *s;
    } else if (k == "texts") {
      const auto* l = std::get_if<std::vector<std::string>>(&f.value);
      if (!l) return bad_type(f, "a string_list");
      r.texts = *l;
    } else if (k == "images") {
      const auto* l = std::get_if<ring::ByteList>(&f.value);
      if (!l) return bad_type(f, "a bytes_list");
      r.images = *l;
    } else if (k == "allow_cpu" || k == "truncate") {
      const auto* b = std::get_if<bool>(&f.value);
      if (!b) return bad_type(f, "a boolean");
      (k == "allow_cpu" ? r.allow_cpu : r.truncate) = *b;
    } else if (k == "deadline_ms") {
      if (const auto* u = std::get_if<std::uint64_t>(&f.value)) {
        r.deadline_ms = *u;
      } else if (const auto* i = std::get_if<std::int64_t>(&f.value)) {
        if (*i < 0) return fail(Errc::invalid_argument, "embed record: 'deadline_ms' must be >= 0, got " + std::to_string(*i));
        r.deadline_ms = static_cast<std::uint64_t>(*i);
      } else {
        return bad_type(f, "an unsigned integer");
      }
    } else {
      return fail(Errc::invalid_argument,
                  "embed record: unknown key '" + f.key +
                      "' (known: model, texts, images, idempotency_key, allow_cpu, deadline_ms, truncate)");
    }
  }
  if (r.texts.empty() && r.images.empty())
    return fail(Errc::invalid_argument, "embed record: no inputs (give 'texts' and/or 'images')");
  return r;
}

std::vector<std::uint8_t> embed_record(const EmbedRecord& r) {
  ring::RecordWriter w;
  if (!r.model.empty()) w.add("model", std::string_view(r.model));
  if (!r.texts.empty()) w.add("texts", r.texts);
  if (!r.images.empty()) w.add("images", r.images);
  if (r.idempotency_key) w.add("idempotency_key", std::string_view(*r.idempotency_key));
  if (r.allow_cpu) w.add("allow_cpu", *r.allow_cpu);
  if (r.deadline_ms) w.add("deadline_ms", *r.deadline_ms);
  if (r.truncate) w.add("truncate", *r.truncate);
  return w.take();
}

}  // namespace tandem::daemon
