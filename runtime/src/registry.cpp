// The sharded registry of loaded kernels.
#include "kjit/internal/registry.hpp"

namespace kjit {

const LoadedKernel* Registry::find(int device, const codegen::KernelSpec& spec) const {
  const Key key{device, spec};
  Shard& shard = shard_for(key);
  std::shared_lock lock(shard.mutex);
  auto it = shard.slots.find(key);
  if (it == shard.slots.end() || !it->second->ready.load(std::memory_order_acquire)) return nullptr;
  return &it->second->kernel;
}

Expected<const LoadedKernel*> Registry::get_or_load(int device, const codegen::KernelSpec& spec,
                                                    const Loader& load) {
  if (const auto* hit = find(device, spec)) return hit;
  const Key key{device, spec};
  Shard& shard = shard_for(key);
  Slot* slot = nullptr;
  {
    std::unique_lock lock(shard.mutex);
    auto& owned = shard.slots[key];
    if (!owned) owned = std::make_unique<Slot>();
    slot = owned.get();  // slots are never erased, so the pointer stays valid
  }
  // One loader per slot; latecomers wait for it and then see `ready`.
  std::lock_guard loading(slot->loading);
  if (slot->ready.load(std::memory_order_acquire)) return &slot->kernel;
  slot->kernel = KJIT_TRY(load());
  slot->ready.store(true, std::memory_order_release);
  return &slot->kernel;
}

}  // namespace kjit
