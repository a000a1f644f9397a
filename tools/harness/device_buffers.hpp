// Device buffers of the harness's checks (internal to the harness).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "kjit/internal/driver.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/base/expected.hpp"

namespace kjit::harness {

// Device memory of one check, freed on every path; uploads without data are
// poisoned with kPoison bytes, so that unwritten elements fail.
class Buffers {
 public:
  static constexpr uint8_t kPoison = 0xA5;
  Buffers(const DriverApi& api, CUcontext ctx) : api_(api), ctx_(ctx) {}
  ~Buffers() {
    ScopedContext scope(api_, ctx_);
    for (CUdeviceptr p : owned_) api_.cuMemFree(p);
  }
  Expected<CUdeviceptr> upload(const void* data, size_t bytes) {
    ScopedContext scope(api_, ctx_);
    CUdeviceptr p = 0;
    KJIT_TRY(check(api_, api_.cuMemAlloc(&p, bytes), "cuMemAlloc"));
    owned_.push_back(p);
    if (data) {
      KJIT_TRY(check(api_, api_.cuMemcpyHtoD(p, data, bytes), "cuMemcpyHtoD"));
    } else if (auto ok = check(api_, api_.cuMemsetD8(p, kPoison, bytes), "cuMemsetD8"); !ok) {
      return std::unexpected(ok.error());
    }
    return p;
  }
  // Copies into memory this object allocated (`p` may point inside it).
  Expected<void> copy_in(CUdeviceptr p, const void* data, size_t bytes) {
    ScopedContext scope(api_, ctx_);
    return check(api_, api_.cuMemcpyHtoD(p, data, bytes), "cuMemcpyHtoD");
  }
  Expected<void> download(void* data, CUdeviceptr p, size_t bytes) {
    ScopedContext scope(api_, ctx_);
    return check(api_, api_.cuMemcpyDtoH(data, p, bytes), "cuMemcpyDtoH");
  }

 private:
  const DriverApi& api_;
  CUcontext ctx_;
  std::vector<CUdeviceptr> owned_;
};

// Runs `launch` (an op on the default stream) and then takes the device's
// error words (Runtime::take_device_errors), holding one lock of the process
// from the one to the other: checks on several threads (jitctl selftest) each
// read the errors of their own kernel, not another check's.
inline std::mutex& launch_mutex() {
  static std::mutex mutex;  // one in the process: an inline function's
  return mutex;
}
template <class Launch>
Expected<void> launch_and_take_errors(Runtime& runtime, const DeviceState& device, Launch&& launch) {
  std::lock_guard lock(launch_mutex());
  KJIT_TRY(launch());
  return runtime.take_device_errors(device.ordinal);
}

}  // namespace kjit::harness
