/* Every code a kjit kernel can leave in its device's error words
 * (device_error[0] = code, device_error[1] = the offending value), beside the
 * message kjit_device_errors reports for it ({device}: the device ordinal,
 * {value}: device_error[1] read as a signed 32-bit integer). One list for the
 * kernels and the host, so codes and messages cannot drift apart; a code's
 * value never changes. Plain C (NVRTC, no headers). */
#ifndef KJIT_ABI_DEVICE_ERRORS_H
#define KJIT_ABI_DEVICE_ERRORS_H

#define KJIT_DEVICE_ERRORS(X)                                                                                        \
  X(EXPERT_ID_OUT_OF_RANGE, 1,                                                                                       \
    "a dequant launch on device {device} was given expert id {value} outside [0, experts); it wrote nothing")        \
  X(OFFSETS_NOT_MONOTONIC, 2,                                                                                        \
    "a grouped GEMM on device {device} was given expert offsets that decrease at expert {value}; it wrote nothing")  \
  X(OFFSETS_OUT_OF_RANGE, 3,                                                                                         \
    "a grouped GEMM on device {device} was given an offset for expert {value} outside [0, rows] (or a first offset " \
    "that is not 0); it wrote nothing")                                                                              \
  X(GLOBAL_EXPERT_ID_OUT_OF_RANGE, 4,                                                                                \
    "MoE routing on device {device} was given expert id {value} outside [0, experts_total); it wrote nothing")       \
  X(COMBINE_INDEX_OUT_OF_RANGE, 5,                                                                                   \
    "MoE combine or dispatch on device {device} was given sorted row {value} past the expert-sorted rows; that "    \
    "pair was left out")                                                                                             \
  X(QUANTIZE_INDEX_OUT_OF_RANGE, 6,                                                                                  \
    "an fp8 quantize gather on device {device} was given flat index {value} past tokens * top_k; that row was "      \
    "written as zeros")                                                                                         \
  X(SCALE_OFFSETS_NOT_MONOTONIC, 7,                                                                                  \
    "a scale-layout conversion on device {device} was given expert offsets that decrease at expert {value}; it "    \
    "wrote nothing")                                                                                                 \
  X(SCALE_OFFSETS_OUT_OF_RANGE, 8,                                                                                   \
    "a scale-layout conversion on device {device} was given an offset for expert {value} outside [0, rows] (or a "  \
    "first offset that is not 0); it wrote nothing")                                                   \
  X(GEMM_GATHER_INDEX_OUT_OF_RANGE, 9,                                                                               \
    "a grouped GEMM gather on device {device} was given flat index {value} past tokens * top_k; that row of A was "  \
    "read as zeros")

#define KJIT_DEVICE_ERROR_ENUMERATOR(name, code, message) KJIT_DEVICE_ERROR_##name = code,
enum kjit_device_error_code { KJIT_DEVICE_ERRORS(KJIT_DEVICE_ERROR_ENUMERATOR) };
#undef KJIT_DEVICE_ERROR_ENUMERATOR

#endif
