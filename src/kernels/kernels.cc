// Kernel dispatch: CPU feature detection, the TANDEM_KERNELS override, the scalar table (the reference, one element
// at a time) and the drivers that walk tiles over a matrix: a plain row loop for decode (one activation row), cache
// blocking for prefill. The ISA-specific tiles live in kernels_avx2*.cc and kernels_avx512*.cc behind dispatch.h.
#include "kernels/kernels.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <initializer_list>
#include <limits>

#include "kernels/dispatch.h"
#include "kernels/quant.h"
#include "kernels/rows.h"
#include "kernels/rows_lanes.h"
#include "kernels/silu_lanes.h"

namespace tandem::kernels {
namespace detail {
namespace {

template <WType T>
void ref_quantize_act(const float* x, void* out, std::int64_t cols) {
  quantize_act_ref(T, x, out, cols);
}

template <WType T>
void ref_tile(const std::uint8_t* w, std::size_t w_row_bytes, int nr, const std::uint8_t* act,
              std::size_t act_row_bytes, int nc, std::int64_t cols, float* y, std::int64_t ldy) {
  for (int c = 0; c < nc; ++c) {
    for (int r = 0; r < nr; ++r) {
      y[c * ldy + r] = vec_dot_ref(T, cols, w + r * w_row_bytes, act + c * act_row_bytes);
    }
  }
}

template <WType T>
constexpr TypeKernels ref_kernels() {
  return {ref_quantize_act<T>, ref_tile<T>, 1, 1, 1};
}

}  // namespace

namespace {

inline float kv_value(float x) { return x; }
inline float kv_value(std::uint16_t h) { return f16_to_f32(h); }

// The reference attention: scores and sums in double, std::exp, key after key; f32 or f16 keys and values.
template <class KV>
void ref_attention_of(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd, const KV* k,
                      const KV* v, const std::int64_t* slots, std::int64_t pos, std::int64_t window, float scale,
                      float cap, float* scratch, float* out) {
  const std::int64_t group = heads / kv_heads, row = kv_heads * hd;
  const std::int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * hd;
    const std::int64_t off = (h / group) * hd;
    float mx = -std::numeric_limits<float>::infinity();
    for (std::int64_t j = first; j <= pos; ++j) {
      const KV* kj = k + slots[j] * row + off;
      double dot = 0;
      for (std::int64_t e = 0; e < hd; ++e) dot += static_cast<double>(qh[e]) * kv_value(kj[e]);
      float s = static_cast<float>(dot) * scale;
      if (cap > 0.0F) s = cap * std::tanh(s / cap);
      scratch[j] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (std::int64_t j = first; j <= pos; ++j) sum += (scratch[j] = std::exp(scratch[j] - mx));
    for (std::int64_t e = 0; e < hd; ++e) {
      double acc = 0;
      for (std::int64_t j = first; j <= pos; ++j)
        acc += static_cast<double>(scratch[j]) * kv_value(v[slots[j] * row + off + e]);
      out[h * hd + e] = static_cast<float>(acc / sum);
    }
  }
}

}  // namespace

void ref_attention(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd, const float* k,
                   const float* v, const std::int64_t* slots, std::int64_t pos, std::int64_t window, float scale,
                   float cap, float* scratch, float* out, KvRows /*rows: nothing to bring in*/) {
  ref_attention_of(q, heads, kv_heads, hd, k, v, slots, pos, window, scale, cap, scratch, out);
}

void ref_attention_f16(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd,
                       const std::uint16_t* k, const std::uint16_t* v, const std::int64_t* slots, std::int64_t pos,
                       std::int64_t window, float scale, float cap, float* scratch, float* out,
                       KvRows /*rows: nothing to bring in*/) {
  ref_attention_of(q, heads, kv_heads, hd, k, v, slots, pos, window, scale, cap, scratch, out);
}

namespace {

void ref_to_f16(const float* x, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = f32_to_f16(x[i]);
}

constexpr KernelTable make_scalar_table() {
  KernelTable t;
  t.isa = Isa::scalar;
  t.attention = ref_attention;
  t.attention_f16 = ref_attention_f16;
  t.to_f16 = ref_to_f16;
  t.silu_mul = silu_mul_lanes<4>;
  t.rmsnorm = rmsnorm_lanes<4>;
  t.rope = rope_lanes<4>;
  t.types[static_cast<int>(WType::f32)] = ref_kernels<WType::f32>();
  t.types[static_cast<int>(WType::f16)] = ref_kernels<WType::f16>();
  t.types[static_cast<int>(WType::bf16)] = ref_kernels<WType::bf16>();
  t.types[static_cast<int>(WType::q8_0)] = ref_kernels<WType::q8_0>();
  t.types[static_cast<int>(WType::q4_0)] = ref_kernels<WType::q4_0>();
  t.types[static_cast<int>(WType::q4_K)] = ref_kernels<WType::q4_K>();
  t.types[static_cast<int>(WType::q5_K)] = ref_kernels<WType::q5_K>();
  t.types[static_cast<int>(WType::q6_K)] = ref_kernels<WType::q6_K>();
  t.types[static_cast<int>(WType::q5_0)] = ref_kernels<WType::q5_0>();
  t.types[static_cast<int>(WType::q4_1)] = ref_kernels<WType::q4_1>();
  t.types[static_cast<int>(WType::q5_1)] = ref_kernels<WType::q5_1>();
  t.types[static_cast<int>(WType::iq4_nl)] = ref_kernels<WType::iq4_nl>();
  t.types[static_cast<int>(WType::iq4_xs)] = ref_kernels<WType::iq4_xs>();
  t.types[static_cast<int>(WType::q2_K)] = ref_kernels<WType::q2_K>();
  t.types[static_cast<int>(WType::q3_K)] = ref_kernels<WType::q3_K>();
  return t;
}

constexpr KernelTable kScalarTable = make_scalar_table();

}  // namespace

const KernelTable& scalar_table() { return kScalarTable; }

}  // namespace detail

namespace {

#if defined(TANDEM_KERNELS_HAVE_AVX2)
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
  return (c & bit_F16C) != 0;
}
#endif

#if defined(TANDEM_KERNELS_HAVE_AVXVNNI)
// AVX-VNNI: CPUID leaf 7 sub-leaf 1 EAX bit 4 (the VEX-encoded 256-bit vpdpbusd; the YMM state as AVX2's).
bool has_avx_vnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0 || a < 1) return false;  // a: the highest sub-leaf
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
  return (a >> 4) & 1;
}
#endif

#if defined(TANDEM_KERNELS_HAVE_AVX512)
// AVX-512 from CPUID leaf 7 (sub-leaf 0: EBX F bit 16, BW bit 30, VL bit 31, ECX VNNI bit 11; sub-leaf 1: EAX BF16
// bit 5) and the OS's support for the opmask and ZMM state (XCR0 bits 1, 2, 5, 6, 7, read with XGETBV once CPUID
// says OSXSAVE): read directly, as compilers name these features differently in __builtin_cpu_supports.
std::uint64_t xcr0() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || (c & bit_OSXSAVE) == 0) return 0;
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}
bool has_avx512_vnni() {
  if ((xcr0() & 0xE6) != 0xE6) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool f = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
  return f && bw && vl && vnni;
}
// AMX: CPUID leaf 7 EDX bits 24 (AMX-TILE) and 25 (AMX-INT8), XCR0 bits 17 and 18 (the OS manages the tile
// state), and the kernel's permission for this process to use the tile data, asked once (Linux 5.16 and later:
// arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; without it the first tile instruction faults).
bool has_amx_int8() {
  static const bool ok = [] {
    if ((xcr0() & 0x60000) != 0x60000) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
    if (((d >> 24) & 1) == 0 || ((d >> 25) & 1) == 0) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}
bool has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0 || a < 1) return false;  // a: the highest sub-leaf
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
  return (a >> 5) & 1;
}
#endif

bool cpu_has(Isa i) {
  switch (i) {
    case Isa::scalar: return true;
    case Isa::avx2:
#if defined(TANDEM_KERNELS_HAVE_AVX2)
      // The compiler's checks include the OS's support for the YMM state (XGETBV). clang 14 has no "f16c" name for
      // __builtin_cpu_supports, so F16C (CPUID leaf 1, ECX bit 29) is read directly.
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#else
      return false;
#endif
    case Isa::avxvnni:
#if defined(TANDEM_KERNELS_HAVE_AVXVNNI)
      return cpu_has(Isa::avx2) && has_avx_vnni();
#else
      return false;
#endif
    case Isa::avx512:
#if defined(TANDEM_KERNELS_HAVE_AVX512)
      return cpu_has(Isa::avx2) && has_avx512_vnni();
#else
      return false;
#endif
    case Isa::avx512bf16:
#if defined(TANDEM_KERNELS_HAVE_AVX512)
      return cpu_has(Isa::avx512) && has_avx512_bf16();
#else
      return false;
#endif
    case Isa::amx:
#if defined(TANDEM_KERNELS_HAVE_AVX512)
      return cpu_has(Isa::avx512bf16) && has_amx_int8();
#else
      return false;
#endif
  }
  return false;
}

const detail::KernelTable& table_for(Isa i) {
#if defined(TANDEM_KERNELS_HAVE_AVX512)
  if (i == Isa::amx) return detail::amx_table();
  if (i == Isa::avx512bf16) return detail::avx512bf16_table();
  if (i == Isa::avx512) return detail::avx512_table();
#endif
#if defined(TANDEM_KERNELS_HAVE_AVXVNNI)
  if (i == Isa::avxvnni) return detail::avxvnni_table();
#endif
#if defined(TANDEM_KERNELS_HAVE_AVX2)
  if (i == Isa::avx2) return detail::avx2_table();
#endif
  (void)i;
  return detail::scalar_table();
}

Isa isa_from_env() {
  const char* v = std::getenv("TANDEM_KERNELS");
  if (v == nullptr || *v == '\0') return detected_isa();
  if (std::strcmp(v, "scalar") == 0) return Isa::scalar;
  for (Isa i : {Isa::avx2, Isa::avxvnni, Isa::avx512, Isa::avx512bf16, Isa::amx})
    if (isa_name(i) == v && cpu_has(i)) return i;
  return detected_isa();  // unknown or unsupported here: the best this CPU and build have
}

std::atomic<const detail::KernelTable*> g_table{nullptr};

const detail::KernelTable& table() {
  const detail::KernelTable* t = g_table.load(std::memory_order_acquire);
  if (t == nullptr) {
    t = &table_for(isa_from_env());
    g_table.store(t, std::memory_order_release);
  }
  return *t;
}

// Prefill: the weight rows of one cache block stay in L2 while every activation row passes over them.
constexpr std::size_t kWeightBlockBytes = 192 * 1024;

// A prefill block's weight rows, prefetched into L2 line by line while the block before it is computed.
struct BlockBytes {
  const std::uint8_t* begin = nullptr;
  std::size_t bytes = 0;

  static BlockBytes of_rows(const std::uint8_t* w, std::size_t wrb, std::int64_t r0, std::int64_t r1) {
    if (r1 <= r0) return {};
    return {w + static_cast<std::size_t>(r0) * wrb, static_cast<std::size_t>(r1 - r0) * wrb};
  }
  std::size_t lines() const { return (bytes + 63) / 64; }
  // Lines [line, line + count) (those that exist); returns the next line to prefetch.
  std::size_t prefetch_l2(std::size_t line, std::size_t count) const {
    const std::size_t end = std::min(lines(), line + count);
    for (; line < end; ++line) __builtin_prefetch(begin + 64 * line, 0, 2);
    return line;
  }
};

}  // namespace

std::string_view isa_name(Isa i) {
  switch (i) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512bf16: return "avx512bf16";
    case Isa::amx: return "amx";
    case Isa::avxvnni: return "avxvnni";
  }
  return "unknown";
}

// The best path this CPU runs; amx included (its q8_0, q4_0, q5_0 and iq4_nl matrices are repacked at load:
// docs/kernels.md, "The AMX path").
Isa detected_isa() {
  for (Isa i : {Isa::amx, Isa::avx512bf16, Isa::avx512, Isa::avxvnni, Isa::avx2})
    if (cpu_has(i)) return i;
  return Isa::scalar;
}

bool isa_supported(Isa i) { return cpu_has(i); }

Isa active_isa() { return table().isa; }

void set_isa_for_testing(Isa i) {
  g_table.store(&table_for(cpu_has(i) ? i : detected_isa()), std::memory_order_release);
}

void quantize_act(WType t, const float* x, std::int64_t ldx, std::int64_t n, std::int64_t cols, void* act) {
  const detail::TypeKernels& k = table()[t];
  const std::size_t arb = act_row_bytes(t, cols);
  assert(arb > 0 && "cols must be a positive multiple of the type's block size");
  auto* out = static_cast<std::uint8_t*>(act);
  for (std::int64_t i = 0; i < n; ++i) k.quantize_act(x + i * ldx, out + static_cast<std::size_t>(i) * arb, cols);
}

void attention_decode(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd, const float* k,
                      const float* v, const std::int64_t* slots, std::int64_t pos, std::int64_t window, float scale,
                      float cap, float* scratch, float* out, KvRows rows) {
  table().attention(q, heads, kv_heads, hd, k, v, slots, pos, window, scale, cap, scratch, out, rows);
}

void attention_decode(const float* q, std::int64_t heads, std::int64_t kv_heads, std::int64_t hd,
                      const std::uint16_t* k, const std::uint16_t* v, const std::int64_t* slots, std::int64_t pos,
                      std::int64_t window, float scale, float cap, float* scratch, float* out, KvRows rows) {
  table().attention_f16(q, heads, kv_heads, hd, k, v, slots, pos, window, scale, cap, scratch, out, rows);
}

void f32_to_f16_row(const float* x, std::uint16_t* out, std::int64_t n) { table().to_f16(x, out, n); }

void silu_mul(const float* gate, const float* up, std::int64_t count, float* out) {
  table().silu_mul(gate, up, count, out);
}

void rmsnorm_rows(const float* x, const float* w, std::int64_t n, std::int64_t d, float eps, float* out) {
  table().rmsnorm(x, w, n, d, eps, out);
}

void rope_rows(float* x, std::int64_t n, std::int64_t heads, std::int64_t half, const float* cos_tab,
               const float* sin_tab, bool interleaved) {
  table().rope(x, n, heads, half, cos_tab, sin_tab, interleaved);
}

std::size_t aux_bytes(WType t, std::int64_t rows, std::int64_t cols) {
  const detail::TypeKernels& k = table()[t];
  if (k.prepare_aux == nullptr || rows <= 0) return 0;
  return static_cast<std::size_t>((rows + 15) / 16) * k.aux_group_bytes(cols);
}

void prepare_aux(WType t, const void* w, std::int64_t rows, std::int64_t cols, void* aux) {
  const detail::TypeKernels& k = table()[t];
  if (k.prepare_aux == nullptr || rows <= 0) return;
  k.prepare_aux(static_cast<const std::uint8_t*>(w), row_bytes(t, cols), rows, cols, static_cast<std::uint8_t*>(aux));
}

void matmul_rows(WType t, const void* w, std::int64_t cols, const void* act, std::int64_t n, float* y,
                 std::int64_t ldy, std::int64_t r0, std::int64_t r1, const void* aux) {
  if (r1 <= r0 || n <= 0) return;
  const detail::TypeKernels& k = table()[t];
  const std::size_t wrb = row_bytes(t, cols);
  const std::size_t arb = act_row_bytes(t, cols);
  assert(wrb > 0 && arb > 0 && "cols must be a positive multiple of the type's block size");
  const auto* wb = static_cast<const std::uint8_t*>(w);
  const auto* ab = static_cast<const std::uint8_t*>(act);
  const std::int64_t tr = k.tile_rows;
  const std::int64_t ta = k.tile_acts;
  // The side table of the 16-row group a tile starts (nullptr unless the tile starts on a group boundary).
  const auto* xb = static_cast<const std::uint8_t*>(aux);
  const std::size_t group_bytes = xb != nullptr && k.tile_aux != nullptr ? k.aux_group_bytes(cols) : 0;
  const auto tile = [&](std::int64_t r, int nr, const std::uint8_t* a, int nc, float* yt) {
    const std::uint8_t* wt = wb + static_cast<std::size_t>(r) * wrb;
    if (k.tile_aux != nullptr) {
      const std::uint8_t* at = group_bytes != 0 && r % 16 == 0 ? xb + static_cast<std::size_t>(r / 16) * group_bytes
                                                               : nullptr;
      k.tile_aux(wt, wrb, nr, a, arb, nc, cols, yt, ldy, at);
    } else {
      k.tile(wt, wrb, nr, a, arb, nc, cols, yt, ldy);
    }
  };
  if (n == 1) {
    const std::int64_t dr = k.decode_rows;
    for (std::int64_t r = r0; r < r1; r += dr) tile(r, static_cast<int>(std::min(dr, r1 - r)), ab, 1, y + r);
    return;
  }
  // Prefill: a block of weight rows (kWeightBlockBytes, a multiple of the tile's rows) is read from memory once and
  // stays in L2; every group of tile_acts activation rows passes over it (those rows stay in L1 across the block).
  // Float weights (2-4 bytes each, where a block's first pass waits on memory longest): meanwhile the next block's
  // rows are prefetched into L2, a few lines before each tile call, spread over all the passes, so only the first
  // block's first pass waits. (The quantized types measured level with and without: docs/kernels.md.)
  const std::int64_t passes = (n + ta - 1) / ta;
  if (passes == 1 && k.tile_any_rows && k.tile_aux != nullptr) {
    // One pass over the weights (a batched decode step): the whole range in one call.
    tile(r0, static_cast<int>(r1 - r0), ab, static_cast<int>(n), y + r0);
    return;
  }
  const std::int64_t block_rows =
      std::max<std::int64_t>(tr, static_cast<std::int64_t>(kWeightBlockBytes / wrb) / tr * tr);
  const bool prefetch_next = traits(t).block_elems == 1;
  for (std::int64_t rb = r0; rb < r1; rb += block_rows) {
    const std::int64_t re = std::min(r1, rb + block_rows);
    const BlockBytes next = prefetch_next ? BlockBytes::of_rows(wb, wrb, re, std::min(r1, re + block_rows)) : BlockBytes{};
    const std::int64_t calls = passes * ((re - rb + tr - 1) / tr);
    const std::size_t lines_per_call = (next.lines() + static_cast<std::size_t>(calls) - 1) / static_cast<std::size_t>(calls);
    std::size_t line = 0;
    for (std::int64_t c = 0; c < n; c += ta) {
      const int nc = static_cast<int>(std::min(ta, n - c));
      const std::uint8_t* ac = ab + static_cast<std::size_t>(c) * arb;
      float* yc = y + c * ldy;
      for (std::int64_t r = rb; r < re; r += tr) {
        line = next.prefetch_l2(line, lines_per_call);
        tile(r, static_cast<int>(std::min(tr, re - r)), ac, nc, yc + r);
      }
    }
  }
}

}  // namespace tandem::kernels
