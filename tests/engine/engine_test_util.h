// Helpers shared by the encoder-model tests (test_clip.cc, test_whisper.cc): scratch directories, loading with the
// error shown, f32 tensors read from safetensors for the ATen references, differences of outputs, config edits
// expected to fail, safetensors rewritten without a tensor or with one of another shape, and simulated devices.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/result.h"
#include "core/temp_dir.h"
#include "device/simulated.h"
#if defined(TANDEM_HAVE_CUDA)
#include "device/cuda.h"
#endif
#include "weights/safetensors.h"

namespace tandem::engine::test {

// A fresh, empty directory <model>-<name> in the binary's scratch directory (removed when it exits).
inline std::string fresh_dir(const std::string& model, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path p = fs::path(core::scratch_root("test")) / (model + "-" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// M::load(path, o), failing the test (with the message) when it does not load.
template <class M, class Options>
std::shared_ptr<M> load_ok(const std::string& path, const Options& o) {
  auto m = M::load(path, o);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.ok() ? *m : nullptr;
}

// A simulated accelerator of `capacity_bytes`.
inline std::shared_ptr<device::SimulatedDevice> simulated_device(std::uint64_t capacity_bytes) {
  device::SimulatedConfig sc;
  sc.capacity_bytes = capacity_bytes;
  return std::make_shared<device::SimulatedDevice>(sc, std::make_shared<SteadyClock>());
}

#if defined(TANDEM_HAVE_CUDA)
// The GPU (device 0), opened once per process; null where there is none or where LibTorch cannot use it (Debian's
// CPU LibTorch), with the reason in *why (the tests skip with it: "no GPU: ...").
inline std::shared_ptr<device::CudaDevice> cuda_device(std::string* why) {
  static std::string reason;
  static const std::shared_ptr<device::CudaDevice> dev = []() -> std::shared_ptr<device::CudaDevice> {
    auto d = device::CudaDevice::open(0, std::make_shared<SteadyClock>());
    if (!d) {
      reason = "no GPU: " + d.error().message;
      return nullptr;
    }
    if (!at::hasCUDA()) {
      reason = "no GPU for LibTorch: this LibTorch is built without CUDA (" + (*d)->name() + " is there)";
      return nullptr;
    }
    return *d;
  }();
  if (why) *why = reason;
  return dev;
}

// `auto dev = ...` the GPU, or the test skips with the reason.
#define TANDEM_REQUIRE_GPU(dev)                                   \
  std::string why_##dev;                                          \
  auto dev = ::tandem::engine::test::cuda_device(&why_##dev);     \
  if (!dev) GTEST_SKIP() << why_##dev
#endif

// M::load(path) onto a 1000-byte device: the weights are refused, out_of_memory.
template <class M, class Options>
void expect_weights_refused(const std::string& path) {
  Options o;
  o.accelerator = simulated_device(1000);
  auto m = M::load(path, o);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, Errc::out_of_memory);
}

// Tensor `name` of an f32 safetensors file, copied.
inline at::Tensor f32_tensor(const weights::SafetensorsFile& f, const std::string& name) {
  const auto* info = f.find(name);
  EXPECT_NE(info, nullptr) << name;
  auto bytes = f.bytes(*info);
  return at::from_blob(const_cast<std::byte*>(bytes.data()), at::IntArrayRef(info->shape), at::kFloat).clone();
}

// max |a − b|.
inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(double(a[i]) - b[i]));
  return d;
}

// `parse(text)` fails with `code` and a message naming `key`.
template <class Parse>
void expect_parse_error(Parse&& parse, const std::string& text, Errc code, const std::string& key) {
  auto r = parse(text);
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_EQ(r.error().code, code) << r.error().message;
  EXPECT_NE(r.error().message.find(key), std::string::npos) << r.error().message;
}

// `base` with its first `from` replaced by `to` (a test failure when `from` is absent).
inline std::string edited(std::string base, const std::string& from, const std::string& to) {
  const auto at = base.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) base.replace(at, from.size(), to);
  return base;
}

// Writes `dir`/config.json and a model.safetensors with f's tensors, less `drop` when `shape` is empty, or with
// `drop` cut to `shape` (its leading bytes).
inline void write_rewritten(const weights::SafetensorsFile& f, const std::string& config_from, const std::string& dir,
                            const std::string& drop, const std::vector<std::int64_t>& shape) {
  std::filesystem::copy_file(config_from, dir + "/config.json");
  std::vector<weights::TensorToWrite> ts;
  for (const auto& t : f.tensors()) {
    if (t.name == drop && shape.empty()) continue;
    weights::TensorToWrite w{t.name, t.dtype, t.shape, f.bytes(t)};
    if (t.name == drop) {
      w.shape = shape;
      std::size_t n = 1;
      for (auto x : shape) n *= static_cast<std::size_t>(x);
      w.data = w.data.subspan(0, weights::dtype_size(t.dtype) * n);
    }
    ts.push_back(w);
  }
  EXPECT_TRUE(weights::write_safetensors(dir + "/model.safetensors", ts).ok());
}

}  // namespace tandem::engine::test
