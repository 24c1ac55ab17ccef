/* A private nats-server for a test program: see nats_server_fixture.h. */
#include "net/nats_server_fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KVI_NATS_STOP_GRACE_MS 5000
#define KVI_NATS_POLL_NS (10 * 1000 * 1000)

static int64_t fx_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void fx_pause(void)
{
    struct timespec p = {.tv_nsec = KVI_NATS_POLL_NS};
    nanosleep(&p, NULL);
}

static int fx_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void fx_rmdir(struct kvi_nats_server *s)
{
    if (s->dir[0])
        nftw(s->dir, fx_rm, 16, FTW_DEPTH | FTW_PHYS);
    s->dir[0] = '\0';
}

static const char *fx_binary(void)
{
    const char *env = getenv("KVI_NATS_SERVER");
    if (env && env[0])
        return env;
    const char *path = getenv("PATH");
    if (path) {
        char buf[PATH_MAX];
        for (const char *p = path; *p;) {
            size_t l = strcspn(p, ":");
            if (l && snprintf(buf, sizeof(buf), "%.*s/nats-server", (int)l, p) < (int)sizeof(buf) &&
                access(buf, X_OK) == 0)
                return "nats-server";
            p += l + (p[l] == ':');
        }
    }
    return "/usr/sbin/nats-server";
}

/* Parse {"nats":["nats://127.0.0.1:PORT"], ...}; 0 when not (yet) complete. */
static int fx_read_port(const char *file)
{
    FILE *f = fopen(file, "r");
    if (!f)
        return 0;
    char buf[512];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strstr(buf, "\"nats\"");
    if (!p || !strchr(buf, '}'))
        return 0;
    p = strstr(p, "nats://");
    if (!p)
        return 0;
    p = strchr(p + 7, ':');
    if (!p)
        return 0;
    int port = atoi(p + 1);
    return port > 0 && port < 65536 ? port : 0;
}

int kvi_nats_server_start(struct kvi_nats_server *s, unsigned timeout_ms)
{
    memset(s, 0, sizeof(*s));
    const char *tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof(s->dir), "%s/kvidx-nats.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(s->dir)) {
        int e = errno;
        s->dir[0] = '\0';
        return -e;
    }
    char store[PATH_MAX + 8], log[PATH_MAX + 16];
    snprintf(store, sizeof(store), "%s/js", s->dir);
    snprintf(log, sizeof(log), "%s/server.log", s->dir);
    const char *bin = fx_binary();
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        fx_rmdir(s);
        return -e;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execlp(bin, bin, "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", s->dir, "-js", "-sd",
               store, (char *)NULL);
        _exit(127);
    }
    s->pid = pid;
    char ports[PATH_MAX + 64];
    snprintf(ports, sizeof(ports), "%s/nats-server_%d.ports", s->dir, (int)pid);
    int64_t deadline = fx_now_ms() + timeout_ms;
    for (;;) {
        s->port = fx_read_port(ports);
        if (s->port)
            break;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            kvi_nats_server_dump_log(s);
            fx_rmdir(s);
            return WIFEXITED(st) && WEXITSTATUS(st) == 127 ? -ENOENT : -ECHILD;
        }
        if (fx_now_ms() >= deadline) {
            kvi_nats_server_dump_log(s);
            kvi_nats_server_stop(s);
            return -ETIMEDOUT;
        }
        fx_pause();
    }
    snprintf(s->url, sizeof(s->url), "nats://127.0.0.1:%d", s->port);
    return 0;
}

int kvi_nats_server_resume(struct kvi_nats_server *s)
{
    char store[PATH_MAX + 8], log[PATH_MAX + 16], port[16];
    snprintf(store, sizeof(store), "%s/js", s->dir);
    snprintf(log, sizeof(log), "%s/server.log", s->dir);
    snprintf(port, sizeof(port), "%d", s->port);
    const char *bin = fx_binary();
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execlp(bin, bin, "-a", "127.0.0.1", "-p", port, "-js", "-sd", store, (char *)NULL);
        _exit(127);
    }
    s->pid = pid;
    return 0;
}

/* SIGTERM, a grace period, then SIGKILL; the directory stays. */
static void fx_kill(struct kvi_nats_server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        int64_t deadline = fx_now_ms() + KVI_NATS_STOP_GRACE_MS;
        int st;
        pid_t r;
        while ((r = waitpid(s->pid, &st, WNOHANG)) == 0 && fx_now_ms() < deadline)
            fx_pause();
        if (r == 0) {
            kill(s->pid, SIGKILL);
            while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR) {
            }
        }
        s->pid = 0;
    }
}

void kvi_nats_server_pause(struct kvi_nats_server *s) { fx_kill(s); }

void kvi_nats_server_stop(struct kvi_nats_server *s)
{
    fx_kill(s);
    fx_rmdir(s);
}

void kvi_nats_server_dump_log(const struct kvi_nats_server *s)
{
    if (!s->dir[0])
        return;
    char log[PATH_MAX + 16];
    snprintf(log, sizeof(log), "%s/server.log", s->dir);
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    char buf[4096];
    size_t n;
    fprintf(stderr, "---- %s ----\n", log);
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
        fwrite(buf, 1, n, stderr);
    fprintf(stderr, "---- end ----\n");
    fclose(f);
}
