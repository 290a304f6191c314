// The weight files of an encoder-style model (CLIP, Whisper): opening a Hugging Face directory (config.json +
// safetensors shards) or one GGUF file, finding and checking the tensors a configuration implies, and the
// fingerprint of what decides the outputs. Shared by clip.cc and whisper.cc. Engine-internal.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "engine/weight.h"
#include "weights/gguf.h"
#include "weights/model_dir.h"

namespace tandem::engine {

using TensorShapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;
using TensorMap = std::map<std::string, const weights::TensorView*>;

// "[a, b, c]", for messages.
std::string shape_str(const std::vector<std::int64_t>& shape);

// A text file of at most 64 MiB; with `optional`, a missing file reads as "".
Result<std::string> read_text(const std::string& path, bool optional);

// A GGUF path: the file itself, or a directory without config.json holding exactly one .gguf ("" otherwise).
std::string gguf_path_of(const std::string& path);

// `path` without trailing slashes (a Hugging Face directory).
std::string hf_dir_of(const std::string& path);

// The mapped files of one model (kept alive: the weights point into them) and what names and identifies them.
struct ModelFiles {
  std::optional<weights::SafetensorsWeights> st;
  std::optional<weights::GgufFile> gguf;
  std::vector<weights::TensorView> gguf_views;  // sorted by name (set by the caller from its GGUF layout)
  std::vector<const weights::MappedFile*> files;
  std::string origin;     // names the weight file(s) in messages
  std::string header_id;  // the headers' digests (and config.json's), for the fingerprint

  // Opens `path`: a GGUF file (gguf_path_of), then `on_gguf()` reads its configuration and fills gguf_views; or a
  // Hugging Face directory, whose config.json text `on_hf(dir, text)` parses (with any other file it reads) before
  // the safetensors shards are opened.
  Status open(const std::string& path, const std::function<Status()>& on_gguf,
              const std::function<Status(const std::string& dir, const std::string& config_text)>& on_hf);
  // Opens the GGUF file at `gguf_path` (gguf_views stay the caller's to fill).
  Status open_gguf(const std::string& gguf_path);
  // Opens the safetensors shards of `dir`, whose config.json text is `config_text`.
  Status open_safetensors(const std::string& dir, const std::string& config_text);
  // The tensor `name` (GGUF views or safetensors), or null.
  const weights::TensorView* find(const std::string& name) const;
  // Every tensor of `required`, present with its shape and a type Tandem computes with. `tolerated(name, t)`, when
  // given, accepts a missing tensor (t null: it is left out of the map) or one of another shape.
  Result<TensorMap> resolve(const TensorShapes& required,
                            const std::function<bool(const std::string&, const weights::TensorView*)>& tolerated = {}) const;
  void prefault() const;
  // The fingerprint's digest: `architecture`, the weights (header_id and sampled content), `revision`, and the types
  // the matrices are held in.
  std::string fingerprint_digest(const std::string& architecture, const std::string& revision,
                                 const std::vector<Weight*>& matrices) const;
};

// Builds a model's weights from its resolved tensors (inside a load's guard: it may throw), counting the bytes
// copied out of the mapping.
struct WeightBuilder {
  const TensorMap& tv;
  ComputeDType dtype;
  bool cpu_compute = true;  // the CPU kernels multiply with these matrices (false: they go to an accelerator)
  std::uint64_t copied = 0;

  // A matrix held at `dtype` (a view the caller reshaped, or the tensor `name`).
  Weight matrix(const weights::TensorView& view) { return make_weight(view, dtype, copied, cpu_compute); }
  Weight matrix(const std::string& name) { return matrix(*tv.at(name)); }
  // A vector as f32.
  at::Tensor vector(const std::string& name) const { return vector_f32(*tv.at(name)); }
  // Every row of a matrix of any type, as f32 [rows, cols] (position embeddings).
  at::Tensor rows_f32(const std::string& name);
};

}  // namespace tandem::engine
