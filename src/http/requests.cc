// HTTP request bodies -> Tandem requests (requests.h).
#include "http/requests.h"

#include <array>
#include <limits>

namespace tandem::http {

using nlohmann::json;

std::string_view api_name(Api a) {
  switch (a) {
    case Api::openai_chat: return "openai_chat";
    case Api::openai_completion: return "openai_completion";
    case Api::ollama_chat: return "ollama_chat";
    case Api::ollama_generate: return "ollama_generate";
  }
  return "?";
}

namespace {

constexpr std::uint64_t kMaxTokens = 1u << 24;

// Members of the OpenAI request bodies that Tandem knows and does not implement: each is a 400 naming it.
const std::set<std::string> kOpenAiUnsupported = {
    "tools", "tool_choice", "functions", "function_call", "response_format", "logprobs", "top_logprobs", "n",
    "logit_bias", "audio", "modalities", "prediction", "reasoning_effort", "web_search_options",
    "parallel_tool_calls", "store", "metadata", "service_tier", "verbosity", "prompt_cache_key",
    "safety_identifier", "presence_penalty", "frequency_penalty", "suffix", "echo", "best_of"};
const std::set<std::string> kOllamaUnsupported = {"tools", "format", "images", "template", "context", "suffix",
                                                  "think", "tool_calls", "thinking", "logprobs", "top_logprobs"};
const std::set<std::string> kOllamaOptionsUnsupported = {
    "num_keep", "typical_p", "repeat_last_n", "presence_penalty", "frequency_penalty", "mirostat", "mirostat_tau",
    "mirostat_eta", "penalize_newline", "numa", "num_batch", "num_gpu", "main_gpu", "low_vram",
    "vocab_only", "use_mmap", "use_mlock", "num_thread", "min_p", "tfs_z"};

// A seed as JavaScript clients send it: any 64-bit integer (negative ones as their two's complement).
std::optional<std::uint64_t> read_seed(FieldReader& f, const char* key) {
  const json* v = f.take(key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<std::uint64_t>();
  if (v->is_number_integer()) return static_cast<std::uint64_t>(v->get<std::int64_t>());
  f.fail(invalid_field(f.where() + key, "expected an integer"));
  return std::nullopt;
}

// Tandem's own options, in a "tandem" member that the OpenAI and Ollama bodies may carry (docs/http.md).
void read_tandem_extension(FieldReader& f, client::SubmitOptions& o) {
  const json* t = f.take("tandem");
  if (!t) return;
  if (!t->is_object()) {
    f.fail(invalid_field("tandem", "expected an object"));
    return;
  }
  FieldReader x(*t, "tandem.");
  o.allow_cpu = x.boolean("allow_cpu");
  o.allow_reduce = x.boolean("allow_reduce");
  o.allow_fallback_model = x.boolean("allow_fallback_model");
  o.enable_thinking = x.boolean("enable_thinking");
  o.side_effects = x.boolean("side_effects");
  o.deadline_ms = x.uint("deadline_ms", 1, 604800000);
  if (auto k = x.uint("top_k", 0, 1u << 20)) o.top_k = static_cast<std::uint32_t>(*k);
  o.repetition_penalty = x.number("repetition_penalty", 0.0, 10.0);
  if (auto c = x.uint("prefill_chunk", 0, kMaxTokens)) o.prefill_chunk = static_cast<std::uint32_t>(*c);
  if (auto e = x.finish({})) f.fail(*e);
}

// The OpenAI sampling members shared by chat and completions.
void read_openai_sampling(FieldReader& f, GenerateCall& c, const BodyLimits& limits) {
  auto& o = c.request.options;
  o.temperature = f.number("temperature", 0.0, 2.0);
  o.top_p = f.number("top_p", 0.0, 1.0);
  o.seed = read_seed(f, "seed");
  o.stop = f.str_or_list("stop", limits.max_stop, limits.max_stop_bytes);
  auto mt = f.uint("max_tokens", 1, kMaxTokens);
  auto mct = f.uint("max_completion_tokens", 1, kMaxTokens);
  if (mt && mct && *mt != *mct)
    f.fail(invalid_field("max_completion_tokens", "differs from max_tokens; give one of them"));
  if (mct) mt = mct;
  if (mt) o.max_tokens = static_cast<std::uint32_t>(*mt);
  c.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.take("stream_options")) {
    if (!so->is_object()) {
      f.fail(invalid_field("stream_options", "expected an object"));
    } else {
      FieldReader s(*so, "stream_options.");
      c.include_usage = s.boolean("include_usage").value_or(false);
      if (auto e = s.finish({"include_obfuscation"})) f.fail(*e);
      if (!c.stream && !f.failed()) f.fail(invalid_field("stream_options", "is only allowed with stream: true"));
    }
  }
  c.user = f.str("user");
  // Accepted at the one value that means "not used".
  f.only("n", 1, "Tandem returns one choice per request");
  f.only("logprobs", false, "log-probabilities are not returned");
  f.only("presence_penalty", 0, "use tandem.repetition_penalty");
  f.only("frequency_penalty", 0, "use tandem.repetition_penalty");
  if (const json* lb = f.take("logit_bias"))
    if (!(lb->is_object() && lb->empty())) f.fail(unsupported_field("logit_bias"));
  // An empty tool list is no tools (some clients always send one).
  if (const json* t = f.take("tools"))
    if (!(t->is_array() && t->empty())) f.fail(unsupported_field("tools", "tool calling"));
  read_tandem_extension(f, o);
}

// Message content: a string, or an array of {"type":"text","text":...} parts (joined).
std::optional<std::string> openai_content(const json& v, const std::string& where, FieldReader& f) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) {
    f.fail(invalid_field(where, "expected a string or an array of content parts"));
    return std::nullopt;
  }
  std::string text;
  for (std::size_t j = 0; j < v.size(); ++j) {
    const std::string w = where + "[" + std::to_string(j) + "]";
    if (!v[j].is_object()) {
      f.fail(invalid_field(w, "expected a content part object"));
      return std::nullopt;
    }
    FieldReader p(v[j], w + ".");
    auto type = p.str("type");
    if (!type) {
      f.fail(p.failed() ? *p.finish({}) : invalid_field(w + ".type", "missing"));
      return std::nullopt;
    }
    if (*type != "text") {
      f.fail(unsupported_field(w + ".type", "content parts of type '" + *type +
                                                "' (this model reads text; images go to /v1/embeddings for CLIP models)"));
      return std::nullopt;
    }
    auto t = p.str("text");
    if (auto e = p.finish({"cache_control"})) {
      f.fail(*e);
      return std::nullopt;
    }
    if (!t) {
      f.fail(invalid_field(w + ".text", "missing"));
      return std::nullopt;
    }
    text += *t;
  }
  return text;
}

std::optional<std::string> required_model(FieldReader& f) {
  auto m = f.str("model", false);
  if (!m && !f.failed()) f.fail(invalid_field("model", "missing (GET /v1/models lists them)"));
  return m;
}

}  // namespace

ApiResult<GenerateCall> parse_openai_chat(std::string_view body, const BodyLimits& limits) {
  auto j = parse_json_object(body, limits);
  if (!j.ok()) return *j.error;
  GenerateCall c;
  c.api = Api::openai_chat;
  FieldReader f(*j);
  if (auto m = required_model(f)) c.model = *m;
  const json* msgs = f.take("messages");
  if (!msgs && !f.failed()) f.fail(invalid_field("messages", "missing"));
  if (msgs) {
    if (!msgs->is_array() || msgs->empty()) {
      f.fail(invalid_field("messages", "expected a non-empty array"));
    } else if (msgs->size() > limits.max_messages) {
      f.fail(invalid_field("messages", "at most " + std::to_string(limits.max_messages) + " messages"));
    } else {
      for (std::size_t i = 0; i < msgs->size() && !f.failed(); ++i) {
        const std::string w = "messages[" + std::to_string(i) + "]";
        const json& m = (*msgs)[i];
        if (!m.is_object()) {
          f.fail(invalid_field(w, "expected an object"));
          break;
        }
        FieldReader mf(m, w + ".");
        auto role = mf.str("role");
        std::optional<std::string> content;
        if (const json* cv = mf.take("content")) content = openai_content(*cv, w + ".content", mf);
        if (auto e = mf.finish({"name", "tool_calls", "tool_call_id", "function_call", "refusal", "audio"})) {
          f.fail(*e);
          break;
        }
        if (!role) {
          f.fail(invalid_field(w + ".role", "missing"));
          break;
        }
        std::string r = *role;
        if (r == "developer") r = "system";  // OpenAI's newer name for the system role
        if (r == "tool" || r == "function") {
          f.fail(unsupported_field(w + ".role", "tool messages (Tandem does not implement tools)"));
          break;
        }
        if (r != "system" && r != "user" && r != "assistant") {
          f.fail(invalid_field(w + ".role", "expected system, developer, user or assistant"));
          break;
        }
        if (!content) {
          f.fail(invalid_field(w + ".content", "missing"));
          break;
        }
        c.request.messages.push_back({r, *content});
      }
    }
  }
  read_openai_sampling(f, c, limits);
  // vLLM's and llama.cpp server's extension, which OpenAI clients send for Qwen3: {"enable_thinking": false}.
  if (const json* k = f.take("chat_template_kwargs")) {
    if (!k->is_object()) {
      f.fail(invalid_field("chat_template_kwargs", "expected an object"));
    } else {
      FieldReader kf(*k, "chat_template_kwargs.");
      c.request.options.enable_thinking = kf.boolean("enable_thinking");
      if (auto e = kf.finish({})) f.fail(*e);
    }
  }
  if (auto e = f.finish(kOpenAiUnsupported)) return *e;
  return c;
}

ApiResult<GenerateCall> parse_openai_completion(std::string_view body, const BodyLimits& limits) {
  auto j = parse_json_object(body, limits);
  if (!j.ok()) return *j.error;
  GenerateCall c;
  c.api = Api::openai_completion;
  FieldReader f(*j);
  if (auto m = required_model(f)) c.model = *m;
  const json* p = f.take("prompt");
  if (!p && !f.failed()) f.fail(invalid_field("prompt", "missing"));
  if (p) {
    if (p->is_string()) {
      c.request.prompt = p->get<std::string>();
    } else if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
      c.request.prompt = (*p)[0].get<std::string>();
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
      f.fail(unsupported_field("prompt", "token-id prompts (send the text)"));
    } else if (p->is_array() && p->size() > 1) {
      f.fail(unsupported_field("prompt", "several prompts in one request (send one request per prompt)"));
    } else {
      f.fail(invalid_field("prompt", "expected a string"));
    }
    if (!f.failed() && c.request.prompt.empty()) f.fail(invalid_field("prompt", "must not be empty"));
  }
  f.only("echo", false, "the prompt is not echoed");
  f.only("best_of", 1, "Tandem generates one completion per request");
  read_openai_sampling(f, c, limits);
  if (auto e = f.finish(kOpenAiUnsupported)) return *e;
  return c;
}

namespace {

// Ollama's "options" object -> SubmitOptions.
void read_ollama_options(FieldReader& f, GenerateCall& c, const BodyLimits& limits) {
  client::SubmitOptions& o = c.request.options;
  const json* opts = f.take("options");
  if (!opts) return;
  if (!opts->is_object()) {
    f.fail(invalid_field("options", "expected an object"));
    return;
  }
  FieldReader x(*opts, "options.");
  o.temperature = x.number("temperature", 0.0, 2.0);
  o.top_p = x.number("top_p", 0.0, 1.0);
  if (auto k = x.uint("top_k", 0, 1u << 20)) o.top_k = static_cast<std::uint32_t>(*k);
  o.seed = read_seed(x, "seed");
  o.repetition_penalty = x.number("repeat_penalty", 0.0, 10.0);
  if (const json* np = x.take("num_predict")) {
    // -1 = until the end (tandemd's limit: the model's context), -2 = fill the context: both leave it unset.
    if (np->is_number_integer() && np->get<std::int64_t>() < 0) {
      if (np->get<std::int64_t>() < -2) x.fail(invalid_field("options.num_predict", "expected -2, -1 or a positive integer"));
    } else if (np->is_number_integer() && np->get<std::int64_t>() >= 1 &&
               static_cast<std::uint64_t>(np->get<std::int64_t>()) <= kMaxTokens) {
      o.max_tokens = static_cast<std::uint32_t>(np->get<std::int64_t>());
    } else {
      x.fail(invalid_field("options.num_predict", "expected -2, -1 or an integer from 1 to " + std::to_string(kMaxTokens)));
    }
  }
  if (auto s = x.str_or_list("stop", limits.max_stop * 4, limits.max_stop_bytes)) o.stop = s;
  // The context size: Tandem runs every model at its own context; a request may name it or less (checked against
  // the model by the gateway), not more.
  if (auto n = x.uint("num_ctx", 1, 1u << 24)) c.num_ctx = static_cast<std::uint32_t>(*n);
  if (auto e = x.finish(kOllamaOptionsUnsupported)) f.fail(*e);
}

// keep_alive: a duration string ("5m", "1h", "-1") or a number of seconds (negative = forever).
void read_keep_alive(FieldReader& f, std::optional<std::string>& out) {
  const json* k = f.take("keep_alive");
  if (!k) return;
  if (k->is_string()) out = k->get<std::string>();
  else if (k->is_number()) out = k->dump();
  else f.fail(invalid_field("keep_alive", "expected a duration string or a number of seconds"));
}

void read_ollama_common(FieldReader& f, GenerateCall& c, const BodyLimits& limits) {
  c.stream = f.boolean("stream").value_or(true);  // Ollama streams unless told not to
  read_ollama_options(f, c, limits);
  if (const json* t = f.take("tools"))
    if (!(t->is_array() && t->empty())) f.fail(unsupported_field("tools", "tool calling"));
  read_keep_alive(f, c.keep_alive);
  if (const json* fm = f.take("format"))
    if (!(fm->is_string() && fm->get<std::string>().empty()))
      f.fail(unsupported_field("format", "constrained (JSON) output"));
  // think: false is Qwen3's "no reasoning" (the template's enable_thinking false); true would need the reasoning
  // returned apart, in "thinking", which Tandem does not do.
  if (const json* t = f.take("think")) {
    if (*t == false) c.request.options.enable_thinking = false;
    else f.fail(unsupported_field("think", "thinking output"));  // (true, or a level such as "high")
  }
  read_tandem_extension(f, c.request.options);
}

}  // namespace

ApiResult<GenerateCall> parse_ollama_chat(std::string_view body, const BodyLimits& limits) {
  auto j = parse_json_object(body, limits);
  if (!j.ok()) return *j.error;
  GenerateCall c;
  c.api = Api::ollama_chat;
  FieldReader f(*j);
  if (auto m = required_model(f)) c.model = *m;
  if (const json* msgs = f.take("messages")) {
    if (!msgs->is_array()) {
      f.fail(invalid_field("messages", "expected an array"));
    } else if (msgs->size() > limits.max_messages) {
      f.fail(invalid_field("messages", "at most " + std::to_string(limits.max_messages) + " messages"));
    } else {
      for (std::size_t i = 0; i < msgs->size() && !f.failed(); ++i) {
        const std::string w = "messages[" + std::to_string(i) + "]";
        if (!(*msgs)[i].is_object()) {
          f.fail(invalid_field(w, "expected an object"));
          break;
        }
        FieldReader mf((*msgs)[i], w + ".");
        auto role = mf.str("role");
        auto content = mf.str("content");
        if (const json* im = mf.take("images"))
          if (!(im->is_array() && im->empty())) mf.fail(unsupported_field(w + ".images", "images in chat messages"));
        if (auto e = mf.finish({"tool_calls", "thinking", "tool_name"})) {
          f.fail(*e);
          break;
        }
        if (!role || (*role != "system" && *role != "user" && *role != "assistant")) {
          if (role && *role == "tool") f.fail(unsupported_field(w + ".role", "tool messages"));
          else f.fail(invalid_field(w + ".role", "expected system, user or assistant"));
          break;
        }
        c.request.messages.push_back({*role, content.value_or("")});
      }
    }
  }
  read_ollama_common(f, c, limits);
  if (auto e = f.finish(kOllamaUnsupported)) return *e;
  c.load_only = c.request.messages.empty();
  return c;
}

ApiResult<GenerateCall> parse_ollama_generate(std::string_view body, const BodyLimits& limits) {
  auto j = parse_json_object(body, limits);
  if (!j.ok()) return *j.error;
  GenerateCall c;
  c.api = Api::ollama_generate;
  FieldReader f(*j);
  if (auto m = required_model(f)) c.model = *m;
  auto prompt = f.str("prompt");
  auto system = f.str("system");
  const bool raw = f.boolean("raw").value_or(false);
  if (const json* im = f.take("images"))
    if (!(im->is_array() && im->empty())) f.fail(unsupported_field("images", "image input to a language model"));
  read_ollama_common(f, c, limits);
  if (auto e = f.finish(kOllamaUnsupported)) return *e;
  if (raw) {
    if (system) return invalid_field("system", "not used with raw: true (the prompt is sent as it is)");
    c.request.prompt = prompt.value_or("");
    c.load_only = c.request.prompt.empty();
  } else {
    // As Ollama does: the prompt is the user's turn, rendered with the model's own chat template.
    if (system && !system->empty()) c.request.messages.push_back({"system", *system});
    if (prompt && !prompt->empty()) c.request.messages.push_back({"user", *prompt});
    c.load_only = !prompt || prompt->empty();
  }
  return c;
}

// ---------------------------------------------------------------------------------------------------------------
// Embeddings

namespace {

// {"type":"image_url","image_url":{"url":"data:image/png;base64,..."}} -> the image bytes (docs/http.md).
std::optional<EmbedInput> image_input(const json& v, const std::string& where, FieldReader& f) {
  FieldReader p(v, where + ".");
  auto type = p.str("type");
  const json* iu = p.take("image_url");
  if (auto e = p.finish({})) {
    f.fail(*e);
    return std::nullopt;
  }
  if (!type || *type != "image_url" || !iu) {
    f.fail(invalid_field(where, "an object input must be {\"type\":\"image_url\",\"image_url\":{\"url\":\"data:...\"}}"));
    return std::nullopt;
  }
  std::string url;
  if (iu->is_string()) {
    url = iu->get<std::string>();
  } else if (iu->is_object()) {
    FieldReader u(*iu, where + ".image_url.");
    url = u.str("url").value_or("");
    if (auto e = u.finish({"detail"})) {
      f.fail(*e);
      return std::nullopt;
    }
  }
  const std::string w = where + ".image_url.url";
  if (!url.starts_with("data:")) {
    f.fail(unsupported_field(w, "image URLs other than data: URLs (Tandem fetches nothing from the network)"));
    return std::nullopt;
  }
  const auto comma = url.find(',');
  if (comma == std::string::npos || url.substr(0, comma).find(";base64") == std::string::npos) {
    f.fail(invalid_field(w, "expected data:image/png;base64,... or data:image/jpeg;base64,..."));
    return std::nullopt;
  }
  auto bytes = base64_decode(std::string_view(url).substr(comma + 1));
  if (!bytes || bytes->empty()) {
    f.fail(invalid_field(w, "the data URL's payload is not valid base64"));
    return std::nullopt;
  }
  EmbedInput in;
  in.kind = EmbedInputKind::image;
  in.bytes = std::move(*bytes);
  return in;
}

// A token array ([1, 2, 3]): non-negative integers below 2^32, at least one. Whether each is in the model's
// vocabulary is tandemd's to say (it knows the model).
std::optional<EmbedInput> token_input(const json& v, const std::string& where, FieldReader& f) {
  EmbedInput in;
  in.kind = EmbedInputKind::tokens;
  if (v.empty()) {
    f.fail(invalid_field(where, "an empty token array has no embedding"));
    return std::nullopt;
  }
  in.tokens.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    const bool id = t.is_number_integer() &&
                    (t.is_number_unsigned() ? t.get<std::uint64_t>() <= UINT32_MAX : t.get<std::int64_t>() >= 0);
    if (!id) {
      f.fail(invalid_field(where + "[" + std::to_string(i) + "]", "a token id is an integer in 0..4294967295"));
      return std::nullopt;
    }
    in.tokens.push_back(static_cast<std::uint32_t>(t.get<std::uint64_t>()));
  }
  return in;
}

// `tokens`: token arrays are accepted (OpenAI's input); Ollama's embed API takes texts only.
void read_inputs(FieldReader& f, const char* key, EmbedCall& c, const BodyLimits& limits, bool images, bool tokens) {
  const json* in = f.take(key);
  if (!in) {
    if (!f.failed()) f.fail(invalid_field(key, "missing"));
    return;
  }
  auto one = [&](const json& v, const std::string& where) {
    if (v.is_string()) {
      if (v.get<std::string>().empty()) {
        f.fail(invalid_field(where, "an empty text has no embedding"));
        return;
      }
      c.inputs.push_back({EmbedInputKind::text, v.get<std::string>(), {}, {}});
    } else if (v.is_object() && images) {
      if (auto im = image_input(v, where, f)) c.inputs.push_back(std::move(*im));
    } else if (v.is_array() && tokens) {
      if (auto t = token_input(v, where, f)) c.inputs.push_back(std::move(*t));
    } else if (v.is_array() || v.is_number()) {
      f.fail(unsupported_field(where, "token-id input (send the text)"));
    } else {
      f.fail(invalid_field(where, tokens ? "expected a string or an array of token ids" : "expected a string"));
    }
  };
  if (in->is_array()) {
    if (in->empty()) f.fail(invalid_field(key, "an empty list has no embedding"));
    if (!in->empty() && (*in)[0].is_number()) {  // one token array
      if (!tokens) f.fail(unsupported_field(key, "token-id input (send the text)"));
      else one(*in, key);
      return;
    }
    if (in->size() > limits.max_inputs)
      f.fail(invalid_field(key, "at most " + std::to_string(limits.max_inputs) + " inputs per request"));
    for (std::size_t i = 0; i < in->size() && !f.failed(); ++i)
      one((*in)[i], std::string(key) + "[" + std::to_string(i) + "]");
  } else {
    one(*in, key);
  }
}

}  // namespace

ApiResult<EmbedCall> parse_openai_embeddings(std::string_view body, const BodyLimits& limits) {
  auto j = parse_json_object(body, limits);
  if (!j.ok()) return *j.error;
  EmbedCall c;
  c.api = EmbedApi::openai;
  FieldReader f(*j);
  if (auto m = required_model(f)) c.model = *m;
  read_inputs(f, "input", c, limits, /*images=*/true, /*tokens=*/true);
  if (auto ef = f.str("encoding_format")) {
    if (*ef == "base64") c.base64 = true;
    else if (*ef != "float") f.fail(invalid_field("encoding_format", "expected float or base64"));
  }
  if (auto d = f.uint("dimensions", 1, 1u << 16)) c.dimensions = static_cast<std::uint32_t>(*d);
  c.user = f.str("user");
  if (const json* t = f.take("tandem")) {
    if (!t->is_object()) {
      f.fail(invalid_field("tandem", "expected an object"));
    } else {
      FieldReader x(*t, "tandem.");
      c.truncate = x.boolean("truncate");
      if (auto e = x.finish({})) f.fail(*e);
    }
  }
  if (auto e = f.finish(kOpenAiUnsupported)) return *e;
  return c;
}

ApiResult<EmbedCall> parse_ollama_embed(std::string_view body, bool legacy, const BodyLimits& limits) {
  auto j = parse_json_object(body, limits);
  if (!j.ok()) return *j.error;
  EmbedCall c;
  c.api = legacy ? EmbedApi::ollama_legacy : EmbedApi::ollama_embed;
  FieldReader f(*j);
  if (auto m = required_model(f)) c.model = *m;
  if (legacy) {
    auto p = f.str("prompt", false);
    if (p) c.inputs.push_back({EmbedInputKind::text, *p, {}, {}});
    else if (!f.failed()) f.fail(invalid_field("prompt", "missing"));
  } else {
    read_inputs(f, "input", c, limits, /*images=*/false, /*tokens=*/false);
    c.truncate = f.boolean("truncate");
    if (auto d = f.uint("dimensions", 1, 1u << 16)) c.dimensions = static_cast<std::uint32_t>(*d);
  }
  read_keep_alive(f, c.keep_alive);
  if (const json* o = f.take("options"))
    if (!(o->is_object() && o->empty())) f.fail(unsupported_field("options", "sampling options for an embedding"));
  if (auto e = f.finish(kOllamaUnsupported)) return *e;
  return c;
}

EmbedPlan plan_embed(const EmbedCall& call) {
  EmbedPlan p;
  p.request.model = call.model;
  p.request.options.truncate = call.truncate;
  std::size_t texts = 0, tokens = 0;
  for (const auto& in : call.inputs) {
    texts += in.kind == EmbedInputKind::text;
    tokens += in.kind == EmbedInputKind::tokens;
  }
  std::size_t ti = 0, ki = 0, ii = 0;
  for (const auto& in : call.inputs) {
    switch (in.kind) {
      case EmbedInputKind::text:
        p.order.push_back(ti++);
        p.request.texts.push_back(in.text);
        break;
      case EmbedInputKind::tokens:
        p.order.push_back(texts + ki++);
        p.request.tokens.push_back(in.tokens);
        break;
      case EmbedInputKind::image:
        p.order.push_back(texts + tokens + ii++);
        p.request.images.push_back(in.bytes);
        break;
    }
  }
  return p;
}

std::optional<std::size_t> embed_input_index(std::string_view message, const EmbedPlan& plan) {
  const std::size_t texts = plan.request.texts.size(), tokens = plan.request.tokens.size();
  struct Prefix {
    std::string_view name;
    std::size_t base, count;
  };
  for (const Prefix p : {Prefix{"texts[", 0, texts}, Prefix{"tokens[", texts, tokens},
                         Prefix{"images[", texts + tokens, plan.request.images.size()}}) {
    if (!message.starts_with(p.name)) continue;
    std::size_t k = 0, at = p.name.size(), digits = 0;
    for (; at < message.size() && message[at] >= '0' && message[at] <= '9' && digits < 9; ++at, ++digits)
      k = k * 10 + static_cast<std::size_t>(message[at] - '0');
    if (digits == 0 || at >= message.size() || message[at] != ']' || k >= p.count) return std::nullopt;
    for (std::size_t j = 0; j < plan.order.size(); ++j)
      if (plan.order[j] == p.base + k) return j;
    return std::nullopt;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------------------------
// Base64

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string base64_encode(const std::uint8_t* data, std::size_t n) {
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    const std::uint32_t v = (data[i] << 16) | (data[i + 1] << 8) | data[i + 2];
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (n - i == 1) {
    const std::uint32_t v = data[i] << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (n - i == 2) {
    const std::uint32_t v = (data[i] << 16) | (data[i + 1] << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::optional<std::vector<std::uint8_t>> base64_decode(std::string_view text) {
  static const std::array<int, 256> table = [] {
    std::array<int, 256> t{};
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(kB64[i])] = i;
    return t;
  }();
  if (text.size() % 4 != 0) return std::nullopt;
  std::vector<std::uint8_t> out;
  out.reserve(text.size() / 4 * 3);
  for (std::size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char ch = text[i + k];
      if (ch == '=') {
        if (i + 4 != text.size() || k < 2) return std::nullopt;
        v[k] = 0;
        ++pad;
      } else {
        if (pad) return std::nullopt;  // data after padding
        v[k] = table[static_cast<unsigned char>(ch)];
        if (v[k] < 0) return std::nullopt;
      }
    }
    const std::uint32_t w = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out.push_back(static_cast<std::uint8_t>(w >> 16));
    if (pad < 2) out.push_back(static_cast<std::uint8_t>((w >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<std::uint8_t>(w & 0xff));
  }
  return out;
}

}  // namespace tandem::http
