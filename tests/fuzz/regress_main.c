/*
 * Regression driver for the fuzz targets, linked instead of libFuzzer in
 * every normal build (CTest fuzz_<name>_regress, label unit, so the asan
 * build runs it under ASan + UBSan too).
 *
 * Usage: fuzz_<name>_regress PATH...
 *   Each PATH is a file or a directory; the files of a directory (not
 *   recursive, hidden files and README* skipped) run in name order. Every
 *   input goes through the target's LLVMFuzzerTestOneInput exactly as
 *   libFuzzer would call it: an exact-size heap copy, so an overread is an
 *   ASan error. A broken invariant aborts (the failing file is printed
 *   first). Exits 1 when no input was found at all (a wrong path must not
 *   pass silently); a missing directory is otherwise fine (regressions/<name>
 *   exists only once a finding was recorded).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "regress: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    if (buf == NULL)
        abort();
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            uint8_t *nb = realloc(buf, cap);
            if (nb == NULL)
                abort();
            buf = nb;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        fprintf(stderr, "regress: cannot read %s\n", path);
        free(buf);
        return -1;
    }
    uint8_t *exact = malloc(n);
    if (exact == NULL && n > 0)
        abort();
    if (n > 0)
        memcpy(exact, buf, n);
    free(buf);
    fprintf(stderr, "regress: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Run every regular file of @p dir. @return files run, or -1. */
static long run_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return errno == ENOENT ? 0 : -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strncmp(e->d_name, "README", 6) == 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **nn = realloc(names, cap * sizeof(*nn));
            if (nn == NULL)
                abort();
            names = nn;
        }
        size_t len = strlen(dir) + 1 + strlen(e->d_name) + 1;
        names[n] = malloc(len);
        if (names[n] == NULL)
            abort();
        snprintf(names[n], len, "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    if (n > 0)
        qsort(names, n, sizeof(*names), name_cmp);
    long ran = 0;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(names[i]) != 0)
                ran = -1;
            else if (ran >= 0)
                ran++;
        }
        free(names[i]);
    }
    free(names);
    return ran;
}

int main(int argc, char **argv)
{
    long total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        long r;
        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
            r = run_dir(argv[i]);
        else if (stat(argv[i], &st) == 0)
            r = run_file(argv[i]) == 0 ? 1 : -1;
        else
            r = 0; /* an absent regressions/<name> directory */
        if (r < 0)
            return 1;
        total += r;
    }
    printf("%ld inputs passed\n", total);
    return total > 0 ? 0 : 1;
}
