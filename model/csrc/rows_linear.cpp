// An f32 linear for the few rows of a decode step: y[r, j] = x[r, :] · w[j, :] (+ b[j]), on a
// copy of the weight reordered once into blocks of outputs (comas_rows_pack).
//
// MKL's sgemv/sgemm on a handful of rows reaches about half of a plain read's bandwidth and
// sums in an order that depends on the row count. Here each output is summed in one fixed order
// that depends only on the input width: not on how many rows the call has, how they are tiled
// or how the outputs are split between threads. So a row decodes to the same bits alone or beside
// 63 others.
//
// Two instruction sets: AVX-512F and AVX2+FMA, which do the same per-lane operations. Off x86-64
// (Grace, Graviton) the kernels are not compiled: the shim reports no instruction set and callers
// use aten.
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

// Outputs per packed block (two AVX-512 vectors, four AVX2 ones).
constexpr int kBlock = 32;

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

// Whether the bf16 kernel runs here (AVX512-BF16 with AVX-512 BW and VL).
bool bf16_runs() {
#if defined(__x86_64__)
  static const bool runs = isa() == Isa::Avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return runs;
#else
  return false;
#endif
}

bool supported(Isa wanted) { return wanted == Isa::Avx2 ? isa() != Isa::None : wanted == isa(); }

#if defined(__x86_64__)
// The packed form: the weight reordered once into blocks of kBlock outputs, [blocks, in,
// kBlock] (the last block zero-padded), so that one input row's value multiplies a whole vector
// of outputs. Each output is summed in one fixed order, k = 0, 1, ..., in - 1, with one
// fused multiply-add per step and the bias added last: its bits depend on neither the rows
// beside it, the tiling, the threads nor the instruction set (AVX2 and AVX-512 do the same
// per-lane operations). No horizontal sums, and a weight block is read from memory once per call
// and then from cache for each group of rows.

// R rows times one block: `acc` holds R x kBlock outputs in registers; AVX-512 has 32 vector
// registers: 12 rows x 2 accumulators, 2 weight vectors and the broadcast fit.
template <int R>
__attribute__((target("avx512f"))) void block_avx512(const float* x, int64_t ldx, const float* pw, int64_t k, const float* bias, float* y, int64_t ldy, int valid) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const __m512 w0 = _mm512_loadu_ps(pw + i * kBlock), w1 = _mm512_loadu_ps(pw + i * kBlock + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + i]);
      acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
    }
  }
  const __mmask16 m0 = valid >= 16 ? 0xffff : static_cast<__mmask16>((1u << valid) - 1);
  const __mmask16 m1 = valid >= 32 ? 0xffff : valid <= 16 ? 0 : static_cast<__mmask16>((1u << (valid - 16)) - 1);
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (bias != nullptr) {
    b0 = _mm512_maskz_loadu_ps(m0, bias);
    b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
  }
  for (int r = 0; r < R; ++r) {
    float* yr = y + r * ldy;
    _mm512_mask_storeu_ps(yr, m0, bias != nullptr ? _mm512_add_ps(acc[r][0], b0) : acc[r][0]);
    _mm512_mask_storeu_ps(yr + 16, m1, bias != nullptr ? _mm512_add_ps(acc[r][1], b1) : acc[r][1]);
  }
}

// AVX2 has 16 vector registers: 3 rows x 4 accumulators, with the weight read from memory by
// each multiply-add.
template <int R>
__attribute__((target("avx2,fma"))) void block_avx2(const float* x, int64_t ldx, const float* pw, int64_t k, const float* bias, float* y, int64_t ldy, int valid) {
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) acc[r][v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const float* wi = pw + i * kBlock;
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_set1_ps(x[r * ldx + i]);
      for (int v = 0; v < 4; ++v) acc[r][v] = _mm256_fmadd_ps(xv, _mm256_loadu_ps(wi + 8 * v), acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    alignas(32) float out[kBlock];
    for (int v = 0; v < 4; ++v) _mm256_store_ps(out + 8 * v, acc[r][v]);
    float* yr = y + r * ldy;
    for (int j = 0; j < valid; ++j) yr[j] = bias != nullptr ? out[j] + bias[j] : out[j];
  }
}

// The rows cut into as few tiles as the kernel's widest allows, of sizes that differ by at most
// one (64 rows: 11, 11, 11, 11, 10, 10 rather than five of 12 and one of 4, whose few
// accumulators leave the multiply-add units waiting). A row's result does not depend on its tile.
struct RowTiles {
  int64_t count, base, extra;
  RowTiles(int64_t rows, int widest) : count((rows + widest - 1) / widest), base(count > 0 ? rows / count : 0), extra(count > 0 ? rows % count : 0) {}
  int rows(int64_t t) const { return static_cast<int>(base + (t < extra ? 1 : 0)); }
};

using Block = void (*)(const float*, int64_t, const float*, int64_t, const float*, float*, int64_t, int);

constexpr int kBlockRows512 = 12;
constexpr int kBlockRows256 = 3;
const Block kBlocks512[kBlockRows512] = {block_avx512<1>, block_avx512<2>, block_avx512<3>, block_avx512<4>, block_avx512<5>, block_avx512<6>,
                                         block_avx512<7>, block_avx512<8>, block_avx512<9>, block_avx512<10>, block_avx512<11>, block_avx512<12>};
const Block kBlocks256[kBlockRows256] = {block_avx2<1>, block_avx2<2>, block_avx2<3>};

void run_packed(const float* x, const float* pw, const float* b, float* y, int64_t rows, int64_t in, int64_t out, Isa chosen) {
  const Block* kernels = chosen == Isa::Avx512 ? kBlocks512 : kBlocks256;
  const int max_rows = chosen == Isa::Avx512 ? kBlockRows512 : kBlockRows256;
  const int64_t blocks = (out + kBlock - 1) / kBlock;
  const RowTiles tiles(rows, max_rows);
  const int64_t block_bytes = kBlock * in * static_cast<int64_t>(sizeof(float));
  const int64_t grain = std::max<int64_t>(1, kSerialBytes / std::max<int64_t>(1, block_bytes));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t j0 = blk * kBlock;
      const int valid = static_cast<int>(std::min<int64_t>(kBlock, out - j0));
      const float* pw_blk = pw + blk * in * kBlock;
      for (int64_t t = 0, r0 = 0; t < tiles.count; r0 += tiles.rows(t), ++t) {
        const int n = tiles.rows(t);
        kernels[n - 1](x + r0 * in, in, pw_blk, in, b == nullptr ? nullptr : b + j0, y + r0 * out + j0, out, valid);
      }
    }
  });
}

// bf16 on CPUs with AVX512-BF16 (Zen 4 and later, Cooper Lake, Sapphire Rapids): the weight
// packed as [blocks, in / 2, kBlock, 2], pairs of inputs side by side, so that one `vdpbf16ps`
// adds two products of a broadcast input pair to each of 16 f32 accumulators. Each output sums
// its pairs in the order p = 0, 1, .. in / 2 - 1 (an odd last input is paired with a zero), adds
// the bias in f32 and is rounded once to bf16: as the f32 kernel, independent of the rows, tiling
// and threads.
__attribute__((target("avx512f,avx512bw"))) __m512 bf16_to_f32(__m256i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16)); }

// One input pair per row (`pair[r]`, two bf16 in 32 bits) times the block's weights of that pair.
template <int R>
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline void pair_step(__m512 (&acc)[R][2], const uint16_t* wp, const int32_t* pair) {
  const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp), w1 = (__m512bh)_mm512_loadu_si512(wp + 16 * 2);
  for (int r = 0; r < R; ++r) {
    const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair[r]);
    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);
    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);
  }
}

template <int R>
__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) void block_bf16(const uint16_t* x, int64_t ldx, const uint16_t* pw, int64_t in, const uint16_t* bias, uint16_t* y, int64_t ldy, int valid) {
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const int64_t pairs = in / 2;
  int32_t pair[R];
  for (int64_t p = 0; p < pairs; ++p) {
    for (int r = 0; r < R; ++r) std::memcpy(&pair[r], x + r * ldx + 2 * p, sizeof(int32_t));
    pair_step<R>(acc, pw + p * 2 * kBlock, pair);
  }
  if (in % 2 != 0) {
    // The low half is the first of the pair (little-endian), as in the weight's layout.
    for (int r = 0; r < R; ++r) pair[r] = static_cast<int32_t>(x[r * ldx + in - 1]);
    pair_step<R>(acc, pw + pairs * 2 * kBlock, pair);
  }
  const __mmask16 m0 = valid >= 16 ? 0xffff : static_cast<__mmask16>((1u << valid) - 1);
  const __mmask16 m1 = valid >= 32 ? 0xffff : valid <= 16 ? 0 : static_cast<__mmask16>((1u << (valid - 16)) - 1);
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (bias != nullptr) {
    b0 = bf16_to_f32(_mm256_maskz_loadu_epi16(m0, bias));
    b1 = bf16_to_f32(_mm256_maskz_loadu_epi16(m1, bias + 16));
  }
  for (int r = 0; r < R; ++r) {
    uint16_t* yr = y + r * ldy;
    const __m512 v0 = bias != nullptr ? _mm512_add_ps(acc[r][0], b0) : acc[r][0];
    const __m512 v1 = bias != nullptr ? _mm512_add_ps(acc[r][1], b1) : acc[r][1];
    _mm256_mask_storeu_epi16(yr, m0, (__m256i)_mm512_cvtneps_pbh(v0));
    _mm256_mask_storeu_epi16(yr + 16, m1, (__m256i)_mm512_cvtneps_pbh(v1));
  }
}

using BlockBf16 = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, const uint16_t*, uint16_t*, int64_t, int);
const BlockBf16 kBlocksBf16[kBlockRows512] = {block_bf16<1>, block_bf16<2>, block_bf16<3>, block_bf16<4>,  block_bf16<5>,  block_bf16<6>,
                                              block_bf16<7>, block_bf16<8>, block_bf16<9>, block_bf16<10>, block_bf16<11>, block_bf16<12>};

void run_packed_bf16(const uint16_t* x, const uint16_t* pw, const uint16_t* b, uint16_t* y, int64_t rows, int64_t in, int64_t out) {
  const int64_t blocks = (out + kBlock - 1) / kBlock;
  const int64_t pairs = (in + 1) / 2;
  const RowTiles tiles(rows, kBlockRows512);
  const int64_t block_elems = pairs * 2 * kBlock;
  const int64_t grain = std::max<int64_t>(1, kSerialBytes / std::max<int64_t>(1, block_elems * 2));
  at::parallel_for(0, blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t j0 = blk * kBlock;
      const int valid = static_cast<int>(std::min<int64_t>(kBlock, out - j0));
      for (int64_t t = 0, r0 = 0; t < tiles.count; r0 += tiles.rows(t), ++t) {
        const int n = tiles.rows(t);
        kBlocksBf16[n - 1](x + r0 * in, in, pw + blk * block_elems, in, b == nullptr ? nullptr : b + j0, y + r0 * out + j0, out, valid);
      }
    }
  });
}

#else

// Never reached: isa() is None off x86-64, and comas_rows_packed_linear refuses before calling it.
void run_packed(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t, Isa) {}
void run_packed_bf16(const uint16_t*, const uint16_t*, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t) {}

#endif  // __x86_64__

}  // namespace

extern "C" {

// Whether this CPU has a kernel (AVX-512F, or AVX2 with FMA).
bool comas_rows_linear_available() { return isa() != Isa::None; }

// Whether this CPU has the bf16 kernel (AVX512-BF16).
bool comas_rows_linear_bf16_available() { return bf16_runs(); }

// `weight` [out, in] reordered for comas_rows_packed_linear: f32 into [blocks, in, 32]; bf16 (where
// the bf16 kernel runs) into [blocks, (in + 1) / 2, 32, 2].
at::Tensor* comas_rows_pack(at::Tensor* weight, char** error) {
  try {
    const bool bf16 = weight->scalar_type() == at::kBFloat16;
    TORCH_CHECK(weight->dim() == 2 && (weight->scalar_type() == at::kFloat || bf16) && weight->device().is_cpu(), "the weight must be a 2-D float32 or bfloat16 CPU tensor, got ", weight->sizes(), " ", weight->scalar_type());
    TORCH_CHECK(!bf16 || bf16_runs(), "this CPU has no bf16 kernel (AVX512-BF16)");
    const int64_t out = weight->size(0), in = weight->size(1);
    const int64_t blocks = (out + kBlock - 1) / kBlock;
    if (!bf16) {
      at::Tensor padded = at::constant_pad_nd(weight->detach(), {0, 0, 0, blocks * kBlock - out});
      return new at::Tensor(padded.view({blocks, kBlock, in}).transpose(1, 2).contiguous());
    }
    const int64_t pairs = (in + 1) / 2;
    at::Tensor padded = at::constant_pad_nd(weight->detach(), {0, pairs * 2 - in, 0, blocks * kBlock - out});
    return new at::Tensor(padded.view({blocks, kBlock, pairs, 2}).permute({0, 2, 1, 3}).contiguous());
  } catch (const std::exception& e) {
    *error = comas_copy_message(e.what());
    return nullptr;
  }
}

// x [rows, in] times a weight of the same dtype packed by comas_rows_pack with `out` outputs,
// plus `bias`. `isa_code` (f32 only) 0 takes the process's choice; 1 (AVX2) and 2 (AVX-512), for
// tests, force one.
at::Tensor* comas_rows_packed_linear(at::Tensor* x, at::Tensor* packed, at::Tensor* bias, int64_t out, int isa_code, char** error) {
  try {
    TORCH_CHECK(isa_code >= 0 && isa_code <= 2, "unknown instruction set code ", isa_code);
    const Isa chosen = isa_code == 0 ? isa() : static_cast<Isa>(isa_code);
    TORCH_CHECK(chosen != Isa::None && supported(chosen), "this CPU has no kernel for the instruction set asked for (AVX-512F, or AVX2 with FMA)");
    const bool bf16 = x->scalar_type() == at::kBFloat16;
    TORCH_CHECK(x->dim() == 2 && (x->scalar_type() == at::kFloat || bf16) && x->device().is_cpu(), "x must be a 2-D float32 or bfloat16 CPU tensor, got ", x->sizes(), " ", x->scalar_type());
    TORCH_CHECK(packed->dim() == (bf16 ? 4 : 3) && packed->size(2) == kBlock && packed->scalar_type() == x->scalar_type() && packed->is_contiguous(), "the packed weight must come from comas_rows_pack, in x's dtype");
    TORCH_CHECK(!bf16 || bf16_runs(), "this CPU has no bf16 kernel (AVX512-BF16)");
    const int64_t rows = x->size(0), in = x->size(1);
    TORCH_CHECK(bf16 ? packed->size(1) == (in + 1) / 2 : packed->size(1) == in, "x has ", in, " features but the packed weight takes ", bf16 ? packed->size(1) * 2 : packed->size(1));
    TORCH_CHECK(out > (packed->size(0) - 1) * kBlock && out <= packed->size(0) * kBlock, "the packed weight does not have ", out, " outputs");
    at::Tensor b;
    if (bias != nullptr) {
      TORCH_CHECK(bias->dim() == 1 && bias->size(0) == out && bias->scalar_type() == x->scalar_type(), "bias must be ", x->scalar_type(), " [", out, "]");
      b = bias->contiguous();
    }
    const at::Tensor xc = x->contiguous();
    at::Tensor y = at::empty({rows, out}, xc.options());
    if (rows > 0 && out > 0) {
      if (bf16) {
        auto u16 = [](const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
        run_packed_bf16(u16(xc), u16(*packed), b.defined() ? u16(b) : nullptr, u16(y), rows, in, out);
      } else {
        run_packed(xc.data_ptr<float>(), packed->data_ptr<float>(), b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(), rows, in, out, chosen);
      }
    }
    return new at::Tensor(std::move(y));
  } catch (const std::exception& e) {
    *error = comas_copy_message(e.what());
    return nullptr;
  }
}

}  // extern "C"
