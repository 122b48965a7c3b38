// out[M, N] = x[M, K] @ w[N, K]^T in float32 for a few rows M (decoding steps), with w stored
// in panels of 16 output columns, `packed[N / 16, K, 16]`, so each panel is one contiguous
// stream. Built by `meltemi.models._native` on first use and called through the XLA FFI.
//
// Why hand-written: XLA:CPU's dot reads a decoding step's weights at 0.66 (1 row) and 0.42
// (8 rows) of the read bandwidth of a `jnp.sum` measured beside it (162M Llama, 2 cores);
// this kernel at about 1.0 and 0.93 (docs/design/models.md). Each weight panel is read once from
// memory and kept in cache while every block of up to 8 rows is multiplied by it; three panels
// at a time, so each broadcast input value feeds three fused multiply-adds.
//
// Portable C++ (GCC/Clang vector extensions): the compiler maps a 16-float vector to one
// AVX-512 register, two AVX2 registers or four NEON registers.

#include <cstdint>
#include <cstring>
#include <memory>

#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v16 __attribute__((vector_size(64), aligned(4)));
constexpr int64_t kLanes = 16;  // output columns per panel
constexpr int kRows = 8;        // input rows per block

// NP panels (16 * NP columns) x MB rows; `w` points at the first panel, `out` at column 0.
template <int NP, int MB>
inline void Block(const float* x, int64_t K, const float* w, float* out, int64_t N) {
  v16 acc[NP][MB];
  for (int p = 0; p < NP; ++p)
    for (int m = 0; m < MB; ++m) acc[p][m] = v16{};
  for (int64_t k = 0; k < K; ++k) {
    v16 wv[NP];
    for (int p = 0; p < NP; ++p) std::memcpy(&wv[p], w + (p * K + k) * kLanes, sizeof(v16));
    for (int m = 0; m < MB; ++m) {
      const float s = x[m * K + k];
      for (int p = 0; p < NP; ++p) acc[p][m] += s * wv[p];
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int m = 0; m < MB; ++m) std::memcpy(out + m * N + p * kLanes, &acc[p][m], sizeof(v16));
}

template <int NP>
void Rows(const float* x, int64_t M, int64_t K, const float* w, float* out, int64_t N) {
  for (int64_t m0 = 0; m0 < M; m0 += kRows) {
    const float* xm = x + m0 * K;
    float* om = out + m0 * N;
    switch (M - m0 >= kRows ? kRows : M - m0) {
      case 8: Block<NP, 8>(xm, K, w, om, N); break;
      case 7: Block<NP, 7>(xm, K, w, om, N); break;
      case 6: Block<NP, 6>(xm, K, w, om, N); break;
      case 5: Block<NP, 5>(xm, K, w, om, N); break;
      case 4: Block<NP, 4>(xm, K, w, om, N); break;
      case 3: Block<NP, 3>(xm, K, w, om, N); break;
      case 2: Block<NP, 2>(xm, K, w, om, N); break;
      default: Block<NP, 1>(xm, K, w, om, N); break;
    }
  }
}

// Panels per block: 3 x 8 rows is 24 accumulators, which fit AVX-512's 32 registers (measured
// at 8 rows: 1, 2, 3, 4 panels read 0.72, 0.87, 0.93, 0.96 of the `jnp.sum` bandwidth; 4 spills).
#ifndef MELTEMI_PANELS
#define MELTEMI_PANELS 3
#endif
constexpr int64_t kStep = MELTEMI_PANELS;

// Panels [p0, p1): kStep at a time, then one at a time.
void Panels(const float* x, int64_t M, int64_t K, const float* w, float* out, int64_t N,
            int64_t p0, int64_t p1) {
  int64_t p = p0;
  for (; p + kStep <= p1; p += kStep) Rows<kStep>(x, M, K, w + p * K * kLanes, out + p * kLanes, N);
  for (; p < p1; ++p) Rows<1>(x, M, K, w + p * K * kLanes, out + p * kLanes, N);
}

// Chunks of panels, the items of `meltemi::ParallelFor` (parallel.h).
struct Work {
  const float* x;
  const float* w;
  float* out;
  int64_t M, K, N, P, chunk;

  void Run(meltemi::Claims::Worker& claims) const {
    for (int64_t c; claims.Next(&c);) {
      const int64_t p0 = c * chunk;
      const int64_t p1 = p0 + chunk < P ? p0 + chunk : P;
      Panels(x, M, K, w, out, N, p0, p1);
    }
  }
};

ffi::Error SmallMatmul(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> packed,
                       ffi::ResultBuffer<ffi::F32> out, ffi::ThreadPool pool) {
  const auto xd = x.dimensions();
  const auto wd = packed.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || wd[2] != kLanes || wd[1] != xd[1]) {
    return ffi::Error::InvalidArgument(
        "meltemi_small_matmul: expects x[M, K] and packed[P, K, 16]");
  }
  auto work = std::make_shared<Work>();
  work->x = x.typed_data();
  work->w = packed.typed_data();
  work->out = out->typed_data();
  work->M = xd[0];
  work->K = xd[1];
  work->P = wd[0];
  work->N = wd[0] * kLanes;
  int64_t threads = pool.num_threads();
  if (threads < 1) threads = 1;
  // About 4 chunks per thread (balance), in whole steps of kStep panels.
  int64_t chunk = work->P / (4 * threads);
  chunk = chunk < kStep ? kStep : chunk - chunk % kStep;
  work->chunk = chunk;
  meltemi::ParallelFor(pool, (work->P + chunk - 1) / chunk,
                       [work](meltemi::Claims::Worker& claims) { work->Run(claims); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MeltemiSmallMatmul, SmallMatmul,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ctx<ffi::ThreadPool>());
