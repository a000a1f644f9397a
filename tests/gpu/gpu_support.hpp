// Shared helpers of the GPU tests: the driver table, checked calls, device
// buffers that make their device current, fresh random numbers, graph
// capture, and what the grouped GEMM tests (bf16 and FP8) share: offsets,
// reading and comparing outputs, the poison check of rows past the last offset.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kjit/internal/driver.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp8.hpp"

namespace kjit::testing {

inline const kjit::DriverApi& api() { return **kjit::load_driver(); }

inline void must(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) FAIL(what, ": ", kjit::driver_error_text(api(), r));
}

// Device 0's compute capability as major * 10 + minor (90 on Hopper).
inline int compute_capability() {
  CUdevice dev;
  must(api().cuDeviceGet(&dev, 0), "cuDeviceGet");
  int major = 0, minor = 0;
  must(api().cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute");
  must(api().cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute");
  return major * 10 + minor;
}

// Whether device 0 is a Hopper GPU: the SM90 kernel paths run there.
inline bool is_hopper() { return compute_capability() / 10 == 9; }

inline std::mt19937_64& rng() {
  static std::mt19937_64 engine(std::random_device{}());
  return engine;
}

// Makes `ordinal`'s primary context current on this thread (what a framework
// that last touched that device would leave behind).
inline CUcontext make_current(int ordinal) {
  CUdevice dev;
  CUcontext ctx;
  must(api().cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  must(api().cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  must(api().cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  CUcontext ctx;
  DeviceBuffer(int device, size_t n) : bytes(n), ctx(make_current(device)) { must(api().cuMemAlloc(&ptr, n), "cuMemAlloc"); }
  ~DeviceBuffer() {
    api().cuCtxSetCurrent(ctx);
    api().cuMemFree(ptr);
  }
  void* get() const { return reinterpret_cast<void*>(ptr); }
  template <class T>
  void upload(const std::vector<T>& host) {
    api().cuCtxSetCurrent(ctx);
    must(api().cuMemcpyHtoD(ptr, host.data(), host.size() * sizeof(T)), "cuMemcpyHtoD");
    settle();
  }
  template <class T>
  std::vector<T> download(size_t offset_bytes, size_t count) const {
    std::vector<T> host(count);
    api().cuCtxSetCurrent(ctx);
    must(api().cuCtxSynchronize(), "cuCtxSynchronize");
    must(api().cuMemcpyDtoH(host.data(), ptr + offset_bytes, count * sizeof(T)), "cuMemcpyDtoH");
    return host;
  }
  // A pattern no dequant can produce (scales here are < 16): -6.3e18 in bf16,
  // f16 NaN with a distinctive payload is avoided by checking bits exactly.
  static constexpr uint32_t kPoison = 0xDEADBEEFu;
  void poison() {
    api().cuCtxSetCurrent(ctx);
    must(api().cuMemsetD32(ptr, kPoison, bytes / 4), "cuMemsetD32");
    settle();
  }
  // The 32-bit words that lost the poison.
  int64_t written_words() const {
    int64_t written = 0;
    for (uint32_t word : download<uint32_t>(0, bytes / 4)) written += word != kPoison;
    return written;
  }
  // The copy and the memset above may return before the device has finished
  // them (pageable copies, device memsets), and a non-blocking stream does
  // not wait for the legacy stream they ran on: a graph replayed right after
  // raced with the poison under load (seen: output still poison).
  static void settle() { must(api().cuStreamSynchronize(nullptr), "cuStreamSynchronize"); }
};

// One stream capture on a fresh non-blocking stream: the calls between the
// constructor and end() are captured, instantiate() makes the graph
// replayable; the stream, graph and its instance die with this.
class GraphCapture {
 public:
  GraphCapture() {
    must(api().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    must(api().cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  }
  GraphCapture(const GraphCapture&) = delete;
  GraphCapture& operator=(const GraphCapture&) = delete;
  ~GraphCapture() {
    if (exec_) api().cuGraphExecDestroy(exec_);
    if (graph_) api().cuGraphDestroy(graph_);
    api().cuStreamDestroy(stream_);
  }
  kjit_stream stream() const { return reinterpret_cast<kjit_stream>(stream_); }
  void end() { must(api().cuStreamEndCapture(stream_, &graph_), "cuStreamEndCapture"); }
  void instantiate() { must(api().cuGraphInstantiateWithFlags(&exec_, graph_, 0), "cuGraphInstantiateWithFlags"); }
  // One replay, waited for.
  void replay() {
    must(api().cuGraphLaunch(exec_, stream_), "cuGraphLaunch");
    must(api().cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }

 private:
  CUstream stream_ = nullptr;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
};

// Captures `launch(stream)` (a kjit call returning its status), requires that
// it was accepted, replays the graph once and requires no device error.
template <class Launch>
void capture_and_replay_once(Launch launch) {
  GraphCapture capture;
  const kjit_status status = launch(capture.stream());
  const std::string message = kjit_last_error_message();
  capture.end();
  REQUIRE_MESSAGE(status == KJIT_OK, message);
  capture.instantiate();
  capture.replay();
  REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
}

// `bytes` behind `offset` bytes of zeros: a tensor whose view starts off alignment.
inline std::vector<uint8_t> shifted(const std::vector<uint8_t>& bytes, size_t offset) {
  std::vector<uint8_t> out(offset, 0);
  out.insert(out.end(), bytes.begin(), bytes.end());
  return out;
}

// A grouped GEMM's offsets of `counts` rows per expert in `convention`.
inline std::vector<int32_t> offsets_for(const std::vector<int32_t>& counts, kjit_expert_offsets convention) {
  std::vector<int32_t> ends(counts.size());
  std::partial_sum(counts.begin(), counts.end(), ends.begin());
  if (convention == KJIT_OFFSETS_CUMULATIVE_END) return ends;
  ends.insert(ends.begin(), 0);
  return ends;
}

// Element `index` of a downloaded output of dtype `out` (bf16 or f32).
inline double output_value(kjit_dtype out, const std::vector<uint8_t>& bytes, int64_t index) {
  if (out == KJIT_DTYPE_F32) {
    float f;
    std::memcpy(&f, &bytes[static_cast<size_t>(index * 4)], 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, &bytes[static_cast<size_t>(index * 2)], 2);
  return kjit::reference::bf16_to_float(b);
}

// ||out - ref|| / ||ref|| over every `row_step`-th of the first `routed` rows
// of N columns (`ref` holds those rows only); huge when a row was never written.
inline double relative_error(kjit_dtype out, int64_t n, const std::vector<double>& ref, const std::vector<uint8_t>& bytes,
                             int64_t routed, int64_t row_step = 1) {
  double diff = 0, norm = 0;
  size_t i = 0;
  for (int64_t row = 0; row < routed; row += row_step)
    for (int64_t col = 0; col < n; ++col, ++i) {
      const double got = output_value(out, bytes, row * n + col), want = ref[i];
      diff += (got - want) * (got - want);
      norm += want * want;
    }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// ||x - y|| / ||y|| over the first `count` elements of two outputs of dtype `out`.
inline double disagreement(kjit_dtype out, const std::vector<uint8_t>& x, const std::vector<uint8_t>& y, int64_t count) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double a = output_value(out, x, i), b = output_value(out, y, i);
    diff += (a - b) * (a - b);
    norm += b * b;
  }
  return std::sqrt(diff / norm);
}

// Poisons `out`, launches `g` (whose output it is) on the legacy stream,
// requires that neither the launch nor the device report an error, and
// returns the whole of `out`.
inline std::vector<uint8_t> grouped_gemm_output(const kjit_grouped_gemm_desc& g, DeviceBuffer& out) {
  out.poison();
  REQUIRE_MESSAGE(kjit_grouped_gemm(&g, nullptr) == KJIT_OK, std::string(kjit_last_error_message()));
  REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, std::string(kjit_last_error_message()));
  return out.download<uint8_t>(0, out.bytes);
}

// `g` holds bad offsets: it launches, the device reports that it wrote
// nothing, and `out` (its output) keeps its poison.
inline void check_bad_offsets_refused(const kjit_grouped_gemm_desc& g, const DeviceBuffer& out) {
  REQUIRE_MESSAGE(kjit_grouped_gemm(&g, nullptr) == KJIT_OK, std::string(kjit_last_error_message()));
  CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
  CHECK(std::string(kjit_last_error_message()).find("wrote nothing") != std::string::npos);
  CHECK(out.written_words() == 0);
}

// A gathered A (kjit_grouped_gemm_desc's sorted_to_flat, tokens, top_k):
// `tokens` random bf16 rows of K, and sorted_to_flat entries for `rows` GEMM
// rows, a shuffled draw of distinct flat indices with every 7th entry -1 (a
// zero row), beside the copy that gather reads ([rows, K]), on the device.
struct GatheredA {
  int64_t tokens, top_k;
  std::vector<uint16_t> copy;
  std::vector<int32_t> sorted_to_flat;
  DeviceBuffer source_buffer, copy_buffer, index_buffer;

  GatheredA(int64_t rows, int64_t k, int64_t top_k_)
      : tokens((rows + top_k_ - 1) / top_k_ + 3), top_k(top_k_), copy(static_cast<size_t>(rows * k)),
        sorted_to_flat(static_cast<size_t>(rows)), source_buffer(0, std::max<size_t>(16, tokens * k * 2)),
        copy_buffer(0, std::max<size_t>(16, copy.size() * 2)), index_buffer(0, std::max<size_t>(16, rows * 4)) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> source(static_cast<size_t>(tokens * k));
    for (auto& v : source) v = kjit::reference::bf16_bits_rne(normal(rng()));
    std::vector<int32_t> flat(static_cast<size_t>(tokens * top_k));
    std::iota(flat.begin(), flat.end(), 0);
    std::shuffle(flat.begin(), flat.end(), rng());
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t entry = r % 7 == 3 ? -1 : flat[static_cast<size_t>(r)];
      sorted_to_flat[static_cast<size_t>(r)] = entry;
      if (entry >= 0)
        std::copy_n(source.begin() + entry / top_k * k, k, copy.begin() + r * k);
    }
    source_buffer.upload(source);
    upload();
  }
  // After a change to `copy` and `sorted_to_flat`.
  void upload() {
    if (!copy.empty()) copy_buffer.upload(copy);
    if (!sorted_to_flat.empty()) index_buffer.upload(sorted_to_flat);
  }
  // `g` reading A from the copy, or gathering it.
  kjit_grouped_gemm_desc from_copy(kjit_grouped_gemm_desc g) const {
    g.a = copy_buffer.get();
    return g;
  }
  kjit_grouped_gemm_desc gathering(kjit_grouped_gemm_desc g) const {
    g.a = source_buffer.get();
    g.sorted_to_flat = static_cast<const int32_t*>(index_buffer.get());
    g.tokens = tokens;
    g.top_k = top_k;
    return g;
  }
};

// The GEMM `g` gathering its rows writes exactly what it writes from the
// gathered copy (the same kernel, the same values in the same order), rows
// past the last offset included.
inline void check_gather_equals_copy(const kjit_grouped_gemm_desc& g, DeviceBuffer& out, const GatheredA& a) {
  const auto want = grouped_gemm_output(a.from_copy(g), out);
  const auto got = grouped_gemm_output(a.gathering(g), out);
  CHECK(got == want);
}

// A W8A16 / W4A16 kernel a test forces: kernel and row tile (0: the heuristic's).
struct MixedKernelPath {
  kjit_gemm_kernel kernel;
  int32_t tile_m;
};

// The mixed-input kernels a test runs on this GPU: the default and the
// portable one forced, and on Hopper (`hopper`) the converter kernel forced,
// at its prefill row tile (256) and at 64, for fp8 weights read [E, K, N] the
// register kernel forced too; with [E, N, K] weights the decode kernel forced,
// at the heuristic's chunks of rows and at 8 (FP4: 16).
inline std::vector<MixedKernelPath> mixed_kernel_paths(bool hopper, kjit_weight_layout layout, bool fp4 = false) {
  std::vector<MixedKernelPath> paths{{KJIT_GEMM_KERNEL_AUTO, 0}, {KJIT_GEMM_KERNEL_PORTABLE, 0}};
  if (hopper) {  // the converter kernel reads either orientation
    paths.push_back({KJIT_GEMM_KERNEL_SM90_CONVERTER, 256});
    paths.push_back({KJIT_GEMM_KERNEL_SM90_CONVERTER, 64});
    if (layout == KJIT_WEIGHTS_E_K_N && !fp4) paths.push_back({KJIT_GEMM_KERNEL_SM90, 0});  // and the register kernel
  }
  if (layout == KJIT_WEIGHTS_E_N_K) {
    paths.push_back({KJIT_GEMM_KERNEL_DECODE, 0});
    paths.push_back({KJIT_GEMM_KERNEL_DECODE, fp4 ? 16 : 8});  // FP4: one block an SM at every tile
  }
  return paths;
}

// check_gather_equals_copy on every row tile of the mixed-input GEMMs (the
// heuristic's, then 32, 64, 128 forced, and the converter kernel's 64 and
// 256, for fp8 [E, K, N] the register kernel too) and on the portable kernel
// forced; the forced tiles only where they exist (`hopper`). g.weights says
// the orientation.
inline void check_gather_on_mixed_paths(kjit_grouped_gemm_desc g, DeviceBuffer& out, const GatheredA& a, bool hopper) {
  std::vector<MixedKernelPath> paths;
  for (int32_t tile_m : {0, 32, 64, 128}) {
    if (hopper || tile_m == 0) paths.push_back({KJIT_GEMM_KERNEL_AUTO, tile_m});
    paths.push_back({KJIT_GEMM_KERNEL_PORTABLE, tile_m});
  }
  for (const auto& path : mixed_kernel_paths(hopper, g.weights, g.b_dtype == KJIT_DTYPE_F4_E2M1))
    if (path.kernel != KJIT_GEMM_KERNEL_AUTO && path.kernel != KJIT_GEMM_KERNEL_PORTABLE) paths.push_back(path);
  for (const auto& path : paths) {
    CAPTURE(path.kernel);
    CAPTURE(path.tile_m);
    g.kernel = path.kernel;
    g.tile_m = path.tile_m;
    check_gather_equals_copy(g, out, a);
  }
}

// The bytes of `out` in [from, to) that are none of DeviceBuffer::poison's.
inline int64_t touched_bytes(const std::vector<uint8_t>& out, size_t from, size_t to) {
  int64_t touched = 0;
  for (size_t i = from; i < to; ++i) touched += out[i] != 0xEF && out[i] != 0xBE && out[i] != 0xAD && out[i] != 0xDE;
  return touched;
}

}  // namespace kjit::testing
