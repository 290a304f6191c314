// Writes CLIP dual-encoder models (Hugging Face CLIPModel layout: config.json, model.safetensors,
// preprocessor_config.json) with deterministic random weights or weights from a caller's source (a trainer), and
// converts such a directory to llama.cpp's "clip" GGUF. Torch-free. docs/embeddings.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "modelgen/gguf_convert.h"
#include "weights/clip_layout.h"
#include "weights/safetensors.h"

namespace tandem::modelgen {

struct ClipShape {
  weights::ClipTowerShape text{512, 2048, 12, 8, 77};   // positions = max_position_embeddings
  weights::ClipTowerShape vision{768, 3072, 12, 12, 0};  // positions derived from image/patch
  int vocab = 49408;
  int projection_dim = 512;
  int image_size = 224;
  int patch_size = 32;
  int channels = 3;
  // text_config bos/eos/pad_token_id. eos 2 is the original OpenAI configs' value, which makes transformers (and
  // Tandem) pool at the argmax of the ids; any other value pools at the first occurrence of that id.
  std::int32_t bos_id = 0, eos_id = 2, pad_id = 1;
  double logit_scale_init = 2.6592;  // ln(1 / 0.07), CLIPConfig's default
  std::vector<float> image_mean{0.48145466F, 0.4578275F, 0.40821073F};
  std::vector<float> image_std{0.26862954F, 0.26130258F, 0.27577711F};

  // The configuration the engine reads back from what write_clip_model writes.
  weights::ClipConfig config() const;
  std::uint64_t parameters() const;
};

// "clip-b32" (openai/clip-vit-base-patch32: text 512/2048/12 layers/8 heads/77 positions, vocab 49408, vision
// 768/3072/12/12, patch 32, image 224, projection 512, legacy eos 2), "clip-test" (tiny: text 32 wide/64/2 layers/
// 2 heads/16 positions, vocab 300, vision 32/64/2/2, image 32, patch 8, projection 16; bos 298, eos 299),
// "clip-small" (the bundled default: text 128/512/2 layers/4 heads/32 positions, vision 128/512/4 layers/4 heads,
// image 64, patch 16, projection 128; vocab 49408 with bos 49406 / eos 49407 until its tokenizer sets them).
// invalid_argument names the known presets.
Result<ClipShape> clip_preset(std::string_view name);

struct ClipWriteOptions {
  ClipShape shape;
  weights::DType dtype = weights::DType::f32;  // f32, f16 or bf16 (logit_scale is always f32)
  std::uint64_t seed = 1;
  // Optional weight source, like modelgen::Options::source: fills `out` (numel floats, HF layout and names, see
  // weights::clip_required_tensors) for tensor `name`. Default: deterministic random init (uniform with std 0.02
  // for matrices and embeddings, std 0.02 for biases, ones / zeros for layer-norm weights / biases,
  // logit_scale_init for logit_scale).
  std::function<void(const std::string& name, std::vector<float>& out)> source;
};

// Creates `dir` if needed and writes config.json (architectures ["CLIPModel"], model_type clip, projection_dim,
// logit_scale_init_value, text_config{...}, vision_config{...}), model.safetensors (plus
// text_model.embeddings.position_ids / vision_model.embeddings.position_ids as i64 buffers, as transformers saves
// them) and preprocessor_config.json. No tokenizer (tokenizer/: vocab.json + merges.txt). Errors: invalid_argument
// (bad shape, a source returning the wrong size), io_error.
Status write_clip_model(const std::string& dir, const ClipWriteOptions& opts);

// A complete CLIP model directory for tests, benchmarks and tandem-validate: write_clip_model with `opts` (random
// weights from opts.seed unless a source is given) plus a byte-level BPE tokenizer trained on fixed captions of
// coloured shapes ("a red circle on a plain background", ...) into at most `vocab_tokens` tokens; the shape's vocab
// and bos/eos/pad ids are set to that tokenizer's (specials last, pad = eos). The weights are random, so vectors are
// deterministic but carry no meaning. Returns the shape written. Errors: those of write_clip_model and
// write_clip_tokenizer_files.
Result<ClipShape> write_clip_test_model(const std::string& dir, ClipWriteOptions opts, std::size_t vocab_tokens = 600);

// Converts a Hugging Face CLIP directory (config.json + model.safetensors, sharded or not) into a GGUF file as
// llama.cpp's convert_image_encoder_to_gguf.py lays it out (general.architecture "clip", clip.text.* /
// clip.vision.* keys, t./v. tensor names, tokenizer.ggml.tokens from vocab.json when present), plus the Tandem
// keys clip.logit_scale, clip.text.eos_token_id / bos_token_id / legacy_eos_argmax / use_gelu. `r`: F32 (every
// tensor f32), F16 (2-D weights f16, the patch embedding f16, vectors f32: the converter's rule), BF16, or Q8_0
// (2-D weights with 32-divisible rows q8_0 except the position embeddings, which stay f16). The merges are not in
// the GGUF (llama.cpp's converter writes only the token list): keep vocab.json / merges.txt next to the file.
// Errors: those of the reader, unsupported (another recipe), io_error.
Result<ConvertStats> convert_clip_to_gguf(const std::string& hf_dir, const std::string& out_file, Recipe r);

}  // namespace tandem::modelgen
