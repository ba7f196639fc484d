/* check_ref.c - the CPU reference (common/ref.c, common/merge.c) against a
 * brute-force oracle written from docs/PROTOCOL.md sections 2, 3 and 5 alone.
 *
 * The oracle shares no code with the reference:
 *   - its order comes from the float values: every non-NaN bf16 pattern is
 *     ranked once by widening it to float32 (ties only at +-0, where -0
 *     ranks lower), so it does not even use ord16; ord16 is used only where
 *     docs/PROTOCOL.md puts it in an output (sat_word, wire words), through
 *     its own copy of the formula;
 *   - a row's exact top-K is the first K of all its (value, r, l) keys
 *     sorted with qsort;
 *   - rank r's local top-N list is the first N of rank r's keys in that
 *     same sorted sequence (the order restricted to one rank), S1 the first
 *     K keys that are on some list, the saturation mask and sat_word follow
 *     section 5.2 and 5.6 literally.
 * Every rank d's outputs of dcpx_ref_call are compared with it, and the
 * reference's statistics with the oracle's mask, so the tests also count
 * how often a rescue ran and assert that the adversarial cases that must
 * rescue did, and those that cannot did not.
 *
 * Environment: DCPX_TEST_SEED replaces the base seed (printed at start);
 * every case derives its own seed from it, and failure messages print that
 * case seed. DCPX_TEST_REPLAY=<case seed> makes test_random_small run just
 * that one case. DCPX_TEST_SCALE (percent, default 100) scales the number
 * of random small cases, e.g. 10 under valgrind (with CK_TIMEOUT_MULTIPLIER).
 */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "dcpx.h"
#include "call.h"
#include "merge.h"
#include "rng.h"
#include "brute.h"

static uint64_t g_seed = 0x5EEDDC9C0FFEEull;
static uint32_t g_scale = 100;
static uint64_t g_replay; /* 0: none */

/* ck_assert_msg records a checkpoint (a write to Check's pipe) on every
 * passing assertion; in hot loops we only call into Check on failure. */
#define EXPECT T_EXPECT

/* ---- PRNG --------------------------------------------------------------- */

/* Uniform in [lo, hi]. */
static uint32_t rnd_in(uint64_t *s, uint32_t lo, uint32_t hi) {
  return lo + dcpx_rnd_below(s, hi - lo + 1);
}

/* The seed of case i of a test: reproducible on its own. */
static uint64_t case_seed(uint64_t salt, uint32_t i) {
  uint64_t s = g_seed ^ (salt * 0x100000001B3ull) ^ ((uint64_t)i << 40);
  return dcpx_splitmix64(&s);
}

static void *xcalloc(size_t n, size_t sz) {
  void *p = calloc(n ? n : 1, sz ? sz : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}

/* ---- the oracle's order ------------------------------------------------- */

/* o_rank[b]: position of bf16 pattern b among all non-NaN patterns sorted
 * by float value (-0 below +0); -1 for a NaN. o_bits inverts it. */
static int32_t o_rank[65536];
static uint16_t o_bits[65536];
static uint32_t o_nvalues;

static float bf16_to_float(uint32_t b) {
  uint32_t u = (b & 0xFFFFu) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

static int cmp_bf16_value(const void *a, const void *b) {
  uint16_t x = *(const uint16_t *)a, y = *(const uint16_t *)b;
  float fx = bf16_to_float(x), fy = bf16_to_float(y);
  if (fx != fy)
    return fx < fy ? -1 : 1;
  if (x == y)
    return 0;
  return (x & 0x8000u) ? -1 : 1; /* -0 below +0 */
}

static void oracle_init(void) {
  static uint16_t vals[65536];
  uint32_t n = 0;
  for (uint32_t b = 0; b < 65536; b++) {
    o_rank[b] = -1;
    if (!isnan(bf16_to_float(b)))
      vals[n++] = (uint16_t)b;
  }
  qsort(vals, n, sizeof(vals[0]), cmp_bf16_value);
  for (uint32_t i = 0; i < n; i++) {
    o_rank[vals[i]] = (int32_t)i;
    o_bits[i] = vals[i];
  }
  o_nvalues = n;
}

/* docs/PROTOCOL.md section 2, copied: only for outputs that carry ord16. */
static uint32_t spec_ord16(uint32_t b) {
  b &= 0xFFFFu;
  return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
}

/* A key sorts ascending best-first: (value desc, r asc, l asc). */
static uint64_t okey(uint32_t rank_of_value, uint32_t r, uint32_t l) {
  return ((uint64_t)(0xFFFFu - rank_of_value) << 32) | ((uint64_t)r << 17) |
         l;
}
static uint32_t okey_r(uint64_t k) { return (uint32_t)(k >> 17) & 0x7FFFu; }
static uint32_t okey_l(uint64_t k) { return (uint32_t)k & 0x1FFFFu; }
static uint32_t okey_bits(uint64_t k) {
  return o_bits[0xFFFFu - (uint32_t)(k >> 32)];
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* ---- a test case: one call's inputs for every rank ---------------------- */

typedef struct tcall {
  dcpx_shape sh;
  uint32_t rows;
  uint64_t stride;
  uint16_t *logits[DCPX_MAX_WORLD]; /* [rows][stride] */
  int32_t *row_end[DCPX_MAX_WORLD]; /* [rows] */
  int32_t *req_id[DCPX_MAX_WORLD];  /* [rows], rank's own */
  int32_t *bt[DCPX_MAX_WORLD];      /* [bt_rows][bt_cols], rank's own */
  uint32_t bt_rows, bt_cols;
  int call_auto_n; /* dcpx_ref_call gets local_topk = 0 (sh has its N) */
} tcall;

static void tcall_init(tcall *c, uint32_t W, uint32_t rows, uint32_t K,
                       uint32_t N, uint32_t B, uint32_t I, uint32_t max_local,
                       uint64_t stride, uint32_t bt_rows) {
  dcpx_shape sh = DCPX_SHAPE_INIT;
  memset(c, 0, sizeof(*c));
  sh.world = W;
  sh.rows = rows;
  sh.topk = K;
  sh.local_topk = N;
  sh.block_size = B;
  sh.interleave = I;
  sh.max_local = max_local;
  c->sh = sh;
  c->rows = rows;
  c->stride = stride;
  c->bt_rows = bt_rows;
  c->bt_cols = (max_local + B - 1) / B;
  for (uint32_t r = 0; r < W; r++) {
    c->logits[r] = xcalloc((size_t)rows * stride, sizeof(uint16_t));
    c->row_end[r] = xcalloc(rows, sizeof(int32_t));
    c->req_id[r] = xcalloc(rows, sizeof(int32_t));
    c->bt[r] = xcalloc((size_t)bt_rows * c->bt_cols, sizeof(int32_t));
  }
}

/* Random block tables (each rank its own permutation of the block ids) and
 * random req_ids. */
static void tcall_random_tables(tcall *c, uint64_t *s) {
  size_t n = (size_t)c->bt_rows * c->bt_cols;
  for (uint32_t r = 0; r < c->sh.world; r++) {
    int32_t *bt = c->bt[r];
    for (size_t i = 0; i < n; i++)
      bt[i] = (int32_t)i;
    for (size_t i = n - 1; i > 0; i--) {
      size_t j = dcpx_rnd_below(s, (uint32_t)(i + 1));
      int32_t x = bt[i];
      bt[i] = bt[j];
      bt[j] = x;
    }
    for (uint32_t t = 0; t < c->rows; t++)
      c->req_id[r][t] = (int32_t)dcpx_rnd_below(s, c->bt_rows);
  }
}

static void tcall_free(tcall *c) {
  for (uint32_t r = 0; r < DCPX_MAX_WORLD; r++) {
    free(c->logits[r]);
    free(c->row_end[r]);
    free(c->req_id[r]);
    free(c->bt[r]);
  }
  memset(c, 0, sizeof(*c));
}

static uint16_t *row_of(const tcall *c, uint32_t r, uint32_t t) {
  return c->logits[r] + (uint64_t)t * c->stride;
}

/* ---- the oracle --------------------------------------------------------- */

typedef struct orow {
  uint32_t nsel;             /* |exact top-K| = min(K, non-NaN elements) */
  uint64_t *sel;             /* [K] (r << 17 | l), ascending (r, l) */
  uint32_t mask, sat_word, s1_count;
  int s1_exact; /* S1 is already the exact top-K (no rescue needed) */
} orow;

typedef struct oracle {
  uint32_t rows, K;
  orow *row;
  uint64_t *selbuf;  /* [rows][K] */
  uint64_t *scratch; /* all keys of a row */
  uint64_t rescue_rows, saturated, rescue_changed;
} oracle;

static void oracle_row(const tcall *c, uint32_t t, uint64_t *keys, orow *o) {
  const uint32_t W = c->sh.world, N = c->sh.local_topk, K = c->sh.topk;
  uint32_t n = 0, have[DCPX_MAX_WORLD] = {0};

  for (uint32_t r = 0; r < W; r++) {
    const uint16_t *x = row_of(c, r, t);
    for (uint32_t l = 0; l < (uint32_t)c->row_end[r][t]; l++) {
      int32_t v = o_rank[x[l]];
      if (v < 0)
        continue; /* NaN: never a candidate */
      keys[n++] = okey((uint32_t)v, r, l);
      have[r]++;
    }
  }
  qsort(keys, n, sizeof(keys[0]), cmp_u64);

  /* Round 1, literally: rank r's list is its first min(N, have[r]) keys in
   * the order; S1 the best K keys that are on a list. */
  uint32_t listed[DCPX_MAX_WORLD] = {0}, in_s1[DCPX_MAX_WORLD] = {0};
  uint32_t s1 = 0, kth_bits = 0;
  o->s1_exact = 1;
  for (uint32_t i = 0; i < n && s1 < K; i++) {
    uint32_t r = okey_r(keys[i]);
    if (listed[r] >= N) {
      /* Beyond rank r's list, yet among the best K: S1 misses it. */
      o->s1_exact = 0;
      continue;
    }
    listed[r]++;
    in_s1[r]++;
    if (++s1 == K)
      kth_bits = okey_bits(keys[i]);
  }
  o->mask = 0;
  for (uint32_t r = 0; r < W; r++)
    if (have[r] >= N && in_s1[r] == N)
      o->mask |= 1u << r;
  o->s1_count = s1;
  o->sat_word = (o->mask << 16) | (s1 == K ? spec_ord16(kth_bits) : 0);

  /* The exact top-K, then in (r, l) order. */
  o->nsel = n < K ? n : K;
  for (uint32_t i = 0; i < o->nsel; i++)
    o->sel[i] = ((uint64_t)okey_r(keys[i]) << 17) | okey_l(keys[i]);
  qsort(o->sel, o->nsel, sizeof(o->sel[0]), cmp_u64);
}

static void oracle_build(const tcall *c, oracle *o) {
  const uint32_t W = c->sh.world, K = c->sh.topk;
  uint64_t maxn = 0;
  for (uint32_t t = 0; t < c->rows; t++) {
    uint64_t n = 0;
    for (uint32_t r = 0; r < W; r++)
      n += (uint32_t)c->row_end[r][t];
    if (n > maxn)
      maxn = n;
  }
  memset(o, 0, sizeof(*o));
  o->rows = c->rows;
  o->K = K;
  o->row = xcalloc(c->rows, sizeof(orow));
  o->selbuf = xcalloc((size_t)c->rows * K, sizeof(uint64_t));
  o->scratch = xcalloc(maxn, sizeof(uint64_t));
  for (uint32_t t = 0; t < c->rows; t++) {
    o->row[t].sel = o->selbuf + (size_t)t * K;
    oracle_row(c, t, o->scratch, &o->row[t]);
    /* Section 5.2-5.3, checked on the oracle itself: if S1 is not the
     * exact top-K, some rank is saturated. */
    EXPECT(o->row[t].s1_exact || o->row[t].mask,
           "oracle: S1 is not the top-K but no rank is saturated (t=%u)", t);
    o->rescue_changed += !o->row[t].s1_exact;
    o->rescue_rows += o->row[t].mask != 0;
    o->saturated += (uint64_t)__builtin_popcount(o->row[t].mask);
  }
}

static void oracle_free(oracle *o) {
  free(o->row);
  free(o->selbuf);
  free(o->scratch);
  memset(o, 0, sizeof(*o));
}

/* ---- comparing every rank's outputs with the oracle --------------------- */

#define SENTINEL ((int32_t)0x7EEEEEEE)

/* The counts a test accumulates over its cases. */
typedef struct counts {
  uint64_t cases, rows, rescue_rows, saturated, no_rescue_rows, sel_hi;
  uint64_t rescue_changed; /* rows where S1 was not the exact top-K */
} counts;

/* Runs dcpx_ref_call for every rank d and compares every output with the
 * oracle. `what` and `seed` identify the case in failure messages. Adds
 * the oracle's rescue counts (checked equal to the reference's stats) to
 * *acc. */
static void check_call(const tcall *c, const char *what, uint64_t seed,
                       counts *acc) {
  const uint32_t W = c->sh.world, K = c->sh.topk, B = c->sh.block_size,
                 I = c->sh.interleave, rows = c->rows;
  oracle o;
  oracle_build(c, &o);

  int32_t *rows_out = xcalloc((size_t)rows * K, sizeof(int32_t));
  int32_t *ids_out = xcalloc((size_t)rows * K, sizeof(int32_t));
  int32_t *valid = xcalloc(rows, sizeof(int32_t));
  uint32_t *sat = xcalloc(rows, sizeof(uint32_t));
  const uint16_t *lg[DCPX_MAX_WORLD];
  const int32_t *re[DCPX_MAX_WORLD];
  for (uint32_t r = 0; r < W; r++) {
    lg[r] = c->logits[r];
    re[r] = c->row_end[r];
  }

  for (uint32_t d = 0; d < W; d++) {
    for (size_t i = 0; i < (size_t)rows * K; i++)
      rows_out[i] = ids_out[i] = SENTINEL;
    for (uint32_t t = 0; t < rows; t++) {
      valid[t] = SENTINEL;
      sat[t] = 0xEEEEEEEEu;
    }
    dcpx_ref_stats st = {0, 0, 0};
    dcpx_shape csh = c->sh;
    if (c->call_auto_n)
      csh.local_topk = 0;
    int rc = t_ref_call(&csh, rows, lg, c->stride, re, d, c->req_id[d],
                           c->bt[d], c->bt_rows, c->bt_cols, rows_out, valid,
                           ids_out, sat, &st);
    EXPECT(rc == 0, "%s seed=0x%" PRIx64 " d=%u: dcpx_ref_call = %d (%s)",
           what, seed, d, rc, dcpx_strerror(rc));
    EXPECT(st.rows == rows && st.rescue_rows == o.rescue_rows &&
               st.saturated == o.saturated,
           "%s seed=0x%" PRIx64 " d=%u: stats rows %" PRIu64
           " rescue_rows %" PRIu64 " saturated %" PRIu64 ", oracle %u %" PRIu64
           " %" PRIu64,
           what, seed, d, st.rows, st.rescue_rows, st.saturated, rows,
           o.rescue_rows, o.saturated);

    for (uint32_t t = 0; t < rows; t++) {
      const orow *x = &o.row[t];
      const int32_t *ro = rows_out + (size_t)t * K,
                    *io = ids_out + (size_t)t * K;
      EXPECT(sat[t] == x->sat_word,
             "%s seed=0x%" PRIx64 " t=%u d=%u: sat_word 0x%08x, want 0x%08x "
             "(|S1| %u)",
             what, seed, t, d, sat[t], x->sat_word, x->s1_count);
      /* ids_out: gids of all selected, (r, l) order, -1 padded. */
      for (uint32_t i = 0; i < K; i++) {
        int64_t want = -1;
        if (i < x->nsel) {
          uint32_t r = (uint32_t)(x->sel[i] >> 17), l = x->sel[i] & 0x1FFFFu;
          want = (int64_t)(l / I) * I * W + (int64_t)r * I + l % I;
        }
        EXPECT(io[i] == want,
               "%s seed=0x%" PRIx64 " t=%u d=%u: ids_out[%u] = %d, want "
               "%" PRId64 " (nsel %u, sel (r=%u, l=%u))",
               what, seed, t, d, i, io[i], want, x->nsel,
               i < x->nsel ? (uint32_t)(x->sel[i] >> 17) : 0u,
               i < x->nsel ? (uint32_t)(x->sel[i] & 0x1FFFFu) : 0u);
      }
      /* rows_out: d's own elements in ascending l, through d's table. */
      uint32_t v = 0;
      const int32_t *bt = c->bt[d] + (size_t)c->req_id[d][t] * c->bt_cols;
      for (uint32_t i = 0; i < x->nsel; i++) {
        uint32_t r = (uint32_t)(x->sel[i] >> 17), l = x->sel[i] & 0x1FFFFu;
        if (r != d)
          continue;
        int32_t want = bt[l / B] * (int32_t)B + (int32_t)(l % B);
        EXPECT(ro[v] == want,
               "%s seed=0x%" PRIx64 " t=%u d=%u: rows_out[%u] = %d, want %d "
               "(l=%u, B=%u)",
               what, seed, t, d, v, ro[v], want, l, B);
        v++;
        if (l >= (1u << 16))
          acc->sel_hi++;
      }
      EXPECT(valid[t] == (int32_t)v,
             "%s seed=0x%" PRIx64 " t=%u d=%u: valid_out %d, want %u", what,
             seed, t, d, valid[t], v);
      for (uint32_t i = v; i < K; i++)
        EXPECT(ro[i] == -1,
               "%s seed=0x%" PRIx64 " t=%u d=%u: rows_out[%u] = %d, want -1 "
               "(valid %u)",
               what, seed, t, d, i, ro[i], v);
    }
  }

  /* ids_out and sat_word are optional. */
  for (uint32_t t = 0; t < rows; t++)
    valid[t] = SENTINEL;
  int rc = t_ref_call(&c->sh, rows, lg, c->stride, re, 0, c->req_id[0],
                         c->bt[0], c->bt_rows, c->bt_cols, rows_out, valid,
                         NULL, NULL, NULL);
  EXPECT(rc == 0, "%s seed=0x%" PRIx64 ": call without optional outputs = %d",
         what, seed, rc);
  for (uint32_t t = 0; t < rows; t++) {
    uint32_t v = 0;
    for (uint32_t i = 0; i < o.row[t].nsel; i++)
      v += (o.row[t].sel[i] >> 17) == 0;
    EXPECT(valid[t] == (int32_t)v,
           "%s seed=0x%" PRIx64 " t=%u: valid_out %d without optional "
           "outputs, want %u",
           what, seed, t, valid[t], v);
  }

  acc->cases++;
  acc->rows += rows;
  acc->rescue_rows += o.rescue_rows;
  acc->saturated += o.saturated;
  acc->no_rescue_rows += rows - o.rescue_rows;
  acc->rescue_changed += o.rescue_changed;
  free(rows_out);
  free(ids_out);
  free(valid);
  free(sat);
  oracle_free(&o);
}

static void print_counts(const char *what, const counts *k) {
  printf("check_ref: %-20s cases %4" PRIu64 " rows %5" PRIu64
         " | rescue rows %5" PRIu64 " (changed the result %5" PRIu64
         ") | no-rescue rows %5" PRIu64 " | saturated ranks %6" PRIu64
         " | selected l>=2^16 %" PRIu64 "\n",
         what, k->cases, k->rows, k->rescue_rows, k->rescue_changed,
         k->no_rescue_rows, k->saturated, k->sel_hi);
  fflush(stdout);
}

/* ---- logits generators -------------------------------------------------- */

enum dist {
  D_BITS,     /* uniform random 16 bits: NaNs, infs, denormals, all */
  D_NARROW,   /* a few adjacent patterns: ties everywhere */
  D_DISCRETE, /* a small palette shared by all ranks */
  D_SPECIAL,  /* NaN, +-inf, +-0 and a few ordinary values */
  D_BIASED,   /* one rank holds the best values */
  D_FINITE,   /* random finite values, few ties */
  D_NDIST
};

static const uint16_t specials[] = {
    0x7FC0, 0xFFC0, 0x7F81, 0xFFFF, /* NaNs */
    0x7F80, 0xFF80,                 /* +inf, -inf */
    0x0000, 0x8000,                 /* +0, -0 */
    0x0001, 0x8001,                 /* smallest denormals */
    0x3F80, 0xBF80,                 /* +-1 */
    0x7F7F, 0xFF7F,                 /* +-max finite */
};
#define NSPECIALS (sizeof(specials) / sizeof(specials[0]))

typedef struct gen {
  enum dist dist;
  uint16_t palette[6];
  uint32_t npal;
  uint16_t base;  /* D_NARROW */
  uint32_t width; /* D_NARROW */
  uint32_t hot;   /* D_BIASED: the rank that holds the best values */
} gen;

static uint16_t random_finite(uint64_t *s) {
  for (;;) {
    uint16_t b = (uint16_t)dcpx_splitmix64(s);
    if ((b & 0x7F80u) != 0x7F80u)
      return b;
  }
}

static void gen_init(gen *g, uint64_t *s, enum dist d, uint32_t W) {
  memset(g, 0, sizeof(*g));
  g->dist = d;
  g->npal = rnd_in(s, 1, 6);
  for (uint32_t i = 0; i < g->npal; i++)
    g->palette[i] = dcpx_rnd_below(s, 3) == 0 ? specials[dcpx_rnd_below(s, NSPECIALS)]
                                         : random_finite(s);
  g->base = random_finite(s);
  g->width = rnd_in(s, 1, 8);
  g->hot = dcpx_rnd_below(s, W);
}

static uint16_t gen_value(const gen *g, uint64_t *s, uint32_t r) {
  switch (g->dist) {
  case D_BITS:
    return (uint16_t)dcpx_splitmix64(s);
  case D_NARROW:
    return (uint16_t)(g->base + dcpx_rnd_below(s, g->width));
  case D_DISCRETE:
    return g->palette[dcpx_rnd_below(s, g->npal)];
  case D_SPECIAL:
    return dcpx_rnd_below(s, 4) ? specials[dcpx_rnd_below(s, NSPECIALS)]
                           : (uint16_t)dcpx_splitmix64(s);
  case D_BIASED:
    /* The hot rank: positive values 2^8..2^9 mostly; the others: below 1,
     * with some overlap so that the cut is not trivial. */
    if (r == g->hot)
      return dcpx_rnd_below(s, 8) ? (uint16_t)(0x4380 + dcpx_rnd_below(s, 0x80))
                             : (uint16_t)(0x3F00 + dcpx_rnd_below(s, 0x100));
    return (uint16_t)(0x3E00 + dcpx_rnd_below(s, 0x180));
  case D_FINITE:
  default:
    return random_finite(s);
  }
}

/* A row length drawn to hit the interesting boundaries around N, K and
 * max_local. */
static uint32_t pick_len(uint64_t *s, uint32_t N, uint32_t K, uint32_t max) {
  uint32_t v;
  switch (dcpx_rnd_below(s, 10)) {
  case 0:
    v = 0;
    break;
  case 1:
    v = dcpx_rnd_below(s, N); /* shorter than N */
    break;
  case 2:
    v = N;
    break;
  case 3:
    v = N + 1;
    break;
  case 4:
    v = K;
    break;
  case 5:
    v = max;
    break;
  default:
    v = rnd_in(s, 0, max);
  }
  return v > max ? max : v;
}

static const uint32_t Bs[] = {1, 16, 64};
static const uint32_t Is[] = {1, 2, 3, 64};

/* Fills c (already initialised) with logits and row ends. One
 * distribution per case, or (mixed) one per (rank, row). */
static void fill_random(tcall *c, uint64_t *s, int mixed, enum dist d) {
  const uint32_t W = c->sh.world, N = c->sh.local_topk, K = c->sh.topk;
  gen g;
  gen_init(&g, s, d, W);
  for (uint32_t t = 0; t < c->rows; t++)
    for (uint32_t r = 0; r < W; r++) {
      if (mixed)
        gen_init(&g, s, (enum dist)dcpx_rnd_below(s, D_NDIST), W);
      uint32_t len = pick_len(s, N, K, c->sh.max_local);
      c->row_end[r][t] = (int32_t)len;
      uint16_t *x = row_of(c, r, t);
      for (uint32_t l = 0; l < len; l++)
        x[l] = gen_value(&g, s, r);
      /* Garbage past row_end must be ignored: make it the best value. */
      for (uint64_t l = len; l < c->stride; l++)
        x[l] = 0x7F80;
    }
}

/* N for a given K: values that are and are not multiples of 32. */
static uint32_t pick_N(uint64_t *s, uint32_t K, uint32_t W) {
  const uint32_t cand[] = {1, 7, 31, 32, 33, 100, K - 1, K / 2, K / W,
                           K / (W + 1), rnd_in(s, 1, K - 1)};
  uint32_t n = cand[dcpx_rnd_below(s, sizeof(cand) / sizeof(cand[0]))];
  if (n == 0 || n >= K)
    n = rnd_in(s, 1, K - 1);
  return n;
}

static uint32_t pick_K(uint64_t *s) {
  switch (dcpx_rnd_below(s, 10)) {
  case 0:
    return 2;
  case 1:
  case 2:
  case 3:
    return rnd_in(s, 2, 64);
  case 4:
  case 5:
  case 6:
    return rnd_in(s, 65, 512);
  case 7:
    return 4096;
  default:
    return rnd_in(s, 513, 4096);
  }
}

/* One random case of the small suite. */
static int g_auto_n; /* random cases with local_topk = 0 (the library's N) */

static void random_case(uint64_t seed, counts *acc) {
  uint64_t s = seed;
  tcall c;
  uint32_t W = rnd_in(&s, 1, 16), K = pick_K(&s), N = pick_N(&s, K, W);
  const uint32_t auto_n = g_auto_n ? dcpx_shape_auto_local_topk(W, K) : 0;
  if (auto_n)
    N = auto_n;
  uint32_t B = Bs[dcpx_rnd_below(&s, 3)], I = Is[dcpx_rnd_below(&s, 4)];
  uint32_t rows = rnd_in(&s, 1, 4);
  /* Keep the work per case around W * rows * max_local <= 48k. */
  uint32_t budget = 48000 / (W * rows);
  uint32_t max_local = rnd_in(&s, 1, budget < 2 * K + 64 ? budget : 2 * K + 64);
  if (dcpx_rnd_below(&s, 8) == 0)
    max_local = rnd_in(&s, 1, 16);
  uint64_t stride = max_local + dcpx_rnd_below(&s, 5);
  tcall_init(&c, W, rows, K, N, B, I, max_local, stride, rnd_in(&s, 1, 3));
  c.call_auto_n = auto_n != 0;
  if (dcpx_rnd_below(&s, 4) == 0)
    c.sh.rows = rows + dcpx_rnd_below(&s, 3); /* a call below the shape's rows */
  tcall_random_tables(&c, &s);
  int mixed = dcpx_rnd_below(&s, 3) == 0;
  fill_random(&c, &s, mixed, (enum dist)dcpx_rnd_below(&s, D_NDIST));
  char what[160];
  snprintf(what, sizeof(what),
           "random W=%u K=%u N=%u B=%u I=%u rows=%u max_local=%u", W, K, N, B,
           I, rows, max_local);
  check_call(&c, what, seed, acc);
  tcall_free(&c);
}

/* ---- random suite ------------------------------------------------------- */

START_TEST(test_random_small) {
  counts k = {0};
  uint32_t n = 1500 * g_scale / 100;
  if (n < 20)
    n = 20;
  if (g_replay) {
    random_case(g_replay, &k);
    print_counts("replayed case", &k);
    return;
  }
  for (uint32_t i = 0; i < n; i++)
    random_case(case_seed(1, i), &k);
  print_counts("random small", &k);
  /* Both paths must have been exercised, a lot. */
  ck_assert_msg(k.rescue_rows * 5 >= k.rows,
                "rescue ran in only %" PRIu64 " of %" PRIu64 " rows",
                k.rescue_rows, k.rows);
  ck_assert_msg(k.no_rescue_rows * 10 >= k.rows,
                "no-rescue path in only %" PRIu64 " of %" PRIu64 " rows",
                k.no_rescue_rows, k.rows);
  ck_assert_msg(k.saturated > k.rescue_rows,
                "never more than one saturated rank in a row");
  ck_assert_msg(k.rescue_changed * 10 >= k.rows,
                "the rescue changed the result in only %" PRIu64 " of %" PRIu64
                " rows",
                k.rescue_changed, k.rows);
}
END_TEST

/* local_topk = 0 in the shape means the library's N
 * (dcpx_shape_auto_local_topk), for dcpx_ref_call as for dcpx_join: exact
 * against the oracle, where it once divided by zero. */
START_TEST(test_ref_call_auto_n) {
  counts k = {0};
  g_auto_n = 1;
  for (uint32_t i = 0; i < 60; i++)
    random_case(case_seed(7, i), &k);
  g_auto_n = 0;
  print_counts("local_topk 0", &k);
  ck_assert_uint_gt(k.rows, 0);
  ck_assert_uint_gt(k.rescue_rows, 0); /* both paths ran */
  ck_assert_uint_gt(k.no_rescue_rows, 0);
}
END_TEST

/* A few rows as large as the limits allow. */
static void large_case(uint64_t seed, uint32_t W, uint32_t K, uint32_t N,
                       uint32_t rows, uint32_t B, uint32_t I, enum dist d,
                       int hot_high, counts *acc) {
  uint64_t s = seed;
  tcall c;
  uint32_t max_local = DCPX_MAX_LOCAL;
  tcall_init(&c, W, rows, K, N, B, I, max_local, max_local, 2);
  tcall_random_tables(&c, &s);
  gen g;
  gen_init(&g, &s, d, W);
  for (uint32_t t = 0; t < rows; t++)
    for (uint32_t r = 0; r < W; r++) {
      uint32_t len = t == 0 ? max_local : pick_len(&s, N, K, max_local);
      c.row_end[r][t] = (int32_t)len;
      uint16_t *x = row_of(&c, r, t);
      for (uint32_t l = 0; l < len; l++)
        x[l] = gen_value(&g, &s, r);
      if (hot_high && r == g.hot)
        /* The best values of the hot rank, all at l >= 2^16 (plane bit). */
        for (uint32_t j = 0; j < K + 17 && (1u << 16) + 3 * j < len; j++)
          x[(1u << 16) + 3 * j] = (uint16_t)(0x4700 + dcpx_rnd_below(&s, 0x80));
    }
  char what[160];
  snprintf(what, sizeof(what), "large W=%u K=%u N=%u B=%u I=%u rows=%u dist=%d",
           W, K, N, B, I, rows, (int)d);
  check_call(&c, what, seed, acc);
  tcall_free(&c);
}

START_TEST(test_random_large) {
  counts k = {0};
  large_case(case_seed(2, 0), 16, 4096, 256, 1, 64, 64, D_BITS, 0, &k);
  large_case(case_seed(2, 1), 8, 2048, 100, 2, 16, 3, D_BIASED, 1, &k);
  large_case(case_seed(2, 2), 2, 4096, 4095, 1, 1, 1, D_NARROW, 0, &k);
  large_case(case_seed(2, 3), 3, 1000, 33, 2, 64, 2, D_FINITE, 1, &k);
  large_case(case_seed(2, 4), 4, 4096, 7, 1, 16, 1, D_DISCRETE, 0, &k);
  print_counts("random large", &k);
  ck_assert_msg(k.rescue_changed >= 1, "no large row needed its rescue");
  ck_assert_msg(k.rescue_rows >= 2, "large rows rescued only %" PRIu64 " times",
                k.rescue_rows);
  ck_assert_msg(k.sel_hi > 0, "no selected element had l >= 2^16");
}
END_TEST

/* ---- adversarial rows --------------------------------------------------- */

/* A call with every rank's rows filled by a callback. */
typedef void (*fill_fn)(tcall *c, uint32_t t, uint32_t r, uint64_t *s);

static void run_filled(const char *what, uint64_t seed, uint32_t W,
                       uint32_t K, uint32_t N, uint32_t B, uint32_t I,
                       uint32_t rows, uint32_t max_local, fill_fn fill,
                       counts *acc) {
  uint64_t s = seed;
  tcall c;
  tcall_init(&c, W, rows, K, N, B, I, max_local, max_local, 2);
  tcall_random_tables(&c, &s);
  for (uint32_t t = 0; t < rows; t++)
    for (uint32_t r = 0; r < W; r++)
      fill(&c, t, r, &s);
  char buf[200];
  snprintf(buf, sizeof(buf), "%s W=%u K=%u N=%u B=%u I=%u", what, W, K, N, B,
           I);
  check_call(&c, buf, seed, acc);
  tcall_free(&c);
}

static void fill_equal(tcall *c, uint32_t t, uint32_t r, uint64_t *s) {
  uint32_t len = t % 2 ? rnd_in(s, 0, c->sh.max_local) : c->sh.max_local;
  c->row_end[r][t] = (int32_t)len;
  uint16_t v = t % 3 == 0 ? 0x3F80 : t % 3 == 1 ? 0x0000 : 0xFF80;
  for (uint32_t l = 0; l < len; l++)
    row_of(c, r, t)[l] = v;
}

/* Hand-checked first: all equal, W=4, K=64, N=20: S1 is ranks 0-2's lists
 * and 4 of rank 3's, ranks 0-2 are saturated, and the exact top-K is rank
 * 0's first 64 elements. */
START_TEST(test_all_equal) {
  counts k = {0};
  tcall c;
  tcall_init(&c, 4, 1, 64, 20, 16, 2, 200, 200, 1);
  for (uint32_t r = 0; r < 4; r++) {
    c.row_end[r][0] = 200;
    for (uint32_t l = 0; l < 200; l++)
      row_of(&c, r, 0)[l] = 0x3F80;
    for (uint32_t b = 0; b < c.bt_cols; b++)
      c.bt[r][b] = (int32_t)(c.bt_cols - 1 - b); /* reversed blocks */
  }
  int32_t rows_out[64], ids[64], valid;
  uint32_t sat;
  const uint16_t *lg[4] = {c.logits[0], c.logits[1], c.logits[2], c.logits[3]};
  const int32_t *re[4] = {c.row_end[0], c.row_end[1], c.row_end[2],
                          c.row_end[3]};
  dcpx_ref_stats st = {0, 0, 0};
  ck_assert_int_eq(t_ref_call(&c.sh, 1, lg, c.stride, re, 0, c.req_id[0],
                                 c.bt[0], 1, c.bt_cols, rows_out, &valid, ids,
                                 &sat, &st),
                   0);
  ck_assert_int_eq(valid, 64);
  ck_assert_uint_eq(sat, (0x7u << 16) | 0xBF80u);
  ck_assert_uint_eq(st.rescue_rows, 1);
  ck_assert_uint_eq(st.saturated, 3);
  for (uint32_t i = 0; i < 64; i++) {
    /* l = i; I=2, W=4: gid = (i/2)*8 + i%2; block (12 - i/16), B=16. */
    ck_assert_int_eq(ids[i], (int32_t)((i / 2) * 8 + i % 2));
    ck_assert_int_eq(rows_out[i], (int32_t)((12 - i / 16) * 16 + i % 16));
  }
  ck_assert_int_eq(t_ref_call(&c.sh, 1, lg, c.stride, re, 1, c.req_id[1],
                                 c.bt[1], 1, c.bt_cols, rows_out, &valid, NULL,
                                 NULL, NULL),
                   0);
  ck_assert_int_eq(valid, 0);
  for (uint32_t i = 0; i < 64; i++)
    ck_assert_int_eq(rows_out[i], -1);
  tcall_free(&c);

  /* The same through the oracle, on many shapes. */
  uint64_t s = case_seed(3, 0);
  for (uint32_t i = 0; i < 60; i++) {
    uint32_t W = rnd_in(&s, 1, 16), K = rnd_in(&s, 2, 300);
    uint32_t N = pick_N(&s, K, W);
    run_filled("all-equal", case_seed(3, i + 1), W, K, N, Bs[i % 3],
               Is[i % 4], 3, rnd_in(&s, 1, 2 * K), fill_equal, &k);
  }
  print_counts("all equal", &k);
  ck_assert_uint_gt(k.rescue_rows, 20);
  ck_assert_uint_gt(k.rescue_changed, 10);
}
END_TEST

/* Ties exactly at the K-th value: every rank has a few distinct values
 * above v, a run of v, and values below. */
static uint32_t g_ties_above;
static void fill_ties_kth(tcall *c, uint32_t t, uint32_t r, uint64_t *s) {
  uint32_t len = c->sh.max_local;
  uint16_t *x = row_of(c, r, t);
  c->row_end[r][t] = (int32_t)len;
  /* Half of the values are v = 0x4000 (2.0), the rest below it; then a
   * few distinct values above v (0x4100..) at random positions. */
  for (uint32_t l = 0; l < len; l++)
    x[l] = dcpx_rnd_below(s, 2) ? 0x4000 : (uint16_t)(0x3000 + dcpx_rnd_below(s, 0x100));
  for (uint32_t j = 0; j < g_ties_above; j++)
    x[dcpx_rnd_below(s, len)] = (uint16_t)(0x4100 + r * 64 + j % 64);
  (void)t;
}

START_TEST(test_ties_at_kth) {
  counts k = {0};
  uint64_t s = case_seed(4, 0);
  for (uint32_t i = 0; i < 80; i++) {
    uint32_t W = rnd_in(&s, 2, 16), K = rnd_in(&s, 8, 512);
    uint32_t N = pick_N(&s, K, W);
    /* Fewer than K values above v in all, so the K-th key is a v. */
    g_ties_above = rnd_in(&s, 0, (K - 1) / W);
    /* About W * max_local / 2 >= K + W copies of v. */
    run_filled("ties-at-kth", case_seed(4, i + 1), W, K, N, Bs[i % 3],
               Is[i % 4], 2, rnd_in(&s, 2 * K / W + 2, 2 * K + 2),
               fill_ties_kth, &k);
  }
  print_counts("ties at K-th", &k);
  ck_assert_uint_gt(k.rescue_rows, 10);
  ck_assert_uint_gt(k.rescue_changed, 5);
  ck_assert_uint_gt(k.no_rescue_rows, 10);
}
END_TEST

static void fill_special(tcall *c, uint32_t t, uint32_t r, uint64_t *s) {
  uint32_t len = rnd_in(s, 0, c->sh.max_local);
  uint16_t *x = row_of(c, r, t);
  c->row_end[r][t] = (int32_t)len;
  uint32_t mode = t % 4;
  for (uint32_t l = 0; l < len; l++) {
    if (mode == 0) /* only +-0 */
      x[l] = dcpx_rnd_below(s, 2) ? 0x0000 : 0x8000;
    else if (mode == 1) /* only NaNs and -inf */
      x[l] = dcpx_rnd_below(s, 3) ? specials[dcpx_rnd_below(s, 4)] : 0xFF80;
    else if (mode == 2) /* the whole zoo */
      x[l] = specials[dcpx_rnd_below(s, NSPECIALS)];
    else /* NaN everywhere */
      x[l] = specials[dcpx_rnd_below(s, 4)];
  }
}

/* Hand-checked: -0 on rank 0 against +0 on rank 1: +0 wins despite its
 * higher rank; NaN is never selected; -inf is. */
START_TEST(test_special_values) {
  static const uint16_t r0[] = {0x8000, 0x7FC0, 0x8000, 0xFF80};
  static const uint16_t r1[] = {0xFFC1, 0x0000, 0x7F81};
  tcall c;
  tcall_init(&c, 2, 1, 3, 1, 1, 1, 4, 4, 1);
  memcpy(row_of(&c, 0, 0), r0, sizeof(r0));
  memcpy(row_of(&c, 1, 0), r1, sizeof(r1));
  c.row_end[0][0] = 4;
  c.row_end[1][0] = 3;
  for (uint32_t r = 0; r < 2; r++)
    for (uint32_t b = 0; b < 4; b++)
      c.bt[r][b] = (int32_t)(10 * r + b);
  const uint16_t *lg[2] = {c.logits[0], c.logits[1]};
  const int32_t *re[2] = {c.row_end[0], c.row_end[1]};
  int32_t ro[3], ids[3], valid;
  uint32_t sat;
  ck_assert_int_eq(t_ref_call(&c.sh, 1, lg, 4, re, 0, c.req_id[0], c.bt[0],
                                 1, 4, ro, &valid, ids, &sat, NULL),
                   0);
  /* Top-3: +0 (1,1), -0 (0,0), -0 (0,2); -inf (0,3) is 4th. */
  ck_assert_int_eq(valid, 2);
  ck_assert_int_eq(ro[0], 0);
  ck_assert_int_eq(ro[1], 2);
  ck_assert_int_eq(ro[2], -1);
  ck_assert_int_eq(ids[0], 0); /* (0,0): 0 */
  ck_assert_int_eq(ids[1], 4); /* (0,2): 2*2 */
  ck_assert_int_eq(ids[2], 3); /* (1,1): 1*2 + 1 */
  /* S1 = {(0,0) -0, (1,1) +0}: count 2 < K, both full ranks saturated. */
  ck_assert_uint_eq(sat, 0x3u << 16);
  tcall_free(&c);

  counts k = {0};
  uint64_t s = case_seed(5, 0);
  for (uint32_t i = 0; i < 80; i++) {
    uint32_t W = rnd_in(&s, 1, 16), K = rnd_in(&s, 2, 200);
    uint32_t N = pick_N(&s, K, W);
    run_filled("special", case_seed(5, i + 1), W, K, N, Bs[i % 3], Is[i % 4],
               4, rnd_in(&s, 1, 3 * K), fill_special, &k);
  }
  print_counts("special values", &k);
  ck_assert_uint_gt(k.rescue_rows, 10);
}
END_TEST

/* Empty rows and rows shorter than N: no rank is ever full, so no rescue
 * can run. */
static void fill_short(tcall *c, uint32_t t, uint32_t r, uint64_t *s) {
  uint32_t len = t == 0 ? 0 : dcpx_rnd_below(s, c->sh.local_topk);
  uint16_t *x = row_of(c, r, t);
  c->row_end[r][t] = (int32_t)len;
  for (uint32_t l = 0; l < len; l++)
    x[l] = dcpx_rnd_below(s, 2) ? (uint16_t)dcpx_splitmix64(s) : 0x3F80;
}

START_TEST(test_short_rows) {
  counts k = {0};
  uint64_t s = case_seed(6, 0);
  for (uint32_t i = 0; i < 80; i++) {
    uint32_t W = rnd_in(&s, 1, 16), K = rnd_in(&s, 2, 600);
    uint32_t N = pick_N(&s, K, W);
    run_filled("short", case_seed(6, i + 1), W, K, N, Bs[i % 3], Is[i % 4], 3,
               N + 5, fill_short, &k);
  }
  print_counts("empty/short rows", &k);
  ck_assert_msg(k.rescue_rows == 0,
                "a rescue ran in %" PRIu64 " rows where no list is full",
                k.rescue_rows);

  /* All rows empty: nothing selected, sat_word 0. */
  tcall c;
  tcall_init(&c, 3, 2, 10, 4, 1, 1, 8, 8, 1);
  const uint16_t *lg[3] = {c.logits[0], c.logits[1], c.logits[2]};
  const int32_t *re[3] = {c.row_end[0], c.row_end[1], c.row_end[2]};
  int32_t ro[20], ids[20], valid[2];
  uint32_t sat[2] = {1, 1};
  ck_assert_int_eq(t_ref_call(&c.sh, 2, lg, 8, re, 2, c.req_id[2], c.bt[2],
                                 1, 8, ro, valid, ids, sat, NULL),
                   0);
  for (int t = 0; t < 2; t++) {
    ck_assert_int_eq(valid[t], 0);
    ck_assert_uint_eq(sat[t], 0);
  }
  for (int i = 0; i < 20; i++) {
    ck_assert_int_eq(ro[i], -1);
    ck_assert_int_eq(ids[i], -1);
  }
  tcall_free(&c);
}
END_TEST

/* Every rank saturated: K >= W*N and every rank has at least N elements. */
static void fill_full(tcall *c, uint32_t t, uint32_t r, uint64_t *s) {
  uint32_t len = rnd_in(s, c->sh.local_topk, c->sh.max_local);
  uint16_t *x = row_of(c, r, t);
  c->row_end[r][t] = (int32_t)len;
  for (uint32_t l = 0; l < len; l++)
    x[l] = random_finite(s);
}

START_TEST(test_all_saturated) {
  counts k = {0};
  uint64_t s = case_seed(7, 0);
  for (uint32_t i = 0; i < 60; i++) {
    uint32_t W = rnd_in(&s, 1, 16), N = rnd_in(&s, 1, 40);
    uint32_t K = rnd_in(&s, W * N < 2 ? 2 : W * N, W * N + 50);
    if (K <= N)
      K = N + 1;
    uint64_t before = k.saturated;
    run_filled("all-saturated", case_seed(7, i + 1), W, K, N, Bs[i % 3],
               Is[i % 4], 3, rnd_in(&s, N, 3 * K), fill_full, &k);
    /* Every row must have had every rank saturated. */
    ck_assert_msg(k.saturated - before == 3u * W,
                  "case %u (W=%u K=%u N=%u): %" PRIu64 " saturated ranks in 3 "
                  "rows, want %u",
                  i, W, K, N, k.saturated - before, 3u * W);
  }
  print_counts("all saturated", &k);
  ck_assert_msg(k.rescue_rows == k.rows, "rescue ran in %" PRIu64 " of %" PRIu64
                " rows", k.rescue_rows, k.rows);

  /* And through sat_word directly: mask = all ranks. */
  tcall c;
  tcall_init(&c, 5, 1, 15, 3, 1, 1, 10, 10, 1);
  for (uint32_t r = 0; r < 5; r++) {
    c.row_end[r][0] = 10;
    for (uint32_t l = 0; l < 10; l++)
      row_of(&c, r, 0)[l] = (uint16_t)(0x3F80 + 16 * l + r);
  }
  const uint16_t *lg[5];
  const int32_t *re[5];
  for (int r = 0; r < 5; r++) {
    lg[r] = c.logits[r];
    re[r] = c.row_end[r];
    for (uint32_t b = 0; b < 10; b++)
      c.bt[r][b] = (int32_t)b;
  }
  int32_t ro[15], valid;
  uint32_t sat;
  dcpx_ref_stats st = {0, 0, 0};
  ck_assert_int_eq(t_ref_call(&c.sh, 1, lg, 10, re, 4, c.req_id[4], c.bt[4],
                                 1, 10, ro, &valid, NULL, &sat, &st),
                   0);
  /* Values grow with l, so each list is l = 7, 8, 9; S1 is all 15 of
   * them, the K-th (worst) is rank 0's l = 7. Round 2 gives the same 15. */
  ck_assert_uint_eq(sat, (0x1Fu << 16) | spec_ord16(0x3F80 + 16 * 7));
  ck_assert_uint_eq(st.saturated, 5);
  ck_assert_int_eq(valid, 3);
  ck_assert_int_eq(ro[0], 7);
  ck_assert_int_eq(ro[1], 8);
  ck_assert_int_eq(ro[2], 9);
  tcall_free(&c);
}
END_TEST

/* One rank holds the whole top-K, with N < K: it must be rescued. */
static uint32_t g_hot_rank;
static void fill_one_rank(tcall *c, uint32_t t, uint32_t r, uint64_t *s) {
  uint32_t len = c->sh.max_local;
  uint16_t *x = row_of(c, r, t);
  c->row_end[r][t] = (int32_t)len;
  for (uint32_t l = 0; l < len; l++)
    x[l] = r == g_hot_rank ? (uint16_t)(0x4400 + dcpx_rnd_below(s, 0x40))
                           : (uint16_t)(0x4000 + dcpx_rnd_below(s, 0x100));
  (void)t;
}

START_TEST(test_one_rank_holds_topk) {
  counts k = {0};
  uint64_t s = case_seed(8, 0);
  for (uint32_t i = 0; i < 50; i++) {
    uint32_t W = rnd_in(&s, 2, 16), K = rnd_in(&s, 2, 1024);
    uint32_t N = pick_N(&s, K, W);
    g_hot_rank = dcpx_rnd_below(&s, W);
    uint32_t rows = 2;
    run_filled("one-rank", case_seed(8, i + 1), W, K, N, Bs[i % 3], Is[i % 4],
               rows, rnd_in(&s, K, K + 200), fill_one_rank, &k);
    /* Every row rescued. */
    ck_assert_msg(k.rescue_rows == k.rows,
                  "case %u: rescue ran in %" PRIu64 " of %" PRIu64 " rows", i,
                  k.rescue_rows, k.rows);
  }
  print_counts("one rank holds top-K", &k);
  /* The hot rank holds K > N of the top-K: S1 always misses some. */
  ck_assert_msg(k.rescue_changed == k.rows,
                "rescue changed the result in %" PRIu64 " of %" PRIu64 " rows",
                k.rescue_changed, k.rows);

  /* Hand-checked: W=3, K=8, N=2, rank 1 holds the 8 best at l = 2..9. */
  tcall c;
  tcall_init(&c, 3, 1, 8, 2, 4, 1, 12, 12, 1);
  for (uint32_t r = 0; r < 3; r++) {
    c.row_end[r][0] = 12;
    for (uint32_t l = 0; l < 12; l++)
      row_of(&c, r, 0)[l] =
          (r == 1 && l >= 2 && l < 10) ? (uint16_t)(0x4400 + l) : 0x3F80;
    for (uint32_t b = 0; b < 3; b++)
      c.bt[r][b] = (int32_t)(100 + b);
  }
  const uint16_t *lg[3] = {c.logits[0], c.logits[1], c.logits[2]};
  const int32_t *re[3] = {c.row_end[0], c.row_end[1], c.row_end[2]};
  int32_t ro[8], ids[8], valid;
  uint32_t sat;
  dcpx_ref_stats st = {0, 0, 0};
  ck_assert_int_eq(t_ref_call(&c.sh, 1, lg, 12, re, 1, c.req_id[1], c.bt[1],
                                 1, 3, ro, &valid, ids, &sat, &st),
                   0);
  ck_assert_int_eq(valid, 8);
  for (uint32_t i = 0; i < 8; i++) {
    uint32_t l = 2 + i;
    ck_assert_int_eq(ro[i], (int32_t)((100 + l / 4) * 4 + l % 4));
    ck_assert_int_eq(ids[i], (int32_t)(l * 3 + 1));
  }
  /* S1 = all 6 listed keys (< K): every full rank saturated. */
  ck_assert_uint_eq(sat, 0x7u << 16);
  ck_assert_uint_eq(st.rescue_rows, 1);
  tcall_free(&c);
}
END_TEST

/* Fewer than K elements overall (some ranks full, some not). */
static void fill_few(tcall *c, uint32_t t, uint32_t r, uint64_t *s) {
  uint32_t W = c->sh.world, K = c->sh.topk;
  uint32_t len = dcpx_rnd_below(s, K / W); /* < K / W: fewer than K in all */
  uint16_t *x = row_of(c, r, t);
  c->row_end[r][t] = (int32_t)len;
  for (uint32_t l = 0; l < len; l++)
    x[l] = dcpx_rnd_below(s, 10) ? random_finite(s) : specials[dcpx_rnd_below(s, 8)];
  (void)t;
}

START_TEST(test_fewer_than_k) {
  counts k = {0};
  uint64_t s = case_seed(9, 0);
  for (uint32_t i = 0; i < 80; i++) {
    uint32_t W = rnd_in(&s, 1, 16), K = rnd_in(&s, 2 * W + 2, 2000);
    uint32_t N = rnd_in(&s, 1, K / W - 1);
    run_filled("fewer-than-K", case_seed(9, i + 1), W, K, N, Bs[i % 3],
               Is[i % 4], 3, K / W, fill_few, &k);
  }
  print_counts("fewer than K", &k);
  ck_assert_uint_gt(k.rescue_rows, 20);
}
END_TEST

/* Block size > 1 and interleave > 1 on every output. */
START_TEST(test_blocks_interleave) {
  counts k = {0};
  const uint32_t bs[] = {16, 64, 5, 1}, is[] = {2, 3, 64, 7};
  for (uint32_t i = 0; i < 64; i++) {
    uint64_t s = case_seed(10, i);
    uint32_t W = rnd_in(&s, 1, 16), K = rnd_in(&s, 2, 400);
    uint32_t N = pick_N(&s, K, W), B = bs[i % 4], I = is[(i / 4) % 4];
    uint32_t rows = rnd_in(&s, 1, 3), max_local = rnd_in(&s, 1, 1500);
    tcall c;
    tcall_init(&c, W, rows, K, N, B, I, max_local, max_local + 3,
               rnd_in(&s, 1, 4));
    tcall_random_tables(&c, &s);
    fill_random(&c, &s, 1, D_BITS);
    check_call(&c, "blocks/interleave", case_seed(10, i), &k);
    tcall_free(&c);
  }
  print_counts("blocks/interleave", &k);
}
END_TEST

/* ---- error paths -------------------------------------------------------- */

/* W = 3, R = 2, K = 16, N = 4, B = 8, I = 2, local 64: random tables and
 * rows of 64 random finite logits on every rank (the error-path tests'
 * call). */
static void small_call(tcall *c, uint64_t *s) {
  tcall_init(c, 3, 2, 16, 4, 8, 2, 64, 64, 2);
  tcall_random_tables(c, s);
  for (uint32_t t = 0; t < 2; t++)
    for (uint32_t r = 0; r < 3; r++) {
      c->row_end[r][t] = 64;
      for (uint32_t l = 0; l < 64; l++)
        row_of(c, r, t)[l] = random_finite(s);
    }
}

START_TEST(test_errors) {
  tcall c;
  uint64_t s = case_seed(11, 0);
  small_call(&c, &s);
  const uint16_t *lg[3] = {c.logits[0], c.logits[1], c.logits[2]};
  const int32_t *re[3] = {c.row_end[0], c.row_end[1], c.row_end[2]};
  int32_t ro[32], ids[32], valid[2];
  uint32_t sat[2];
  dcpx_ref_stats st = {7, 8, 9};
  const dcpx_shape *sh = &c.sh;
  int32_t *bt = c.bt[0], *rq = c.req_id[0];

#define CALL(shp, rows, lgp, stride, rep, rank, rqp, btp, btr, btc, rop, vp)   \
  t_ref_call(shp, rows, lgp, stride, rep, rank, rqp, btp, btr, btc, rop,    \
                vp, ids, sat, &st)

  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, valid), 0);
  st = (dcpx_ref_stats){7, 8, 9};
  /* rank >= W */
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 3, rq, bt, 2, 8, ro, valid),
                   DCPX_E_INVAL);
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 16, rq, bt, 2, 8, ro, valid),
                   DCPX_E_INVAL);
  /* rows > shape rows */
  ck_assert_int_eq(CALL(sh, 3, lg, 64, re, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_RANGE);
  /* NULL pointers */
  ck_assert_int_eq(CALL(NULL, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_INVAL);
  ck_assert_int_eq(CALL(sh, 2, NULL, 64, re, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_INVAL);
  ck_assert_int_eq(CALL(sh, 2, lg, 64, NULL, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_INVAL);
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, NULL, bt, 2, 8, ro, valid),
                   DCPX_E_INVAL);
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq, NULL, 2, 8, ro, valid),
                   DCPX_E_INVAL);
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq, bt, 2, 8, NULL, valid),
                   DCPX_E_INVAL);
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, NULL),
                   DCPX_E_INVAL);
  {
    const uint16_t *lg2[3] = {lg[0], NULL, lg[2]};
    const int32_t *re2[3] = {re[0], re[1], NULL};
    ck_assert_int_eq(CALL(sh, 2, lg2, 64, re, 0, rq, bt, 2, 8, ro, valid),
                     DCPX_E_INVAL);
    ck_assert_int_eq(CALL(sh, 2, lg, 64, re2, 0, rq, bt, 2, 8, ro, valid),
                     DCPX_E_INVAL);
  }
  /* A bad shape. */
  {
    dcpx_shape bad = c.sh;
    bad.local_topk = bad.topk;
    ck_assert_int_eq(CALL(&bad, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, valid),
                     DCPX_E_INVAL);
    bad = c.sh;
    bad.world = 17;
    ck_assert_int_eq(CALL(&bad, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, valid),
                     DCPX_E_LIMIT);
    bad = c.sh;
    bad.size = 4;
    ck_assert_int_eq(CALL(&bad, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, valid),
                     DCPX_E_INVAL);
  }
  /* row_end over max_local, negative, over the stride (rank 2, row 1). */
  c.row_end[2][1] = 65;
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_RANGE);
  c.row_end[2][1] = -1;
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_RANGE);
  c.row_end[2][1] = INT32_MIN;
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_RANGE);
  /* A row beyond `rows` is not read. */
  ck_assert_int_eq(CALL(sh, 1, lg, 64, re, 0, rq, bt, 2, 8, ro, valid), 0);
  st = (dcpx_ref_stats){7, 8, 9};
  c.row_end[2][1] = 64;
  /* A stride whose rows run past the end of the address space (row t at
   * logits[r] + t * stride would wrap around): refused, nothing read. */
  ck_assert_int_eq(CALL(sh, 2, lg, 1ull << 62, re, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_INVAL);
  ck_assert_int_eq(CALL(sh, 2, lg, UINT64_MAX, re, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_INVAL);
  /* The v1 structs: a size this library does not know (an older or newer
   * dcpx.h, or a struct never initialised) and a reserved word that is
   * not 0 are refused, and nothing is written. */
  {
    dcpx_ref_in in = DCPX_REF_IN_INIT;
    dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
    in.rows = 2;
    in.stride = 64;
    in.logits = lg;
    in.row_ends = re;
    in.req_id = rq;
    in.block_table = bt;
    in.bt_rows = 2;
    in.bt_cols = 8;
    out.rows_out = ro;
    out.valid_out = valid;
    ck_assert_int_eq(dcpx_ref_call(sh, &in, &out, NULL), 0);
    valid[0] = valid[1] = 77;
    const uint32_t sizes[] = {0, 4, sizeof(in) - 8, sizeof(in) + 8};
    for (unsigned i = 0; i < 4; i++) {
      in.size = sizes[i];
      ck_assert_int_eq(dcpx_ref_call(sh, &in, &out, NULL), DCPX_E_INVAL);
      in.size = sizeof(in);
      out.size = sizes[i];
      ck_assert_int_eq(dcpx_ref_call(sh, &in, &out, NULL), DCPX_E_INVAL);
      out.size = sizeof(out);
    }
    in.reserved = 1;
    ck_assert_int_eq(dcpx_ref_call(sh, &in, &out, NULL), DCPX_E_INVAL);
    in.reserved = 0;
    out.reserved = 1;
    ck_assert_int_eq(dcpx_ref_call(sh, &in, &out, NULL), DCPX_E_INVAL);
    out.reserved = 0;
    ck_assert_int_eq(dcpx_ref_call(sh, NULL, &out, NULL), DCPX_E_INVAL);
    ck_assert_int_eq(dcpx_ref_call(sh, &in, NULL, NULL), DCPX_E_INVAL);
    ck_assert_int_eq(valid[0], 77);
    ck_assert_int_eq(valid[1], 77);
    ck_assert_int_eq(dcpx_ref_call(sh, &in, &out, NULL), 0);
    ck_assert_int_ne(valid[0], 77);
  }
  c.row_end[2][1] = 64;
  ck_assert_int_eq(CALL(sh, 2, lg, 32, re, 0, rq, bt, 2, 8, ro, valid),
                   DCPX_E_RANGE);

  /* Table errors: make rank 0 own elements of row 0 (its values best). */
  for (uint32_t l = 0; l < 64; l++)
    row_of(&c, 0, 0)[l] = 0x7F00;
  int32_t rq_bad[2] = {2, 0}, rq_neg[2] = {-1, 0};
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq_bad, bt, 2, 8, ro, valid),
                   DCPX_E_RANGE);
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq_neg, bt, 2, 8, ro, valid),
                   DCPX_E_RANGE);
  /* A table too narrow for the selected l (l / B >= bt_cols). */
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq, bt, 2, 1, ro, valid),
                   DCPX_E_RANGE);
  /* A negative block, and a KV row beyond int32. */
  {
    int32_t bt2[16];
    for (int i = 0; i < 16; i++)
      bt2[i] = -1;
    int32_t rq0[2] = {0, 0};
    ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq0, bt2, 2, 8, ro, valid),
                     DCPX_E_RANGE);
    for (int i = 0; i < 16; i++)
      bt2[i] = INT32_MAX / 4; /* * B=8 overflows */
    ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq0, bt2, 2, 8, ro, valid),
                     DCPX_E_RANGE);
    /* A failed row writes none of its outputs. */
    for (int i = 0; i < 32; i++)
      ro[i] = SENTINEL;
    valid[0] = SENTINEL;
    ck_assert_int_eq(CALL(sh, 1, lg, 64, re, 0, rq0, bt2, 2, 8, ro, valid),
                     DCPX_E_RANGE);
    for (int i = 0; i < 16; i++)
      ck_assert_int_eq(ro[i], SENTINEL);
    ck_assert_int_eq(valid[0], SENTINEL);
  }
  /* ret_stats is left untouched by every failure above. */
  ck_assert_uint_eq(st.rows, 7);
  ck_assert_uint_eq(st.rescue_rows, 8);
  ck_assert_uint_eq(st.saturated, 9);
  /* ... and accumulated, not overwritten, on success. */
  ck_assert_int_eq(CALL(sh, 2, lg, 64, re, 0, rq, bt, 2, 8, ro, valid), 0);
  ck_assert_uint_eq(st.rows, 9);
  /* rows == 0 is a no-op. */
  ck_assert_int_eq(CALL(sh, 0, lg, 64, re, 0, rq, bt, 2, 8, ro, valid), 0);
  ck_assert_uint_eq(st.rows, 9);
#undef CALL
  tcall_free(&c);

  /* dcpx_ref_local_list. */
  uint16_t x[4] = {1, 2, 3, 4};
  uint32_t w[8];
  ck_assert_int_eq(dcpx_ref_local_list(NULL, 4, 2, w), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_ref_local_list(NULL, 0, 2, w), 0);
  ck_assert_int_eq(dcpx_ref_local_list(x, 4, 2, NULL), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_ref_local_list(x, 4, 0, w), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_ref_local_list(x, 4, 4097, w), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_ref_local_list(x, DCPX_MAX_LOCAL + 1, 2, w),
                   DCPX_E_LIMIT);

  /* dcpx_ref_rescue_list: the same checks, and t1 is an ord16. */
  ck_assert_int_eq(dcpx_ref_rescue_list(NULL, 4, 2, 0, w), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_ref_rescue_list(NULL, 0, 2, 0, w), 0);
  ck_assert_int_eq(dcpx_ref_rescue_list(x, 4, 2, 0, NULL), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_ref_rescue_list(x, 4, 0, 0, w), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_ref_rescue_list(x, 4, 4097, 0, w), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_ref_rescue_list(x, 4, 2, 0x10000, w), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_ref_rescue_list(x, DCPX_MAX_LOCAL + 1, 2, 0, w),
                   DCPX_E_LIMIT);
  ck_assert_int_eq(dcpx_ref_rescue_list(x, 4, 2, 0xFFFF, w), 0);
}
END_TEST

/* ---- dcpx_ref_local_list against its oracle ----------------------------- */

/* Section 3: the cap best non-NaN elements, those of them with
 * ord16 >= t1 (all for t1 = 0: the local list; else the rescue list), in
 * ascending l, then zeros, with the bit-16 plane, row_words(cap) words. */
static uint32_t oracle_list(const uint16_t *x, uint32_t len, uint32_t cap,
                            uint32_t t1, uint64_t *keys, uint32_t *words) {
  uint32_t n = 0, m = 0;
  for (uint32_t l = 0; l < len; l++)
    if (o_rank[x[l]] >= 0)
      keys[n++] = okey((uint32_t)o_rank[x[l]], 0, l);
  qsort(keys, n, sizeof(keys[0]), cmp_u64);
  uint32_t *ls = xcalloc(cap, sizeof(uint32_t));
  for (uint32_t i = 0; i < n && i < cap; i++)
    if (spec_ord16(okey_bits(keys[i])) >= t1)
      ls[m++] = okey_l(keys[i]);
  qsort(ls, m, sizeof(ls[0]), cmp_u32);
  uint32_t rw = cap + (cap + 31) / 32;
  rw = (rw + 3) / 4 * 4;
  memset(words, 0, rw * sizeof(uint32_t));
  for (uint32_t j = 0; j < m; j++) {
    words[j] = (spec_ord16(x[ls[j]]) << 16) | (ls[j] & 0xFFFFu);
    if (ls[j] >> 16)
      words[cap + j / 32] |= 1u << (j % 32);
  }
  free(ls);
  return m;
}

/* dcpx_ref_call refuses outputs that share a byte with one another or
 * with an array it reads (the logits and row ends of every rank, the
 * arrays of pointers to them, req_id, the block table, given lists):
 * DCPX_E_INVAL, as dcpx_merge refuses them. It writes each output while
 * it reads the inputs and writes the others, so a shared buffer gave a
 * silently wrong result (ids_out == rows_out: 0, with the ids in
 * rows_out). Arrays that only touch (one ends where the next starts) are
 * fine, and exact. */
START_TEST(test_overlapping_outputs) {
  tcall c;
  uint64_t s = case_seed(12, 0);
  small_call(&c, &s);
  /* every array in one arena, where the cases place them */
  static int32_t arena[1024];
  int32_t *const lg_words = arena + 512; /* 3 ranks x 2 rows x 64 bf16 */
  int32_t *const re_at = arena + 704, *const rq_at = arena + 720,
                 *const bt_at = arena + 736; /* 16 words */
  const uint16_t *lg[3];
  const int32_t *re[3];
  for (uint32_t r = 0; r < 3; r++) {
    memcpy((uint16_t *)lg_words + r * 128, c.logits[r], 128 * 2);
    lg[r] = (const uint16_t *)lg_words + r * 128;
    memcpy(re_at + 4 * r, c.row_end[r], 2 * sizeof(int32_t));
    re[r] = re_at + 4 * r;
  }
  memcpy(rq_at, c.req_id[0], 2 * sizeof(int32_t));
  memcpy(bt_at, c.bt[0], 16 * sizeof(int32_t));
  const uint16_t *const *lgp = lg;
  dcpx_ref_in in = DCPX_REF_IN_INIT;
  in.rows = 2;
  in.stride = 64;
  in.logits = lgp;
  in.row_ends = re;
  in.req_id = rq_at;
  in.block_table = bt_at;
  in.bt_rows = 2;
  in.bt_cols = 8;
  /* the answer, into arrays of their own */
  int32_t xr[32], xi[32], xv[2];
  uint32_t xs[2];
  dcpx_merge_out out = DCPX_MERGE_OUT_INIT;
  out.rows_out = xr;
  out.valid_out = xv;
  out.ids_out = xi;
  out.sat_word = xs;
  ck_assert_int_eq(dcpx_ref_call(&c.sh, &in, &out, NULL), 0);

  /* outputs that only touch one another and the inputs: exact */
  int32_t *const o = arena + 64;
  out.rows_out = o;
  out.valid_out = o + 32;
  out.ids_out = o + 34;
  out.sat_word = (uint32_t *)(o + 66);
  ck_assert_int_eq(dcpx_ref_call(&c.sh, &in, &out, NULL), 0);
  ck_assert(!memcmp(o, xr, sizeof(xr)) && !memcmp(o + 32, xv, sizeof(xv)) &&
            !memcmp(o + 34, xi, sizeof(xi)) && !memcmp(o + 66, xs, sizeof(xs)));
  out.rows_out = bt_at + 16; /* right after the block table: fine */
  out.valid_out = rq_at - 2; /* right before req_id */
  out.ids_out = lg_words - 32; /* right before the logits */
  out.sat_word = (uint32_t *)(re_at + 12); /* after the row ends */
  ck_assert_int_eq(dcpx_ref_call(&c.sh, &in, &out, NULL), 0);
  ck_assert(!memcmp(bt_at + 16, xr, sizeof(xr)) &&
            !memcmp(lg_words - 32, xi, sizeof(xi)));

  /* overlaps: each refused, before anything is written */
  struct {
    const char *what;
    int32_t *ro, *vo, *io;
    uint32_t *so;
  } bad[] = {
      {"ids_out == rows_out", o, o + 32, o, (uint32_t *)(o + 66)},
      {"valid_out in rows_out's last word", o, o + 31, o + 34,
       (uint32_t *)(o + 66)},
      {"sat_word on valid_out's second word", o, o + 32, o + 34,
       (uint32_t *)(o + 33)},
      {"ids_out's end on sat_word", o, o + 32, o + 35, (uint32_t *)(o + 66)},
      {"rows_out on the block table", bt_at + 15, o + 32, o + 34,
       (uint32_t *)(o + 66)},
      {"valid_out on req_id", o, rq_at + 1, o + 34, (uint32_t *)(o + 66)},
      {"sat_word on rank 1's row ends", o, o + 32, o + 34,
       (uint32_t *)(re_at + 5)},
      {"ids_out on rank 2's second logits row", o, o + 32, lg_words + 160,
       (uint32_t *)(o + 66)},
      {"valid_out across rank 0's and rank 1's logits", o, lg_words + 63,
       o + 34, (uint32_t *)(o + 66)},
      {"valid_out on the logits pointers", o, (int32_t *)(void *)lg, o + 34,
       (uint32_t *)(o + 66)},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    memset(o, 0x55, 67 * sizeof(int32_t));
    out.rows_out = bad[i].ro;
    out.valid_out = bad[i].vo;
    out.ids_out = bad[i].io;
    out.sat_word = bad[i].so;
    const int r = dcpx_ref_call(&c.sh, &in, &out, NULL);
    ck_assert_msg(r == DCPX_E_INVAL, "%s: %s, not refused", bad[i].what,
                  dcpx_strerror(r));
    for (uint32_t w = 0; w < 67; w++)
      ck_assert_msg(o[w] == 0x55555555, "%s: word %u written", bad[i].what, w);
  }
  /* an output on a given list (rank 1's values) */
  uint16_t vals[2 * 4] = {0};
  int32_t idx[2 * 4];
  for (uint32_t i = 0; i < 8; i++)
    idx[i] = -1;
  dcpx_lists li = DCPX_LISTS_INIT;
  li.rows = 2;
  li.n = 4;
  li.values = vals;
  li.indices = idx;
  const dcpx_lists *lists[3] = {NULL, &li, NULL};
  in.lists = lists;
  out.rows_out = o;
  out.valid_out = o + 32;
  out.ids_out = o + 34;
  out.sat_word = (uint32_t *)(o + 66);
  ck_assert_int_eq(dcpx_ref_call(&c.sh, &in, &out, NULL), 0);
  out.valid_out = (int32_t *)(void *)(vals + 6);
  ck_assert_int_eq(dcpx_ref_call(&c.sh, &in, &out, NULL), DCPX_E_INVAL);
  out.valid_out = idx + 6;
  ck_assert_int_eq(dcpx_ref_call(&c.sh, &in, &out, NULL), DCPX_E_INVAL);
  out.valid_out = o + 32;
  /* ids_out and sat_word may be NULL: not compared */
  out.ids_out = NULL;
  out.sat_word = NULL;
  ck_assert_int_eq(dcpx_ref_call(&c.sh, &in, &out, NULL), 0);
  tcall_free(&c);
}
END_TEST

START_TEST(test_local_list) {
  uint16_t *x = xcalloc(DCPX_MAX_LOCAL, sizeof(uint16_t));
  uint64_t *keys = xcalloc(DCPX_MAX_LOCAL, sizeof(uint64_t));
  uint32_t *want = xcalloc(4224 + 8, sizeof(uint32_t));
  uint32_t *got = xcalloc(4224 + 8, sizeof(uint32_t));
  uint32_t hi = 0;
  for (uint32_t i = 0; i < 400; i++) {
    uint64_t seed = case_seed(12, i + 1), s = seed;
    uint32_t cap = dcpx_rnd_below(&s, 4) ? rnd_in(&s, 1, 300) : rnd_in(&s, 1, 4096);
    uint32_t len = i < 6 ? DCPX_MAX_LOCAL - dcpx_rnd_below(&s, 3)
                         : rnd_in(&s, 0, dcpx_rnd_below(&s, 3) ? 2 * cap : 5000);
    gen g;
    gen_init(&g, &s, (enum dist)dcpx_rnd_below(&s, D_NDIST), 1);
    for (uint32_t l = 0; l < len; l++)
      x[l] = gen_value(&g, &s, 0);
    uint32_t rw = dcpx_row_words(cap);
    for (uint32_t j = 0; j < rw + 8; j++)
      got[j] = 0xCCCCCCCCu; /* stale words must be cleared */
    int n = dcpx_ref_local_list(x, len, cap, got);
    uint32_t m = oracle_list(x, len, cap, 0, keys, want);
    EXPECT(n == (int)m,
           "seed=0x%" PRIx64 " len=%u cap=%u: %d entries, want %u", seed, len,
           cap, n, m);
    for (uint32_t j = 0; j < rw; j++)
      EXPECT(got[j] == want[j],
             "seed=0x%" PRIx64 " len=%u cap=%u: word %u = 0x%08x, want "
             "0x%08x",
             seed, len, cap, j, got[j], want[j]);
    for (uint32_t j = rw; j < rw + 8; j++)
      EXPECT(got[j] == 0xCCCCCCCCu,
             "seed=0x%" PRIx64 " cap=%u: wrote word %u past row_words", seed,
             cap, j);
    for (uint32_t j = 0; j < m; j++)
      hi += (want[cap + j / 32] >> (j % 32)) & 1u;
  }
  ck_assert_msg(hi > 0, "no list entry with l >= 2^16 was tested");
  free(x);
  free(keys);
  free(want);
  free(got);
}
END_TEST

/* ---- dcpx_ref_rescue_list against the same oracle ----------------------- */

/* ord16 of the k-th best non-NaN element of x (0 if fewer than k), by a
 * histogram: a threshold for the inputs, not part of what is checked. */
static uint32_t kth_ord16(const uint16_t *x, uint32_t len, uint32_t k) {
  static uint32_t h[65536];
  uint32_t cum = 0, t = 0;
  memset(h, 0, sizeof(h));
  for (uint32_t l = 0; l < len; l++)
    if (o_rank[x[l]] >= 0)
      h[spec_ord16(x[l])]++;
  for (uint32_t o = 65535; o > 0 && cum < k; o--) {
    cum += h[o];
    t = o;
  }
  return cum >= k ? t : 0;
}

/* t1 as the protocol makes it (S1's K-th ord16: an element's value, so
 * ties sit exactly on it), next to it, and at the extremes. */
static uint32_t pick_t1(uint64_t *s, const uint16_t *x, uint32_t len,
                        uint32_t cap) {
  uint32_t k = rnd_in(s, 1, 2 * cap + 1), t;
  switch (dcpx_rnd_below(s, 8)) {
  case 0:
    return 0;
  case 1:
    return dcpx_rnd_below(s, 0x10000);
  case 2:
    return (uint32_t)(dcpx_rnd_below(s, 2) ? 0xFFFF : 0xFF80); /* > max, +inf */
  case 3:
    t = kth_ord16(x, len, k);
    return t + (t < 0xFFFF);
  case 4:
    t = kth_ord16(x, len, k);
    return t - (t > 0);
  default:
    return kth_ord16(x, len, k);
  }
}

/* One case: dcpx_ref_rescue_list against oracle_list, and no word written
 * past row_words(cap). Counts how the case exercised the function. */
typedef struct rl_counts {
  uint32_t filtered; /* fewer entries than the local list: t1 cut in */
  uint32_t full;     /* cap entries: the whole local list */
  uint32_t empty;    /* no entry */
  uint32_t hi;       /* entries with l >= 2^16 in filtered lists */
} rl_counts;

static void rescue_case(uint64_t seed, const uint16_t *x, uint32_t len,
                        uint32_t cap, uint32_t t1, uint64_t *keys,
                        uint32_t *want, uint32_t *got, rl_counts *k) {
  const uint32_t rw = dcpx_row_words(cap);
  for (uint32_t j = 0; j < rw + 8; j++)
    got[j] = 0xCCCCCCCCu;
  int n = dcpx_ref_rescue_list(x, len, cap, t1, got);
  uint32_t m = oracle_list(x, len, cap, t1, keys, want);
  EXPECT(n == (int)m,
         "seed=0x%" PRIx64 " len=%u cap=%u t1=0x%x: %d entries, want %u", seed,
         len, cap, t1, n, m);
  for (uint32_t j = 0; j < rw; j++)
    EXPECT(got[j] == want[j],
           "seed=0x%" PRIx64 " len=%u cap=%u t1=0x%x: word %u = 0x%08x, "
           "want 0x%08x",
           seed, len, cap, t1, j, got[j], want[j]);
  for (uint32_t j = rw; j < rw + 8; j++)
    EXPECT(got[j] == 0xCCCCCCCCu,
           "seed=0x%" PRIx64 " cap=%u: wrote word %u past row_words", seed, cap,
           j);
  uint32_t all = oracle_list(x, len, cap, 0, keys, want);
  k->filtered += m < all;
  k->full += m == cap;
  k->empty += m == 0;
  for (uint32_t j = 0; j < m && m < all; j++)
    k->hi += (got[cap + j / 32] >> (j % 32)) & 1u;
}

START_TEST(test_rescue_list) {
  uint16_t *x = xcalloc(DCPX_MAX_LOCAL, sizeof(uint16_t));
  uint64_t *keys = xcalloc(DCPX_MAX_LOCAL, sizeof(uint64_t));
  uint32_t *want = xcalloc(4224 + 8, sizeof(uint32_t));
  uint32_t *got = xcalloc(4224 + 8, sizeof(uint32_t));
  rl_counts k = {0, 0, 0, 0};
  for (uint32_t i = 0; i < 600; i++) {
    uint64_t seed = case_seed(15, i + 1), s = seed;
    uint32_t cap = dcpx_rnd_below(&s, 4) ? rnd_in(&s, 1, 300) : rnd_in(&s, 1, 4096);
    uint32_t len = i < 12 ? DCPX_MAX_LOCAL - dcpx_rnd_below(&s, 3) * 20000
                          : rnd_in(&s, 0, dcpx_rnd_below(&s, 3) ? 2 * cap : 5000);
    gen g;
    gen_init(&g, &s, (enum dist)dcpx_rnd_below(&s, D_NDIST), 1);
    const uint16_t same = dcpx_rnd_below(&s, 2) ? 0x3F80 : specials[i % NSPECIALS];
    for (uint32_t l = 0; l < len; l++) /* every 10th case: all equal */
      x[l] = i % 10 == 9 ? same : gen_value(&g, &s, 0);
    /* The long rows: t1 near the cap-th best, so that a filtered list
     * keeps entries beyond 2^16 at shifted positions. */
    uint32_t t1 = i < 12 ? kth_ord16(x, len, rnd_in(&s, 1, cap))
                         : pick_t1(&s, x, len, cap);
    rescue_case(seed, x, len, cap, t1, keys, want, got, &k);
  }
  printf("check_ref: rescue lists: %u filtered, %u full, %u empty, %u "
         "filtered entries with l >= 2^16\n",
         k.filtered, k.full, k.empty, k.hi);
  ck_assert_msg(k.filtered > 50 && k.full > 50 && k.empty > 10 && k.hi > 0,
                "weak coverage: %u filtered, %u full, %u empty, %u high",
                k.filtered, k.full, k.empty, k.hi);
  free(x);
  free(keys);
  free(want);
  free(got);
}
END_TEST

/* ---- the selection core (merge.h) --------------------------------------- */

/* Sort oracle of dcpx__select + dcpx__sel_next: key i (0 = empty) is in the
 * top-k iff it is among the first k non-empty keys sorted by (ord desc,
 * i asc). */
START_TEST(test_select) {
  uint16_t *ord = xcalloc(6000, sizeof(uint16_t));
  uint64_t *keys = xcalloc(6000, sizeof(uint64_t));
  uint8_t *in = xcalloc(6000, 1);
  for (uint32_t i = 0; i < 3000; i++) {
    uint64_t seed = case_seed(13, i), s = seed;
    uint32_t n = dcpx_rnd_below(&s, 4) ? rnd_in(&s, 0, 300) : rnd_in(&s, 0, 6000);
    uint32_t k = rnd_in(&s, 1, n + 10);
    uint32_t mode = dcpx_rnd_below(&s, 5), zeros = dcpx_rnd_below(&s, 4);
    uint16_t pal[4];
    for (int j = 0; j < 4; j++)
      pal[j] = (uint16_t)(1 + dcpx_rnd_below(&s, 0xFFFF));
    for (uint32_t j = 0; j < n; j++) {
      uint16_t v;
      if (mode == 0)
        v = (uint16_t)dcpx_splitmix64(&s);
      else if (mode == 1)
        v = pal[dcpx_rnd_below(&s, 4)];
      else if (mode == 2) /* ties within one high-byte bucket */
        v = (uint16_t)(0x8000 + dcpx_rnd_below(&s, 4));
      else if (mode == 3) /* ties across bucket boundaries */
        v = (uint16_t)(0x80FE + dcpx_rnd_below(&s, 4));
      else /* small keys, bucket 0 */
        v = (uint16_t)dcpx_rnd_below(&s, 300);
      if (zeros && dcpx_rnd_below(&s, 4) == 0)
        v = 0;
      ord[j] = v;
    }
    uint32_t nz = 0;
    for (uint32_t j = 0; j < n; j++)
      if (ord[j])
        keys[nz++] = ((uint64_t)(0xFFFFu - ord[j]) << 32) | j;
    qsort(keys, nz, sizeof(keys[0]), cmp_u64);
    memset(in, 0, n);
    uint32_t m = nz < k ? nz : k, T = 0, take = 0;
    for (uint32_t j = 0; j < m; j++)
      in[(uint32_t)keys[j]] = 1;
    if (nz >= k) {
      T = ord[(uint32_t)keys[k - 1]];
      for (uint32_t j = 0; j < k; j++)
        take += ord[(uint32_t)keys[j]] == T;
    }
    dcpx__sel sel;
    dcpx__select(ord, n, k, &sel);
    EXPECT(sel.count == m && sel.T == T && sel.take == take,
           "seed=0x%" PRIx64 " n=%u k=%u: (T 0x%x, take %u, count %u), want "
           "(0x%x, %u, %u)",
           seed, n, k, sel.T, sel.take, sel.count, T, take, m);
    dcpx__sel_iter it;
    dcpx__sel_iter_init(&it, &sel);
    uint32_t cnt = 0;
    for (uint32_t j = 0; j < n; j++) {
      int got = dcpx__sel_next(&it, ord[j]);
      EXPECT(got == in[j],
             "seed=0x%" PRIx64 " n=%u k=%u: key %u (ord 0x%x): selected %d, "
             "want %d",
             seed, n, k, j, ord[j], got, in[j]);
      cnt += (uint32_t)got;
    }
    EXPECT(cnt == m, "seed=0x%" PRIx64 ": %u selected, want %u", seed, cnt,
           m);
  }
  free(ord);
  free(keys);
  free(in);
}
END_TEST

/* dcpx__round1's mask and sat_word (and dcpx__finish without a rescue)
 * against the definition, on arbitrary lists (not necessarily any logits'
 * local top-N): full lists, short lists, ties across ranks, l >= 2^16. */
START_TEST(test_round1) {
  uint32_t *words = xcalloc((size_t)16 * 4224, sizeof(uint32_t));
  uint64_t *keys = xcalloc((size_t)16 * 4096, sizeof(uint64_t));
  uint32_t sat_cases = 0, unsat_cases = 0;
  for (uint32_t i = 0; i < 1500; i++) {
    uint64_t seed = case_seed(14, i), s = seed;
    uint32_t W = rnd_in(&s, 1, 16);
    uint32_t K = dcpx_rnd_below(&s, 8) ? rnd_in(&s, 2, 200) : rnd_in(&s, 2, 4096);
    uint32_t N = pick_N(&s, K, W), rw = dcpx_row_words(N);
    uint32_t nvals = dcpx_rnd_below(&s, 2) ? 3 : 0xFFFF;
    uint32_t base = 1 + dcpx_rnd_below(&s, 0xFFFF - (nvals == 3 ? 3 : 0));
    const uint32_t *lists[DCPX_MAX_WORLD];
    uint32_t cnt[DCPX_MAX_WORLD], n = 0;
    memset(words, 0, sizeof(uint32_t) * W * rw);
    for (uint32_t r = 0; r < W; r++) {
      uint32_t *w = words + (size_t)r * rw;
      lists[r] = w;
      cnt[r] = dcpx_rnd_below(&s, 3) ? N : rnd_in(&s, 0, N);
      uint32_t l = dcpx_rnd_below(&s, 4) ? 0 : 60000;
      for (uint32_t j = 0; j < cnt[r]; j++) {
        l += 1 + dcpx_rnd_below(&s, 3);
        uint32_t o = nvals == 3 ? base + dcpx_rnd_below(&s, 3)
                                : 1 + dcpx_rnd_below(&s, 0xFFFF);
        w[j] = (o << 16) | (l & 0xFFFFu);
        if (l >> 16)
          w[N + j / 32] |= 1u << (j % 32);
        /* flat order: rank, then position in the list (ascending l) */
        keys[n++] = ((uint64_t)(0xFFFFu - o) << 32) | ((uint64_t)r << 24) |
                    j;
      }
    }
    qsort(keys, n, sizeof(keys[0]), cmp_u64);
    uint32_t s1 = n < K ? n : K, in_s1[DCPX_MAX_WORLD] = {0}, mask = 0;
    for (uint32_t j = 0; j < s1; j++)
      in_s1[(keys[j] >> 24) & 0xFFu]++;
    for (uint32_t r = 0; r < W; r++)
      if (cnt[r] == N && in_s1[r] == N)
        mask |= 1u << r;
    uint32_t want_sw =
        (mask << 16) | (s1 == K ? 0xFFFFu - (uint32_t)(keys[K - 1] >> 32) : 0);

    dcpx_shape sh = DCPX_SHAPE_INIT;
    sh.world = W;
    sh.topk = K;
    sh.local_topk = N;
    dcpx__merge_ws ws;
    ck_assert_int_eq(dcpx__merge_ws_init(&ws, &sh), 0);
    dcpx__sel sel;
    uint32_t sw = 0;
    uint32_t got = dcpx__round1(&ws, lists, &sel, &sw);
    EXPECT(got == mask && sw == want_sw && sel.count == s1,
           "seed=0x%" PRIx64 " W=%u K=%u N=%u: mask 0x%x sat_word 0x%x "
           "count %u, want 0x%x 0x%x %u",
           seed, W, K, N, got, sw, sel.count, mask, want_sw, s1);
    /* No rescue: the final selection is S1 in (r, l) order. */
    dcpx__finish(&ws, &sel, 0, lists);
    EXPECT(ws.nsel == s1, "seed=0x%" PRIx64 ": nsel %u, want %u", seed,
           ws.nsel, s1);
    /* Sort S1 by flat position, i.e. (r, j). */
    for (uint32_t j = 0; j < s1; j++)
      keys[j] &= 0xFFFFFFFFu;
    qsort(keys, s1, sizeof(keys[0]), cmp_u64);
    for (uint32_t j = 0; j < s1; j++) {
      uint32_t r = (uint32_t)(keys[j] >> 24) & 0xFFu, p = keys[j] & 0xFFFFFFu;
      const uint32_t *w = lists[r];
      uint32_t l = (w[p] & 0xFFFFu) | (((w[N + p / 32] >> (p % 32)) & 1u) << 16);
      EXPECT(ws.sel_r[j] == r && ws.sel_l[j] == l,
             "seed=0x%" PRIx64 " W=%u K=%u N=%u: S1[%u] = (%u, %u), want "
             "(%u, %u)",
             seed, W, K, N, j, ws.sel_r[j], ws.sel_l[j], r, l);
    }
    dcpx__merge_ws_free(&ws);
    if (mask)
      sat_cases++;
    else
      unsat_cases++;
  }
  printf("check_ref: round1 lists: %u with a saturated rank, %u without\n",
         sat_cases, unsat_cases);
  fflush(stdout);
  ck_assert_uint_gt(sat_cases, 100);
  ck_assert_uint_gt(unsat_cases, 100);
  free(words);
  free(keys);
}
END_TEST

/* The oracle's own order agrees with the ord16 of docs/PROTOCOL.md (so the
 * oracle and the spec describe the same order; check_wire tests the
 * library's). */
START_TEST(test_oracle_order) {
  ck_assert_uint_eq(o_nvalues, 65536u - 254u);
  for (uint32_t i = 1; i < o_nvalues; i++)
    EXPECT(spec_ord16(o_bits[i - 1]) < spec_ord16(o_bits[i]),
           "oracle order disagrees with ord16 at 0x%04x, 0x%04x",
           o_bits[i - 1], o_bits[i]);
  ck_assert_int_eq(o_rank[0x0000], o_rank[0x8000] + 1);
}
END_TEST

/* ---- main --------------------------------------------------------------- */

/* The local_topk = 0 rule: a valid N below K, above K/W by at least three
 * standard deviations of a rank's share (so W*N > K for W >= 2), on the
 * 32 grid unless capped at K - 1; out-of-range shapes get 0. Checked over
 * every W and a spread of K, against the formula in floating point. */
START_TEST(test_auto_local_topk) {
  static const uint32_t ks[] = {2, 3, 31, 64, 100, 512, 1000, 1024, 2048,
                                3000, 4095, 4096};
  for (uint32_t W = 1; W <= DCPX_MAX_WORLD; W++)
    for (size_t i = 0; i < sizeof(ks) / sizeof(ks[0]); i++) {
      const uint32_t K = ks[i], N = dcpx_shape_auto_local_topk(W, K);
      const double m = (double)K / W, sd = sqrt(m * (1.0 - 1.0 / W));
      ck_assert_msg(N >= 1 && N < K, "W=%u K=%u: N=%u", W, K, N);
      ck_assert_msg(N == K - 1 || N % 32 == 0, "W=%u K=%u: N=%u", W, K, N);
      ck_assert_msg(N == K - 1 || N + 1e-9 >= m + 3.0 * sd,
                    "W=%u K=%u: N=%u below K/W + 3 sd = %.1f", W, K, N,
                    m + 3.0 * sd);
      ck_assert_msg(W == 1 || (uint64_t)W * (K - 1) <= K ||
                        (uint64_t)W * N > K,
                    "W=%u K=%u: W*N <= K", W, K);
      dcpx_shape sh = DCPX_SHAPE_INIT;
      sh.world = W;
      sh.topk = K;
      sh.local_topk = N;
      ck_assert_int_eq(dcpx_shape_check(&sh), 0);
      /* the warning is exactly "W >= 2 and W * N <= K" */
      ck_assert((dcpx_shape_warning(&sh) != NULL) ==
                (W >= 2 && (uint64_t)W * N <= K));
      sh.local_topk = K / W ? K / W : 1; /* W * N <= K unless K < W */
      ck_assert((dcpx_shape_warning(&sh) != NULL) ==
                (W >= 2 && (uint64_t)W * sh.local_topk <= K));
    }
  ck_assert_uint_eq(dcpx_shape_auto_local_topk(0, 2048), 0);
  ck_assert_uint_eq(dcpx_shape_auto_local_topk(DCPX_MAX_WORLD + 1, 2048), 0);
  ck_assert_uint_eq(dcpx_shape_auto_local_topk(8, 1), 0);
  ck_assert_uint_eq(dcpx_shape_auto_local_topk(8, DCPX_MAX_TOPK + 1), 0);
}
END_TEST

/* ---- lists given by the engine (docs/PROTOCOL.md 5.8) --------------------- */

/* The result exact for the lists given, straight from section 5.8 and the
 * oracle's order: round 1 over the given keys (their values as given),
 * S1 its first K; rank r saturated when its list holds N keys, all in S1;
 * with a saturated rank, round 2 over every element of the saturated
 * ranks whose logit is at or above T1 (the rescue list of 5.4, but for
 * elements beyond the rank's top K, which K of its own beat) and the S1
 * keys of the others. Writes the selection's gids in (r, l) order, -1
 * padded, and the sat_word. */
static void given_oracle(uint32_t W, uint32_t K, uint32_t N, uint32_t I,
                         uint32_t len, const uint16_t *const *lg,
                         const uint16_t *const *v, const int32_t *const *ix,
                         int32_t *ids, uint32_t *sat) {
  uint64_t *k1 = xcalloc((size_t)W * N + 1, 8);
  uint64_t *k2 = xcalloc((size_t)W * (len + N) + 1, 8);
  uint32_t n1 = 0, n2 = 0, mask = 0, cnt[DCPX_MAX_WORLD] = {0};
  for (uint32_t r = 0; r < W; r++)
    for (uint32_t j = 0; j < N && ix[r][j] >= 0; j++, cnt[r]++)
      k1[n1++] = okey((uint32_t)o_rank[v[r][j]], r, (uint32_t)ix[r][j]);
  qsort(k1, n1, 8, cmp_u64);
  const uint32_t c1 = n1 < K ? n1 : K;
  uint32_t in_s1[DCPX_MAX_WORLD] = {0};
  for (uint32_t i = 0; i < c1; i++)
    in_s1[okey_r(k1[i])]++;
  for (uint32_t r = 0; r < W; r++)
    mask |= (uint32_t)(cnt[r] == N && in_s1[r] == N) << r;
  const uint32_t t1 = c1 == K ? spec_ord16(okey_bits(k1[K - 1])) : 0u;
  *sat = (mask << 16) | t1;
  if (mask) {
    for (uint32_t i = 0; i < c1; i++)
      if (!((mask >> okey_r(k1[i])) & 1u))
        k2[n2++] = k1[i];
    for (uint32_t r = 0; r < W; r++)
      for (uint32_t l = 0; l < len && ((mask >> r) & 1u); l++)
        if (o_rank[lg[r][l]] >= 0 && spec_ord16(lg[r][l]) >= t1)
          k2[n2++] = okey((uint32_t)o_rank[lg[r][l]], r, l);
    qsort(k2, n2, 8, cmp_u64);
  } else {
    memcpy(k2, k1, 8 * (size_t)c1);
    n2 = c1;
  }
  const uint32_t c2 = n2 < K ? n2 : K;
  uint64_t *rl = xcalloc((size_t)c2 + 1, 8);
  for (uint32_t i = 0; i < c2; i++)
    rl[i] = ((uint64_t)okey_r(k2[i]) << 17) | okey_l(k2[i]);
  qsort(rl, c2, 8, cmp_u64);
  for (uint32_t i = 0; i < K; i++) {
    int64_t gid = -1;
    if (i < c2)
      ck_assert_int_eq(dcpx_gid((uint32_t)rl[i] & 0x1FFFFu,
                                (uint32_t)(rl[i] >> 17), W, I, &gid),
                       0);
    ids[i] = (int32_t)gid;
  }
  free(k1);
  free(k2);
  free(rl);
}

/* dcpx_ref_call with dcpx_ref_in.lists against given_oracle, on random
 * valid lists (random ascending subsets, full in about half of the rows,
 * values now and then unlike the logit) over tie-heavy rows; lists that
 * are the local top-N give the logits' own result; bad lists are refused. */
START_TEST(test_given_lists) {
  uint64_t s = g_seed ^ 0x6177E4ull;
  uint64_t rescued = 0, differ = 0;
  for (uint32_t c = 0; c < 300; c++) {
    const uint32_t W = 1 + dcpx_rnd_below(&s, 5), K = 2 + dcpx_rnd_below(&s, 40);
    const uint32_t N = 1 + dcpx_rnd_below(&s, K - 1), I = 1 + dcpx_rnd_below(&s, 3);
    const uint32_t len = dcpx_rnd_below(&s, 3 * K), nvals = 1 + dcpx_rnd_below(&s, 12);
    dcpx_shape sh = DCPX_SHAPE_INIT;
    sh.world = W;
    sh.rows = 1;
    sh.topk = K;
    sh.local_topk = N;
    sh.interleave = I;
    sh.max_local = len ? len : 1;
    uint16_t *lg[DCPX_MAX_WORLD], *v[DCPX_MAX_WORLD];
    int32_t *ix[DCPX_MAX_WORLD], ends[DCPX_MAX_WORLD][1];
    const int32_t *ep[DCPX_MAX_WORLD];
    dcpx_lists li[DCPX_MAX_WORLD];
    const dcpx_lists *lp[DCPX_MAX_WORLD];
    for (uint32_t r = 0; r < W; r++) {
      lg[r] = xcalloc(len + 1, 2);
      v[r] = xcalloc(N, 2);
      ix[r] = xcalloc(N, 4);
      for (uint32_t l = 0; l < len; l++)
        lg[r][l] = dcpx_rnd_below(&s, 20) ? (uint16_t)(0x3F80 + dcpx_rnd_below(&s, nvals))
                                     : 0x7FC1; /* NaN now and then */
      uint32_t avail = 0, want, j = 0;
      for (uint32_t l = 0; l < len; l++)
        avail += o_rank[lg[r][l]] >= 0;
      want = avail < N ? avail : N;
      if (dcpx_rnd_below(&s, 2))
        want = dcpx_rnd_below(&s, want + 1);
      for (uint32_t l = 0; l < len && j < want; l++) {
        if (o_rank[lg[r][l]] < 0 || dcpx_rnd_below(&s, avail--) >= want - j)
          continue;
        v[r][j] = dcpx_rnd_below(&s, 4) ? lg[r][l] : (uint16_t)(0x3F80 + dcpx_rnd_below(&s, 16));
        ix[r][j++] = (int32_t)l;
      }
      for (; j < N; j++)
        ix[r][j] = -1;
      ends[r][0] = (int32_t)len;
      ep[r] = ends[r];
      li[r] = (dcpx_lists)DCPX_LISTS_INIT;
      li[r].rows = 1;
      li[r].n = N;
      li[r].values = v[r];
      li[r].indices = ix[r];
      lp[r] = &li[r];
    }
    int32_t req = 0, bt[1] = {0}, rows_out[4096], valid, ids[4096], want_ids[4096];
    int32_t plain_ids[4096];
    uint32_t sat, want_sat;
    dcpx_ref_stats st = {0, 0, 0};
    /* block_size 1 and a table of one block: only rows_out of rank 0
     * elements beyond l = 0 fail; ids_out and sat_word do not care. */
    sh.block_size = 1;
    int32_t *btab = xcalloc(len + 1, 4);
    ck_assert_int_eq(t_ref_call_lists(&sh, 1, (const uint16_t *const *)lg, len,
                                      ep, 0, &req, btab, 1, len ? len : 1,
                                      rows_out, &valid, ids, &sat, &st, lp),
                     0);
    given_oracle(W, K, N, I, len, (const uint16_t *const *)lg,
                 (const uint16_t *const *)v, (const int32_t *const *)ix,
                 want_ids, &want_sat);
    ck_assert_msg(!memcmp(ids, want_ids, 4 * (size_t)K) && sat == want_sat,
                  "given lists: case %u W=%u K=%u N=%u len=%u: ids/sat "
                  "differ from the oracle (sat %08x, want %08x)",
                  c, W, K, N, len, sat, want_sat);
    rescued += st.rescue_rows;
    ck_assert_int_eq(t_ref_call(&sh, 1, (const uint16_t *const *)lg, len, ep,
                                0, &req, btab, 1, len ? len : 1, rows_out,
                                &valid, plain_ids, NULL, NULL),
                     0);
    differ += memcmp(ids, plain_ids, 4 * (size_t)K) != 0;
    (void)bt;
    free(btab);
    for (uint32_t r = 0; r < W; r++) {
      free(lg[r]);
      free(v[r]);
      free(ix[r]);
    }
  }
  printf("check_ref: given lists: 300 calls as the oracle, %" PRIu64
         " rescued, %" PRIu64 " unlike the logits' result\n", rescued, differ);
  ck_assert_uint_gt(rescued, 20);
  ck_assert_uint_gt(differ, 20);
}
END_TEST

/* The local top-N as given lists: the logits' own result; and the rules
 * of dcpx_lists, checked by the reference always. */
START_TEST(test_given_lists_rules) {
  const uint32_t N = 4, K = 8, L = 16;
  dcpx_shape sh = DCPX_SHAPE_INIT;
  sh.world = 2;
  sh.rows = 1;
  sh.topk = K;
  sh.local_topk = N;
  sh.max_local = L;
  uint16_t lg0[16], lg1[16], v[2][4];
  int32_t ix[2][4], e0[1] = {16}, e1[1] = {12};
  const uint16_t *lg[2] = {lg0, lg1};
  const int32_t *ep[2] = {e0, e1};
  for (uint32_t l = 0; l < L; l++) {
    lg0[l] = (uint16_t)(0x3F80 + (l * 7) % 5);
    lg1[l] = (uint16_t)(0x3F80 + (l * 3) % 4);
  }
  dcpx_lists li[2];
  const dcpx_lists *lp[2] = {&li[0], &li[1]};
  uint32_t w[8];
  for (uint32_t r = 0; r < 2; r++) {
    int n = dcpx_ref_local_list(lg[r], (uint32_t)ep[r][0], N, w);
    ck_assert_int_eq(n, (int)N);
    for (uint32_t j = 0; j < N; j++) {
      uint32_t o, l;
      ck_assert_int_eq(dcpx_word_decode(w, N, j, &o, &l), 1);
      v[r][j] = lg[r][l];
      ix[r][j] = (int32_t)l;
    }
    li[r] = (dcpx_lists)DCPX_LISTS_INIT;
    li[r].rows = 1;
    li[r].n = N;
    li[r].values = v[r];
    li[r].indices = ix[r];
  }
  int32_t req = 0, bt[16], ro[8], va, ids[8], ro2[8], va2, ids2[8];
  uint32_t sat, sat2;
  for (int i = 0; i < 16; i++)
    bt[i] = i;
  ck_assert_int_eq(t_ref_call(&sh, 1, lg, L, ep, 0, &req, bt, 1, 16, ro, &va,
                              ids, &sat, NULL), 0);
  ck_assert_int_eq(t_ref_call_lists(&sh, 1, lg, L, ep, 0, &req, bt, 1, 16, ro2,
                                    &va2, ids2, &sat2, NULL, lp), 0);
  ck_assert(!memcmp(ro, ro2, sizeof(ro)) && va == va2 &&
            !memcmp(ids, ids2, sizeof(ids)) && sat == sat2);
#define REF_BAD(stmt, code)                                                   \
  do {                                                                        \
    int32_t keep_ix = ix[1][1], keep_ix2 = ix[1][2];                          \
    uint16_t keep_v = v[1][1];                                                \
    uint32_t keep_n = li[1].n, keep_rows = li[1].rows;                        \
    stmt;                                                                     \
    ck_assert_int_eq(t_ref_call_lists(&sh, 1, lg, L, ep, 0, &req, bt, 1, 16,  \
                                      ro2, &va2, ids2, NULL, NULL, lp),       \
                     (code));                                                 \
    ix[1][1] = keep_ix, ix[1][2] = keep_ix2, v[1][1] = keep_v;                \
    li[1].n = keep_n, li[1].rows = keep_rows;                                 \
  } while (0)
  REF_BAD(ix[1][1] = 12, DCPX_E_RANGE);             /* == rank 1's row_end */
  REF_BAD(v[1][1] = 0x7FC0, DCPX_E_RANGE);          /* NaN */
  REF_BAD(ix[1][1] = ix[1][2], DCPX_E_RANGE);       /* repeated */
  REF_BAD((ix[1][1] = ix[1][2], ix[1][2] = keep_ix), DCPX_E_RANGE); /* order */
  REF_BAD(ix[1][1] = -1, DCPX_E_RANGE);             /* full after empty */
  REF_BAD(li[1].n = 3, DCPX_E_INVAL);
  REF_BAD(li[1].rows = 2, DCPX_E_INVAL);
#undef REF_BAD
  ck_assert_int_eq(t_ref_call_lists(&sh, 1, lg, L, ep, 0, &req, bt, 1, 16, ro2,
                                    &va2, ids2, NULL, NULL, lp), 0);
}
END_TEST

/* ---- adversarial corners against tests/brute.h ---------------------------- */

/* One adversarial call (tests/brute.h's generator: its shape, rows,
 * tables and, in some cases, given lists) through dcpx_ref_call for every
 * rank, against the brute force: sat_word, ids_out, rows_out, valid_out,
 * the statistics, and DCPX_E_RANGE exactly when one of the rank's rows
 * fails its table lookup (5.7). */
typedef struct adv_counts {
  uint64_t cases, rows, rescue_rows, changed, range_calls, sel_hi, given_rows,
      multi_sat, kodd, w16, big;
} adv_counts;

static void adv_ref_case(uint64_t seed, adv_counts *k) {
  uint64_t s = seed;
  const int big = dcpx_rnd_below(&s, 8) == 0;
  dcpx_shape sh = adv_shape(&s, big ? DCPX_MAX_LOCAL : 3000, big ? 4 : 16);
  const uint32_t W = sh.world, K = sh.topk, N = sh.local_topk,
                 maxl = sh.max_local;
  uint32_t rows = maxl > 20000 ? 1 : adv_in(&s, 1, 3);
  sh.rows = rows + dcpx_rnd_below(&s, 2);
  ck_assert_int_eq(dcpx_shape_check(&sh), 0);
  const uint64_t stride = maxl + dcpx_rnd_below(&s, 3);
  const uint32_t hot = dcpx_rnd_below(&s, W), cmode = dcpx_rnd_below(&s, 8);
  const int mixed = dcpx_rnd_below(&s, 3) == 0;
  const int given = dcpx_rnd_below(&s, 4) == 0;
  const int bad = dcpx_rnd_below(&s, 6) == 0;
  uint16_t *lg[DCPX_MAX_WORLD], *gv[DCPX_MAX_WORLD] = {0};
  int32_t *re[DCPX_MAX_WORLD], *gi[DCPX_MAX_WORLD] = {0};
  int32_t *req[DCPX_MAX_WORLD], *bt[DCPX_MAX_WORLD];
  dcpx_lists li[DCPX_MAX_WORLD];
  const dcpx_lists *lp[DCPX_MAX_WORLD];
  bf_el *scr = xcalloc((size_t)stride + 1, sizeof(bf_el));
  const uint32_t bt_rows = adv_in(&s, 1, 3);
  uint32_t bt_cols = (uint32_t)((maxl + (uint64_t)sh.block_size - 1) /
                                sh.block_size);
  if (bad && dcpx_rnd_below(&s, 2))
    bt_cols = dcpx_rnd_below(&s, bt_cols + 1); /* too narrow */
  for (uint32_t r = 0; r < W; r++) {
    lg[r] = xcalloc((size_t)rows * stride, sizeof(uint16_t));
    re[r] = xcalloc(rows, sizeof(int32_t));
    for (uint32_t t = 0; t < rows; t++) {
      const uint32_t len = big && t == 0 ? maxl : adv_len(&s, N, K, maxl);
      re[r][t] = (int32_t)len;
      adv_row(&s, lg[r] + t * stride, len, stride,
              mixed ? dcpx_rnd_below(&s, 8) : cmode, r, hot, K);
    }
    lp[r] = NULL;
    if (given && dcpx_rnd_below(&s, 4)) {
      gv[r] = xcalloc((size_t)rows * N, sizeof(uint16_t));
      gi[r] = xcalloc((size_t)rows * N, sizeof(int32_t));
      const uint32_t kind = dcpx_rnd_below(&s, 3);
      for (uint32_t t = 0; t < rows; t++)
        adv_list(&s, lg[r] + t * stride, (uint32_t)re[r][t], N, kind,
                 gv[r] + (size_t)t * N, gi[r] + (size_t)t * N, scr);
      li[r] = (dcpx_lists)DCPX_LISTS_INIT;
      li[r].rows = rows;
      li[r].n = N;
      li[r].values = gv[r];
      li[r].indices = gi[r];
      lp[r] = &li[r];
    }
    bt[r] = xcalloc((size_t)bt_rows * bt_cols + 1, sizeof(int32_t));
    adv_table(&s, bt[r], bt_rows, bt_cols, sh.block_size, bad);
    req[r] = xcalloc(rows, sizeof(int32_t));
    for (uint32_t t = 0; t < rows; t++)
      req[r][t] = bad && dcpx_rnd_below(&s, 4) == 0
                      ? (dcpx_rnd_below(&s, 2) ? -1 : (int32_t)bt_rows)
                      : (int32_t)dcpx_rnd_below(&s, bt_rows);
  }

  /* The brute force of every row. */
  bf_row_out *o = xcalloc(rows, sizeof(bf_row_out));
  bf_el *selbuf = xcalloc((size_t)rows * K, sizeof(bf_el));
  bf_row_in bi;
  memset(&bi, 0, sizeof(bi));
  bi.W = W;
  bi.K = K;
  bi.N = N;
  uint64_t want_resc = 0, want_sat = 0;
  for (uint32_t t = 0; t < rows; t++) {
    for (uint32_t r = 0; r < W; r++) {
      bi.x[r] = lg[r] + t * stride;
      bi.len[r] = (uint32_t)re[r][t];
      bi.gv[r] = lp[r] ? gv[r] + (size_t)t * N : NULL;
      bi.gi[r] = lp[r] ? gi[r] + (size_t)t * N : NULL;
    }
    bf_el *bs = xcalloc(bf_scratch(&bi), sizeof(bf_el));
    o[t].sel = selbuf + (size_t)t * K;
    bf_row(&bi, bs, &o[t]);
    free(bs);
    want_resc += o[t].mask != 0;
    want_sat += (uint64_t)__builtin_popcount(o[t].mask);
    k->rows++;
    k->rescue_rows += o[t].mask != 0;
    k->changed += !o[t].s1_exact;
    k->multi_sat += __builtin_popcount(o[t].mask) > 1;
    k->given_rows += given;
  }

  char what[200];
  snprintf(what, sizeof(what),
           "adversarial seed=0x%" PRIx64 " W=%u K=%u N=%u B=%u I=%u "
           "max_local=%u rows=%u given=%d bad=%d",
           seed, W, K, N, sh.block_size, sh.interleave, maxl, rows, given,
           bad);
  int32_t *ro = xcalloc((size_t)rows * K, sizeof(int32_t));
  int32_t *io = xcalloc((size_t)rows * K, sizeof(int32_t));
  int32_t *wr = xcalloc(K, sizeof(int32_t)), *wi = xcalloc(K, sizeof(int32_t));
  int32_t *vo = xcalloc(rows, sizeof(int32_t));
  uint32_t *so = xcalloc(rows, sizeof(uint32_t));
  for (uint32_t d = 0; d < W; d++) {
    int want_rc = 0;
    for (uint32_t t = 0; t < rows; t++) {
      int32_t wv;
      if (bf_outputs(&o[t], W, K, sh.block_size, sh.interleave, d,
                     req[d][t], bt[d], bt_rows, bt_cols, wr, &wv, wi) < 0)
        want_rc = DCPX_E_RANGE;
    }
    dcpx_ref_stats st = {0, 0, 0};
    int rc = t_ref_call_lists(&sh, rows, (const uint16_t *const *)lg, stride,
                              (const int32_t *const *)re, d, req[d], bt[d],
                              bt_rows, bt_cols, ro, vo, io, so, &st,
                              given ? lp : NULL);
    EXPECT(rc == want_rc, "%s d=%u: dcpx_ref_call = %d, want %d", what, d, rc,
           want_rc);
    k->range_calls += rc == DCPX_E_RANGE;
    if (rc)
      continue;
    EXPECT(st.rows == rows && st.rescue_rows == want_resc &&
               st.saturated == want_sat,
           "%s d=%u: stats %" PRIu64 " %" PRIu64 " %" PRIu64 ", want %u %"
           PRIu64 " %" PRIu64, what, d, st.rows, st.rescue_rows,
           st.saturated, rows, want_resc, want_sat);
    for (uint32_t t = 0; t < rows; t++) {
      int32_t wv = 0;
      ck_assert_int_eq(bf_outputs(&o[t], W, K, sh.block_size, sh.interleave,
                                  d, req[d][t], bt[d], bt_rows, bt_cols, wr,
                                  &wv, wi),
                       0);
      EXPECT(so[t] == o[t].sat_word, "%s d=%u t=%u: sat_word 0x%08x, want "
             "0x%08x", what, d, t, so[t], o[t].sat_word);
      EXPECT(vo[t] == wv, "%s d=%u t=%u: valid_out %d, want %d", what, d, t,
             vo[t], wv);
      for (uint32_t i = 0; i < K; i++) {
        EXPECT(io[(size_t)t * K + i] == wi[i],
               "%s d=%u t=%u: ids_out[%u] = %d, want %d", what, d, t, i,
               io[(size_t)t * K + i], wi[i]);
        EXPECT(ro[(size_t)t * K + i] == wr[i],
               "%s d=%u t=%u: rows_out[%u] = %d, want %d", what, d, t, i,
               ro[(size_t)t * K + i], wr[i]);
      }
      for (uint32_t i = 0; i < o[t].nsel; i++)
        k->sel_hi += o[t].sel[i].r == d && o[t].sel[i].l >= 65536;
    }
  }
  k->cases++;
  k->kodd += K % 2;
  k->w16 += W == 16;
  k->big += big;
  for (uint32_t r = 0; r < W; r++) {
    free(lg[r]);
    free(re[r]);
    free(gv[r]);
    free(gi[r]);
    free(bt[r]);
    free(req[r]);
  }
  free(scr);
  free(o);
  free(selbuf);
  free(ro);
  free(io);
  free(wr);
  free(wi);
  free(vo);
  free(so);
}

START_TEST(test_adversarial_brute) {
  adv_counts k;
  memset(&k, 0, sizeof(k));
  uint32_t n = 2000 * g_scale / 100;
  if (n < 40)
    n = 40;
  for (uint32_t i = 0; i < n; i++)
    adv_ref_case(case_seed(16, i), &k);
  printf("check_ref: adversarial: %" PRIu64 " cases (%" PRIu64 " K odd, %"
         PRIu64 " W=16, %" PRIu64 " rows >= 2^16), %" PRIu64 " rows, %" PRIu64
         " rescued (%" PRIu64 " changed by it, %" PRIu64 " with 2+ saturated "
         "ranks), %" PRIu64 " given-list rows, %" PRIu64 " calls DCPX_E_RANGE, %"
         PRIu64 " own l >= 2^16 selected\n",
         k.cases, k.kodd, k.w16, k.big, k.rows, k.rescue_rows, k.changed,
         k.multi_sat, k.given_rows, k.range_calls, k.sel_hi);
  fflush(stdout);
  ck_assert_uint_gt(k.rescue_rows, k.rows / 5);
  ck_assert_uint_gt(k.changed, k.rows / 20);
  ck_assert_uint_gt(k.multi_sat, 10);
  ck_assert_uint_gt(k.given_rows, 20);
  ck_assert_uint_gt(k.range_calls, 5);
  ck_assert_uint_gt(k.sel_hi, 0);
  ck_assert_uint_gt(k.kodd, 20);
  ck_assert_uint_gt(k.w16, 20);

  /* Hand-checked (docs/PROTOCOL.md 5.8): the local top-N's indices with a
   * value of other bits are another list. W = 2, K = 2, N = 1, rank 0
   * {-0, -inf}, rank 1 {+0, +0}: both ranks saturated; T1 is -0's ord16
   * from the logits, +0's when rank 0 gives (+0, l = 0); the selection is
   * rank 1's two +0 either way. */
  {
    dcpx_shape sh = DCPX_SHAPE_INIT;
    sh.world = 2;
    sh.rows = 1;
    sh.topk = 2;
    sh.local_topk = 1;
    sh.max_local = 2;
    const uint16_t a[2] = {0x8000, 0xFF80}, b[2] = {0x0000, 0x0000};
    const uint16_t *lg[2] = {a, b};
    const int32_t e[1] = {2}, *re[2] = {e, e};
    const uint16_t gv[1] = {0x0000};
    const int32_t gi[1] = {0};
    dcpx_lists li = DCPX_LISTS_INIT;
    li.rows = 1;
    li.n = 1;
    li.values = gv;
    li.indices = gi;
    const dcpx_lists *lp[2] = {&li, NULL};
    int32_t req = 0, bt[2] = {0, 1}, ro[2], va, ids[2];
    uint32_t sat;
    ck_assert_int_eq(t_ref_call(&sh, 1, lg, 2, re, 1, &req, bt, 1, 2, ro, &va,
                                ids, &sat, NULL), 0);
    ck_assert_uint_eq(sat, 0x37FFFu);
    ck_assert_int_eq(ids[0], 1); /* (1, 0) */
    ck_assert_int_eq(ids[1], 3); /* (1, 1) */
    ck_assert_int_eq(t_ref_call_lists(&sh, 1, lg, 2, re, 1, &req, bt, 1, 2,
                                      ro, &va, ids, &sat, NULL, lp), 0);
    ck_assert_uint_eq(sat, 0x38000u);
    ck_assert_int_eq(ids[0], 1);
    ck_assert_int_eq(ids[1], 3);
  }
}
END_TEST

static Suite *ref_suite(void) {
  Suite *s = suite_create("ref");
  TCase *tc;

  tc = t_tcase(s, "core", 60);
  tcase_add_test(tc, test_oracle_order);
  tcase_add_test(tc, test_select);
  tcase_add_test(tc, test_round1);
  tcase_add_test(tc, test_local_list);
  tcase_add_test(tc, test_rescue_list);
  tcase_add_test(tc, test_auto_local_topk);
  tcase_add_test(tc, test_given_lists);
  tcase_add_test(tc, test_given_lists_rules);

  tc = t_tcase(s, "random", 120);
  tcase_add_test(tc, test_random_small);
  tcase_add_test(tc, test_ref_call_auto_n);
  tcase_add_test(tc, test_random_large);
  tcase_add_test(tc, test_blocks_interleave);

  tc = t_tcase(s, "adversarial", 60);
  tcase_add_test(tc, test_all_equal);
  tcase_add_test(tc, test_ties_at_kth);
  tcase_add_test(tc, test_special_values);
  tcase_add_test(tc, test_short_rows);
  tcase_add_test(tc, test_all_saturated);
  tcase_add_test(tc, test_one_rank_holds_topk);
  tcase_add_test(tc, test_fewer_than_k);
  tcase_add_test(tc, test_adversarial_brute);

  tc = t_tcase(s, "errors", 30);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_overlapping_outputs);
  return s;
}

int main(void) {
  const char *e = getenv("DCPX_TEST_SEED");
  if (e && *e)
    g_seed = strtoull(e, NULL, 0);
  e = getenv("DCPX_TEST_REPLAY");
  if (e && *e)
    g_replay = strtoull(e, NULL, 0);
  e = getenv("DCPX_TEST_SCALE");
  if (e && *e)
    g_scale = (uint32_t)strtoul(e, NULL, 10);
  oracle_init(); /* before the forks: every test inherits it */
  printf("check_ref: seed 0x%" PRIx64 " scale %u%% (DCPX_TEST_SEED, "
         "DCPX_TEST_SCALE)\n",
         g_seed, g_scale);
  fflush(stdout);
  /* CK_VERBOSITY=verbose lists every test */
  return t_suite_run_mode(ref_suite(), CK_ENV);
}
