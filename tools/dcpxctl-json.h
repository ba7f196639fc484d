/* dcpxctl-json.h - dcpxctl's JSON output, written by json-c.
 *
 * A small builder that reads like a stream writer: jw_obj / jw_arr open a
 * container (in an object with a key, in an array with key NULL), the
 * value functions add to the innermost one, jw_*_end close it, and jw_end
 * prints the document on one line and frees it. json-c writes UTF-8 text
 * as it is; in text that is not valid UTF-8 (dcpxd sends only valid
 * UTF-8, but the output stays valid JSON whatever it sent) each bad byte
 * becomes '?' (dcpx__text_clean). tests/check_json.c reads the output back with
 * Python's json module. */
#ifndef DCPXCTL_JSON_H
#define DCPXCTL_JSON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <json-c/json.h>

typedef struct jw {
  FILE *f;
  json_object *stack[32];
  int depth; /* stack[depth - 1] is the innermost container */
} jw;

jw jw_start(FILE *f);
void jw_open(jw *w, const char *key, json_object *container);
void jw_close(jw *w);
#define jw_obj(w, key) jw_open(w, key, json_object_new_object())
#define jw_obj_end(w) jw_close(w)
#define jw_arr(w, key) jw_open(w, key, json_object_new_array())
#define jw_arr_end(w) jw_close(w)

void jw_str(jw *w, const char *key, const char *v);
void jw_u64(jw *w, const char *key, uint64_t v);
void jw_i64(jw *w, const char *key, int64_t v);
void jw_bool(jw *w, const char *key, bool v);
void jw_null(jw *w, const char *key);
void jw_double(jw *w, const char *key, double v);

/* Prints the document and a newline to w->f, and frees it. */
void jw_end(jw *w);

#endif /* DCPXCTL_JSON_H */
