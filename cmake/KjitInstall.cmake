# What `cmake --install` puts under the prefix: libkjit.so, the public headers,
# jitctl, a CMake package (find_package(kjit CONFIG) -> kjit::kjit), a
# pkg-config file (kjit.pc), the bundled manifests (share/kjit/manifests: the
# files jitctl has compiled in and finds by name) and the licence
# (share/doc/kjit/LICENSE). Both package files are relocatable: the prefix may
# be moved (or be a Python wheel's folder) after installation.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS kjit EXPORT kjitTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(SKBUILD_SCRIPTS_DIR)
  # A Python wheel (pyproject.toml): jitctl goes where pip puts the
  # environment's commands.
  install(TARGETS jitctl RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR})
else()
  install(TARGETS jitctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
set(KJIT_INSTALL_MANIFESTDIR ${CMAKE_INSTALL_DATADIR}/kjit/manifests CACHE STRING
  "where the bundled manifests are installed, relative to the prefix")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/tools/manifests/ DESTINATION ${KJIT_INSTALL_MANIFESTDIR}
  FILES_MATCHING PATTERN "*.json" PATTERN "README.md")
if(NOT SKBUILD)  # a wheel carries the licence in its metadata (pyproject.toml's license-files)
  install(FILES ${PROJECT_SOURCE_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR})
endif()
install(FILES ${PROJECT_SOURCE_DIR}/runtime/include/kjit/kjit.h ${PROJECT_SOURCE_DIR}/runtime/include/kjit/kjit.hpp
  ${PROJECT_SOURCE_DIR}/base/include/kjit/status.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kjit)

set(KJIT_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kjit)
install(EXPORT kjitTargets NAMESPACE kjit:: DESTINATION ${KJIT_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/kjitConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kjitConfig.cmake INSTALL_DESTINATION ${KJIT_CMAKE_DIR})
# 0.x: a minor version may change the ABI (the struct_size fields keep old
# callers working, but not new callers on an old library).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kjitConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kjitConfig.cmake ${PROJECT_BINARY_DIR}/kjitConfigVersion.cmake
  DESTINATION ${KJIT_CMAKE_DIR})

# kjit.pc names its prefix relative to its own folder (${pcfiledir}).
set(KJIT_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(IS_ABSOLUTE "${KJIT_PC_DIR}")
  set(KJIT_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH KJIT_PC_PREFIX "/prefix/${KJIT_PC_DIR}" "/prefix")
  set(KJIT_PC_PREFIX "\${pcfiledir}/${KJIT_PC_PREFIX}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/kjit.pc.in ${PROJECT_BINARY_DIR}/kjit.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kjit.pc DESTINATION ${KJIT_PC_DIR})
