// kjit from C++ (kjit.hpp, which throws kjit::Exception): one MoE layer's
// expert GEMM in bf16 on one GPU. Rows of A are sorted by expert; expert e
// owns rows [ends[e-1], ends[e]) (an expert may get none), and
// out[rows, N] = A[rows, K] . W_e^T with W stacked [E, N, K] as checkpoints
// store it. Checked against the CPU.
//
//   cmake -S examples -B build-examples -DCMAKE_PREFIX_PATH=/opt/kjit   (an installed kjit)
//   cmake --build build-examples && build-examples/cpp_grouped_gemm
//
// Exit status: 0 checked, 1 a failure, 77 skipped (no GPU).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <cuda_runtime.h>
#include <kjit/kjit.hpp>

namespace {

uint16_t to_bf16(float value) {  // round to nearest even (no NaN here)
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

float from_bf16(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

// A device copy of `host`, freed with the object.
template <class T>
struct DeviceBuffer {
  explicit DeviceBuffer(const std::vector<T>& host) : bytes(host.size() * sizeof(T)) {
    if (cudaMalloc(&ptr, bytes) != cudaSuccess || cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess)
      throw std::runtime_error("cudaMalloc / cudaMemcpy failed");
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* ptr = nullptr;
  size_t bytes;
};

}  // namespace

int main() try {
  if (kjit::device_count() == 0) {
    std::printf("skipped: no GPU (kjit %s)\n", kjit_version());
    return 77;
  }
  constexpr int64_t experts = 4, n = 256, k = 512;
  const std::vector<int32_t> ends = {48, 48, 176, 200};  // expert 1 gets no rows
  const int64_t rows = ends.back();

  std::vector<uint16_t> a(static_cast<size_t>(rows * k)), w(static_cast<size_t>(experts * n * k));
  for (size_t i = 0; i < a.size(); ++i) a[i] = to_bf16(static_cast<float>(static_cast<int>(i % 17) - 8) / 16.0f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = to_bf16(static_cast<float>(static_cast<int>(i % 13) - 6) / 32.0f);

  DeviceBuffer<uint16_t> d_a(a), d_w(w), d_out(std::vector<uint16_t>(static_cast<size_t>(rows * n)));
  DeviceBuffer<int32_t> d_ends(ends);
  DeviceBuffer<uint8_t> workspace{std::vector<uint8_t>(kjit_grouped_gemm_workspace_bytes())};

  kjit::GroupedGemmDesc d;  // struct_size and the defaults set
  d.a_dtype = d.b_dtype = d.out_dtype = KJIT_DTYPE_BF16;
  d.rows = rows;
  d.n = n;
  d.k = k;
  d.experts = experts;
  d.weights = KJIT_WEIGHTS_E_N_K;
  d.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
  d.a = d_a.ptr;
  d.b = d_w.ptr;
  d.out = d_out.ptr;
  d.offsets = static_cast<const int32_t*>(d_ends.ptr);
  d.workspace = workspace.ptr;  // one per stream: lets Hopper's kernel hand tiles out on demand
  d.workspace_bytes = workspace.bytes;
  kjit::grouped_gemm(d, nullptr);  // compiles (or finds in the cache) on first use; the default stream
  kjit::check_device_errors(0);    // bad offsets would be reported here (synchronises)

  std::vector<uint16_t> out(static_cast<size_t>(rows * n));
  if (cudaMemcpy(out.data(), d_out.ptr, d_out.bytes, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
  int wrong = 0;
  for (int64_t e = 0, begin = 0; e < experts; begin = ends[static_cast<size_t>(e)], ++e)
    for (int64_t r = begin; r < ends[static_cast<size_t>(e)]; ++r)
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0;
        for (int64_t i = 0; i < k; ++i)
          sum += from_bf16(a[static_cast<size_t>(r * k + i)]) * from_bf16(w[static_cast<size_t>((e * n + j) * k + i)]);
        const float got = from_bf16(out[static_cast<size_t>(r * n + j)]);
        if (std::fabs(got - sum) > 1e-2f * std::fabs(sum) + 1e-2f) ++wrong;
      }
  std::printf("cpp_grouped_gemm: %lld rows x %lld experts, N %lld, K %lld, bf16: %s (%d wrong)\n",
              static_cast<long long>(rows), static_cast<long long>(experts), static_cast<long long>(n),
              static_cast<long long>(k), wrong ? "FAILED" : "ok", wrong);
  return wrong ? 1 : 0;
} catch (const std::exception& e) {  // kjit::Exception: the status and kjit's message
  std::fprintf(stderr, "cpp_grouped_gemm: %s\n", e.what());
  return 1;
}
