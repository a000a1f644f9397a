// GPU test runner: exits 77 (ctest: skipped) with the reason when this machine
// has no usable GPU, so CI shows the GPU tests as skipped, not passed. Queries
// (--list-test-cases, --list-test-suites, --count, --help ...) need no GPU:
// ctest discovers the cases on machines without one.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "kjit/internal/driver.hpp"

namespace {

bool only_queries(doctest::Context& context) {
  context.setAsDefaultForAssertsOutOfTestCases();  // makes the parsed options readable
  const doctest::ContextOptions& o = *doctest::getContextOptions();
  return o.help || o.version || o.count || o.list_test_cases || o.list_test_suites || o.list_reporters || o.no_run;
}

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  if (only_queries(context)) return context.run();
  auto driver = kjit::load_driver();
  int count = 0;
  if (driver) (*driver)->cuDeviceGetCount(&count);
  if (!driver || count == 0) {
    std::printf("SKIPPED: no GPU on this machine (%s)\n",
                driver ? "driver loaded, 0 devices" : driver.error().message.c_str());
    return 77;
  }
  return context.run();
}
