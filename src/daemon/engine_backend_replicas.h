// EngineBackend-internal: a model of one engine class (engine::ClipModel, engine::WhisperModel) served by a CPU
// replica and, when the model wants it and there is an accelerator, a GPU replica that dies with the device and is
// loaded again after it recovers. The embedding and speech entries (engine_backend_embed.cc,
// engine_backend_speech.cc) are such pairs; the LLM entries have their own (hybrid layers, KV pool, step loops).
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/result.h"
#include "daemon/backend.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "device/device.h"
#include "engine/model.h"

namespace tandem::daemon {

// A model directory's small text file (config.json, preprocessor_config.json, generation_config.json), at most
// `limit` bytes; "" when it cannot be read (the callers check existence first or treat "" as absent).
inline std::string read_small_file(const std::string& path, std::size_t limit = 16u << 20) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::string s;
  s.resize(limit);
  f.read(s.data(), static_cast<std::streamsize>(limit));
  s.resize(static_cast<std::size_t>(f.gcount()));
  return s;
}

// An error that comes from the accelerator (the GPU run failed over, not the request).
inline bool accel_fault(Errc c) { return c == Errc::out_of_memory || c == Errc::device_lost || c == Errc::kv_exhausted; }

// Load options of the two replicas from a [[model]] section: the compute dtype and revision for both, the CPU and GPU
// thread counts, the accelerator for the GPU one (wanted when the model asks for the GPU and there is one).
template <class Opts>
struct ReplicaOptions {
  Opts cpu, gpu;
  bool gpu_wanted = false;
  engine::ComputeDType dtype = engine::ComputeDType::auto_;
};
template <class Opts>
Result<ReplicaOptions<Opts>> replica_options(const ModelConfig& mc, const std::shared_ptr<device::Device>& accel) {
  auto dt = engine::parse_compute_dtype(mc.dtype);
  if (!dt) return fail(Errc::invalid_argument, "model " + mc.name + ": " + dt.error().message);
  ReplicaOptions<Opts> r;
  r.dtype = *dt;
  Opts o;
  o.dtype = *dt;
  o.revision = mc.revision;
  r.cpu = o;
  r.cpu.threads = mc.cpu_threads;
  r.gpu = o;
  r.gpu.threads = mc.gpu_threads;
  r.gpu.accelerator = accel;
  r.gpu_wanted = mc.gpu && accel != nullptr;
  return r;
}

// What a replica holds on the accelerator: its weights, and its KV pool where the model has one (Whisper's decoder).
template <class Stats>
std::uint64_t resident_accel_bytes(const Stats& s) {
  if constexpr (requires { s.accel_kv_bytes; }) return s.accel_weight_bytes + s.accel_kv_bytes;
  else return s.accel_weight_bytes;
}

template <class M>
struct ReplicaPair {
  ModelConfig cfg;
  std::shared_ptr<M> cpu;
  mutable std::mutex gpu_mu;
  std::shared_ptr<M> gpu;      // guarded by gpu_mu
  std::string gpu_error;       // guarded by gpu_mu
  std::uint64_t gpu_epoch = 0; // the accelerator's epoch when `gpu` was loaded; a loss bumps it
  bool gpu_wanted = false;
  bool evicted = false;        // given back on purpose (evict): not reloaded after a loss; guarded by gpu_mu

  // The GPU replica's tensors died with the device: lost now, or lost and back since it was loaded (a new epoch).
  bool gpu_lost(const device::Device* accel) const {
    return accel && (accel->lost() || accel->epoch() != gpu_epoch);
  }

  // Loads the GPU replica with `load()` (a Result<std::shared_ptr<M>>). It must have the CPU replica's fingerprint
  // (incompatible otherwise). `kind` names the model kind in the log line ("embedding", "speech").
  template <class Load>
  Status load_gpu(const device::Device* accel, const char* kind, Load&& load) {
    const auto t0 = std::chrono::steady_clock::now();
    auto m = load();
    std::lock_guard lock(gpu_mu);
    evicted = false;  // loaded, or failed (with its error): no longer given back on purpose
    if (!m) {
      gpu.reset();
      gpu_error = m.error().message;
      return fail(std::move(m).error());
    }
    if ((*m)->fingerprint() != cpu->fingerprint()) {
      gpu_error = "GPU replica fingerprint differs from the CPU replica's";
      return fail(Errc::incompatible, gpu_error);
    }
    gpu = std::move(m).value();
    gpu_epoch = accel ? accel->epoch() : 0;
    gpu_error.clear();
    log::info("{} model {}: GPU replica ready in {} ms ({} MiB weights on {})", kind, cfg.name,
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count(),
              gpu->stats().accel_weight_bytes >> 20, accel ? accel->name() : "none");
    return {};
  }

  // After a device loss and recovery: loads the GPU replica again when it is wanted, not usable and not evicted.
  template <class Load>
  Status reload(const device::Device* accel, const char* kind, Load&& load) {
    if (!gpu_wanted) return {};
    {
      std::lock_guard lock(gpu_mu);
      if (evicted || (gpu && !gpu_lost(accel))) return {};
      gpu.reset();
    }
    return load_gpu(accel, kind, std::forward<Load>(load));
  }

  // Gives the GPU replica back (Backend::evict_gpu): drops it (its tensors go with the last run holding it) and
  // returns the bytes it held on the accelerator. unsupported when no GPU replica is wanted.
  Result<std::uint64_t> evict(const device::Device* accel) {
    if (!gpu_wanted) return fail(Errc::unsupported, "model " + cfg.name + " has no GPU replica");
    std::lock_guard lock(gpu_mu);
    const std::uint64_t bytes = gpu && !gpu_lost(accel) ? resident_accel_bytes(gpu->stats()) : 0;
    gpu.reset();
    evicted = true;
    return bytes;
  }

  // The GPU replica for a run; null when there is none or it died with the device.
  std::shared_ptr<M> gpu_for_run(const device::Device* accel) const {
    std::lock_guard lock(gpu_mu);
    if (!gpu || gpu_lost(accel)) return nullptr;
    return gpu;
  }
  bool gpu_ready(const device::Device* accel) const { return gpu_for_run(accel) != nullptr; }
  std::uint64_t gpu_bytes(const device::Device* accel) const {
    auto m = gpu_for_run(accel);
    return m ? resident_accel_bytes(m->stats()) : 0;
  }

  // The replicas as ListModels / the model objects show them; `layers(model)` counts a replica's layers.
  template <class Layers>
  std::vector<ReplicaInfo> infos(const device::Device* accel, Layers&& layers) const {
    std::vector<ReplicaInfo> out;
    if (gpu_wanted) {
      ReplicaInfo r;
      std::lock_guard lock(gpu_mu);
      r.device = "gpu";
      r.mode = "resident";
      if (evicted) {
        r.state = ReplicaState::evicted;
      } else if (gpu) {
        const bool lost = gpu_lost(accel);
        r.state = lost ? ReplicaState::lost : ReplicaState::loaded;
        r.layers = static_cast<std::uint32_t>(layers(*gpu));
        r.accel_bytes = lost ? 0 : resident_accel_bytes(gpu->stats());
        r.fingerprint = gpu->fingerprint();
      } else {
        r.state = ReplicaState::failed;
        r.error = gpu_error;
      }
      out.push_back(r);
    }
    ReplicaInfo c;
    c.device = "cpu";
    c.state = ReplicaState::loaded;
    c.mode = "mmap";
    c.fingerprint = cpu->fingerprint();
    c.host_bytes = cpu->stats().resident_copy_bytes;
    out.push_back(c);
    return out;
  }
};

}  // namespace tandem::daemon
