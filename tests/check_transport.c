/* check_transport.c - unit tests of the transport rule
 * (common/transport.c), of the NCCL transport's buffer layout
 * (common/layout.h, dcpx_nccl_layout_compute), of the rank a wait
 * record's index names (dcpx_ll_index_source, dcpx_rescue_index_source),
 * and of the rules for a call's arrays (common/devptr.c), against a
 * made-up address space.
 *
 * The expected sizes are worked out here from the layout's documented
 * formula (region sizes, 256-byte alignment), not by calling the code under
 * test twice.
 */
#include <check.h>
#include <stdint.h>
#include <string.h>

#include "check_main.h"
#include "dcpx.h"
#include "devptr.h"
#include "layout.h"
#include "transport.h"

static uint64_t up256(uint64_t x) { return (x + 255u) / 256u * 256u; }

START_TEST(test_explicit_wins) {
  const int32_t dev[3] = {0, 1, 2};
  const uint8_t none[9] = {0};
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_LL, 3, dev, none),
                   DCPX_TRANSPORT_LL);
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_NCCL, 3, dev, NULL),
                   DCPX_TRANSPORT_NCCL);
  /* nccl even when every pair could use ll */
  const int32_t same[2] = {0, 0};
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_NCCL, 2, same, NULL),
                   DCPX_TRANSPORT_NCCL);
}
END_TEST

START_TEST(test_auto_same_gpu) {
  const int32_t dev[4] = {3, 3, 3, 3};
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 4, dev, NULL),
                   DCPX_TRANSPORT_LL);
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 1, dev, NULL),
                   DCPX_TRANSPORT_LL);
}
END_TEST

START_TEST(test_auto_p2p) {
  const int32_t dev[3] = {0, 1, 2};
  uint8_t acc[9];
  memset(acc, 1, sizeof(acc));
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 3, dev, acc),
                   DCPX_TRANSPORT_LL);
  /* one direction of one pair missing: nccl */
  acc[2 * 3 + 1] = 0;
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 3, dev, acc),
                   DCPX_TRANSPORT_NCCL);
  /* the diagonal is never consulted */
  memset(acc, 1, sizeof(acc));
  acc[0] = acc[4] = acc[8] = 0;
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 3, dev, acc),
                   DCPX_TRANSPORT_LL);
}
END_TEST

/* 16-byte UUID number x (distinct for distinct x). */
static void uuid_of(uint8_t *u, uint8_t x) {
  memset(u, 0xA5, 16);
  u[0] = x;
  u[15] = (uint8_t)~x;
}

/* Each rank process sees its own GPU as device 0 (CUDA_VISIBLE_DEVICES=N
 * per process), dcpxd sees all: by the ordinals every rank is on GPU 0
 * and shares it with the others; by the UUIDs they are four GPUs, and
 * the one this process sees is the only one it has an ordinal for. */
START_TEST(test_gpu_map_uuids) {
  const int32_t dev[4] = {0, 0, 0, 0};
  uint8_t uu[4 * 16], mine[16];
  int32_t gpu[4], local[4];
  for (uint8_t r = 0; r < 4; r++)
    uuid_of(uu + 16u * r, (uint8_t)(10 + r));
  uuid_of(mine, 12); /* this process is rank 2 and sees only its GPU */
  dcpx__gpu_map(4, dev, uu, mine, 1, gpu, local);
  for (int r = 0; r < 4; r++) {
    ck_assert_int_eq(gpu[r], r);
    ck_assert_int_eq(local[r], r == 2 ? 0 : -1);
  }
  /* the ordinals alone would have put every rank on one GPU */
  dcpx__gpu_map(4, dev, NULL, mine, 1, gpu, local);
  for (int r = 0; r < 4; r++) {
    ck_assert_int_eq(gpu[r], 0);
    ck_assert_int_eq(local[r], 0);
  }
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 4, gpu, NULL),
                   DCPX_TRANSPORT_LL);
}
END_TEST

/* Two ranks per GPU under MPS, with ordinals that differ between the
 * processes of one GPU: the UUIDs pair them; this process sees all four
 * GPUs in another order. */
START_TEST(test_gpu_map_shared) {
  const int32_t dev[4] = {0, 1, 1, 0};
  uint8_t uu[4 * 16], all[4 * 16];
  int32_t gpu[4], local[4];
  uuid_of(uu + 0, 7);
  uuid_of(uu + 16, 7);
  uuid_of(uu + 32, 9);
  uuid_of(uu + 48, 9);
  for (uint8_t d = 0; d < 4; d++)
    uuid_of(all + 16u * d, (uint8_t)(6 + d)); /* 7 is device 1, 9 device 3 */
  dcpx__gpu_map(4, dev, uu, all, 4, gpu, local);
  ck_assert_int_eq(gpu[0], 0);
  ck_assert_int_eq(gpu[1], 0);
  ck_assert_int_eq(gpu[2], 2);
  ck_assert_int_eq(gpu[3], 2);
  ck_assert_int_eq(local[0], 1);
  ck_assert_int_eq(local[1], 1);
  ck_assert_int_eq(local[2], 3);
  ck_assert_int_eq(local[3], 3);
  /* without UUIDs: the ordinals, and -1 past this process's devices */
  const int32_t far[2] = {1, 5};
  dcpx__gpu_map(2, far, NULL, all, 4, gpu, local);
  ck_assert_int_eq(gpu[0], 0);
  ck_assert_int_eq(gpu[1], 1);
  ck_assert_int_eq(local[0], 1);
  ck_assert_int_eq(local[1], -1);
}
END_TEST

START_TEST(test_auto_mixed) {
  /* ranks 0, 1 share GPU 0 (no P2P needed); GPU 0 and 1 lack P2P */
  const int32_t dev[3] = {0, 0, 1};
  uint8_t acc[9] = {0};
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 3, dev, acc),
                   DCPX_TRANSPORT_NCCL);
  /* with P2P between GPU 0 and 1 (rank pairs 0-2 and 1-2): ll */
  acc[0 * 3 + 2] = acc[2 * 3 + 0] = acc[1 * 3 + 2] = acc[2 * 3 + 1] = 1;
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 3, dev, acc),
                   DCPX_TRANSPORT_LL);
  /* two ranks on one GPU each side, one cross pair without access */
  const int32_t d4[4] = {0, 0, 1, 1};
  uint8_t a4[16];
  memset(a4, 1, sizeof(a4));
  a4[1 * 4 + 3] = 0;
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 4, d4, a4),
                   DCPX_TRANSPORT_NCCL);
}
END_TEST

START_TEST(test_invalid) {
  const int32_t dev[2] = {0, 1};
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 0, dev, NULL),
                   DCPX_E_INVAL);
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 17, dev, NULL),
                   DCPX_E_INVAL);
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 2, NULL, NULL),
                   DCPX_E_INVAL);
  /* different GPUs and nothing to ask */
  ck_assert_int_eq(dcpx__transport_resolve(DCPX_TRANSPORT_AUTO, 2, dev, NULL),
                   DCPX_E_INVAL);
  ck_assert_int_eq(dcpx__transport_resolve(7, 2, dev, NULL), DCPX_E_INVAL);
  ck_assert_str_eq(dcpx__transport_name(DCPX_TRANSPORT_LL), "ll");
  ck_assert_str_eq(dcpx__transport_name(DCPX_TRANSPORT_NCCL), "nccl");
  ck_assert_str_eq(dcpx__transport_name(DCPX_TRANSPORT_AUTO), "auto");
  ck_assert_str_eq(dcpx__transport_name(9), "unknown");
  ck_assert_str_eq(dcpx__backend_name(DCPX_BACKEND_HOST), "host");
  ck_assert_str_eq(dcpx__backend_name(DCPX_BACKEND_CUDA), "cuda");
  ck_assert_str_eq(dcpx__backend_name(2), "unknown");
}
END_TEST

/* The NCCL buffer of a shape, from the documented formula. */
static void expect_nccl(uint32_t W, uint32_t R, uint32_t K, uint32_t N) {
  dcpx_layout L;
  dcpx_nccl_layout NL;
  dcpx_layout_compute(&L, W, R, K, N);
  dcpx_nccl_layout_compute(&NL, &L);
  const uint64_t rwn = dcpx_row_words(N), rwk = dcpx_row_words(K);
  const uint64_t bw = ((W * N + 31) / 32 + 3) / 4 * 4;
  uint64_t o = 0;
  ck_assert_uint_eq(NL.bits_words, bw);
  ck_assert_uint_eq(NL.off_send, o);
  o = up256(o + 4 * R * rwn);
  ck_assert_uint_eq(NL.off_recv, o);
  o = up256(o + 4ull * W * R * rwn);
  ck_assert_uint_eq(NL.off_rsend, o);
  o = up256(o + 4 * R * rwk);
  ck_assert_uint_eq(NL.off_rrecv, o);
  o = up256(o + 4ull * W * R * rwk);
  ck_assert_uint_eq(NL.off_mask, o);
  o = up256(o + 4ull * R);
  ck_assert_uint_eq(NL.off_bits, o);
  o = up256(o + 4ull * R * bw);
  ck_assert_uint_eq(NL.bytes, o);
  /* (the offsets above are each the previous region's end rounded up to
   * 256 bytes: aligned and disjoint by construction) */
  /* a row's S1 bits hold all W*N keys; the list words hold a row */
  ck_assert(32ull * NL.bits_words >= (uint64_t)W * N);
  ck_assert_uint_eq(L.rw_n, rwn);
  ck_assert_uint_eq(L.rw_k, rwk);
}

START_TEST(test_nccl_layout) {
  expect_nccl(1, 1, 2, 1);
  expect_nccl(1, 64, 2048, 512);
  expect_nccl(2, 128, 2048, 512);
  expect_nccl(8, 256, 2048, 512);
  expect_nccl(3, 17, 100, 31);
  expect_nccl(16, 4096, 4096, 4095);
  {
    /* a worked example: W=2, R=4, K=64, N=8
     * rw_n = 8 + 1 -> 12, rw_k = 64 + 2 -> 68, bw = 1 -> 4
     * send 4*4*12 = 192 -> 256; recv 2*192 = 384 -> 256+384 = 640 -> 768;
     * rsend 4*4*68 = 1088 -> 768+1088 = 1856 -> 2048; rrecv 2176 -> 4224
     * -> 4352; mask 16 -> 4608; bits 4*4*4 = 64 -> 4864. */
    dcpx_layout L;
    dcpx_nccl_layout NL;
    dcpx_layout_compute(&L, 2, 4, 64, 8);
    dcpx_nccl_layout_compute(&NL, &L);
    ck_assert_uint_eq(NL.off_recv, 256);
    ck_assert_uint_eq(NL.off_rsend, 768);
    ck_assert_uint_eq(NL.off_rrecv, 2048);
    ck_assert_uint_eq(NL.off_mask, 4352);
    ck_assert_uint_eq(NL.off_bits, 4608);
    ck_assert_uint_eq(NL.bytes, 4864);
  }
}
END_TEST

/* A wait record's index names the rank it awaited (docs/PROTOCOL.md 6.3):
 * in ll_slots always (the source); in rescue only where the slot leaves
 * one rank. Every mask of at most S saturated ranks, every holder s of a
 * slot and every waiter d but s: the rank named is s or none, and it is
 * named exactly when every such mask gives the waiter's slot one holder. */
static void expect_sources(uint32_t W, uint32_t R, uint32_t K, uint32_t N) {
  dcpx_layout L;
  uint32_t holders[16][16]; /* [d][x]: bit s, for some mask */
  dcpx_layout_compute(&L, W, R, K, N);
  memset(holders, 0, sizeof(holders));
  for (uint32_t p = 0; p < 2; p++)
    for (uint32_t s = 0; s < W; s++)
      for (uint32_t t = 0; t < R; t++) {
        const uint32_t at = (uint32_t)(dcpx_ll_offset(&L, p, s, t, 0) / 8);
        for (uint32_t h = 0; h < 2 * L.pairs; h++)
          ck_assert_uint_eq(dcpx_ll_index_source(&L, at + h), s);
      }
  for (uint32_t mask = 1; mask < 1u << W; mask++) {
    if ((uint32_t)__builtin_popcount(mask) > L.rescue_slots)
      continue;
    for (uint32_t s = 0; s < W; s++) {
      if (!((mask >> s) & 1u))
        continue;
      const uint32_t x = dcpx_rescue_slot(mask, s);
      for (uint32_t d = 0; d < W; d++) {
        if (d == s) /* its own slot never makes a rank wait */
          continue;
        holders[d][x] |= 1u << s;
        for (uint32_t t = 0; t < R; t += R - 1 ? R - 1 : 1)
          for (uint32_t h = 0; h < 2 * L.rpairs; h += 2 * L.rpairs - 1) {
            const uint32_t index =
                (uint32_t)(dcpx_rescue_offset(&L, t, x, 0) / 8) + h;
            const int32_t got = dcpx_rescue_index_source(&L, d, index);
            ck_assert_msg(got == -1 || got == (int32_t)s,
                          "W=%u mask 0x%x: rank %u's wait on slot %u named "
                          "rank %d, not %u",
                          W, mask, d, x, got, s);
          }
      }
    }
  }
  for (uint32_t d = 0; d < W; d++)
    for (uint32_t x = 0; x < L.rescue_slots; x++) {
      const int one = __builtin_popcount(holders[d][x]) == 1;
      const int32_t got = dcpx_rescue_index_source(
          &L, d, (uint32_t)(dcpx_rescue_offset(&L, R - 1, x, 1) / 8));
      ck_assert_msg(one ? got == __builtin_ctz(holders[d][x]) : got == -1,
                    "W=%u S=%u: rank %u, slot %u (holders 0x%x): %d", W,
                    L.rescue_slots, d, x, holders[d][x], got);
    }
  /* a waiter that is no rank of the group: none named */
  ck_assert_int_eq(dcpx_rescue_index_source(&L, W, 0), -1);
}

START_TEST(test_wait_sources) {
  expect_sources(1, 2, 4, 2);      /* S = 1: no peer to wait for */
  expect_sources(2, 3, 64, 16);    /* S = 2: every rescue wait named */
  expect_sources(2, 2, 16, 9);     /* S = 1 (check_health's "short") */
  expect_sources(3, 2, 64, 16);    /* S = 3 */
  expect_sources(4, 2, 100, 40);   /* S = 2 < W */
  expect_sources(5, 3, 2048, 512); /* S = 4 < W */
  expect_sources(6, 2, 64, 8);     /* S = 6 */
  {
    /* W = 2: the other rank, whichever the slot (x = 0: mask 0b01 or 0b10;
     * x = 1: 0b11, rank 1) */
    dcpx_layout L;
    dcpx_layout_compute(&L, 2, 3, 64, 16);
    const uint32_t x0 = (uint32_t)(dcpx_rescue_offset(&L, 2, 0, 3) / 8);
    const uint32_t x1 = (uint32_t)(dcpx_rescue_offset(&L, 2, 1, 3) / 8);
    ck_assert_int_eq(dcpx_rescue_index_source(&L, 0, x0), 1);
    ck_assert_int_eq(dcpx_rescue_index_source(&L, 1, x0), 0);
    ck_assert_int_eq(dcpx_rescue_index_source(&L, 0, x1 + 1), 1);
    /* W = 3, all saturated: slot 1 is rank 1; rank 2's wait names it,
     * rank 0's cannot (rank 2 could hold slot 1 under mask 0b101) */
    dcpx_layout_compute(&L, 3, 2, 64, 16);
    const uint32_t s1 = (uint32_t)(dcpx_rescue_offset(&L, 0, 1, 0) / 8);
    ck_assert_int_eq(dcpx_rescue_index_source(&L, 2, s1), 1);
    ck_assert_int_eq(dcpx_rescue_index_source(&L, 0, s1), -1);
  }
}
END_TEST

START_TEST(test_health_block) {
  /* the transport word took a pad word: the block stays 128 bytes */
  ck_assert_uint_eq(sizeof(dcpx_rank_health), 128);
}
END_TEST


/* ---- a call's arrays (devptr.c) ----------------------------------------- */

/* A made-up address space: these mappings, everything else unknown. */
typedef struct fake_map {
  uintptr_t beg, end;
  int kind, device;
} fake_map;

static const fake_map fake[] = {
    {0x10000, 0x20000, DCPX__MEM_DEVICE, 0},  /* GPU 0 */
    {0x20000, 0x30000, DCPX__MEM_DEVICE, 0},  /* GPU 0, the next mapping */
    {0x40000, 0x50000, DCPX__MEM_DEVICE, 1},  /* GPU 1 */
    {0x60000, 0x61000, DCPX__MEM_HOST, -1},   /* registered host memory */
    {0x70000, 0x71000, DCPX__MEM_MANAGED, 0}, /* managed */
    {0x80000, 0x81000, DCPX__MEM_DEVICE, 0},  /* GPU 0, range not known */
};
static int fake_fail;

static int fake_query(void *ctx, uintptr_t a, dcpx__mem_info *ret) {
  (void)ctx;
  if (fake_fail)
    return DCPX_E_CUDA;
  for (size_t i = 0; i < sizeof(fake) / sizeof(fake[0]); i++)
    if (a >= fake[i].beg && a < fake[i].end) {
      ret->kind = fake[i].kind;
      ret->device = fake[i].device;
      ret->beg = fake[i].beg;
      ret->end = fake[i].beg == 0x80000 ? fake[i].beg : fake[i].end;
      return 0;
    }
  ret->kind = DCPX__MEM_UNKNOWN;
  ret->beg = ret->end = 0;
  return 0;
}

static int ok(dcpx__ptr_check *c, uintptr_t a, uint64_t bytes, char *why) {
  why[0] = 0;
  return dcpx__ptr_ok(c, "x", (const void *)a, bytes, why, 256);
}

START_TEST(test_devptr_kinds) {
  dcpx__ptr_check c;
  char why[256];
  dcpx__ptr_check_init(&c, 0, 0, fake_query, NULL);
  /* the member's GPU, managed and registered host memory */
  ck_assert_int_eq(ok(&c, 0x10100, 0x100, why), 0);
  ck_assert_int_eq(ok(&c, 0x70000, 0x1000, why), 0);
  ck_assert_int_eq(ok(&c, 0x60010, 16, why), 0);
  /* another GPU's memory */
  ck_assert_int_eq(ok(&c, 0x40000, 4, why), DCPX_E_INVAL);
  ck_assert_ptr_nonnull(strstr(why, "GPU 1"));
  /* memory CUDA does not know */
  ck_assert_int_eq(ok(&c, 0x90000, 4, why), DCPX_E_INVAL);
  ck_assert_ptr_nonnull(strstr(why, "not memory that CUDA knows"));
  /* NULL and empty arrays are the caller's to judge: no query */
  const uint64_t q = c.queries;
  ck_assert_int_eq(ok(&c, 0, 64, why), 0);
  ck_assert_int_eq(ok(&c, 0x90000, 0, why), 0);
  ck_assert_uint_eq(c.queries, q);
  /* the driver could not be asked */
  fake_fail = 1;
  ck_assert_int_eq(ok(&c, 0x50000 - 8, 4, why), DCPX_E_CUDA);
  fake_fail = 0;
}
END_TEST

START_TEST(test_devptr_extent) {
  dcpx__ptr_check c;
  char why[256];
  dcpx__ptr_check_init(&c, 0, 0, fake_query, NULL);
  /* the whole allocation, and one byte more: past its end into unknown */
  ck_assert_int_eq(ok(&c, 0x60000, 0x1000, why), 0);
  ck_assert_int_eq(ok(&c, 0x60000, 0x1001, why), DCPX_E_INVAL);
  ck_assert_ptr_nonnull(strstr(why, "4097 bytes"));
  /* across two mappings of the member's GPU (expandable segments) */
  ck_assert_int_eq(ok(&c, 0x1F000, 0x2000, why), 0);
  /* from the member's GPU into another's: refused at the last byte */
  dcpx__ptr_check_init(&c, 1, 0, fake_query, NULL);
  ck_assert_int_eq(ok(&c, 0x40000, 0x10000, why), 0);
  ck_assert_int_eq(ok(&c, 0x40000, 0x10001, why), DCPX_E_INVAL);
  /* an extent that wraps the address space */
  ck_assert_int_eq(ok(&c, 0x40000, UINT64_MAX, why), DCPX_E_INVAL);
  ck_assert_ptr_nonnull(strstr(why, "address space"));
  /* a mapping whose range the driver did not give: each byte is asked */
  dcpx__ptr_check_init(&c, 0, 0, fake_query, NULL);
  ck_assert_int_eq(ok(&c, 0x80000, 0x1000, why), 0);
  ck_assert_uint_eq(c.queries, 2);
  ck_assert_int_eq(ok(&c, 0x80000, 0x1000, why), 0);
  ck_assert_uint_eq(c.queries, 4);
}
END_TEST

START_TEST(test_devptr_cache) {
  dcpx__ptr_check c;
  char why[256];
  dcpx__ptr_check_init(&c, 0, 0, fake_query, NULL);
  /* an engine's buffers stay put: after the first call, no query */
  ck_assert_int_eq(ok(&c, 0x10000, 0x800, why), 0);
  ck_assert_int_eq(ok(&c, 0x11000, 0x800, why), 0);
  ck_assert_uint_eq(c.queries, 1); /* one mapping holds both */
  for (int i = 0; i < 100; i++) {
    ck_assert_int_eq(ok(&c, 0x10000, 0x800, why), 0);
    ck_assert_int_eq(ok(&c, 0x1F000, 0x2000, why), 0);
  }
  ck_assert_uint_eq(c.queries, 2); /* the second mapping, once */
  /* a refusal is never cached: asked again, refused again */
  ck_assert_int_eq(ok(&c, 0x40000, 4, why), DCPX_E_INVAL);
  ck_assert_int_eq(ok(&c, 0x40000, 4, why), DCPX_E_INVAL);
  ck_assert_uint_eq(c.queries, 4);
}
END_TEST

/* A GPU that reaches pageable host memory (HMM, Grace Hopper): memory
 * CUDA does not know is the caller's to pass (never cached: asked again);
 * another GPU's memory is still refused. */
START_TEST(test_devptr_pageable) {
  dcpx__ptr_check c;
  char why[256];
  dcpx__ptr_check_init(&c, 0, 1, fake_query, NULL);
  ck_assert_int_eq(ok(&c, 0x90000, 64, why), 0);
  ck_assert_int_eq(ok(&c, 0x60000, 0x1001, why), 0); /* into pageable */
  ck_assert_int_eq(ok(&c, 0x90000, 64, why), 0);
  ck_assert_uint_eq(c.queries, 6); /* first and last byte, each time */
  ck_assert_int_eq(ok(&c, 0x40000, 4, why), DCPX_E_INVAL);
}
END_TEST

/* More buffers than the cache holds: still right, the oldest asked again. */
static int many_query(void *ctx, uintptr_t a, dcpx__mem_info *ret) {
  (void)ctx;
  ret->kind = DCPX__MEM_DEVICE;
  ret->device = 0;
  ret->beg = a & ~(uintptr_t)0xFFF;
  ret->end = ret->beg + 0x1000;
  return 0;
}

START_TEST(test_devptr_evict) {
  dcpx__ptr_check c;
  char why[256];
  dcpx__ptr_check_init(&c, 0, 0, many_query, NULL);
  for (uintptr_t i = 0; i <= DCPX__PTR_CACHE; i++)
    ck_assert_int_eq(ok(&c, 0x100000 + i * 0x1000, 64, why), 0);
  ck_assert_uint_eq(c.queries, DCPX__PTR_CACHE + 1);
  ck_assert_int_eq(ok(&c, 0x100000 + 0x1000, 64, why), 0); /* still there */
  ck_assert_uint_eq(c.queries, DCPX__PTR_CACHE + 1);
  ck_assert_int_eq(ok(&c, 0x100000, 64, why), 0); /* replaced: asked */
  ck_assert_uint_eq(c.queries, DCPX__PTR_CACHE + 2);
}
END_TEST

static Suite *transport_suite(void) {
  Suite *s = suite_create("transport");
  TCase *tc = t_tcase(s, "rule", T_TIMEOUT_DEFAULT);
  tcase_add_test(tc, test_explicit_wins);
  tcase_add_test(tc, test_auto_same_gpu);
  tcase_add_test(tc, test_auto_p2p);
  tcase_add_test(tc, test_auto_mixed);
  tcase_add_test(tc, test_invalid);
  tcase_add_test(tc, test_gpu_map_uuids);
  tcase_add_test(tc, test_gpu_map_shared);
  tc = t_tcase(s, "layout", T_TIMEOUT_DEFAULT);
  tcase_add_test(tc, test_nccl_layout);
  tcase_add_test(tc, test_wait_sources);
  tcase_add_test(tc, test_health_block);
  tc = t_tcase(s, "devptr", T_TIMEOUT_DEFAULT);
  tcase_add_test(tc, test_devptr_kinds);
  tcase_add_test(tc, test_devptr_extent);
  tcase_add_test(tc, test_devptr_cache);
  tcase_add_test(tc, test_devptr_evict);
  tcase_add_test(tc, test_devptr_pageable);
  return s;
}

int main(void) {
  return t_suite_run_mode(transport_suite(), CK_ENV);
}
