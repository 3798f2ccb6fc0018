// Smoke harness: every generated variant against a naive GPU reference, then timing vs cuBLAS.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include "variants.h"

#define CK(x) do { cudaError_t ck_ = (x); if (ck_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(ck_), __LINE__); exit(1);} } while (0)

template <typename T> __global__ void fill(T* p, long long n, unsigned seed, float scale) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
  p[i] = (T)(((h & 0xffff) / 65536.0f - 0.5f) * scale);
}
__global__ void fillf(float* p, long long n, unsigned seed) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned h = (unsigned)i * 2246822519u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
  p[i] = ((h & 0xffff) / 65536.0f - 0.5f);
}
template <typename T> __global__ void ref(const T* A, const T* B, const T* C, const float* bias, float* D,
    int M, int N, int K, bool a_row, bool b_col, float alpha, float beta) {
  int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
  if (n >= N) return;
  float acc = 0;
  for (int k = 0; k < K; ++k) {
    float a = (float)(a_row ? A[(long long)m * K + k] : A[(long long)k * M + m]);
    float b = (float)(b_col ? B[(long long)n * K + k] : B[(long long)k * N + n]);
    acc += a * b;
  }
  float v = alpha * acc + beta * (float)C[(long long)m * N + n] + bias[n];
  D[(long long)m * N + n] = v > 0 ? v : 0;
}
template <typename T> __global__ void diff(const T* D, const float* R, long long n, float* out) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  float d = (float)D[i];
  float e = fabsf(d - R[i]) / (1.0f + fabsf(R[i]));
  if (d != d) e = 1e30f;
  atomicMax((int*)out, __float_as_int(e));
}

template <typename T, typename P, typename L>
void check(const char* tag, L launch, bool a_row, bool b_col, int M, int N, int K, int& fails) {
  T *A, *B, *C, *D; float *bias, *R, *err;
  CK(cudaMalloc(&A, sizeof(T) * M * K)); CK(cudaMalloc(&B, sizeof(T) * K * N));
  CK(cudaMalloc(&C, sizeof(T) * M * N)); CK(cudaMalloc(&D, sizeof(T) * M * N));
  CK(cudaMalloc(&bias, 4 * N)); CK(cudaMalloc(&R, 4ll * M * N)); CK(cudaMalloc(&err, 4));
  long long t = 256;
  fill<T><<<(M * (long long)K + t - 1) / t, t>>>(A, (long long)M * K, 1, 1.0f);
  fill<T><<<(N * (long long)K + t - 1) / t, t>>>(B, (long long)N * K, 2, 1.0f);
  fill<T><<<(M * (long long)N + t - 1) / t, t>>>(C, (long long)M * N, 3, 2.0f);
  fillf<<<(N + t - 1) / t, t>>>(bias, N, 4);
  CK(cudaMemset(D, 0xff, sizeof(T) * M * N));  // NaN poison
  CK(cudaMemset(err, 0, 4));
  P p{};
  p.A = A; p.B = B; p.C = C; p.D = D; p.bias = bias; p.M = M; p.N = N; p.K = K;
  p.ld_A = a_row ? K : M; p.ld_B = b_col ? K : N; p.ld_C = N; p.ld_D = N; p.alpha = 1.5f; p.beta = 0.5f;
  if (launch(p, 0) != cudaSuccess) { printf("%-22s M=%5d N=%5d K=%5d  rejected: %s\n", tag, M, N, K, "can_implement"); cudaGetLastError(); return; }
  CK(cudaDeviceSynchronize());
  ref<T><<<dim3((N + 127) / 128, M), 128>>>(A, B, C, bias, R, M, N, K, a_row, b_col, 1.5f, 0.5f);
  diff<T><<<(M * (long long)N + t - 1) / t, t>>>(D, R, (long long)M * N, err);
  CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
  float e = -1; CK(cudaMemcpy(&e, err, 4, cudaMemcpyDeviceToHost));
  T hd[2]; float hr[2]; CK(cudaMemcpy(hd, D + 1, sizeof(hd), cudaMemcpyDeviceToHost)); CK(cudaMemcpy(hr, R + 1, sizeof(hr), cudaMemcpyDeviceToHost));
  if (0) printf("   sample D %f %f ref %f %f\n", (float)hd[0], (float)hd[1], hr[0], hr[1]);
  bool ok = e < 2e-2f;
  if (!ok) ++fails;
  printf("%-22s M=%5d N=%5d K=%5d  max rel err %.3e  %s\n", tag, M, N, K, e, ok ? "PASS" : "FAIL");
  cudaFree(A); cudaFree(B); cudaFree(C); cudaFree(D); cudaFree(bias); cudaFree(R); cudaFree(err);
}

template <typename T, typename P, typename L>
void bench(const char* tag, L launch, bool a_row, bool b_col, int S, cublasHandle_t h) {
  const int copies = 3;  // rotate inputs past L2
  std::vector<T*> A(copies), B(copies), C(copies), D(copies); float* bias;
  for (int i = 0; i < copies; ++i) {
    CK(cudaMalloc(&A[i], sizeof(T) * S * S)); CK(cudaMalloc(&B[i], sizeof(T) * S * S));
    CK(cudaMalloc(&C[i], sizeof(T) * S * S)); CK(cudaMalloc(&D[i], sizeof(T) * S * S));
    fill<T><<<(S * (long long)S + 255) / 256, 256>>>(A[i], (long long)S * S, 10 + i, 1.0f);
    fill<T><<<(S * (long long)S + 255) / 256, 256>>>(B[i], (long long)S * S, 20 + i, 1.0f);
    fill<T><<<(S * (long long)S + 255) / 256, 256>>>(C[i], (long long)S * S, 30 + i, 1.0f);
  }
  CK(cudaMalloc(&bias, 4 * S)); fillf<<<(S + 255) / 256, 256>>>(bias, S, 5);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> tk, tc;
  for (int it = 0; it < 25; ++it) {
    int i = it % copies;
    P p{}; p.A = A[i]; p.B = B[i]; p.C = C[i]; p.D = D[i]; p.bias = bias; p.M = S; p.N = S; p.K = S;
    p.ld_A = S; p.ld_B = S; p.ld_C = S; p.ld_D = S; p.alpha = 1.5f; p.beta = 0.5f;
    cudaEventRecord(e0); CK(launch(p, 0)); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); if (it >= 5) tk.push_back(ms);
    float one = 1, zero = 0;
    cudaDataType dt = sizeof(T) == 2 && std::is_same<T, __half>::value ? CUDA_R_16F : CUDA_R_16BF;
    cudaEventRecord(e0);
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, S, S, S, &one, B[i], dt, S, A[i], dt, S, &zero, D[i], dt, S,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1); if (it >= 5) tc.push_back(ms);
  }
  std::sort(tk.begin(), tk.end()); std::sort(tc.begin(), tc.end());
  double fl = 2.0 * S * (double)S * S;
  double k = tk[tk.size() / 2], c = tc[tc.size() / 2];
  printf("BENCH %-22s S=%5d kgen %.3f ms %.0f TFLOP/s | cuBLAS %.3f ms %.0f TFLOP/s | ratio %.2f\n", tag, S, k,
         fl / k / 1e9, c, fl / c / 1e9, c / k);
  for (int i = 0; i < copies; ++i) { cudaFree(A[i]); cudaFree(B[i]); cudaFree(C[i]); cudaFree(D[i]); }
  cudaFree(bias);
}

int main(int argc, char** argv) {
  int fails = 0;
  int sizes[][3] = {{1000, 1000, 1000}, {1000, 1000, 40}, {130, 258, 72}};
#define CHECK(tag, T, AR, BC) for (auto& s : sizes) check<T, tag##_params>(#tag, tag##_launch, AR, BC, s[0], s[1], s[2], fails);
  KGEN_VARIANTS(CHECK)
  cublasHandle_t h; cublasCreate(&h);
  int S1 = 4096, S2 = 8192;
#define BENCH(tag, T, AR, BC) if (AR && BC) { bench<T, tag##_params>(#tag, tag##_launch, AR, BC, S1, h); bench<T, tag##_params>(#tag, tag##_launch, AR, BC, S2, h);}
  KGEN_VARIANTS(BENCH)
  printf("%d failures\n", fails);
  return fails != 0;
}
