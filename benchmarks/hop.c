/* Core-to-core latency, for benchmarks/placement.py.

   usage: hop CPU_A CPU_B HOPS
   Two threads, pinned to CPU_A and CPU_B, pass a counter back and forth on
   one cache line, spinning: each hop is the time for a store on one core
   to be seen by the other. Runs 1 + BATCHES batches of HOPS round trips
   (the first untimed) and prints "median max" of the batches' one-way hop
   in nanoseconds. On a VM the two vCPUs move between host cores: on one
   L3 cache (Zen 4: ~26 ns a hop here) or across two (~170 ns). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCHES 15

static _Atomic long token __attribute__((aligned(64)));
static long hops;

static int pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

/* The other core: answers odd values with the next even one. */
static void *answer(void *arg) {
  (void)arg;
  long total = (BATCHES + 1) * hops;
  for (long i = 0; i < total; i++) {
    while (atomic_load_explicit(&token, memory_order_acquire) != 2 * i + 1)
      ;
    atomic_store_explicit(&token, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s CPU_A CPU_B HOPS\n", argv[0]);
    return 2;
  }
  int cpu_a = atoi(argv[1]), cpu_b = atoi(argv[2]);
  hops = atol(argv[3]);
  if (cpu_a < 0 || cpu_b < 0 || cpu_a >= CPU_SETSIZE || cpu_b >= CPU_SETSIZE
      || cpu_a == cpu_b || hops < 1) {
    fprintf(stderr, "hop: CPU_A and CPU_B must be two different CPUs "
            "(got %s, %s) and HOPS >= 1 (got %s)\n", argv[1], argv[2],
            argv[3]);
    return 2;
  }
  int err = pin(cpu_a);
  if (err) {
    fprintf(stderr, "hop: cannot run on CPU %d: %s\n", cpu_a, strerror(err));
    return 3;
  }
  pthread_attr_t attr;
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu_b, &s);
  pthread_attr_init(&attr);
  pthread_attr_setaffinity_np(&attr, sizeof s, &s);
  pthread_t other;
  err = pthread_create(&other, &attr, answer, NULL);
  if (err) {
    fprintf(stderr, "hop: cannot start a thread on CPU %d: %s\n", cpu_b,
            strerror(err));
    return 3;
  }
  double ns[BATCHES];
  long k = 0;
  for (int j = 0; j <= BATCHES; j++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < hops; i++, k++) {
      atomic_store_explicit(&token, 2 * k + 1, memory_order_release);
      while (atomic_load_explicit(&token, memory_order_acquire) != 2 * k + 2)
        ;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (j > 0)
      ns[j - 1] = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec))
                  / (2.0 * hops);
  }
  pthread_join(other, NULL);
  qsort(ns, BATCHES, sizeof(double), cmp);
  printf("%.1f %.1f\n", ns[BATCHES / 2], ns[BATCHES - 1]);
  return 0;
}
