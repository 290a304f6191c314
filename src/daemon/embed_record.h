// The ring's embed record (docs/rings.md "Embed record", ABI 1.1): the inputs and options of one Embed call as a
// ring client writes them. Pure (no service, no D-Bus): the ring hub turns the result into a Service EmbedRequest.
// Every field is checked here — type, unknown key, at least one input — with invalid_argument naming the field; what
// depends on the model and on [embedding] limits (input count, bytes, decoding) is the service's to check.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "ring/record.h"

namespace tandem::daemon {

struct EmbedRecord {
  std::string model;  // "" = the default embedding model
  std::vector<std::string> texts;
  std::vector<std::vector<std::int32_t>> tokens;  // token-id inputs (on the ring: 'tokens' + 'token_lengths')
  std::vector<std::vector<std::uint8_t>> images;  // encoded JPEG/PNG files
  std::optional<std::string> idempotency_key;
  std::optional<bool> allow_cpu;
  std::optional<std::uint64_t> deadline_ms;
  std::optional<bool> truncate;
};

// Keys: model (string), texts (string_list), tokens (int32_list: the token-id inputs one after another) with
// token_lengths (int32_list: each input's length, in order; they sum to the length of tokens), images (bytes_list),
// idempotency_key (string), allow_cpu (boolean), deadline_ms (uint64, or int64 >= 0), truncate (boolean). Errors:
// invalid_argument (unknown key, wrong type, negative deadline or id, lengths that are not positive or do not sum
// to the ids, one of tokens/token_lengths without the other, no inputs).
Result<EmbedRecord> embed_from_record(const std::vector<ring::Field>& fields);

// The record a client writes for these inputs (the inverse; for clients and tests).
std::vector<std::uint8_t> embed_record(const EmbedRecord& r);

}  // namespace tandem::daemon
