// The in-process registry: (device, spec) -> loaded kernel. The hit path takes
// one shard's shared lock (no global lock) and touches no allocation; a miss
// loads each kernel exactly once even when many threads ask at the same time,
// and a failed load is retried by the next caller.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/base/expected.hpp"

namespace kjit {

struct LoadedKernel {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  int resident_blocks = 0;  // blocks that fit on the device at once (persistent kernels size their grid by it)
};

class Registry {
 public:
  using Loader = std::function<Expected<LoadedKernel>()>;

  // The loaded kernel, or nullptr when it has not been loaded yet.
  const LoadedKernel* find(int device, const codegen::KernelSpec& spec) const;

  // find(), else runs `load` once for this (device, spec) and keeps the result.
  Expected<const LoadedKernel*> get_or_load(int device, const codegen::KernelSpec& spec, const Loader& load);


 private:
  struct Key {
    int device;
    codegen::KernelSpec spec;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept {
      return codegen::SpecHash{}(k.spec) * 31 + static_cast<size_t>(k.device);
    }
  };
  struct Slot {
    std::mutex loading;
    std::atomic<bool> ready{false};
    LoadedKernel kernel;
  };
  struct Shard {
    mutable std::shared_mutex mutex;
    std::unordered_map<Key, std::unique_ptr<Slot>, KeyHash> slots;
  };
  static constexpr size_t kShards = 16;

  Shard& shard_for(const Key& key) const { return shards_[KeyHash{}(key) % kShards]; }
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace kjit
