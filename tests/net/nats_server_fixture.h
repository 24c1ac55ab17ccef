/*
 * Test support: a private nats-server (JetStream on) per test program.
 *
 *     nats-server -a 127.0.0.1 -p -1 --ports_file_dir DIR -js -sd DIR/js
 *
 * in a fresh mkdtemp DIR; the random port is read from
 * DIR/nats-server_<pid>.ports (JSON) with a bounded poll. The server is
 * stopped by its pid (SIGTERM, waitpid; SIGKILL if it outlives the grace
 * period) and DIR is removed. It also gets SIGTERM if the test program dies
 * (PR_SET_PDEATHSIG), so no server outlives a crashed test.
 *
 * Binary: $KVI_NATS_SERVER, else "nats-server" on PATH, else
 * /usr/sbin/nats-server. Its output goes to DIR/server.log (dumped to stderr
 * by kvi_nats_server_dump_log).
 *
 * Link tests/net/nats_server_fixture.c into the test (tests/CMakeLists.txt,
 * target_sources), and libnats (the cluster functions ask JetStream). Thread: the functions are called from one thread (the
 * test's main thread); they never call cmocka asserts, so they may be used
 * from setup and teardown functions.
 */
#ifndef KVI_TESTS_NATS_SERVER_FIXTURE_H
#define KVI_TESTS_NATS_SERVER_FIXTURE_H

#include <limits.h>
#include <sys/types.h>

struct kvi_nats_server {
    pid_t pid;           /* 0: not running */
    int port;
    char dir[PATH_MAX];  /* the temporary directory, "" when none */
    char url[64];        /* "nats://127.0.0.1:<port>" */
};

/**
 * Start a server and wait (at most @p timeout_ms) until it wrote its ports
 * file. On failure nothing is left running or on disk.
 * @return 0, or a negative errno (-ETIMEDOUT when no ports file came, -ENOENT
 *         when the binary is missing, -ECHILD when it exited early).
 */
int kvi_nats_server_start(struct kvi_nats_server *s, unsigned timeout_ms);

/**
 * Stop the server (SIGTERM, wait) but keep its directory, port and URL, so
 * that kvi_nats_server_resume can start it again on the same port and
 * JetStream store (a server that went away and came back).
 */
void kvi_nats_server_pause(struct kvi_nats_server *s);

/**
 * Start a paused server again on its port and store; returns at once (the
 * clients' reconnection is what a test waits for). @return 0 or a negative
 * errno (fork).
 */
int kvi_nats_server_resume(struct kvi_nats_server *s);

/** Stop the server (if running) and remove its directory. Idempotent. */
void kvi_nats_server_stop(struct kvi_nats_server *s);

/** Copy DIR/server.log to stderr (for a failing test's diagnosis). */
void kvi_nats_server_dump_log(const struct kvi_nats_server *s);

/*
 * A JetStream cluster of N servers on loopback (3 for a replicated stream
 * that survives one node):
 *
 *     nats-server -a 127.0.0.1 -p P -n kvidx-<i> --cluster_name kvidx
 *       --cluster nats://127.0.0.1:C --routes <the other nodes' cluster URLs>
 *       --ports_file_dir DIR -js -sd DIR/js
 *
 * each in a directory of its own. The client and cluster ports are chosen
 * free (bound to port 0 and released) before the servers start, so every
 * node's routes name the others; a node killed (SIGKILL) and restarted
 * keeps its ports, name and store. The leader of a stream is asked of the
 * cluster with libnats ($JS.API.STREAM.INFO.<stream>: cluster.leader).
 * Same thread and cleanup rules as a single server.
 */
#define KVI_NATS_CLUSTER_MAX 5

struct kvi_nats_cluster {
    int n;
    struct kvi_nats_server node[KVI_NATS_CLUSTER_MAX];
    int cluster_port[KVI_NATS_CLUSTER_MAX];
    char urls[KVI_NATS_CLUSTER_MAX * 64]; /* every node's client URL, comma-separated */
};

/**
 * Start @p n (1..KVI_NATS_CLUSTER_MAX) clustered servers and wait (at most
 * @p timeout_ms) until JetStream answers (a meta leader is elected). On
 * failure nothing is left running or on disk (the logs are dumped first).
 * @return 0 or a negative errno (-ETIMEDOUT, -ENOENT, -ECHILD, -EINVAL).
 */
int kvi_nats_cluster_start(struct kvi_nats_cluster *c, int n, unsigned timeout_ms);

/** SIGKILL node @p i and reap it (its ports and store stay). */
void kvi_nats_cluster_kill(struct kvi_nats_cluster *c, int i);

/**
 * Start killed node @p i again on its ports, name and store, and wait (at
 * most @p timeout_ms) until it listens (its ports file). Catching up with
 * the cluster is what a test waits for. @return 0 or a negative errno.
 */
int kvi_nats_cluster_restart(struct kvi_nats_cluster *c, int i, unsigned timeout_ms);

/**
 * The node that leads @p stream, asked of the running nodes until one
 * names a leader (at most @p timeout_ms: an election takes seconds).
 * @return its index, or a negative errno (-ETIMEDOUT).
 */
int kvi_nats_cluster_stream_leader(const struct kvi_nats_cluster *c, const char *stream, unsigned timeout_ms);

/**
 * As kvi_nats_cluster_stream_leader, but only once every other node is a
 * current replica of @p stream (a restarted node has caught up), so that
 * one more node may go. @return the leader's index or a negative errno.
 */
int kvi_nats_cluster_stream_current(const struct kvi_nats_cluster *c, const char *stream, unsigned timeout_ms);

/** Stop every node and remove their directories. Idempotent. */
void kvi_nats_cluster_stop(struct kvi_nats_cluster *c);

/** Every node's log to stderr. */
void kvi_nats_cluster_dump_logs(const struct kvi_nats_cluster *c);

#endif
