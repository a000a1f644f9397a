# kjit_discover_suite_tests(TARGET PREFIX <prefix> PROPERTIES <properties>...)
#
# Like doctest_discover_tests, one ctest per doctest case, found after each
# build by asking the binary (--list-test-suites, --list-test-cases), but each
# case is named <prefix><suite>.<case> after its TEST_SUITE, for example
# "gpu.grouped_gemm.one expert owning every row, and a single expert", so that
# ctest -R selects a family. Every case must be in a suite, and no name may
# hold a ';' (CMake's list separator). Included from tests/CMakeLists.txt; this
# file is also the script the build runs (cmake -P) to write the ctest list.

if(CMAKE_SCRIPT_MODE_FILE)
  # Lists what the binary prints for `query`, without doctest's own lines.
  function(doctest_query out)
    execute_process(COMMAND "${EXECUTABLE}" ${ARGN} OUTPUT_VARIABLE text RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "'${EXECUTABLE} ${ARGN}' exited ${rc}:\n${text}")
    endif()
    if(text MATCHES ";")
      message(FATAL_ERROR "'${EXECUTABLE} ${ARGN}' lists a name with a ';':\n${text}")
    endif()
    string(REPLACE "\n" ";" lines "${text}")
    set(names)
    foreach(line IN LISTS lines)
      if(line STREQUAL "" OR line MATCHES "^\\[doctest\\] " OR line MATCHES "^=+$")
        continue()
      endif()
      list(APPEND names "${line}")
    endforeach()
    set(${out} "${names}" PARENT_SCOPE)
  endfunction()

  # doctest filters are comma-separated lists; a backslash escapes ',' and '\'.
  function(doctest_filter out name)
    string(REPLACE "\\" "\\\\" name "${name}")
    string(REPLACE "," "\\," name "${name}")
    set(${out} "${name}" PARENT_SCOPE)
  endfunction()

  doctest_query(all_cases --list-test-cases)
  doctest_query(suites --list-test-suites)
  set(script)
  set(in_suites 0)
  foreach(suite IN LISTS suites)
    doctest_filter(suite_filter "${suite}")
    doctest_query(cases "--test-suite=${suite_filter}" --list-test-cases)
    foreach(case IN LISTS cases)
      math(EXPR in_suites "${in_suites} + 1")
      doctest_filter(case_filter "${case}")
      set(name "${PREFIX}${suite}.${case}")
      string(APPEND script
        "add_test([==[${name}]==] [==[${EXECUTABLE}]==] [==[--test-suite=${suite_filter}]==]"
        " [==[--test-case=${case_filter}]==])\n"
        "set_tests_properties([==[${name}]==] PROPERTIES ${PROPERTIES})\n")
    endforeach()
  endforeach()
  list(LENGTH all_cases total)
  if(NOT total EQUAL in_suites)
    message(FATAL_ERROR "${EXECUTABLE}: ${total} test cases, ${in_suites} of them in a TEST_SUITE; put every case in one")
  endif()
  file(WRITE "${OUT}" "${script}")
  return()
endif()

set(KJIT_DOCTEST_SUITES_SCRIPT ${CMAKE_CURRENT_LIST_FILE})

function(kjit_discover_suite_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "PREFIX" "PROPERTIES")
  set(tests_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suite_tests.cmake)
  add_custom_command(TARGET ${target} POST_BUILD BYPRODUCTS ${tests_file}
    COMMAND ${CMAKE_COMMAND} -D EXECUTABLE=$<TARGET_FILE:${target}> -D PREFIX=${arg_PREFIX}
            -D "PROPERTIES=${arg_PROPERTIES}" -D OUT=${tests_file} -P ${KJIT_DOCTEST_SUITES_SCRIPT}
    VERBATIM)
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_suite_include.cmake)
  file(WRITE ${include_file}
    "if(EXISTS [==[${tests_file}]==])\n  include([==[${tests_file}]==])\nelse()\n"
    "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
