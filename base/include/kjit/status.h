/* kjit — status codes of the C ABI, shared by every room of the library.
 * Values are part of the ABI. */
#ifndef KJIT_STATUS_H
#define KJIT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kjit_status {
  KJIT_OK = 0,
  KJIT_ERROR_INVALID_ARGUMENT = 1, /* a bad shape, pointer, dtype, stride ... */
  KJIT_ERROR_UNSUPPORTED = 2,      /* valid request this GPU or build cannot do */
  KJIT_ERROR_NO_DEVICE = 3,        /* no driver or no GPU where one is needed */
  KJIT_ERROR_DRIVER = 4,           /* a CUDA driver call failed */
  KJIT_ERROR_COMPILE = 5,          /* NVRTC failed or is missing; the log is in the message */
  KJIT_ERROR_CACHE = 6,            /* the on-disk cache could not be used */
  KJIT_ERROR_CAPTURING = 7,        /* a compile would be needed while the stream captures a graph */
  KJIT_ERROR_DEVICE_REPORTED = 8,  /* a kernel reported bad data (kjit_device_errors) */
  KJIT_ERROR_INTERNAL = 9
} kjit_status;

#ifdef __cplusplus
}
#endif
#endif /* KJIT_STATUS_H */
