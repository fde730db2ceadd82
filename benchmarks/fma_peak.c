/* The cores' f32 fused multiply-add peak, for benchmarks/peak.py.

   usage: fma_peak THREADS ITERS
   Each thread runs ITERS rounds of ACC independent vector FMAs (acc =
   acc * a + b) on vectors of the target's widest register (GCC vector
   extension: 64 bytes with AVX-512, 32 with AVX, else 16, e.g. NEON),
   enough independent chains to cover the FMA latency, and few enough that
   the ACC accumulators, a and b stay in registers (16 with AVX2, 32 with
   AVX-512 or NEON). 64-byte vectors on an AVX2-only CPU were two registers
   each: 26 registers for 16, so the accumulators lived on the stack and
   the probe read 12 GFLOP/s on two Zen 3 cores whose matmul ran at 125.
   Prints "GFLOP/s seconds" (an FMA is 2 FLOP). No memory traffic: this is
   the arithmetic ceiling that a matmul kernel approaches and never
   passes. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
typedef float vec __attribute__((vector_size(4 * LANES)));
#define ACC 12

static long iters;
float fma_peak_sink[256];  /* external: the stores stay */

static void *run(void *arg) {
  long id = (long)arg;
  vec acc[ACC], a, b;
  for (int k = 0; k < LANES; k++) { a[k] = 0.999f; b[k] = 0.001f; }
  for (int i = 0; i < ACC; i++)
    for (int k = 0; k < LANES; k++) acc[i][k] = (float)(i + k);
  for (long n = 0; n < iters; n++) {
#pragma GCC unroll 12
    for (int i = 0; i < ACC; i++) acc[i] = acc[i] * a + b;
  }
  float s = 0.0f;  /* keep the result live */
  for (int i = 0; i < ACC; i++)
    for (int k = 0; k < LANES; k++) s += acc[i][k];
  fma_peak_sink[id % 256] = s;
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s THREADS ITERS\n", argv[0]);
    return 2;
  }
  int threads = atoi(argv[1]);
  iters = atol(argv[2]);
  if (threads < 1 || threads > 1024 || iters < 1) {
    fprintf(stderr, "fma_peak: THREADS must be 1..1024 and ITERS >= 1\n");
    return 2;
  }
  pthread_t *th = malloc(sizeof(pthread_t) * threads);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < threads; i++) pthread_create(&th[i], NULL, run, (void *)i);
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double dt = (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
  double flop = 2.0 * LANES * ACC * (double)iters * threads;
  printf("%.3f %.6f\n", flop / dt / 1e9, dt);
  free(th);
  return 0;
}
