// Causal attention through a page table, read in place: the engine's paged attention on the CPU
// (`meltemi.models.engine._paged_attention`, backend "native"), float32, through the XLA FFI.
//
//   q[B, T, H, G, D]   queries: B rows of T tokens, H kv heads of G query heads each
//   k[H, P, S, D]      keys of every page (S tokens per page)
//   v[H, P, S, D]      values, in the keys' layout
//   table[B, NP]       each row's pages in order: position p sits in table[b, p / S] at p % S
//   pos[B, T]          each query's position; it sees the keys at positions <= pos
//                      (and > pos - window with a window); pos < 0: output zeros
//
// Why hand-written: the plain-JAX reference gathers every page a row's table lists into a
// dense block first (a copy per layer and step, of the whole table width) and XLA:CPU runs the
// small batched products of attention well below the machine's speed. Here each (row, kv head)
// reads only the pages up to its position, where they are, once for all its queries' dot
// products; see docs/design/models.md for the measured figures.
//
// Portable C++ (`#pragma omp simd` reductions with -fopenmp-simd; no OpenMP runtime).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Attention {
  const float* q;
  const float* k;
  const float* v;
  const int32_t* table;
  const int32_t* pos;
  float* out;
  int64_t B, T, H, G, D, P, S, NP;
  float scale, softcap;
  int64_t window;

  // The page holding key position s of row b (an out-of-range entry reads page 0, the
  // engine's reserved page, rather than memory outside the pool).
  int64_t Page(int64_t b, int64_t s) const {
    const int64_t page = table[b * NP + s / S];
    return page >= 0 && page < P ? page : 0;
  }

  // One query vector: out_row = softmax(scale * q_row . keys) values.
  void Query(int64_t b, int64_t h, const float* q_in, int64_t p, float* out_row,
             std::vector<float>& q_row, std::vector<float>& w, std::vector<float>& acc) const {
    const int64_t n = std::min(p + 1, NP * S);  // key positions [lo, n)
    if (p < 0 || n <= 0) {
      std::memset(out_row, 0, D * sizeof(float));
      return;
    }
    for (int64_t d = 0; d < D; ++d) q_row[d] = q_in[d] * scale;  // as the reference does
    const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
    w.resize(n - lo);
    float* wp = w.data() - lo;  // wp[s] for s in [lo, n)
    float top = -std::numeric_limits<float>::infinity();
    const float* qs = q_row.data();
    for (int64_t s = lo; s < n; ++s) {
      const float* key = k + ((h * P + Page(b, s)) * S + s % S) * D;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += qs[d] * key[d];
      if (softcap > 0.0f) dot = std::tanh(dot / softcap) * softcap;
      wp[s] = dot;
      top = std::max(top, dot);
    }
    float sum = 0.0f;
    for (int64_t s = lo; s < n; ++s) {
      wp[s] = std::exp(wp[s] - top);
      sum += wp[s];
    }
    // Weighted values, elementwise over the head's dimensions.
    acc.assign(D, 0.0f);
    float* a = acc.data();
    for (int64_t s = lo; s < n; ++s) {
      const float* value = v + ((h * P + Page(b, s)) * S + s % S) * D;
      const float ws = wp[s];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) a[d] += ws * value[d];
    }
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < D; ++d) out_row[d] = a[d] * inv;
  }

  // One worker (see parallel.h): (row, kv head) items, each reading its pages once for all
  // of its queries.
  void Run(meltemi::Claims::Worker& claims) const {
    std::vector<float> w, acc, q_row(D);
    for (int64_t item; claims.Next(&item);) {
      const int64_t b = item / H, h = item % H;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t p = pos[b * T + t];
        for (int64_t g = 0; g < G; ++g) {
          const int64_t at = (((b * T + t) * H + h) * G + g) * D;
          Query(b, h, q + at, p, out + at, q_row, w, acc);
        }
      }
    }
  }
};

ffi::Error PagedAttention(ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                          ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> table,
                          ffi::Buffer<ffi::S32> pos, ffi::ResultBuffer<ffi::F32> out,
                          ffi::ThreadPool pool, float scale, float softcap, int64_t window) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  const auto td = table.dimensions(), pd = pos.dimensions();
  if (qd.size() != 5 || kd.size() != 4 || vd.size() != 4 || td.size() != 2 || pd.size() != 2 ||
      kd[0] != qd[2] || kd[3] != qd[4] || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] ||
      vd[3] != kd[3] || td[0] != qd[0] || pd[0] != qd[0] || pd[1] != qd[1]) {
    return ffi::Error::InvalidArgument(
        "meltemi_paged_attention: expects q[B, T, H, G, D], k[H, P, S, D], v[H, P, S, D], "
        "table[B, NP], pos[B, T]");
  }
  auto work = std::make_shared<Attention>();
  work->q = q.typed_data();
  work->k = k.typed_data();
  work->v = v.typed_data();
  work->table = table.typed_data();
  work->pos = pos.typed_data();
  work->out = out->typed_data();
  work->B = qd[0];
  work->T = qd[1];
  work->H = qd[2];
  work->G = qd[3];
  work->D = qd[4];
  work->P = kd[1];
  work->S = kd[2];
  work->NP = td[1];
  work->scale = scale;
  work->softcap = softcap;
  work->window = window;
  meltemi::ParallelFor(pool, work->B * work->H,
                       [work](meltemi::Claims::Worker& claims) { work->Run(claims); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MeltemiPagedAttention, PagedAttention,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ctx<ffi::ThreadPool>()
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap")
                                  .Attr<int64_t>("window"));
