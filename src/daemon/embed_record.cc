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
  std::optional<std::vector<std::int32_t>> ids, lengths;
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
    } else if (k == "tokens" || k == "token_lengths") {
      const auto* l = std::get_if<std::vector<std::int32_t>>(&f.value);
      if (!l) return bad_type(f, "an int32_list");
      (k == "tokens" ? ids : lengths) = *l;
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
                      "' (known: model, texts, tokens, token_lengths, images, idempotency_key, allow_cpu, deadline_ms, "
                      "truncate)");
    }
  }
  if (ids.has_value() != lengths.has_value())
    return fail(Errc::invalid_argument, "embed record: 'tokens' and 'token_lengths' come together");
  if (ids) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < lengths->size(); ++i) {
      const std::int32_t n = (*lengths)[i];
      if (n <= 0 || static_cast<std::size_t>(n) > ids->size() - at)
        return fail(Errc::invalid_argument, "embed record: token_lengths[" + std::to_string(i) + "] is " +
                                                std::to_string(n) + " (each length is positive; they sum to the " +
                                                std::to_string(ids->size()) + " ids of 'tokens')");
      r.tokens.emplace_back(ids->begin() + static_cast<std::ptrdiff_t>(at),
                            ids->begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(n)));
      at += static_cast<std::size_t>(n);
    }
    if (at != ids->size())
      return fail(Errc::invalid_argument, "embed record: token_lengths sum to " + std::to_string(at) + ", 'tokens' has " +
                                              std::to_string(ids->size()) + " ids");
    for (std::size_t i = 0; i < ids->size(); ++i)
      if ((*ids)[i] < 0)
        return fail(Errc::invalid_argument, "embed record: tokens[" + std::to_string(i) + "] is negative");
  }
  if (r.texts.empty() && r.tokens.empty() && r.images.empty())
    return fail(Errc::invalid_argument, "embed record: no inputs (give 'texts', 'tokens' and/or 'images')");
  return r;
}

std::vector<std::uint8_t> embed_record(const EmbedRecord& r) {
  ring::RecordWriter w;
  if (!r.model.empty()) w.add("model", std::string_view(r.model));
  if (!r.texts.empty()) w.add("texts", r.texts);
  if (!r.tokens.empty()) {
    std::vector<std::int32_t> ids, lengths;
    for (const auto& t : r.tokens) {
      ids.insert(ids.end(), t.begin(), t.end());
      lengths.push_back(static_cast<std::int32_t>(t.size()));
    }
    w.add("tokens", ids);
    w.add("token_lengths", lengths);
  }
  if (!r.images.empty()) w.add("images", r.images);
  if (r.idempotency_key) w.add("idempotency_key", std::string_view(*r.idempotency_key));
  if (r.allow_cpu) w.add("allow_cpu", *r.allow_cpu);
  if (r.deadline_ms) w.add("deadline_ms", *r.deadline_ms);
  if (r.truncate) w.add("truncate", *r.truncate);
  return w.take();
}

}  // namespace tandem::daemon
