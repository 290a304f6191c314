// Writes the seed corpus for fuzz_speech into DIR: the config.json and generation_config.json that
// modelgen::write_whisper_model writes (whisper-test shape, and the whisper-tiny shape's config), generation configs
// matching fuzz_speech's tokenizers (multilingual and English-only, same recipe), checkpoints from
// speech::encode_checkpoint (fresh, mid-file with a prompt, with a language, finished), and one text that is both
// a generation config and a checkpoint, so the fuzzer starts inside every parser and the resume path.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "modelgen/whisper_writer.h"
#include "speech/transcriber.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/whisper_tokens.h"

using namespace tandem;

namespace {

namespace fs = std::filesystem;

bool save(const std::string& dir, const std::string& name, const std::string& text) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out << text;
  return static_cast<bool>(out.flush());
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// fuzz_speech's tokenizer recipe; returns its specials (eot < 0 on failure).
tok::WhisperSpecials fuzz_specials(const std::string& tmp, int languages) {
  std::vector<std::string> corpus;
  for (int k = 0; k < 20; ++k) corpus.push_back("hello world, the end of a transcription test number " + std::to_string(k));
  const std::string dir = tmp + "/tok" + std::to_string(languages);
  auto total = tok::write_whisper_tokenizer(dir, corpus, {300, languages});
  if (!total) return {};
  auto t = tok::load_tokenizer_files(dir);
  if (!t) return {};
  auto sp = tok::whisper_specials(*t, *total);
  return sp ? *sp : tok::WhisperSpecials{};
}

std::string generation_config(const tok::WhisperSpecials& sp, bool multilingual, const std::string& extra = "") {
  return "{\"decoder_start_token_id\": " + std::to_string(sp.sot) + ", \"eos_token_id\": " + std::to_string(sp.eot) +
         ", \"no_timestamps_token_id\": " + std::to_string(sp.notimestamps) +
         ", \"max_initial_timestamp_index\": 50, \"suppress_tokens\": [1, 2, 7, -1], \"begin_suppress_tokens\": [220, " +
         std::to_string(sp.eot) + "], \"is_multilingual\": " + (multilingual ? "true" : "false") + extra + "}";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_speech_make_corpus DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::string tmp = (fs::temp_directory_path() / ("tandem-fuzz-speech-seeds-" + std::to_string(::getpid()))).string();
  bool ok = true;

  // A model the writer wrote: its config.json and generation_config.json.
  modelgen::WhisperWriteOptions o;
  o.shape = *modelgen::whisper_preset("whisper-test");
  ok &= modelgen::write_whisper_model(tmp + "/model", o).ok();
  ok &= save(dir, "config-whisper-test.json", read(tmp + "/model/config.json"));
  ok &= save(dir, "generation-whisper-test.json", read(tmp + "/model/generation_config.json"));
  // whisper-tiny's config without its 150 MB of weights: the writer's config with the tiny shape's numbers.
  const auto tiny = modelgen::whisper_preset("whisper-tiny")->config();
  {
    std::ostringstream s;
    s << "{\"architectures\": [\"WhisperForConditionalGeneration\"], \"model_type\": \"whisper\", \"d_model\": "
      << tiny.d_model << ", \"encoder_layers\": " << tiny.encoder_layers << ", \"decoder_layers\": "
      << tiny.decoder_layers << ", \"encoder_attention_heads\": " << tiny.encoder_heads
      << ", \"decoder_attention_heads\": " << tiny.decoder_heads << ", \"encoder_ffn_dim\": " << tiny.encoder_ffn
      << ", \"decoder_ffn_dim\": " << tiny.decoder_ffn << ", \"num_mel_bins\": " << tiny.n_mels
      << ", \"max_source_positions\": " << tiny.source_positions << ", \"max_target_positions\": "
      << tiny.target_positions << ", \"vocab_size\": " << tiny.vocab
      << ", \"activation_function\": \"gelu\", \"scale_embedding\": false, \"decoder_start_token_id\": "
      << tiny.decoder_start_id << ", \"eos_token_id\": " << tiny.eos_id << ", \"pad_token_id\": " << tiny.pad_id
      << ", \"bos_token_id\": " << tiny.bos_id << "}";
    ok &= save(dir, "config-whisper-tiny.json", s.str());
  }

  // Generation configs that fuzz_speech's tokenizers accept.
  const auto multi = fuzz_specials(tmp, 99);
  const auto english = fuzz_specials(tmp, 0);
  ok &= multi.eot >= 0 && english.eot >= 0;
  ok &= save(dir, "generation-multilingual.json", generation_config(multi, true));
  ok &= save(dir, "generation-english.json", generation_config(english, false));

  // Checkpoints as the journal holds them.
  speech::Checkpoint ck;
  ok &= save(dir, "checkpoint-fresh.json", speech::encode_checkpoint(ck));
  ck.seek = 32000;
  ck.prompt = {multi.timestamp_begin, 40, 41, 42, multi.timestamp_begin + 50};
  ck.language = "en";
  ck.windows_done = 1;
  ck.segments_done = 1;
  ok &= save(dir, "checkpoint-mid.json", speech::encode_checkpoint(ck));
  ck.language = "de";
  ck.prompt.assign(100, 45);
  ok &= save(dir, "checkpoint-long-prompt.json", speech::encode_checkpoint(ck));
  ck.finished = true;
  ck.seek = 48000;
  ok &= save(dir, "checkpoint-finished.json", speech::encode_checkpoint(ck));

  // Both at once: a generation config whose keys also make a checkpoint.
  ok &= save(dir, "generation-and-checkpoint.json",
             generation_config(multi, true,
                               ", \"v\": 1, \"seek\": 16000, \"prompt\": [50, 51], \"language\": \"\", "
                               "\"windows_done\": 1, \"segments_done\": 0, \"finished\": false"));

  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!ok) {
    std::fprintf(stderr, "fuzz_speech_make_corpus: cannot write the seeds into %s\n", dir.c_str());
    return 1;
  }
  return 0;
}
