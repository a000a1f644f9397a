#!/usr/bin/env bash
# kjit as a user embeds it, from a project outside its tree (tests/package/consumer):
# - `cmake --install` into a temporary prefix, which is then moved (the package
#   files must not name the prefix they were installed to), with the bundled
#   manifests (found by name by the installed jitctl) and the licence;
# - examples/ (C, C++) built against it;
# - a C99 and a C++17 program built through find_package(kjit CONFIG) and
#   through pkg-config, and run: they check kjit_version(), kjit_status_name,
#   a descriptor's init and the C++ API's exception;
# - kjit as a subproject (add_subdirectory): tests, -Werror and install rules
#   are off, and the programs compile against the kjit target's include
#   directories (compiled only: linking would build all of kjit again).
#
#     test_package.sh BUILD_DIR SOURCE_DIR VERSION [FLAGS]
#
# FLAGS are the build's CMAKE_CXX_FLAGS, given to the programs too (a
# sanitizer build's libkjit needs its runtime in the program).
set -uo pipefail
build=$1 source=$2 version=$3 flags=${4:-}
consumer=$source/tests/package/consumer
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0

check() {  # check NAME COMMAND...: runs COMMAND, counts it, shows its output on failure
  local name=$1
  shift
  if "$@" > "$tmp/log" 2>&1; then
    passed=$((passed + 1))
    echo "ok: $name"
  else
    failed=$((failed + 1))
    echo "FAILED: $name"
    cat "$tmp/log"
  fi
}

install_and_move() {
  cmake --install "$build" --prefix "$tmp/staging" && mv "$tmp/staging" "$tmp/prefix"
}

installed_files() {
  local f
  for f in include/kjit/kjit.h include/kjit/kjit.hpp include/kjit/status.h bin/jitctl share/doc/kjit/LICENSE \
           share/kjit/manifests/default.json share/kjit/manifests/deepseek-v3.json share/kjit/manifests/README.md; do
    [ -e "$tmp/prefix/$f" ] || { echo "missing: $f"; return 1; }
  done
  # Nothing internal: kjit/base/ and the CPU references stay in the source tree.
  [ ! -e "$tmp/prefix/include/kjit/base" ] && [ ! -e "$tmp/prefix/include/kjit/reference" ] ||
    { echo "internal headers were installed"; return 1; }
}

# The licence where pkg-config has a field for it (pkgconf 1.9 and later print it: --license).
licence_in_metadata() {
  grep -qx "License: Apache-2.0" "$(find "$tmp/prefix" -name kjit.pc)" || { echo "kjit.pc has no License: Apache-2.0"; return 1; }
  grep -q "Apache License" "$tmp/prefix/share/doc/kjit/LICENSE"
}

# The installed jitctl, away from any checkout, takes a bundled manifest by its
# name: it reads it and stops at the cache root, which cannot be written.
manifest_by_name() {
  local rc
  (cd "$tmp" && KJIT_CACHE_DIR=/dev/null/cache "$tmp/prefix/bin/jitctl" precompile --manifest deepseek-v3 \
    --arch sm_90a) > "$tmp/by_name.log" 2>&1
  rc=$?
  cat "$tmp/by_name.log"
  [ "$rc" -eq 1 ] && grep -q "cannot be written" "$tmp/by_name.log"
}

build_with_find_package() {
  cmake -S "$consumer" -B "$tmp/fp" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_CXX_FLAGS="$flags" &&
    cmake --build "$tmp/fp" &&
    "$tmp/fp/consumer_c" "$version" && "$tmp/fp/consumer_cpp" "$version"
}

# examples/ as a user builds it, against the installed package (warnings are
# errors); running them needs a GPU (ctest's examples.* do, in the build tree).
build_examples() {
  cmake -S "$source/examples" -B "$tmp/examples" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    -DCMAKE_C_FLAGS="-Wall -Wextra -Wpedantic -Werror $flags" -DCMAKE_CXX_FLAGS="-Wall -Wextra -Wpedantic -Werror $flags" &&
    cmake --build "$tmp/examples" && [ -x "$tmp/examples/c_dequant" ] && [ -x "$tmp/examples/cpp_grouped_gemm" ]
}

build_with_pkg_config() {
  local pc_dir cflags libs libdir
  pc_dir=$(dirname "$(find "$tmp/prefix" -name kjit.pc)")
  export PKG_CONFIG_PATH=$pc_dir
  [ "$(pkg-config --modversion kjit)" = "$version" ] || { echo "pkg-config --modversion kjit: not $version"; return 1; }
  cflags=$(pkg-config --cflags kjit) && libs=$(pkg-config --libs kjit) && libdir=$(pkg-config --variable=libdir kjit) &&
    cc -std=c99 -Wall -Wextra -Wpedantic -Werror $flags $cflags "$consumer/consumer.c" $libs -Wl,-rpath,"$libdir" \
      -o "$tmp/pc_c" &&
    c++ -std=c++17 -Wall -Wextra -Wpedantic -Werror $flags $cflags "$consumer/consumer.cpp" $libs -Wl,-rpath,"$libdir" \
      -o "$tmp/pc_cpp" &&
    "$tmp/pc_c" "$version" && "$tmp/pc_cpp" "$version"
}

as_subproject() {
  cmake -S "$consumer" -B "$tmp/sub" -G Ninja -DKJIT_SOURCE_DIR="$source" || return 1
  local option
  for option in KJIT_BUILD_TESTS:BOOL=OFF KJIT_WERROR:BOOL=OFF KJIT_INSTALL:BOOL=OFF; do
    grep -qx "$option" "$tmp/sub/CMakeCache.txt" || { echo "not in the subproject's cache: $option"; return 1; }
  done
  cmake --build "$tmp/sub" --target CMakeFiles/consumer_c.dir/consumer.c.o CMakeFiles/consumer_cpp.dir/consumer.cpp.o
}

check "cmake --install into a prefix that is then moved" install_and_move
if [ -d "$tmp/prefix" ]; then
  check "the public headers, jitctl, the manifests and the licence are installed, nothing internal" installed_files
  check "the licence in kjit.pc" licence_in_metadata
  check "the installed jitctl finds a bundled manifest by name" manifest_by_name
  check "a C and a C++ program through find_package(kjit CONFIG)" build_with_find_package
  check "a C and a C++ program through pkg-config" build_with_pkg_config
  check "examples/ (C and C++) build against the installed package" build_examples
fi
check "add_subdirectory(kjit): options off, include directories on the target" as_subproject
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -eq 8 ]
