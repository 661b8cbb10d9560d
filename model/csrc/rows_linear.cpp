// An f32 linear for the few rows of a decode step: y[r, j] = x[r, :] · w[j, :] (+ b[j]), read
// straight from the unpacked weight [out, in].
//
// MKL's sgemv/sgemm on a handful of rows reaches about half of a plain read's bandwidth; this
// kernel streams each weight row once per call and uses it for every input row while it sits in
// L1. Each output is one dot product whose order of additions depends only on the input width:
// not on how many rows the call has, how they are tiled or how the outputs are split between
// threads. So a row decodes to the same bits alone or beside 63 others.
//
// Two instruction sets: AVX-512F (16 lanes) and AVX2+FMA (8 lanes). The choice is made once per
// process, so every call of a process sums in the same order. Off x86-64 (Grace, Graviton) the
// kernels are not compiled: the shim reports no instruction set and callers use aten.
#include <ATen/ATen.h>
#include "shim_error.h"
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// Weight rows per tile: one accumulator per (input row, weight row) pair.
constexpr int kOut = 4;
// Weight bytes below which a call stays on one thread (waking the pool costs more).
constexpr int64_t kSerialBytes = 256 * 1024;

enum class Isa { None, Avx2, Avx512 };

Isa detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return Isa::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
#endif
  return Isa::None;
}

Isa isa() {
  static const Isa chosen = detect();
  return chosen;
}

bool supported(Isa wanted) { return wanted == Isa::Avx2 ? isa() != Isa::None : wanted == isa(); }

#if defined(__x86_64__)
// R input rows times kOut weight rows; `out[r * kOut + o]` receives the dot products.
template <int R>
__attribute__((target("avx512f"))) void tile_avx512(const float* const* xr, const float* const* wr, int64_t k, float* out) {
  __m512 acc[R][kOut];
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < kOut; ++o) acc[r][o] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m512 wv[kOut];
    for (int o = 0; o < kOut; ++o) wv[o] = _mm512_loadu_ps(wr[o] + i);
    for (int r = 0; r < R; ++r) {
      __m512 xv = _mm512_loadu_ps(xr[r] + i);
      for (int o = 0; o < kOut; ++o) acc[r][o] = _mm512_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  if (i < k) {
    const __mmask16 m = static_cast<__mmask16>((1u << (k - i)) - 1);
    __m512 wv[kOut];
    for (int o = 0; o < kOut; ++o) wv[o] = _mm512_maskz_loadu_ps(m, wr[o] + i);
    for (int r = 0; r < R; ++r) {
      __m512 xv = _mm512_maskz_loadu_ps(m, xr[r] + i);
      for (int o = 0; o < kOut; ++o) acc[r][o] = _mm512_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < kOut; ++o) out[r * kOut + o] = _mm512_reduce_add_ps(acc[r][o]);
}

__attribute__((target("avx2,fma"))) float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int R>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* const* xr, const float* const* wr, int64_t k, float* out) {
  __m256 acc[R][kOut];
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < kOut; ++o) acc[r][o] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 wv[kOut];
    for (int o = 0; o < kOut; ++o) wv[o] = _mm256_loadu_ps(wr[o] + i);
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_loadu_ps(xr[r] + i);
      for (int o = 0; o < kOut; ++o) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  if (i < k) {
    alignas(32) static const int32_t ones[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    const __m256i m = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ones + 8 - (k - i)));
    __m256 wv[kOut];
    for (int o = 0; o < kOut; ++o) wv[o] = _mm256_maskload_ps(wr[o] + i, m);
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_maskload_ps(xr[r] + i, m);
      for (int o = 0; o < kOut; ++o) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int o = 0; o < kOut; ++o) out[r * kOut + o] = sum8(acc[r][o]);
}

using Tile = void (*)(const float* const*, const float* const*, int64_t, float*);

// Input rows per tile. A tile of fewer rows does for each row exactly what a full one does.
// AVX-512 has 32 vector registers: 6 x 4 accumulators plus the loads fit; AVX2 has 16: 2 x 4.
constexpr int kRows512 = 6;
constexpr int kRows256 = 2;
const Tile kTiles512[kRows512] = {tile_avx512<1>, tile_avx512<2>, tile_avx512<3>, tile_avx512<4>, tile_avx512<5>, tile_avx512<6>};
const Tile kTiles256[kRows256] = {tile_avx2<1>, tile_avx2<2>};

void run(const float* x, const float* w, const float* b, float* y, int64_t rows, int64_t in, int64_t out, Isa chosen) {
  const Tile* tiles = chosen == Isa::Avx512 ? kTiles512 : kTiles256;
  const int max_rows = chosen == Isa::Avx512 ? kRows512 : kRows256;
  const int64_t out_tiles = (out + kOut - 1) / kOut;
  const int64_t tile_bytes = kOut * in * static_cast<int64_t>(sizeof(float));
  // A zero-width weight (every output is its bias) must not divide by zero here.
  const int64_t grain = std::max<int64_t>(1, kSerialBytes / std::max<int64_t>(1, tile_bytes));
  at::parallel_for(0, out_tiles, grain, [&](int64_t begin, int64_t end) {
    float part[kRows512 * kOut];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t j0 = t * kOut;
      const int valid = static_cast<int>(std::min<int64_t>(kOut, out - j0));
      // A short last tile repeats its last weight row; the extra results are dropped.
      const float* wr[kOut];
      for (int o = 0; o < kOut; ++o) wr[o] = w + (j0 + std::min(o, valid - 1)) * in;
      for (int64_t r0 = 0; r0 < rows; r0 += max_rows) {
        const int n = static_cast<int>(std::min<int64_t>(max_rows, rows - r0));
        const float* xr[kRows512];
        for (int r = 0; r < n; ++r) xr[r] = x + (r0 + r) * in;
        tiles[n - 1](xr, wr, in, part);
        for (int r = 0; r < n; ++r) {
          float* yr = y + (r0 + r) * out + j0;
          for (int o = 0; o < valid; ++o) yr[o] = b == nullptr ? part[r * kOut + o] : part[r * kOut + o] + b[j0 + o];
        }
      }
    }
  });
}

#else

// Never reached: isa() is None off x86-64, and comas_rows_linear refuses before calling it.
void run(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, Isa) {}

#endif  // __x86_64__

}  // namespace

extern "C" {

// Whether this CPU has a kernel (AVX-512F, or AVX2 with FMA).
bool comas_rows_linear_available() { return isa() != Isa::None; }

// x [rows, in] f32 times weight [out, in] f32, plus `bias` [out] when it is not null. `isa_code`
// 0 takes the process's choice; 1 (AVX2) and 2 (AVX-512), for tests, force one.
at::Tensor* comas_rows_linear(at::Tensor* x, at::Tensor* weight, at::Tensor* bias, int isa_code, char** error) {
  try {
    TORCH_CHECK(isa_code >= 0 && isa_code <= 2, "unknown instruction set code ", isa_code);
    const Isa chosen = isa_code == 0 ? isa() : static_cast<Isa>(isa_code);
    TORCH_CHECK(chosen != Isa::None && supported(chosen), "this CPU has no kernel for the instruction set asked for (AVX-512F, or AVX2 with FMA)");
    TORCH_CHECK(x->dim() == 2 && weight->dim() == 2, "x and weight must be 2-D, got ", x->sizes(), " and ", weight->sizes());
    TORCH_CHECK(x->scalar_type() == at::kFloat && weight->scalar_type() == at::kFloat, "x and weight must be float32");
    TORCH_CHECK(x->device().is_cpu() && weight->device().is_cpu(), "x and weight must be on the CPU");
    const int64_t in = weight->size(1), out = weight->size(0), rows = x->size(0);
    TORCH_CHECK(x->size(1) == in, "x has ", x->size(1), " features but the weight takes ", in);
    at::Tensor b;
    if (bias != nullptr) {
      TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out && bias->scalar_type() == at::kFloat, "bias must be float32 [", out, "]");
      b = bias->contiguous();
    }
    const at::Tensor xc = x->contiguous(), wc = weight->contiguous();
    at::Tensor y = at::empty({rows, out}, xc.options());
    if (rows > 0 && out > 0) {
      run(xc.data_ptr<float>(), wc.data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(), rows, in, out, chosen);
    }
    return new at::Tensor(std::move(y));
  } catch (const std::exception& e) {
    *error = comas_copy_message(e.what());
    return nullptr;
  }
}

}  // extern "C"
