/* An external C99 program using kjit's C ABI (tests/package/test_package.sh). */
#include <kjit/kjit.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  const char* expected_version = argc > 1 ? argv[1] : "";
  int failed = 0;
  kjit_dequant_desc desc;
  if (strcmp(kjit_version(), expected_version) != 0) {
    fprintf(stderr, "FAILED: kjit_version() is %s, expected %s\n", kjit_version(), expected_version);
    failed = 1;
  }
  if (strcmp(kjit_status_name(KJIT_ERROR_INVALID_ARGUMENT), "KJIT_ERROR_INVALID_ARGUMENT") != 0) {
    fprintf(stderr, "FAILED: kjit_status_name(KJIT_ERROR_INVALID_ARGUMENT) is %s\n",
            kjit_status_name(KJIT_ERROR_INVALID_ARGUMENT));
    failed = 1;
  }
  kjit_dequant_desc_init(&desc);
  if (desc.struct_size != sizeof desc) {
    fprintf(stderr, "FAILED: kjit_dequant_desc_init set struct_size %u, sizeof is %zu\n",
            (unsigned)desc.struct_size, sizeof desc);
    failed = 1;
  }
  printf("C consumer: kjit %s, %s\n", kjit_version(), failed ? "FAILED" : "ok");
  return failed;
}
