// The generated .cu's own launcher for examples/gemm_bias_relu.kg compiled for sm_90a (the
// warp-specialized kernel), built with nvcc and run on the GPU: it encodes the tensor maps of
// A, B and D through the driver entry point and launches the kernel with them. Random inputs,
// D poisoned with NaN, sampled rows (the last included) checked against a float reference of
// relu(alpha * A @ B + beta * C + bias). Usage: gemm_launcher M N K [M N K ...]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "gemm_bias_relu.h"

namespace {

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

template <typename T>
T* upload(const std::vector<T>& host) {
  T* dev = nullptr;
  CHECK(cudaMalloc(&dev, (host.empty() ? 1 : host.size()) * sizeof(T)));
  if (!host.empty()) CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

bool run(int M, int N, int K) {
  std::vector<__half> a(static_cast<size_t>(M) * K), b(static_cast<size_t>(K) * N), c(static_cast<size_t>(M) * N);
  std::vector<float> bias(N);
  for (auto& x : a) x = __float2half(uniform());
  for (auto& x : b) x = __float2half(uniform() / 16.0f);  // col-major: (k, n) at n * K + k
  for (auto& x : c) x = __float2half(uniform());
  for (auto& x : bias) x = 0.5f * uniform();
  __half *da = upload(a), *db = upload(b), *dc = upload(c);
  float* dbias = upload(bias);
  __half* dd = upload(std::vector<__half>(static_cast<size_t>(M) * N));
  CHECK(cudaMemset(dd, 0xff, static_cast<size_t>(M) * N * sizeof(__half)));  // NaN everywhere

  gemm_bias_relu_params p{};
  p.A = da, p.B = db, p.C = dc, p.D = dd, p.bias = dbias, p.alpha = 1.5f, p.beta = 0.5f;
  p.M = M, p.N = N, p.K = K, p.ld_A = K, p.ld_B = K, p.ld_C = N, p.ld_D = N;
  const char* why = gemm_bias_relu_can_implement(p);
  if (why != nullptr) {
    std::printf("M=%d N=%d K=%d: refused: %s\n", M, N, K, why);
    return false;
  }
  CHECK(gemm_bias_relu_launch(p, 0));
  CHECK(cudaDeviceSynchronize());

  std::vector<__half> d(static_cast<size_t>(M) * N);
  if (!d.empty()) CHECK(cudaMemcpy(d.data(), dd, d.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  size_t nan = 0;
  for (const auto& x : d) nan += std::isnan(__half2float(x)) ? 1 : 0;
  double err = 0.0, ref_norm = 0.0;
  int checked = 0;
  for (int i = 0; i < 64 && M > 0; ++i) {
    const int r = i == 0 ? M - 1 : static_cast<int>((static_cast<long long>(i) * 7919) % M);
    for (int n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < K; ++k)
        acc += __half2float(a[static_cast<size_t>(r) * K + k]) * __half2float(b[static_cast<size_t>(n) * K + k]);
      const double want = std::fmax(1.5f * acc + 0.5f * __half2float(c[static_cast<size_t>(r) * N + n]) + bias[n], 0.0f);
      const double got = __half2float(d[static_cast<size_t>(r) * N + n]);
      err += (got - want) * (got - want), ref_norm += want * want;
    }
    ++checked;
  }
  const double rel = ref_norm > 0 ? std::sqrt(err / ref_norm) : 0.0;
  const bool ok = nan == 0 && rel < 5e-3;
  std::printf("M=%d N=%d K=%d: %d rows checked (the last one included), rel error %.2e, NaN left %zu: %s\n",
              M, N, K, checked, rel, nan, ok ? "PASS" : "FAIL");
  cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd), cudaFree(dbias);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool ok = true;
  for (int i = 1; i + 2 < argc; i += 3) ok = run(std::atoi(argv[i]), std::atoi(argv[i + 1]), std::atoi(argv[i + 2])) && ok;
  return ok ? 0 : 1;
}
