/* brute.h - a brute force of docs/PROTOCOL.md sections 2, 5.7 and 5.8, and
 * a generator of adversarial calls, shared by check_ref.c and check_host.c.
 *
 * Independence: nothing here calls into libdcpx's order, selection, wire
 * or gid code (no merge.h, no dcpx_ord16, dcpx_gid, dcpx_ref_*). The order
 * is the float order of the bf16 values (widened to float32; -0 below +0,
 * NaN dropped), ties by (r, l); a row's result is "sort every candidate,
 * take the first K"; with given lists (5.8) it is rounds 1 and 2 spelled
 * out with sorts. ord16 appears only where the contract puts it in an
 * output (sat_word's T1), through its own copy of the formula. dcpx.h is
 * used for its types and limits only.
 *
 * The generator aims at the corners: bf16 specials (+-0, +-inf,
 * subnormals, NaN of every sign and payload), ties at the K-th value
 * across the saturated / unsaturated boundary, K odd, K = 2, K = 4096,
 * N = 1, N = K - 1, N = K / W, W = 1 and 16, W * N below, at and above K,
 * rows shorter than N, empty, beyond 2^16 and at 2^17, B and I not powers
 * of two, 1, huge, beyond max_local, I at the gid bound, block tables
 * whose KV rows reach 2^31 - 1 (and pass it), negative blocks, narrow
 * tables, req_id out of range, and given lists (5.8) that are the local
 * top-N, shorter than N, random subsets, with values unlike the logits,
 * or at indices whose logit is NaN. */
#ifndef DCPX_TESTS_BRUTE_H
#define DCPX_TESTS_BRUTE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dcpx.h"
#include "rng.h"

/* ---- the order ------------------------------------------------------------ */

static inline int bf_isnan(uint16_t b) {
  /* exponent all ones, mantissa not zero: the float's own test */
  return (b & 0x7F80u) == 0x7F80u && (b & 0x007Fu) != 0;
}

static inline float bf_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* > 0 if a's value beats b's, < 0 if b's beats a's, 0 if the same bits
 * (for non-NaN bf16, equal floats are equal bits but for +-0). */
static inline int bf_vcmp(uint16_t a, uint16_t b) {
  const float fa = bf_float(a), fb = bf_float(b);
  if (fa != fb)
    return fa > fb ? 1 : -1;
  if (a == b)
    return 0;
  return (a & 0x8000u) ? -1 : 1; /* -0 below +0 */
}

/* docs/PROTOCOL.md section 2, copied: for sat_word only. */
static inline uint32_t bf_spec_ord16(uint16_t b) {
  return (b & 0x8000u) ? (~(uint32_t)b & 0xFFFFu) : ((uint32_t)b | 0x8000u);
}

typedef struct bf_el {
  uint16_t v;
  uint8_t r;
  uint32_t l;
} bf_el;

static inline int bf_cmp_best(const void *pa, const void *pb) {
  const bf_el *a = pa, *b = pb;
  const int c = bf_vcmp(a->v, b->v);
  if (c)
    return -c;
  if (a->r != b->r)
    return a->r < b->r ? -1 : 1;
  return a->l < b->l ? -1 : a->l > b->l;
}

static inline int bf_cmp_rl(const void *pa, const void *pb) {
  const bf_el *a = pa, *b = pb;
  if (a->r != b->r)
    return a->r < b->r ? -1 : 1;
  return a->l < b->l ? -1 : a->l > b->l;
}

/* ---- one row -------------------------------------------------------------- */

typedef struct bf_row_in {
  uint32_t W, K, N;
  const uint16_t *x[DCPX_MAX_WORLD]; /* rank r's row */
  uint32_t len[DCPX_MAX_WORLD];      /* its row_end */
  /* rank r's given list of the row (N values and indices, negative:
   * empty), or NULL: its local top-N of x */
  const uint16_t *gv[DCPX_MAX_WORLD];
  const int32_t *gi[DCPX_MAX_WORLD];
} bf_row_in;

typedef struct bf_row_out {
  uint32_t nsel;    /* selected elements */
  bf_el *sel;       /* [K], (r, l) order */
  uint32_t mask;    /* saturated ranks */
  uint32_t sat_word;
  int s1_exact;     /* S1 was already the result */
} bf_row_out;

/* Rank r's candidates of the row, sorted best first, into a (returns the
 * count). */
static inline uint32_t bf_rank_sorted(const bf_row_in *in, uint32_t r, bf_el *a) {
  uint32_t m = 0;
  for (uint32_t l = 0; l < in->len[r]; l++)
    if (!bf_isnan(in->x[r][l]))
      a[m++] = (bf_el){in->x[r][l], (uint8_t)r, l};
  qsort(a, m, sizeof(bf_el), bf_cmp_best);
  return m;
}

/* Scratch of bf_row: 2 * (sum of len + W * N) + K elements. */
static inline size_t bf_scratch(const bf_row_in *in) {
  size_t n = 0;
  for (uint32_t r = 0; r < in->W; r++)
    n += in->len[r];
  return 2 * (n + (size_t)in->W * in->N) + in->K + 1;
}

static inline void bf_row(const bf_row_in *in, bf_el *scratch, bf_row_out *o) {
  const uint32_t W = in->W, K = in->K, N = in->N;
  size_t tot = 0;
  int given = 0;
  for (uint32_t r = 0; r < W; r++) {
    tot += in->len[r];
    given |= in->gi[r] != NULL;
  }
  bf_el *k1 = scratch, *all = scratch + (size_t)W * N + 1,
        *k2 = all + tot + 1;
  uint32_t n1 = 0, cnt[DCPX_MAX_WORLD] = {0}, ins1[DCPX_MAX_WORLD] = {0};

  /* Round 1, literally: every rank's list (given, or its N best). */
  for (uint32_t r = 0; r < W; r++) {
    if (in->gi[r]) {
      for (uint32_t j = 0; j < N && in->gi[r][j] >= 0; j++, cnt[r]++)
        k1[n1++] = (bf_el){in->gv[r][j], (uint8_t)r, (uint32_t)in->gi[r][j]};
    } else {
      const uint32_t m = bf_rank_sorted(in, r, all);
      for (uint32_t j = 0; j < m && j < N; j++, cnt[r]++)
        k1[n1++] = all[j];
    }
  }
  qsort(k1, n1, sizeof(bf_el), bf_cmp_best);
  const uint32_t c1 = n1 < K ? n1 : K;
  for (uint32_t i = 0; i < c1; i++)
    ins1[k1[i].r]++;
  o->mask = 0;
  for (uint32_t r = 0; r < W; r++)
    if (cnt[r] == N && ins1[r] == N)
      o->mask |= 1u << r;
  o->sat_word = (o->mask << 16) | (c1 == K ? bf_spec_ord16(k1[K - 1].v) : 0);

  uint32_t n2 = 0;
  if (!given) {
    /* section 2: the first K of every candidate of every rank */
    for (uint32_t r = 0; r < W; r++)
      for (uint32_t l = 0; l < in->len[r]; l++)
        if (!bf_isnan(in->x[r][l]))
          k2[n2++] = (bf_el){in->x[r][l], (uint8_t)r, l};
  } else if (!o->mask) {
    memcpy(k2, k1, sizeof(bf_el) * c1); /* 5.2: S1 is the result */
    n2 = c1;
  } else {
    /* 5.5 with 5.8: the S1 keys of the ranks not saturated, and each
     * saturated rank's top K of its logits not below S1's K-th */
    for (uint32_t i = 0; i < c1; i++)
      if (!((o->mask >> k1[i].r) & 1u))
        k2[n2++] = k1[i];
    for (uint32_t r = 0; r < W; r++) {
      if (!((o->mask >> r) & 1u))
        continue;
      const uint32_t m = bf_rank_sorted(in, r, all);
      for (uint32_t j = 0; j < m && j < K; j++)
        if (c1 < K || bf_vcmp(all[j].v, k1[K - 1].v) >= 0)
          k2[n2++] = all[j];
    }
  }
  qsort(k2, n2, sizeof(bf_el), bf_cmp_best);
  o->nsel = n2 < K ? n2 : K;
  /* S1 the result already? (for the counts of the tests) */
  o->s1_exact = 1;
  if (!given) {
    bf_el *s1 = all;
    memcpy(s1, k1, sizeof(bf_el) * c1);
    qsort(s1, c1, sizeof(bf_el), bf_cmp_rl);
    qsort(k2, o->nsel, sizeof(bf_el), bf_cmp_rl);
    o->s1_exact = c1 == o->nsel && !memcmp(s1, k2, sizeof(bf_el) * c1);
  } else {
    qsort(k2, o->nsel, sizeof(bf_el), bf_cmp_rl);
  }
  memcpy(o->sel, k2, sizeof(bf_el) * o->nsel);
}

/* Rank d's outputs of a row (5.7): rows_out and valid_out, ids_out (K
 * each). Returns 0, or -1 when the row's table lookup fails (req_id
 * outside the table, or an own element's column outside it, its block
 * negative or its KV row above 2^31 - 1); rows_out and valid_out are then
 * not written, ids_out is. */
static inline int bf_outputs(const bf_row_out *o, uint32_t W, uint32_t K, uint32_t B,
                      uint32_t I, uint32_t d, int32_t req, const int32_t *bt,
                      uint32_t bt_rows, uint32_t bt_cols, int32_t *rows_out,
                      int32_t *valid_out, int32_t *ids_out) {
  for (uint32_t i = 0; i < K; i++) {
    int64_t gid = -1;
    if (i < o->nsel) {
      const uint64_t l = o->sel[i].l, r = o->sel[i].r;
      /* (l / I) * I * W + r * I + l % I, in 64 bits */
      gid = (int64_t)((l - l % I) * W + r * I + l % I);
    }
    ids_out[i] = (int32_t)gid;
  }
  if (req < 0 || (uint32_t)req >= bt_rows)
    return -1;
  uint32_t v = 0;
  for (uint32_t i = 0; i < o->nsel; i++) {
    if (o->sel[i].r != d)
      continue;
    const uint64_t l = o->sel[i].l, col = l / B;
    if (col >= bt_cols)
      return -1;
    const int64_t blk = bt[(uint64_t)req * bt_cols + col];
    const int64_t kv = blk * (int64_t)B + (int64_t)(l % B);
    if (blk < 0 || kv > 2147483647)
      return -1;
    rows_out[v++] = (int32_t)kv;
  }
  for (uint32_t i = v; i < K; i++)
    rows_out[i] = -1;
  *valid_out = (int32_t)v;
  return 0;
}

/* ---- the generator ---------------------------------------------------------- */

static inline uint32_t adv_in(uint64_t *s, uint32_t lo, uint32_t hi) {
  return lo + dcpx_rnd_below(s, hi - lo + 1);
}

static const uint16_t adv_specials[] = {
    0x0000, 0x8000, 0x7F80, 0xFF80,         /* +-0, +-inf */
    0x0001, 0x8001, 0x007F, 0x807F,         /* subnormals */
    0x0080, 0x8080, 0x7F7F, 0xFF7F,         /* smallest normal, max finite */
    0x3F80, 0xBF80, 0x3F81, 0x3F7F,         /* +-1 and neighbours */
    0x7F81, 0xFF81, 0x7FC0, 0xFFC0,         /* NaNs: quiet, signalling, */
    0x7FFF, 0xFFFF, 0x7FA5, 0xFFDA,         /* every sign and payload */
};
#define ADV_NSPECIALS (sizeof(adv_specials) / sizeof(adv_specials[0]))

/* A valid shape with its corners; max_local <= cap_local. */
static inline dcpx_shape adv_shape(uint64_t *s, uint32_t cap_local, uint32_t wmax) {
  dcpx_shape sh = DCPX_SHAPE_INIT;
  uint32_t W, K, N, B, I, maxl;
  switch (dcpx_rnd_below(s, 5)) {
  case 0: W = 1; break;
  case 1: W = wmax; break;
  default: W = adv_in(s, 1, wmax);
  }
  /* the class of max_local first: rows beyond 2^16 take K = 4096 or 4095
   * half of the time (capacity-K lists whose plane words are full) */
  const uint32_t lclass = dcpx_rnd_below(s, 8);
  const int hi = (lclass == 1 || lclass == 2) && cap_local > 65536;
  switch (hi && dcpx_rnd_below(s, 2) ? 3 : dcpx_rnd_below(s, 7)) {
  case 0: K = 2; break;
  case 1: K = 3; break;
  case 2: K = adv_in(s, 2, 40) | 1; break; /* odd */
  case 3: K = dcpx_rnd_below(s, 2) ? 4096 : 4095; break;
  case 4: K = adv_in(s, 200, 1200); break;
  default: K = adv_in(s, 2, 160);
  }
  switch (dcpx_rnd_below(s, 7)) {
  case 0: N = 1; break;
  case 1: N = K - 1; break;
  case 2: N = K / W; break;                /* W * N <= K: always rescues */
  case 3: N = (K + W - 1) / W; break;      /* W * N just >= K */
  case 4: N = K / W + 1; break;
  case 5: N = dcpx_shape_auto_local_topk(W, K); break;
  default: N = adv_in(s, 1, K - 1);
  }
  if (N < 1)
    N = 1;
  if (N >= K)
    N = K - 1;
  switch (lclass) {
  case 0: maxl = adv_in(s, 1, 4); break;
  case 1: maxl = adv_in(s, 65535, 65538); break; /* the bit-16 plane */
  case 2: maxl = DCPX_MAX_LOCAL; break;
  default: maxl = adv_in(s, 1, 3 * K / W + 8);
  }
  if (maxl > cap_local)
    maxl = cap_local;
  switch (dcpx_rnd_below(s, 7)) {
  case 0: B = 1; break;
  case 1: B = adv_in(s, 2, 13) | 1; break;   /* odd, not a power of 2 */
  case 2: B = maxl + adv_in(s, 0, 3); break; /* one block holds the row */
  case 3: B = 1u << adv_in(s, 4, 31); break;
  case 4: B = dcpx_rnd_below(s, 2) ? 0xFFFFFFFFu : 0x7FFFFFFFu; break;
  default: B = adv_in(s, 1, 100);
  }
  switch (dcpx_rnd_below(s, 6)) {
  case 0: I = 1; break;
  case 1: I = adv_in(s, 2, 9); break;
  case 2: I = maxl + adv_in(s, 0, 3); break;
  case 3: I = (uint32_t)(2147483647u / W); break; /* at the gid bound */
  default: I = adv_in(s, 1, 100);
  }
  while ((uint64_t)(maxl / I + 1) * I * W > 2147483647u)
    I = I > 1 ? I - 1 - (I - 1) / 64 : 1; /* largest I below the bound */
  sh.world = W;
  sh.rows = 1;
  sh.topk = K;
  sh.local_topk = N;
  sh.block_size = B;
  sh.interleave = I;
  sh.max_local = maxl;
  return sh;
}

/* Bf16 value of a mode for rank r (hot: the rank that holds the best). */
static inline uint16_t adv_value(uint64_t *s, uint32_t mode, uint32_t r,
                          uint32_t hot) {
  switch (mode) {
  case 0: /* any bits: NaNs, infs, subnormals */
    return (uint16_t)dcpx_splitmix64(s);
  case 1: /* the specials */
    return adv_specials[dcpx_rnd_below(s, ADV_NSPECIALS)];
  case 2: /* +-0 and the smallest subnormals: -0 < +0 is the whole order */
    return (uint16_t)(dcpx_rnd_below(s, 2) ? dcpx_rnd_below(s, 2)
                                           : 0x8000u + dcpx_rnd_below(s, 2));
  case 3: /* +-inf, +-0 and NaN */
    return adv_specials[dcpx_rnd_below(s, 4) +
                        (dcpx_rnd_below(s, 4) ? 0 : 16)];
  case 4: /* two values; the hot rank mostly the better one: ties at T1
             across the saturated and the other ranks */
    return r == hot ? (uint16_t)(dcpx_rnd_below(s, 4) ? 0x4000 : 0x3F80)
                    : (uint16_t)(dcpx_rnd_below(s, 4) ? 0x3F80 : 0x4000);
  case 5: /* NaN-heavy */
    return dcpx_rnd_below(s, 4) ? adv_specials[16 + dcpx_rnd_below(s, 8)]
                                : adv_specials[dcpx_rnd_below(s, 16)];
  case 6: /* all equal */
    return 0x3F80;
  default: /* few distinct finite values, signed */
    return (uint16_t)((dcpx_rnd_below(s, 2) ? 0x8000u : 0u) | 0x3F00u |
                      dcpx_rnd_below(s, 3));
  }
}

/* A row length at the boundaries of N, K and max_local. */
static inline uint32_t adv_len(uint64_t *s, uint32_t N, uint32_t K, uint32_t maxl) {
  uint32_t v;
  switch (dcpx_rnd_below(s, 10)) {
  case 0: v = 0; break;
  case 1: v = N - 1; break;
  case 2: v = N; break;
  case 3: v = N + 1; break;
  case 4: v = K - 1; break;
  case 5: v = K; break;
  case 6: case 7: v = maxl; break;
  default: v = adv_in(s, 0, maxl);
  }
  return v > maxl ? maxl : v;
}

/* Row t of rank r: x[0..len) and garbage (+inf, the best value) after. */
static inline void adv_row(uint64_t *s, uint16_t *x, uint32_t len, uint64_t stride,
                    uint32_t mode, uint32_t r, uint32_t hot, uint32_t K) {
  for (uint64_t l = 0; l < stride; l++)
    x[l] = l < len ? adv_value(s, mode, r, hot) : 0x7F80;
  if (r == hot && len > 65536 + 2 && dcpx_rnd_below(s, 2))
    /* the best values of the hot rank beyond 2^16: bit 16 of l */
    for (uint32_t j = 0; j < K + 3 && 65536u + 3 * j < len; j++)
      x[65536u + 3 * j] = (uint16_t)(0x4700 + dcpx_rnd_below(s, 3));
}

/* A given list of rank r's row (5.8): N values and indices. kind 0: the
 * local top-N (what dcpx_push would push); 1: a random ascending subset
 * of the non-NaN elements (maybe shorter than N) with their values; 2: the
 * same with values now and then unlike the logits, at indices whose logit
 * may be NaN. scratch: len elements. */
static inline void adv_list(uint64_t *s, const uint16_t *x, uint32_t len, uint32_t N,
                     uint32_t kind, uint16_t *gv, int32_t *gi,
                     bf_el *scratch) {
  uint32_t j = 0;
  if (kind == 0) {
    uint32_t m = 0;
    for (uint32_t l = 0; l < len; l++)
      if (!bf_isnan(x[l]))
        scratch[m++] = (bf_el){x[l], 0, l};
    qsort(scratch, m, sizeof(bf_el), bf_cmp_best);
    if (m > N)
      m = N;
    qsort(scratch, m, sizeof(bf_el), bf_cmp_rl);
    for (; j < m; j++) {
      gv[j] = scratch[j].v;
      gi[j] = (int32_t)scratch[j].l;
    }
  } else {
    uint32_t avail = 0;
    for (uint32_t l = 0; l < len; l++)
      avail += kind == 2 || !bf_isnan(x[l]);
    uint32_t want = avail < N ? avail : N;
    if (dcpx_rnd_below(s, 3) == 0)
      want = dcpx_rnd_below(s, want + 1);
    for (uint32_t l = 0; l < len && j < want; l++) {
      if (kind != 2 && bf_isnan(x[l]))
        continue;
      if (dcpx_rnd_below(s, avail--) >= want - j)
        continue;
      uint16_t v = x[l];
      if (kind == 2 && (bf_isnan(v) || dcpx_rnd_below(s, 2)))
        do
          v = adv_specials[dcpx_rnd_below(s, 16)];
        while (bf_isnan(v));
      gv[j] = v;
      gi[j++] = (int32_t)l;
    }
  }
  for (; j < N; j++) {
    gv[j] = (uint16_t)dcpx_splitmix64(s); /* an empty entry's value: any */
    gi[j] = -1 - (int32_t)dcpx_rnd_below(s, 3);
  }
}

/* A block table of bt_rows x bt_cols for block size B whose KV rows reach
 * 2^31 - 1 but never pass it; with bad != 0 also blocks at the edge (a KV
 * row may pass 2^31 - 1 by its l % B), beyond it, and negative. */
static inline void adv_table(uint64_t *s, int32_t *bt, uint32_t bt_rows,
                      uint32_t bt_cols, uint32_t B, int bad) {
  const int64_t top = 2147483647 / (int64_t)B; /* blk * B <= 2^31 - 1 */
  /* blk * B + B - 1 <= 2^31 - 1 (B - 1 <= 2^31 - 1 when B < 2^32 - 1) */
  const int64_t safe =
      (int64_t)B - 1 > 2147483647 ? 0 : (2147483647 - ((int64_t)B - 1)) / B;
  for (uint64_t i = 0; i < (uint64_t)bt_rows * bt_cols; i++) {
    int64_t v;
    switch (dcpx_rnd_below(s, bad ? 7 : 4)) {
    case 0: v = safe; break;
    case 1: v = safe - dcpx_rnd_below(s, 3); break;
    case 2: v = dcpx_rnd_below(s, 1000); break;
    case 3: v = (int64_t)dcpx_rnd_below(s, (uint32_t)(safe + 1)); break;
    case 4: v = top; break;
    case 5: v = -1 - (int64_t)dcpx_rnd_below(s, 2); break;
    default: v = top + 1 + dcpx_rnd_below(s, 2); break;
    }
    if (v < 0 && !bad)
      v = 0;
    bt[i] = (int32_t)(v > 2147483647 ? 2147483647 : v);
  }
}

#endif /* DCPX_TESTS_BRUTE_H */
