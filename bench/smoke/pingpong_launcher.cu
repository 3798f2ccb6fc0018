// The generated .cu's own launcher for examples/b2b_gemm_rf_pingpong_sm90a.kg, built with nvcc
// and run on the GPU: it encodes D1's tensor map through the driver entry point and launches the
// kernel with it. Random inputs, D1 poisoned with NaN, then rows checked against a float
// reference that rounds g0 to f16 as the kernel does. Usage: pingpong_launcher M [M ...]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "b2b_gemm_rf_pingpong_sm90a.h"

namespace {

constexpr int K0 = 576, N0 = 64, N1 = 128;

unsigned long long state = 0x2545f4914f6cdd1dull;
float uniform() {  // in [-1, 1)
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<float>((state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

#define CHECK(call)                                                              \
  do {                                                                           \
    const cudaError_t err_ = (call);                                             \
    if (err_ != cudaSuccess) {                                                   \
      std::printf("%s failed: %s\n", #call, cudaGetErrorString(err_));           \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

bool run(int M) {
  std::vector<__half> a(static_cast<size_t>(M) * K0), b0(K0 * N0), b1(N0 * N1);
  std::vector<float> scale(N0), bias(N0);
  for (auto& x : a) x = __float2half(uniform());
  for (auto& x : b0) x = __float2half(uniform() / 24.0f);  // col-major: (k, n) at n * K0 + k
  for (auto& x : b1) x = __float2half(uniform() / 8.0f);   // col-major: (k, n) at n * N0 + k
  for (int n = 0; n < N0; ++n) scale[n] = 1.0f + 0.5f * uniform(), bias[n] = 0.1f * uniform();

  __half *da = nullptr, *db0 = nullptr, *db1 = nullptr, *dd = nullptr;
  float *ds = nullptr, *dbias = nullptr;
  const size_t rows = M > 0 ? M : 1;
  CHECK(cudaMalloc(&da, rows * K0 * sizeof(__half)));
  CHECK(cudaMalloc(&db0, b0.size() * sizeof(__half)));
  CHECK(cudaMalloc(&db1, b1.size() * sizeof(__half)));
  CHECK(cudaMalloc(&dd, rows * N1 * sizeof(__half)));
  CHECK(cudaMalloc(&ds, N0 * sizeof(float)));
  CHECK(cudaMalloc(&dbias, N0 * sizeof(float)));
  if (M > 0) CHECK(cudaMemcpy(da, a.data(), a.size() * sizeof(__half), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db0, b0.data(), b0.size() * sizeof(__half), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(db1, b1.data(), b1.size() * sizeof(__half), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(ds, scale.data(), N0 * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dbias, bias.data(), N0 * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(dd, 0xff, rows * N1 * sizeof(__half)));  // NaN everywhere

  b2b_gemm_rf_pingpong_sm90a_params p{};
  p.A = da, p.B0 = db0, p.B1 = db1, p.D1 = dd, p.scale0 = ds, p.bias0 = dbias, p.M = M;
  p.ld_A = K0, p.ld_B0 = K0, p.ld_B1 = N0, p.ld_D1 = N1;
  CHECK(b2b_gemm_rf_pingpong_sm90a_launch(p, 0));
  CHECK(cudaDeviceSynchronize());

  std::vector<__half> d(static_cast<size_t>(M) * N1);
  if (M > 0) CHECK(cudaMemcpy(d.data(), dd, d.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  size_t nan = 0;
  for (const auto& x : d) nan += std::isnan(__half2float(x)) ? 1 : 0;
  double err = 0.0, ref_norm = 0.0;
  int checked = 0;
  for (int i = 0; i < 256 && M > 0; ++i) {
    const int r = i == 0 ? M - 1 : static_cast<int>((static_cast<long long>(i) * 7919) % M);
    float g0[N0];
    for (int n = 0; n < N0; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < K0; ++k)
        acc += __half2float(a[static_cast<size_t>(r) * K0 + k]) * __half2float(b0[n * K0 + k]);
      g0[n] = __half2float(__float2half(std::fmax(acc * scale[n] + bias[n], 0.0f)));
    }
    for (int n = 0; n < N1; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < N0; ++k) acc += g0[k] * __half2float(b1[n * N0 + k]);
      const double want = std::fmax(acc, 0.0f);
      const double got = __half2float(d[static_cast<size_t>(r) * N1 + n]);
      err += (got - want) * (got - want), ref_norm += want * want;
    }
    ++checked;
  }
  const double rel = ref_norm > 0 ? std::sqrt(err / ref_norm) : 0.0;
  const bool ok = nan == 0 && rel < 5e-3;
  std::printf("M=%d: %d rows checked (the last one included), rel error %.2e, NaN left %zu: %s\n",
              M, checked, rel, nan, ok ? "PASS" : "FAIL");
  cudaFree(da), cudaFree(db0), cudaFree(db1), cudaFree(dd), cudaFree(ds), cudaFree(dbias);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool ok = true;
  for (int i = 1; i < argc; ++i) ok = run(std::atoi(argv[i])) && ok;
  return ok ? 0 : 1;
}
