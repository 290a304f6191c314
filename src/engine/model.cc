// The Llama forward pass in LibTorch (the only translation unit of the engine that includes ATen).
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
#include <mutex>
#include <sstream>

#include "core/sha256.h"
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

at::ScalarType scalar_of(weights::DType d) {
  switch (d) {
    case weights::DType::f32: return at::kFloat;
    case weights::DType::f16: return at::kHalf;
    case weights::DType::bf16: return at::kBFloat16;
    default: return at::kFloat;  // ModelDir only admits f32/f16/bf16 for model tensors
  }
}

at::ScalarType scalar_of(ComputeDType d) {
  switch (d) {
    case ComputeDType::f32: return at::kFloat;
    case ComputeDType::bf16: return at::kBFloat16;
    case ComputeDType::f16: return at::kHalf;
  }
  return at::kFloat;
}

// A weight as a tensor: zero-copy over the mapping when dtype and alignment allow, else one converted copy.
at::Tensor weight_tensor(const weights::TensorView& tv, at::ScalarType target, std::uint64_t& copied) {
  const at::ScalarType stored = scalar_of(tv.dtype);
  const auto elem = static_cast<std::uintptr_t>(weights::dtype_size(tv.dtype));
  auto* ptr = const_cast<std::byte*>(tv.data.data());  // read-only mapping: never written through
  at::Tensor t;
  if (reinterpret_cast<std::uintptr_t>(ptr) % elem == 0) {
    t = at::from_blob(ptr, tv.shape, at::TensorOptions().dtype(stored));
    if (stored == target) return t;
  } else {
    t = at::empty(tv.shape, at::TensorOptions().dtype(stored));
    std::memcpy(t.data_ptr(), ptr, tv.data.size());
    if (stored == target) {
      copied += tv.data.size();
      return t;
    }
  }
  at::Tensor c = t.to(target).contiguous();
  copied += static_cast<std::uint64_t>(c.numel()) * c.element_size();
  return c;
}

// Content identity without reading every byte: SHA-256 over 64 evenly spaced 4 KiB windows of each shard, plus
// its last 4 KiB. Together with the header digest this tells apart checkpoints of the same shape (a fine-tune
// changes all weights); a change confined to unsampled bytes goes unseen — ModelDir::content_digest() reads all.
std::string sampled_content_digest(const weights::ModelDir& dir) {
  Sha256 h;
  constexpr std::size_t kWindow = 4096, kWindows = 64;
  for (const auto& shard : dir.shards()) {
    const std::byte* p = shard.file().data();
    const std::size_t n = shard.file().size();
    for (std::size_t i = 0; i < kWindows; ++i) {
      const std::size_t off = n > kWindow ? (n - kWindow) / kWindows * i : 0;
      h.update(std::span(p + off, std::min(kWindow, n - off)));
    }
    if (n > kWindow) h.update(std::span(p + n - kWindow, kWindow));
  }
  return Sha256::hex(h.finish());
}

// All intra-op parallelism is the model's WorkerPool: ATen (OpenMP) and OpenBLAS are kept to one thread on every
// thread that computes, so no library thread spin-waits against our workers.
void single_threaded_kernels() {
  at::set_num_threads(1);
  using SetThreads = void (*)(int);
  static const auto openblas = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (openblas) openblas(1);
}

struct Layer {
  at::Tensor attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  bool on_accel = false;

  std::vector<at::Tensor*> all() { return {&attn_norm, &wq, &wk, &wv, &wo, &mlp_norm, &w_gate, &w_up, &w_down}; }
};

std::uint64_t tensor_bytes(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.numel()) * static_cast<std::uint64_t>(t.element_size());
}

// Thrown inside a forward when the accelerator reports a fault at a safe point; caught in Model::forward.
struct DeviceFault {
  Error error;
};

}  // namespace

std::string_view compute_dtype_name(ComputeDType d) {
  switch (d) {
    case ComputeDType::f32: return "f32";
    case ComputeDType::bf16: return "bf16";
    case ComputeDType::f16: return "f16";
  }
  return "f32";
}

Result<ComputeDType> parse_compute_dtype(std::string_view s) {
  for (auto d : {ComputeDType::f32, ComputeDType::bf16, ComputeDType::f16})
    if (compute_dtype_name(d) == s) return d;
  return fail(Errc::invalid_argument, "unknown compute dtype '" + std::string(s) + "' (f32, bf16, f16)");
}

struct Model::Impl {
  weights::ModelDir dir;
  tok::Tokenizer tokenizer;
  LoadOptions opts;
  LoadStats stats;
  gen::Fingerprint fingerprint;
  gen::TemplateKind templ = gen::TemplateKind::raw;
  at::ScalarType dtype = at::kFloat;
  int max_context = 0;

  at::Tensor embed, final_norm, lm_head;
  std::vector<Layer> layers;
  at::Tensor inv_freq;  // [head_dim / 2], f32

  // Paged KV pool: per layer [num_blocks * block_size, kv_heads, head_dim] for K and for V.
  std::mutex kv_mu;  // guards the allocator (sequences may be created/released from several threads)
  gen::KvBlockAllocator kv;
  std::vector<at::Tensor> k_pool, v_pool;
  gen::SeqId next_seq = 1;

  std::unique_ptr<WorkerPool> pool;
  std::mutex compute_mu;  // one forward at a time per model: the pool and the KV pool tensors are shared

  // Accelerator placement (see LoadOptions::accelerator).
  std::shared_ptr<device::Device> accel;
  at::Device accel_dev{at::kCPU};
  int accel_layers = 0;
  bool head_on_accel = false;
  std::vector<device::Allocation> accel_allocs;  // weights and KV pool; void after a device loss
  device::Site current_site = device::Site::prefill;

  bool device_lost() const {
    if (!accel) return false;
    if (accel->lost()) return true;
    for (const auto& a : accel_allocs)
      if (!a.valid()) return true;
    return false;
  }

  Impl(weights::ModelDir d, tok::Tokenizer t, LoadOptions o, int blocks)
      : dir(std::move(d)), tokenizer(std::move(t)), opts(std::move(o)), kv(blocks, opts.kv_block_size) {}

  const weights::ModelConfig& cfg() const { return dir.config(); }

  // x @ W^T, split by output rows across the model's worker pool (each BLAS call single-threaded). A one-row
  // input (decode) goes through matrix-vector products: sgemm on one row reads weights 2-4x slower than gemv
  // (TOOLCHAIN.md).
  at::Tensor linear(const at::Tensor& x, const at::Tensor& w) const {
    const std::int64_t rows = w.size(0), n = x.size(0);
    if (w.is_cuda()) return at::matmul(x, w.t());
    const int T = pool->size();
    if (T == 1 || rows < 256) {
      if (n == 1) return at::mv(w, x.reshape({x.size(1)})).reshape({1, rows});
      return at::matmul(x, w.t());
    }
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(T));
    auto chunked = [&](auto&& body) {
      pool->run([&](int i) {
        try {
          c10::InferenceMode guard;
          body(rows * i / T, rows * (i + 1) / T);
        } catch (...) {
          errors[static_cast<std::size_t>(i)] = std::current_exception();
        }
      });
      for (auto& e : errors)
        if (e) std::rethrow_exception(e);
    };
    if (n == 1) {
      const at::Tensor xv = x.reshape({x.size(1)});
      at::Tensor out = at::empty({rows}, x.options());
      chunked([&](std::int64_t b, std::int64_t e) {
        at::Tensor o = out.slice(0, b, e);
        at::mv_out(o, w.slice(0, b, e), xv);
      });
      return out.reshape({1, rows});
    }
    at::Tensor out_t = at::empty({rows, n}, x.options());
    const at::Tensor xt = x.t();
    chunked([&](std::int64_t b, std::int64_t e) {
      at::Tensor o = out_t.slice(0, b, e);
      at::mm_out(o, w.slice(0, b, e), xt);
    });
    return out_t.t().contiguous();
  }

  at::Tensor rmsnorm(const at::Tensor& x, const at::Tensor& w) const {
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor r = at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + cfg().rms_norm_eps);
    return (xf * r).to(dtype) * w;
  }

  // cos/sin tables [n, head_dim] for absolute positions pos0 .. pos0+n-1 (HF "rotate_half" convention).
  std::pair<at::Tensor, at::Tensor> rope_tables(std::int64_t pos0, std::int64_t n) const {
    const at::Tensor pos = at::arange(pos0, pos0 + n, at::TensorOptions().dtype(at::kFloat));  // on the CPU
    const at::Tensor freqs = at::outer(pos, inv_freq);
    const at::Tensor emb = at::cat({freqs, freqs}, -1);
    return {emb.cos(), emb.sin()};
  }

  static at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    // x: [n, heads, hd]; cos/sin: [n, hd] broadcast over heads.
    const std::int64_t half = x.size(-1) / 2;
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor x1 = xf.narrow(-1, 0, half), x2 = xf.narrow(-1, half, half);
    const at::Tensor rot = at::cat({-x2, x1}, -1);
    return (xf * cos.unsqueeze(1) + rot * sin.unsqueeze(1)).to(x.scalar_type());
  }

  // q: [n, H, hd] at positions pos0.., keys/values: [L, kvh, hd] for positions 0..L-1. Causal. → [n, H*hd]
  at::Tensor attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                       std::int64_t pos0) const {
    const std::int64_t n = q.size(0), H = q.size(1), hd = q.size(2);
    const std::int64_t kvh = keys.size(1), L = keys.size(0), g = H / kvh;
    const at::Tensor qh = q.to(at::kFloat).view({n, kvh, g, hd}).permute({1, 2, 0, 3}).reshape({kvh, g * n, hd});
    const at::Tensor kt = keys.to(at::kFloat).permute({1, 2, 0});  // [kvh, hd, L]
    const at::Tensor vh = values.to(at::kFloat).permute({1, 0, 2});  // [kvh, L, hd]
    at::Tensor scores = at::bmm(qh, kt).mul_(1.0 / std::sqrt(static_cast<double>(hd)));
    if (n > 1 || pos0 + n < L) {
      // key j is visible to query i (absolute position pos0 + i) iff j <= pos0 + i
      const auto on = at::TensorOptions().device(q.device());
      const at::Tensor qi = at::arange(pos0, pos0 + n, on.dtype(at::kLong)).unsqueeze(1);
      const at::Tensor kj = at::arange(0, L, on.dtype(at::kLong)).unsqueeze(0);
      const at::Tensor mask = at::zeros({n, L}, on.dtype(at::kFloat))
                                  .masked_fill_(kj > qi, -std::numeric_limits<float>::infinity());
      scores = scores.view({kvh, g, n, L}).add_(mask).view({kvh, g * n, L});
    }
    const at::Tensor probs = at::softmax(scores, -1);
    const at::Tensor out = at::bmm(probs, vh);  // [kvh, g*n, hd]
    return out.view({kvh, g, n, hd}).permute({2, 0, 1, 3}).reshape({n, H * hd}).to(dtype);
  }

  // The transformer over `ids` at positions pos0..; `kv_step(layer, k, v)` stores the new K/V and returns the
  // keys/values visible to this step (all positions 0 .. pos0+n-1).
  template <class KvStep>
  at::Tensor run(const std::vector<std::int64_t>& ids, std::int64_t pos0, bool all_logits, KvStep&& kv_step) {
    const auto& c = cfg();
    const auto n = static_cast<std::int64_t>(ids.size());
    const at::Tensor idt = at::tensor(ids, at::TensorOptions().dtype(at::kLong));
    at::Tensor x = embed.index_select(0, idt);
    const auto [cpu_cos, cpu_sin] = rope_tables(pos0, n);
    at::Tensor acc_cos, acc_sin;
    if (accel_dev.is_cuda()) {
      acc_cos = cpu_cos.to(accel_dev);
      acc_sin = cpu_sin.to(accel_dev);
    }
    for (std::size_t li = 0; li < layers.size(); ++li) {
      const Layer& l = layers[li];
      const at::Device dev = l.attn_norm.device();
      if (x.device() != dev) x = x.to(dev);
      const at::Tensor& cos = dev.is_cuda() ? acc_cos : cpu_cos;
      const at::Tensor& sin = dev.is_cuda() ? acc_sin : cpu_sin;
      const at::Tensor h = rmsnorm(x, l.attn_norm);
      const at::Tensor q = apply_rope(linear(h, l.wq).view({n, c.num_heads, c.head_dim}), cos, sin);
      const at::Tensor k = apply_rope(linear(h, l.wk).view({n, c.num_kv_heads, c.head_dim}), cos, sin);
      const at::Tensor v = linear(h, l.wv).view({n, c.num_kv_heads, c.head_dim});
      const auto [keys, values] = kv_step(li, k, v);
      x = x + linear(attention(q, keys, values, pos0), l.wo);
      const at::Tensor h2 = rmsnorm(x, l.mlp_norm);
      x = x + linear(at::silu(linear(h2, l.w_gate)) * linear(h2, l.w_up), l.w_down);
      if (l.on_accel) {
        // A safe point: a device lost (or a fault injected) while this layer ran fails the forward here.
        if (auto st = accel->check(current_site); !st) throw DeviceFault{std::move(st).error()};
      }
    }
    if (x.device() != final_norm.device()) x = x.to(final_norm.device());
    x = rmsnorm(x, final_norm);
    if (!all_logits) x = x.narrow(0, n - 1, 1);
    return linear(x, lm_head).to(at::kFloat).to(at::kCPU).contiguous();
  }

  // Moves layers [0, accel_layers) (and the head when all layers go) to the accelerator, accounting every byte
  // there first; a refusal fails the load with the device's typed error.
  Status place_on_accelerator() {
    const auto& c = cfg();
    accel_dev = accel->kind() == device::Kind::cuda ? at::Device(at::kCUDA, static_cast<at::DeviceIndex>(accel->torch_index()))
                                                   : at::Device(at::kCPU);
    auto copy = [&](const at::Tensor& t) { return accel_dev.is_cuda() ? t.to(accel_dev) : t.clone(); };
#if defined(TANDEM_HAVE_TORCH_CUDA) && defined(TANDEM_HAVE_CUDA)
    // Observed memory on CUDA includes LibTorch's caching allocator: reserved (held from the driver) and
    // allocated (in live tensors). Not verified on a GPU yet (docs/cuda.md).
    if (auto* cuda = dynamic_cast<device::CudaDevice*>(accel.get())) {
      const int index = accel->torch_index();
      cuda->set_allocator_stats([index] {
        const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
        const auto agg = static_cast<std::size_t>(c10::cuda::CUDACachingAllocator::StatType::AGGREGATE);
        return std::pair<std::uint64_t, std::uint64_t>(static_cast<std::uint64_t>(st.reserved_bytes[agg].current),
                                                       static_cast<std::uint64_t>(st.allocated_bytes[agg].current));
      });
    }
#endif
    for (int li = 0; li < accel_layers; ++li) {
      Layer& l = layers[static_cast<std::size_t>(li)];
      std::uint64_t bytes = 0;
      for (at::Tensor* t : l.all()) bytes += tensor_bytes(*t);
      auto a = accel->allocate(bytes, device::Site::weights);
      if (!a) {
        Error e = std::move(a).error();
        e.message = dir.dir() + ": weights of layer " + std::to_string(li) + " on " + accel->name() + ": " + e.message;
        return fail(std::move(e));
      }
      accel_allocs.push_back(std::move(a).value());
      for (at::Tensor* t : l.all()) *t = copy(*t);
      l.on_accel = true;
      stats.accel_weight_bytes += bytes;
    }
    if (accel_layers == c.num_layers) {
      const std::uint64_t bytes = tensor_bytes(final_norm) + tensor_bytes(lm_head);
      auto a = accel->allocate(bytes, device::Site::weights);
      if (!a) {
        Error e = std::move(a).error();
        e.message = dir.dir() + ": LM head on " + accel->name() + ": " + e.message;
        return fail(std::move(e));
      }
      accel_allocs.push_back(std::move(a).value());
      final_norm = copy(final_norm);
      lm_head = copy(lm_head);  // tied: a device copy of the embedding matrix; lookups still read the mapping
      head_on_accel = true;
      stats.accel_weight_bytes += bytes;
    }
    return {};
  }
};

Model::Model() = default;
Model::~Model() = default;

Result<std::shared_ptr<Model>> Model::load(const std::string& path, const LoadOptions& opts) {
  const auto t0 = Clock::now();
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

  auto dir = weights::ModelDir::open(path);
  if (!dir) return fail(std::move(dir).error());
  auto tokenizer = tok::Tokenizer::load_file(dir->tokenizer_path());
  if (!tokenizer) return fail(std::move(tokenizer).error());
  const weights::ModelConfig cfg = dir->config();
  if (tokenizer->vocab_size() > cfg.vocab_size)
    return fail(Errc::format_error, path + "/tokenizer.model: " + std::to_string(tokenizer->vocab_size()) +
                                        " pieces but config.json vocab_size is " + std::to_string(cfg.vocab_size));
  if (cfg.head_dim % 2 != 0)
    return fail(Errc::unsupported, path + "/config.json: head_dim must be even for rotary embeddings");

  int max_context = opts.max_context > 0 ? opts.max_context : cfg.max_position_embeddings;
  if (max_context > cfg.max_position_embeddings) max_context = cfg.max_position_embeddings;
  // Mistral-style sliding-window attention is not implemented: within the window it equals full attention, so
  // the context is capped at the window instead of silently diverging beyond it.
  if (cfg.sliding_window && *cfg.sliding_window > 0 && max_context > *cfg.sliding_window)
    max_context = *cfg.sliding_window;
  const std::int64_t blocks_per_seq = (max_context + opts.kv_block_size - 1) / opts.kv_block_size;
  std::int64_t blocks = opts.kv_blocks > 0 ? opts.kv_blocks : blocks_per_seq * opts.max_sequences;
  if (blocks > (std::int64_t{1} << 30)) return fail(Errc::invalid_argument, "kv_blocks too large");

  auto m = std::shared_ptr<Model>(new Model());
  const double open_ms = ms_since(t0);
  m->impl_ = std::make_unique<Impl>(std::move(dir).value(), std::move(tokenizer).value(), opts,
                                    static_cast<int>(blocks));
  Impl& im = *m->impl_;
  im.max_context = max_context;
  im.stats.open_ms = open_ms;
  im.dtype = scalar_of(opts.dtype);
  im.stats.weight_bytes = im.dir.weight_bytes();

  if (!opts.template_name.empty()) {
    auto t = gen::parse_template(opts.template_name);
    if (!t) return fail(std::move(t).error());
    im.templ = *t;
  } else if (!im.dir.tokenizer_settings().template_guess.empty()) {
    auto t = gen::parse_template(im.dir.tokenizer_settings().template_guess);
    if (t) im.templ = *t;
  }

  single_threaded_kernels();

  const auto t1 = Clock::now();
  try {
    im.pool = std::make_unique<WorkerPool>(opts.threads, [] { single_threaded_kernels(); });
    c10::InferenceMode guard;
    std::uint64_t copied = 0;
    auto w = [&](const std::string& name) { return weight_tensor(*im.dir.tensor(name), im.dtype, copied); };
    im.embed = w("model.embed_tokens.weight");
    im.final_norm = w("model.norm.weight");
    im.lm_head = cfg.tie_word_embeddings ? im.embed : w("lm_head.weight");
    for (int i = 0; i < cfg.num_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      im.layers.push_back(Layer{w(p + "input_layernorm.weight"), w(p + "self_attn.q_proj.weight"),
                                w(p + "self_attn.k_proj.weight"), w(p + "self_attn.v_proj.weight"),
                                w(p + "self_attn.o_proj.weight"), w(p + "post_attention_layernorm.weight"),
                                w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight"),
                                w(p + "mlp.down_proj.weight")});
    }
    im.stats.resident_copy_bytes = copied;

    // Rotary inverse frequencies, with Llama 3 / linear scaling when configured.
    std::vector<float> inv(static_cast<std::size_t>(cfg.head_dim / 2));
    for (std::size_t i = 0; i < inv.size(); ++i) {
      double f = 1.0 / std::pow(cfg.rope_theta, (2.0 * static_cast<double>(i)) / cfg.head_dim);
      if (cfg.rope_scaling == weights::RopeScaling::linear) {
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
      inv[i] = static_cast<float>(f);
    }
    im.inv_freq = at::tensor(inv, at::TensorOptions().dtype(at::kFloat));

    if (opts.accelerator) {
      if (opts.accel_layers > cfg.num_layers)
        return fail(Errc::invalid_argument, "accel_layers " + std::to_string(opts.accel_layers) + " > " +
                                                std::to_string(cfg.num_layers) + " layers");
      im.accel = opts.accelerator;
      im.accel_layers = opts.accel_layers < 0 ? cfg.num_layers : opts.accel_layers;
      TANDEM_TRY(im.place_on_accelerator());
    }

    const std::int64_t slots = blocks * opts.kv_block_size;
    const std::uint64_t layer_kv_bytes = static_cast<std::uint64_t>(slots) * cfg.num_kv_heads * cfg.head_dim *
                                         static_cast<std::uint64_t>(at::elementSize(im.dtype)) * 2;
    for (int i = 0; i < cfg.num_layers; ++i) {
      auto opt = at::TensorOptions().dtype(im.dtype);
      if (i < im.accel_layers) {
        auto a = im.accel->allocate(layer_kv_bytes, device::Site::kv_pool);
        if (!a) {
          Error e = std::move(a).error();
          e.message = path + ": KV pool of layer " + std::to_string(i) + " on " + im.accel->name() + ": " + e.message;
          return fail(std::move(e));
        }
        im.accel_allocs.push_back(std::move(a).value());
        im.stats.accel_kv_bytes += layer_kv_bytes;
        opt = opt.device(im.accel_dev);
      }
      im.k_pool.push_back(at::empty({slots, cfg.num_kv_heads, cfg.head_dim}, opt));
      im.v_pool.push_back(at::empty({slots, cfg.num_kv_heads, cfg.head_dim}, opt));
    }
    im.stats.kv_pool_bytes = layer_kv_bytes * static_cast<std::uint64_t>(cfg.num_layers);
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
    for (const auto& shard : im.dir.shards()) shard.file().prefault();
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
         << ";max_positions=" << cfg.max_position_embeddings;  // not the context in force: a limit, announced apart
    std::ostringstream stops;
    for (auto id : m->eos_ids()) stops << "eos:" << id << ";";
    for (const auto& s : gen::template_stops(im.templ)) stops << "str:" << s.size() << ":" << s << ";";
    im.fingerprint = gen::Fingerprint::make({
        {"architecture", arch.str()},
        {"tokenizer", Sha256::hex(Sha256::of(im.tokenizer.model_bytes()))},
        {"weights", im.dir.header_digest() + ";" + sampled_content_digest(im.dir)},
        {"revision", opts.revision},
        {"weights_dtype", std::string(weights::dtype_name(im.dir.dtype()))},
        {"compute_dtype", std::string(compute_dtype_name(opts.dtype))},
        {"template", std::string(gen::template_name(im.templ))},
        {"add_bos", m->add_bos() ? "1" : "0"},
        {"sampling_defaults", m->default_sampling().describe()},
        {"stop_rules", stops.str()},
    });
  }
  im.stats.total_ms = ms_since(t0);
  return m;
}

const weights::ModelConfig& Model::config() const { return impl_->cfg(); }
const weights::ModelDir& Model::files() const { return impl_->dir; }
const tok::Tokenizer& Model::tokenizer() const { return impl_->tokenizer; }
const gen::Fingerprint& Model::fingerprint() const { return impl_->fingerprint; }
gen::TemplateKind Model::prompt_template() const { return impl_->templ; }
const LoadStats& Model::load_stats() const { return impl_->stats; }
const LoadOptions& Model::options() const { return impl_->opts; }
int Model::max_context() const { return impl_->max_context; }
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
  return bytes;
}

gen::SamplingParams Model::default_sampling() const {
  gen::SamplingParams p;
  const auto& g = impl_->dir.generation();
  const bool sample = g.do_sample.value_or(false);
  p.temperature = sample ? g.temperature.value_or(1.0) : 0.0;
  if (g.top_k) p.top_k = *g.top_k;
  if (g.top_p) p.top_p = *g.top_p;
  if (g.repetition_penalty) p.repetition_penalty = *g.repetition_penalty;
  return p;
}

std::vector<TokenId> Model::eos_ids() const {
  std::vector<TokenId> out;
  auto add = [&](int id) {
    if (id >= 0 && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  for (int id : impl_->dir.generation().eos_token_ids) add(id);
  for (int id : impl_->cfg().eos_token_ids) add(id);
  add(impl_->tokenizer.eos_id());
  return out;
}

bool Model::add_bos() const {
  return impl_->dir.tokenizer_settings().add_bos_token.value_or(true) && impl_->tokenizer.bos_id() >= 0;
}

KvStats Model::kv_stats() const {
  std::lock_guard lock(impl_->kv_mu);
  KvStats s;
  s.block_size = impl_->kv.block_size();
  s.total_blocks = impl_->kv.total_blocks();
  s.used_blocks = impl_->kv.used_blocks();
  s.sequences = impl_->kv.sequences();
  s.bytes_total = impl_->stats.kv_pool_bytes;
  s.bytes_used = s.total_blocks > 0 ? s.bytes_total / static_cast<std::uint64_t>(s.total_blocks) *
                                          static_cast<std::uint64_t>(s.used_blocks)
                                    : 0;
  return s;
}

std::vector<TokenId> Model::encode(const std::vector<gen::Segment>& segments) const {
  std::vector<TokenId> out;
  for (const auto& s : segments) {
    switch (s.kind) {
      case gen::Segment::bos:
        if (add_bos()) out.push_back(impl_->tokenizer.bos_id());
        break;
      case gen::Segment::eos:
        if (impl_->tokenizer.eos_id() >= 0) out.push_back(impl_->tokenizer.eos_id());
        break;
      case gen::Segment::text: {
        auto ids = impl_->tokenizer.encode(s.content);
        out.insert(out.end(), ids.begin(), ids.end());
        break;
      }
    }
  }
  return out;
}

Result<std::vector<TokenId>> Model::encode_chat(const std::vector<gen::Message>& messages) const {
  auto segs = gen::render(impl_->templ, messages);
  if (!segs) return fail(std::move(segs).error());
  return encode(*segs);
}

std::vector<TokenId> Model::encode_text(std::string_view text) const {
  return encode({{gen::Segment::bos, {}}, {gen::Segment::text, std::string(text)}});
}

Result<std::unique_ptr<Sequence>> Model::new_sequence() {
  std::lock_guard lock(impl_->kv_mu);
  const gen::SeqId id = impl_->next_seq++;
  TANDEM_TRY(impl_->kv.create(id));
  return std::unique_ptr<Sequence>(new Sequence(shared_from_this(), id));
}

// Waits for a forward in progress (compute_mu), so blocks are never handed to another sequence while a forward
// still writes into them; then marks the sequence released and returns its blocks. Safe from any thread.
void Model::release_sequence(Sequence& s) {
  std::lock_guard compute(impl_->compute_mu);
  if (s.released_) return;
  s.released_ = true;
  s.length_ = 0;
  std::lock_guard lock(impl_->kv_mu);
  impl_->kv.release(s.id_);
}

Sequence::~Sequence() { release(); }

void Sequence::release() { model_->release_sequence(*this); }

namespace {

Result<std::vector<std::int64_t>> check_ids(std::span<const TokenId> tokens, int vocab) {
  if (tokens.empty()) return fail(Errc::invalid_argument, "forward: no tokens");
  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return fail(Errc::invalid_argument, "token " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  return ids;
}

Error map_torch_error(const std::string& what, std::string_view where) {
  const bool oom = what.find("not enough memory") != std::string::npos ||
                   what.find("out of memory") != std::string::npos ||
                   what.find("DefaultCPUAllocator") != std::string::npos;
  // Sticky CUDA errors (illegal address, launch failure, ECC, device unavailable) leave the context unusable.
  const bool cuda_fault = !oom && (what.find("CUDA error") != std::string::npos ||
                                   what.find("cudaError") != std::string::npos);
  return make_error(oom ? Errc::out_of_memory : cuda_fault ? Errc::device_lost : Errc::internal,
                    std::string(where) + ": " + what);
}

}  // namespace

Result<std::vector<float>> Model::forward(Sequence& seq, std::span<const TokenId> tokens, bool all_logits) {
  Impl& im = *impl_;
  if (seq.model_.get() != this) return fail(Errc::invalid_argument, "forward: sequence belongs to another model");
  // One forward at a time per model; held from the block reservation to the last K/V write, so a release from
  // another thread (which takes this lock) cannot free blocks under a running forward.
  std::lock_guard compute(im.compute_mu);
  if (seq.released_) return fail(Errc::invalid_argument, "forward: the sequence was released");
  auto ids = check_ids(tokens, im.cfg().vocab_size);
  if (!ids) return fail(std::move(ids).error());
  const std::int64_t pos0 = seq.length_;
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (pos0 + n > im.max_context)
    return fail(Errc::invalid_argument, "context overflow: " + std::to_string(pos0) + " cached + " +
                                            std::to_string(n) + " new tokens > max context " +
                                            std::to_string(im.max_context));
  const device::Site site = n > 1 || pos0 == 0 ? device::Site::prefill : device::Site::decode;
  device::Allocation workspace;
  if (im.accel) {
    if (im.device_lost())
      return fail(Errc::device_lost, im.accel->name() + ": the model's device buffers were lost (driver reset); "
                                                         "reload the replica");
    TANDEM_TRY(im.accel->check(site));
  }
  std::vector<std::int64_t> ctx_slots;
  {
    std::lock_guard lock(im.kv_mu);
    TANDEM_TRY(im.kv.reserve(seq.id_, pos0 + n));
    const auto& table = *im.kv.table(seq.id_);
    const std::int64_t bs = im.kv.block_size();
    ctx_slots.resize(static_cast<std::size_t>(pos0 + n));
    for (std::int64_t p = 0; p < pos0 + n; ++p)
      ctx_slots[static_cast<std::size_t>(p)] = std::int64_t{table[static_cast<std::size_t>(p / bs)]} * bs + p % bs;
  }
  if (im.accel) {
    auto ws = im.accel->allocate(workspace_bytes(n, pos0 + n), site);
    if (!ws) return fail(std::move(ws).error());
    workspace = std::move(ws).value();
  }
  try {
    c10::InferenceMode guard;
    im.current_site = site;
    const at::Tensor all = at::tensor(ctx_slots, at::TensorOptions().dtype(at::kLong));
    const at::Tensor fresh = all.narrow(0, pos0, n);
    at::Tensor all_acc, fresh_acc;
    if (im.accel_dev.is_cuda()) {
      all_acc = all.to(im.accel_dev);
      fresh_acc = all_acc.narrow(0, pos0, n);
    }
    at::Tensor logits = im.run(*ids, pos0, all_logits, [&](std::size_t li, const at::Tensor& k, const at::Tensor& v) {
      const bool acc = im.k_pool[li].is_cuda();
      const at::Tensor& a = acc ? all_acc : all;
      const at::Tensor& f = acc ? fresh_acc : fresh;
      im.k_pool[li].index_copy_(0, f, k);
      im.v_pool[li].index_copy_(0, f, v);
      return std::pair{im.k_pool[li].index_select(0, a), im.v_pool[li].index_select(0, a)};
    });
    seq.length_ = pos0 + n;
    const float* p = logits.data_ptr<float>();
    return std::vector<float>(p, p + logits.numel());
  } catch (const DeviceFault& f) {
    return fail(f.error);
  } catch (const c10::Error& e) {
    Error err = map_torch_error(e.what_without_backtrace(), "forward");
    if (im.accel && err.code == Errc::internal && !im.accel->check(site).ok()) err.code = Errc::device_lost;
    return fail(std::move(err));
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, "forward: out of host memory");
  }
}

Result<std::vector<float>> Model::forward_reference(std::span<const TokenId> tokens) {
  Impl& im = *impl_;
  auto ids = check_ids(tokens, im.cfg().vocab_size);
  if (!ids) return fail(std::move(ids).error());
  if (im.device_lost()) return fail(Errc::device_lost, im.accel->name() + ": the model's device buffers were lost");
  try {
    std::lock_guard compute(im.compute_mu);
    c10::InferenceMode guard;
    at::Tensor logits = im.run(*ids, 0, true, [](std::size_t, const at::Tensor& k, const at::Tensor& v) {
      return std::pair{k, v};
    });
    const float* p = logits.data_ptr<float>();
    return std::vector<float>(p, p + logits.numel());
  } catch (const DeviceFault& f) {
    return fail(f.error);
  } catch (const c10::Error& e) {
    return fail(map_torch_error(e.what_without_backtrace(), "forward_reference"));
  }
}

}  // namespace tandem::engine
