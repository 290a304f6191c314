// libFuzzer target for the speech parsers of untrusted text (src/weights/whisper_layout.cc, src/speech): the same
// bytes as a Whisper config.json (weights::parse_whisper_config, then the tensors it implies), as a journal
// checkpoint (speech::decode_checkpoint; what decodes must survive encode → decode unchanged) and as a model's
// generation_config.json (speech::Transcriber::create over a multilingual and an English-only tokenizer). A
// checkpoint that decodes is then resumed for one window (Transcriber::window) over a session that aborts when the
// transcriber breaks the DecoderSession contract (an id out of range, more text positions than the model has, a
// rewind past what was fed). Every refusal must carry a message. Built only with -Dfuzz=true; run by
// scripts/fuzz.sh --target speech. Seeds: fuzz_speech_make_corpus. Torch-free (no engine).
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "speech/session.h"
#include "speech/transcriber.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/whisper_tokens.h"
#include "weights/whisper_layout.h"

namespace {

using namespace tandem;

constexpr int kMels = 16;
constexpr int kFrames = 200;   // a 2-s window keeps each resume cheap
constexpr int kPositions = 64;  // prompts from checkpoints (up to 4096 ids) must be cut to fit

// A Whisper tokenizer written once (the corpus maker writes its generation configs from the same recipe).
struct Vocab {
  tok::Tokenizer tok;
  tok::WhisperSpecials sp;
  int total = 0;
};

std::unique_ptr<Vocab> make_vocab(int languages) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("tandem-fuzz-speech-" + std::to_string(::getpid()) + "-" + std::to_string(languages));
  std::vector<std::string> corpus;
  for (int k = 0; k < 20; ++k) corpus.push_back("hello world, the end of a transcription test number " + std::to_string(k));
  auto total = tok::write_whisper_tokenizer(dir.string(), corpus, {300, languages});
  if (!total) std::abort();
  auto t = tok::load_tokenizer_files(dir.string());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!t) std::abort();
  auto v = std::make_unique<Vocab>(Vocab{std::move(t).value(), {}, *total});
  auto sp = tok::whisper_specials(v->tok, v->total);
  if (!sp) std::abort();
  v->sp = std::move(sp).value();
  return v;
}

// Logits that favour <|endoftext|> after a few tokens; aborts when used against its contract.
class ContractSession final : public speech::DecoderSession {
 public:
  explicit ContractSession(int vocab, speech::TokenId eot) : vocab_(vocab), eot_(eot) {}
  Status encode(std::span<const float> mel, const std::atomic<bool>*) override {
    if (mel.size() != static_cast<std::size_t>(kMels) * kFrames) std::abort();
    encoded_ = true;
    fed_ = 0;
    return {};
  }
  Result<std::vector<float>> decode(std::span<const speech::TokenId> tokens, const std::atomic<bool>*) override {
    if (!encoded_ || tokens.empty() || fed_ + tokens.size() > static_cast<std::size_t>(kPositions)) std::abort();
    for (speech::TokenId id : tokens)
      if (id < 0 || id >= vocab_) std::abort();
    fed_ += tokens.size();
    std::vector<float> logits(static_cast<std::size_t>(vocab_), 0.0F);
    logits[static_cast<std::size_t>(tokens.back()) * 7 % logits.size()] = 4.0F;
    logits[static_cast<std::size_t>(eot_)] = fed_ > 8 ? 12.0F : 1.0F;
    return logits;
  }
  void rewind(std::size_t n) override {
    if (n > fed_) std::abort();
    fed_ = n;
  }
  std::size_t fed() const override { return fed_; }

 private:
  int vocab_;
  speech::TokenId eot_;
  std::size_t fed_ = 0;
  bool encoded_ = false;
};

void check_config(std::string_view text) {
  auto c = weights::parse_whisper_config(text);
  if (!c) {
    if (c.error().message.empty()) std::abort();  // every refusal must say what is wrong
    return;
  }
  if (c->d_model < 1 || c->vocab < 1 || c->encoder_heads < 1 || c->decoder_heads < 1 ||
      c->d_model % c->encoder_heads != 0 || c->d_model % c->decoder_heads != 0 || c->act != "gelu") {
    std::abort();
  }
  for (std::int32_t id : {c->decoder_start_id, c->eos_id, c->pad_id, c->bos_id})
    if (id < -1 || id >= c->vocab) std::abort();
  // The tensors the config implies: all dimensions positive, encoder and decoder layers all there.
  const auto tensors = weights::whisper_required_tensors(*c);
  std::size_t layer_norms = 0;
  for (const auto& [name, shape] : tensors) {
    if (name.empty() || shape.empty()) std::abort();
    for (std::int64_t d : shape)
      if (d < 1) std::abort();
    if (name.ends_with("final_layer_norm.weight")) ++layer_norms;
  }
  if (layer_norms != static_cast<std::size_t>(c->encoder_layers + c->decoder_layers)) std::abort();
}

// Resumes `ck` for one window over a contract-checking session.
void resume(const speech::Transcriber& tr, const Vocab& v, const speech::Checkpoint& ck) {
  static const std::vector<float> pcm = [] {
    std::vector<float> p(3 * 16000);
    std::uint32_t x = 12345;
    for (float& s : p) {
      x = x * 1664525u + 1013904223u;
      s = (static_cast<float>(x >> 8) / 16777216.0F - 0.5F) * 0.2F;
    }
    return p;
  }();
  ContractSession session(v.total, v.sp.eot);
  auto w = tr.window(pcm, ck, session, nullptr);
  if (!w) {
    if (w.error().message.empty()) std::abort();
    return;
  }
  if (!w->next.finished && w->next.seek <= ck.seek) std::abort();  // every window moves the file on
  if (w->next.prompt.size() > 4096) std::abort();                  // what the journal can read back
  for (const auto& s : w->segments)
    if (!(s.end >= s.start) || s.text.empty()) std::abort();
  auto back = speech::decode_checkpoint(speech::encode_checkpoint(w->next));
  if (!back || !(*back == w->next)) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::unique_ptr<Vocab> multi = make_vocab(99);
  static const std::unique_ptr<Vocab> english = make_vocab(0);
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  check_config(text);

  // The journal's checkpoint record.
  auto ck = speech::decode_checkpoint(text);
  if (!ck) {
    if (ck.error().message.empty()) std::abort();
  } else {
    if (ck->prompt.size() > 4096) std::abort();
    auto again = speech::decode_checkpoint(speech::encode_checkpoint(*ck));
    if (!again || !(*again == *ck)) std::abort();
  }

  // The model's generation_config.json.
  for (const Vocab* v : {multi.get(), english.get()}) {
    const speech::ModelSpeechInfo info{kMels, kFrames, kPositions, v->total};
    auto tr = speech::Transcriber::create(v->tok, v->sp, info, text, {});
    if (!tr) {
      if (tr.error().message.empty()) std::abort();
      // Without a usable generation config the checkpoint is resumed under the model's defaults.
      if (ck) {
        auto plain = speech::Transcriber::create(v->tok, v->sp, info, "", {});
        if (!plain) std::abort();
        resume(*plain, *v, *ck);
      }
      continue;
    }
    const auto prompt = tr->prompt_tokens({}, v->sp.multilingual() ? "en" : "");
    if (prompt.empty() || prompt.front() != v->sp.sot || tr->window_samples() != kFrames * 160u) std::abort();
    if (ck) resume(*tr, *v, *ck);
  }
  return 0;
}
