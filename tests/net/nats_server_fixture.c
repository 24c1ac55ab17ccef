/* A private nats-server for a test program: see nats_server_fixture.h. */
#include "net/nats_server_fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

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

/* Fork and exec the server with @p argv (after the binary's name; NULL-terminated), its output
 * appended to DIR/server.log (truncated first unless @p append). @return 0 or a negative errno. */
static int fx_spawn(struct kvi_nats_server *s, const char *const *argv, bool append)
{
    char log[PATH_MAX + 16];
    snprintf(log, sizeof(log), "%s/server.log", s->dir);
    const char *bin = fx_binary();
    const char *args[32];
    size_t n = 0;
    args[n++] = bin;
    for (; argv[n - 1] != NULL && n < 31; n++)
        args[n] = argv[n - 1];
    args[n] = NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        execvp(bin, (char *const *)args);
        _exit(127);
    }
    s->pid = pid;
    return 0;
}

/* Wait until the server wrote DIR/nats-server_<pid>.ports; s->port is set from it. */
static int fx_wait_ports(struct kvi_nats_server *s, unsigned timeout_ms)
{
    char ports[PATH_MAX + 64];
    snprintf(ports, sizeof(ports), "%s/nats-server_%d.ports", s->dir, (int)s->pid);
    int64_t deadline = fx_now_ms() + timeout_ms;
    for (;;) {
        int port = fx_read_port(ports);
        if (port) {
            s->port = port;
            snprintf(s->url, sizeof(s->url), "nats://127.0.0.1:%d", s->port);
            return 0;
        }
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) && WEXITSTATUS(st) == 127 ? -ENOENT : -ECHILD;
        }
        if (fx_now_ms() >= deadline)
            return -ETIMEDOUT;
        fx_pause();
    }
}

/* A fresh mkdtemp directory for @p s (memset first). */
static int fx_mkdir(struct kvi_nats_server *s)
{
    memset(s, 0, sizeof(*s));
    const char *tmp = getenv("TMPDIR");
    snprintf(s->dir, sizeof(s->dir), "%s/kvidx-nats.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(s->dir)) {
        int e = errno;
        s->dir[0] = '\0';
        return -e;
    }
    return 0;
}

int kvi_nats_server_start(struct kvi_nats_server *s, unsigned timeout_ms)
{
    int rc = fx_mkdir(s);
    if (rc != 0)
        return rc;
    char store[PATH_MAX + 8];
    snprintf(store, sizeof(store), "%s/js", s->dir);
    const char *argv[] = {"-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", s->dir, "-js", "-sd", store, NULL};
    if ((rc = fx_spawn(s, argv, false)) != 0) {
        fx_rmdir(s);
        return rc;
    }
    if ((rc = fx_wait_ports(s, timeout_ms)) != 0) {
        kvi_nats_server_dump_log(s);
        kvi_nats_server_stop(s);
    }
    return rc;
}

int kvi_nats_server_resume(struct kvi_nats_server *s)
{
    char store[PATH_MAX + 8], port[16];
    snprintf(store, sizeof(store), "%s/js", s->dir);
    snprintf(port, sizeof(port), "%d", s->port);
    const char *argv[] = {"-a", "127.0.0.1", "-p", port, "-js", "-sd", store, NULL};
    return fx_spawn(s, argv, true);
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

/* ---- a JetStream cluster ------------------------------------------------------------------- */

/* A free loopback TCP port (bound to port 0, then released), 0 on failure. */
static int fx_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* Start node i on its ports, name, routes and store (its directory exists). */
static int fx_node_spawn(struct kvi_nats_cluster *c, int i, bool append)
{
    struct kvi_nats_server *s = &c->node[i];
    char store[PATH_MAX + 8], port[16], name[32], listen[64], routes[KVI_NATS_CLUSTER_MAX * 40] = "";
    snprintf(store, sizeof(store), "%s/js", s->dir);
    snprintf(port, sizeof(port), "%d", s->port);
    snprintf(name, sizeof(name), "kvidx-%d", i);
    snprintf(listen, sizeof(listen), "nats://127.0.0.1:%d", c->cluster_port[i]);
    for (int k = 0; k < c->n; k++)
        if (k != i)
            snprintf(routes + strlen(routes), sizeof(routes) - strlen(routes), "%snats://127.0.0.1:%d",
                     routes[0] ? "," : "", c->cluster_port[k]);
    const char *argv[24] = {"-a", "127.0.0.1", "-p", port, "-n", name, "--cluster_name", "kvidx", "--cluster", listen,
                            "--ports_file_dir", s->dir, "-js", "-sd", store};
    size_t k = 15;
    if (routes[0]) { /* (none in a cluster of one) */
        argv[k++] = "--routes";
        argv[k++] = routes;
    }
    argv[k] = NULL;
    return fx_spawn(s, argv, append);
}

/* A connection to every node of the list (libnats picks a live one), NULL when none answers. */
static natsConnection *fx_cluster_connect(const struct kvi_nats_cluster *c)
{
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    const char *urls[KVI_NATS_CLUSTER_MAX];
    int n = 0;
    for (int i = 0; i < c->n; i++)
        if (c->node[i].pid > 0)
            urls[n++] = c->node[i].url;
    if (n > 0 && natsOptions_Create(&o) == NATS_OK && natsOptions_SetServers(o, urls, n) == NATS_OK &&
        natsOptions_SetTimeout(o, 2000) == NATS_OK && natsOptions_SetMaxReconnect(o, 0) == NATS_OK)
        (void)natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    return nc;
}

/* Does JetStream answer on the cluster (a meta leader elected)? */
static bool fx_js_up(const struct kvi_nats_cluster *c)
{
    natsConnection *nc = fx_cluster_connect(c);
    if (nc == NULL)
        return false;
    jsCtx *js = NULL;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 2000;
    jsAccountInfo *ai = NULL;
    bool up = natsConnection_JetStream(&js, nc, &jo) == NATS_OK && js_GetAccountInfo(&ai, js, NULL, NULL) == NATS_OK;
    jsAccountInfo_Destroy(ai);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return up;
}

int kvi_nats_cluster_start(struct kvi_nats_cluster *c, int n, unsigned timeout_ms)
{
    memset(c, 0, sizeof(*c));
    if (n < 1 || n > KVI_NATS_CLUSTER_MAX)
        return -EINVAL;
    c->n = n;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = fx_mkdir(&c->node[i]);
        c->node[i].port = fx_free_port();
        c->cluster_port[i] = fx_free_port();
        if (rc == 0 && (c->node[i].port == 0 || c->cluster_port[i] == 0))
            rc = -EADDRNOTAVAIL;
        snprintf(c->node[i].url, sizeof(c->node[i].url), "nats://127.0.0.1:%d", c->node[i].port);
        snprintf(c->urls + strlen(c->urls), sizeof(c->urls) - strlen(c->urls), "%s%s", i ? "," : "",
                 c->node[i].url);
    }
    int64_t deadline = fx_now_ms() + timeout_ms;
    for (int i = 0; i < n && rc == 0; i++)
        rc = fx_node_spawn(c, i, false);
    for (int i = 0; i < n && rc == 0; i++) {
        int64_t left = deadline - fx_now_ms();
        rc = fx_wait_ports(&c->node[i], left > 0 ? (unsigned)left : 0);
    }
    while (rc == 0 && !fx_js_up(c))
        if (fx_now_ms() >= deadline)
            rc = -ETIMEDOUT;
        else
            fx_pause();
    if (rc != 0) {
        kvi_nats_cluster_dump_logs(c);
        kvi_nats_cluster_stop(c);
    }
    return rc;
}

void kvi_nats_cluster_kill(struct kvi_nats_cluster *c, int i)
{
    struct kvi_nats_server *s = &c->node[i];
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGKILL);
    int st;
    while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR) {
    }
    s->pid = 0;
}

int kvi_nats_cluster_restart(struct kvi_nats_cluster *c, int i, unsigned timeout_ms)
{
    int port = c->node[i].port;
    int rc = fx_node_spawn(c, i, true);
    if (rc == 0)
        rc = fx_wait_ports(&c->node[i], timeout_ms);
    c->node[i].port = port; /* (the same, from its ports file) */
    return rc;
}

/* The index of the node that leads @p stream with every other node a current replica (when
 * @p all_current), else -1; asked once. */
static int fx_stream_leader_once(const struct kvi_nats_cluster *c, const char *stream, bool all_current)
{
    int leader = -1;
    natsConnection *nc = fx_cluster_connect(c);
    jsCtx *js = NULL;
    jsStreamInfo *si = NULL;
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 2000;
    if (nc != NULL && natsConnection_JetStream(&js, nc, &jo) == NATS_OK &&
        js_GetStreamInfo(&si, js, stream, NULL, NULL) == NATS_OK && si->Cluster != NULL &&
        si->Cluster->Leader != NULL) {
        for (int i = 0; i < c->n; i++) {
            char name[32];
            snprintf(name, sizeof(name), "kvidx-%d", i);
            if (strcmp(si->Cluster->Leader, name) == 0 && c->node[i].pid > 0)
                leader = i;
        }
        int current = 0;
        for (int i = 0; i < si->Cluster->ReplicasLen; i++)
            current += si->Cluster->Replicas[i]->Current && !si->Cluster->Replicas[i]->Offline;
        if (all_current && current != c->n - 1)
            leader = -1;
    }
    jsStreamInfo_Destroy(si);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    return leader;
}

/* Poll fx_stream_leader_once until it names a node. */
static int fx_stream_leader(const struct kvi_nats_cluster *c, const char *stream, bool all_current,
                            unsigned timeout_ms)
{
    int64_t deadline = fx_now_ms() + timeout_ms;
    for (;;) {
        int leader = fx_stream_leader_once(c, stream, all_current);
        if (leader >= 0)
            return leader;
        if (fx_now_ms() >= deadline)
            return -ETIMEDOUT;
        fx_pause();
    }
}

int kvi_nats_cluster_stream_leader(const struct kvi_nats_cluster *c, const char *stream, unsigned timeout_ms)
{
    return fx_stream_leader(c, stream, false, timeout_ms);
}

int kvi_nats_cluster_stream_current(const struct kvi_nats_cluster *c, const char *stream, unsigned timeout_ms)
{
    return fx_stream_leader(c, stream, true, timeout_ms);
}

void kvi_nats_cluster_stop(struct kvi_nats_cluster *c)
{
    for (int i = 0; i < c->n; i++)
        kvi_nats_server_stop(&c->node[i]);
}

void kvi_nats_cluster_dump_logs(const struct kvi_nats_cluster *c)
{
    for (int i = 0; i < c->n; i++)
        kvi_nats_server_dump_log(&c->node[i]);
}
