// What the CLIP and Whisper models share past their files (encoder_model.h).
#include "engine/encoder_model.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "engine/dequant.h"
#include "engine/upload.h"

namespace tandem::engine {

namespace {

std::uint64_t tensor_bytes(const at::Tensor& t) {
  return static_cast<std::uint64_t>(t.numel()) * static_cast<std::uint64_t>(t.element_size());
}

}  // namespace

Status check_load_options(int threads, const std::shared_ptr<device::Device>& accelerator) {
  if (threads < 1 || threads > 256)
    return fail(Errc::invalid_argument, "threads must be in [1, 256], got " + std::to_string(threads));
  if (accelerator && accelerator->lost())
    return fail(Errc::device_lost, accelerator->name() + ": device lost; cannot load onto it");
  return {};
}

void EncoderModelBase::start_pool(int threads) {
  Model::init_compute_thread();
  pool = std::make_unique<WorkerPool>(threads, [] { Model::init_compute_thread(); });
}

Result<std::uint64_t> EncoderModelBase::place_on_accelerator(const std::vector<Weight*>& matrices,
                                                             const std::vector<at::Tensor*>& vectors, const char* model) {
  accel_dev = accel->kind() == device::Kind::cuda ? at::Device(at::kCUDA, static_cast<at::DeviceIndex>(accel->torch_index()))
                                                 : at::Device(at::kCPU);
  std::uint64_t bytes = 0;
  for (Weight* w : matrices) {
    bytes += w->bytes();
    dequant_ws = std::max(dequant_ws, dequantize_aten_workspace(w->type, w->rows, w->cols, 4));
  }
  for (at::Tensor* v : vectors) bytes += tensor_bytes(*v);
  auto a = accel->allocate(bytes, device::Site::weights);
  if (!a) {
    Error e = std::move(a).error();
    e.message = std::string(model) + " weights on " + accel->name() + ": " + e.message;
    return fail(std::move(e));
  }
  accel_allocs.push_back(std::move(a).value());
  // One group: on the simulated device one mapping of whole huge pages for the model (engine/upload.h).
  std::vector<at::Tensor> cpu;
  for (Weight* w : matrices) cpu.push_back(w->cpu_tensor());
  for (at::Tensor* v : vectors) cpu.push_back(*v);
  std::vector<at::Tensor> dev = to_accelerator(cpu, accel_dev);
  for (std::size_t i = 0; i < matrices.size(); ++i) matrices[i]->dev = std::move(dev[i]);
  for (std::size_t i = 0; i < vectors.size(); ++i) *vectors[i] = std::move(dev[matrices.size() + i]);
  return bytes;
}

at::Tensor EncoderModelBase::linear(const at::Tensor& x, const Weight& w, const at::Tensor& b,
                                    const std::vector<std::int64_t>& lens) {
  if (!on_accel()) {
    at::Tensor y = cpu_linear(x.contiguous(), w, *pool, act_buf);
    if (b.defined()) add_bias_rows(y.data_ptr<float>(), b.data_ptr<float>(), y.size(0), y.size(1));
    return y;
  }
  const at::Tensor m = dequantize_aten(w.dev, w.type, w.cols, at::kFloat);
  at::Tensor y;
  if (accel_dev.is_cuda() || lens.size() <= 1) {
    y = at::matmul(x, m.t());
  } else {
    std::vector<at::Tensor> parts;
    std::int64_t off = 0;
    for (std::int64_t n : lens) {
      parts.push_back(at::matmul(x.narrow(0, off, n), m.t()));
      off += n;
    }
    y = at::cat(parts, 0);
  }
  return b.defined() ? y.add_(b) : y;
}

at::Tensor EncoderModelBase::layer_norm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, double eps_in) const {
  const double eps = static_cast<double>(static_cast<float>(eps_in));
  if (!on_accel()) {
    const at::Tensor xf = x.contiguous();
    at::Tensor out = at::empty_like(xf);
    layer_norm_rows(xf.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), xf.size(0), xf.size(1), eps,
                    out.data_ptr<float>());
    return out;
  }
  return at::layer_norm(x, {x.size(1)}, w, b, eps);
}

at::Tensor EncoderModelBase::gelu(at::Tensor x) const {
  if (!on_accel()) {
    gelu_rows(x.data_ptr<float>(), x.numel());
    return x;
  }
  return at::gelu(x);
}

}  // namespace tandem::engine
