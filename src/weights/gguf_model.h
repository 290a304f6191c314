// The mapping between llama.cpp's GGUF conventions and the Hugging Face view the engine uses: tensor names, and the
// SentencePiece tokenizer rebuilt from `tokenizer.ggml.*`. ModelDir::open uses these for .gguf files; the writers
// (tandem-mkmodel --format gguf, tandem-quantize) use them the other way.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"
#include "weights/gguf.h"

namespace tandem::weights {

// "blk.3.attn_q.weight" → "model.layers.3.self_attn.q_proj.weight", "token_embd.weight" →
// "model.embed_tokens.weight", "output_norm.weight" → "model.norm.weight", "output.weight" → "lm_head.weight"
// (.bias the same way). `arch` is the GGUF general.architecture: for "phi3", "blk.N.attn_qkv" ↔
// "model.layers.N.self_attn.qkv_proj" and "blk.N.ffn_up" ↔ "model.layers.N.mlp.gate_up_proj" (the fused [gate; up]
// rows; a phi3 file has no ffn_gate). nullopt for names outside the mapping (kept unchanged as extra tensors).
std::optional<std::string> hf_name_from_gguf(std::string_view gguf_name, std::string_view arch = "llama");
// The inverse: an HF tensor name → its GGUF name; nullopt for names outside the mapping.
std::optional<std::string> gguf_name_from_hf(std::string_view hf_name, std::string_view arch = "llama");

// The GGUF general.architecture of a config.json architecture: "llama" for LlamaForCausalLM and
// MistralForCausalLM (as llama.cpp's converter writes Mistral), "qwen2", "phi3"; nullopt for others.
std::optional<std::string> gguf_arch_of(std::string_view hf_architecture);

// A serialized SentencePiece ModelProto (BPE, byte fallback when the vocabulary has byte tokens, identity
// normalizer) holding the GGUF vocabulary: tokenizer.ggml.tokens / scores / token_type, the bos / eos / unknown /
// padding ids, add_space_prefix (→ add_dummy_prefix, default true), remove_extra_whitespaces (default false) and
// precompiled_charsmap. Errors: format_error (missing or mistyped arrays, lengths that disagree, ids out of range),
// unsupported (tokenizer.ggml.model other than "llama": "gpt2" BPE vocabularies are read by bpe_vocab_from_gguf in
// weights/gguf_tokenizer.h; tok::load_model_tokenizer picks the right one).
Result<std::string> sentencepiece_model_from_gguf(const GgufFile& f);

}  // namespace tandem::weights
