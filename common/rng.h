/* rng.h - splitmix64, the one pseudo-random generator of the tests, the
 * benches and dcpx-demo: a fixed seed gives the same inputs everywhere
 * (a failing case is named by its seed). Not for anything that must be
 * unpredictable: the reattach secrets come from getrandom(2). The
 * examples keep their own copy: they use the public headers only. */
#ifndef DCPX_RNG_H
#define DCPX_RNG_H

#include <math.h>
#include <stdint.h>

/* The next value of the sequence at *s (Steele, Lea and Flood's
 * SplitMix64). */
static inline uint64_t dcpx_splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [0, n) (0 for n = 0), from the high 32 bits. */
static inline uint32_t dcpx_rnd_below(uint64_t *s, uint32_t n) {
  return (uint32_t)(((dcpx_splitmix64(s) >> 32) * (uint64_t)n) >> 32);
}

/* Log-uniform in [lo, hi] (1 <= lo <= hi): the tests' random shapes,
 * small values as likely as large ones per octave (a program that uses
 * it links -lm). */
static inline uint32_t dcpx_rnd_log(uint64_t *s, uint32_t lo, uint32_t hi) {
  const double a = log((double)lo), b = log((double)hi + 1.0);
  const double u = (double)dcpx_rnd_below(s, 1u << 30) / (double)(1u << 30);
  const uint32_t x = (uint32_t)exp(a + (b - a) * u);
  return x < lo ? lo : x > hi ? hi : x;
}

#endif
