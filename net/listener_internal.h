/*
 * Listener internals shared by net/listener.c (listener threads: sockets,
 * message handling, commands) and net/listener_registry.c (the pool and its
 * registry: control calls and inspection). Not installed; see
 * net/listener.h for the public API and net/listener.c for the design.
 */
#ifndef KVI_NET_LISTENER_INTERNAL_H
#define KVI_NET_LISTENER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "net/decode.h"
#include "net/ingest.h"
#include "net/keyhash.h"
#include "net/listener.h"
#include "net/replay.h"

#include <zmq.h>

#define KVI_LIS_WARN_BUDGET 20  /* warnings and errors a listener prints before going quiet */

enum sock_kind { SK_CMD, SK_SUB, SK_BIND, SK_DEALER, SK_MON };

struct lmon;

/* A ZMQ socket in a thread's epoll set. Embedded in its owner, never freed alone. */
struct lsock {
    void *zs;      /* NULL when closed */
    int fd;        /* ZMQ_FD */
    uint8_t kind;  /* enum sock_kind */
    bool ready;    /* on the thread's ready list */
    bool polled;   /* in the epoll set */
    void *owner;   /* struct listener (SUB, DEALER), struct bind_ep (BIND), struct lmon (MON) */
    struct lmon *mon; /* SUB, BIND: the monitor attached when the socket opened, or NULL */
};

/*
 * The connection monitor of a SUB (a listener's or a bind endpoint's): a PAIR
 * connected to the SUB's zmq_socket_monitor PAIR, in the thread's epoll set
 * like any socket, and the descriptors of the SUB's connections that are up
 * (CONNECTED / ACCEPTED add one, DISCONNECTED / CLOSED remove it). Embedded
 * in the SUB's owner; owner thread only.
 */
struct lmon {
    struct lsock sock;    /* kind SK_MON, owner this lmon; zs NULL when not monitoring */
    struct lsock *target; /* the monitored SUB */
    int *up;              /* descriptors of connections up (few: one per engine) */
    uint32_t n_up, cap_up;
};

struct lis_thread;
struct bind_ep;

struct listener {
    /* identity and settings: immutable after registration */
    struct kvi_index *ix;
    uint64_t instance_id;
    char *instance_name;
    uint32_t instance;
    uint32_t dp_rank;
    char *endpoint, *replay_ep, *topic;
    size_t topic_len;
    bool exact;          /* bind mode: the topic must equal frame 0, not prefix it */
    uint8_t mode, policy;
    struct lis_thread *thr;
    struct kvi_listeners *lp;
    struct listener *next, *prev; /* registry list, newest first: pool->mu */
    struct listener *hnext;       /* registry hash chain by (ix, instance, dp_rank): pool->mu */
    struct kvi_khnode xnode;      /* bind mode, exact topic: in its bind_ep's topic hash, key = topic
                                   * (owner thread) */

    /* pool->mu */
    uint8_t state;
    char last_error[KVI_LISTEN_ERR_MAX];

    /* owner thread */
    struct lsock sub, dealer;
    struct lmon mon;     /* connect mode: the SUB's monitor */
    struct bind_ep *bind;
    bool draining;       /* messages are read and handled */
    bool subscribed;     /* bind mode: topic subscribed on the shared socket */
    bool replay_listed;  /* on the thread's replaying list */
    uint32_t warn_budget;
    bool ranks_warned;   /* the rank bound's warning was printed (once per registration) */
    uint32_t *ranks;     /* batch ranks other than dp_rank carried since the last clear: sorted,
                            unique, fewer than the pool's max_ranks when added (net/listener.h RANKS);
                            written under pool->mu (kvi_listeners_ranks reads them) */
    uint32_t n_ranks, cap_ranks;
    bool own_rank_seen;  /* a batch used dp_rank since the last clear: written under pool->mu */
    struct kvi_stream stream;
    struct kvi_ingest_target tgt;
    char tgt_name[96];
    uint64_t live_seq1;  /* seq + 1 of the live message being handled, 0 = none yet (mirror resets) */

    /* counters and published state: written by the owner thread (and writers: sink) */
    struct kvi_stream_ctr ctr;
    struct kvi_ingest_counters ictr;
    struct kvi_op_sink sink;
    _Atomic uint64_t pub_w1;     /* W + 1, 0 = unset */
    _Atomic uint64_t pub_l1;     /* L + 1, 0 = unset */
    _Atomic bool pub_replaying;
    _Atomic int32_t pub_peers;   /* connections up; 0 also with no SUB open; -1: SUB open, not monitored */
    _Atomic uint64_t pub_last_msg_ns; /* kvi_now_ns() of the last live message, 0 = none yet */
};

/* A message of an unknown topic held for the registration on_unknown announced. */
struct held_msg {
    zmq_msg_t fr[3]; /* topic, seq8, payload (moved out of the thread's frames) */
};

/* A bound SUB shared by the bind-mode registrations of one endpoint (thread-owned). */
struct bind_ep {
    char *endpoint;
    struct lsock sock;
    struct lmon mon;     /* the shared SUB's monitor (members' pub_peers) */
    bool bound;
    struct listener **members;
    size_t n, cap;
    /* how bind_match finds a member: the exact-topic members in a hash by topic (net/keyhash.h,
     * their xnode), the others (prefix topics) in pfx, scanned for the longest, last_hit tried first */
    struct kvi_khash xt;
    struct listener **pfx;
    size_t n_pfx, cap_pfx;
    struct listener *last_hit;
    struct bind_ep *next;
    /* kvi_listeners_bind_open: open without members, `prefix` subscribed, unknown topics offered to
     * on_unknown; the messages it accepts are held (oldest first, at most max_held) until a member
     * whose topic they match is added */
    bool held_open;
    char *prefix;
    size_t prefix_len;
    kvi_listener_unknown_fn on_unknown;
    void *ctx;
    struct held_msg *held;
    size_t n_held, max_held;
};

/* Control-side record of a bind endpoint (pool->mu). */
struct bind_reg {
    char *endpoint;
    struct lis_thread *thr;
    uint32_t refs;       /* members, plus one while open (kvi_listeners_bind_open until _bind_close) */
    bool open;
    struct bind_reg *next;
};

enum cmd_type { CMD_ADD, CMD_REMOVE, CMD_PAUSE, CMD_RESUME, CMD_GATE, CMD_STOP, CMD_SEED, CMD_BIND_OPEN, CMD_BIND_CLOSE };

struct cmd {
    uint8_t type;
    bool done;
    int rc;       /* CMD_SEED: 0 or -EBUSY */
    uint64_t arg; /* CMD_SEED: the watermark; CMD_BIND_OPEN: the struct bind_ep * (rc: 0 or -errno);
                     CMD_BIND_CLOSE: the endpoint (const char *) */
    struct listener *l;
    struct cmd *next;
};

struct lis_thread {
    struct kvi_listeners *lp;
    uint32_t idx;
    pthread_t tid;
    int epfd, evfd;
    struct lsock cmd_sock;

    /* t->mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct cmd *q_head, *q_tail;
    int start_rc; /* 1 while starting, then 0 or -errno */

    /* pool->mu */
    uint32_t load;

    /* owner thread */
    struct kvi_producer *prod;
    struct kvi_decoder *dec;
    bool stop;
    struct listener **ls;
    size_t n_ls, cap_ls;
    struct lsock **ready;
    size_t n_ready, cap_ready;
    struct lsock **snap; /* serve_ready's copy of the ready list */
    size_t cap_snap;
    struct listener **replaying;
    size_t n_replaying, cap_replaying;
    struct bind_ep *binds;
    zmq_msg_t fr[5];

    /* counters: owner thread writes */
    _Atomic uint64_t wakeups, messages, decode_ns, ingest_ns, busy_ns, unknown_topic, held_dropped;
    _Atomic uint32_t n_listeners, n_sockets;
};

struct kvi_listeners {
    struct kvi_writer_pool *writers;
    void *zctx;
    bool own_zctx;
    struct kvi_listeners_config cfg;
    _Atomic bool gate_open;
    pthread_mutex_t ctl; /* one control call at a time */
    pthread_mutex_t mu;  /* registry */
    struct listener *list;
    uint32_t n_list;
    struct listener **bucket; /* hash of the list by key; n_bucket a power of two (or 0) */
    uint32_t n_bucket;
    struct bind_reg *binds;
    struct kvi_listener_counters departed;
    uint64_t departed_unknown_topic;
    _Atomic uint32_t n_monitors; /* monitors open over all threads (the budget of cfg.monitors) */
    _Atomic uint32_t max_ranks;  /* distinct ranks per registration (cfg.max_ranks, then the setter):
                                    relaxed, a setting on its own */
    uint32_t n_threads;
    struct lis_thread *thr;
};

/* ---- shared between the two files ----------------------------------------- */

/** The callbacks a listener's stream uses (listener.c). */
extern const struct kvi_stream_ops kvi_lis__stream_ops;

/** Start listener thread @p idx of @p lp and wait until it is ready. @return 0 or -errno. */
int kvi_lis__thread_start(struct kvi_listeners *lp, struct lis_thread *t, uint32_t idx);

/** Free what kvi_lis__thread_start set up (after the thread exited or failed to start). */
void kvi_lis__thread_cleanup(struct lis_thread *t);

/** Queue a command on thread @p t and wait until it ran (control side). */
void kvi_lis__call(struct lis_thread *t, uint8_t type, struct listener *l);

/** kvi_lis__call with an argument. @return the command's rc. */
int kvi_lis__call_arg(struct lis_thread *t, uint8_t type, struct listener *l, uint64_t arg);

/** Seed W := @p w and publish it (W and the sink's applied position). Owner thread, or before CMD_ADD. */
void kvi_lis__seed(struct listener *l, uint64_t w);

/** strdup that aborts on out-of-memory (control plane). */
char *kvi_lis__strdup(const char *s);

#endif
