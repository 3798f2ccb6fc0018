// Calls two kgen-generated kernels through their headers only, and checks each result against
// a plain CPU loop:
//   gemm_bf16      (../gemm.kg)            D = A @ B                                   bf16
//   gemm_bias_relu (../gemm_bias_relu.kg)  D = relu(alpha * A @ B + beta * C + bias[col])  f16
// at a ragged size (M, N, K not multiples of the 128x256x64 tile). Prints PASS or FAIL per
// kernel and exits non-zero if any failed.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "gemm.h"
#include "gemm_bias_relu.h"

#define CUDA_CHECK(call)                                                             \
  do {                                                                               \
    const cudaError_t err_ = (call);                                                 \
    if (err_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,             \
                   cudaGetErrorString(err_));                                        \
      std::exit(2);                                                                  \
    }                                                                                \
  } while (0)

namespace {

// M, N, K are not multiples of the tile; the alignment rules still hold: A and B rows of 16
// bytes (K a multiple of 8 elements), an even number of output columns (N).
constexpr int kM = 200;
constexpr int kN = 136;
constexpr int kK = 72;

float to_float(__half x) { return __half2float(x); }
float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> T from_float(float x);
template <> __half from_float<__half>(float x) { return __float2half(x); }
template <> __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// A small deterministic generator (an LCG): values in [-1, 1) in steps of 1/64, never all zero.
struct Lcg {
  uint32_t state;
  float next() {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int>(state >> 25) - 64) / 64.0f;
  }
};

template <typename T>
std::vector<T> random_values(size_t count, uint32_t seed) {
  Lcg lcg{seed};
  std::vector<T> out(count);
  for (T& x : out) x = from_float<T>(lcg.next());
  return out;
}

// A device copy of a host vector, freed with the object.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) { CUDA_CHECK(cudaMalloc(&ptr, n * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> to_host() const {
    std::vector<T> host(count);
    CUDA_CHECK(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
};

// acc[m][n] = sum_k A[m][k] * B[k][n] in float; A row-major (ld K), B column-major (ld K).
template <typename T>
std::vector<float> reference_gemm(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<float> acc(static_cast<size_t>(kM) * kN);
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      float sum = 0.0f;
      for (int k = 0; k < kK; ++k)
        sum += to_float(a[static_cast<size_t>(m) * kK + k]) *
               to_float(b[static_cast<size_t>(n) * kK + k]);
      acc[static_cast<size_t>(m) * kN + n] = sum;
    }
  return acc;
}

// |out - ref| <= atol + rtol * |ref| everywhere (NaN, the poison of an unwritten element,
// fails); prints the verdict.
template <typename T>
bool report(const char* name, const std::vector<T>& out, const std::vector<float>& ref,
            float atol, float rtol) {
  int bad = 0;
  float worst = 0.0f;
  for (size_t i = 0; i < ref.size(); ++i) {
    const float err = std::fabs(to_float(out[i]) - ref[i]);
    if (!(err <= atol + rtol * std::fabs(ref[i]))) ++bad;  // NaN counts as bad
    if (err > worst) worst = err;
  }
  std::printf("%s %s: M=%d N=%d K=%d, max abs error %g, %d of %zu bad (atol %g, rtol %g)\n",
              bad == 0 ? "PASS" : "FAIL", name, kM, kN, kK, worst, bad, ref.size(), atol, rtol);
  return bad == 0;
}

// Rejected arguments come back as a reason, and the launcher refuses them.
template <typename Params>
bool rejects(const char* name, const Params& p, const char* (*can_implement)(const Params&),
             cudaError_t (*launch)(const Params&, cudaStream_t)) {
  const char* reason = can_implement(p);
  const bool ok = reason != nullptr && launch(p, nullptr) == cudaErrorInvalidValue;
  std::printf("%s %s rejects a bad leading dimension: %s\n", ok ? "PASS" : "FAIL", name,
              reason ? reason : "(accepted)");
  return ok;
}

bool run_gemm() {
  const auto a = random_values<__nv_bfloat16>(static_cast<size_t>(kM) * kK, 1);
  const auto b = random_values<__nv_bfloat16>(static_cast<size_t>(kN) * kK, 2);
  DeviceBuffer<__nv_bfloat16> a_dev(a), b_dev(b), d_dev(static_cast<size_t>(kM) * kN);
  CUDA_CHECK(cudaMemset(d_dev.ptr, 0xFF, d_dev.count * sizeof(__nv_bfloat16)));  // NaN

  gemm_bf16_params p{};
  p.A = a_dev.ptr;
  p.B = b_dev.ptr;
  p.D = d_dev.ptr;
  p.M = kM;
  p.N = kN;
  p.K = kK;
  p.ld_A = kK;  // A row-major [M, K]
  p.ld_B = kK;  // B column-major [K, N]: column n starts at n * ld_B
  p.ld_D = kN;  // D row-major [M, N]
  if (const char* reason = gemm_bf16_can_implement(p)) {
    std::printf("FAIL gemm_bf16: cannot run: %s\n", reason);
    return false;
  }
  CUDA_CHECK(gemm_bf16_launch(p, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());
  bool ok = report("gemm_bf16", d_dev.to_host(), reference_gemm(a, b), 1.6e-2f, 1.6e-2f);

  gemm_bf16_params bad = p;
  bad.ld_A = kK + 1;
  ok = rejects("gemm_bf16", bad, gemm_bf16_can_implement, gemm_bf16_launch) && ok;
  return ok;
}

bool run_gemm_bias_relu() {
  const float alpha = 1.5f;
  const float beta = 0.5f;
  const auto a = random_values<__half>(static_cast<size_t>(kM) * kK, 3);
  const auto b = random_values<__half>(static_cast<size_t>(kN) * kK, 4);
  const auto c = random_values<__half>(static_cast<size_t>(kM) * kN, 5);
  std::vector<float> bias(kN);
  Lcg lcg{6};
  for (float& x : bias) x = lcg.next();
  DeviceBuffer<__half> a_dev(a), b_dev(b), c_dev(c), d_dev(static_cast<size_t>(kM) * kN);
  DeviceBuffer<float> bias_dev(bias);
  CUDA_CHECK(cudaMemset(d_dev.ptr, 0xFF, d_dev.count * sizeof(__half)));  // NaN

  gemm_bias_relu_params p{};
  p.A = a_dev.ptr;
  p.B = b_dev.ptr;
  p.C = c_dev.ptr;
  p.D = d_dev.ptr;
  p.bias = bias_dev.ptr;
  p.M = kM;
  p.N = kN;
  p.K = kK;
  p.ld_A = kK;
  p.ld_B = kK;
  p.ld_C = kN;
  p.ld_D = kN;
  p.alpha = alpha;
  p.beta = beta;
  if (const char* reason = gemm_bias_relu_can_implement(p)) {
    std::printf("FAIL gemm_bias_relu: cannot run: %s\n", reason);
    return false;
  }
  CUDA_CHECK(gemm_bias_relu_launch(p, nullptr));
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> ref = reference_gemm(a, b);
  int positive = 0;
  for (int m = 0; m < kM; ++m)
    for (int n = 0; n < kN; ++n) {
      const size_t i = static_cast<size_t>(m) * kN + n;
      const float x = alpha * ref[i] + beta * to_float(c[i]) + bias[n];
      ref[i] = x > 0.0f ? x : 0.0f;
      positive += x > 0.0f;
    }
  // relu must see both signs, or the check would prove little
  bool ok = positive > 0 && positive < kM * kN;
  if (!ok) std::printf("FAIL gemm_bias_relu: the inputs give %d positive outputs\n", positive);
  ok = report("gemm_bias_relu", d_dev.to_host(), ref, 2e-3f, 4e-3f) && ok;

  gemm_bias_relu_params bad = p;
  bad.ld_B = kK - 4;
  ok = rejects("gemm_bias_relu", bad, gemm_bias_relu_can_implement, gemm_bias_relu_launch) && ok;
  return ok;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  bool ok = run_gemm();
  ok = run_gemm_bias_relu() && ok;
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
