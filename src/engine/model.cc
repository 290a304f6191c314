// Loading a model, its placement on an accelerator and its accessors (the forward pass is model_forward.cc, the text side model_text.cc).
#include "engine/model.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <dlfcn.h>

#include <chrono>
#include <exception>
#include <system_error>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

#include "core/sha256.h"
#include "engine/dequant.h"
#include "engine/model_impl.h"
#include "engine/upload.h"
#include "engine/weight.h"
#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/rows.h"
#if defined(TANDEM_HAVE_TORCH_CUDA) && defined(TANDEM_HAVE_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>

#include "device/cuda.h"
#endif
#include "engine/worker_pool.h"

namespace tandem::engine {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

using kernels::WType;

// All intra-op parallelism is the model's WorkerPool: ATen (OpenMP) and OpenBLAS are kept to one thread on every
// thread that computes, so no library thread spin-waits against our workers.
void single_threaded_kernels() {
  at::set_num_threads(1);
  using SetThreads = void (*)(int);
  static const auto openblas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (openblas) openblas(1);
}

std::uint64_t tensor_bytes(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.numel()) * static_cast<std::uint64_t>(t.element_size());
}


}  // namespace

std::string_view compute_dtype_name(ComputeDType d) {
  switch (d) {
    case ComputeDType::auto_: return "auto";
    case ComputeDType::f32: return "f32";
    case ComputeDType::bf16: return "bf16";
    case ComputeDType::f16: return "f16";
  }
  return "f32";
}

Result<ComputeDType> parse_compute_dtype(std::string_view s) {
  for (auto d : {ComputeDType::auto_, ComputeDType::f32, ComputeDType::bf16, ComputeDType::f16})
    if (compute_dtype_name(d) == s) return d;
  return fail(Errc::invalid_argument, "unknown compute dtype '" + std::string(s) + "' (auto, f32, bf16, f16)");
}

std::string_view kv_cache_type_name(KvCacheType t) { return t == KvCacheType::f32 ? "f32" : "f16"; }

Result<KvCacheType> parse_kv_cache_type(std::string_view s) {
  for (auto t : {KvCacheType::f16, KvCacheType::f32})
    if (kv_cache_type_name(t) == s) return t;
  return fail(Errc::invalid_argument, "unknown KV cache type '" + std::string(s) + "' (f16, f32)");
}

// The types the matrices are held in (after any load-time conversion), as "type:count" in kAllWTypes order;
// norms are always f32. What decides the CPU kernels' results, so it is part of the fingerprint (the
// requested dtype is not: `auto` and `f32` on an f32 file are the same replica).
std::string Model::Impl::held_type_summary() {
  std::map<WType, int> n;
  n[WType::f32] += (1 + (2 + (cfg().qkv_bias ? 3 : 0) + (cfg().qk_norm ? 2 : 0) + (cfg().post_norms ? 2 : 0)) *
                             static_cast<int>(layers.size()));
  // (norms, + biases, + q/k norms, + post-norms)
  n[embed.type]++;
  if (!cfg().tie_word_embeddings) n[lm_head.type]++;
  for (Layer& l : layers)
    for (const Weight* w : l.matrices()) n[w->type]++;
  std::string out;
  for (WType t : kernels::kAllWTypes)
    if (n.count(t)) out += (out.empty() ? "" : ",") + std::string(kernels::wtype_name(t)) + ":" + std::to_string(n[t]);
  return out;
}

// Moves layers [0, accel_layers) (and the head when all layers go) to the accelerator, accounting every byte
// there first; a refusal fails the load with the device's typed error.
Status Model::Impl::place_on_accelerator() {
  const auto& c = cfg();
  accel_dev = accel->kind() == device::Kind::cuda ? at::Device(at::kCUDA, static_cast<at::DeviceIndex>(accel->torch_index()))
                                                 : at::Device(at::kCPU);
#if defined(TANDEM_HAVE_TORCH_CUDA) && defined(TANDEM_HAVE_CUDA)
  // Observed memory on CUDA includes LibTorch's caching allocator: reserved (held from the driver) and
  // allocated (in live tensors).
  if (auto* cuda = dynamic_cast<device::CudaDevice*>(accel.get())) {
    const int index = accel->torch_index();
    cuda->set_allocator_stats([index] {
      const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
      // StatType::AGGREGATE, index 0 of each StatArray (the enum moved from c10::cuda::CUDACachingAllocator to c10
      // between LibTorch 1.13 and 2.x; the index did not).
      constexpr std::size_t agg = 0;
      return std::pair<std::uint64_t, std::uint64_t>(static_cast<std::uint64_t>(st.reserved_bytes[agg].current),
                                                     static_cast<std::uint64_t>(st.allocated_bytes[agg].current));
    });
    cuda->set_cache_release([] { c10::cuda::CUDACachingAllocator::emptyCache(); });
  }
#endif
  // Weights go at their stored size (raw blocks for quantized types; float types in their held type); norms in
  // the activation dtype.
  // A layer's matrices as one group (on the simulated device: one mapping of whole huge pages, engine/upload.h).
  auto place = [&](const std::vector<Weight*>& ws) {
    std::vector<at::Tensor> cpu;
    for (const Weight* w : ws) cpu.push_back(w->cpu_tensor());
    std::vector<at::Tensor> dev = to_accelerator(cpu, accel_dev);
    for (std::size_t i = 0; i < ws.size(); ++i) {
      Weight& w = *ws[i];
      w.dev = std::move(dev[i]);
      dequant_ws = std::max(dequant_ws, dequantize_aten_workspace(w.type, w.rows, w.cols, at::elementSize(dtype)));
    }
  };
  auto place_norm = [&](const at::Tensor& t) { return t.to(accel_dev, dtype); };
  for (int li = 0; li < accel_layers; ++li) {
    Layer& l = layers[static_cast<std::size_t>(li)];
    std::uint64_t bytes = (tensor_bytes(l.attn_norm) + tensor_bytes(l.mlp_norm)) / 4 * at::elementSize(dtype);
    for (const at::Tensor* b : l.extra_vectors())
      if (b->defined()) bytes += tensor_bytes(*b) / 4 * at::elementSize(dtype);
    for (Weight* w : l.matrices()) bytes += w->bytes();
    auto a = accel->allocate(bytes, device::Site::weights);
    if (!a) {
      Error e = std::move(a).error();
      e.message = dir.dir() + ": weights of layer " + std::to_string(li) + " on " + accel->name() + ": " + e.message;
      return fail(std::move(e));
    }
    accel_allocs.push_back(std::move(a).value());
    place(l.matrices());
    l.attn_norm_cpu = l.attn_norm;
    l.mlp_norm_cpu = l.mlp_norm;
    l.bq_cpu = l.bq;
    l.bk_cpu = l.bk;
    l.bv_cpu = l.bv;
    l.qn_cpu = l.qn;
    l.kn_cpu = l.kn;
    l.attn_post_norm_cpu = l.attn_post_norm;
    l.mlp_post_norm_cpu = l.mlp_post_norm;
    l.attn_norm = place_norm(l.attn_norm);
    l.mlp_norm = place_norm(l.mlp_norm);
    for (at::Tensor* b : l.extra_vectors())
      if (b->defined()) *b = place_norm(*b);
    l.on_accel = true;
    stats.accel_weight_bytes += bytes;
  }
  if (accel_layers == c.num_layers) {
    const std::uint64_t bytes = tensor_bytes(final_norm) / 4 * at::elementSize(dtype) + lm_head.bytes();
    auto a = accel->allocate(bytes, device::Site::weights);
    if (!a) {
      Error e = std::move(a).error();
      e.message = dir.dir() + ": LM head on " + accel->name() + ": " + e.message;
      return fail(std::move(e));
    }
    accel_allocs.push_back(std::move(a).value());
    final_norm = place_norm(final_norm);
    place({&lm_head});  // tied: a device copy of the embedding matrix; lookups still read the CPU bytes
    head_on_accel = true;
    stats.accel_weight_bytes += bytes;
  }
  return {};
}

void Model::init_compute_thread() { single_threaded_kernels(); }

Model::Model() = default;
Model::~Model() = default;

Result<std::shared_ptr<Model>> Model::load(const std::string& path, const LoadOptions& opts) {
  const auto t0 = Clock::now();
  TANDEM_TRY(check_options(opts));
  auto dir = weights::ModelDir::open(path);
  if (!dir) return fail(std::move(dir).error());
  return build(std::make_shared<const weights::ModelDir>(std::move(dir).value()), nullptr, opts, t0);
}

Result<std::shared_ptr<Model>> Model::load_beside(const std::shared_ptr<const Model>& source, const LoadOptions& opts) {
  const auto t0 = Clock::now();
  if (!source) return fail(Errc::invalid_argument, "load_beside: no source model");
  TANDEM_TRY(check_options(opts));
  return build(source->impl_->dir_owner, source->impl_->tokenizer_owner, opts, t0);
}

Status Model::check_options(const LoadOptions& opts) {
  if (opts.threads < 1 || opts.threads > 256)
    return fail(Errc::invalid_argument, "threads must be in [1, 256], got " + std::to_string(opts.threads));
  if (opts.kv_block_size < 1 || opts.kv_block_size > 4096)
    return fail(Errc::invalid_argument, "kv_block_size must be in [1, 4096], got " + std::to_string(opts.kv_block_size));
  if (opts.max_sequences < 1 || opts.max_sequences > 4096)
    return fail(Errc::invalid_argument, "max_sequences must be in [1, 4096], got " + std::to_string(opts.max_sequences));
  if (opts.kv_blocks < 0) return fail(Errc::invalid_argument, "kv_blocks must be >= 0");
  if (opts.max_context < 0) return fail(Errc::invalid_argument, "max_context must be >= 0");
  if (opts.accel_layers < -1) return fail(Errc::invalid_argument, "accel_layers must be >= -1");
  if (opts.accelerator && opts.accelerator->lost())
    return fail(Errc::device_lost, opts.accelerator->name() + ": device lost; cannot load onto it");
  return {};
}

Result<std::shared_ptr<Model>> Model::build(std::shared_ptr<const weights::ModelDir> dir,
                                            std::shared_ptr<const tok::Tokenizer> tokenizer, const LoadOptions& opts,
                                            std::chrono::steady_clock::time_point t0) {
  const std::string path = dir->dir();
  const weights::ModelConfig cfg = dir->config();
  if (!tokenizer) {  // a replica beside another one shares its tokenizer, checked when that one was built
    auto loaded = load_tokenizer(*dir);
    if (!loaded) return fail(std::move(loaded).error());
    if (loaded->tokenizer.vocab_size() > cfg.vocab_size)
      return fail(Errc::format_error, loaded->origin + ": " + std::to_string(loaded->tokenizer.vocab_size()) +
                                          " pieces but the model's vocabulary size is " +
                                          std::to_string(cfg.vocab_size));
    tokenizer = std::make_shared<const tok::Tokenizer>(std::move(loaded->tokenizer));
  }
  if (cfg.head_dim % 2 != 0)
    return fail(Errc::unsupported, path + "/config.json: head_dim must be even for rotary embeddings");

  int max_context = opts.max_context > 0 ? opts.max_context : cfg.max_position_embeddings;
  if (max_context > cfg.max_position_embeddings) max_context = cfg.max_position_embeddings;
  const std::int64_t blocks_per_seq = (max_context + opts.kv_block_size - 1) / opts.kv_block_size;
  std::int64_t blocks = opts.kv_blocks > 0 ? opts.kv_blocks : blocks_per_seq * opts.max_sequences;
  if (blocks > (std::int64_t{1} << 30)) return fail(Errc::invalid_argument, "kv_blocks too large");

  auto m = std::shared_ptr<Model>(new Model());
  const double open_ms = ms_since(t0);
  m->impl_ = std::make_unique<Impl>(std::move(dir), std::move(tokenizer), opts, static_cast<int>(blocks));
  Impl& im = *m->impl_;
  im.max_context = max_context;
  im.stats.open_ms = open_ms;
  // Activations on the accelerator: f32, or the requested 16-bit type (f16 only on CUDA: ATen's CPU matmuls, which
  // the simulated device runs, have no f16 kernels). The CPU path computes in f32 whatever the weight types.
  im.dtype = opts.dtype == ComputeDType::bf16 ? at::kBFloat16
             : opts.dtype == ComputeDType::f16 && opts.accelerator &&
                       opts.accelerator->kind() == device::Kind::cuda
                 ? at::kHalf
                 : at::kFloat;
  im.rope_interleaved = cfg.rope_interleaved;
  im.stats.weight_bytes = im.dir.weight_bytes();

  TANDEM_TRY(im.select_template());

  single_threaded_kernels();

  const auto t1 = Clock::now();
  try {
    im.pool = std::make_unique<WorkerPool>(opts.threads, [] { single_threaded_kernels(); });
    c10::InferenceMode guard;
    std::uint64_t copied = 0;
    auto tensor = [&](const std::string& name) -> const weights::TensorView& { return *im.dir.tensor(name); };
    // Layers [0, accel_n) go to the accelerator (and the head with them when all do): their matrices get no CPU
    // side table.
    const int accel_n = !opts.accelerator ? 0
                        : opts.accel_layers < 0 ? cfg.num_layers
                                                : std::min(opts.accel_layers, cfg.num_layers);
    const bool head_on_cpu = accel_n < cfg.num_layers;
    auto w = [&](const std::string& name, bool cpu = true) { return make_weight(tensor(name), opts.dtype, copied, cpu); };
    // Lookups need no side table; the tied head (a copy of this Weight) does.
    im.embed = w("model.embed_tokens.weight", head_on_cpu && cfg.tie_word_embeddings);
    // Gemma's Hugging Face norms hold w and apply 1 + w (computed once here, in f32, as transformers does).
    auto norm = [&](const std::string& name) {
      at::Tensor t = vector_f32(tensor(name));
      return cfg.norm_add_one ? (t + 1.0F).contiguous() : t;
    };
    im.final_norm = norm("model.norm.weight");
    im.final_norm_cpu = im.final_norm;
    im.lm_head = cfg.tie_word_embeddings ? im.embed : w("lm_head.weight", head_on_cpu);
    for (int i = 0; i < cfg.num_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      Layer l;
      l.attn_norm = norm(p + "input_layernorm.weight");
      if (cfg.post_norms) {
        l.attn_post_norm = norm(p + "post_attention_layernorm.weight");
        l.mlp_norm = norm(p + "pre_feedforward_layernorm.weight");
        l.mlp_post_norm = norm(p + "post_feedforward_layernorm.weight");
      } else {
        l.mlp_norm = norm(p + "post_attention_layernorm.weight");
      }
      l.wq = w(p + "self_attn.q_proj.weight", i >= accel_n);
      l.wk = w(p + "self_attn.k_proj.weight", i >= accel_n);
      l.wv = w(p + "self_attn.v_proj.weight", i >= accel_n);
      if (cfg.qkv_bias) {
        l.bq = vector_f32(tensor(p + "self_attn.q_proj.bias"));
        l.bk = vector_f32(tensor(p + "self_attn.k_proj.bias"));
        l.bv = vector_f32(tensor(p + "self_attn.v_proj.bias"));
      }
      if (cfg.qk_norm) {
        l.qn = norm(p + "self_attn.q_norm.weight");
        l.kn = norm(p + "self_attn.k_norm.weight");
      }
      l.wo = w(p + "self_attn.o_proj.weight", i >= accel_n);
      l.w_gate = w(p + "mlp.gate_proj.weight", i >= accel_n);
      l.w_up = w(p + "mlp.up_proj.weight", i >= accel_n);
      l.w_down = w(p + "mlp.down_proj.weight", i >= accel_n);
      im.layers.push_back(std::move(l));
    }
    im.stats.resident_copy_bytes = copied;

    // Rotary inverse frequencies, with Llama 3 / linear / LongRoPE scaling when configured.
    std::vector<float> inv(static_cast<std::size_t>(cfg.head_dim / 2));
    if (cfg.rope_scaling == weights::RopeScaling::longrope) {
      im.longrope_long = cfg.longrope_uses_long(max_context);
      im.rope_mscale = static_cast<float>(cfg.longrope_attention_factor());
    }
    for (std::size_t i = 0; i < inv.size(); ++i) {
      double f = 1.0 / std::pow(cfg.rope_theta, (2.0 * static_cast<double>(i)) / cfg.head_dim);
      if (cfg.rope_scaling == weights::RopeScaling::longrope) {
        f /= (im.longrope_long ? cfg.rope_long_factors : cfg.rope_short_factors)[i];
      } else if (cfg.rope_scaling == weights::RopeScaling::linear) {
        f /= cfg.rope_factor;
      } else if (cfg.rope_scaling == weights::RopeScaling::llama3) {
        const double low_wl = cfg.rope_original_max_positions / cfg.rope_low_freq_factor;
        const double high_wl = cfg.rope_original_max_positions / cfg.rope_high_freq_factor;
        const double wl = 2.0 * M_PI / f;
        if (wl > low_wl) {
          f /= cfg.rope_factor;
        } else if (wl >= high_wl) {
          const double smooth = (cfg.rope_original_max_positions / wl - cfg.rope_low_freq_factor) /
                                (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor);
          f = (1.0 - smooth) * f / cfg.rope_factor + smooth * f;
        }
      }
      if (i < cfg.rope_freq_factors.size()) f /= cfg.rope_freq_factors[i];  // GGUF rope_freqs.weight
      inv[i] = static_cast<float>(f);
    }
    im.inv_freq = at::tensor(inv, at::TensorOptions().dtype(at::kFloat));
    if (cfg.rope_local_theta) {  // Gemma 3's sliding layers: their own base, no scaling
      for (std::size_t i = 0; i < inv.size(); ++i)
        inv[i] = static_cast<float>(1.0 / std::pow(*cfg.rope_local_theta, (2.0 * static_cast<double>(i)) / cfg.head_dim));
      im.inv_freq_local = at::tensor(inv, at::TensorOptions().dtype(at::kFloat));
    }

    if (opts.accelerator) {
      if (opts.accel_layers > cfg.num_layers)
        return fail(Errc::invalid_argument, "accel_layers " + std::to_string(opts.accel_layers) + " > " +
                                                std::to_string(cfg.num_layers) + " layers");
      im.accel = opts.accelerator;
      im.accel_layers = opts.accel_layers < 0 ? cfg.num_layers : opts.accel_layers;
      TANDEM_TRY(im.place_on_accelerator());
    }

    // KV pool: accelerator layers in the activation dtype there (accounted at Site::kv_pool), CPU layers in
    // opts.cpu_kv: f32 (the rows as computed), or f16 (llama.cpp's default cache type and the daemon's: half the
    // bytes to hold and to read per decode step; the rows rounded to f16 as they are stored and widened exactly as
    // they are read).
    const at::ScalarType cpu_kv = opts.cpu_kv == KvCacheType::f32 ? at::kFloat : at::kHalf;
    for (int i = 0; i < cfg.num_layers; ++i) {
      const bool on_accel = i < im.accel_layers;
      const at::ScalarType st = on_accel ? im.dtype : cpu_kv;
      const std::uint64_t layer_kv_bytes = im.kv.layer_bytes(std::int64_t{cfg.num_kv_heads} * cfg.head_dim, st);
      auto a = im.kv.add_layer({cfg.num_kv_heads, cfg.head_dim}, st, on_accel ? im.accel_dev : at::Device(at::kCPU),
                               on_accel ? im.accel.get() : nullptr);
      if (!a) {
        Error e = std::move(a).error();
        e.message = path + ": KV pool of layer " + std::to_string(i) + " on " + im.accel->name() + ": " + e.message;
        return fail(std::move(e));
      }
      if (on_accel) {
        im.accel_allocs.push_back(std::move(a).value());
        im.stats.accel_kv_bytes += layer_kv_bytes;
      }
      im.stats.kv_pool_bytes += layer_kv_bytes;
    }
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    const bool oom = what.find("alloc") != std::string::npos || what.find("memory") != std::string::npos;
    return fail(oom ? Errc::out_of_memory : Errc::internal, path + ": loading weights failed: " + what);
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, path + ": out of host memory while loading weights / KV pool");
  } catch (const std::system_error& e) {
    return fail(Errc::internal, path + ": cannot start worker threads: " + e.what());
  }
  im.stats.weights_ms = ms_since(t1);
  if (opts.prefault) {
    const auto t2 = Clock::now();
    for (const weights::MappedFile* f : im.dir.mapped_files()) f->prefault();
    im.stats.prefault_ms = ms_since(t2);
  }

  // Fingerprint: everything that decides which tokens come out for a given request.
  {
    std::ostringstream arch;
    arch.precision(17);
    arch << cfg.architecture << ";hidden=" << cfg.hidden_size << ";inter=" << cfg.intermediate_size
         << ";layers=" << cfg.num_layers << ";heads=" << cfg.num_heads << ";kv_heads=" << cfg.num_kv_heads
         << ";head_dim=" << cfg.head_dim << ";eps=" << cfg.rms_norm_eps << ";theta=" << cfg.rope_theta
         << ";rope_scaling=" << static_cast<int>(cfg.rope_scaling) << ":" << cfg.rope_factor << ":"
         << cfg.rope_low_freq_factor << ":" << cfg.rope_high_freq_factor << ":" << cfg.rope_original_max_positions
         << ";vocab=" << cfg.vocab_size << ";tied=" << cfg.tie_word_embeddings
         << ";max_positions=" << cfg.max_position_embeddings << ";rope_interleaved=" << cfg.rope_interleaved << ";freq_factors=";
    for (float f : cfg.rope_freq_factors) arch << f << ",";  // not the context in force: a limit, announced apart
    arch << ";qkv_bias=" << cfg.qkv_bias << ";qk_norm=" << cfg.qk_norm << ";fused=" << cfg.fused_projections
         << ";sliding_window=" << cfg.sliding_window.value_or(0);
    if (!cfg.sliding_layers.empty()) {
      arch << ";sliding_layers=";
      for (auto b : cfg.sliding_layers) arch << static_cast<int>(b);
    }
    if (cfg.post_norms || cfg.activation != weights::Activation::silu || cfg.embed_scale != 0.0 || cfg.attn_scale != 0.0) {
      // Gemma (absent for the other families, whose fingerprints stay as they were)
      arch << ";act=" << static_cast<int>(cfg.activation) << ";embed_scale=" << cfg.embed_scale
           << ";norm_add_one=" << cfg.norm_add_one << ";post_norms=" << cfg.post_norms << ";attn_scale=" << cfg.attn_scale
           << ";attn_softcap=" << cfg.attn_softcap.value_or(0) << ";final_softcap=" << cfg.final_softcap.value_or(0)
           << ";rope_local=" << cfg.rope_local_theta.value_or(0);
    }
    if (cfg.rope_scaling == weights::RopeScaling::longrope) {
      // The factor set in use follows from max_context (announced apart) but decides the outputs: named here.
      arch << ";longrope=" << (im.longrope_long ? "long" : "short") << ":mscale=" << im.rope_mscale << ":short=";
      for (float f : cfg.rope_short_factors) arch << f << ",";
      arch << ":long=";
      for (float f : cfg.rope_long_factors) arch << f << ",";
    }
    std::vector<std::pair<std::string, std::string>> parts = {
        {"architecture", arch.str()},
        {"weights", im.dir.header_digest() + ";" + weights::sampled_content_digest(im.dir.mapped_files())},
        {"revision", opts.revision},
        {"weights_types", im.held_type_summary()},
        {"accel_activations", std::string(opts.dtype == ComputeDType::bf16  ? "bf16"
                                          : opts.dtype == ComputeDType::f16 ? "f16"
                                                                            : "f32")},
        {"cpu_kv", std::string(kv_cache_type_name(opts.cpu_kv))},
    };
    for (auto& p : im.text_fingerprint(*m)) parts.push_back(std::move(p));
    im.fingerprint = gen::Fingerprint::make(std::move(parts));
  }
  im.stats.total_ms = ms_since(t0);
  return m;
}

const weights::ModelConfig& Model::config() const { return impl_->cfg(); }
const weights::ModelDir& Model::files() const { return impl_->dir; }
const gen::Fingerprint& Model::fingerprint() const { return impl_->fingerprint; }
const LoadStats& Model::load_stats() const { return impl_->stats; }
const LoadOptions& Model::options() const { return impl_->opts; }
int Model::max_context() const { return impl_->max_context; }
std::vector<float> Model::rope_inv_freq() const {
  const at::Tensor t = impl_->inv_freq.contiguous();
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
}
float Model::rope_attention_factor() const { return impl_->rope_mscale; }
device::Device* Model::accelerator() const { return impl_->accel.get(); }
int Model::accel_layers() const { return impl_->accel ? impl_->accel_layers : 0; }
bool Model::device_lost() const { return impl_->device_lost(); }

// Activation workspace of one forward on the accelerator, in bytes: per new token the hidden state, its norm and
// the residual (3·hidden), q/k/v (heads·hd + 2·kv_heads·hd), the MLP's gate/up/product (3·intermediate), in the
// compute dtype, plus an f32 copy of the hidden state for the norms; the attention scores and probabilities
// (2 · heads · n · context, f32); one layer's K and V gathered over the context (2 · context · kv_heads · hd, in
// the compute dtype and in f32); and the logits (n · vocab, f32) when the head runs there. Forwards on the
// accelerator allocate this at Site::prefill (n > 1) or Site::decode and free it when done.
std::uint64_t Model::workspace_bytes(std::int64_t n, std::int64_t context) const {
  const Impl& im = *impl_;
  if (!im.accel || im.accel_layers == 0 || n <= 0) return 0;
  const auto& c = im.cfg();
  const auto u = [](auto v) { return static_cast<std::uint64_t>(v); };
  const std::uint64_t elem = u(at::elementSize(im.dtype));
  const std::uint64_t per_token = (3 * u(c.hidden_size) + u(c.num_heads) * u(c.head_dim) +
                                   2 * u(c.num_kv_heads) * u(c.head_dim) + 3 * u(c.intermediate_size)) * elem +
                                  u(c.hidden_size) * 4;
  // Plus one layer's K/V gathered over the whole context through the block table, and their f32 copies.
  std::uint64_t bytes = per_token * u(n) + 2 * u(c.num_heads) * u(n) * u(context) * 4 +
                        2 * u(context) * u(c.num_kv_heads) * u(c.head_dim) * (elem + 4);
  if (im.head_on_accel) bytes += u(n) * u(c.vocab_size) * 4;
  // Plus one weight matrix expanded from its stored blocks before its matmul (0 when stored as the dtype).
  return bytes + im.dequant_ws;
}

std::uint64_t Model::held_weight_bytes() const {
  const Impl& im = *impl_;
  std::uint64_t b = im.embed.bytes() + tensor_bytes(im.final_norm);
  if (!im.cfg().tie_word_embeddings) b += im.lm_head.bytes();
  for (const Layer& l : im.layers) {
    b += tensor_bytes(l.attn_norm) + tensor_bytes(l.mlp_norm);
    for (const at::Tensor* t : const_cast<Layer&>(l).extra_vectors())
      if (t->defined()) b += tensor_bytes(*t);
    for (const Weight* w : const_cast<Layer&>(l).matrices()) b += w->bytes();
  }
  return b;
}

std::uint64_t Model::dequant_workspace_bytes(std::size_t act_elem) const {
  const Impl& im = *impl_;
  std::uint64_t ws = 0;
  auto consider = [&](const Weight& w) {
    if (is_float_type(w.type) && kernels::traits(w.type).block_bytes == act_elem) return;
    ws = std::max(ws, dequantize_aten_workspace(w.type, w.rows, w.cols, act_elem));
  };
  consider(im.lm_head);
  for (const Layer& l : im.layers)
    for (const Weight* w : const_cast<Layer&>(l).matrices()) consider(*w);
  return ws;
}

KvStats Model::kv_stats() const { return impl_->kv.stats(); }

Result<std::unique_ptr<Sequence>> Model::new_sequence(int gpu_layers) {
  const int n = impl_->cfg().num_layers;
  if (gpu_layers >= 0) {
    if (!impl_->accel || impl_->accel_layers == 0)
      return fail(Errc::invalid_argument, "gpu_layers " + std::to_string(gpu_layers) +
                                              ": offloading needs a replica with layers on an accelerator");
    if (gpu_layers < 1 || gpu_layers > n)
      return fail(Errc::invalid_argument, "gpu_layers must be in [1, " + std::to_string(n) + "], got " +
                                              std::to_string(gpu_layers));
  }
  const gen::SeqId id = impl_->next_seq++;
  TANDEM_TRY(impl_->kv.create(id));
  auto seq = std::unique_ptr<Sequence>(new Sequence(shared_from_this(), id));
  seq->gpu_layers_ = gpu_layers < 0 ? -1 : std::min(gpu_layers, impl_->accel_layers);
  return seq;
}

// Waits for a forward in progress (compute_mu), so blocks are never handed to another sequence while a forward
// still writes into them; then marks the sequence released and returns its blocks. Safe from any thread.
void Model::release_sequence(Sequence& s) {
  std::lock_guard compute(impl_->compute_mu);
  if (s.released_) return;
  s.released_ = true;
  s.length_ = 0;
  impl_->host_kv.erase(s.id_);
  impl_->kv.release(s.id_);
}

Sequence::~Sequence() { release(); }

void Sequence::release() { model_->release_sequence(*this); }

}  // namespace tandem::engine
