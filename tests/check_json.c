/* check_json.c - dcpxctl's JSON output (tools/dcpxctl-json.c, json-c):
 * a document with non-ASCII text (as an error text from dcpxd may hold),
 * quotes, backslashes, control characters, invalid UTF-8, nesting, and
 * 64-bit numbers is read back by Python's json module, which must find
 * exactly the values written. (The hand-written writer this replaced wrote
 * each UTF-8 byte as \u00XX, which reads back as other characters.)
 * Then dcpxctl --json against a private daemon, read back the same way.
 * SKIP (77) without python3.
 */
#define _GNU_SOURCE
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "dcpxctl-json.h"

static int have_python(void) {
  return system("python3 -c 'import json' >/dev/null 2>&1") == 0;
}

/* Runs python3 on the script with the file as argv[1]; its exit status. */
static int python_check(const char *script, const char *file) {
  char cmd[4096];
  int st;
  FILE *p;

  snprintf(cmd, sizeof(cmd), "python3 - '%s'", file);
  p = popen(cmd, "w");
  ck_assert_ptr_nonnull(p);
  fputs(script, p);
  st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

START_TEST(test_utf8_round_trip) {
  char path[] = "/tmp/dcpx-json.XXXXXX";
  int fd = mkstemp(path);
  FILE *f;
  jw w;

  ck_assert_int_ge(fd, 0);
  f = fdopen(fd, "w");
  ck_assert_ptr_nonnull(f);
  w = jw_start(f);
  jw_obj(&w, NULL);
  jw_i64(&w, "status", -22);
  jw_str(&w, "error", "gruppe \xc2\xbbgr\xc3\xbc\xc3\x9f" "e\xc2\xab: "
                      "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 refused");
  jw_str(&w, "quotes", "a \"b\" \\c/ \n\t\x01 end");
  jw_str(&w, "bad", "a\xff" "b\xc3(c");
  jw_str(&w, "null_text", NULL);
  jw_u64(&w, "big", UINT64_MAX);
  jw_i64(&w, "neg", INT64_MIN);
  jw_double(&w, "rate", 0.1);
  jw_bool(&w, "yes", true);
  jw_null(&w, "nothing");
  jw_arr(&w, "list");
  jw_obj(&w, NULL);
  jw_str(&w, "name", "\xc3\xa9t\xc3\xa9");
  jw_obj_end(&w);
  jw_u64(&w, NULL, 7);
  jw_arr_end(&w);
  jw_obj_end(&w);
  jw_end(&w);
  fclose(f);

  ck_assert_int_eq(
      python_check(
          "import json, sys\n"
          "raw = open(sys.argv[1], 'rb').read()\n"
          "assert raw.endswith(b'\\n') and raw.count(b'\\n') == 1, raw\n"
          "d = json.loads(raw.decode('utf-8'))\n"
          "want = {'status': -22,\n"
          "  'error': 'gruppe \\u00bbgr\\u00fc\\u00dfe\\u00ab: "
          "\\u65e5\\u672c \\U0001f642 refused',\n"
          "  'quotes': 'a \"b\" \\\\c/ \\n\\t\\x01 end',\n"
          "  'bad': 'a?b?(c', 'null_text': '',\n"
          "  'big': 2**64 - 1, 'neg': -2**63, 'rate': 0.1, 'yes': True,\n"
          "  'nothing': None, 'list': [{'name': '\\u00e9t\\u00e9'}, 7]}\n"
          "if d != want:\n"
          "    print('got ', d, '\\nwant', want); sys.exit(1)\n"
          "assert 'gr\\u00fc\\u00dfe'.encode() in raw  # as UTF-8, not "
          "escaped\n",
          path),
      0);
  unlink(path);
}
END_TEST

/* dcpxctl --json against a private daemon (no groups): stats, records and
 * an error reply all parse, and the error carries the daemon's text. */
START_TEST(test_dcpxctl_json) {
  const char *dcpxd = getenv("DCPXD"), *ctl = getenv("DCPXCTL");
  char dir[] = "/tmp/dcpx-json-d.XXXXXX", cmd[1024], out[128];
  pid_t pid;

  if (!dcpxd)
    dcpxd = "./daemon/dcpxd";
  if (!ctl)
    ctl = "./tools/dcpxctl";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  pid = fork();
  if (pid == 0) {
    char sock[96], state[96];
    snprintf(sock, sizeof(sock), "--socket=%s/s", dir);
    snprintf(state, sizeof(state), "--state-dir=%s/st", dir);
    if (!freopen("/dev/null", "w", stderr))
      _exit(127);
    execl(dcpxd, dcpxd, "--config=", sock, state, (char *)NULL);
    _exit(127);
  }
  snprintf(cmd, sizeof(cmd), "%s --socket=%s/s groups >/dev/null 2>&1", ctl,
           dir);
  for (int i = 0; i < 100 && system(cmd) != 0; i++)
    usleep(50000);
  snprintf(out, sizeof(out), "%s/out", dir);
  snprintf(cmd, sizeof(cmd),
           "{ %s --socket=%s/s --json stats; %s --socket=%s/s --json records;"
           " %s --socket=%s/s --json reset --group no-such-group; } > %s "
           "2>/dev/null",
           ctl, dir, ctl, dir, ctl, dir, out);
  ck_assert_int_eq(WEXITSTATUS(system(cmd)), 4); /* the reset's error */
  ck_assert_int_eq(
      python_check("import json, sys\n"
                   "docs = [json.loads(l) for l in open(sys.argv[1])]\n"
                   "assert docs[0] == {'groups': [], 'refused_reattaches': [],"
      " 'state_error': None,"
                        " 'groups_left_out': 0}, docs\n"
                   "assert docs[1]['records'] == [], docs\n"
                   "assert docs[2]['status'] == -2, docs\n"
                   "assert 'no-such-group' in docs[2]['error'], docs\n"
                   "assert len(docs) == 3\n",
                   out),
      0);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void) {
  if (!have_python()) {
    printf("SKIP: no python3\n");
    return 77;
  }
  Suite *s = suite_create("json");
  TCase *tc = t_tcase(s, "writer", 30);
  tcase_add_test(tc, test_utf8_round_trip);
  tcase_add_test(tc, test_dcpxctl_json);
  return t_suite_run(s);
}
