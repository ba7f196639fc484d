/* wire.c - the order, the wire words and the epochs (docs/PROTOCOL.md
 * sections 2-4), and the error table. Everything here is pure arithmetic
 * on integers. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dcpx.h"
#include "layout.h"
#include "merge.h"

const char *dcpx_strerror(int code) {
  switch (code) {
#define DCPX__CASE(name, value, msg)                                          \
  case value:                                                                 \
    return msg;
    DCPX_ERROR_TABLE(DCPX__CASE)
#undef DCPX__CASE
  default:
    break;
  }
  if (code < 0 && code > -4096) {
    /* strerrordesc_np: a static string, unlike strerror's shared buffer
     * for unknown values; NULL for those. */
    const char *d = strerrordesc_np(-code);
    if (d)
      return d;
  }
  return "unknown dcpx error";
}

const char *dcpx_version(void) { return DCPX_VERSION_STRING; }

size_t dcpx_struct_size(uint32_t kind) {
  switch (kind) {
  case DCPX_STRUCT_SHAPE:
    return sizeof(dcpx_shape);
  case DCPX_STRUCT_JOIN_OPTS:
    return sizeof(dcpx_join_opts);
  case DCPX_STRUCT_HEALTH_INFO:
    return sizeof(dcpx_health_info);
  case DCPX_STRUCT_REF_STATS:
    return sizeof(dcpx_ref_stats);
  case DCPX_STRUCT_CALL:
    return sizeof(dcpx_call);
  case DCPX_STRUCT_MERGE_OUT:
    return sizeof(dcpx_merge_out);
  case DCPX_STRUCT_REF_IN:
    return sizeof(dcpx_ref_in);
  case DCPX_STRUCT_ASYNC_ERROR:
    return sizeof(dcpx_async_error);
  case DCPX_STRUCT_LISTS:
    return sizeof(dcpx_lists);
  case DCPX_STRUCT_DEVICE:
    return sizeof(dcpx_device);
  default:
    return 0;
  }
}

/* The shape rules, the one place they are written (dcpx_shape_check,
 * dcpxd's refusal text, the kernels' context checks). */
#define WHY(...) (why && n ? (void)snprintf(why, n, __VA_ARGS__) : (void)0)

int dcpx__shape_why(const dcpx_shape *s, char *why, size_t n) {
  if (!s || s->size != sizeof(dcpx_shape)) {
    WHY("the shape struct is missing or of a size this library does not "
        "know (size %u, want %zu)",
        s ? s->size : 0u, sizeof(dcpx_shape));
    return DCPX_E_INVAL;
  }
  if (!s->world || !s->rows || !s->topk || !s->local_topk || !s->block_size ||
      !s->interleave || !s->max_local) {
    /* topk 1 leaves no N (1 <= N < K): say so, not "local_topk 0", which
     * the caller may have passed as "the library chooses". */
    if (s->topk == 1 && !s->local_topk && s->world && s->rows &&
        s->block_size && s->interleave && s->max_local)
      WHY("topk 1 is too small: local_topk must be at least 1 and less "
          "than topk, so topk must be >= 2");
    else
      WHY("every shape field must be >= 1 (world %u rows %u topk %u "
        "local_topk %u block_size %u interleave %u max_local %u)",
        s->world, s->rows, s->topk, s->local_topk, s->block_size,
        s->interleave, s->max_local);
    return DCPX_E_INVAL;
  }
  if (s->world > DCPX_MAX_WORLD) {
    WHY("world %u exceeds the limit of %u", s->world, DCPX_MAX_WORLD);
    return DCPX_E_LIMIT;
  }
  if (s->rows > DCPX_MAX_ROWS) {
    WHY("rows %u exceeds the limit of %u", s->rows, DCPX_MAX_ROWS);
    return DCPX_E_LIMIT;
  }
  if (s->topk > DCPX_MAX_TOPK) {
    WHY("topk %u exceeds the limit of %u", s->topk, DCPX_MAX_TOPK);
    return DCPX_E_LIMIT;
  }
  if (s->max_local > DCPX_MAX_LOCAL) {
    WHY("max_local %u exceeds the limit of %u", s->max_local,
        (unsigned)DCPX_MAX_LOCAL);
    return DCPX_E_LIMIT;
  }
  if (s->local_topk >= s->topk) {
    WHY("local_topk %u must be less than topk %u", s->local_topk, s->topk);
    return DCPX_E_INVAL;
  }
  /* gid = (l / I) * I * W + r * I + l % I must fit in int32. */
  if ((uint64_t)(s->max_local / s->interleave + 1) * s->interleave *
          s->world >
      INT32_MAX) {
    WHY("max_local %u x interleave %u x world %u overflows the 32-bit "
        "token ids",
        s->max_local, s->interleave, s->world);
    return DCPX_E_LIMIT;
  }
  return 0;
}

#undef WHY

/* local_topk = 0: the library's choice, dcpx_shape_auto_local_topk (every
 * rank resolves it alike, so dcpxd sees one shape). */
const dcpx_shape *dcpx__shape_resolved(const dcpx_shape *in,
                                       dcpx_shape *buf) {
  if (!in || in->size != sizeof(dcpx_shape) || in->local_topk)
    return in;
  *buf = *in;
  buf->local_topk = dcpx_shape_auto_local_topk(in->world, in->topk);
  /* No N for a world or topk beyond the limits: any N, so that the check
   * names the limit (DCPX_E_LIMIT), not a zero field. */
  if (!buf->local_topk &&
      (in->world > DCPX_MAX_WORLD || in->topk > DCPX_MAX_TOPK))
    buf->local_topk = 1;
  return buf;
}

int dcpx_shape_check(const dcpx_shape *s) {
  dcpx_shape r;
  return dcpx__shape_why(dcpx__shape_resolved(s, &r), NULL, 0);
}

int dcpx_shape_explain(const dcpx_shape *s, char *buf, size_t n) {
  dcpx_shape r;
  if (buf && n)
    buf[0] = '\0';
  return dcpx__shape_why(dcpx__shape_resolved(s, &r), buf, n);
}

/* The rule for local_topk = 0 (bench/RESULTS.md, "Choosing N"): with DCP's
 * token interleave a rank's share of a row's top K is about Binomial(K,
 * 1/W), mean K/W and spread sd = sqrt(K (W-1)) / W; a rank saturates only
 * when its share reaches N. N = K/W + AUTO_Z * sd, rounded up to 32 and
 * kept below K, makes that rare on balanced rows (measured). */
#define AUTO_Z 3u

static uint32_t isqrt_ceil(uint32_t x) {
  uint32_t r = 0;
  while (r * r < x)
    r++;
  return r;
}

uint32_t dcpx_shape_auto_local_topk(uint32_t world, uint32_t topk) {
  if (world < 1 || world > DCPX_MAX_WORLD || topk < 2 || topk > DCPX_MAX_TOPK)
    return 0;
  const uint32_t spread = isqrt_ceil(AUTO_Z * AUTO_Z * topk * (world - 1));
  uint32_t n = (topk + spread + world - 1) / world;
  n = (n + 31u) & ~31u;
  return n < topk ? n : topk - 1;
}

const char *dcpx_shape_warning(const dcpx_shape *s) {
  dcpx_shape r;
  if (dcpx_shape_check(s) < 0) /* NULL, a foreign size, a bad shape */
    return NULL;
  s = dcpx__shape_resolved(s, &r);
  if (!s || s->world < 2 || !s->local_topk ||
      (uint64_t)s->world * s->local_topk > s->topk)
    return NULL;
  if ((uint64_t)s->world * (s->topk - 1u) <= s->topk) /* N < K: no N helps */
    return "world * local_topk <= topk: every full row rescues, always "
           "(no local_topk below topk avoids it at this world and topk)";
  return "world * local_topk <= topk: every full row rescues, always "
         "(choose local_topk > topk / world, or 0 for the library's choice)";
}

int dcpx_bf16_isnan(uint32_t bits) { return (bits & 0x7FFFu) > 0x7F80u; }

uint32_t dcpx_ord16(uint32_t b) {
  b &= 0xFFFFu;
  return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
}

uint32_t dcpx_row_words(uint32_t c) {
  if (c == 0 || c > DCPX_MAX_TOPK)
    return 0;
  return DCPX_ROW_WORDS(c);
}

int dcpx_word_encode(uint32_t *words, uint32_t c, uint32_t j, uint32_t ord16,
                     uint32_t l) {
  if (!words || !dcpx__aligned(words, 4) || j >= c || c > DCPX_MAX_TOPK ||
      ord16 == 0 || ord16 > 0xFFFF || l >= DCPX_MAX_LOCAL)
    return DCPX_E_INVAL;
  words[j] = (ord16 << 16) | (l & 0xFFFFu);
  if (l >> 16)
    words[c + j / 32] |= 1u << (j % 32);
  else
    words[c + j / 32] &= ~(1u << (j % 32));
  return 0;
}

int dcpx_word_decode(const uint32_t *words, uint32_t c, uint32_t j,
                     uint32_t *ret_ord16, uint32_t *ret_l) {
  if (!words || !dcpx__aligned(words, 4) || j >= c || c > DCPX_MAX_TOPK)
    return DCPX_E_INVAL;
  uint32_t w = words[j];
  if (w == 0)
    return 0;
  if (ret_ord16)
    *ret_ord16 = w >> 16;
  if (ret_l)
    *ret_l = (w & 0xFFFFu) | (((words[c + j / 32] >> (j % 32)) & 1u) << 16);
  return 1;
}

uint32_t dcpx_epoch_next(uint32_t e) { return e >= 0xFFFFFFFEu ? 1u : e + 1u; }

uint32_t dcpx_epoch_tag(uint32_t w) {
  const uint32_t row = w & 0xFFFFu;
  return ((w + 0x10000u) & 0xFFFF0000u) | (row >= 0xFFFEu ? 1u : row + 1u);
}

uint32_t dcpx_epoch_pass(uint32_t w, uint32_t e) {
  return (e & 0xFFFF0000u) | (w & 0xFFFFu);
}

int dcpx_gid(uint32_t l, uint32_t r, uint32_t world, uint32_t interleave,
             int64_t *ret_gid) {
  if (!world || !interleave || r >= world || !ret_gid)
    return DCPX_E_INVAL;
  if (world > DCPX_MAX_WORLD) /* no group has it, and the product of a
                                 32-bit l and world overflows an int64 */
    return DCPX_E_LIMIT;
  *ret_gid = dcpx__gid(l, r, world, interleave);
  return 0;
}
