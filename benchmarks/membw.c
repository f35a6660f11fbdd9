// Measures this machine's DRAM *read* bandwidth with T threads: the ceiling of LLM decoding,
// whose every token streams all the weights once (no writes).
//
//   gcc -O2 -march=native -fopenmp benchmarks/membw.c -o /tmp/membw && /tmp/membw 2 [MiB]
//
// Each thread sums its share of a buffer (default 1024 MiB, far past every cache) with 4
// independent vector accumulators; bytes read / time, best of 7 passes after one warm-up.
// Prints "membw: read X GB/s (T threads, N MiB)". benchmarks/ceilings.c's triad mixes reads
// and writes; this is the number a decode roofline divides by. A busy machine reads low.
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Sum of a[0..n) in 4 chains of 16 floats; the compiler vectorises the inner loop.
static float sum_chunk(const float *restrict a, size_t n) {
  float acc[4][16] = {{0}};
  size_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int c = 0; c < 4; c++)
      for (int l = 0; l < 16; l++) acc[c][l] += a[i + 16 * c + l];
  float s = 0;
  for (; i < n; i++) s += a[i];
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 16; l++) s += acc[c][l];
  return s;
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
  if (threads < 1 || mib < 64) {
    fprintf(stderr, "usage: membw THREADS [MiB >= 64]\n");
    return 2;
  }
  omp_set_num_threads(threads);
  size_t n = mib * 1024 * 1024 / sizeof(float);
  float *a = aligned_alloc(64, n * sizeof(float));
  if (!a) {
    fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib);
    return 1;
  }
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) a[i] = (float)(i & 7) * 0.125f;  // first touch by its reader

  double best = 0;
  float sink = 0;
  for (int rep = 0; rep < 8; rep++) {
    float total = 0;
    double t = now();
#pragma omp parallel reduction(+ : total)
    {
      int tid = omp_get_thread_num(), nt = omp_get_num_threads();
      size_t lo = n * tid / nt, hi = n * (tid + 1) / nt;
      total += sum_chunk(a + lo, hi - lo);
    }
    t = now() - t;
    sink += total;
    double gbs = n * sizeof(float) / t / 1e9;
    if (rep > 0 && gbs > best) best = gbs;
  }
  printf("membw: read %.1f GB/s (%d threads, %zu MiB) [%g]\n", best, threads, mib, sink > 0 ? 0.0 : 1.0);
  free(a);
  return 0;
}
