// HTTP request bodies -> Tandem requests (docs/http.md "What each endpoint accepts"): the OpenAI chat/completions/
// embeddings bodies and Ollama's chat/generate/embed bodies, read strictly (a member Tandem does not implement is a
// 400 naming it, never ignored). Pure: strings in, client::Request / client::EmbedRequest out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "client/requests.h"
#include "http/api.h"

namespace tandem::http {

enum class Api {
  openai_chat,        // POST /v1/chat/completions
  openai_completion,  // POST /v1/completions
  ollama_chat,        // POST /api/chat
  ollama_generate,    // POST /api/generate
};
std::string_view api_name(Api a);
inline Flavor flavor_of(Api a) {
  return a == Api::ollama_chat || a == Api::ollama_generate ? Flavor::ollama : Flavor::openai;
}

// One generation request, mapped.
struct GenerateCall {
  Api api = Api::openai_chat;
  std::string model;        // as the client named it ("" = tandemd's default model: Ollama only)
  client::Request request;  // messages (templated by the model) or a raw prompt, and the options
  bool stream = false;
  bool include_usage = false;             // OpenAI stream_options.include_usage
  std::optional<std::string> user;        // OpenAI `user` (logged with the job, not interpreted)
  bool load_only = false;                 // Ollama: no prompt / messages = "load the model" (answered without a job)
  std::optional<std::string> keep_alive;  // Ollama keep_alive, as given (docs/http.md: what it does today)
  std::optional<std::uint32_t> num_ctx;   // Ollama options.num_ctx: at most the model's context (else 400)
};

ApiResult<GenerateCall> parse_openai_chat(std::string_view body, const BodyLimits& limits = {});
ApiResult<GenerateCall> parse_openai_completion(std::string_view body, const BodyLimits& limits = {});
ApiResult<GenerateCall> parse_ollama_chat(std::string_view body, const BodyLimits& limits = {});
ApiResult<GenerateCall> parse_ollama_generate(std::string_view body, const BodyLimits& limits = {});

// One embedding input: a text, a text as token ids (the OpenAI API's token arrays: the model's vocabulary ids,
// without special tokens), or an image (JPEG/PNG bytes, from a data URL) for a CLIP model.
enum class EmbedInputKind { text, tokens, image };
struct EmbedInput {
  EmbedInputKind kind = EmbedInputKind::text;
  std::string text;
  std::vector<std::uint32_t> tokens;
  std::vector<std::uint8_t> bytes;
  bool image() const { return kind == EmbedInputKind::image; }
};

enum class EmbedApi {
  openai,         // POST /v1/embeddings
  ollama_embed,   // POST /api/embed
  ollama_legacy,  // POST /api/embeddings ({"prompt"} -> {"embedding"})
};

struct EmbedCall {
  EmbedApi api = EmbedApi::openai;
  std::string model;
  std::vector<EmbedInput> inputs;  // in the request's order
  bool base64 = false;             // OpenAI encoding_format "base64": little-endian float32, base64
  std::optional<std::uint32_t> dimensions;
  std::optional<bool> truncate;
  std::optional<std::string> keep_alive;
  std::optional<std::string> user;
};

ApiResult<EmbedCall> parse_openai_embeddings(std::string_view body, const BodyLimits& limits = {});
ApiResult<EmbedCall> parse_ollama_embed(std::string_view body, bool legacy, const BodyLimits& limits = {});

// The Embed request for a call: the inputs go to tandemd in its order (texts, token inputs, images);
// `order[i]` is the reply vector index of input i.
struct EmbedPlan {
  client::EmbedRequest request;
  std::vector<std::size_t> order;
};
EmbedPlan plan_embed(const EmbedCall& call);
// tandemd names a bad input by its place in the Embed call ("texts[0]: ...", "tokens[1]: ...", "images[0] is ...");
// the client knows it by its place in the request. The request's index for the input a message starts with, if any.
std::optional<std::size_t> embed_input_index(std::string_view message, const EmbedPlan& plan);

// Base64 (RFC 4648, with padding). decode: nullopt on any character outside the alphabet or bad padding.
std::string base64_encode(const std::uint8_t* data, std::size_t n);
std::optional<std::vector<std::uint8_t>> base64_decode(std::string_view text);

}  // namespace tandem::http
