// libFuzzer target: an HTTP request body -> Tandem request mapping (docs/http.md), for every endpoint that parses
// a body: OpenAI chat/completions/embeddings, Ollama chat/generate/embed/embeddings. The first byte picks the
// parser; the rest is the body. Whatever is accepted is mapped on (plan_embed) and its error or value rendered, so
// the shapes are exercised too. Built with -Dfuzz=true by clang (scripts/fuzz.sh --target http).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "http/audio.h"
#include "http/requests.h"
#include "http/wyoming.h"
#include "http/responses.h"

using namespace tandem::http;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  BodyLimits limits;
  if (data[0] >= 0xe0 && data[0] < 0xf0) {  // a Wyoming byte stream through the reader and one session
    WyomingReader r;
    WyomingSession s;
    if (!r.feed(body).ok()) return 0;
    for (int i = 0; i < 1000; ++i) {
      auto e = r.next();
      if (!e.ok() || !*e) break;
      for (const auto& a : s.on_event(**e))
        if (a.kind == WyomingAction::Kind::send || a.kind == WyomingAction::Kind::close) (void)wyoming_encode(a.event);
    }
    return 0;
  }
  if (data[0] >= 0xf0) {  // a transcription upload (multipart) with a fixed boundary
    auto r = parse_transcription("multipart/form-data; boundary=B0", body, data[0] & 1);
    if (r.ok()) (void)transcript_body(*r, "t", {}, {}, {});
    return 0;
  }
  switch (data[0] % 7) {
    case 0: case 1: case 2: case 3: {
      auto r = data[0] % 7 == 0   ? parse_openai_chat(body, limits)
               : data[0] % 7 == 1 ? parse_openai_completion(body, limits)
               : data[0] % 7 == 2 ? parse_ollama_chat(body, limits)
                                  : parse_ollama_generate(body, limits);
      if (!r.ok()) {
        (void)error_json(*r.error, Flavor::openai).dump();
        (void)error_json(*r.error, Flavor::ollama).dump();
      } else {
        ResponseMeta m;
        m.api = r->api;
        m.model = r->model;
        JobView v;
        (void)completion_body(m, v).dump();
      }
      break;
    }
    default: {
      auto r = data[0] % 7 == 4 ? parse_openai_embeddings(body, limits) : parse_ollama_embed(body, data[0] % 7 == 6, limits);
      if (r.ok()) {
        auto p = plan_embed(*r);
        if (p.order.size() != r->inputs.size()) __builtin_trap();
      } else {
        (void)error_json(*r.error, Flavor::openai).dump();
      }
      break;
    }
  }
  return 0;
}
