// The CLIP dual-encoder layout (Hugging Face CLIPModel, and llama.cpp's "clip" GGUF convention): the configuration,
// the tensors a configuration implies (names and shapes), and the mapping between the Hugging Face and GGUF tensor
// names. Torch-free: shared by the engine (engine/clip.h), the writer (modelgen/clip_writer.h) and the GGUF
// converter. docs/embeddings.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"
#include "weights/gguf.h"
#include "weights/model_dir.h"

namespace tandem::weights {

// One encoder tower (text or vision).
struct ClipTowerShape {
  int hidden = 0, intermediate = 0, layers = 0, heads = 0;
  int positions = 0;  // text: max_position_embeddings; vision: 1 + (image_size / patch_size)²
  double eps = 1e-5;  // layer_norm_eps
  std::string act = "quick_gelu";  // hidden_act: "quick_gelu" (x·σ(1.702x)) or "gelu" (erf)
};

struct ClipConfig {
  ClipTowerShape text, vision;
  int vocab = 0, projection_dim = 0, image_size = 0, patch_size = 0, channels = 3;
  std::int32_t eos_id = -1, bos_id = -1;  // text_config eos_token_id / bos_token_id (-1: none)
  // eos_token_id == 2 (the original OpenAI configs): the EOT position is the argmax of the input ids, as
  // transformers' CLIPTextTransformer does for that value; otherwise the first position whose id is eos_id.
  bool legacy_eos_argmax = false;
  // The logit scale as stored (log of the multiplier): config logit_scale_init_value, replaced by the
  // `logit_scale` tensor's value when the model is loaded.
  float logit_scale = 2.6592F;
  std::vector<float> image_mean{0.48145466F, 0.4578275F, 0.40821073F};  // preprocessor_config.json when present
  std::vector<float> image_std{0.26862954F, 0.26130258F, 0.27577711F};

  int patches() const { return image_size > 0 && patch_size > 0 ? (image_size / patch_size) * (image_size / patch_size) : 0; }
};

// Parses a Hugging Face CLIPModel config.json: text_config, vision_config, projection_dim (and
// logit_scale_init_value, optional). Errors: parse_error (not JSON), format_error naming the key (missing, mistyped,
// out of range, heads not dividing hidden, patch not dividing image), unsupported (hidden_act other than
// quick_gelu / gelu, naming the tower; a model_type other than clip).
Result<ClipConfig> parse_clip_config(std::string_view json_text, const std::string& origin);
// Reads image_mean / image_std from a preprocessor_config.json's text into `c` (format_error naming the key).
Status parse_clip_preprocessor(std::string_view json_text, const std::string& origin, ClipConfig& c);

// The tensors a configuration implies, Hugging Face names and shapes, in a stable order (text, vision,
// projections, logit_scale). The patch embedding is [hidden, channels, patch, patch]; class_embedding [hidden];
// logit_scale a scalar (shape []).
std::vector<std::pair<std::string, std::vector<std::int64_t>>> clip_required_tensors(const ClipConfig& c);

// llama.cpp's names (convert_image_encoder_to_gguf.py): text_model → t, vision_model → v, encoder.layers → blk,
// self_attn.{q,k,v,out}_proj → attn_{q,k,v,out}, layer_norm1/2 → ln1/ln2, mlp.fc1 → ffn_down and mlp.fc2 → ffn_up
// (sic: that converter's naming), token_embedding → token_embd, position_embedding → position_embd,
// class_embedding → class_embd, patch_embedding → patch_embd, final_layer_norm → post_ln, pre_layrnorm → pre_ln,
// post_layernorm → post_ln; text_projection / visual_projection unchanged. logit_scale has no GGUF tensor (the
// converter skips it; Tandem writes it as the key clip.logit_scale). nullopt outside the mapping.
std::optional<std::string> clip_gguf_name_from_hf(std::string_view hf_name);
std::optional<std::string> clip_hf_name_from_gguf(std::string_view gguf_name);

// A CLIP GGUF file's configuration (general.architecture "clip", both encoders): clip.text.* / clip.vision.*
// metadata. The vocabulary size is the rows of t.token_embd.weight; the EOT id is clip.text.eos_token_id (a Tandem
// key) when present, else the id of "<|endoftext|>" in tokenizer.ggml.tokens, else none (pool at the last
// position). Errors: format_error naming the key, unsupported (another architecture, a missing encoder).
Result<ClipConfig> clip_config_from_gguf(const GgufFile& f);

// The tensors of a CLIP GGUF file under their Hugging Face names and shapes (the patch embedding 4-D), zero-copy,
// sorted by name. Tensors outside the mapping are left out. The feed-forward pair is taken by shape: the legacy
// converter's ffn_down ([intermediate, hidden] in HF order) is fc1; a file written with ffn_up as fc1 (newer
// llama.cpp converters) is recognised when its shapes say so. format_error when two tensors map to one name.
Result<std::vector<TensorView>> clip_tensor_views_from_gguf(const GgufFile& f, const ClipConfig& c);

// vocab.json (token → id) as the token list ordered by id (what the GGUF tokenizer.ggml.tokens holds).
// format_error for ids that are not 0..n-1 exactly once.
Result<std::vector<std::string>> clip_vocab_tokens(std::string_view vocab_json_text, const std::string& origin);

}  // namespace tandem::weights
