/* dcpxctl-json.c - dcpxctl's JSON output through json-c (dcpxctl-json.h). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdlib.h>
#include <string.h>

#include "dcpxctl-json.h"
#include "frame.h"

#define ELEMENTSOF(a) (sizeof(a) / sizeof((a)[0]))

/* Text as json-c takes it: UTF-8, with any byte that is not part of a
 * valid sequence made '?' (the daemon's own rule, dcpx__text_clean). */
static json_object *jw_text(const char *s) {
  json_object *o;
  char *clean;

  if (!s)
    s = "";
  if (dcpx__text_ok(s, strlen(s)))
    return json_object_new_string(s);
  clean = strdup(s);
  if (!clean)
    return json_object_new_string("");
  dcpx__text_clean(clean);
  o = json_object_new_string(clean);
  free(clean);
  return o;
}

/* Adds v to the innermost container (a NULL v is a JSON null). */
static void jw_add(jw *w, const char *key, json_object *v) {
  json_object *top = w->depth ? w->stack[w->depth - 1] : NULL;
  if (!top) {
    json_object_put(v);
    return;
  }
  if (json_object_is_type(top, json_type_array))
    json_object_array_add(top, v);
  else
    json_object_object_add(top, key, v);
}

void jw_open(jw *w, const char *key, json_object *c) {
  if (w->depth == 0)
    w->stack[w->depth++] = c; /* the document */
  else if (w->depth < (int)ELEMENTSOF(w->stack)) {
    jw_add(w, key, c);
    w->stack[w->depth++] = c;
  } else
    json_object_put(c);
}
void jw_close(jw *w) {
  if (w->depth > 1)
    w->depth--;
}

void jw_str(jw *w, const char *key, const char *v) {
  jw_add(w, key, jw_text(v));
}
void jw_u64(jw *w, const char *key, uint64_t v) {
  jw_add(w, key, json_object_new_uint64(v));
}
void jw_i64(jw *w, const char *key, int64_t v) {
  jw_add(w, key, json_object_new_int64(v));
}
void jw_bool(jw *w, const char *key, bool v) {
  jw_add(w, key, json_object_new_boolean(v));
}
void jw_null(jw *w, const char *key) { jw_add(w, key, NULL); }
/* Six significant digits, as the text output (json-c's own "%.17g" shows
 * 0.1 as 0.10000000000000001). */
void jw_double(jw *w, const char *key, double v) {
  char text[32];
  snprintf(text, sizeof(text), "%.6g", v);
  jw_add(w, key, json_object_new_double_s(v, text));
}

jw jw_start(FILE *f) {
  jw w = {.f = f, .depth = 0};
  return w;
}

void jw_end(jw *w) {
  if (w->depth == 0)
    return;
  fputs(json_object_to_json_string_ext(w->stack[0],
                                       JSON_C_TO_STRING_PLAIN |
                                           JSON_C_TO_STRING_NOSLASHESCAPE),
        w->f);
  fputc('\n', w->f);
  json_object_put(w->stack[0]);
  w->depth = 0;
}

