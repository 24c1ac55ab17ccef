/*
 * kvidx-bench: benchmark programs (never tests). Each subcommand measures and
 * prints a human table followed, as its last line, by one JSON summary line.
 */
#ifndef KVI_BENCH_H
#define KVI_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Subcommands: each returns a process exit code. */
int kvi_bench_micro(int argc, char **argv);
int kvi_bench_ring(int argc, char **argv);
int kvi_bench_decode(int argc, char **argv);
int kvi_bench_trace(int argc, char **argv);
int kvi_bench_ingest(int argc, char **argv);
int kvi_bench_snapshot(int argc, char **argv);

/* Shared helpers (bench/util.c). */
uint64_t kvi_bench_rand(uint64_t *state);  /* splitmix64 */
double kvi_bench_pct(uint64_t *sorted_ns, size_t n, double p);
int kvi_bench_cmp_u64(const void *a, const void *b);
double kvi_bench_proc_cpu_s(int pid); /* user + system CPU seconds of a process; -1 when unknown */
/* CPU seconds (user + system) so far of this process's threads, summed into out[0..n_groups) by
 * @p group (thread id, command name), which returns the group, or n_groups to leave a thread out.
 * Read from /proc/self/task/<tid>/stat, to the clock tick (10 ms). Thread: any. */
void kvi_bench_thread_cpu_s(double *out, size_t n_groups,
                            size_t (*group)(pid_t tid, const char *comm, void *arg), void *arg);

#endif
