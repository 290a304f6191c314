// The BERT-family text encoder layouts of sentence-embedding models: Hugging Face BertModel (bge, e5, all-MiniLM,
// ... as sentence-transformers saves them) and NomicBertModel (nomic-embed-text), and llama.cpp's "bert" /
// "nomic-bert" GGUF files: the configuration, the tensors a configuration implies (names and shapes), the GGUF
// names, and the pooling. Torch-free: shared by the engine (engine/bert.h) and the writers (modelgen/bert_writer.h).
// docs/embeddings.md, "Text embedding models".
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

enum class BertFamily : std::uint8_t {
  bert,        // learned absolute positions; q/k/v/o and MLP with biases; GELU (erf)
  nomic_bert,  // rotary positions (NEOX pairing), fused Wqkv without bias, SwiGLU MLP without biases
};
enum class BertPooling : std::uint8_t { mean, cls };

struct BertConfig {
  BertFamily family = BertFamily::bert;
  int hidden = 0, intermediate = 0, layers = 0, heads = 0;
  int positions = 0;   // the longest input in tokens ([CLS] and [SEP] included)
  int type_vocab = 2;  // token types (all inputs are type 0)
  int vocab = 0;
  double eps = 1e-12;  // layer_norm_eps
  double rope_theta = 1000.0;  // nomic_bert: rotary_emb_base
  BertPooling pooling = BertPooling::cls;
  std::int32_t pad_id = 0;

  int head_dim() const { return heads > 0 ? hidden / heads : 0; }
};

std::string_view bert_family_name(BertFamily f);   // "bert", "nomic-bert" (GGUF general.architecture)
std::string_view bert_pooling_name(BertPooling p);  // "mean", "cls"

// config.json of a BertModel (model_type "bert"; hidden_size, num_hidden_layers, num_attention_heads,
// intermediate_size, max_position_embeddings, type_vocab_size, vocab_size, layer_norm_eps, hidden_act "gelu",
// position_embedding_type "absolute") or a NomicBertModel (model_type "nomic_bert"; n_embd, n_layer, n_head, n_inner,
// n_positions / max_trained_positions, layer_norm_epsilon, rotary_emb_base, activation_function "swiglu",
// rotary_emb_fraction 1, rotary_emb_interleaved false, prenorm false, the biases off). Pooling starts as CLS for
// bert and mean for nomic_bert (parse_sentence_transformers_pooling replaces it). Errors: parse_error, format_error
// naming the key, unsupported naming what (another model_type, hidden_act, a relative position embedding, ...).
Result<BertConfig> parse_bert_config(std::string_view json_text, const std::string& origin);
// A sentence-transformers 1_Pooling/config.json: pooling_mode_mean_tokens or pooling_mode_cls_token (exactly one
// of the modes true; max / weighted-mean / last-token pooling are unsupported).
Status parse_sentence_transformers_pooling(std::string_view json_text, const std::string& origin, BertConfig& c);

// modules.json of a sentence-transformers directory: the path of its sentence_transformers.models.Pooling module
// ("" when it has none). format_error for a path that is not a plain directory name; unsupported for a module other
// than Transformer, Pooling and Normalize (a Dense projection after pooling would change the vectors).
Result<std::string> sentence_transformers_pooling_dir(std::string_view modules_json, const std::string& origin);
// tokenizer_config.json's do_lower_case (true when absent), which a vocab.txt tokenizer follows.
Result<bool> tokenizer_do_lower_case(std::string_view tokenizer_config_json, const std::string& origin);

// The tensors a configuration implies, Hugging Face names (without BertForMaskedLM's "bert." prefix: the loader
// adds it when the file uses it) and shapes, in a stable order.
std::vector<std::pair<std::string, std::vector<std::int64_t>>> bert_required_tensors(const BertConfig& c);

// llama.cpp's names (convert_hf_to_gguf.py BertModel / NomicBertModel): token_embd, token_types, position_embd,
// token_embd_norm; blk.N.{attn_q, attn_k, attn_v, attn_qkv, attn_output, attn_output_norm, ffn_up, ffn_gate,
// ffn_down, layer_output_norm}. nullopt outside the mapping.
std::optional<std::string> bert_gguf_name_from_hf(std::string_view hf_name, BertFamily f);

// A "bert" / "nomic-bert" GGUF file's configuration: <arch>.embedding_length, block_count, feed_forward_length,
// attention.head_count, context_length, attention.layer_norm_epsilon, pooling_type (1 mean, 2 cls; 0 = none and
// others unsupported), rope.freq_base (nomic-bert); the vocabulary size is the rows of token_embd.weight.
// Errors: format_error naming the key, unsupported (another architecture, attention.causal true, a pooling type).
Result<BertConfig> bert_config_from_gguf(const GgufFile& f);
// The tensors of such a file under their Hugging Face names and shapes, zero-copy, sorted by name (tensors outside
// the mapping are left out). format_error when two tensors map to one name.
Result<std::vector<TensorView>> bert_tensor_views_from_gguf(const GgufFile& f, const BertConfig& c);

}  // namespace tandem::weights
