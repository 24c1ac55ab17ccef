/* Sweep plots through gnuplot (see bench/plot.h). */
#include "bench/plot.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* gnuplot string literal in single quotes: double any quote */
static void put_quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static const char *const colors[] = {"#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9"};

/* One backend's series in one panel: a line through every run, filled
 * markers for runs that kept up, open markers for the rest. */
static void put_series(FILE *f, const char *dat, size_t i, const char *name, int col)
{
    const char *c = colors[i % (sizeof colors / sizeof colors[0])];
    put_quoted(f, dat);
    fprintf(f, " index %zu using 1:%d with lines lw 2 lc rgb '%s' title ", i, col, c);
    put_quoted(f, name);
    fprintf(f, ", ");
    put_quoted(f, dat);
    fprintf(f, " index %zu using 1:($4 > 0 ? $%d : 1/0) with points pt 7 ps 1.2 lc rgb '%s' notitle, ", i, col, c);
    put_quoted(f, dat);
    fprintf(f, " index %zu using 1:($4 > 0 ? 1/0 : $%d) with points pt 6 ps 1.2 lc rgb '%s' notitle", i, col, c);
}

static void write_panels(FILE *f, const char *dat, const char *title, const struct kvi_plot_line *lines,
                         size_t n_lines)
{
    fprintf(f, "set multiplot layout 1,2 title ");
    put_quoted(f, title);
    fprintf(f, " font ',12'\n");
    fprintf(f, "set logscale xy\nset grid xtics ytics mxtics mytics lc rgb '#dddddd'\nset key top left\n");
    fprintf(f, "set xlabel 'offered load (M block-ops/s); filled marker = kept up, open = did not'\n");
    fprintf(f, "set ylabel 'achieved (M block-ops/s)'\n");
    fprintf(f, "set title 'throughput'\n");
    fprintf(f, "plot x title 'achieved = offered' with lines dt 2 lc rgb '#888888'");
    for (size_t i = 0; i < n_lines; i++) {
        fprintf(f, ", ");
        put_series(f, dat, i, lines[i].name, 2);
    }
    fprintf(f, "\nset ylabel 'find_matches p99 (us)'\n");
    fprintf(f, "set title 'query latency'\n");
    fprintf(f, "plot ");
    for (size_t i = 0; i < n_lines; i++) {
        if (i)
            fprintf(f, ", ");
        put_series(f, dat, i, lines[i].name, 3);
    }
    fprintf(f, "\nunset multiplot\n");
}

/* Run gnuplot on @p script with its output in @p log. */
static int run_gnuplot(const char *script, const char *log)
{
    char *argv[] = {"gnuplot", (char *)script, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid;
    int rc = posix_spawnp(&pid, "gnuplot", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return rc == ENOENT ? -ENOENT : -EIO;
    int st;
    if (waitpid(pid, &st, 0) < 0)
        return -EIO;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        return -ENOENT;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

int kvi_plot_sweep(const char *prefix, const char *title, const struct kvi_plot_line *lines, size_t n_lines,
                   char *msg, size_t msg_len)
{
    char dat[4200], gp[4200], png[4200], svg[4200], log[4200];
    snprintf(log, sizeof log, "%s.log", prefix);
    snprintf(dat, sizeof dat, "%s.dat", prefix);
    snprintf(gp, sizeof gp, "%s.gp", prefix);
    snprintf(png, sizeof png, "%s.png", prefix);
    snprintf(svg, sizeof svg, "%s.svg", prefix);
    FILE *f = fopen(dat, "w");
    if (f == NULL) {
        snprintf(msg, msg_len, "cannot write %s: %s", dat, strerror(errno));
        return -EIO;
    }
    for (size_t i = 0; i < n_lines; i++) {
        fprintf(f, "# %s: offered_Mblk_s achieved_Mblk_s find_p99_us keep_up\n", lines[i].name);
        for (size_t j = 0; j < lines[i].n; j++) {
            const struct kvi_plot_point *p = &lines[i].p[j];
            fprintf(f, "%.6f %.6f %.4f %d\n", p->offered / 1e6, p->achieved / 1e6, p->p99_ns / 1e3, p->keep_up);
        }
        if (lines[i].n == 0)
            fprintf(f, "NaN NaN NaN 0\n"); /* keep the index numbering */
        fprintf(f, "\n\n");
    }
    if (fclose(f) != 0) {
        snprintf(msg, msg_len, "cannot write %s", dat);
        return -EIO;
    }
    f = fopen(gp, "w");
    if (f == NULL) {
        snprintf(msg, msg_len, "cannot write %s: %s", gp, strerror(errno));
        return -EIO;
    }
    /* the data file is referenced by name relative to the script's directory */
    fprintf(f, "# kvidx-bench trace sweep plot: gnuplot %s\n", base_name(gp));
    fprintf(f, "cd ");
    char dir[4200], abs_dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", prefix);
    char *slash = strrchr(dir, '/');
    if (slash != NULL)
        *(slash == dir ? slash + 1 : slash) = 0;
    else
        snprintf(dir, sizeof dir, ".");
    put_quoted(f, realpath(dir, abs_dir) ? abs_dir : dir);
    fprintf(f, "\n");
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo size 1400,560 font 'sans,10' noenhanced\n"
               "} else {\n"
               "  set terminal png size 1400,560 noenhanced\n"
               "}\n");
    fprintf(f, "set output ");
    put_quoted(f, base_name(png));
    fprintf(f, "\n");
    write_panels(f, base_name(dat), title, lines, n_lines);
    fprintf(f, "set terminal svg size 1400,560 dynamic font 'sans,10' noenhanced\nset output ");
    put_quoted(f, base_name(svg));
    fprintf(f, "\n");
    write_panels(f, base_name(dat), title, lines, n_lines);
    fprintf(f, "unset output\n");
    if (fclose(f) != 0) {
        snprintf(msg, msg_len, "cannot write %s", gp);
        return -EIO;
    }
    int rc = run_gnuplot(gp, log);
    if (rc == -ENOENT)
        snprintf(msg, msg_len, "gnuplot not found (apt-get install gnuplot-nox); wrote %s and %s", gp, dat);
    else if (rc < 0)
        snprintf(msg, msg_len, "gnuplot failed on %s (see %s)", gp, log);
    else
        snprintf(msg, msg_len, "wrote %s and %s", png, svg);
    return rc;
}
