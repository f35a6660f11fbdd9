// Measures this machine's fp32 FMA peak and DRAM bandwidth with T threads.
//
//   gcc -O2 -march=native -fopenmp benchmarks/ceilings.c -o /tmp/ceilings && /tmp/ceilings 2
//
// FMA: each thread runs 12 independent chains of vector FMAs on registers (no
// memory traffic) with the widest vectors the compiler was allowed
// (-march=native: 512-bit with AVX-512, 256-bit with AVX2), best of 5 runs.
// Bandwidth: STREAM-style triad a[i] = b[i] + s * c[i] over three 256 MiB
// arrays (24 bytes of traffic per element counted; write-allocate not counted),
// best of 5. Prints one line each. A busy machine reads low: see the load line.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vec;
#define LANES 16
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSET(x) _mm512_set1_ps(x)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VSUM(a) _mm512_reduce_add_ps(a)
#define ISA "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 vec;
#define LANES 8
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VSET(x) _mm256_set1_ps(x)
#define VADD(a, b) _mm256_add_ps(a, b)
static float VSUM(__m256 a) {
  float t[8];
  _mm256_storeu_ps(t, a);
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#define ISA "avx2+fma"
#else
#error "needs AVX2+FMA or AVX-512"
#endif

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static float fma_loop(long iters, float seed) {
  vec a = VSET(0.999999f), b = VSET(1e-7f);
  vec c0 = VSET(seed), c1 = VSET(seed + 1), c2 = VSET(seed + 2), c3 = VSET(seed + 3);
  vec c4 = VSET(seed + 4), c5 = VSET(seed + 5), c6 = VSET(seed + 6), c7 = VSET(seed + 7);
  vec c8 = VSET(seed + 8), c9 = VSET(seed + 9), c10 = VSET(seed + 10), c11 = VSET(seed + 11);
  for (long i = 0; i < iters; i++) {
    c0 = VFMA(c0, a, b); c1 = VFMA(c1, a, b); c2 = VFMA(c2, a, b); c3 = VFMA(c3, a, b);
    c4 = VFMA(c4, a, b); c5 = VFMA(c5, a, b); c6 = VFMA(c6, a, b); c7 = VFMA(c7, a, b);
    c8 = VFMA(c8, a, b); c9 = VFMA(c9, a, b); c10 = VFMA(c10, a, b); c11 = VFMA(c11, a, b);
    __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5));
  }
  vec s = VADD(VADD(VADD(c0, c1), VADD(c2, c3)), VADD(VADD(c4, c5), VADD(c6, c7)));
  s = VADD(s, VADD(VADD(c8, c9), VADD(c10, c11)));
  return VSUM(s);
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  omp_set_num_threads(threads);
  const long iters = 200000000L / LANES;
  double best = 0;
  float sink = 0;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now();
#pragma omp parallel reduction(+ : sink)
    sink += fma_loop(iters, (float)omp_get_thread_num());
    double dt = now() - t0;
    double gf = (double)threads * iters * 12 * LANES * 2 / dt / 1e9;
    if (gf > best) best = gf;
  }
  printf("ceilings: fp32 FMA %.0f GFLOP/s (%s, %d threads) [%g]\n", best, ISA, threads, sink > 0 ? 0.0 : 1.0);

  const long n = 64L << 20;  // 64 Mi floats = 256 MiB per array
  float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float)), *c = malloc(n * sizeof(float));
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) { a[i] = 0; b[i] = 1; c[i] = 2; }
  double bw = 0;
  for (int rep = 0; rep < 5; rep++) {
    double t0 = now();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) a[i] = b[i] + 0.5f * c[i];
    double dt = now() - t0;
    double gbs = 3.0 * n * sizeof(float) / dt / 1e9;
    if (gbs > bw) bw = gbs;
  }
  printf("ceilings: DRAM triad %.1f GB/s (%d threads) [%g]\n", bw, threads, a[n / 2]);
  free(a); free(b); free(c);
  return 0;
}
