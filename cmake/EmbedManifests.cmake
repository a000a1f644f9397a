# Writes a C++ file holding every bundled manifest (tools/manifests/*.json) as
# a string, so that `jitctl precompile --manifest NAME` finds them wherever
# jitctl is installed (a wheel's scripts folder, a prefix's bin/).
# Invoked as: cmake -DMANIFEST_DIR=... -DOUTPUT=... -P EmbedManifests.cmake
file(GLOB files RELATIVE "${MANIFEST_DIR}" "${MANIFEST_DIR}/*.json")
list(SORT files)
set(body "// Generated from tools/manifests/ by cmake/EmbedManifests.cmake. Do not edit.\n")
string(APPEND body "#include \"manifest.hpp\"\n\nnamespace kjit::tools {\nnamespace {\n")
string(APPEND body "constexpr BundledManifest kManifests[] = {\n")
foreach(f IN LISTS files)
  file(READ "${MANIFEST_DIR}/${f}" text)
  string(FIND "${text}" ")kjit_manifest\"" clash)
  if(NOT clash EQUAL -1)
    message(FATAL_ERROR "manifest ${f} contains the raw-string delimiter")
  endif()
  string(APPEND body "  {\"${f}\", R\"kjit_manifest(${text})kjit_manifest\"},\n")
endforeach()
string(APPEND body "};\n}  // namespace\n\nstd::span<const BundledManifest> bundled_manifests() { return kManifests; }\n\n}  // namespace kjit::tools\n")
file(WRITE "${OUTPUT}.tmp" "${body}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
