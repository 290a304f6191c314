#include "policy/types.h"

#include "policy/format.h"

namespace tandem::policy {

namespace {

Status in_range(const char* path, std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
  if (v >= lo && v <= hi) return {};
  return fail(Errc::invalid_argument, std::string(path) + " must be in [" + std::to_string(lo) + "," +
                                          std::to_string(hi) + "], got " + std::to_string(v));
}

}  // namespace

// Bounds keep every product in the estimator far from uint64 overflow (it saturates anyway).
Status ModelShape::validate() const {
  TANDEM_TRY(in_range("model.layers", layers, 1, 1024));
  TANDEM_TRY(in_range("model.hidden", hidden, 1, 1u << 20));
  TANDEM_TRY(in_range("model.intermediate", intermediate, 1, 1u << 22));
  TANDEM_TRY(in_range("model.heads", heads, 1, 1024));
  TANDEM_TRY(in_range("model.kv_heads", kv_heads, 1, heads));
  if (heads % kv_heads != 0) {
    return fail(Errc::invalid_argument, "model.kv_heads must divide model.heads (" + std::to_string(heads) +
                                            "), got " + std::to_string(kv_heads));
  }
  TANDEM_TRY(in_range("model.head_dim", head_dim, 1, 4096));
  TANDEM_TRY(in_range("model.vocab", vocab, 1, 1u << 24));
  if (weight_bits != 4 && weight_bits != 8 && weight_bits != 16 && weight_bits != 32) {
    return fail(Errc::invalid_argument, "model.weight_bits must be 4, 8, 16 or 32, got " + std::to_string(weight_bits));
  }
  if (kv_elem_bytes != 1 && kv_elem_bytes != 2 && kv_elem_bytes != 4) {
    return fail(Errc::invalid_argument, "model.kv_elem_bytes must be 1, 2 or 4, got " + std::to_string(kv_elem_bytes));
  }
  if (cpu_kv_elem_bytes != 2 && cpu_kv_elem_bytes != 4) {
    return fail(Errc::invalid_argument, "model.cpu_kv_elem_bytes must be 2 or 4, got " + std::to_string(cpu_kv_elem_bytes));
  }
  if (act_elem_bytes != 2 && act_elem_bytes != 4) {
    return fail(Errc::invalid_argument, "model.act_elem_bytes must be 2 or 4, got " + std::to_string(act_elem_bytes));
  }
  return {};
}

Status RequestShape::validate() const {
  TANDEM_TRY(in_range("request.prompt_tokens", prompt_tokens, 1, 1u << 22));
  TANDEM_TRY(in_range("request.max_new_tokens", max_new_tokens, 1, 1u << 22));
  TANDEM_TRY(in_range("request.batch", batch, 1, 1024));
  TANDEM_TRY(in_range("request.prefill_chunk", prefill_chunk, 0, 1u << 22));
  return {};
}

Status MemorySnapshot::validate() const {
  if (total_bytes == 0) return fail(Errc::invalid_argument, "snapshot.total_bytes must be > 0, got 0");
  if (free_bytes > total_bytes) {
    return fail(Errc::invalid_argument, "snapshot.free_bytes must be <= total_bytes (" + std::to_string(total_bytes) +
                                            "), got " + std::to_string(free_bytes));
  }
  if (reserved_bytes > total_bytes) {
    return fail(Errc::invalid_argument, "snapshot.reserved_bytes must be <= total_bytes (" +
                                            std::to_string(total_bytes) + "), got " + std::to_string(reserved_bytes));
  }
  if (allocated_bytes > reserved_bytes) {
    return fail(Errc::invalid_argument, "snapshot.allocated_bytes must be <= reserved_bytes (" +
                                            std::to_string(reserved_bytes) + "), got " +
                                            std::to_string(allocated_bytes));
  }
  return {};
}

std::string_view device_name(Device d) noexcept {
  switch (d) {
    case Device::gpu: return "gpu";
    case Device::hybrid: return "hybrid";
    case Device::cpu: return "cpu";
  }
  return "gpu";
}

}  // namespace tandem::policy
