// Shared shapes and snapshot builders for the policy tests.
#pragma once

#include "policy/policy.h"

namespace tandem::policy::testing {

// A tiny model whose terms are easy to compute by hand (see test_estimator.cc).
inline ModelShape tiny_model() {
  ModelShape m;
  m.name = "tiny";
  m.layers = 2;
  m.hidden = 8;
  m.intermediate = 16;
  m.heads = 2;
  m.kv_heads = 1;
  m.head_dim = 4;
  m.vocab = 32;
  m.weight_bits = 16;
  m.kv_elem_bytes = 2;
  m.act_elem_bytes = 2;
  return m;
}

// Llama-2-7B's published shape (6.74 B parameters, 0.5 MiB of fp16 KV per token).
inline ModelShape llama7b() {
  ModelShape m;
  m.name = "llama-2-7b";
  m.layers = 32;
  m.hidden = 4096;
  m.intermediate = 11008;
  m.heads = 32;
  m.kv_heads = 32;
  m.head_dim = 128;
  m.vocab = 32000;
  return m;
}

// A small fallback model for the CPU.
inline ModelShape small_model() {
  ModelShape m = llama7b();
  m.name = "small-1b";
  m.layers = 16;
  m.hidden = 2048;
  m.intermediate = 5632;
  m.heads = 16;
  m.kv_heads = 4;
  m.head_dim = 128;
  return m;
}

inline RequestShape request(std::uint32_t prompt, std::uint32_t max_new) {
  RequestShape r;
  r.prompt_tokens = prompt;
  r.max_new_tokens = max_new;
  return r;
}

inline Clock::time_point at(Clock::duration d) { return Clock::time_point{} + d; }

}  // namespace tandem::policy::testing
