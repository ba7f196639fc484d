/* check_wire.c - unit tests of the order, the wire words, the epochs, the
 * global ids, the shape limits and the error table (docs/PROTOCOL.md
 * sections 1-4; common/wire.c).
 *
 * Every expectation here comes from docs/PROTOCOL.md or from an independent
 * model (e.g. the float value of a bf16, obtained by widening it to
 * float32), never from re-running the code under test.
 *
 * Environment: DCPX_TEST_SEED (hex or decimal) replaces the base seed of the
 * randomised tests; the seed is printed in every failure message.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "dcpx.h"
#include "merge.h"
#include "rng.h"

static uint64_t g_seed = 0xD0C9A11CE5EEDull;

/* ck_assert_msg records a checkpoint (a write to Check's pipe) on every
 * passing assertion; in hot loops we only call into Check on failure. */
#define EXPECT T_EXPECT

/* The float value of bf16 bits: the high half of a float32. */
static float bf16_to_float(uint32_t b) {
  uint32_t u = (b & 0xFFFFu) << 16;
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* ---- the order (section 2) ---------------------------------------------- */

START_TEST(test_ord16_bijection_and_nan) {
  static uint8_t seen[65536];
  memset(seen, 0, sizeof(seen));
  for (uint32_t b = 0; b < 65536; b++) {
    uint32_t o = dcpx_ord16(b);
    EXPECT(o <= 0xFFFFu, "ord16(0x%04x) = 0x%x > 0xFFFF", b, o);
    EXPECT(!seen[o], "ord16 not injective: 0x%04x -> 0x%04x twice", b,
                  o);
    seen[o] = 1;
    /* Bits above 16 are ignored. */
    EXPECT(dcpx_ord16(b | 0xABCD0000u) == o,
                  "ord16(0x%04x) depends on high bits", b);
    int nan = isnan(bf16_to_float(b)) ? 1 : 0;
    EXPECT(dcpx_bf16_isnan(b) == nan,
                  "bf16_isnan(0x%04x) = %d, float says %d", b,
                  dcpx_bf16_isnan(b), nan);
    EXPECT(dcpx_bf16_isnan(b | 0xFFFF0000u) == nan,
                  "bf16_isnan(0x%04x) depends on high bits", b);
    /* The selection key: ord16, or 0 for a NaN. */
    EXPECT(dcpx__key_of_bf16(b) == (nan ? 0u : o),
                  "key_of_bf16(0x%04x) = 0x%x, want 0x%x", b,
                  dcpx__key_of_bf16(b), nan ? 0u : o);
    if (!nan)
      EXPECT(o >= 0x007Fu, "non-NaN 0x%04x has ord16 0x%04x < 0x7F", b,
                    o);
  }
  /* Extremes: -inf is the lowest non-NaN key (exactly 0x7F), +inf the
   * highest (0xFF80); the NaNs sit outside [0x7F, 0xFF80]. */
  ck_assert_uint_eq(dcpx_ord16(0xFF80u), 0x007Fu);
  ck_assert_uint_eq(dcpx_ord16(0x7F80u), 0xFF80u);
  ck_assert_int_eq(dcpx_bf16_isnan(0x7F80u), 0);
  ck_assert_int_eq(dcpx_bf16_isnan(0xFF80u), 0);
  ck_assert_int_eq(dcpx_bf16_isnan(0x7F81u), 1);
  ck_assert_int_eq(dcpx_bf16_isnan(0xFFC0u), 1);
  ck_assert_int_eq(dcpx_bf16_isnan(0x7FFFu), 1);
  ck_assert_int_eq(dcpx_bf16_isnan(0xFFFFu), 1);
}
END_TEST

/* Walking the keys upwards visits the non-NaN values in strictly increasing
 * float order, except that -0 comes immediately before +0. */
START_TEST(test_ord16_monotonic) {
  static uint32_t inv[65536];
  for (uint32_t b = 0; b < 65536; b++)
    inv[dcpx_ord16(b)] = b;
  int have_prev = 0;
  uint32_t prev = 0, n = 0;
  for (uint32_t o = 0; o < 65536; o++) {
    uint32_t b = inv[o];
    if (isnan(bf16_to_float(b)))
      continue;
    n++;
    if (have_prev) {
      float fp = bf16_to_float(prev), fc = bf16_to_float(b);
      if (prev == 0x8000u) {
        EXPECT(b == 0x0000u,
                      "-0 (ord 0x%04x) is followed by 0x%04x, not +0", o - 1,
                      b);
        EXPECT(fp == fc, "-0 != +0 as floats");
      } else {
        EXPECT(fp < fc,
                      "not increasing: ord 0x%04x bits 0x%04x (%g) then "
                      "bits 0x%04x (%g)",
                      o, prev, (double)fp, b, (double)fc);
      }
    }
    prev = b;
    have_prev = 1;
  }
  ck_assert_uint_eq(n, 65536u - 2u * 127u); /* 254 NaN patterns */
  /* -0 just below +0. */
  ck_assert_uint_eq(dcpx_ord16(0x8000u) + 1u, dcpx_ord16(0x0000u));
  ck_assert_uint_eq(dcpx_ord16(0x0000u), 0x8000u);
  ck_assert_uint_eq(dcpx_ord16(0x8000u), 0x7FFFu);
  /* Largest negative denormal just below -0, smallest positive just above
   * +0. */
  ck_assert_uint_eq(dcpx_ord16(0x8001u) + 1u, dcpx_ord16(0x8000u));
  ck_assert_uint_eq(dcpx_ord16(0x0001u), dcpx_ord16(0x0000u) + 1u);
}
END_TEST

/* Random pairs: ord16 order agrees with the float order (with -0 < +0). */
START_TEST(test_ord16_pairs) {
  uint64_t s = g_seed ^ 0x11;
  for (int i = 0; i < 200000; i++) {
    uint32_t a = (uint32_t)dcpx_splitmix64(&s) & 0xFFFFu;
    uint32_t b = (uint32_t)dcpx_splitmix64(&s) & 0xFFFFu;
    float fa = bf16_to_float(a), fb = bf16_to_float(b);
    if (isnan(fa) || isnan(fb))
      continue;
    int want;
    if (fa != fb)
      want = fa > fb ? 1 : -1;
    else if (a == b)
      want = 0;
    else /* +0 vs -0 */
      want = (a == 0x0000u) ? 1 : -1;
    uint32_t oa = dcpx_ord16(a), ob = dcpx_ord16(b);
    int got = oa > ob ? 1 : oa < ob ? -1 : 0;
    EXPECT(got == want,
                  "seed=0x%" PRIx64 " i=%d: 0x%04x vs 0x%04x: ord says %d, "
                  "float says %d",
                  g_seed, i, a, b, got, want);
  }
}
END_TEST

/* ---- row_words (section 3) ---------------------------------------------- */

START_TEST(test_row_words) {
  for (uint32_t c = 1; c <= DCPX_MAX_TOPK; c++) {
    uint32_t need = c + (c + 31) / 32;
    uint32_t rw = dcpx_row_words(c);
    EXPECT(rw >= need, "row_words(%u) = %u < %u", c, rw, need);
    EXPECT(rw % 4 == 0, "row_words(%u) = %u not a multiple of 4", c,
                  rw);
    EXPECT(rw < need + 4, "row_words(%u) = %u not minimal (need %u)",
                  c, rw, need);
    if (c > 1)
      EXPECT(rw >= dcpx_row_words(c - 1),
                    "row_words not monotonic at %u", c);
  }
  ck_assert_uint_eq(dcpx_row_words(1), 4);
  ck_assert_uint_eq(dcpx_row_words(3), 4);
  ck_assert_uint_eq(dcpx_row_words(4), 8);
  ck_assert_uint_eq(dcpx_row_words(31), 32);
  ck_assert_uint_eq(dcpx_row_words(32), 36);
  ck_assert_uint_eq(dcpx_row_words(33), 36);
  ck_assert_uint_eq(dcpx_row_words(100), 104);
  ck_assert_uint_eq(dcpx_row_words(2048), 2112);
  ck_assert_uint_eq(dcpx_row_words(4095), 4224);
  ck_assert_uint_eq(dcpx_row_words(4096), 4224);
  ck_assert_uint_eq(dcpx_row_words(0), 0);
  ck_assert_uint_eq(dcpx_row_words(4097), 0);
  ck_assert_uint_eq(dcpx_row_words(UINT32_MAX), 0);
}
END_TEST

/* ---- word encode/decode (section 3) ------------------------------------- */

START_TEST(test_word_roundtrip) {
  uint64_t s = g_seed ^ 0x22;
  static uint32_t words[4224 + 8], ords[4096], ls[4096];
  uint32_t caps[64];
  int ncap = 0;
  const uint32_t fixed[] = {1, 2, 31, 32, 33, 63, 64, 65, 100, 4095, 4096};
  for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
    caps[ncap++] = fixed[i];
  while (ncap < 64)
    caps[ncap++] = 1 + dcpx_rnd_below(&s, DCPX_MAX_TOPK);

  for (int ci = 0; ci < ncap; ci++) {
    uint32_t c = caps[ci], rw = dcpx_row_words(c);
    /* Guard words after the list must stay untouched. */
    for (uint32_t i = 0; i < rw + 8; i++)
      words[i] = i < rw ? 0 : 0xDEADBEEFu;
    for (uint32_t j = 0; j < c; j++) {
      ords[j] = 1 + dcpx_rnd_below(&s, 0xFFFF);
      switch (dcpx_rnd_below(&s, 4)) {
      case 0:
        ls[j] = dcpx_rnd_below(&s, 1u << 16); /* plane bit 0 */
        break;
      case 1:
        ls[j] = (1u << 16) + dcpx_rnd_below(&s, 1u << 16); /* plane bit 1 */
        break;
      case 2:
        ls[j] = (j & 1) ? (1u << 17) - 1 : 0xFFFFu;
        break;
      default:
        ls[j] = dcpx_rnd_below(&s, 1u << 17);
      }
      int rc = dcpx_word_encode(words, c, j, ords[j], ls[j]);
      EXPECT(rc == 0, "encode(c=%u, j=%u, 0x%x, %u) = %d", c, j, ords[j],
             ls[j], rc);
    }
    for (uint32_t j = 0; j < c; j++) {
      EXPECT(words[j] == ((ords[j] << 16) | (ls[j] & 0xFFFFu)),
                    "seed=0x%" PRIx64 " c=%u j=%u: word 0x%08x, want 0x%08x",
                    g_seed, c, j, words[j], (ords[j] << 16) | (ls[j] & 0xFFFFu));
      uint32_t bit = (words[c + j / 32] >> (j % 32)) & 1u;
      EXPECT(bit == (ls[j] >> 16),
                    "seed=0x%" PRIx64 " c=%u j=%u l=%u: plane bit %u", g_seed,
                    c, j, ls[j], bit);
      uint32_t o = 0, l = 0;
      int rc = dcpx_word_decode(words, c, j, &o, &l);
      EXPECT(rc == 1, "decode(c=%u, j=%u) = %d", c, j, rc);
      EXPECT(o == ords[j] && l == ls[j],
                    "seed=0x%" PRIx64 " c=%u j=%u: decoded (0x%x, %u), want "
                    "(0x%x, %u)",
                    g_seed, c, j, o, l, ords[j], ls[j]);
    }
    for (uint32_t i = c + (c + 31) / 32; i < rw; i++)
      EXPECT(words[i] == 0, "c=%u: padding word %u = 0x%x", c, i,
                    words[i]);
    for (uint32_t i = rw; i < rw + 8; i++)
      EXPECT(words[i] == 0xDEADBEEFu, "c=%u: wrote past row_words", c);

    /* Re-encoding an entry with bit 16 clear clears the plane bit and
     * leaves the neighbours alone. */
    uint32_t j = dcpx_rnd_below(&s, c);
    ck_assert_int_eq(dcpx_word_encode(words, c, j, 0x1234, (1u << 16) | 7),
                     0);
    ck_assert_int_eq(dcpx_word_encode(words, c, j, 0x4321, 9), 0);
    uint32_t o = 0, l = 0;
    ck_assert_int_eq(dcpx_word_decode(words, c, j, &o, &l), 1);
    ck_assert_uint_eq(o, 0x4321);
    ck_assert_uint_eq(l, 9);
    for (uint32_t k = 0; k < c; k++) {
      if (k == j)
        continue;
      int rc = dcpx_word_decode(words, c, k, &o, &l);
      EXPECT(rc == 1, "decode(c=%u, k=%u) = %d", c, k, rc);
      EXPECT(o == ords[k] && l == ls[k],
                    "c=%u: re-encoding j=%u changed entry %u", c, j, k);
    }
  }
}
END_TEST

START_TEST(test_word_decode_empty) {
  uint32_t words[36];
  memset(words, 0, sizeof(words));
  /* An empty word, even with its plane bit set, is empty; the outputs are
   * not written. */
  words[32] = 0xFFFFFFFFu;
  for (uint32_t j = 0; j < 32; j++) {
    uint32_t o = 0xAAAA, l = 0xBBBB;
    ck_assert_int_eq(dcpx_word_decode(words, 32, j, &o, &l), 0);
    ck_assert_uint_eq(o, 0xAAAA);
    ck_assert_uint_eq(l, 0xBBBB);
  }
  /* NULL outputs are allowed. */
  ck_assert_int_eq(dcpx_word_encode(words, 32, 5, 0x8000, 70000), 0);
  ck_assert_int_eq(dcpx_word_decode(words, 32, 5, NULL, NULL), 1);
  uint32_t l = 0;
  ck_assert_int_eq(dcpx_word_decode(words, 32, 5, NULL, &l), 1);
  ck_assert_uint_eq(l, 70000);
  /* The smallest legal entry: ord 1, l 0. */
  ck_assert_int_eq(dcpx_word_encode(words, 32, 6, 1, 0), 0);
  ck_assert_uint_eq(words[6], 0x00010000u);
}
END_TEST

START_TEST(test_word_bad_args) {
  uint32_t words[4224];
  uint32_t o = 0x5555, l = 0x6666;
  memset(words, 0, sizeof(words));
  ck_assert_int_eq(dcpx_word_encode(NULL, 8, 0, 1, 0), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_encode(words, 8, 8, 1, 0), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_encode(words, 8, UINT32_MAX, 1, 0),
                   DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_encode(words, 0, 0, 1, 0), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_encode(words, 4097, 0, 1, 0), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_encode(words, 8, 0, 0, 0), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_encode(words, 8, 0, 0x10000, 0), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_encode(words, 8, 0, 1, 1u << 17), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_encode(words, 8, 0, 1, UINT32_MAX),
                   DCPX_E_INVAL);
  for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
    EXPECT(words[i] == 0, "a failed encode wrote word %zu", i);
  ck_assert_int_eq(dcpx_word_encode(words, 8, 7, 0xFFFF, (1u << 17) - 1), 0);
  ck_assert_int_eq(dcpx_word_encode(words, 4096, 4095, 1, 0), 0);

  ck_assert_int_eq(dcpx_word_decode(NULL, 8, 0, &o, &l), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_decode(words, 8, 8, &o, &l), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_decode(words, 0, 0, &o, &l), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_word_decode(words, 4097, 0, &o, &l), DCPX_E_INVAL);
  ck_assert_uint_eq(o, 0x5555);
  ck_assert_uint_eq(l, 0x6666);
}
END_TEST

/* ---- epochs (section 4) ------------------------------------------------- */

/* What we found: next() never yields 0 from any epoch a rank can hold
 * (0 and 1..0xFFFFFFFE), and its parity flips on every step, the wrap
 * included: 0xFFFFFFFE (even) -> 1 (odd) skips both 0xFFFFFFFF and 0, an
 * even number of values. 0xFFFFFFFF is no epoch (a damaged word): it
 * steps to 1 as well; it stepped to 0, the epoch of a slot never written,
 * which a rank would then store and wait for. */
START_TEST(test_epoch_next) {
  ck_assert_uint_eq(dcpx_epoch_next(0), 1);
  ck_assert_uint_eq(dcpx_epoch_next(1), 2);
  ck_assert_uint_eq(dcpx_epoch_next(0x7FFFFFFFu), 0x80000000u);
  ck_assert_uint_eq(dcpx_epoch_next(0xFFFFFFFDu), 0xFFFFFFFEu);
  ck_assert_uint_eq(dcpx_epoch_next(0xFFFFFFFEu), 1);
  ck_assert_uint_eq(dcpx_epoch_next(0xFFFFFFFFu), 1);

  /* Walk across the wrap. */
  uint32_t e = 0xFFFFFF00u;
  int wraps = 0;
  for (int i = 0; i < 1000; i++) {
    uint32_t n = dcpx_epoch_next(e);
    EXPECT(n != 0, "next(0x%08x) = 0", e);
    EXPECT(n != 0xFFFFFFFFu, "next(0x%08x) = 0xFFFFFFFF", e);
    EXPECT((n & 1u) != (e & 1u), "parity kept: 0x%08x -> 0x%08x", e, n);
    EXPECT(n == (e >= 0xFFFFFFFEu ? 1u : e + 1u),
                  "next(0x%08x) = 0x%08x, not DESIGN's formula", e, n);
    if (n < e)
      wraps++;
    e = n;
  }
  ck_assert_int_eq(wraps, 1);

  /* Random epochs in the reachable range. */
  uint64_t s = g_seed ^ 0x33;
  for (int i = 0; i < 100000; i++) {
    uint32_t x = 1 + dcpx_rnd_below(&s, 0xFFFFFFFEu); /* 1..0xFFFFFFFE */
    uint32_t n = dcpx_epoch_next(x);
    EXPECT(n != 0 && (n & 1u) != (x & 1u),
                  "seed=0x%" PRIx64 ": next(0x%08x) = 0x%08x", g_seed, x, n);
  }
}
END_TEST

/* The tag of the epoch word (docs/PROTOCOL.md 4.3): fixed points, then
 * the protocol simulated on two ranks over random calls of random rows
 * (both halves started near their wraps, rows that sit calls out). What
 * must hold: the ranks agree on every row's tag; a tag is never 0 or
 * 0xFFFFFFFF; its parity flips on every use of the row; the slot a push
 * is about to overwrite never already holds the tag awaited (a stale
 * list is never taken); and once the ranks disagree on one call's rows,
 * no list the lagging rank pushes in its next calls carries a tag that
 * the other rank awaits for a row the lagging one left out (a wrong
 * pairing is a wait that times out, never a result). Calls of 0 rows
 * among them, and as the lagging rank's call: a merge of 0 rows passes
 * every row (it advanced nothing, and its next call took the peer's
 * lists of the call it made with 0 rows, silently). */

/* One call of `rows` rows on epoch words w[0..R): the rows held step to
 * their tags, the others take the call's call half. */
static void sim_call(uint32_t *w, uint32_t R, uint32_t rows) {
  const uint32_t e = dcpx_epoch_tag(w[0]); /* row 0's tag in this call */
  for (uint32_t t = 0; t < rows; t++)
    w[t] = dcpx_epoch_tag(w[t]);
  for (uint32_t t = rows; t < R; t++)
    w[t] = dcpx_epoch_pass(w[t], e);
}

START_TEST(test_epoch_tag) {
  ck_assert_uint_eq(dcpx_epoch_tag(0), 0x00010001u);
  ck_assert_uint_eq(dcpx_epoch_tag(0x00010001u), 0x00020002u);
  ck_assert_uint_eq(dcpx_epoch_tag(0xFFFFFFFEu), 0x00000001u);
  ck_assert_uint_eq(dcpx_epoch_tag(0xFFFFFFFFu), 0x00000001u);
  ck_assert_uint_eq(dcpx_epoch_tag(0x1234FFFDu), 0x1235FFFEu);
  ck_assert_uint_eq(dcpx_epoch_pass(0xFFFF0007u, 0x00000009u), 0x00000007u);
  ck_assert_uint_eq(dcpx_epoch_pass(0x00020003u, 0x00030001u), 0x00030003u);
  ck_assert_uint_eq(DCPX_EPOCH_ROW_MAX, 0xFFFEu);

  enum { R = 6, CALLS = 3000 };
  uint64_t s = g_seed ^ 0x7A6;
  for (int run = 0; run < 40; run++) {
    uint32_t w[2][R], slot[2][R], last[R];
    const uint32_t hi = 0xFFF0u + (uint32_t)dcpx_rnd_below(&s, 16);
    for (uint32_t t = 0; t < R; t++) {
      const uint32_t lo =
          run % 4 == 0 ? 0 : 0xFFF0u + (uint32_t)dcpx_rnd_below(&s, 16);
      w[0][t] = w[1][t] = (hi << 16) | lo;
      slot[0][t] = slot[1][t] = 0;
      last[t] = 0;
    }
    for (int c = 0; c < CALLS; c++) {
      const uint32_t rows = (uint32_t)dcpx_rnd_below(&s, R + 1); /* 0..R */
      for (uint32_t t = 0; t < rows; t++) {
        const uint32_t e = dcpx_epoch_tag(w[0][t]);
        EXPECT(e == dcpx_epoch_tag(w[1][t]), "run %d call %d row %u: the "
               "ranks' tags differ", run, c, t);
        EXPECT(e != 0 && e != 0xFFFFFFFFu, "run %d: tag 0x%08x", run, e);
        EXPECT(!last[t] || (e & 1u) != (last[t] & 1u),
               "run %d row %u: parity kept 0x%08x -> 0x%08x", run, t,
               last[t], e);
        EXPECT(slot[e & 1u][t] != e, "run %d call %d row %u: the slot "
               "already holds tag 0x%08x", run, c, t, e);
        slot[e & 1u][t] = e;
        last[t] = e;
      }
      sim_call(w[0], R, rows);
      sim_call(w[1], R, rows);
      for (uint32_t t = 0; t < rows; t++)
        EXPECT(w[0][t] == slot[w[0][t] & 1u][t], "run %d call %d row %u: "
               "the model's word 0x%08x", run, c, t, w[0][t]);
    }
    /* Now rank 0 calls with `more` rows and rank 1 with `less` (0 in a
     * third of the runs): rank 0 awaits rank 1's rows less..more-1 with
     * these tags. */
    const uint32_t less =
        run % 3 == 0 ? 0 : 1 + (uint32_t)dcpx_rnd_below(&s, R - 1);
    const uint32_t more = less + 1 + (uint32_t)dcpx_rnd_below(&s, R - less);
    uint32_t awaited[R];
    for (uint32_t t = 0; t < more; t++)
      awaited[t] = dcpx_epoch_tag(w[0][t]);
    sim_call(w[1], R, less);
    for (int c = 0; c < 200; c++) { /* rank 1 goes on alone */
      const uint32_t rows = (uint32_t)dcpx_rnd_below(&s, R + 1);
      for (uint32_t t = 0; t < rows; t++) {
        const uint32_t e = dcpx_epoch_tag(w[1][t]);
        EXPECT(t < less || t >= more || e != awaited[t],
               "run %d: rank 1's call %d pushes row %u with 0x%08x, the "
               "tag rank 0 awaits", run, c, t, e);
      }
      sim_call(w[1], R, rows);
    }
  }
}
END_TEST

/* ---- global ids (section 2) --------------------------------------------- */

/* dcpx_gid's value, or a code: the tests' one-expression form. */
static int64_t gid_of(uint32_t l, uint32_t r, uint32_t world,
                      uint32_t interleave) {
  int64_t g = -12345;
  int rc = dcpx_gid(l, r, world, interleave, &g);
  ck_assert_msg(rc == 0 || g == -12345, "gid written on failure");
  return rc < 0 ? rc : g;
}

START_TEST(test_gid) {
  ck_assert_int_eq(gid_of(0, 0, 1, 1), 0);
  ck_assert_int_eq(gid_of(5, 0, 1, 1), 5);
  ck_assert_int_eq(gid_of(5, 1, 2, 1), 11);
  /* W=4, I=64: l=70 is block 1 (offset 6) of rank 1: 1*256 + 64 + 6. */
  ck_assert_int_eq(gid_of(70, 1, 4, 64), 326);
  /* W=2, I=3: rank 0 holds 0,1,2,6,7,8,..., rank 1 3,4,5,9,... */
  const int64_t r0[] = {0, 1, 2, 6, 7, 8, 12}, r1[] = {3, 4, 5, 9, 10, 11, 15};
  for (uint32_t l = 0; l < 7; l++) {
    ck_assert_int_eq(gid_of(l, 0, 2, 3), r0[l]);
    ck_assert_int_eq(gid_of(l, 1, 2, 3), r1[l]);
  }
  ck_assert_int_eq(gid_of((1u << 17) - 1, 15, 16, 1),
                   ((int64_t)(1 << 17) - 1) * 16 + 15);

  ck_assert_int_eq(gid_of(0, 0, 0, 1), DCPX_E_INVAL);
  ck_assert_int_eq(gid_of(0, 0, 1, 0), DCPX_E_INVAL);
  ck_assert_int_eq(gid_of(0, 2, 2, 1), DCPX_E_INVAL);
  ck_assert_int_eq(gid_of(0, 16, 16, 1), DCPX_E_INVAL);
  ck_assert_int_eq(dcpx_gid(0, 0, 1, 1, NULL), DCPX_E_INVAL);
  /* A world beyond the limit: no group has it, and l * world of 32-bit
   * values overflowed the int64 (UB, and a negative gid). */
  ck_assert_int_eq(gid_of(0xFFFFFFFFu, 0, 0xFFFFFFFFu, 1), DCPX_E_LIMIT);
  ck_assert_int_eq(gid_of(0xFFFFFFFFu, 0xFFFFFFFEu, 0xFFFFFFFFu, 0xFFFFFFFFu),
                   DCPX_E_LIMIT);
  ck_assert_int_eq(gid_of(0, 0, DCPX_MAX_WORLD + 1, 1), DCPX_E_LIMIT);
  /* The largest values within it fit. */
  ck_assert_int_eq(gid_of(0xFFFFFFFFu, 15, 16, 0xFFFFFFFFu),
                   (int64_t)0xFFFFFFFFu * 16 + (int64_t)15 * 0xFFFFFFFFu);

  /* Formula on random inputs, and a bijection of {r} x [0, M) onto
   * [0, W*M) when I divides M. */
  uint64_t s = g_seed ^ 0x44;
  const uint32_t ils[] = {1, 2, 3, 64};
  static uint8_t hit[16 * 64 * 40];
  for (int rep = 0; rep < 200; rep++) {
    uint32_t W = 1 + dcpx_rnd_below(&s, 16), I = ils[dcpx_rnd_below(&s, 4)];
    uint32_t M = I * (1 + dcpx_rnd_below(&s, 40 * 64 / I));
    if (M > 64 * 40)
      M = 64 * 40 / I * I;
    memset(hit, 0, (size_t)W * M);
    for (uint32_t r = 0; r < W; r++)
      for (uint32_t l = 0; l < M; l++) {
        int64_t g = gid_of(l, r, W, I);
        int64_t want = (int64_t)(l / I) * I * W + (int64_t)r * I + l % I;
        EXPECT(g == want,
                      "seed=0x%" PRIx64 " gid(l=%u, r=%u, W=%u, I=%u) = "
                      "%" PRId64 ", want %" PRId64,
                      g_seed, l, r, W, I, g, want);
        EXPECT(g >= 0 && g < (int64_t)W * M && !hit[g],
                      "gid not a bijection: W=%u I=%u M=%u g=%" PRId64, W, I,
                      M, g);
        hit[g] = 1;
      }
  }
}
END_TEST

/* ---- shape limits (section 1) ------------------------------------------- */

static dcpx_shape good_shape(void) {
  dcpx_shape s = DCPX_SHAPE_INIT;
  s.world = 8;
  s.rows = 64;
  s.topk = 2048;
  s.local_topk = 512;
  s.block_size = 64;
  s.interleave = 1;
  s.max_local = 1u << 17;
  return s;
}

START_TEST(test_shape_check) {
  dcpx_shape s = DCPX_SHAPE_INIT;
  ck_assert_int_eq(dcpx_shape_check(&s), 0); /* the default is valid */
  ck_assert_uint_eq(s.size, sizeof(dcpx_shape));

  s = good_shape();
  ck_assert_int_eq(dcpx_shape_check(&s), 0);
  ck_assert_int_eq(dcpx_shape_check(NULL), DCPX_E_INVAL);

  s = good_shape();
  s.size = sizeof(dcpx_shape) - 4;
  ck_assert_int_eq(dcpx_shape_check(&s), DCPX_E_INVAL);
  s.size = 0;
  ck_assert_int_eq(dcpx_shape_check(&s), DCPX_E_INVAL);
  s.size = sizeof(dcpx_shape) + 64; /* from a newer dcpx.h: refused too */
  ck_assert_int_eq(dcpx_shape_check(&s), DCPX_E_INVAL);

  /* World. */
  const uint32_t worlds[] = {0, 1, 16, 17, 1000};
  const int wcode[] = {DCPX_E_INVAL, 0, 0, DCPX_E_LIMIT, DCPX_E_LIMIT};
  for (int i = 0; i < 5; i++) {
    s = good_shape();
    s.world = worlds[i];
    EXPECT(dcpx_shape_check(&s) == wcode[i], "world %u: %d, want %d",
                  worlds[i], dcpx_shape_check(&s), wcode[i]);
  }
  /* N >= K. */
  s = good_shape();
  s.local_topk = s.topk;
  ck_assert_int_eq(dcpx_shape_check(&s), DCPX_E_INVAL);
  s.local_topk = s.topk + 1;
  ck_assert_int_eq(dcpx_shape_check(&s), DCPX_E_INVAL);
  s.local_topk = s.topk - 1;
  ck_assert_int_eq(dcpx_shape_check(&s), 0);
  s.topk = 2;
  s.local_topk = 1;
  ck_assert_int_eq(dcpx_shape_check(&s), 0);
  s.topk = 1;
  s.local_topk = 1;
  ck_assert_int_eq(dcpx_shape_check(&s), DCPX_E_INVAL);
  /* dcpx_shape_explain: the same code, and a reason naming the field. */
  {
    char why[200] = "x";
    ck_assert_int_eq(dcpx_shape_explain(&s, why, sizeof(why)), DCPX_E_INVAL);
    ck_assert_msg(strstr(why, "local_topk 1 must be less than topk 1"), "%s",
                  why);
    /* topk 1 with local_topk 0 ("the library chooses", which has no N
     * below 1): the reason names topk, not a zero local_topk. */
    s.local_topk = 0;
    ck_assert_int_eq(dcpx_shape_explain(&s, why, sizeof(why)), DCPX_E_INVAL);
    ck_assert_msg(strstr(why, "topk must be >= 2") &&
                      !strstr(why, "every shape field"),
                  "%s", why);
    s = good_shape();
    s.world = 17;
    ck_assert_int_eq(dcpx_shape_explain(&s, why, sizeof(why)), DCPX_E_LIMIT);
    ck_assert_msg(strstr(why, "world 17 exceeds the limit of 16"), "%s", why);
    s = good_shape();
    ck_assert_int_eq(dcpx_shape_explain(&s, why, sizeof(why)), 0);
    ck_assert_str_eq(why, "");
    ck_assert_int_eq(dcpx_shape_explain(NULL, why, sizeof(why)),
                     DCPX_E_INVAL);
    ck_assert_ptr_nonnull(strstr(why, "missing"));
    ck_assert_int_eq(dcpx_shape_explain(&s, NULL, 0), 0); /* no buffer */
    char tiny[8];
    s.local_topk = s.topk;
    ck_assert_int_eq(dcpx_shape_explain(&s, tiny, sizeof(tiny)),
                     DCPX_E_INVAL);
    ck_assert_uint_eq(strlen(tiny), sizeof(tiny) - 1); /* cut, terminated */
    s = good_shape();
  }
  /* K. */
  s = good_shape();
  s.topk = 4096;
  s.local_topk = 4095;
  ck_assert_int_eq(dcpx_shape_check(&s), 0);
  s.topk = 4097;
  s.local_topk = 100;
  ck_assert_int_eq(dcpx_shape_check(&s), DCPX_E_LIMIT);
  /* max_local. */
  s = good_shape();
  s.max_local = (1u << 17) + 1;
  ck_assert_int_eq(dcpx_shape_check(&s), DCPX_E_LIMIT);
  s.max_local = 1u << 17;
  ck_assert_int_eq(dcpx_shape_check(&s), 0);
  s.max_local = 1;
  ck_assert_int_eq(dcpx_shape_check(&s), 0);
  /* rows. */
  s = good_shape();
  s.rows = DCPX_MAX_ROWS;
  ck_assert_int_eq(dcpx_shape_check(&s), 0);
  s.rows = DCPX_MAX_ROWS + 1;
  ck_assert_int_eq(dcpx_shape_check(&s), DCPX_E_LIMIT);
  /* The extremes together: W=16, I large, max_local 2^17. */
  s = good_shape();
  s.world = 16;
  s.interleave = 1u << 17;
  ck_assert_int_eq(dcpx_shape_check(&s), 0);
  /* Zero fields (local_topk 0 is the library's choice: below). */
  for (int f = 0; f < 7; f++) {
    s = good_shape();
    uint32_t *fld[] = {&s.world,      &s.rows,       &s.topk,     &s.local_topk,
                       &s.block_size, &s.interleave, &s.max_local};
    if (fld[f] == &s.local_topk)
      continue;
    *fld[f] = 0;
    EXPECT(dcpx_shape_check(&s) == DCPX_E_INVAL,
                  "zero field %d: %d, want DCPX_E_INVAL", f,
                  dcpx_shape_check(&s));
  }
  /* local_topk 0: checked, explained and warned about as the shape with
   * dcpx_shape_auto_local_topk's N, the one dcpx_join uses (the shape of
   * dcpx(3)'s example was refused as "a zero field"). */
  for (uint32_t w = 1; w <= DCPX_MAX_WORLD + 1; w++)
    for (uint32_t k = 1; k <= DCPX_MAX_TOPK + 1; k = k * 3 + 1) {
      dcpx_shape z = good_shape(), n;
      char wz[200], wn[200];
      z.world = w;
      z.topk = k;
      z.local_topk = 0;
      n = z;
      n.local_topk = dcpx_shape_auto_local_topk(w, k);
      if (!n.local_topk && (w > DCPX_MAX_WORLD || k > DCPX_MAX_TOPK))
        n.local_topk = 1; /* any N: the limit is what is refused */
      const int rz = dcpx_shape_explain(&z, wz, sizeof(wz));
      const int rn = dcpx_shape_explain(&n, wn, sizeof(wn));
      EXPECT(rz == rn && !strcmp(wz, wn) && dcpx_shape_check(&z) == rn &&
                 dcpx_shape_warning(&z) == dcpx_shape_warning(&n),
             "W %u K %u: %d '%s' against N %u: %d '%s'", w, k, rz, wz,
             n.local_topk, rn, wn);
      if (w >= 1 && w <= DCPX_MAX_WORLD && k >= 2 && k <= DCPX_MAX_TOPK)
        EXPECT(rz == 0, "W %u K %u: %d '%s'", w, k, rz, wz);
    }
  /* The warning's advice is one the caller can take: N = 0 (the library's
   * choice) never draws "0 for the library's choice" again; where no N
   * below K avoids it (W = 2, K = 2), it says so. */
  for (uint32_t w = 2; w <= DCPX_MAX_WORLD; w++)
    for (uint32_t k = 2; k <= DCPX_MAX_TOPK; k++) {
      dcpx_shape z = good_shape();
      z.world = w;
      z.topk = k;
      z.local_topk = 0;
      const char *why = dcpx_shape_warning(&z);
      EXPECT(!why || !strstr(why, "library's choice"),
             "W %u K %u: the library's own N draws '%s'", w, k, why);
      EXPECT(!why || (w == 2 && k == 2), "W %u K %u: auto N warns '%s'", w,
             k, why);
    }
  {
    dcpx_shape z = good_shape();
    z.world = 2;
    z.topk = 2;
    z.local_topk = 1;
    const char *why = dcpx_shape_warning(&z);
    EXPECT(why && strstr(why, "no local_topk below topk avoids it"),
           "W 2 K 2: '%s'", why ? why : "(none)");
  }
}
END_TEST

/* ---- errors ------------------------------------------------------------- */

START_TEST(test_strerror) {
  /* The codes are wire values (docs/PROTOCOL.md 10.5), written out here by
   * hand, not taken from DCPX_ERROR_TABLE: a renumbered or dropped code
   * fails. The errno-valued ones must be the platform's errno values. */
  static const struct {
    const char *name;
    int value, code, errno_value;
  } want[] = {
      {"DCPX_OK", 0, DCPX_OK, 0},
      {"DCPX_E_PERM", -1, DCPX_E_PERM, EPERM},
      {"DCPX_E_NOENT", -2, DCPX_E_NOENT, ENOENT},
      {"DCPX_E_INTR", -4, DCPX_E_INTR, EINTR},
      {"DCPX_E_IO", -5, DCPX_E_IO, EIO},
      {"DCPX_E_AGAIN", -11, DCPX_E_AGAIN, EAGAIN},
      {"DCPX_E_NOMEM", -12, DCPX_E_NOMEM, ENOMEM},
      {"DCPX_E_ACCES", -13, DCPX_E_ACCES, EACCES},
      {"DCPX_E_BUSY", -16, DCPX_E_BUSY, EBUSY},
      {"DCPX_E_EXIST", -17, DCPX_E_EXIST, EEXIST},
      {"DCPX_E_INVAL", -22, DCPX_E_INVAL, EINVAL},
      {"DCPX_E_RANGE", -34, DCPX_E_RANGE, ERANGE},
      {"DCPX_E_NOSYS", -38, DCPX_E_NOSYS, ENOSYS},
      {"DCPX_E_PROTO", -71, DCPX_E_PROTO, EPROTO},
      {"DCPX_E_MSGSIZE", -90, DCPX_E_MSGSIZE, EMSGSIZE},
      {"DCPX_E_CONNRESET", -104, DCPX_E_CONNRESET, ECONNRESET},
      {"DCPX_E_NOTCONN", -107, DCPX_E_NOTCONN, ENOTCONN},
      {"DCPX_E_TIMEDOUT", -110, DCPX_E_TIMEDOUT, ETIMEDOUT},
      {"DCPX_E_CONNREFUSED", -111, DCPX_E_CONNREFUSED, ECONNREFUSED},
      {"DCPX_E_SHAPE", -1001, DCPX_E_SHAPE, 0},
      {"DCPX_E_DUPRANK", -1002, DCPX_E_DUPRANK, 0},
      {"DCPX_E_BADRANK", -1003, DCPX_E_BADRANK, 0},
      {"DCPX_E_LIMIT", -1004, DCPX_E_LIMIT, 0},
      {"DCPX_E_VERSION", -1005, DCPX_E_VERSION, 0},
      {"DCPX_E_ABORTED", -1006, DCPX_E_ABORTED, 0},
      {"DCPX_E_FAILED", -1007, DCPX_E_FAILED, 0},
      {"DCPX_E_TRANSPORT", -1008, DCPX_E_TRANSPORT, 0},
      {"DCPX_E_CUDA", -1009, DCPX_E_CUDA, 0},
      {"DCPX_E_NCCL", -1010, DCPX_E_NCCL, 0},
      {"DCPX_E_STATE", -1011, DCPX_E_STATE, 0},
      {"DCPX_E_RECOVER", -1012, DCPX_E_RECOVER, 0},
      {"DCPX_E_FDS", -1013, DCPX_E_FDS, 0},
      {"DCPX_E_TEXT", -1014, DCPX_E_TEXT, 0},
  };
  const size_t n = sizeof(want) / sizeof(want[0]);
  /* Every code of the header's table is one of these, under its name. */
  static const struct {
    const char *name;
    int value;
  } tab[] = {
#define ROW(name, value, msg) {#name, value},
      DCPX_ERROR_TABLE(ROW)
#undef ROW
  };
  ck_assert_uint_eq(sizeof(tab) / sizeof(tab[0]), n);
  for (size_t i = 0; i < n; i++) {
    EXPECT(strcmp(tab[i].name, want[i].name) == 0 &&
               tab[i].value == want[i].value,
           "table row %zu is %s = %d, want %s = %d", i, tab[i].name,
           tab[i].value, want[i].name, want[i].value);
    EXPECT(want[i].code == want[i].value, "%s = %d, want %d", want[i].name,
           want[i].code, want[i].value);
    if (want[i].errno_value)
      EXPECT(want[i].value == -want[i].errno_value, "%s = %d, but -errno %d",
             want[i].name, want[i].value, -want[i].errno_value);
    /* Each has a text of its own: not empty, not the generic one, not
     * another code's. */
    const char *m = dcpx_strerror(want[i].value);
    EXPECT(m != NULL && *m && strcmp(m, "unknown dcpx error") != 0,
           "%s: no text of its own", want[i].name);
    for (size_t j = 0; m && j < i; j++)
      EXPECT(strcmp(m, dcpx_strerror(want[j].value)) != 0,
             "%s and %s share the text \"%s\"", want[i].name, want[j].name,
             m);
  }
  ck_assert_str_eq(dcpx_strerror(DCPX_E_SHAPE),
                   "group shape does not match the group's");
  ck_assert_str_eq(dcpx_strerror(0), "success");
  /* Unknown codes: the generic text. */
  const int unknown[] = {1, 42, 12345, -4096, -100000, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
    const char *m = dcpx_strerror(unknown[i]);
    EXPECT(m != NULL && strcmp(m, "unknown dcpx error") == 0,
           "strerror(%d) = \"%s\"", unknown[i], m ? m : "(null)");
  }
  /* A negative errno outside the table gets its errno text. */
  const char *m = dcpx_strerror(-EXDEV);
  ck_assert_ptr_nonnull(m);
  ck_assert_str_eq(m, strerror(EXDEV));
  /* Codes in dcpx's own range but not in the table: the generic text
   * (not an errno text: no errno is that large). */
  for (int c = -1015; c > -1100; c--) {
    m = dcpx_strerror(c);
    EXPECT(m != NULL && strcmp(m, "unknown dcpx error") == 0,
           "strerror(%d) = \"%s\"", c, m ? m : "(null)");
  }
  /* The version: the string, its parts and the number agree. */
  unsigned maj, min, pat;
  char extra;
  ck_assert_int_eq(sscanf(dcpx_version(), "%u.%u.%u%c", &maj, &min, &pat,
                          &extra),
                   3);
  ck_assert_uint_eq(maj, DCPX_VERSION_MAJOR);
  ck_assert_uint_eq(min, DCPX_VERSION_MINOR);
  ck_assert_uint_eq(pat, DCPX_VERSION_PATCH);
  ck_assert_uint_eq(DCPX_VERSION_NUMBER, (maj << 16) | (min << 8) | pat);
}
END_TEST

/* ---- main --------------------------------------------------------------- */

static Suite *wire_suite(void) {
  Suite *s = suite_create("wire");
  TCase *tc;

  tc = t_tcase(s, "order", 30);
  tcase_add_test(tc, test_ord16_bijection_and_nan);
  tcase_add_test(tc, test_ord16_monotonic);
  tcase_add_test(tc, test_ord16_pairs);

  tc = t_tcase(s, "words", 30);
  tcase_add_test(tc, test_row_words);
  tcase_add_test(tc, test_word_roundtrip);
  tcase_add_test(tc, test_word_decode_empty);
  tcase_add_test(tc, test_word_bad_args);

  tc = t_tcase(s, "misc", 30);
  tcase_add_test(tc, test_epoch_next);
  tcase_add_test(tc, test_epoch_tag);
  tcase_add_test(tc, test_gid);
  tcase_add_test(tc, test_shape_check);
  tcase_add_test(tc, test_strerror);
  return s;
}

int main(void) {
  const char *e = getenv("DCPX_TEST_SEED");
  if (e && *e)
    g_seed = strtoull(e, NULL, 0);
  printf("check_wire: seed 0x%" PRIx64 " (set DCPX_TEST_SEED to change)\n",
         g_seed);
  fflush(stdout);
  /* CK_VERBOSITY=verbose lists every test */
  return t_suite_run_mode(wire_suite(), CK_ENV);
}
