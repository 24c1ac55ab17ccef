/*
 * Sweep plots for kvidx-bench trace (bench/ only): writes a data file and a
 * gnuplot script, then runs gnuplot (Debian package `gnuplot-nox`) to render
 * PNG and SVG. Two panels: achieved vs offered block-ops/s (log-log, with the
 * "achieved = offered" diagonal) and find_matches p99 vs offered load, one
 * line per backend. Without gnuplot the script and data stay for later.
 */
#ifndef KVI_BENCH_PLOT_H
#define KVI_BENCH_PLOT_H

#include <stdbool.h>
#include <stddef.h>

struct kvi_plot_point {
    double offered;  /* block-ops/s */
    double achieved; /* block-ops/s */
    double p99_ns;   /* find_matches p99 */
    bool keep_up;
};

struct kvi_plot_line {
    const char *name;
    const struct kvi_plot_point *p; /* sorted by offered load */
    size_t n;
};

/**
 * Write PREFIX.dat and PREFIX.gp and render PREFIX.png and PREFIX.svg
 * (gnuplot's own messages go to PREFIX.log).
 * @param msg  receives a one-line note (what was written, or why not)
 * @return 0 when both images were rendered, -ENOENT when gnuplot is
 *         missing, -EIO when a file could not be written or gnuplot failed.
 */
int kvi_plot_sweep(const char *prefix, const char *title, const struct kvi_plot_line *lines, size_t n_lines,
                   char *msg, size_t msg_len);

#endif
