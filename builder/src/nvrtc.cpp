// Loading NVRTC and compiling with it.
#include "kjit/builder/nvrtc.hpp"

#include <cuda.h>
#include <dlfcn.h>
#include <link.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

namespace kjit {

// Signatures copied from nvrtc.h's C declarations, which are stable across
// CUDA 12 and 13; nvrtcProgram is an opaque pointer.
struct Nvrtc::Api {
  using Program = struct _nvrtcProgram*;
  const char* (*GetErrorString)(int);
  int (*Version)(int*, int*);
  int (*GetNumSupportedArchs)(int*);
  int (*GetSupportedArchs)(int*);
  int (*CreateProgram)(Program*, const char*, const char*, int, const char* const*, const char* const*);
  int (*DestroyProgram)(Program*);
  int (*CompileProgram)(Program, int, const char* const*);
  int (*GetProgramLogSize)(Program, size_t*);
  int (*GetProgramLog)(Program, char*);
  int (*GetCUBINSize)(Program, size_t*);
  int (*GetCUBIN)(Program, char*);
};

namespace {

std::vector<std::string> library_candidates() {
  std::vector<std::string> names;
  if (const char* env = std::getenv("KJIT_NVRTC_LIBRARY"); env && *env) names.emplace_back(env);
  names.emplace_back("libnvrtc.so.13");
  names.emplace_back("libnvrtc.so.12");
  names.emplace_back("libnvrtc.so");
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* root = std::getenv(var); root && *root) {
      names.push_back(fmt::format("{}/lib64/libnvrtc.so.13", root));
      names.push_back(fmt::format("{}/lib64/libnvrtc.so.12", root));
    }
  names.emplace_back("/usr/local/cuda/lib64/libnvrtc.so.13");
  names.emplace_back("/usr/local/cuda/lib64/libnvrtc.so.12");
  return names;
}

std::string loaded_path(void* handle) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name) return map->l_name;
  return "";
}

}  // namespace

Expected<const Nvrtc*> Nvrtc::load() {
  static const Expected<Nvrtc> nvrtc = [] {
    std::string tried;
    void* handle = nullptr;
    for (const auto& name : library_candidates()) {
      handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle) break;
      const char* why = dlerror();
      tried += fmt::format("\n  {}: {}", name, why ? why : "not found");
    }
    if (!handle)
      return Expected<Nvrtc>(fail(KJIT_ERROR_COMPILE,
                                  fmt::format("NVRTC (libnvrtc) could not be loaded, so kjit cannot compile; install "
                                              "the CUDA toolkit or set KJIT_NVRTC_LIBRARY. Tried:{}",
                                              tried)));
    static Api api;
    std::string missing;
    auto sym = [&](const char* name, auto& fn) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      if (!fn) missing += fmt::format(" {}", name);
    };
    sym("nvrtcGetErrorString", api.GetErrorString);
    sym("nvrtcVersion", api.Version);
    sym("nvrtcGetNumSupportedArchs", api.GetNumSupportedArchs);
    sym("nvrtcGetSupportedArchs", api.GetSupportedArchs);
    sym("nvrtcCreateProgram", api.CreateProgram);
    sym("nvrtcDestroyProgram", api.DestroyProgram);
    sym("nvrtcCompileProgram", api.CompileProgram);
    sym("nvrtcGetProgramLogSize", api.GetProgramLogSize);
    sym("nvrtcGetProgramLog", api.GetProgramLog);
    sym("nvrtcGetCUBINSize", api.GetCUBINSize);
    sym("nvrtcGetCUBIN", api.GetCUBIN);
    if (!missing.empty())
      return Expected<Nvrtc>(fail(KJIT_ERROR_COMPILE, fmt::format("libnvrtc lacks entry points:{}", missing)));

    Nvrtc n;
    n.api_ = &api;
    n.library_path_ = loaded_path(handle);
    int major = 0, minor = 0;
    api.Version(&major, &minor);
    n.version_ = fmt::format("{}.{}", major, minor);
    n.has_own_cache_ = major > 12 || (major == 12 && minor >= 9);
    int count = 0;
    if (api.GetNumSupportedArchs(&count) == 0 && count > 0) {
      n.archs_.resize(static_cast<size_t>(count));
      api.GetSupportedArchs(n.archs_.data());
    }
    return Expected<Nvrtc>(std::move(n));
  }();
  if (!nvrtc) return std::unexpected(nvrtc.error());
  return &*nvrtc;
}

bool Nvrtc::supports(const std::string& arch) const {
  // "sm_90a" -> 90: the arch-specific 'a' variants exist wherever the base does.
  if (!arch.starts_with("sm_")) return false;
  const int number = std::atoi(arch.c_str() + 3);
  for (int a : archs_)
    if (a == number) return true;
  return false;
}

Expected<CompiledKernel> Nvrtc::compile(const std::string& source, const std::string& name, const std::string& arch,
                                        const std::vector<std::string>& options) const {
  const auto start = std::chrono::steady_clock::now();
  Api::Program program = nullptr;
  if (int r = api_->CreateProgram(&program, source.c_str(), name.c_str(), 0, nullptr, nullptr); r != 0)
    return fail(KJIT_ERROR_COMPILE, fmt::format("nvrtcCreateProgram failed: {}", api_->GetErrorString(r)));
  struct Destroy {  // the program is destroyed on every path
    const Api* api;
    Api::Program* p;
    ~Destroy() { api->DestroyProgram(p); }
  } destroy{api_, &program};


  std::vector<const char*> argv;
  for (const auto& o : options) argv.push_back(o.c_str());
  // kjit's cache is the one whose entries are verified. NVRTC's own (12.9+, in
  // the driver's compute cache) would store every cubin a second time there,
  // evicting other programs' JIT entries from its shared size cap, and serve
  // unverified bytes with no record of it. It changes no output, so it stays
  // out of the options that enter the key.
  if (has_own_cache_) argv.push_back("--no-cache");
  const int compiled = api_->CompileProgram(program, static_cast<int>(argv.size()), argv.data());

  CompiledKernel out;
  size_t log_size = 0;
  api_->GetProgramLogSize(program, &log_size);
  if (log_size > 1) {
    out.log.resize(log_size);
    api_->GetProgramLog(program, out.log.data());
    out.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (compiled != 0)
    return fail(KJIT_ERROR_COMPILE, fmt::format("NVRTC {} failed to compile {} for {}: {}\n{}", version_, name, arch,
                                                api_->GetErrorString(compiled), out.log));
  size_t cubin_size = 0;
  if (int r = api_->GetCUBINSize(program, &cubin_size); r != 0 || cubin_size == 0)
    return fail(KJIT_ERROR_COMPILE, fmt::format("NVRTC produced no cubin for {} ({})", arch, api_->GetErrorString(r)));
  out.cubin.resize(cubin_size);
  api_->GetCUBIN(program, out.cubin.data());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

std::string built_with_cuda_version() {
  return fmt::format("{}.{}", CUDA_VERSION / 1000, (CUDA_VERSION % 1000) / 10);
}

std::vector<std::string> compile_options(const std::string& arch, bool lineinfo) {
  // -lineinfo keeps profilers' source correlation; it does not change the code, but it triples the cubin
  // (the cache's bytes, each load's read and hash) and adds ~8% to the compile: asked for, not the default.
  std::vector<std::string> options{"--gpu-architecture=" + arch, "--std=c++17"};
  if (lineinfo) options.emplace_back("-lineinfo");
  return options;
}

bool lineinfo_from_environment() {
  const char* value = std::getenv("KJIT_LINEINFO");
  return value != nullptr && std::string_view(value) == "1";
}

}  // namespace kjit
