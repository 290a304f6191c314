// The admission tests' fixture (test_admission.cc, test_admission_evict.cc): a 7B-shaped model on a 24 GiB device
// with 8 GiB of headroom, a CPU replica and a fallback model, and a host guard.
#pragma once

#include <gtest/gtest.h>

#include "fixtures.h"
#include "policy/admission.h"

namespace tandem::policy::testing {

constexpr std::uint64_t G = kGiB;

class AdmissionTest : public ::testing::Test {
 public:
  AdmissionTest() : host_(HostGuardConfig{32 * G, 1 * G, 4}) {}

  AdmissionSnapshot base() const {
    AdmissionSnapshot s;
    s.model = llama7b();
    s.request = request(1000, 1000);
    s.gpu.headroom.total_bytes = 24 * G;
    s.gpu.headroom.headroom = static_cast<std::int64_t>(8 * G);
    s.gpu.headroom.drained_headroom = static_cast<std::int64_t>(8 * G);
    s.gpu.weights_resident = true;
    s.gpu.offload_supported = true;
    s.gpu.max_context = 8192;
    s.gpu.max_new_tokens = 4096;
    s.cpu.replica_present = true;
    s.cpu.fingerprint_compatible = true;
    s.cpu.fallback = small_model();
    s.cpu.max_context = 4096;
    s.cpu.max_new_tokens = 1024;
    s.cpu.host = &host_;
    s.cpu.host_reading.mem_available = 64 * G;
    s.gpu.evict_budget = 4;
    return s;
  }
  std::int64_t need(const AdmissionSnapshot& s) const {
    return static_cast<std::int64_t>(policy_.estimator().estimate(s.model, s.request, s.gpu.weights_resident).total_bytes);
  }
  void no_fit(AdmissionSnapshot& s) const { s.gpu.headroom.headroom = need(s) - 1; }

  HostMemoryGuard host_;
  AdmissionPolicy policy_{LadderConfig{}, EstimatorConfig{}, HostGuardConfig{32 * G, 1 * G, 4}};
};

}  // namespace tandem::policy::testing
