// Attention of one new token per row over its row of the KV cache, f32, for decode steps on CPU:
// out[b, h] = softmax(scale * q[b, h] . k[b, kv(h), j] for j < visible[b]) . v[b, kv(h), j].
//
// SDPA on such a step runs a small matrix product per (row, query head) and reads every column
// the cache holds, visible or not, through a mask. Here the query heads that share a key/value
// head are done together, so each key and value is read once per group, and a row reads only
// the columns it may see, with no mask.
//
// A row's result depends only on its own query, keys and values and on how many columns it sees:
// not on the rows beside it, on the cache's capacity, or on the threads. Every sum runs in a
// fixed order (a dot product over the head width, then the softmax's sum over the visible
// columns in blocks of 16, then the values in column order).
//
// AVX-512F only; elsewhere the shim reports it unavailable and callers keep SDPA.
#include <ATen/ATen.h>
#include "shim_error.h"
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kLanes = 16;
// Multiply-adds below which a call stays on one thread (waking the pool costs more).
constexpr int64_t kSerialWork = 1 << 16;

bool has_avx512() {
#if defined(__x86_64__)
  static const bool yes = [] {
    __builtin_cpu_init();
    return static_cast<bool>(__builtin_cpu_supports("avx512f"));
  }();
  return yes;
#else
  return false;
#endif
}

#if defined(__x86_64__)
// exp(x) for x <= 0, within about 2 ulp: x = n ln 2 + r with |r| <= ln 2 / 2, a degree-7 Taylor
// polynomial in r (remainder below 2^-27 relative), scaled by 2^n. Below -104 the result is 0.
__attribute__((target("avx512f"))) __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Sixteen keys' or values' elements as f32: loaded, or widened from bf16 (exactly).
__attribute__((target("avx512f"))) inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f"))) inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// T: the cache's element, float or bf16 (as uint16_t); queries and outputs are f32.
template <typename T>
struct Group {
  const float* q;       // the group's first query head
  int64_t q_stride;     // between query heads
  const T* k;           // the row's keys for this kv head, column 0
  const T* v;
  int64_t col_stride;   // between columns of k and v
  float* out;           // the group's first output head
  int64_t out_stride;   // between output heads
};

// Sixteen dot products at once: lane t of the result is the sum of the lanes of acc[t]. The
// pairs are added in a fixed pattern (halves, then quarters, then pairs, then lanes), so each
// score's sum has one order whatever the column.
__attribute__((target("avx512f"))) inline __m512 sum_lanes_16(const __m512* acc) {
  __m512 r8[8], r4[4], r2[2];
  for (int i = 0; i < 8; ++i)
    r8[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                          _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)
    r4[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r8[2 * i], r8[2 * i + 1], 0x88),
                          _mm512_shuffle_f32x4(r8[2 * i], r8[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)
    r2[i] = _mm512_add_ps(_mm512_shuffle_ps(r4[2 * i], r4[2 * i + 1], 0x44),
                          _mm512_shuffle_ps(r4[2 * i], r4[2 * i + 1], 0xEE));
  const __m512 r1 = _mm512_add_ps(_mm512_shuffle_ps(r2[0], r2[1], 0x88),
                                  _mm512_shuffle_ps(r2[0], r2[1], 0xDD));
  // r1 holds column 4p + L at lane 4L + p: put column m at lane m.
  const __m512i order =
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, r1);
}

// One row and key/value head: `g` query heads of width C * 16 over `n` columns. `scratch` has
// room for g * (n + 1) floats.
template <int C, typename T>
__attribute__((target("avx512f"))) void attend_group(const Group<T>& a, int g, int64_t n, float scale, float* scratch) {
  float* scores = scratch;
  float* sums = scratch + g * n;
  // Scores, 16 columns at a time: the block's keys stay in L1 while every head of the group
  // reads them.
  for (int64_t j0 = 0; j0 < n; j0 += kLanes) {
    const int64_t m = std::min<int64_t>(kLanes, n - j0);
    const __mmask16 live = static_cast<__mmask16>((1u << m) - 1);
    for (int h = 0; h < g; ++h) {
      const float* qh = a.q + h * a.q_stride;
      __m512 q[C];
      for (int c = 0; c < C; ++c) q[c] = _mm512_loadu_ps(qh + c * kLanes);
      __m512 acc[kLanes];
      for (int t = 0; t < kLanes; ++t) {
        acc[t] = _mm512_setzero_ps();
        if (t >= m) continue;
        const T* kj = a.k + (j0 + t) * a.col_stride;
        for (int c = 0; c < C; ++c) acc[t] = _mm512_fmadd_ps(q[c], load16(kj + c * kLanes), acc[t]);
      }
      const __m512 s = _mm512_mul_ps(sum_lanes_16(acc), _mm512_set1_ps(scale));
      _mm512_mask_storeu_ps(scores + h * n + j0, live, s);
    }
  }
  // Softmax weights, unnormalised, and their sums.
  for (int h = 0; h < g; ++h) {
    float* s = scores + h * n;
    __m512 top = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes) top = _mm512_max_ps(top, _mm512_loadu_ps(s + j));
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - j)) - 1);
    if (j < n) top = _mm512_mask_max_ps(top, tail, top, _mm512_maskz_loadu_ps(tail, s + j));
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    __m512 sum = _mm512_setzero_ps();
    for (j = 0; j + kLanes <= n; j += kLanes) {
      const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + j), mx));
      _mm512_storeu_ps(s + j, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (j < n) {
      const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + j), mx));
      _mm512_mask_storeu_ps(s + j, tail, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, e));
    }
    sums[h] = _mm512_reduce_add_ps(sum);
  }
  // Weighted values in one pass over the columns for up to `heads` query heads, whose C * heads
  // accumulators stay in registers.
  constexpr int heads = 24 / C;
  for (int h0 = 0; h0 < g; h0 += heads) {
    const int hn = std::min(heads, g - h0);
    __m512 acc[heads][C];
    for (int h = 0; h < heads; ++h)
      for (int c = 0; c < C; ++c) acc[h][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; ++j) {
      const T* vj = a.v + j * a.col_stride;
      __m512 vc[C];
      for (int c = 0; c < C; ++c) vc[c] = load16(vj + c * kLanes);
      for (int h = 0; h < heads; ++h) {
        if (h >= hn) break;
        const __m512 w = _mm512_set1_ps(scores[(h0 + h) * n + j]);
        for (int c = 0; c < C; ++c) acc[h][c] = _mm512_fmadd_ps(w, vc[c], acc[h][c]);
      }
    }
    for (int h = 0; h < hn; ++h) {
      const __m512 sum = _mm512_set1_ps(sums[h0 + h]);
      for (int c = 0; c < C; ++c)
        _mm512_storeu_ps(a.out + (h0 + h) * a.out_stride + c * kLanes, _mm512_div_ps(acc[h][c], sum));
    }
  }
}

template <typename T>
using GroupFn = void (*)(const Group<T>&, int, int64_t, float, float*);

// The routine for a head width of `d` elements, or null where none is compiled.
template <typename T>
GroupFn<T> group_fn(int64_t d) {
  switch (d) {
    case 16: return attend_group<1, T>;
    case 32: return attend_group<2, T>;
    case 48: return attend_group<3, T>;
    case 64: return attend_group<4, T>;
    case 80: return attend_group<5, T>;
    case 96: return attend_group<6, T>;
    case 128: return attend_group<8, T>;
    case 256: return attend_group<16, T>;
    default: return nullptr;
  }
}

// Every row and key/value head of a step. `q` is f32 [B, H, 1, D]; `k`, `v` hold T.
template <typename T>
void attend_all(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const int64_t* vis, int64_t widest, float sc, at::Tensor& y) {
  const int64_t b = q.size(0), h = q.size(1), d = q.size(3), kv = k.size(1);
  const int g = static_cast<int>(h / kv);
  const GroupFn<T> attend_group = group_fn<T>(d);
  const float* qp = q.data_ptr<float>();
  const T* kp = static_cast<const T*>(k.data_ptr());
  const T* vp = static_cast<const T*>(v.data_ptr());
  float* yp = y.data_ptr<float>();
  const int64_t items = b * kv;
  const int64_t per_item = std::max<int64_t>(1, widest * d * h / kv * 2);
  const int64_t grain = std::max<int64_t>(1, kSerialWork / per_item);
  at::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(static_cast<size_t>(g * (widest + 1)));
    for (int64_t it = begin; it < end; ++it) {
      const int64_t r = it / kv, e = it % kv;
      Group<T> a{qp + r * q.stride(0) + e * g * q.stride(1), q.stride(1),
                 kp + r * k.stride(0) + e * k.stride(1), vp + r * v.stride(0) + e * v.stride(1), k.stride(2),
                 yp + (r * h + e * g) * d, d};
      attend_group(a, g, vis[r], sc, scratch.data());
    }
  });
}
#endif  // __x86_64__

}  // namespace

extern "C" {
// Whether this CPU has the kernel (AVX-512F).
bool comas_decode_attention_available() { return has_avx512(); }

// Whether the kernel is compiled for heads of `d` floats.
bool comas_decode_attention_head_width(int64_t d) {
#if defined(__x86_64__)
  return group_fn<float>(d) != nullptr;
#else
  return false;
#endif
}

// q [B, H, 1, D], k and v [B, KV, C, D] (all f32 or all bf16, CPU, last dimension contiguous),
// `visible` [B] int64 (each row's columns 1..=C that its query sees). Returns [B, H, 1, D] in q's
// dtype (a view of a [B, 1, H, D] tensor, as the layer reshapes it next). bf16 is computed in f32
// from the exact widened values, and the result rounded once to bf16.
at::Tensor* comas_decode_attention(at::Tensor* q, at::Tensor* k, at::Tensor* v, at::Tensor* visible, double scale, char** error) {
  try {
    TORCH_CHECK(has_avx512(), "the decode attention kernel needs AVX-512F");
    TORCH_CHECK(q->dim() == 4 && k->dim() == 4 && v->dim() == 4, "q, k and v must be 4-D, got ", q->sizes(), ", ", k->sizes(), " and ", v->sizes());
    const bool bf16 = q->scalar_type() == at::kBFloat16;
    for (const at::Tensor* t : {q, k, v}) {
      TORCH_CHECK(t->scalar_type() == (bf16 ? at::kBFloat16 : at::kFloat) && t->device().is_cpu(), "q, k and v must be all float32 or all bfloat16, on the CPU");
      TORCH_CHECK(t->size(3) == 0 || t->stride(3) == 1, "the head dimension must be contiguous");
    }
    TORCH_CHECK(k->sizes() == v->sizes(), "k ", k->sizes(), " and v ", v->sizes(), " differ");
    const int64_t b = q->size(0), h = q->size(1), d = q->size(3), kv = k->size(1), cols = k->size(2);
    TORCH_CHECK(q->size(2) == 1, "one query per row, got ", q->size(2));
    TORCH_CHECK(k->size(0) == b && k->size(3) == d, "k ", k->sizes(), " does not fit q ", q->sizes());
    TORCH_CHECK(kv > 0 && h % kv == 0, h, " query heads cannot share ", kv, " key/value heads");
    TORCH_CHECK(comas_decode_attention_head_width(d), "no decode attention kernel for heads of ", d, " floats (16, 32, 48, 64, 80, 96, 128 or 256)");
    TORCH_CHECK(visible->dim() == 1 && visible->size(0) == b && visible->scalar_type() == at::kLong, "visible must be int64 [", b, "]");
    const at::Tensor seen = visible->contiguous();
    const int64_t* vis = seen.data_ptr<int64_t>();
    int64_t widest = 0;
    for (int64_t r = 0; r < b; ++r) {
      TORCH_CHECK(vis[r] >= 1 && vis[r] <= cols, "row ", r, " sees ", vis[r], " columns; the cache holds ", cols);
      widest = std::max(widest, vis[r]);
    }
    TORCH_CHECK(v->strides() == k->strides(), "k and v must share their strides, got ", k->strides(), " and ", v->strides());
    at::Tensor y = at::empty({b, 1, h, d}, q->options().dtype(at::kFloat));
#if defined(__x86_64__)
    const float sc = static_cast<float>(scale);
    if (bf16) {
      attend_all<uint16_t>(q->to(at::kFloat), *k, *v, vis, widest, sc, y);
      y = y.to(at::kBFloat16);
    } else {
      attend_all<float>(*q, *k, *v, vis, widest, sc, y);
    }
#endif
    return new at::Tensor(y.transpose(1, 2));
  } catch (const std::exception& e) {
    *error = comas_copy_message(e.what());
    return nullptr;
  }
}
}  // extern "C"
