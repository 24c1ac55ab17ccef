#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"

uint64_t kvi_bench_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int kvi_bench_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

double kvi_bench_pct(uint64_t *sorted_ns, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)(p / 100.0 * (double)(n - 1) + 0.5);
    if (i >= n)
        i = n - 1;
    return (double)sorted_ns[i];
}

/* User + system CPU seconds in the /proc stat file at @p path, and the command (between the
 * parentheses, possibly with spaces) into @p comm. @return -1 when unreadable. */
static double stat_cpu_s(const char *path, char *comm, size_t comm_len)
{
    char buf[1024];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *lp = strchr(buf, '('), *rp = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* fields after ")": state(3) ... utime(14) stime(15) */
    if (lp == NULL || rp == NULL ||
        sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    if (comm != NULL && comm_len > 0) {
        *rp = '\0';
        snprintf(comm, comm_len, "%s", lp + 1);
    }
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

double kvi_bench_proc_cpu_s(int pid)
{
    if (pid <= 0)
        return -1;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    return stat_cpu_s(path, NULL, 0);
}

void kvi_bench_thread_cpu_s(double *out, size_t n_groups,
                            size_t (*group)(pid_t tid, const char *comm, void *arg), void *arg)
{
    memset(out, 0, n_groups * sizeof *out);
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        char path[64], comm[64];
        snprintf(path, sizeof path, "/proc/self/task/%.16s/stat", e->d_name);
        double s = stat_cpu_s(path, comm, sizeof comm);
        if (s < 0)
            continue;
        size_t g = group((pid_t)atoi(e->d_name), comm, arg);
        if (g < n_groups)
            out[g] += s;
    }
    closedir(d);
}
