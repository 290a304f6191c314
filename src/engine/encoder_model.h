// What the CLIP and Whisper models share past their files: the worker pool and activation buffer of the CPU
// kernels, the accelerator their weights are placed on, and the forward's building blocks that pick the CPU row
// kernels (encoder_rows.h) or ATen — linear, layer norm, GELU — plus the guard that runs one call under the model's
// lock with its workspace accounted. ClipModel::Impl and WhisperModel::Impl derive from it. Engine-internal;
// includes ATen's Tensor type (the template guards need c10's InferenceMode).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "device/device.h"
#include "engine/encoder_rows.h"
#include "engine/model_files.h"
#include "engine/weight.h"
#include "engine/worker_pool.h"

namespace tandem::engine {

// The threads and accelerator a load asks for, checked before anything is opened.
Status check_load_options(int threads, const std::shared_ptr<device::Device>& accelerator);

struct EncoderModelBase : ModelFiles {
  std::unique_ptr<WorkerPool> pool;
  std::vector<std::byte> act_buf;
  std::mutex compute_mu;  // one call at a time: the pool and act_buf are shared

  std::shared_ptr<device::Device> accel;
  at::Device accel_dev{at::kCPU};
  std::vector<device::Allocation> accel_allocs;
  std::uint64_t dequant_ws = 0;

  bool on_accel() const { return accel != nullptr; }
  bool device_lost() const {
    if (!accel) return false;
    if (accel->lost()) return true;
    for (const auto& a : accel_allocs)
      if (!a.valid()) return true;
    return false;
  }

  // The compute thread's settings and the worker pool (inside a load's guard: it may throw).
  void start_pool(int threads);
  // Every matrix at its held size and every vector (f32) to `accel`, accounted first as one allocation at
  // Site::weights (a refusal names `model`'s weights); returns the bytes placed.
  Result<std::uint64_t> place_on_accelerator(const std::vector<Weight*>& matrices, const std::vector<at::Tensor*>& vectors,
                                             const char* model);

  // x [rows, in] · wᵀ (+ b). CPU: cpu_linear (row-independent) and the bias per row. Accelerator: the matrix expanded
  // (dequant.h); on the simulated device (ATen's CPU BLAS) each item of `lens` (its row count) gets its own
  // product, as when the item is alone; on CUDA, or without lens, one product over all rows.
  at::Tensor linear(const at::Tensor& x, const Weight& w, const at::Tensor& b, const std::vector<std::int64_t>& lens = {});
  // Layer norm over the last dimension with eps as an f32 value (what torch's f32 layer norm adds, and what a GGUF
  // file stores), so the HF and GGUF files of one model give identical outputs.
  at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps) const;
  // Exact GELU (in place on the CPU).
  at::Tensor gelu(at::Tensor x) const;

  // Runs `body` (returning Result<T>) under the model's lock with `ws_bytes` accounted at `site` on the accelerator,
  // mapping failures to errors: buffers lost (the model's, or `also_needed` when given) and a c10 failure on a device
  // that no longer answers are device_lost, naming `model`.
  template <class T, class F>
  Result<T> guarded(std::uint64_t ws_bytes, device::Site site, const char* op, const char* model,
                    const device::Allocation* also_needed, F&& body) {
    std::lock_guard lock(compute_mu);
    device::Allocation ws;
    if (accel) {
      if (device_lost() || (also_needed && !also_needed->valid()))
        return fail(Errc::device_lost, accel->name() + ": the " + model + " model's device buffers were lost; reload it");
      TANDEM_TRY(accel->check(site));
      auto a = accel->allocate(ws_bytes, site);
      if (!a) return fail(std::move(a).error());
      ws = std::move(a).value();
    }
    try {
      c10::InferenceMode guard;
      return body();
    } catch (const Cancelled&) {
      return fail(Errc::cancelled, std::string(op) + ": cancelled");
    } catch (const Error& e) {
      return fail(e);
    } catch (const c10::Error& e) {
      Error err = torch_error(e.what_without_backtrace(), op);
      if (accel && err.code == Errc::internal && !accel->check(site).ok()) err.code = Errc::device_lost;
      return fail(std::move(err));
    } catch (const std::bad_alloc&) {
      return fail(Errc::out_of_memory, std::string(op) + ": out of host memory");
    }
  }
};

// Runs a load's `body` (returning Status) in inference mode, mapping LibTorch, host memory and thread failures to
// errors that name `path` and `model`'s weights.
template <class F>
Status guarded_load(const std::string& path, const char* model, F&& body) {
  try {
    c10::InferenceMode guard;
    return body();
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    const bool oom = what.find("alloc") != std::string::npos || what.find("memory") != std::string::npos;
    return fail(oom ? Errc::out_of_memory : Errc::internal, path + ": loading " + model + " weights failed: " + what);
  } catch (const std::bad_alloc&) {
    return fail(Errc::out_of_memory, path + ": out of host memory while loading " + model + " weights");
  } catch (const std::system_error& e) {
    return fail(Errc::internal, path + ": cannot start worker threads: " + e.what());
  }
}

}  // namespace tandem::engine
