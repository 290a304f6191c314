// The tokenizer of a model (a Hugging Face directory or a GGUF file): chooses the kind from what the model holds.
// Its own library (tandem_model_tokenizer), depending on weights and tokenizer.
#pragma once

#include "core/result.h"
#include "tokenizer/tokenizer.h"
#include "weights/model_dir.h"

namespace tandem::tok {

// hf_dir: load_hf_tokenizer_files(dir.dir()) (tokenizer.json, else vocab.json + merges.txt), else tokenizer.model
// (dir.tokenizer_bytes()). GGUF: tokenizer.ggml.model "llama" → the SentencePiece vocabulary
// (dir.tokenizer_bytes()), "gpt2" → the BPE vocabulary (weights::bpe_vocab_from_gguf). Errors name the file:
// not_found / io_error reading, and the loaders' parse_error / format_error / unsupported.
Result<Tokenizer> load_model_tokenizer(const weights::ModelDir& dir);

// Whether BOS is added to a prompt by default: tokenizer_config.json / GGUF add_bos_token when set, else the
// tokenizer's own configuration (Tokenizer::adds_bos()).
bool model_adds_bos(const weights::ModelDir& dir, const Tokenizer& tok);

}  // namespace tandem::tok
