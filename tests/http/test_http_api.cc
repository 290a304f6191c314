// The gateway's pure half: request bodies -> Tandem requests (accepted, refused as unsupported, refused as invalid),
// tandemd errors -> HTTP status, response shapes, base64, API keys and the metrics text.
#include <gtest/gtest.h>

#include "client/requests.h"
#include "http/api.h"
#include "http/audio.h"
#include "http/multipart.h"
#include "http/wyoming.h"
#include "http/auth.h"
#include "http/metrics.h"
#include "http/requests.h"
#include "http/responses.h"

namespace tandem::http {
namespace {

using nlohmann::json;

struct Refusal {
  const char* name;
  const char* body;
  int status;
  const char* param;
  const char* code;
};

class OpenAiChatRefusals : public ::testing::TestWithParam<Refusal> {};

TEST_P(OpenAiChatRefusals, NameTheField) {
  const auto& c = GetParam();
  auto r = parse_openai_chat(c.body);
  ASSERT_FALSE(r.ok()) << c.name;
  EXPECT_EQ(r.error->status, c.status) << c.name;
  EXPECT_EQ(r.error->param, c.param) << c.name << ": " << r.error->message;
  EXPECT_EQ(r.error->code, c.code) << c.name << ": " << r.error->message;
}

#define MSG R"("messages":[{"role":"user","content":"hi"}])"
INSTANTIATE_TEST_SUITE_P(
    Table, OpenAiChatRefusals,
    ::testing::Values(
        Refusal{"empty body", "", 400, "", "invalid_value"},
        Refusal{"not json", "{\"model\":", 400, "", "invalid_value"},
        Refusal{"not an object", "[1,2]", 400, "", "invalid_value"},
        Refusal{"invalid utf8", "{\"model\":\"\xff\"}", 400, "", "invalid_value"},
        Refusal{"number overflow", "{\"model\":22222e22222}", 400, "", "invalid_value"},
        Refusal{"deep", "{\"model\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}", 400, "", "invalid_value"},
        Refusal{"no model", "{" MSG "}", 400, "model", "invalid_value"},
        Refusal{"no messages", R"({"model":"m"})", 400, "messages", "invalid_value"},
        Refusal{"empty messages", R"({"model":"m","messages":[]})", 400, "messages", "invalid_value"},
        Refusal{"bad role", R"({"model":"m","messages":[{"role":"robot","content":"x"}]})", 400, "messages[0].role", "invalid_value"},
        Refusal{"tool role", R"({"model":"m","messages":[{"role":"tool","content":"x"}]})", 400, "messages[0].role", "unsupported_parameter"},
        Refusal{"name", R"({"model":"m","messages":[{"role":"user","content":"x","name":"bob"}]})", 400, "messages[0].name", "unsupported_parameter"},
        Refusal{"image part", R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", 400, "messages[0].content[0].type", "unsupported_parameter"},
        Refusal{"tools", R"({"model":"m",)" MSG R"(,"tools":[{"type":"function","function":{"name":"f"}}]})", 400, "tools", "unsupported_parameter"},
        Refusal{"response_format", R"({"model":"m",)" MSG R"(,"response_format":{"type":"json_schema"}})", 400, "response_format", "unsupported_parameter"},
        Refusal{"n=2", R"({"model":"m",)" MSG R"(,"n":2})", 400, "n", "unsupported_parameter"},
        Refusal{"logprobs", R"({"model":"m",)" MSG R"(,"logprobs":true})", 400, "logprobs", "unsupported_parameter"},
        Refusal{"presence", R"({"model":"m",)" MSG R"(,"presence_penalty":0.5})", 400, "presence_penalty", "unsupported_parameter"},
        Refusal{"logit_bias", R"({"model":"m",)" MSG R"(,"logit_bias":{"1":2}})", 400, "logit_bias", "unsupported_parameter"},
        Refusal{"unknown", R"({"model":"m",)" MSG R"(,"frobnicate":1})", 400, "frobnicate", "unknown_parameter"},
        Refusal{"temperature range", R"({"model":"m",)" MSG R"(,"temperature":3})", 400, "temperature", "invalid_value"},
        Refusal{"max_tokens type", R"({"model":"m",)" MSG R"(,"max_tokens":"many"})", 400, "max_tokens", "invalid_value"},
        Refusal{"max_tokens 0", R"({"model":"m",)" MSG R"(,"max_tokens":0})", 400, "max_tokens", "invalid_value"},
        Refusal{"both maxes differ", R"({"model":"m",)" MSG R"(,"max_tokens":5,"max_completion_tokens":6})", 400, "max_completion_tokens", "invalid_value"},
        Refusal{"five stops", R"({"model":"m",)" MSG R"(,"stop":["a","b","c","d","e"]})", 400, "stop", "invalid_value"},
        Refusal{"empty stop", R"({"model":"m",)" MSG R"(,"stop":""})", 400, "stop", "invalid_value"},
        Refusal{"stream_options without stream", R"({"model":"m",)" MSG R"(,"stream_options":{"include_usage":true}})", 400, "stream_options", "invalid_value"},
        Refusal{"unknown stream option", R"({"model":"m",)" MSG R"(,"stream":true,"stream_options":{"x":1}})", 400, "stream_options.x", "unknown_parameter"},
        Refusal{"tandem ext typo", R"({"model":"m",)" MSG R"(,"tandem":{"allow_cpuu":true}})", 400, "tandem.allow_cpuu", "unknown_parameter"},
        Refusal{"tandem deadline", R"({"model":"m",)" MSG R"(,"tandem":{"deadline_ms":0}})", 400, "tandem.deadline_ms", "invalid_value"},
        Refusal{"template kwarg", R"({"model":"m",)" MSG R"(,"chat_template_kwargs":{"tools_in_system":true}})", 400, "chat_template_kwargs.tools_in_system", "unknown_parameter"},
        Refusal{"template kwargs type", R"({"model":"m",)" MSG R"(,"chat_template_kwargs":[1]})", 400, "chat_template_kwargs", "invalid_value"},
        Refusal{"enable_thinking type", R"({"model":"m",)" MSG R"(,"chat_template_kwargs":{"enable_thinking":"no"}})", 400, "chat_template_kwargs.enable_thinking", "invalid_value"}));

// Qwen3's thinking switch as the clients send it: OpenAI bodies through vLLM's chat_template_kwargs or Tandem's own
// extension, Ollama's think: false. (think: true would need the reasoning returned apart: refused.)
TEST(Thinking, TheSwitchReachesTheSubmitOptions) {
  auto a = parse_openai_chat(R"({"model":"m",)" MSG R"(,"chat_template_kwargs":{"enable_thinking":false}})");
  ASSERT_TRUE(a.ok()) << a.error->message;
  EXPECT_EQ(a->request.options.enable_thinking, std::optional<bool>(false));
  auto b = parse_openai_chat(R"({"model":"m",)" MSG R"(,"tandem":{"enable_thinking":true}})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->request.options.enable_thinking, std::optional<bool>(true));
  EXPECT_FALSE(parse_openai_chat(R"({"model":"m",)" MSG R"(})")->request.options.enable_thinking.has_value());
  auto o = parse_ollama_chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"think":false})");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->request.options.enable_thinking, std::optional<bool>(false));
  EXPECT_EQ(parse_ollama_chat(R"({"model":"m","think":true})").error->param, "think");
  EXPECT_EQ(parse_ollama_chat(R"({"model":"m","think":"high"})").error->code, "unsupported_parameter");
  auto g = parse_ollama_generate(R"({"model":"m","prompt":"p","think":false})");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->request.options.enable_thinking, std::optional<bool>(false));
}

TEST(OpenAiChat, MapsEveryImplementedField) {
  auto r = parse_openai_chat(R"({"model":"m","messages":[{"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":"ok"}],
      "stream":true,"stream_options":{"include_usage":true},"stop":"\n","seed":-1,"temperature":0.5,"top_p":0.9,
      "max_completion_tokens":16,"n":1,"user":"u1","logprobs":false,"presence_penalty":0,"frequency_penalty":0,
      "logit_bias":{},"tandem":{"allow_cpu":false,"top_k":40,"repetition_penalty":1.1,"deadline_ms":5000,"side_effects":true}})");
  ASSERT_TRUE(r.ok()) << r.error->message;
  const auto& c = *r;
  EXPECT_EQ(c.model, "m");
  ASSERT_EQ(c.request.messages.size(), 3u);
  EXPECT_EQ(c.request.messages[0].role, "system");
  EXPECT_EQ(c.request.messages[1].content, "ab");
  EXPECT_TRUE(c.stream);
  EXPECT_TRUE(c.include_usage);
  const auto& o = c.request.options;
  EXPECT_EQ(o.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(o.seed, 0xffffffffffffffffull);
  EXPECT_EQ(o.temperature, 0.5);
  EXPECT_EQ(o.top_p, 0.9);
  EXPECT_EQ(o.max_tokens, 16u);
  EXPECT_EQ(o.allow_cpu, false);
  EXPECT_EQ(o.top_k, 40u);
  EXPECT_EQ(o.deadline_ms, 5000u);
  EXPECT_EQ(o.side_effects, true);
  EXPECT_EQ(c.user, "u1");
}

TEST(OpenAiChat, EmptyToolsIsNoTools) {
  EXPECT_TRUE(parse_openai_chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[]})").ok());
}

TEST(OpenAiChat, NullMeansAbsent) {
  auto r = parse_openai_chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"temperature":null,"tools":null,"n":null})");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->request.options.temperature);
}

TEST(OpenAiCompletion, PromptForms) {
  EXPECT_EQ(parse_openai_completion(R"({"model":"m","prompt":"abc"})")->request.prompt, "abc");
  EXPECT_EQ(parse_openai_completion(R"({"model":"m","prompt":["abc"]})")->request.prompt, "abc");
  EXPECT_EQ(parse_openai_completion(R"({"model":"m","prompt":[1,2,3]})").error->code, "unsupported_parameter");
  EXPECT_EQ(parse_openai_completion(R"({"model":"m","prompt":["a","b"]})").error->code, "unsupported_parameter");
  EXPECT_EQ(parse_openai_completion(R"({"model":"m","prompt":""})").error->param, "prompt");
  EXPECT_EQ(parse_openai_completion(R"({"model":"m","prompt":"x","echo":true})").error->param, "echo");
  EXPECT_EQ(parse_openai_completion(R"({"model":"m","prompt":"x","suffix":"y"})").error->param, "suffix");
  EXPECT_TRUE(parse_openai_completion(R"({"model":"m","prompt":"x","echo":false,"best_of":1})").ok());
}

TEST(Ollama, ChatAndGenerate) {
  auto c = parse_ollama_chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],
      "options":{"num_predict":7,"temperature":0.2,"top_k":5,"seed":3,"stop":["a"],"repeat_penalty":1.2},"keep_alive":"5m"})");
  ASSERT_TRUE(c.ok()) << c.error->message;
  EXPECT_TRUE(c->stream);  // Ollama streams by default
  EXPECT_EQ(c->request.options.max_tokens, 7u);
  EXPECT_EQ(c->request.options.repetition_penalty, 1.2);
  EXPECT_EQ(c->keep_alive, "5m");
  EXPECT_FALSE(c->load_only);
  EXPECT_TRUE(parse_ollama_chat(R"({"model":"m"})")->load_only);
  EXPECT_FALSE(parse_ollama_chat(R"({"model":"m","options":{"num_predict":-1}})")->request.options.max_tokens);
  EXPECT_EQ(parse_ollama_chat(R"({"model":"m","options":{"num_ctx":8192}})")->num_ctx, 8192u);  // checked per model
  EXPECT_EQ(parse_ollama_chat(R"({"model":"m","options":{"mirostat":1}})").error->param, "options.mirostat");
  EXPECT_TRUE(parse_ollama_chat(R"({"model":"m","tools":[]})").ok());  // the Python client always sends one
  EXPECT_EQ(parse_ollama_chat(R"({"model":"m","tools":[{"type":"function"}]})").error->param, "tools");
  EXPECT_EQ(parse_ollama_chat(R"({"model":"m","options":{"nope":1}})").error->code, "unknown_parameter");
  EXPECT_EQ(parse_ollama_chat(R"({"model":"m","format":"json"})").error->param, "format");
  EXPECT_EQ(parse_ollama_chat(R"({"model":"m","messages":[{"role":"user","content":"x","images":["aGk="]}]})").error->param,
            "messages[0].images");
  auto g = parse_ollama_generate(R"({"model":"m","prompt":"p","system":"s","stream":false})");
  ASSERT_TRUE(g.ok());
  ASSERT_EQ(g->request.messages.size(), 2u);  // templated like Ollama: system + user turn
  EXPECT_EQ(g->request.messages[1].content, "p");
  auto raw = parse_ollama_generate(R"({"model":"m","prompt":"p","raw":true})");
  EXPECT_EQ(raw->request.prompt, "p");
  EXPECT_TRUE(raw->request.messages.empty());
  EXPECT_TRUE(parse_ollama_generate(R"({"model":"m"})")->load_only);
  EXPECT_EQ(parse_ollama_generate(R"({"model":"m","prompt":"p","context":[1,2]})").error->param, "context");
}

TEST(Embeddings, Inputs) {
  auto a = parse_openai_embeddings(R"({"model":"e","input":["x","y"],"encoding_format":"base64","dimensions":8})");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->inputs.size(), 2u);
  EXPECT_TRUE(a->base64);
  EXPECT_EQ(a->dimensions, 8u);
  // Token arrays (the SDKs' and LangChain's form): one array, or a list of them, mixed with texts and images.
  auto one = parse_openai_embeddings(R"({"model":"e","input":[1,2,4294967295]})");
  ASSERT_TRUE(one.ok()) << one.error->message;
  ASSERT_EQ(one->inputs.size(), 1u);
  EXPECT_EQ(one->inputs[0].kind, EmbedInputKind::tokens);
  EXPECT_EQ(one->inputs[0].tokens, (std::vector<std::uint32_t>{1, 2, 4294967295u}));
  auto mixed = parse_openai_embeddings(
      R"({"model":"e","input":[{"type":"image_url","image_url":"data:image/png;base64,AAEC"},[7],"x",[8,9]]})");
  ASSERT_TRUE(mixed.ok()) << mixed.error->message;
  const EmbedPlan plan = plan_embed(*mixed);
  EXPECT_EQ(plan.request.texts, (std::vector<std::string>{"x"}));
  EXPECT_EQ(plan.request.tokens, (std::vector<std::vector<std::uint32_t>>{{7}, {8, 9}}));
  EXPECT_EQ(plan.request.images.size(), 1u);
  EXPECT_EQ(plan.order, (std::vector<std::size_t>{3, 1, 0, 2}));  // tandemd's order: texts, token inputs, images
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model":"e","input":[1,-2]})", "input[1]"},
           {R"({"model":"e","input":[1,2.5]})", "input[1]"},
           {R"({"model":"e","input":[1,4294967296]})", "input[1]"},
           {R"({"model":"e","input":[[1],[]]})", "input[1]"},
           {R"({"model":"e","input":[[1],["a"]]})", "input[1][0]"},
           {R"({"model":"e","input":["a",3]})", "input[1]"}}) {
    auto r = parse_openai_embeddings(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error->param, param) << body << ": " << r.error->message;
  }
  // tandemd's names of the inputs back to the request's.
  EXPECT_EQ(embed_input_index("texts[0]: not UTF-8", plan), 2u);
  EXPECT_EQ(embed_input_index("tokens[0]: token 3 is 9", plan), 1u);
  EXPECT_EQ(embed_input_index("tokens[1] is empty", plan), 3u);
  EXPECT_EQ(embed_input_index("images[0] is 0 bytes", plan), 0u);
  for (const char* m : {"tokens[2]: x", "images[1]: x", "tokens[]: x", "tokens[1: x", "no inputs", "tokens[99999999999]"})
    EXPECT_FALSE(embed_input_index(m, plan)) << m;
  // Ollama's embed API takes texts only.
  EXPECT_EQ(parse_ollama_embed(R"({"model":"e","input":[1,2]})", false).error->code, "unsupported_parameter");
  EXPECT_EQ(parse_ollama_embed(R"({"model":"e","input":[[1,2]]})", false).error->code, "unsupported_parameter");
  EXPECT_EQ(parse_openai_embeddings(R"({"model":"e","input":""})").error->param, "input");
  EXPECT_EQ(parse_openai_embeddings(R"({"model":"e","input":[]})").error->param, "input");
  EXPECT_EQ(parse_openai_embeddings(R"({"model":"e","input":"x","encoding_format":"hex"})").error->param, "encoding_format");
  auto img = parse_openai_embeddings(R"({"model":"e","input":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAEC"}}]})");
  ASSERT_TRUE(img.ok()) << img.error->message;
  EXPECT_TRUE(img->inputs[0].image());
  EXPECT_EQ(img->inputs[0].bytes, (std::vector<std::uint8_t>{0, 1, 2}));
  EXPECT_EQ(parse_openai_embeddings(R"({"model":"e","input":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]})").error->code,
            "unsupported_parameter");
  EXPECT_EQ(parse_openai_embeddings(R"({"model":"e","input":[{"type":"image_url","image_url":{"url":"data:image/png;base64,@@@@"}}]})").error->param,
            "input[0].image_url.url");
  auto legacy = parse_ollama_embed(R"({"model":"e","prompt":"x"})", true);
  ASSERT_TRUE(legacy.ok());
  EXPECT_EQ(legacy->inputs[0].text, "x");
  EXPECT_EQ(parse_ollama_embed(R"({"model":"e","input":"x","options":{"temperature":1}})", false).error->param, "options");
}

TEST(Base64, RoundTripAndRejects) {
  for (std::size_t n = 0; n < 40; ++n) {
    std::vector<std::uint8_t> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(i * 37 + 11);
    auto s = base64_encode(b.data(), b.size());
    EXPECT_EQ(base64_decode(s), b) << n;
  }
  EXPECT_EQ(base64_encode(reinterpret_cast<const std::uint8_t*>("hello"), 5), "aGVsbG8=");
  for (const char* bad : {"a", "ab=c", "====", "a===", "ab!d", "aGVsbG8=aGVs"}) EXPECT_FALSE(base64_decode(bad)) << bad;
}

TEST(Errors, ErrorTextsQuotingRequestBytesStayJson) {
  // The JSON parser's message quotes the bytes it read, cut inside a character; a multipart name can be any bytes.
  auto r = parse_openai_embeddings("{\"model\": \xc3\xbc}");
  ASSERT_FALSE(r.ok());
  EXPECT_NO_THROW((void)error_json(*r.error, Flavor::openai).dump());
  auto t = parse_transcription("multipart/form-data; boundary=B0",
                               "--B0\r\nContent-Disposition: form-data; name=\"\xff\"\r\n\r\nx\r\n--B0--\r\n", false);
  ASSERT_FALSE(t.ok());
  EXPECT_NO_THROW((void)error_json(*t.error, Flavor::openai).dump());
  EXPECT_NO_THROW((void)error_json(*t.error, Flavor::ollama).dump());
}

TEST(Errors, TandemdErrorsMapToHonestStatuses) {
  struct Row {
    const char* name;
    int status;
    const char* code;
  };
  for (const Row& r : {Row{"io.tandem.Tandem1.Error.InvalidArgument", 400, "invalid_value"},
                       Row{"io.tandem.Tandem1.Error.UnknownModel", 404, "model_not_found"},
                       Row{"io.tandem.Tandem1.Error.NotAuthorized", 403, "not_authorized"},
                       Row{"io.tandem.Tandem1.Error.Busy", 503, "busy"},
                       Row{"io.tandem.Tandem1.Error.QueueFull", 503, "queue_full"},
                       Row{"io.tandem.Tandem1.Error.HostMemory", 503, "host_memory"},
                       Row{"io.tandem.Tandem1.Error.Duplicate", 409, "duplicate"},
                       Row{"io.tandem.Tandem1.Error.Timeout", 504, "timeout"},
                       Row{"io.tandem.Tandem1.Error.Internal", 500, "internal"},
                       Row{"org.freedesktop.DBus.Error.ServiceUnknown", 503, "tandemd_unavailable"},
                       Row{"org.freedesktop.DBus.Error.AccessDenied", 403, "access_denied"}}) {
    auto e = error_from_remote(client::parse_remote_error(r.name, "why"));
    EXPECT_EQ(e.status, r.status) << r.name;
    EXPECT_EQ(e.code, r.code) << r.name;
    if (e.status == 503) {
      EXPECT_TRUE(e.retry_after_ms) << r.name;
    }
  }
  auto res = error_from_remote(client::parse_remote_error("io.tandem.Tandem1.Error.Resumable", "failed; job=12; tokens=3; retry_after_ms=100"));
  EXPECT_EQ(res.job, 12u);
  auto j = error_json(res, Flavor::openai);
  EXPECT_EQ(j["tandem"]["resume"], "/tandem/v1/jobs/12/resume");
  EXPECT_TRUE(error_json(res, Flavor::ollama)["error"].is_string());
  EXPECT_EQ(retry_after_seconds(0), "1");
  EXPECT_EQ(retry_after_seconds(1000), "1");
  EXPECT_EQ(retry_after_seconds(1001), "2");
}

TEST(KeyRingTest, ParseAuthenticateRefuse) {
  const std::string line = KeyRing::line_for("laptop", "s3cret");
  auto k = KeyRing::parse("# keys\n\n" + line + "\n" + KeyRing::line_for("phone", "other") + "\n");
  ASSERT_TRUE(k.ok()) << k.error().message;
  EXPECT_EQ(k->size(), 2u);
  EXPECT_EQ(k->authenticate("Bearer s3cret"), "laptop");
  EXPECT_EQ(k->authenticate("Bearer other"), "phone");
  EXPECT_FALSE(k->authenticate("Bearer wrong"));
  EXPECT_FALSE(k->authenticate("Basic s3cret"));
  EXPECT_FALSE(k->authenticate("Bearer "));
  EXPECT_FALSE(KeyRing::parse("laptop sha256:abc").ok());
  EXPECT_FALSE(KeyRing::parse("bad/name " + line.substr(line.find(' ') + 1)).ok());
  EXPECT_FALSE(KeyRing::parse(line + "\n" + line).ok());  // duplicate
  EXPECT_FALSE(KeyRing::parse("onlyname").ok());
}

TEST(JobViewTest, FinishedTextAndUnsent) {
  JobView v;
  client::SubmitResult s;
  s.job_id = 3;
  s.placement.route = "gpu";
  v.accepted(s);
  client::JobUpdate t;
  t.kind = "tokens";
  t.text = "ab";
  t.tokens = std::vector<std::int32_t>{1, 2};
  v.update(t);
  EXPECT_EQ(v.take_unsent(), "ab");
  EXPECT_EQ(v.take_unsent(), "");
  client::JobUpdate f;
  f.kind = "finished";
  f.state = "completed";
  f.finish_reason = "eos";
  f.text = "abcd";
  f.tokens_total = 4;
  v.update(f);
  EXPECT_EQ(v.take_unsent(), "cd");
  EXPECT_EQ(v.completion_tokens(), 4u);
  EXPECT_EQ(openai_finish_reason(v.finish_reason()), "stop");
  client::JobUpdate m;
  m.kind = "migrated";
  m.to = "cpu";
  EXPECT_TRUE(v.update(m));
  EXPECT_EQ(v.tandem_json()["routes"], json::array({"gpu", "cpu"}));
}

std::string form(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string b;
  for (const auto& [k, v] : fields) {
    b += "--B0\r\nContent-Disposition: form-data; name=\"" + k + "\"";
    if (k == "file") b += "; filename=\"a.wav\"\r\nContent-Type: audio/wav";
    b += "\r\n\r\n" + v + "\r\n";
  }
  return b + "--B0--\r\n";
}

TEST(Multipart, PartsAndMalformedBodies) {
  EXPECT_EQ(*multipart_boundary("multipart/form-data; boundary=B0"), "B0");
  EXPECT_EQ(*multipart_boundary("Multipart/Form-Data; charset=utf-8; boundary=\"a b\""), "a b");
  EXPECT_FALSE(multipart_boundary("application/json").ok());
  EXPECT_FALSE(multipart_boundary("multipart/form-data").ok());
  const std::string body = form({{"model", "asr"}, {"file", std::string("RI\0FF\r\n--B", 10)}});
  auto p = parse_multipart(body, "B0");  // the parts are views into the body
  ASSERT_TRUE(p.ok()) << p.error().message;
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].name, "model");
  EXPECT_EQ((*p)[0].data, "asr");
  EXPECT_EQ((*p)[1].filename, "a.wav");
  EXPECT_EQ((*p)[1].content_type, "audio/wav");
  EXPECT_EQ((*p)[1].data.size(), 10u);  // binary, with CR LF and a near-delimiter inside
  const std::string whole = form({{"model", "asr"}});
  EXPECT_FALSE(parse_multipart(whole.substr(0, whole.size() - 10), "B0").ok());  // truncated
  EXPECT_FALSE(parse_multipart("--B0\r\nX: y\r\n\r\nz\r\n--B0--", "B0").ok());  // no Content-Disposition
  EXPECT_FALSE(parse_multipart("--B0\r\nContent-Disposition: form-data\r\n\r\nz\r\n--B0--", "B0").ok());  // no name
  EXPECT_FALSE(parse_multipart("no delimiter", "B0").ok());
}

TEST(Transcription, FieldsAndRefusals) {
  const std::string ct = "multipart/form-data; boundary=B0";
  auto c = parse_transcription(ct, form({{"file", "RIFF"}, {"model", "asr"}, {"response_format", "srt"}, {"language", "en"},
                                         {"prompt", "names"}, {"temperature", "0.2"}, {"timestamp_granularities[]", "segment"},
                                         {"tandem.seed", "9"}}), false);
  ASSERT_TRUE(c.ok()) << c.error->message;
  EXPECT_EQ(c->format, TranscriptFormat::srt);
  EXPECT_EQ(c->options.language, "en");
  EXPECT_EQ(c->options.initial_prompt, "names");
  EXPECT_EQ(c->options.seed, 9u);
  EXPECT_EQ(c->audio.size(), 4u);
  EXPECT_TRUE(parse_transcription(ct, form({{"file", "x"}, {"model", "a"}}), true)->options.translate.value_or(false));
  struct Bad {
    std::vector<std::pair<std::string, std::string>> fields;
    const char* param;
  };
  for (const Bad& b : {Bad{{{"model", "asr"}}, "file"}, Bad{{{"file", "x"}}, "model"},
                       Bad{{{"file", "x"}, {"model", "a"}, {"response_format", "xml"}}, "response_format"},
                       Bad{{{"file", "x"}, {"model", "a"}, {"temperature", "hot"}}, "temperature"},
                       Bad{{{"file", "x"}, {"model", "a"}, {"timestamp_granularities[]", "word"}}, "timestamp_granularities[]"},
                       Bad{{{"file", "x"}, {"model", "a"}, {"model", "b"}}, "model"},
                       Bad{{{"file", "x"}, {"model", "a"}, {"colour", "red"}}, "colour"},
                       Bad{{{"file", ""}, {"model", "a"}}, "file"}}) {
    auto r = parse_transcription(ct, form(b.fields), false);
    ASSERT_FALSE(r.ok()) << b.param;
    EXPECT_EQ(r.error->param, b.param);
  }
  EXPECT_EQ(parse_transcription("application/json", "{}", false).error->status, 400);
}

TEST(Transcription, Formats) {
  TranscriptionCall c;
  std::vector<client::TranscriptSegment> segs = {{0, 0.0, 1.5, " Hello", 0, 0, 0}, {1, 1.5, 3.25, " world", 0, 0, 0}};
  client::JobInfo j;
  j.language = "en";
  j.audio_ms = 3250;
  c.format = TranscriptFormat::srt;
  EXPECT_EQ(transcript_body(c, " Hello world", segs, j, {}).body,
            "1\n00:00:00,000 --> 00:00:01,500\nHello\n\n2\n00:00:01,500 --> 00:00:03,250\nworld\n\n");
  c.format = TranscriptFormat::vtt;
  EXPECT_EQ(transcript_body(c, "", segs, j, {}).body.rfind("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello", 0), 0u);
  c.format = TranscriptFormat::verbose_json;
  auto v = json::parse(transcript_body(c, " Hello world", segs, j, {}).body);
  EXPECT_EQ(v["duration"], 3.25);
  EXPECT_EQ(v["segments"][1]["text"], " world");
  c.format = TranscriptFormat::text;
  EXPECT_EQ(transcript_body(c, "x", segs, j, {}).content_type, "text/plain; charset=utf-8");
}

TEST(Wyoming, FramingRoundTripAndLimits) {
  WyomingEvent e{"audio-chunk", {{"rate", 16000}, {"width", 2}, {"channels", 1}}, std::string("\x01\x00\x02\x00", 4)};
  const std::string wire = wyoming_encode(e) + wyoming_encode({"audio-stop", json::object(), {}});
  WyomingReader r;
  // Byte by byte: events come out whole and in order.
  std::vector<WyomingEvent> got;
  for (char c : wire) {
    ASSERT_TRUE(r.feed(std::string_view(&c, 1)).ok());
    auto n = r.next();
    ASSERT_TRUE(n.ok()) << n.error().message;
    if (*n) got.push_back(**n);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type, "audio-chunk");
  EXPECT_EQ(got[0].data["rate"], 16000);
  EXPECT_EQ(got[0].payload.size(), 4u);
  EXPECT_EQ(got[1].type, "audio-stop");
  // Inline data and extra data merge (extra wins).
  WyomingReader m;
  ASSERT_TRUE(m.feed("{\"type\":\"transcribe\",\"data\":{\"name\":\"a\",\"language\":\"en\"},\"data_length\":12}\n{\"name\":\"b\"}").ok());
  auto t = m.next();
  ASSERT_TRUE(t.ok() && *t);
  EXPECT_EQ((**t).data["name"], "b");
  EXPECT_EQ((**t).data["language"], "en");
  WyomingLimits small;
  small.max_header_bytes = 64;
  small.max_payload_bytes = 8;
  for (const std::string& bad : {std::string(100, 'a'), std::string("not json\n"), std::string("{\"type\":1e99999}\n"), std::string("[1]\n"),
                                 std::string("{\"data\":{}}\n"), std::string("{\"type\":\"x\",\"payload_length\":9}\n"),
                                 std::string("{\"type\":\"x\",\"payload_length\":-1}\n"),
                                 std::string("{\"type\":\"x\",\"data\":[1]}\n")}) {
    WyomingReader b(small);
    ASSERT_TRUE(b.feed(bad).ok());
    EXPECT_FALSE(b.next().ok()) << bad;
  }
}

TEST(Wyoming, SessionStateMachine) {
  WyomingSession s;
  auto close_of = [](const std::vector<WyomingAction>& a) {
    return a.size() == 1 && a[0].kind == WyomingAction::Kind::close && a[0].event.type == "error";
  };
  EXPECT_TRUE(close_of(s.on_event({"audio-chunk", {{"rate", 16000}, {"width", 2}, {"channels", 1}}, "ab"})));
  WyomingSession t;
  EXPECT_TRUE(t.on_event({"transcribe", {{"name", "asr"}, {"language", "en"}, {"context", {{"tandem", {{"seed", 3}}}}}}, {}}).empty());
  auto start = t.on_event({"audio-start", {{"rate", 22050}, {"width", 2}, {"channels", 1}}, {}});
  ASSERT_EQ(start.size(), 1u);
  ASSERT_EQ(start[0].kind, WyomingAction::Kind::start_stream);
  EXPECT_EQ(start[0].request.model, "asr");
  EXPECT_EQ(start[0].request.stream->sample_rate, 22050u);
  EXPECT_EQ(start[0].request.options.language, "en");
  EXPECT_EQ(start[0].request.options.seed, 3u);
  auto chunk = t.on_event({"audio-chunk", {{"rate", 22050}, {"width", 2}, {"channels", 1}}, "abcd"});
  ASSERT_EQ(chunk.size(), 1u);
  EXPECT_EQ(chunk[0].pcm, "abcd");
  EXPECT_TRUE(close_of(t.on_event({"audio-chunk", {{"rate", 22050}, {"width", 2}, {"channels", 1}}, "abc"})));  // partial frame
  WyomingSession u;
  u.on_event({"audio-start", {{"rate", 16000}, {"width", 2}, {"channels", 1}}, {}});
  EXPECT_TRUE(close_of(u.on_event({"audio-chunk", {{"rate", 8000}, {"width", 2}, {"channels", 1}}, "ab"})));  // format changed
  WyomingSession v;
  EXPECT_TRUE(close_of(v.on_event({"audio-start", {{"rate", 16000}, {"width", 1}, {"channels", 1}}, {}})));  // 8-bit
  WyomingSession w;
  w.on_event({"audio-start", {{"rate", 16000}, {"width", 2}, {"channels", 1}}, {}});
  auto stop = w.on_event({"audio-stop", json::object(), {}});
  ASSERT_EQ(stop.size(), 1u);
  EXPECT_TRUE(stop[0].end);
  auto seg = w.on_segment(" Hello");
  ASSERT_EQ(seg.size(), 2u);
  EXPECT_EQ(seg[0].event.type, "transcript-start");
  EXPECT_EQ(seg[1].event.data["text"], " Hello");
  auto fin = w.on_finished(" Hello", "en");
  ASSERT_EQ(fin.size(), 2u);
  EXPECT_EQ(fin[0].event.type, "transcript");
  EXPECT_EQ(fin[0].event.data["text"], "Hello");
  EXPECT_EQ(fin[1].event.type, "transcript-stop");
  EXPECT_TRUE(w.on_event({"wake-detect", json::object(), {}}).empty());  // other programs' events: ignored
  EXPECT_EQ(w.on_event({"describe", json::object(), {}})[0].kind, WyomingAction::Kind::describe);
  client::ModelInfo asr;
  asr.name = "asr";
  asr.kind = "speech";
  asr.languages = std::vector<std::string>{"en", "de"};
  client::ModelInfo llm;
  llm.name = "tiny";
  llm.kind = "llm";
  auto info = wyoming_info({asr, llm}, "0.1");
  EXPECT_EQ(info.data["asr"][0]["models"].size(), 1u);
  EXPECT_EQ(info.data["asr"][0]["models"][0]["languages"][1], "de");
}

TEST(MetricsTest, RendersCountersAndEscapes) {
  Metrics m;
  m.request("/v1/chat/completions", "gpu", 200);
  m.request("/v1/chat/completions", "gpu", 200);
  m.tokens("cpu", 12);
  m.refused("auth");
  client::ServiceStatus st;
  st.state = "normal";
  st.degraded_reason = "a\"b";
  st.gpu_breaker = "closed";
  client::MemoryInfo mem;
  mem.total = 100;
  mem.foreign = 10;
  st.memory = mem;
  const std::string t = m.render(st, true);
  EXPECT_NE(t.find("tandem_http_requests_total{endpoint=\"/v1/chat/completions\",route=\"gpu\",status=\"200\"} 2"), std::string::npos);
  EXPECT_NE(t.find("tandem_generation_tokens_total{route=\"cpu\"} 12"), std::string::npos);
  EXPECT_NE(t.find("tandem_degraded{reason=\"a\\\"b\"} 0"), std::string::npos);
  EXPECT_NE(t.find("tandem_gpu_breaker{state=\"closed\"} 1"), std::string::npos);
  EXPECT_NE(t.find("tandem_gpu_memory_bytes{kind=\"foreign\"} 10"), std::string::npos);
  EXPECT_NE(t.find("tandem_up 1"), std::string::npos);
  EXPECT_NE(m.render(std::nullopt, false).find("tandem_up 0"), std::string::npos);
  EXPECT_EQ(t.find("tandem_replica_info"), std::string::npos) << "no models given: no replica series";

  // Replicas: one info series each (state and reason as labels), bytes on the accelerator and the host.
  client::ReplicaInfo gpu, cpu;
  gpu.device = "gpu";
  gpu.state = "evicted";
  gpu.reason = "pressure";
  gpu.accel_bytes = 0;
  cpu.device = "cpu";
  cpu.state = "loaded";
  cpu.host_bytes = 4096;
  const std::string r = m.render(st, true, {{"chat\"1", {gpu, cpu}}});
  EXPECT_NE(r.find("tandem_replica_info{model=\"chat\\\"1\",device=\"gpu\",state=\"evicted\",reason=\"pressure\"} 1"),
            std::string::npos) << r;
  EXPECT_NE(r.find("tandem_replica_info{model=\"chat\\\"1\",device=\"cpu\",state=\"loaded\",reason=\"\"} 1"), std::string::npos);
  EXPECT_NE(r.find("tandem_replica_bytes{model=\"chat\\\"1\",device=\"gpu\",on=\"accelerator\"} 0"), std::string::npos);
  EXPECT_NE(r.find("tandem_replica_bytes{model=\"chat\\\"1\",device=\"cpu\",on=\"host\"} 4096"), std::string::npos);
  EXPECT_EQ(r.find("device=\"cpu\",on=\"accelerator\""), std::string::npos) << "absent bytes are not invented";
}

}  // namespace
}  // namespace tandem::http
