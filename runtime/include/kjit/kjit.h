/* kjit — stable C ABI.
 *
 * Every function returns a kjit_status; on failure the calling thread's last
 * error message (kjit_last_error_message) says what was wrong in words that
 * name the argument. No function throws, allocates device memory on a launch,
 * synchronises the host on a launch, or compiles while a stream is capturing.
 *
 * Structs passed in carry their own size (struct_size) so that fields can be
 * appended without breaking callers built against an older header.
 *
 * Launches are in stream order. On sm_90 and later each kernel is launched
 * as a programmatic dependent of the kernel before it in the stream and
 * waits for that kernel's completion and memory before it touches memory
 * (griddepcontrol.wait), so only its launch overlaps; a kernel of yours
 * launched with the programmatic attribute after a kjit call must likewise
 * wait before it reads kjit's output. KJIT_PROGRAMMATIC_LAUNCH=0 launches
 * plainly (docs/environment.md). */
#ifndef KJIT_KJIT_H
#define KJIT_KJIT_H

#include <stddef.h>
#include <stdint.h>

#include "kjit/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define KJIT_API __declspec(dllexport)
#else
#define KJIT_API __attribute__((visibility("default")))
#endif

/* CUstream without including cuda.h: the ABI is the driver's opaque pointer. */
typedef struct CUstream_st* kjit_stream;

#define KJIT_ABI_VERSION 1

/* Element types. Values are part of the ABI. */
typedef enum kjit_dtype {
  KJIT_DTYPE_INVALID = 0,
  KJIT_DTYPE_F8_E4M3FN = 1, /* OCP e4m3fn: max 448, no inf, NaN = 0x7F/0xFF */
  KJIT_DTYPE_F8_E5M2 = 2,   /* OCP e5m2: max 57344, has inf and NaN */
  KJIT_DTYPE_BF16 = 3,
  KJIT_DTYPE_F16 = 4,
  KJIT_DTYPE_F32 = 5,
  KJIT_DTYPE_F4_E2M1 = 6    /* e2m1 pairs in bytes, element 2i in the LOW nibble of byte i (NVFP4, MXFP4) */
} kjit_dtype;

/* How one fp32 scale covers the data. */
typedef enum kjit_scale_granularity {
  KJIT_SCALE_INVALID = 0,
  KJIT_SCALE_PER_TENSOR = 1, /* scales: [E] (one per expert; [1] for 2-D) */
  KJIT_SCALE_PER_ROW = 2,    /* scales: [E, R] (compressed-tensors CHANNEL: [N, 1]) */
  KJIT_SCALE_PER_BLOCK = 3   /* scales: [E, ceil(R/block_rows), ceil(C/block_cols)] */
} kjit_scale_granularity;

/* What the scale means. There is deliberately no default: DeepSeek's
 * weight_scale_inv and compressed-tensors' weight_scale are both MULTIPLY. */
typedef enum kjit_scale_convention {
  KJIT_SCALE_CONVENTION_UNSET = 0, /* rejected */
  KJIT_SCALE_MULTIPLY = 1,         /* out = fp8 * scale */
  KJIT_SCALE_DIVIDE = 2            /* out = fp8 / scale (IEEE division) */
} kjit_scale_convention;

/* ------------------------------------------------------------------------
 * Block-scaled "MX" formats: NVFP4, MXFP4, MXFP8 (../docs/formats.md states
 * every formula). Elements run along K (the contiguous axis of a row); one
 * scale covers `block` consecutive elements of a row:
 *   NVFP4: e2m1 pairs in bytes (element 2i in the LOW nibble of byte i), one
 *          e4m3fn scale byte per 16 elements, and an fp32 global scale per
 *          expert whose meaning the caller states (ModelOpt weight_scale_2 is
 *          a MULTIPLY, compressed-tensors weight_global_scale a DIVIDE):
 *          value = (e2m1 * e4m3 scale), exact in fp32, then one IEEE multiply
 *          or divide by the global scale.
 *   MXFP4: e2m1 pairs as NVFP4, one UE8M0 scale byte per 32 elements
 *          (2^(byte - 127); 0x00 = 2^-127, 0xFF = NaN), no global scale.
 *   MXFP8: e4m3fn or e5m2 codes, one UE8M0 scale byte per 32 elements.
 * gpt-oss's stored MXFP4 experts (`*_blocks` [E, N, K/32, 16] and `*_scales`
 * [E, N, K/32] uint8) are exactly the packed [E, N, K/2] bytes and LINEAR
 * scales: pass them as they are. */
typedef enum kjit_block_format {
  KJIT_BLOCK_FORMAT_UNSET = 0, /* rejected */
  KJIT_BLOCK_FORMAT_NVFP4 = 1, /* e2m1 pairs, e4m3fn scale per 16, fp32 global scale per expert */
  KJIT_BLOCK_FORMAT_MXFP4 = 2, /* e2m1 pairs, UE8M0 scale per 32 */
  KJIT_BLOCK_FORMAT_MXFP8 = 3  /* e4m3fn or e5m2 codes (element_dtype), UE8M0 scale per 32 */
} kjit_block_format;

/* Where the scale bytes of row r, scale column c (= element column / block)
 * of one expert's [rows, K / block] scales live. */
typedef enum kjit_scale_layout {
  KJIT_SCALE_LAYOUT_UNSET = 0,  /* rejected */
  KJIT_SCALE_LAYOUT_LINEAR = 1, /* row-major [rows, K / block]; experts one after another, no padding */
  /* "128x4" (cuBLASLt, CUTLASS, TensorRT-LLM, FlashInfer): rows padded to a multiple of 128 and scale columns
   * to a multiple of 4; with kt = ceil(scale_cols / 4), byte
   * ((r / 128) * kt + c / 4) * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + c % 4 of the expert's block.
   * Each expert is swizzled on its own, r counted from its first row, its block starting at the sum of
   * round_up(rows_j, 128) * round_up(scale_cols, 4) over the experts j before it. */
  KJIT_SCALE_LAYOUT_SWIZZLED_128X4 = 2
} kjit_scale_layout;

/* FP8 -> bf16/fp16/fp32 dequantisation of a 2-D tensor [R, C] or a stack of
 * experts [E, R, C] (experts dense one after another: expert e starts at
 * e * R * in_row_stride elements). All sizes and strides are in elements.
 *
 * With expert_ids == NULL every expert is written to out[E, R, C]. With a
 * device-resident int32 list of num_expert_ids ids, only those experts are
 * dequantised, compactly: out[i] = dequant(in[expert_ids[i]]). Ids are checked
 * on the device: if any is outside [0, experts) the launch writes nothing and
 * records the error, which kjit_device_errors returns. */
typedef struct kjit_dequant_desc {
  uint32_t struct_size; /* sizeof(kjit_dequant_desc) */
  kjit_dtype in_dtype;  /* KJIT_DTYPE_F8_E4M3FN or KJIT_DTYPE_F8_E5M2 */
  kjit_dtype out_dtype; /* KJIT_DTYPE_BF16, _F16 or _F32 */
  int64_t experts;      /* 1 for a plain 2-D tensor */
  int64_t rows;
  int64_t cols;
  int64_t in_row_stride;  /* 0 = cols (contiguous); otherwise >= cols */
  int64_t out_row_stride; /* 0 = cols (contiguous); otherwise >= cols */
  kjit_scale_granularity scale_granularity;
  int64_t block_rows; /* PER_BLOCK only, >= 1; partial last blocks allowed */
  int64_t block_cols; /* PER_BLOCK only, >= 1 */
  int64_t scale_rows; /* the shape of one expert's scales as the caller holds */
  int64_t scale_cols; /* them: [1,1], [R,1] or [ceil(R/br), ceil(C/bc)]; checked */
  kjit_scale_convention scale_convention;
  const void* in;           /* device memory, fp8 codes */
  const float* scales;      /* device memory, fp32, dense, layout per granularity */
  void* out;                /* device memory */
  const int32_t* expert_ids; /* optional device memory, see above */
  int64_t num_expert_ids;    /* > 0 exactly when expert_ids != NULL */
} kjit_dequant_desc;

/* Fills *desc with defaults (struct_size set, everything else invalid/zero). */
KJIT_API void kjit_dequant_desc_init(kjit_dequant_desc* desc);

/* Dequantises on `stream`, in the context of the device that owns the
 * pointers (whatever context the calling thread has current). Compiles and
 * loads the kernel on first use, unless the stream is capturing a graph, in
 * which case it fails with KJIT_ERROR_CAPTURING: call kjit_dequant_fp8_prepare
 * first. Rejects host pointers, pointers on different devices, and a stream
 * of another device. */
KJIT_API kjit_status kjit_dequant_fp8(const kjit_dequant_desc* desc, kjit_stream stream);

/* Compiles (or finds in the cache) and loads the kernels that launches of
 * `desc`'s shapes need on device `device`, one per vector width their
 * pointers' alignment can ask for (views at any offset), so that later
 * launches of the same kind neither compile nor load. Pointers in desc are not
 * used and may be NULL. */
KJIT_API kjit_status kjit_dequant_fp8_prepare(const kjit_dequant_desc* desc, int device);

/* Checks `desc` as kjit_dequant_fp8 and kjit_dequant_fp8_prepare do before they
 * look at a device: every rule that depends on neither a pointer nor the
 * device (dtypes, sizes, strides, the scales' shape, the convention; not the
 * arch's capability gate), with the status and the message a launch would
 * give. KJIT_OK leaves only the pointers and the device to check. Host only:
 * it loads no driver, needs no GPU and compiles nothing, so a caller can check
 * where it only traces (the Python module's fake kernels, which torch.compile
 * runs, call it). No pointer is read: an optional one counts only as given or
 * NULL (its presence is part of the shapes), the others may be NULL. Every op
 * has its kjit_<launch>_check, alike but for the descriptor. */
KJIT_API kjit_status kjit_dequant_fp8_check(const kjit_dequant_desc* desc);

/* How the rows of each expert are given: device-resident int32 offsets into
 * the rows of A (rows sorted by expert). No default, on purpose. */
typedef enum kjit_expert_offsets {
  KJIT_OFFSETS_UNSET = 0,             /* rejected */
  KJIT_OFFSETS_CUMULATIVE_END = 1,    /* E entries: end of each expert, no leading 0 (torch._grouped_mm) */
  KJIT_OFFSETS_WITH_LEADING_ZERO = 2  /* E + 1 entries: 0, end of expert 0, ..., end of expert E-1 */
} kjit_expert_offsets;

/* How the stacked expert weights W are laid out. */
typedef enum kjit_weight_layout {
  KJIT_WEIGHTS_UNSET = 0, /* rejected */
  KJIT_WEIGHTS_E_N_K = 1, /* [E, N, K]: how checkpoints store expert weights (out = A . W_e^T) */
  KJIT_WEIGHTS_E_K_N = 2  /* [E, K, N] (out = A . W_e) */
} kjit_weight_layout;

/* Which grouped GEMM kernel runs. */
typedef enum kjit_gemm_kernel {
  KJIT_GEMM_KERNEL_AUTO = 0,     /* the arch's own (default): wgmma + TMA on SM90, mma.sync elsewhere */
  KJIT_GEMM_KERNEL_PORTABLE = 1, /* the mma.sync kernel on any arch (comparisons, debugging) */
  KJIT_GEMM_KERNEL_SM90 = 2,     /* the arch's wgmma kernels; KJIT_ERROR_UNSUPPORTED off Hopper */
  KJIT_GEMM_KERNEL_SM90_SWAP_AB = 3, /* the wgmma kernel with rows on wgmma's N in every bucket; off Hopper as _SM90 */
  KJIT_GEMM_KERNEL_SM90_CONVERTER = 4, /* W8A16 / W4A16 only: the wgmma kernel whose converter warps write bf16 weight
                                          tiles into shared memory, in every bucket; off Hopper as _SM90 */
  KJIT_GEMM_KERNEL_DECODE = 5, /* weights read [E, N, K] only (bf16, W8A16, W8A8): the decode kernel (blocks only for
                                  non-empty experts, weights streamed through shared memory; W8A8 on Hopper on wgmma)
                                  in every bucket, sm_90 and newer; AUTO picks it on Hopper for few routed rows */
  KJIT_GEMM_KERNEL_SHORT_K = 6 /* bf16 with K <= 32 (a LoRA rank) and no fused activation only: the short-K kernel
                                  (mma.sync, sm_80 and newer; built to stream the output and its addend) in every
                                  bucket; AUTO picks it on every arch wherever it serves */
} kjit_gemm_kernel;

/* Which way a grouped GEMM cluster's blocks lie over the output tiles. */
typedef enum kjit_gemm_cluster_axis {
  KJIT_GEMM_CLUSTER_ALONG_M = 0, /* adjacent m-tiles sharing the weight tile (B) */
  KJIT_GEMM_CLUSTER_ALONG_N = 1  /* adjacent n-tiles sharing the activation tile (A) */
} kjit_gemm_cluster_axis;

/* Grouped GEMM for MoE experts: for each expert e with rows [s_e, t_e) of A,
 * out[s_e:t_e, :] = A[s_e:t_e, :] . W_e (as the layout says), fp32 accumulate,
 * optionally times row_scale[row] (routing weights) in the epilogue.
 * Segments may have any length, 0 included; no padding. The offsets are read
 * on the device (no host synchronisation): offsets that decrease or leave
 * [0, rows] make the launch write nothing and are reported by
 * kjit_device_errors. Rows of A past the last offset are not written.
 * N and K must be multiples of 8; A, W and out 16-byte aligned.
 * The kernel configuration (tile, pipeline) is chosen per arch from the
 * average rows per expert, a few buckets, so a new batch size never
 * compiles; tile_m / tile_n / cluster / cluster_axis override the choice for
 * tuning. With FP8 operands (the fields at the end) the same call runs the
 * W8A8 kernels: wgmma on Hopper, mma.sync with FP8 operands on sm_89 and newer
 * elsewhere; tile_m / tile_n / cluster then name those kernels' tiles. FP8 weights with bf16 activations run
 * the W8A16 kernels (the last fields). */
/* The MoE activation between the two expert GEMMs, on a gate/up pair:
 *   SILU_MUL:   silu(gate) * up, silu(g) = g / (1 + exp(-g));
 *   SWIGLU_OAI: gpt-oss's clamped form: g = min(gate, limit),
 *               u = clamp(up, -limit, limit), (g * sigmoid(alpha g)) * (u + 1).
 * The fp32 arithmetic, operation by operation, is kjit_moe_activation's (below);
 * the grouped GEMM's fused epilogue evaluates the same operations on its fp32
 * accumulators. NaN passes through the clamps, as torch.clamp lets it. */
typedef enum kjit_activation {
  KJIT_ACTIVATION_NONE = 0,
  KJIT_ACTIVATION_SILU_MUL = 1,
  KJIT_ACTIVATION_SWIGLU_OAI = 2
} kjit_activation;

/* Where gate and up lie among a gate_up GEMM's 2I output columns h (its
 * weights' rows): kjit_moe_activation's `layout`, and the checkpoint order of
 * 128 x 128 block-scaled weights under the grouped GEMM's fused activation. */
typedef enum kjit_gate_up_layout {
  KJIT_GATE_UP_UNSET = 0,       /* rejected where a layout is needed */
  KJIT_GATE_UP_HALVES = 1,      /* [gate | up]: gate = h[:, :I], up = h[:, I:] */
  KJIT_GATE_UP_ALTERNATING = 2, /* gate = h[:, 0::2], up = h[:, 1::2] */
  KJIT_GATE_UP_GROUPS_OF_8 = 3  /* kjit_moe_activation only: gate = h[:, 16g + i], up = h[:, 16g + 8 + i] for
                                   output column 8g + i (kjit.gate_up_interleaved's order: a fused-activation
                                   module's stored rows) */
} kjit_gate_up_layout;

typedef struct kjit_grouped_gemm_desc {
  uint32_t struct_size; /* sizeof(kjit_grouped_gemm_desc) */
  kjit_dtype a_dtype;   /* KJIT_DTYPE_BF16, or KJIT_DTYPE_F8_E4M3FN with b_dtype (FP8, below) */
  kjit_dtype b_dtype;   /* KJIT_DTYPE_BF16, KJIT_DTYPE_F8_E4M3FN with a_dtype (W8A8), or FP8 with bf16 A (W8A16) */
  kjit_dtype out_dtype; /* KJIT_DTYPE_BF16 or KJIT_DTYPE_F32 */
  int64_t rows;         /* rows of A and out (the token count; never part of a kernel key) */
  int64_t n;
  int64_t k;
  int64_t experts;
  kjit_weight_layout weights;
  kjit_expert_offsets offsets_convention;
  const void* a;           /* [rows, K] row-major ([tokens, K] with gather, below) */
  const void* b;           /* the stacked weights */
  void* out;               /* [rows, N] row-major */
  const int32_t* offsets;  /* device memory, E or E + 1 entries */
  const float* row_scale;  /* optional device memory [rows] */
  kjit_gemm_kernel kernel; /* KJIT_GEMM_KERNEL_AUTO after _desc_init */
  int32_t tile_m;          /* 0 (default): the heuristic's; else SM90 64 or 128, swap AB 32 to 256 by 32 (the
                              tallest row tile), portable 32 to 128 by 32 */
  int32_t tile_n;          /* 0 (default): the heuristic's; else SM90 64 to 256 by 64, swap AB 64 or 128, portable
                              16 to 128 by 16 */
  int32_t cluster;         /* 0 (default): the heuristic's; SM90: 1, or 2 blocks sharing an operand */
  kjit_gemm_cluster_axis cluster_axis; /* with cluster 2: ALONG_M (default; tile_n 128 or 256; not swap AB) or
                                          ALONG_N (swap AB: N a multiple of 2 tile_n) */
  void* workspace;          /* optional device scratch of kjit_grouped_gemm_workspace_bytes() for the tile
                               counter of the swap-AB kernel (which then hands tiles out on demand; NULL: a static
                               round robin, slower when tile heights differ). kjit zeroes it in the stream before
                               each launch; launches that may run concurrently need separate workspaces. */
  uint64_t workspace_bytes; /* its size */
  /* FP8 (W8A8, DeepSeek's recipe): a_dtype and b_dtype KJIT_DTYPE_F8_E4M3FN, weights KJIT_WEIGHTS_E_N_K, K a
   * multiple of 128. out = sum over 128-column blocks kb of
   * (A[:, kb] . B_e[:, kb]^T) * a_scales[row, kb] * b_scale, accumulated in fp32. Scales are fp32 multipliers
   * (x = code * scale); power-of-two (UE8M0-valued) scales are passed as the fp32 values they are, never made. */
  const float* a_scales; /* device [rows, K / 128] row-major (what kjit_fp8_quantize writes), 4-byte aligned */
  const float* b_scales; /* device: PER_BLOCK [E, ceil(N / 128), K / 128]; PER_ROW [E, N] (per output channel) */
  kjit_scale_granularity b_scale_granularity; /* KJIT_SCALE_PER_BLOCK or KJIT_SCALE_PER_ROW (no default) */
  int64_t b_block_rows; /* PER_BLOCK: the checkpoint's block along N and K, which must be 128 x 128 (stated so */
  int64_t b_block_cols; /* that a checkpoint of another block is an error, not a wrong answer); else 0 */
  /* W8A16 (FP8 weights, bf16 activations, the weights converted inside the kernel's mainloop): a_dtype
   * KJIT_DTYPE_BF16, b_dtype KJIT_DTYPE_F8_E4M3FN or _E5M2, a_scales NULL, N and K multiples of 16. The stored
   * weights are read as `weights` says: a checkpoint's [E, N, K] tensor is KJIT_WEIGHTS_E_N_K for the forward
   * pass (out = A . W_e^T) and the same storage is KJIT_WEIGHTS_E_K_N for the backward pass's dX = dY . W_e
   * (the GEMM's N is then the checkpoint's K). Over the stored [E, R, C] (R, C = N, K or K, N), b_scales are
   * PER_BLOCK [E, ceil(R / 128), ceil(C / 128)] (b_block_rows = b_block_cols = 128), PER_ROW [E, R] (one per
   * stored row: per output channel for E_N_K) or PER_TENSOR [E]. Each weight is converted as kjit_dequant_fp8
   * converts it, w = code * scale (MULTIPLY) or code * (1 / scale) (DIVIDE: the reciprocal rounded to fp32, which
   * may differ from dequant's IEEE division in the last fp32 bit), rounded to nearest-even bf16, and multiplied
   * with A in the bf16 tensor cores with fp32 accumulation. */
  kjit_scale_convention b_scale_convention; /* W8A16: MULTIPLY or DIVIDE (no default). W8A8: UNSET or MULTIPLY.
                                               W4A16: NVFP4's global scale, MULTIPLY or DIVIDE; MXFP4: MULTIPLY */
  /* W4A16 (FP4 weights, bf16 activations): b_dtype KJIT_DTYPE_F4_E2M1, b the stored [E, R, C / 2] bytes of
   * pairs along its rows, read as W8A16's: KJIT_WEIGHTS_E_N_K for the forward pass (N, K = R, C) and
   * KJIT_WEIGHTS_E_K_N for the backward pass's dX (N, K = C, R); R a multiple of 16 and C of 32, b_format NVFP4 or
   * MXFP4, b_block_scales LINEAR [E, R, C / 16] e4m3fn (NVFP4) or [E, R, C / 32] UE8M0 (MXFP4) bytes: gpt-oss's
   * `*_blocks` and `*_scales` as stored; NVFP4 also b_global_scales fp32 [E]. b_scales, b_scale_granularity and
   * b_block_rows/cols stay unset. Each weight enters the bf16 tensor cores as e2m1 x group scale (exact in bf16:
   * MXFP4's is kjit_dequant_mx's value), with fp32 accumulation; NVFP4's global scale then multiplies each
   * expert's fp32 sums (DIVIDE: times its fp32 reciprocal, as W8A16), before the activation, row scale and
   * rounding to the output. So NVFP4 products carry no rounding of the weights (kjit_dequant_mx rounds each
   * e2m1 x scale x global to the output type): results differ from dequant + bf16 GEMM within the GEMM's
   * tolerance, and are closer to the exact product. */
  kjit_block_format b_format;     /* W4A16 only (else UNSET) */
  const uint8_t* b_block_scales;  /* W4A16 only, device */
  const float* b_global_scales;   /* W4A16 NVFP4 only, device [E] */
  /* A fused activation (bf16 A; bf16 B, or W8A16 / W4A16 with KJIT_WEIGHTS_E_N_K; not W8A8): the weights' N rows
   * are gate/up groups of 8, gate rows 8g..8g+7 at rows 16g..16g+7 and up rows 8g..8g+7 at 16g+8..16g+15 of each
   * expert (kjit.gate_up_interleaved in Python builds this order from the halves or alternating layouts once, at
   * load), N a multiple of 16, and out is [rows, N / 2]: out[:, 8g + i] = activation(h[:, 16g + i],
   * h[:, 16g + 8 + i]) of the product h, then times row_scale. Scales that follow the rows (PER_ROW, FP4 block
   * scales) are reordered with them. W8A16 PER_BLOCK 128 x 128 scales, which the groups would split, stay as the
   * checkpoint stores them, [E, ceil(N / 128), ceil(K / 128)] over the original row order, and
   * activation_gate_up_layout names that order (HALVES: gate rows [0, N / 2), up [N / 2, N); ALTERNATING: gate
   * rows 0::2, up 1::2): reordered row 16g + i then takes the scales of original gate row 8g + i (HALVES) or
   * 2 (8g + i) (ALTERNATING), and row 16g + 8 + i those of up row N / 2 + 8g + i or 2 (8g + i) + 1. Any N
   * that is a multiple of 16 (so, for HALVES, any I = N / 2 that is a multiple of 8, 128 or not), both kernels.
   * Saves the gate_up output's write and re-read and a launch. */
  kjit_activation activation;  /* KJIT_ACTIVATION_NONE after _desc_init */
  float activation_alpha;      /* SWIGLU_OAI: 1.702 after _desc_init */
  float activation_limit;      /* SWIGLU_OAI: 7.0 after _desc_init */
  kjit_gate_up_layout activation_gate_up_layout; /* UNSET after _desc_init; required (HALVES or ALTERNATING)
                                                    with an activation and W8A16 PER_BLOCK scales, and UNSET
                                                    everywhere else */
  /* Gather (bf16 A: the bf16, W8A16 and W4A16 GEMMs; W8A8 gathers in kjit_fp8_quantize): with top_k >= 1 and
   * sorted_to_flat, row r of the GEMM's A is row sorted_to_flat[r] / top_k of `a`, which is [tokens, K]: the
   * permutation kjit_moe_routing writes, read by the kernels' loads, so routing -> GEMM makes no gathered copy of
   * the activations. `rows` stays the GEMM's (out's) row count. A negative entry (-1: past the routed rows) reads
   * zeros; an entry at or past tokens * top_k reads zeros and is reported by kjit_device_errors. */
  const int32_t* sorted_to_flat; /* gather only: device [rows], 4-byte aligned; NULL without */
  int64_t tokens;                /* gather only: rows of `a` */
  int64_t top_k;                 /* 0 (after _desc_init): no gather; >= 1: gather, sorted_to_flat required */
  /* Addend (bf16 A and B only; not with a fused activation): out = A . W_e (times row_scale) + addend, the sum
   * taken in fp32 and rounded once to out_dtype; `addend` is [rows, N] row-major, 16-byte aligned, of
   * addend_dtype, and may be `out` itself (each element is read before it is written). Rows past the last offset
   * are neither read nor written. For a LoRA branch's product (K = its rank) summed into its base GEMM's fp32
   * output, or into a bf16 gradient: no pass of its own, one rounding. */
  const void* addend;      /* NULL (after _desc_init): none */
  kjit_dtype addend_dtype; /* with addend: KJIT_DTYPE_BF16 or KJIT_DTYPE_F32; KJIT_DTYPE_INVALID without */
} kjit_grouped_gemm_desc;

KJIT_API void kjit_grouped_gemm_desc_init(kjit_grouped_gemm_desc* desc);
/* The workspace a grouped GEMM can use (see kjit_grouped_gemm_desc.workspace). */
KJIT_API uint64_t kjit_grouped_gemm_workspace_bytes(void);
KJIT_API kjit_status kjit_grouped_gemm(const kjit_grouped_gemm_desc* desc, kjit_stream stream);
/* Compiles (or finds) and loads the kernel `desc` needs on `device`; pointers unused. */
KJIT_API kjit_status kjit_grouped_gemm_prepare(const kjit_grouped_gemm_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_grouped_gemm_check(const kjit_grouped_gemm_desc* desc);

/* MoE routing helpers, on the device and CUDA-graph safe.
 *
 * kjit_moe_routing: from top-k global expert ids [tokens, top_k], for the
 * experts this rank owns ([expert_base, expert_base + experts_local); all of
 * them without expert parallelism): per-expert counts, offsets in the chosen
 * convention, sorted_to_flat (for each row of the expert-sorted order, the flat
 * index t * top_k + j it came from; -1 past the routed rows) and flat_to_sorted
 * (the sorted row of each (t, j); -1 when routed to another rank, never an
 * index). Within an expert, rows keep the order of their flat index, so the
 * result is reproducible. Global ids outside [0, experts_total) make the launch
 * write nothing and are reported by kjit_device_errors. Every output array is
 * sized by tokens * top_k, known to the host: no sync is needed.
 * Without a workspace routing runs in one thread block: fast for decode and
 * mid-size prefill, slower than a torch sort past ~70k routed ids (H100).
 * With a workspace of kjit_moe_routing_workspace_bytes (device memory of the
 * same device, 4-byte aligned, contents irrelevant), batches of more ids than
 * one block takes run over many blocks, with the same result. */
typedef struct kjit_moe_routing_desc {
  uint32_t struct_size; /* sizeof(kjit_moe_routing_desc) */
  int64_t tokens;
  int64_t top_k;
  int64_t experts_total;
  int64_t expert_base;
  int64_t experts_local; /* 1 to 4096 */
  kjit_expert_offsets offsets_convention;
  const int32_t* topk_ids;  /* device [tokens * top_k] */
  int32_t* counts;          /* device [experts_local] */
  int32_t* offsets;         /* device [experts_local] or [experts_local + 1] */
  int32_t* sorted_to_flat;  /* device [tokens * top_k] */
  int32_t* flat_to_sorted;  /* device [tokens * top_k] */
  void* workspace;          /* optional device scratch (NULL: one block) */
  uint64_t workspace_bytes; /* its size: at least kjit_moe_routing_workspace_bytes(...) */
} kjit_moe_routing_desc;

/* kjit_moe_combine: out[t, :] = sum over j of topk_weights[t, j] *
 * expert_out[flat_to_sorted[t * top_k + j], :], skipping -1 (rows of other
 * ranks), accumulated in fp32 in order of j, rounded once.
 *
 * The weights' gradient (backward pass; `grad` given): grad is the gradient of
 * out, bf16 [tokens, hidden], and out receives fp32 [tokens, top_k] with
 * out[t, j] = sum over h of grad[t, h] * expert_out[row, h] (row =
 * flat_to_sorted[t * top_k + j]; +0 for -1), out_dtype KJIT_DTYPE_F32,
 * topk_weights NULL. The order, fixed: partial sums s_l for l = 0..31, s_l
 * fma'ing (each one fma rounded once) the products of columns 8c .. 8c + 7 in
 * order for c = l, l + 32, ... below hidden / 8, in order of c; then for d =
 * 16, 8, 4, 2, 1 every s_l becomes s_l + s_(l xor d) (fp32 adds), and the
 * result is s_0. Bit-exact with kjit/reference/moe_routing.hpp's
 * moe_combine_weight_gradient. */
typedef struct kjit_moe_combine_desc {
  uint32_t struct_size; /* sizeof(kjit_moe_combine_desc) */
  int64_t tokens;
  int64_t top_k;        /* 1 to 32 */
  int64_t hidden;       /* a multiple of 8 */
  int64_t rows;         /* rows of expert_out */
  kjit_dtype in_dtype;  /* KJIT_DTYPE_BF16 */
  kjit_dtype out_dtype; /* KJIT_DTYPE_BF16 or KJIT_DTYPE_F32 */
  const void* expert_out;       /* device [rows, hidden], 16-byte aligned */
  const float* topk_weights;    /* device [tokens * top_k] */
  const int32_t* flat_to_sorted; /* device [tokens * top_k] */
  void* out;                    /* device [tokens, hidden], 16-byte aligned ([tokens, top_k] fp32 with grad) */
  const void* grad;             /* the weights' gradient only: device bf16 [tokens, hidden], 16-byte aligned;
                                   NULL (after _desc_init): the combine */
} kjit_moe_combine_desc;

/* kjit_moe_dispatch, the combine's transpose: out[flat_to_sorted[t * top_k +
 * j], :] = x[t, :] for every (t, j) routed to this rank (-1 skipped): the
 * tokens' rows in expert-sorted order, as the grouped GEMMs read them, each
 * token's row read once. out is [tokens * top_k, hidden] (the routing's row
 * count); with valid_rows (a device int32 holding the routed row count, e.g.
 * the offsets' last entry) the rows from it on are zeroed, without it they are
 * left as they were. bf16 only; an index at or past tokens * top_k writes
 * nothing for its pair and is reported by kjit_device_errors. */
typedef struct kjit_moe_dispatch_desc {
  uint32_t struct_size; /* sizeof(kjit_moe_dispatch_desc) */
  int64_t tokens;
  int64_t top_k;        /* 1 to 32 */
  int64_t hidden;       /* a multiple of 8 */
  kjit_dtype dtype;     /* KJIT_DTYPE_BF16 (x and out) */
  const void* x;                 /* device [tokens, hidden], 16-byte aligned */
  const int32_t* flat_to_sorted; /* device [tokens * top_k] */
  const int32_t* valid_rows;     /* optional device int32 [1]: the routed row count (NULL: no rows zeroed) */
  void* out;                     /* device [tokens * top_k, hidden], 16-byte aligned */
} kjit_moe_dispatch_desc;

KJIT_API void kjit_moe_routing_desc_init(kjit_moe_routing_desc* desc);
KJIT_API kjit_status kjit_moe_routing(const kjit_moe_routing_desc* desc, kjit_stream stream);
KJIT_API kjit_status kjit_moe_routing_prepare(const kjit_moe_routing_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_moe_routing_check(const kjit_moe_routing_desc* desc);
/* The workspace kjit_moe_routing can use for tokens * top_k ids and
 * experts_local experts; 0 when one block takes them all anyway. */
KJIT_API uint64_t kjit_moe_routing_workspace_bytes(int64_t tokens, int64_t top_k, int64_t experts_local);
KJIT_API void kjit_moe_combine_desc_init(kjit_moe_combine_desc* desc);
KJIT_API kjit_status kjit_moe_combine(const kjit_moe_combine_desc* desc, kjit_stream stream);
KJIT_API kjit_status kjit_moe_combine_prepare(const kjit_moe_combine_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_moe_combine_check(const kjit_moe_combine_desc* desc);
KJIT_API void kjit_moe_dispatch_desc_init(kjit_moe_dispatch_desc* desc);
KJIT_API kjit_status kjit_moe_dispatch(const kjit_moe_dispatch_desc* desc, kjit_stream stream);
KJIT_API kjit_status kjit_moe_dispatch_prepare(const kjit_moe_dispatch_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_moe_dispatch_check(const kjit_moe_dispatch_desc* desc);

/* What an fp8 quantize scale is. No default, on purpose. */
typedef enum kjit_quant_scale_format {
  KJIT_QUANT_SCALE_UNSET = 0, /* rejected */
  KJIT_QUANT_SCALE_FP32 = 1,  /* scale = amax / 448 */
  KJIT_QUANT_SCALE_UE8M0 = 2  /* scale = amax / 448 rounded up to a power of two (stored as fp32) */
} kjit_quant_scale_format;

/* kjit_fp8_quantize: bf16 activations -> e4m3fn codes out[rows, K] and fp32
 * scales[rows, K / 128] (row-major: scales[r * K / 128 + g] covers columns
 * [128 g, 128 g + 128) of row r), the DeepSeek / vLLM per-token-group recipe,
 * so that x ~= code * scale. For each group of 128 values x (exactly, in fp32):
 *   amax  = max |x|, clamped below to 1e-10f
 *   scale = amax / 448.0f (one IEEE fp32 division, round to nearest even);
 *           UE8M0: then rounded up to a power of two (2^ceil(log2(scale)),
 *           exact on scale's bits: unchanged when its mantissa is zero)
 *   code  = cvt.rn.satfinite.e4m3 of (x / scale) (one IEEE fp32 division per
 *           value; nearest even; beyond +-448 saturates to +-448)
 * An all-zero group gives codes 0 (0x80 for -0.0) and scale 1e-10f / 448.0f
 * (UE8M0: its power of two, 2^-42). A group holding any inf or NaN gets scale
 * NaN (0x7FC00000) and every code NaN (0x7F). The result is bit-exact with
 * kjit/reference/fp8_quantize.hpp.
 *
 * Gather (top_k >= 1, with sorted_to_flat): output row r reads input row
 * sorted_to_flat[r] / top_k (the permutation kjit_moe_routing writes, device
 * int32 [rows]), so routing -> quantize -> grouped GEMM needs no copy. A
 * negative entry (-1: past the routed rows) gives zero codes and scale 0; an
 * entry at or past tokens * top_k does the same and is reported by
 * kjit_device_errors. Without gather, input row r is output row r. */
typedef struct kjit_fp8_quantize_desc {
  uint32_t struct_size; /* sizeof(kjit_fp8_quantize_desc) */
  kjit_dtype in_dtype;  /* KJIT_DTYPE_BF16 */
  kjit_dtype out_dtype; /* KJIT_DTYPE_F8_E4M3FN */
  int64_t rows;         /* output rows (and input rows without gather); 0 launches nothing */
  int64_t k;            /* columns: a multiple of 128 */
  int64_t group;        /* columns per scale: 128 (set by _desc_init; the only size) */
  kjit_quant_scale_format scale_format;
  int64_t in_row_stride; /* elements between input rows: 0 = k; otherwise >= k and a multiple of 8 */
  const void* in;        /* device bf16 [input rows, in_row_stride], 16-byte aligned */
  void* out;             /* device e4m3fn [rows, k], 16-byte aligned */
  float* scales;         /* device fp32 [rows, k / 128], 4-byte aligned */
  const int32_t* sorted_to_flat; /* gather only: device [rows] (see above); NULL without */
  int64_t tokens;        /* gather only: input rows */
  int64_t top_k;         /* 0 (after _desc_init): no gather; >= 1: gather, sorted_to_flat required */
} kjit_fp8_quantize_desc;

KJIT_API void kjit_fp8_quantize_desc_init(kjit_fp8_quantize_desc* desc);
/* Quantises on `stream`, like kjit_dequant_fp8 (no compile while capturing). */
KJIT_API kjit_status kjit_fp8_quantize(const kjit_fp8_quantize_desc* desc, kjit_stream stream);
/* Compiles (or finds) and loads the kernel `desc` needs on `device`; pointers unused. */
KJIT_API kjit_status kjit_fp8_quantize_prepare(const kjit_fp8_quantize_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_fp8_quantize_check(const kjit_fp8_quantize_desc* desc);

/* kjit_dequant_mx: MX-format weights -> bf16/fp16/fp32 out[E, rows, k] (or
 * out[i] = dequant(expert expert_ids[i]) with the "only these experts" form,
 * as kjit_dequant_fp8). Bit-exact with kjit/reference/fp4_mx.hpp: the fp32
 * value above, rounded once to nearest-even bf16/fp16 (fp32 out: as is).
 * Indexing is 64-bit: stacks past 2^31 elements are fine. */
typedef struct kjit_mx_dequant_desc {
  uint32_t struct_size;           /* sizeof(kjit_mx_dequant_desc) */
  kjit_block_format format;
  kjit_dtype element_dtype;       /* MXFP8: KJIT_DTYPE_F8_E4M3FN or _E5M2; FP4 formats: KJIT_DTYPE_INVALID */
  kjit_dtype out_dtype;           /* KJIT_DTYPE_BF16, _F16 or _F32 */
  int64_t experts;                /* 1 for a plain 2-D tensor */
  int64_t rows;                   /* rows per expert */
  int64_t k;                      /* elements per row: a multiple of the format's block (16 or 32) */
  int64_t in_row_stride;          /* BYTES between rows of `in`: 0 = k / 2 (FP4) or k (MXFP8) */
  int64_t out_row_stride;         /* elements between rows of `out`: 0 = k (FP4: even, and `out` aligned to two
                                     elements: a packed byte's pair is stored together) */
  kjit_scale_layout scale_layout;
  const void* in;                 /* device: packed pairs or fp8 codes, expert e at e * rows * in_row_stride */
  const uint8_t* scales;          /* device: e4m3fn (NVFP4) or UE8M0 bytes, in scale_layout */
  const float* global_scales;     /* NVFP4 only: device fp32 [experts]; NULL for MX formats */
  kjit_scale_convention global_scale_convention; /* NVFP4: MULTIPLY or DIVIDE (no default); MX: UNSET */
  void* out;                      /* device */
  const int32_t* expert_ids;      /* optional device int32 [num_expert_ids], checked on the device */
  int64_t num_expert_ids;         /* > 0 exactly when expert_ids != NULL */
} kjit_mx_dequant_desc;

KJIT_API void kjit_mx_dequant_desc_init(kjit_mx_dequant_desc* desc);
KJIT_API kjit_status kjit_dequant_mx(const kjit_mx_dequant_desc* desc, kjit_stream stream);
/* Loads every kernel a launch of `desc`'s shapes may need, whatever its
 * pointers' alignment, as kjit_dequant_fp8_prepare. */
KJIT_API kjit_status kjit_dequant_mx_prepare(const kjit_mx_dequant_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_dequant_mx_check(const kjit_mx_dequant_desc* desc);

/* How kjit_quantize_mx gets NVFP4's global scale. No default. */
typedef enum kjit_global_scale_mode {
  KJIT_GLOBAL_SCALE_UNSET = 0,   /* rejected (and the only value allowed for the MX formats) */
  KJIT_GLOBAL_SCALE_GIVEN = 1,   /* read from global_scales[e] */
  /* computed on the device in the same stream (no host synchronisation, so a capturable call): per expert,
   * global = amax / (448 * 6) as a MULTIPLY or (448 * 6) / amax as a DIVIDE (one IEEE fp32 operation), amax
   * over the expert's FINITE values (NaN and inf mark only their own blocks, with NaN scales); an expert with
   * no finite non-zero value gets 1.0f. Written to global_scales[e] before the quantize pass reads it (with
   * rows 0 nothing is launched and global_scales is left as it was) */
  KJIT_GLOBAL_SCALE_COMPUTE = 2
} kjit_global_scale_mode;

/* kjit_quantize_mx: bf16 [E, rows, k] -> packed pairs / fp8 codes and scale
 * bytes in scale_layout, bit-exact with kjit/reference/fp4_mx.hpp's block
 * quantizers (NVFP4: scale = e4m3(amax / 6 / global) for MULTIPLY, ...; MX:
 * the OCP MX v1.0 shared exponent). A swizzled layout's padding bytes are
 * written with 0 (so the buffer holds no stale bytes). */
typedef struct kjit_mx_quantize_desc {
  uint32_t struct_size;           /* sizeof(kjit_mx_quantize_desc) */
  kjit_block_format format;
  kjit_dtype in_dtype;            /* KJIT_DTYPE_BF16 */
  kjit_dtype element_dtype;       /* MXFP8: KJIT_DTYPE_F8_E4M3FN or _E5M2; FP4 formats: KJIT_DTYPE_INVALID */
  int64_t experts;                /* 1 for a plain 2-D tensor */
  int64_t rows;                   /* rows per expert; 0 launches nothing */
  int64_t k;                      /* a multiple of the format's block */
  int64_t in_row_stride;          /* elements between input rows: 0 = k */
  kjit_scale_layout scale_layout;
  const void* in;                 /* device bf16 */
  void* out;                      /* device packed [E, rows, k / 2] (FP4) or codes [E, rows, k] (MXFP8) */
  uint8_t* scales;                /* device scale bytes in scale_layout */
  float* global_scales;           /* NVFP4: device fp32 [experts], read (GIVEN) or written (COMPUTE); else NULL */
  kjit_global_scale_mode global_scale_mode;      /* NVFP4: GIVEN or COMPUTE; MX: UNSET */
  kjit_scale_convention global_scale_convention; /* NVFP4: MULTIPLY or DIVIDE; MX: UNSET */
} kjit_mx_quantize_desc;

KJIT_API void kjit_mx_quantize_desc_init(kjit_mx_quantize_desc* desc);
KJIT_API kjit_status kjit_quantize_mx(const kjit_mx_quantize_desc* desc, kjit_stream stream);
KJIT_API kjit_status kjit_quantize_mx_prepare(const kjit_mx_quantize_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_quantize_mx_check(const kjit_mx_quantize_desc* desc);

/* kjit_convert_scale_layout: scale bytes LINEAR <-> SWIZZLED_128X4 for a
 * stack of experts, so no caller hand-rolls the swizzle. Expert e has
 * rows_e rows: `rows` each (offsets NULL), or the segments of device int32
 * `offsets` in offsets_convention (activations sorted by expert; read on the
 * device, no host synchronisation; bad offsets write nothing and are reported
 * by kjit_device_errors). Swizzled padding bytes are written with `pad`. The
 * output's size: LINEAR sum rows_e * scale_cols; SWIZZLED the sum above,
 * at most kjit_swizzled_scale_bytes(total rows, scale_cols, experts). */
typedef struct kjit_scale_layout_desc {
  uint32_t struct_size; /* sizeof(kjit_scale_layout_desc) */
  kjit_scale_layout from;
  kjit_scale_layout to; /* the other one */
  int64_t experts;
  int64_t rows;         /* rows per expert (offsets NULL), or the total rows (offsets given) */
  int64_t scale_cols;   /* scale bytes per row: K / block */
  const int32_t* offsets;                /* optional device int32, E or E + 1 entries */
  kjit_expert_offsets offsets_convention; /* with offsets */
  uint8_t pad;          /* the byte written into a swizzled layout's padding */
  const uint8_t* in;    /* device */
  uint8_t* out;         /* device; may not overlap in */
  uint64_t out_bytes;   /* the size of out, checked against what the layout can need */
} kjit_scale_layout_desc;

KJIT_API void kjit_scale_layout_desc_init(kjit_scale_layout_desc* desc);
KJIT_API kjit_status kjit_convert_scale_layout(const kjit_scale_layout_desc* desc, kjit_stream stream);
KJIT_API kjit_status kjit_convert_scale_layout_prepare(const kjit_scale_layout_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_convert_scale_layout_check(const kjit_scale_layout_desc* desc);
/* The largest swizzled size a stack of `experts` experts holding `total_rows` rows in all can need (each
 * expert's rows padded up to 128; at most min(experts, total_rows) experts hold rows): (total_rows + 127 *
 * min(experts, total_rows)) rounded down to a multiple of 128, times round_up(scale_cols, 4). 0 for negative
 * arguments. */
KJIT_API uint64_t kjit_swizzled_scale_bytes(int64_t total_rows, int64_t scale_cols, int64_t experts);

/* kjit_moe_activation: the activation between an MoE layer's two grouped
 * GEMMs, in one pass. h is the gate_up GEMM's bf16 output [rows, 2I]; per row
 * r and output column c, with gate g and up u taken from h as `layout` says:
 *   HALVES (Hugging Face):    g = h[r, c],      u = h[r, I + c]
 *   ALTERNATING (gpt-oss):    g = h[r, 2c],     u = h[r, 2c + 1]
 *   GROUPS_OF_8:              g = h[r, 16 (c / 8) + c % 8], u = that + 8
 * the activation in fp32, every operation one IEEE fp32 operation rounded to
 * nearest even, in this order:
 *   SILU_MUL:   out = (g / (1 + exp(-g))) * u
 *   SWIGLU_OAI: g = min(g, limit); u = clamp(u, -limit, limit) (NaN passes
 *               through both); out = (g * (1 / (1 + exp(-(alpha * g))))) * (u + 1)
 * where exp is kjit's own fp32 e^x, within 0.92 ulp of the exact value (not
 * expf, whose last bits vary with the toolkit): x clamped to [-104, 89] (NaN
 * passes through), n = rint(x * 0x1.715476p+0f), r = fma(-n, 0x1.7f7d1cp-20f,
 * fma(-n, 0x1.62e4p-1f, x)), p = Horner by fma of the degree-7 Taylor
 * polynomial (coefficients 1/k! rounded to fp32), e^x = p * 2^n rounded once.
 * Then out is rounded once to bf16 (out_dtype KJIT_DTYPE_BF16: [rows, I]), or
 * (out_dtype KJIT_DTYPE_F8_E4M3FN) that bf16 value is quantized exactly as
 * kjit_fp8_quantize quantizes a bf16 row: e4m3fn codes [rows, I] and fp32
 * scales [rows, I / 128] row-major, the A operand and a_scales of the W8A8
 * grouped GEMM as they are, bit-identical to this call's bf16 output followed
 * by kjit_fp8_quantize. A NaN output is NaN (its bf16 bits unspecified); with
 * FP8 output its group gets scale NaN and NaN codes, as kjit_fp8_quantize.
 * kjit/reference/moe_activation.hpp evaluates the same operations: the
 * results are bit-exact with it.
 *
 * valid_rows (optional, device int32, e.g. the last of the routing's
 * cumulative end offsets): rows at or past *valid_rows are not read and are
 * written as zeros (bf16 0; FP8 codes 0 and scale 0), so a buffer's padding
 * rows carry no stale data. NULL: every row is computed.
 *
 * The gradient (backward pass; `grad` given): grad is the gradient d of the
 * activation's output, bf16 [rows, I] row-major, and out receives the gradient
 * of h, bf16 [rows, 2I] row-major in h's layout (out_dtype KJIT_DTYPE_BF16,
 * scale_format UNSET, scales NULL). Per row and column, with g, u as above
 * and d = grad[r, c], in fp32 (every operation rounded to nearest even, fma
 * rounded once, exp as above), each result rounded once to bf16:
 *   SILU_MUL:   den = 1 + exp(-g); s = 1 / den; d_u = d * (g / den);
 *               d_g = (d * u) * (s * fma(g, 1 - s, 1))
 *   SWIGLU_OAI: g' = min(g, limit); u' = clamp(u, -limit, limit); z = alpha * g';
 *               s = 1 / (1 + exp(-z));
 *               d_u = d * (g' * s) where -limit < u < limit, else 0;
 *               d_g = (d * (u' + 1)) * (s * fma(z, 1 - s, 1)) where g < limit, else 0
 * (the clamps pass no gradient at or past their bounds, nor does a NaN gate
 * or up). valid_rows as for the forward (rows past it get zero gradients).
 * Bit-exact with kjit/reference/moe_activation.hpp's moe_activation_gradient. */

typedef struct kjit_moe_activation_desc {
  uint32_t struct_size;   /* sizeof(kjit_moe_activation_desc) */
  kjit_dtype in_dtype;    /* KJIT_DTYPE_BF16 (set by _desc_init) */
  kjit_dtype out_dtype;   /* KJIT_DTYPE_BF16 or KJIT_DTYPE_F8_E4M3FN (no default) */
  kjit_activation activation; /* SILU_MUL or SWIGLU_OAI (NONE after _desc_init: rejected) */
  kjit_gate_up_layout layout;
  int64_t rows;           /* rows of h and out (never part of a kernel key); 0 launches nothing */
  int64_t intermediate;   /* I: a multiple of 8 (bf16 out) or 128 (FP8 out) */
  int64_t in_row_stride;  /* elements between rows of h: 0 = 2I; otherwise >= 2I and a multiple of 8 */
  float alpha;            /* SWIGLU_OAI: finite (1.702 after _desc_init); ignored by SILU_MUL */
  float limit;            /* SWIGLU_OAI: > 0, may be +inf (7.0 after _desc_init); ignored by SILU_MUL */
  kjit_quant_scale_format scale_format; /* FP8 out: FP32 or UE8M0 (no default); bf16 out: UNSET */
  const void* in;         /* device bf16 h, 16-byte aligned */
  void* out;              /* device [rows, I] bf16 or e4m3fn, 16-byte aligned */
  float* scales;          /* FP8 out: device fp32 [rows, I / 128], 4-byte aligned; bf16 out: NULL */
  const int32_t* valid_rows; /* optional device int32 (see above) */
  const void* grad;       /* the gradient only: device bf16 [rows, I], 16-byte aligned; NULL (after _desc_init): the
                             forward */
} kjit_moe_activation_desc;

KJIT_API void kjit_moe_activation_desc_init(kjit_moe_activation_desc* desc);
/* Runs on `stream`, like kjit_dequant_fp8 (no compile while capturing). */
KJIT_API kjit_status kjit_moe_activation(const kjit_moe_activation_desc* desc, kjit_stream stream);
/* Compiles (or finds) and loads the kernel `desc` needs on `device`; pointers unused. */
KJIT_API kjit_status kjit_moe_activation_prepare(const kjit_moe_activation_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_moe_activation_check(const kjit_moe_activation_desc* desc);

/* kjit_grouped_gemm_wgrad: the weight gradient of a grouped GEMM (MoE
 * experts' dW), K-grouped: for each expert e with rows [s_e, t_e),
 *   out[e, n, k] = sum over r in [s_e, t_e) of dy[r, n] * x[r, k]
 * i.e. dW_e = dY_e^T . X_e, an N x K matrix (out is [E, N, K]: the layout
 * KJIT_WEIGHTS_E_N_K reads). dy is bf16 [rows, N] and x bf16 [rows, K], both
 * row-major, rows sorted by expert; offsets are the grouped GEMM's, in either
 * convention, read on the device (no host synchronisation): offsets that
 * decrease or leave [0, rows] make the launch write nothing and are reported
 * by kjit_device_errors. Products are exact in fp32 and summed in fp32, each
 * output element by one thread block over its expert's rows in ascending
 * order, so runs are bit-identical; out is fp32, or bf16 rounded once (to
 * nearest even) from the fp32 sum. Every element of out is written: an empty
 * expert's matrix is zeros (rows = 0 included). Rows past the last offset are
 * never read. N and K must be multiples of 8; dy, x and out 16-byte aligned.
 * Capturable in a CUDA graph. Callers: MoE training's expert dW (gate_up:
 * dy = dH [rows, 2I], x = the gathered hidden states [rows, H]; down: dy
 * [rows, H], x the activation [rows, I]) and LoRA adapters' dA / dB. */
typedef struct kjit_grouped_gemm_wgrad_desc {
  uint32_t struct_size;   /* sizeof(kjit_grouped_gemm_wgrad_desc) */
  kjit_dtype dy_dtype;    /* KJIT_DTYPE_BF16 (set by _desc_init) */
  kjit_dtype x_dtype;     /* KJIT_DTYPE_BF16 (set by _desc_init) */
  kjit_dtype out_dtype;   /* KJIT_DTYPE_F32 (set by _desc_init) or KJIT_DTYPE_BF16 */
  int64_t rows;           /* rows of dy and x (never part of a kernel key); 0 writes zeros */
  int64_t n;              /* columns of dy: rows of each out[e] */
  int64_t k;              /* columns of x: columns of each out[e] */
  int64_t experts;        /* E: 1 to 4096 */
  kjit_expert_offsets offsets_convention; /* CUMULATIVE_END (E entries) or WITH_LEADING_ZERO (E + 1); no default */
  const void* dy;         /* device [rows, N] bf16; may be NULL when rows is 0 */
  const void* x;          /* device [rows, K] bf16; may be NULL when rows is 0 */
  void* out;              /* device [E, N, K] fp32 or bf16 */
  const int32_t* offsets; /* device int32, 4-byte aligned */
  kjit_gemm_kernel kernel; /* KJIT_GEMM_KERNEL_AUTO (after _desc_init): on sm_90 the wgmma kernel when N and K are
                              both >= 128, else the portable mma.sync kernel (sm_80 and newer); _PORTABLE: that one
                              anywhere; _SM90: the wgmma kernel at any N and K (KJIT_ERROR_UNSUPPORTED off sm_90).
                              The two sum in different orders: each is bit-stable, they differ in the last bits */
} kjit_grouped_gemm_wgrad_desc;

KJIT_API void kjit_grouped_gemm_wgrad_desc_init(kjit_grouped_gemm_wgrad_desc* desc);
/* Runs on `stream` (no compile while capturing). */
KJIT_API kjit_status kjit_grouped_gemm_wgrad(const kjit_grouped_gemm_wgrad_desc* desc, kjit_stream stream);
/* Compiles (or finds) and loads the kernel `desc` needs on `device`; pointers unused. */
KJIT_API kjit_status kjit_grouped_gemm_wgrad_prepare(const kjit_grouped_gemm_wgrad_desc* desc, int device);
/* Its checks without pointers, host only, as kjit_dequant_fp8_check. */
KJIT_API kjit_status kjit_grouped_gemm_wgrad_check(const kjit_grouped_gemm_wgrad_desc* desc);

/* Reads and clears the errors kernels have recorded on `device` (for example
 * an expert id out of range). Synchronises that device. Returns KJIT_OK when
 * none were recorded, else KJIT_ERROR_DEVICE_REPORTED with the message. */
KJIT_API kjit_status kjit_device_errors(int device);

/* The message of the last failure on this thread ("" if none). The pointer
 * stays valid until the next kjit call on the same thread. */
KJIT_API const char* kjit_last_error_message(void);

/* A constant name for a status, e.g. "KJIT_ERROR_INVALID_ARGUMENT". */
KJIT_API const char* kjit_status_name(kjit_status status);

/* Number of GPUs the driver reports, 0 when no driver or no GPU. */
KJIT_API kjit_status kjit_device_count(int* count);

/* kjit's version string, e.g. "0.1.0". */
KJIT_API const char* kjit_version(void);

/* Log messages (a cache root skipped, a kernel compiled, what each cache
 * lookup found) are lines on stderr, "kjit: warning: ...", filtered by the
 * environment variable KJIT_LOG (error, warn, info, debug; default warn). */
typedef enum kjit_log_level {
  KJIT_LOG_ERROR = 0,
  KJIT_LOG_WARN = 1,
  KJIT_LOG_INFO = 2,
  KJIT_LOG_DEBUG = 3
} kjit_log_level;

/* Receives one message: its level (a kjit_log_level), the text (no prefix, no
 * newline; valid during the call only) and the user_data given with it. It may
 * be called from any thread that calls kjit, and must not call kjit. */
typedef void (*kjit_log_callback)(int level, const char* message, void* user_data);

/* Sends every message of max_level and below (KJIT_LOG_WARN: errors and
 * warnings) to `callback` instead of stderr; KJIT_LOG is then not consulted.
 * NULL restores stderr under KJIT_LOG. Process-wide; the Python module points
 * it at logging.getLogger("kjit"). */
KJIT_API void kjit_set_log_callback(kjit_log_callback callback, void* user_data, int max_level);

#ifdef __cplusplus
}
#endif
#endif /* KJIT_KJIT_H */
