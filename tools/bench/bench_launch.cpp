// Host-side costs of kjit, measured on a GPU machine (not a test):
//   first call   — the first kjit_dequant_fp8 of a process: compile or disk
//                  hit, module load, launch (run twice against one
//                  KJIT_CACHE_DIR: the first run is cold, the second a warm
//                  disk hit in a fresh process);
//   registry hit — the in-process lookup of a loaded kernel;
//   cached call  — a whole kjit_dequant_fp8 on a small tensor, against a raw
//                  cuLaunchKernel of the same function and parameters: the
//                  difference is kjit's overhead per launch.
// Prints one JSON object.
#include <chrono>
#include <cstdio>
#include <vector>

#include "kjit/internal/driver.hpp"
#include "kjit/kjit.h"
#include "kjit/internal/ops/dequant.hpp"
#include "kjit/internal/runtime.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int die(const char* what) {
  std::fprintf(stderr, "bench_launch: %s: %s\n", what, kjit_last_error_message());
  return 1;
}

}  // namespace

int main() {
  auto driver = kjit::load_driver();
  if (!driver) {
    std::fprintf(stderr, "bench_launch: %s\n", driver.error().message.c_str());
    return 1;
  }
  const kjit::DriverApi& api = **driver;
  CUdevice dev;
  CUcontext ctx;
  api.cuDeviceGet(&dev, 0);
  api.cuDevicePrimaryCtxRetain(&ctx, dev);
  api.cuCtxSetCurrent(ctx);
  const int64_t rows = 128, cols = 512;
  CUdeviceptr in, scales, out;
  api.cuMemAlloc(&in, rows * cols);
  api.cuMemAlloc(&scales, 4 * 4);
  api.cuMemAlloc(&out, rows * cols * 2);
  api.cuMemsetD8(in, 0x38, rows * cols);  // 1.0 in e4m3
  api.cuMemsetD32(scales, 0x3f800000u, 4);

  kjit_dequant_desc d;
  kjit_dequant_desc_init(&d);
  d.in_dtype = KJIT_DTYPE_F8_E4M3FN;
  d.out_dtype = KJIT_DTYPE_BF16;
  d.rows = rows;
  d.cols = cols;
  d.scale_granularity = KJIT_SCALE_PER_BLOCK;
  d.block_rows = d.block_cols = 128;
  d.scale_rows = 1;
  d.scale_cols = 4;
  d.scale_convention = KJIT_SCALE_MULTIPLY;
  d.in = reinterpret_cast<void*>(in);
  d.scales = reinterpret_cast<const float*>(scales);
  d.out = reinterpret_cast<void*>(out);

  auto t = std::chrono::steady_clock::now();
  if (kjit_dequant_fp8(&d, nullptr) != KJIT_OK) return die("first call");
  api.cuCtxSynchronize();
  const double first_call_ms = seconds_since(t) * 1e3;

  kjit::Runtime& runtime = kjit::Runtime::global();
  auto plan = kjit::ops::plan_dequant(d);
  const int lookups = 1000000;
  t = std::chrono::steady_clock::now();
  const kjit::LoadedKernel* kernel = nullptr;
  for (int i = 0; i < lookups; ++i) kernel = runtime.registry().find(0, plan->spec);
  const double registry_hit_ns = seconds_since(t) / lookups * 1e9;
  if (!kernel) return die("registry lookup");

  // Launch costs: batches of 200 calls, each batch drained before the next so
  // the launch queue never fills and blocks the host.
  auto time_calls = [&](auto&& call) {
    double best = 1e9;
    for (int batch = 0; batch < 50; ++batch) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < 200; ++i) call();
      best = std::min(best, seconds_since(start) / 200);
      api.cuCtxSynchronize();
    }
    return best * 1e6;
  };
  bool ok = true;
  const double kjit_call_us = time_calls([&] { ok = ok && kjit_dequant_fp8(&d, nullptr) == KJIT_OK; });
  if (!ok) return die("cached call");
  auto params = plan->params;
  params.device_error = reinterpret_cast<unsigned int*>(runtime.device(0).value()->error_words);
  void* args[] = {&params};
  const auto& g = plan->geometry;
  const double raw_launch_us = time_calls([&] {
    api.cuLaunchKernel(kernel->function, g.grid_x, g.grid_y, g.grid_z, g.block_x, 1, 1, 0, nullptr, args, nullptr);
  });
  api.cuCtxSynchronize();
  std::printf(
      "{\"first_call_ms\": %.3f, \"registry_hit_ns\": %.1f, \"kjit_call_us\": %.3f, \"raw_launch_us\": %.3f, "
      "\"kjit_overhead_us\": %.3f}\n",
      first_call_ms, registry_hit_ns, kjit_call_us, raw_launch_us, kjit_call_us - raw_launch_us);
  return 0;
}
