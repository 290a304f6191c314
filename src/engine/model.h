// A loaded model replica (Llama, Mistral, Qwen2, Phi-3: weights::ModelConfig) and its paged KV cache. The public
// surface is torch-free (plain vectors), so the CLI, the generation loop and their tests compile without LibTorch
// headers; only the engine's own translation units include ATen.
#pragma once

#include <cstdint>
#include <chrono>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "device/device.h"
#include "generation/fingerprint.h"
#include "generation/kv_blocks.h"
#include "generation/prompt_template.h"
#include "generation/sampler.h"
#include "tokenizer/tokenizer.h"
#include "weights/model_dir.h"

namespace tandem::engine {

using TokenId = std::int32_t;

// How float weights (f32/f16/bf16 tensors) are held: `auto` as stored; f32/bf16/f16 converted once at load.
// Quantized tensors (q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K) are always used as stored. The CPU computes activations in f32
// through Tandem's kernels (docs/kernels.md); on an accelerator the activations and KV are f32, or bf16 / f16
// when asked for (f16 on CUDA only: the simulated device runs ATen's CPU kernels, which have no f16 matmul).
enum class ComputeDType { auto_, f32, bf16, f16 };
std::string_view compute_dtype_name(ComputeDType d);
Result<ComputeDType> parse_compute_dtype(std::string_view s);  // "auto", "f32", "bf16", "f16"

// The element type of the CPU layers' KV cache: f16 (llama.cpp's and Ollama's default: half the memory, and half
// the bytes a decode step reads, each row rounded to nearest even as it is stored) or f32 (the rows as computed).
// Accelerator layers keep theirs in the compute dtype.
enum class KvCacheType { f16, f32 };
std::string_view kv_cache_type_name(KvCacheType t);
Result<KvCacheType> parse_kv_cache_type(std::string_view s);  // "f16", "f32"

struct LoadOptions {
  ComputeDType dtype = ComputeDType::auto_;
  int threads = 1;                        // intra-op threads for matmuls (set per model, applied on each call)
  int kv_block_size = 16;                 // tokens per KV block
  std::int64_t kv_blocks = 0;             // 0: enough for `max_sequences` sequences of `max_context` tokens
  int max_sequences = 1;
  int max_context = 0;                    // 0: the model's max_position_embeddings
  std::string revision;                   // optional revision label, part of the fingerprint
  std::string template_name;              // "" = from tokenizer_config.json's chat template, else raw
  bool prefault = false;                  // touch every weight page at load (replica mode "warm")
  KvCacheType cpu_kv = KvCacheType::f32;  // the CPU layers' KV cache (the daemon's default is f16: config.md)

  // Placement. Without an accelerator everything runs on the CPU over the mmap'd weights. With one, layers
  // [0, accel_layers) have their weights copied to it and their KV blocks on it; layers [accel_layers, n) stay on
  // the CPU (the hybrid split, the ladder's "offload" rung). The final norm and LM head go to the accelerator only
  // when every layer does. Embedding lookups always read the CPU mapping. -1 = all layers.
  std::shared_ptr<device::Device> accelerator;
  int accel_layers = -1;
};

struct LoadStats {
  double open_ms = 0;       // validate directory + headers
  double weights_ms = 0;    // map / convert weights into tensors
  double prefault_ms = 0;
  double total_ms = 0;
  std::uint64_t weight_bytes = 0;       // as stored in the files
  std::uint64_t resident_copy_bytes = 0; // bytes copied because of a dtype conversion or misalignment (0 = zero-copy)
  std::uint64_t kv_pool_bytes = 0;
  std::uint64_t accel_weight_bytes = 0;  // weights copied to the accelerator (accounted there)
  std::uint64_t accel_kv_bytes = 0;      // KV pool bytes on the accelerator (accounted there)
};

struct KvStats {
  int block_size = 0;
  int total_blocks = 0;
  int used_blocks = 0;
  std::size_t sequences = 0;
  std::uint64_t bytes_total = 0;
  std::uint64_t bytes_used = 0;
};

class Model;

// One sequence's slot in the KV cache. Releases its blocks when destroyed (or on release()). release() is safe from
// any thread (it waits for a forward in progress); forward() and length() are for the thread that owns it.
class Sequence {
 public:
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  gen::SeqId id() const { return id_; }
  std::int64_t length() const { return length_; }  // tokens whose K/V are cached
  // Offload: layers [0, gpu_layers) run on the accelerator, the rest on the CPU; -1 = as the replica places them.
  int gpu_layers() const { return gpu_layers_; }
  void release();

 private:
  friend class Model;
  Sequence(std::shared_ptr<Model> m, gen::SeqId id) : model_(std::move(m)), id_(id) {}
  std::shared_ptr<Model> model_;
  gen::SeqId id_;
  std::int64_t length_ = 0;
  int gpu_layers_ = -1;
  bool released_ = false;
};

class Model : public std::enable_shared_from_this<Model> {
 public:
  // Opens and validates the directory, loads the tokenizer, maps the weights (zero-copy when the stored dtype is
  // the compute dtype and the data is aligned) and allocates the KV pool. Errors are those of ModelDir::open and
  // Tokenizer::load_file, invalid_argument for bad options, out_of_memory if the pool cannot be allocated.
  static Result<std::shared_ptr<Model>> load(const std::string& dir, const LoadOptions& opts);
  // Another replica of `source`'s model with other options (the GPU replica next to the CPU one, at start and at
  // every restore: docs/residency.md, "Restoring fast"): it shares `source`'s opened files — the mappings (their
  // pages already in memory when `source` is warm), headers and config — instead of opening them again; tokenizer,
  // weights, placement, KV pool and fingerprint are built as load() builds them, from the same bytes, so the
  // fingerprint equals load()'s for the same options. The files stay mapped while either replica lives. Errors as
  // load()'s after its directory checks.
  static Result<std::shared_ptr<Model>> load_beside(const std::shared_ptr<const Model>& source, const LoadOptions& opts);
  ~Model();
  // Call once on a thread that will run forwards other than the one that loaded the model (a step loop): keeps
  // ATen's and OpenBLAS's own threading to one thread there, as on the model's workers (their thread counts are
  // per thread), so no library thread spin-waits against ours.
  static void init_compute_thread();

  const weights::ModelConfig& config() const;
  const weights::ModelDir& files() const;
  const tok::Tokenizer& tokenizer() const;
  const gen::Fingerprint& fingerprint() const;
  gen::TemplateKind prompt_template() const;
  gen::SamplingParams default_sampling() const;  // from generation_config.json when present
  std::vector<TokenId> eos_ids() const;
  bool add_bos() const;
  const LoadStats& load_stats() const;
  const LoadOptions& options() const;
  KvStats kv_stats() const;
  int max_context() const;
  // The rotary inverse frequencies in use ([head_dim / 2], after any Llama 3 / linear / LongRoPE scaling and GGUF
  // frequency factors) and the factor cos/sin are multiplied by (LongRoPE's attention factor, else 1).
  std::vector<float> rope_inv_freq() const;
  float rope_attention_factor() const;
  // The accelerator this replica uses (nullptr: CPU only) and how many layers run on it.
  device::Device* accelerator() const;
  int accel_layers() const;
  // True once the accelerator was lost (driver reset) after this model was loaded: its device buffers are gone
  // and every forward fails with device_lost; load a new replica.
  bool device_lost() const;
  // Bytes an activation workspace needs on the accelerator for a forward of `n` new tokens over `context`
  // positions (accounted there for the duration of the forward; 0 without an accelerator).
  std::uint64_t workspace_bytes(std::int64_t n, std::int64_t context) const;
  // Bytes of the weights as this replica holds them (quantized blocks as stored, float matrices in their held
  // type, norms in f32): what a full placement on an accelerator copies there.
  std::uint64_t held_weight_bytes() const;
  // Bytes to expand the largest weight matrix for one matmul on an accelerator with activations of `act_elem`
  // bytes (0 when every matrix is already in that element type).
  std::uint64_t dequant_workspace_bytes(std::size_t act_elem) const;

  // Tokenizes a rendered template (text segments encoded, BOS/EOS inserted as ids).
  std::vector<TokenId> encode(const std::vector<gen::Segment>& segments) const;
  // Renders `messages` with the model's template and encodes; raw text → [BOS] + encode(text). `flags`: boolean
  // template variables (enable_thinking, ...); the built-in templates ignore them.
  Result<std::vector<TokenId>> encode_chat(const std::vector<gen::Message>& messages,
                                           const std::map<std::string, bool>& flags = {}) const;
  std::vector<TokenId> encode_text(std::string_view text) const;

  // A new KV sequence. `gpu_layers` >= 0 offloads it (the ladder's offload rung): on a replica whose layers are on
  // an accelerator, this sequence runs layers [0, gpu_layers) there and the rest on the CPU over the mapped weights,
  // with its K/V of those layers in host memory (grown as it goes); other sequences of the replica are unaffected
  // and can share its steps. invalid_argument without an accelerator or outside [1, layers].
  Result<std::unique_ptr<Sequence>> new_sequence(int gpu_layers = -1);

  // Runs `tokens` at positions [seq.length(), seq.length() + n) through the model, appending their K/V to the
  // sequence's blocks (grown as needed; kv_exhausted leaves the sequence unchanged). Returns the logits of the
  // last position (vocab floats), or of every position (n × vocab) when `all_logits`. Token ids are validated
  // (invalid_argument); context overflow is invalid_argument; LibTorch exceptions map to internal/out_of_memory.
  Result<std::vector<float>> forward(Sequence& seq, std::span<const TokenId> tokens, bool all_logits = false);

  // One forward for several sequences at once (continuous batching): each item's tokens at that sequence's next
  // positions, decode tokens and prefill chunks mixed. The matmuls read every weight once for all rows; everything
  // else runs per row or per item, with kernels whose result for a row depends on that row only, so each item's
  // logits are bit-identical to what forward() on it alone returns (CPU layers; docs/batching.md for the
  // accelerator). An item that cannot run (invalid tokens, context overflow, kv_exhausted, released, twice in the
  // batch) gets its own error in the result and the others still run. A failure of the step itself (device lost,
  // an accelerator allocation refused, out of memory) is the outer error: then no sequence advanced.
  struct BatchItem {
    Sequence* seq = nullptr;
    std::span<const TokenId> tokens;
    bool all_logits = false;
  };
  Result<std::vector<Result<std::vector<float>>>> forward_batch(std::span<const BatchItem> items);

  // Reference forward without any cache: full causal attention over `tokens`, logits for every position.
  // For tests of the paged path.
  Result<std::vector<float>> forward_reference(std::span<const TokenId> tokens);

 private:
  friend class Sequence;
  struct Impl;
  Model();
  static Status check_options(const LoadOptions& opts);
  // load() and load_beside() after the files are open: tokenizer (parsed from `dir` unless given), weights,
  // placement, KV pool, fingerprint.
  static Result<std::shared_ptr<Model>> build(std::shared_ptr<const weights::ModelDir> dir,
                                              std::shared_ptr<const tok::Tokenizer> tokenizer, const LoadOptions& opts,
                                              std::chrono::steady_clock::time_point t0);
  void release_sequence(Sequence& s);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::engine
