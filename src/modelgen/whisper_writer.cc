#include "modelgen/whisper_writer.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "generation/rng.h"
#include "kernels/quant.h"
#include "modelgen/modelgen.h"
#include "weights/gguf.h"

namespace tandem::modelgen {

namespace fs = std::filesystem;

weights::WhisperConfig WhisperShape::config() const {
  weights::WhisperConfig c;
  c.d_model = d_model;
  c.encoder_layers = encoder_layers;
  c.decoder_layers = decoder_layers;
  c.encoder_heads = encoder_heads;
  c.decoder_heads = decoder_heads;
  c.encoder_ffn = encoder_ffn;
  c.decoder_ffn = decoder_ffn;
  c.n_mels = n_mels;
  c.source_positions = source_positions;
  c.target_positions = target_positions;
  c.vocab = vocab;
  c.scale_embedding = scale_embedding;
  c.decoder_start_id = decoder_start_id;
  c.eos_id = eos_id;
  c.pad_id = pad_id;
  c.bos_id = bos_id;
  return c;
}

std::uint64_t WhisperShape::parameters() const {
  std::uint64_t n = 0;
  for (const auto& [name, shape] : weights::whisper_required_tensors(config())) {
    std::uint64_t k = 1;
    for (auto d : shape) k *= static_cast<std::uint64_t>(d);
    n += k;
  }
  return n;
}

Result<WhisperShape> whisper_preset(std::string_view name) {
  WhisperShape s;
  auto set = [&](int d, int layers, int heads, int ffn) {
    s.d_model = d;
    s.encoder_layers = s.decoder_layers = layers;
    s.encoder_heads = s.decoder_heads = heads;
    s.encoder_ffn = s.decoder_ffn = ffn;
  };
  if (name == "whisper-tiny") return s;
  if (name == "whisper-test") {
    set(32, 2, 2, 64);
    s.target_positions = 64;
    s.vocab = 300;
    s.eos_id = s.bos_id = s.pad_id = 296;
    s.decoder_start_id = 297;
    s.no_timestamps_id = 299;
    return s;
  }
  if (name == "whisper-base") {
    set(512, 6, 8, 2048);
    return s;
  }
  if (name == "whisper-small") {
    set(768, 12, 12, 3072);
    return s;
  }
  if (name == "whisper-large-v3") {
    set(1280, 32, 20, 5120);
    s.n_mels = 128;
    s.vocab = 51866;
    s.no_timestamps_id = 50364;
    return s;
  }
  return fail(Errc::invalid_argument, "unknown Whisper preset '" + std::string(name) +
                                          "' (whisper-test, whisper-tiny, whisper-base, whisper-small, whisper-large-v3)");
}

std::vector<float> whisper_sinusoids(int length, int channels) {
  const int half = channels / 2;
  const double inc = std::log(10000.0) / static_cast<double>(half - 1);
  std::vector<float> out(static_cast<std::size_t>(length) * static_cast<std::size_t>(channels));
  for (int t = 0; t < length; ++t)
    for (int k = 0; k < half; ++k) {
      // As whisper's sinusoids() computes it in f32: exp(f32(−inc) · k) times the position, both f32.
      const float inv = std::exp(static_cast<float>(-inc) * static_cast<float>(k));
      const float x = static_cast<float>(t) * inv;
      out[static_cast<std::size_t>(t) * channels + k] = std::sin(x);
      out[static_cast<std::size_t>(t) * channels + half + k] = std::cos(x);
    }
  return out;
}

namespace {

Status check(const WhisperWriteOptions& o) {
  const WhisperShape& s = o.shape;
  auto bad = [](const std::string& m) { return fail(Errc::invalid_argument, "Whisper shape: " + m); };
  if (s.d_model < 4 || s.d_model % 2 != 0) return bad("d_model must be even and >= 4");
  for (int h : {s.encoder_heads, s.decoder_heads})
    if (h < 1 || s.d_model % h != 0) return bad("heads must divide d_model");
  for (int l : {s.encoder_layers, s.decoder_layers})
    if (l < 1 || l > 1024) return bad("layers must be in [1, 1024]");
  if (s.encoder_ffn < 1 || s.decoder_ffn < 1) return bad("ffn dims must be >= 1");
  if (s.n_mels < 1 || s.n_mels > 1024) return bad("n_mels must be in [1, 1024]");
  if (s.source_positions < 1 || s.target_positions < 2) return bad("positions out of range");
  if (s.vocab < 3) return bad("vocab must be >= 3");
  for (std::int32_t id : {s.eos_id, s.bos_id, s.pad_id, s.decoder_start_id, s.no_timestamps_id})
    if (id < -1 || id >= s.vocab) return bad("special ids must be in [-1, vocab)");
  if (o.dtype != weights::DType::f32 && o.dtype != weights::DType::f16 && o.dtype != weights::DType::bf16)
    return bad("dtype must be f32, f16 or bf16");
  return {};
}

std::string id_json(std::int32_t v) { return v >= 0 ? std::to_string(v) : std::string("null"); }

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return fail(Errc::io_error, path + ": cannot open");
  std::ostringstream o;
  o << f.rdbuf();
  if (!f && !f.eof()) return fail(Errc::io_error, path + ": read error");
  return o.str();
}

}  // namespace

Status write_whisper_model(const std::string& dir, const WhisperWriteOptions& o) {
  TANDEM_TRY(check(o));
  const WhisperShape& s = o.shape;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return fail(Errc::io_error, "cannot create " + dir + ": " + ec.message());
  const char* torch_dtype = o.dtype == weights::DType::f32 ? "float32" : o.dtype == weights::DType::f16 ? "float16" : "bfloat16";

  std::ostringstream cfg;
  cfg << "{\n  \"architectures\": [\"WhisperForConditionalGeneration\"],\n  \"model_type\": \"whisper\",\n"
      << "  \"d_model\": " << s.d_model << ",\n  \"encoder_layers\": " << s.encoder_layers
      << ",\n  \"decoder_layers\": " << s.decoder_layers << ",\n  \"encoder_attention_heads\": " << s.encoder_heads
      << ",\n  \"decoder_attention_heads\": " << s.decoder_heads << ",\n  \"encoder_ffn_dim\": " << s.encoder_ffn
      << ",\n  \"decoder_ffn_dim\": " << s.decoder_ffn << ",\n  \"num_mel_bins\": " << s.n_mels
      << ",\n  \"max_source_positions\": " << s.source_positions << ",\n  \"max_target_positions\": " << s.target_positions
      << ",\n  \"vocab_size\": " << s.vocab << ",\n  \"activation_function\": \"gelu\",\n  \"scale_embedding\": "
      << (s.scale_embedding ? "true" : "false") << ",\n  \"decoder_start_token_id\": " << id_json(s.decoder_start_id)
      << ",\n  \"eos_token_id\": " << id_json(s.eos_id) << ",\n  \"bos_token_id\": " << id_json(s.bos_id)
      << ",\n  \"pad_token_id\": " << id_json(s.pad_id) << ",\n  \"num_hidden_layers\": " << s.encoder_layers
      << ",\n  \"dropout\": 0.0,\n  \"attention_dropout\": 0.0,\n  \"activation_dropout\": 0.0,\n"
      << "  \"init_std\": 0.02,\n  \"use_cache\": true,\n  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \""
      << torch_dtype << "\"\n}\n";
  TANDEM_TRY(write_text_file((fs::path(dir) / "config.json").string(), cfg.str()));

  std::ostringstream pre;
  pre << "{\n  \"feature_extractor_type\": \"WhisperFeatureExtractor\",\n  \"feature_size\": " << s.n_mels
      << ",\n  \"sampling_rate\": 16000,\n  \"hop_length\": 160,\n  \"n_fft\": 400,\n  \"chunk_length\": 30,\n"
      << "  \"n_samples\": 480000,\n  \"nb_max_frames\": 3000,\n  \"padding_side\": \"right\",\n"
      << "  \"padding_value\": 0.0,\n  \"return_attention_mask\": false,\n  \"processor_class\": \"WhisperProcessor\"\n}\n";
  TANDEM_TRY(write_text_file((fs::path(dir) / "preprocessor_config.json").string(), pre.str()));

  std::string begin_suppress;
  for (std::int32_t id : {std::int32_t{220}, s.eos_id})
    if (id >= 0 && id < s.vocab) begin_suppress += (begin_suppress.empty() ? "" : ", ") + std::to_string(id);
  std::ostringstream gen;
  gen << "{\n  \"decoder_start_token_id\": " << id_json(s.decoder_start_id) << ",\n  \"eos_token_id\": "
      << id_json(s.eos_id) << ",\n  \"bos_token_id\": " << id_json(s.bos_id) << ",\n  \"pad_token_id\": "
      << id_json(s.pad_id) << ",\n  \"no_timestamps_token_id\": " << id_json(s.no_timestamps_id)
      << ",\n  \"max_initial_timestamp_index\": 50,\n  \"max_length\": " << s.target_positions
      << ",\n  \"suppress_tokens\": [],\n  \"begin_suppress_tokens\": [" << begin_suppress << "]\n}\n";
  TANDEM_TRY(write_text_file((fs::path(dir) / "generation_config.json").string(), gen.str()));

  const auto required = weights::whisper_required_tensors(s.config());
  std::vector<std::vector<std::byte>> storage(required.size());
  std::vector<weights::TensorToWrite> all;
  std::vector<float> vals;
  for (std::size_t ti = 0; ti < required.size(); ++ti) {
    const auto& [name, shape] = required[ti];
    std::uint64_t numel = 1;
    for (auto d : shape) numel *= static_cast<std::uint64_t>(d);
    vals.assign(numel, 0.0F);
    const bool ln = name.find("layer_norm") != std::string::npos;
    if (o.source) {
      o.source(name, vals);
      if (vals.size() != numel) return fail(Errc::invalid_argument, "weight source returned a wrong size for " + name);
    } else if (name == "model.encoder.embed_positions.weight") {
      vals = whisper_sinusoids(s.source_positions, s.d_model);
    } else {
      const float a = (ln ? 0.1F : 0.02F) * std::sqrt(3.0F);
      const float base = ln && name.ends_with(".weight") ? 1.0F : 0.0F;
      fill_uniform(vals, base, a, o.seed, static_cast<std::uint32_t>(ti), 0x5A15);
    }
    auto& buf = storage[ti];
    encode_floats(vals, o.dtype, buf);
    all.push_back({name, o.dtype, shape, std::span<const std::byte>(buf)});
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"generator", "tandem-mkmodel"}};
  return weights::write_safetensors((fs::path(dir) / "model.safetensors").string(), all, meta);
}

Result<ConvertStats> convert_whisper_to_gguf(const std::string& hf_dir, const std::string& out_file, Recipe r) {
  using kernels::WType;
  using weights::GgufType;
  using weights::GgufValue;
  if (r != Recipe::f32 && r != Recipe::f16 && r != Recipe::bf16 && r != Recipe::q8_0)
    return fail(Errc::unsupported, "Whisper GGUF: type " + std::string(recipe_name(r)) + " is not supported (F32, F16, BF16, Q8_0)");
  auto text = read_text(hf_dir + "/config.json");
  if (!text) return fail(std::move(text).error());
  auto cfg = weights::parse_whisper_config(*text, hf_dir + "/config.json");
  if (!cfg) return fail(std::move(cfg).error());
  const weights::WhisperConfig& c = *cfg;
  auto st = weights::open_safetensors_weights(hf_dir);
  if (!st) return fail(std::move(st).error());

  weights::GgufWriter w;
  auto u32 = [](std::int64_t v) { return GgufValue::of_uint(GgufType::u32, static_cast<std::uint64_t>(v)); };
  w.set("general.architecture", GgufValue::of_string("whisper"));
  w.set("general.file_type", u32(static_cast<std::int64_t>(r)));
  w.set("general.name", GgufValue::of_string(fs::path(hf_dir).filename().string()));
  w.set("whisper.embedding_length", u32(c.d_model));
  w.set("whisper.n_mels", u32(c.n_mels));
  w.set("whisper.encoder.block_count", u32(c.encoder_layers));
  w.set("whisper.encoder.attention.head_count", u32(c.encoder_heads));
  w.set("whisper.encoder.feed_forward_length", u32(c.encoder_ffn));
  w.set("whisper.encoder.context_length", u32(c.source_positions));
  w.set("whisper.decoder.block_count", u32(c.decoder_layers));
  w.set("whisper.decoder.attention.head_count", u32(c.decoder_heads));
  w.set("whisper.decoder.feed_forward_length", u32(c.decoder_ffn));
  w.set("whisper.decoder.context_length", u32(c.target_positions));
  w.set("whisper.scale_embedding", GgufValue::of_bool(c.scale_embedding));
  for (auto [key, id] : {std::pair{"whisper.decoder_start_token_id", c.decoder_start_id}, std::pair{"whisper.eos_token_id", c.eos_id},
                         std::pair{"whisper.pad_token_id", c.pad_id}, std::pair{"whisper.bos_token_id", c.bos_id}})
    w.set(key, GgufValue::of_int(GgufType::i32, id));

  auto tensors = weights::whisper_required_tensors(c);
  if (st->find("proj_out.weight")) tensors.push_back({"proj_out.weight", {c.vocab, c.d_model}});
  ConvertStats stats;
  const WType half = r == Recipe::bf16 ? WType::bf16 : WType::f16;
  for (const auto& [name, shape] : tensors) {
    const weights::TensorView* tv = st->find(name);
    if (!tv) return fail(Errc::format_error, hf_dir + ": required tensor '" + name + "' is missing");
    if (tv->shape != shape) return fail(Errc::format_error, hf_dir + ": tensor '" + name + "' has the wrong shape for config.json");
    if (!tv->type_supported) return fail(Errc::unsupported, hf_dir + ": tensor '" + name + "' is not F32, F16 or BF16");
    WType type = WType::f32;
    if (r != Recipe::f32 && shape.size() >= 2) {
      const bool positions = name.find("embed_positions") != std::string::npos;
      if (shape.size() == 3 || positions) type = half;
      else type = r == Recipe::q8_0 && shape.back() % 32 != 0 ? WType::f16 : r == Recipe::q8_0 ? recipe_default_type(r) : half;
    }
    const std::int64_t cols = shape.back();
    const std::uint64_t rows = static_cast<std::uint64_t>(tv->data.size() / kernels::row_bytes(tv->type, cols));
    const std::size_t in_rb = kernels::row_bytes(tv->type, cols), out_rb = kernels::row_bytes(type, cols);
    std::vector<std::byte> data(out_rb * rows);
    std::vector<float> row(static_cast<std::size_t>(cols));
    for (std::uint64_t i = 0; i < rows; ++i) {
      kernels::dequantize_row(tv->type, tv->data.data() + i * in_rb, row.data(), cols);
      kernels::quantize_row(type, row.data(), data.data() + i * out_rb, cols);
    }
    TANDEM_TRY(w.add_tensor(name, type, shape, data));
    stats.tensors++;
    stats.quantized += type != tv->type;
    stats.bytes_in += tv->data.size();
    stats.bytes_out += data.size();
    stats.types.emplace_back(name, type);
  }
  TANDEM_TRY(w.write(out_file));
  std::error_code ec;
  stats.file_bytes = fs::file_size(out_file, ec);
  return stats;
}

Result<WhisperShape> write_whisper_test_model(const std::string& dir, WhisperWriteOptions opts,
                                              const std::vector<std::string>& corpus,
                                              const tok::WhisperTokenizerWrite& tok_opts) {
  auto vocab = tok::write_whisper_tokenizer(dir, corpus, tok_opts);
  if (!vocab) return fail(std::move(vocab).error());
  auto t = tok::load_tokenizer_files(dir);
  if (!t) return fail(std::move(t).error());
  auto sp = tok::whisper_specials(*t, *vocab);
  if (!sp) return fail(std::move(sp).error());
  WhisperShape& s = opts.shape;
  s.vocab = *vocab;
  s.eos_id = s.bos_id = s.pad_id = sp->eot;
  s.decoder_start_id = sp->sot;
  s.no_timestamps_id = sp->notimestamps;
  if (auto w = write_whisper_model(dir, opts); !w) return fail(w.error());
  return s;
}

std::vector<std::string> whisper_test_corpus() {
  static const char* who[] = {"the cat", "a small dog", "my brother", "the old man", "our teacher", "a red bird",
                              "the children", "her friend"};
  static const char* did[] = {"walked to", "looked at", "painted", "carried", "found", "talked about"};
  static const char* what[] = {"the green house", "a wooden boat", "the river", "seven apples", "the quiet market",
                               "a long letter", "the morning train"};
  std::vector<std::string> out;
  for (const char* a : who)
    for (const char* b : did)
      for (const char* c : what) out.push_back(std::string(a) + " " + b + " " + c + ".");
  return out;
}

}  // namespace tandem::modelgen
