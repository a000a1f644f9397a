/* kjit from C: dequantise an FP8 (e4m3fn) weight with DeepSeek-style 128x128
 * block scales to bf16 on one GPU, and check it against the CPU.
 *
 *   cmake -S examples -B build-examples -DCMAKE_PREFIX_PATH=/opt/kjit   (an installed kjit)
 *   cmake --build build-examples && build-examples/c_dequant
 *
 * Device memory comes from the CUDA runtime (linked statically, so the program
 * starts without a driver). Exit status: 0 checked, 1 a failure, 77 skipped
 * (no GPU). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <kjit/kjit.h>

enum { ROWS = 256, COLS = 512, BLOCK = 128 };

/* e4m3fn -> float: 1 sign, 4 exponent (bias 7), 3 mantissa bits. */
static float e4m3_to_float(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  const float magnitude = exponent == 0 ? ldexpf((float)mantissa / 8.0f, -6)
                                        : ldexpf(1.0f + (float)mantissa / 8.0f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

static float bf16_to_float(uint16_t bits) {
  uint32_t word = (uint32_t)bits << 16;
  float value;
  memcpy(&value, &word, sizeof value);
  return value;
}

#define CUDA_CHECK(call)                                                              \
  do {                                                                                \
    cudaError_t error_ = (call);                                                      \
    if (error_ != cudaSuccess) {                                                      \
      fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(error_));                 \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

int main(void) {
  int gpus = 0;
  if (kjit_device_count(&gpus) != KJIT_OK || gpus == 0) {
    printf("skipped: no GPU (kjit %s)\n", kjit_version());
    return 77;
  }
  enum { SCALE_ROWS = ROWS / BLOCK, SCALE_COLS = COLS / BLOCK };
  static uint8_t w[ROWS * COLS];
  static uint16_t y[ROWS * COLS];
  float scales[SCALE_ROWS * SCALE_COLS];
  for (int i = 0; i < ROWS * COLS; ++i) w[i] = (uint8_t)(((i * 37) & 0xff) & 0xf7); /* no NaN codes (0x7f, 0xff) */
  for (int i = 0; i < SCALE_ROWS * SCALE_COLS; ++i) scales[i] = 0.25f * (float)(i + 1);

  void *d_w = NULL, *d_scales = NULL, *d_y = NULL;
  CUDA_CHECK(cudaMalloc(&d_w, sizeof w));
  CUDA_CHECK(cudaMalloc(&d_scales, sizeof scales));
  CUDA_CHECK(cudaMalloc(&d_y, sizeof y));
  CUDA_CHECK(cudaMemcpy(d_w, w, sizeof w, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(d_scales, scales, sizeof scales, cudaMemcpyHostToDevice));

  kjit_dequant_desc d;
  kjit_dequant_desc_init(&d);
  d.in_dtype = KJIT_DTYPE_F8_E4M3FN;
  d.out_dtype = KJIT_DTYPE_BF16;
  d.rows = ROWS;
  d.cols = COLS;
  d.scale_granularity = KJIT_SCALE_PER_BLOCK;
  d.block_rows = d.block_cols = BLOCK;
  d.scale_rows = SCALE_ROWS;
  d.scale_cols = SCALE_COLS;
  d.scale_convention = KJIT_SCALE_MULTIPLY; /* DeepSeek's weight_scale_inv is a multiplier */
  d.in = d_w;
  d.scales = d_scales;
  d.out = d_y;
  /* The first call compiles the kernel (or finds it in the cache); the default stream. */
  if (kjit_dequant_fp8(&d, NULL) != KJIT_OK) {
    fprintf(stderr, "kjit_dequant_fp8: %s\n", kjit_last_error_message());
    return 1;
  }
  CUDA_CHECK(cudaMemcpy(y, d_y, sizeof y, cudaMemcpyDeviceToHost)); /* synchronises */

  int wrong = 0;
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < COLS; ++c) {
      const float expected = e4m3_to_float(w[r * COLS + c]) * scales[(r / BLOCK) * SCALE_COLS + c / BLOCK];
      const float got = bf16_to_float(y[r * COLS + c]);
      if (fabsf(got - expected) > fabsf(expected) / 128.0f) ++wrong; /* bf16 keeps 8 significant bits */
    }
  cudaFree(d_w);
  cudaFree(d_scales);
  cudaFree(d_y);
  printf("c_dequant: %d x %d e4m3fn -> bf16 with 128x128 block scales: %s (%d wrong)\n", ROWS, COLS,
         wrong ? "FAILED" : "ok", wrong);
  return wrong ? 1 : 0;
}
