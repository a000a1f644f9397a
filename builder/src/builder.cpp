// The Builder: render, key, look up, compile, publish.
#include "kjit/builder/builder.hpp"

#include <chrono>
#include <string>

#include <fmt/format.h>

#include "kjit/base/log.hpp"
#include "kjit/base/text.hpp"
#include "kjit/builder/nvrtc.hpp"
#include "kjit/codegen/cache_key.hpp"
#include "kjit/version.h"

namespace kjit {

Expected<BuiltKernel> Builder::build(const codegen::KernelSpec& launched, const codegen::ArchInfo& arch) {
  // Rendered, keyed and recorded as its identity (a grouped GEMM's expert count is the launch's).
  const codegen::KernelSpec spec = codegen::kernel_identity(launched);
  KJIT_TRY(codegen::validate_for_target(spec, arch));
  const std::string target(arch.target);
  BuiltKernel out;
  out.rendered = codegen::render(spec);
  counters_.renders.fetch_add(1, std::memory_order_relaxed);
  const auto options = compile_options(target, lineinfo_);
  auto lookup = [&](const std::string& nvrtc_version) {
    out.key = codegen::cache_key({out.rendered.source, target, options, nvrtc_version, kEntryFormatVersion});
    auto entry = store_.load_payload(out.key);
    if (!entry) return false;
    out.cubin = std::move(entry->payload);
    out.origin = CubinOrigin::disk_cache;
    counters_.disk_hits.fetch_add(1, std::memory_order_relaxed);
    return true;
  };
  // Keys name the NVRTC that compiles. The common case is the toolkit kjit
  // was built with, so that key is tried first without compiling (a disk hit
  // works where there is no NVRTC).
  std::string nvrtc_version = built_with_cuda_version();
  if (lookup(nvrtc_version)) return out;
  const auto nvrtc = Nvrtc::load();
  if (!nvrtc)
    return fail(KJIT_ERROR_COMPILE, fmt::format("{} for {} is not in the cache and cannot be compiled: {}",
                                                codegen::canonical(spec), target, nvrtc.error().message));
  if ((*nvrtc)->version() != nvrtc_version) {
    nvrtc_version = (*nvrtc)->version();
    if (lookup(nvrtc_version)) return out;
  }
  if (!(*nvrtc)->supports(target))
    return fail(KJIT_ERROR_UNSUPPORTED, fmt::format("NVRTC {} cannot build for {}", nvrtc_version, target));
  // Another process may be compiling this kernel right now: wait a bounded
  // while for its advisory lock and look again before compiling ourselves.
  // Correctness never depends on the lock (publish is atomic either way).
  const auto lock = store_.try_lock(out.key, std::chrono::seconds(10));
  if (lock.held() && lookup(nvrtc_version)) return out;

  // The program name lies under the absolute source root, as the #line names
  // do: no file name is relative, so the cubin does not depend on the working directory.
  const auto program_name = fmt::format("{}/{}.cu", codegen::kSourceRoot, codegen::op_name(spec));
  auto compiled = (*nvrtc)->compile(out.rendered.source, program_name, target, options);
  if (!compiled)
    return fail(compiled.error().code,
                fmt::format("compiling {}: {}", codegen::canonical(spec), compiled.error().message));
  counters_.compiles.fetch_add(1, std::memory_order_relaxed);
  log::info("compiled {} for {} in {:.0f} ms", codegen::canonical(spec), target, compiled->seconds * 1e3);

  const nlohmann::json meta = {{"spec", codegen::to_json(spec)},
                               {"canonical", codegen::canonical(spec)},
                               {"op", codegen::op_name(spec)},
                               {"arch", target},
                               {"nvrtc", nvrtc_version},
                               {"kjit", KJIT_VERSION_STRING},
                               {"options", options},
                               {"entry_point", out.rendered.entry_point},
                               {"compile_seconds", compiled->seconds},
                               {"source", out.rendered.source},
                               {"log", text::valid_utf8(compiled->log)}};
  // A cache that cannot be written is not fatal here: the store has warned
  // once, the kernel is served from memory, and `stored` says so.
  if (auto published = store_.publish(out.key, meta, compiled->cubin); published) {
    out.stored = true;
  } else {
    out.store_error = published.error().message;
    log::debug("not stored: {} ({})", out.key, out.store_error);
  }
  out.cubin = std::move(compiled->cubin);
  out.compile_seconds = compiled->seconds;
  return out;
}

}  // namespace kjit
