/* fuzz_conf.c - libFuzzer target: the dcpxd config file parser, inih and
 * the reader and handler around it
 * (dcpxd_conf_load with --config= a file holding the input). Built by
 * `make fuzz`; corpus in tests/fuzz/corpus/conf. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcpxd-conf.h"
#include "dcpxd-log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  static char path[64], arg[96];
  char *argv[] = {"dcpxd", arg, NULL};
  dcpxd_conf c;
  FILE *f;

  if (!path[0]) {
    snprintf(path, sizeof(path), "/tmp/fuzz_conf.%d", (int)getpid());
    snprintf(arg, sizeof(arg), "--config=%s", path);
    dcpxd_log_max_level = -1; /* parse errors are expected: keep quiet */
  }
  f = fopen(path, "w");
  if (!f)
    return 0;
  fwrite(data, 1, n, f);
  fclose(f);
  memset(&c, 0, sizeof(c));
  (void)dcpxd_conf_load(&c, 2, argv);
  dcpxd_conf_done(&c);
  return 0;
}
