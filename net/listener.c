/*
 * ZMQ event listeners: the listener threads, their sockets and commands
 * (net/listener.h; the pool and registry are in net/listener_registry.c).
 *
 * DESIGN
 *   Threads. A pool runs N listener threads. Each owns: an epoll set, an
 *   eventfd for commands, a kvi_producer on the writer pool, a kvi_decoder,
 *   the ZMQ sockets of the registrations it serves, and those
 *   registrations' streams (net/replay.h). Nothing a thread owns is touched
 *   by another thread, except counters (relaxed single-writer atomics) and
 *   the registry fields marked "pool->mu" below.
 *
 *   Polling. The epoll set holds each socket's ZMQ_FD. That fd only says
 *   that the socket's state may have changed (libzmq signals commands, not
 *   messages), so a socket is served from a ready list: it joins the list
 *   when its fd fires and after every send on it, and it leaves the list
 *   only once a receive returned EAGAIN (at most `budget` messages per
 *   socket per turn, so one busy engine cannot starve the others). A wake-up
 *   costs O(sockets that fired); zmq_poll would cost O(sockets) per call
 *   (measured on this machine: 214 us for 500 idle SUB sockets, 410 ns of
 *   ZMQ_EVENTS each), which 1,000 mostly idle registrations cannot afford.
 *
 *   Commands. register / unregister / pause / resume / open_gate take
 *   pool->ctl (one control call at a time), queue a command on the target
 *   thread (t->mu), write its eventfd and wait on t->cv until the thread has
 *   executed it. The thread runs commands after serving its ready sockets in
 *   each turn, so a socket or listener freed by a command is never on the
 *   ready list or in an unprocessed epoll event.
 *
 *   Open bind endpoints (kvi_listeners_bind_open). CMD_BIND_OPEN hands the
 *   thread a bind_ep marked held_open: it is bound and its prefix subscribed
 *   like a member's topic, and it survives its last member (freed at
 *   CMD_STOP, or by CMD_BIND_CLOSE, which clears held_open and frees it now
 *   when memberless, else with its last member). An unmatched message goes to on_unknown (bind_hold); one it
 *   accepts is moved out of t->fr into the endpoint's held array (oldest
 *   first, bounded), and exec_add hands a new member the held messages it
 *   matches (bind_release_held) right after lis_start, before the thread
 *   reads the socket again: they come before anything that follows them.
 *
 *   Monitors (liveness, net/listener.h). When a SUB opens (a connect-mode
 *   listener's, or a bind endpoint's shared one), the thread attaches a
 *   connection monitor, within the pool's budget (pool->n_monitors, a
 *   relaxed counter shared by the threads: a budget, not a hand-over):
 *   zmq_socket_monitor makes the SUB publish its connection events on a
 *   fresh inproc address, and a PAIR of the thread's, connected to it, sits
 *   in the epoll set like any socket (SK_MON, served from the ready list).
 *   Before the SUB connects or binds, so no event is missed. The thread
 *   keeps the descriptors of the connections that are up (struct lmon) and
 *   publishes their number in each listener's pub_peers; closing the SUB
 *   closes its monitor.
 *
 *   Published state. Counters, watermarks, pub_peers and pub_last_msg_ns
 *   are single-writer relaxed atomics: a snapshot (fill_info) reads each on
 *   its own and needs no order between them, nor with anything else.
 *
 *   Logging. Stream events (net/replay.h kvi_stream_ops.note) and socket
 *   trouble go to net/log.h through lis_log, which applies the listener's
 *   budget and the pool's quiet flag. The rank bound's warning (RANKS in
 *   net/listener.h) is printed once per registration outside the budget.
 *
 *   Ranks. Each listener keeps the ranks its batches named since the last
 *   clear (a sorted array, owner thread, grown once per new rank and never
 *   past the pool's max_ranks), so a restart clears every one of them. The
 *   owner thread changes the set (and own_rank_seen) under pool->mu, once per
 *   new rank or clear, so that kvi_listeners_ranks can read it. The
 *   bound itself is pool->max_ranks, a relaxed atomic read per new rank:
 *   the setter hands over a number, nothing else.
 *
 *   Ordering. Each listener's batches are decoded and ingested on its
 *   thread in seq order (the stream's rules), through the thread's producer:
 *   sticky routing then keeps every worker's ops in order on its writer.
 *
 *   Shutdown. destroy unregisters every listener (each flushes the thread's
 *   producer), stops the threads (which destroy their producers and
 *   decoders), then terminates the ZMQ context.
 *
 *   Lock order: pool->ctl, then pool->mu or t->mu (never both of the last two).
 */
#include "net/listener_internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/common.h"
#include "net/log.h"
#include "net/msgpack_wire.h"

#define MAX_EVENTS 64

/* ---- small helpers -------------------------------------------------------- */

char *kvi_lis__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = kvi_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

#define CTR(l, field, v) kvi_relaxed_add(&(l)->ctr.field, (uint64_t)(v))
#define TCTR(t, field, v) kvi_relaxed_add(&(t)->field, (uint64_t)(v))

/*
 * One log line of listener @p l: "listener instance 7 rank 0: <message>".
 * Owner thread. Nothing under `quiet`, below the log level, or once the
 * listener's budget is spent: warnings and errors each take one, info and
 * debug lines print while some remain. The last line says so.
 */
__attribute__((format(printf, 3, 4))) static void lis_log(struct listener *l, enum kvi_log_level level,
                                                          const char *fmt, ...);

static void lis_log(struct listener *l, enum kvi_log_level level, const char *fmt, ...)
{
    if (l->lp->cfg.quiet || l->warn_budget == 0 || !kvi_log_enabled(level))
        return;
    if (level <= KVI_LOG_WARN)
        l->warn_budget--;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvi_log(level, "listener %s: %s%s", l->tgt_name, msg,
            l->warn_budget == 0 ? " (further lines of this listener suppressed)" : "");
}

const char *kvi_listener_state_name(enum kvi_listener_state s)
{
    static const char *const names[] = {"pending", "active", "paused", "failed"};
    return (unsigned)s < KVI_LISTENER_STATES ? names[s] : "unknown";
}

/* Set state (and last_error when err != NULL) under pool->mu. */
__attribute__((format(printf, 3, 4))) static void set_state(struct listener *l, uint8_t state, const char *err, ...);

static void set_state(struct listener *l, uint8_t state, const char *err, ...)
{
    pthread_mutex_lock(&l->lp->mu);
    l->state = state;
    if (err != NULL) {
        va_list ap;
        va_start(ap, err);
        vsnprintf(l->last_error, sizeof l->last_error, err, ap);
        va_end(ap);
    } else if (state != KVI_LISTENER_FAILED) {
        l->last_error[0] = '\0';
    }
    pthread_mutex_unlock(&l->lp->mu);
}

static void publish_wm(struct listener *l)
{
    const struct kvi_wm *wm = &l->stream.wm;
    atomic_store_explicit(&l->pub_w1, wm->w_set ? wm->w + 1 : 0, memory_order_relaxed);
    atomic_store_explicit(&l->pub_l1, wm->l_set ? wm->l + 1 : 0, memory_order_relaxed);
}

void kvi_lis__seed(struct listener *l, uint64_t w)
{
    kvi_wm_seed(&l->stream.wm, w);
    publish_wm(l);
    kvi_op_sink_set_applied(&l->sink, w + 1); /* the index holds batches up to w */
}

/* ---- sockets -------------------------------------------------------------- */

static void set_ready(struct lis_thread *t, struct lsock *s)
{
    if (s->ready || s->zs == NULL)
        return;
    if (t->n_ready == t->cap_ready) {
        t->cap_ready = t->cap_ready ? t->cap_ready * 2 : 64;
        t->ready = kvi_xrealloc(t->ready, t->cap_ready * sizeof *t->ready);
    }
    t->ready[t->n_ready++] = s;
    s->ready = true;
}

static void unset_ready(struct lis_thread *t, struct lsock *s)
{
    if (!s->ready)
        return;
    for (size_t i = 0; i < t->n_ready; i++)
        if (t->ready[i] == s) {
            t->ready[i] = t->ready[--t->n_ready];
            break;
        }
    s->ready = false;
}

static int sock_poll(struct lis_thread *t, struct lsock *s)
{
    if (s->polled)
        return 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, s->fd, &ev) != 0)
        return -errno;
    s->polled = true;
    set_ready(t, s); /* messages may be queued already: the fd does not say so */
    return 0;
}

static void mon_close(struct lis_thread *t, struct lmon *m);
static void mon_publish(struct lsock *target);

/* Close @p s (and its monitor); a SUB's listeners then report no connection. */
static void sock_close(struct lis_thread *t, struct lsock *s)
{
    if (s->zs == NULL)
        return;
    if (s->mon != NULL) {
        /* Stop it first: a SUB closed with its monitor on is never freed by libzmq (measured:
         * every descriptor of 1,000 such SUBs and monitors stayed open) */
        if (s->mon->sock.zs != NULL)
            zmq_socket_monitor(s->zs, NULL, 0);
        mon_close(t, s->mon);
        s->mon = NULL;
    }
    unset_ready(t, s);
    if (s->polled)
        epoll_ctl(t->epfd, EPOLL_CTL_DEL, s->fd, NULL);
    s->polled = false;
    zmq_close(s->zs);
    s->zs = NULL;
    atomic_fetch_sub_explicit(&t->n_sockets, 1, memory_order_relaxed);
    if (s->kind == SK_SUB || s->kind == SK_BIND)
        mon_publish(s);
}

static void setopt_int(void *zs, int opt, int v)
{
    zmq_setsockopt(zs, opt, &v, sizeof v);
}

/* Create a socket with the options of wire-protocol.md §1.6. */
static int sock_open(struct lis_thread *t, struct lsock *s, int type, uint8_t kind, void *owner)
{
    s->zs = zmq_socket(t->lp->zctx, type);
    if (s->zs == NULL)
        return -errno;
    s->kind = kind;
    s->owner = owner;
    s->ready = s->polled = false;
    s->mon = NULL;
    atomic_fetch_add_explicit(&t->n_sockets, 1, memory_order_relaxed);
    setopt_int(s->zs, ZMQ_LINGER, 0);
    setopt_int(s->zs, ZMQ_RECONNECT_IVL, 100);
    setopt_int(s->zs, ZMQ_RECONNECT_IVL_MAX, 5000);
    setopt_int(s->zs, ZMQ_TCP_KEEPALIVE, 1);
    setopt_int(s->zs, ZMQ_HEARTBEAT_IVL, 5000);
    setopt_int(s->zs, ZMQ_HEARTBEAT_TIMEOUT, 15000);
    setopt_int(s->zs, ZMQ_HEARTBEAT_TTL, 15000);
    setopt_int(s->zs, ZMQ_RCVTIMEO, 100);
    if (type == ZMQ_DEALER) {
        setopt_int(s->zs, ZMQ_SNDTIMEO, 0);
        setopt_int(s->zs, ZMQ_RCVHWM, 0); /* a ROUTER drops replies when the pipe fills (§7.4) */
    } else {
        int hwm = t->lp->cfg.sub_hwm;
        setopt_int(s->zs, ZMQ_RCVHWM, hwm < 0 ? 0 : hwm);
    }
    size_t fdlen = sizeof s->fd;
    if (zmq_getsockopt(s->zs, ZMQ_FD, &s->fd, &fdlen) != 0) {
        int e = errno;
        sock_close(t, s);
        return -e;
    }
    return 0;
}

/* ---- connection monitors (thread side) ------------------------------------- */

#define MON_EVENTS (ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED)

static _Atomic uint64_t mon_seq; /* inproc address suffix: unique in the process, never reused */

/* The most monitors the pool may hold now (cfg.monitors, or RLIMIT_NOFILE / 8). */
static uint32_t mon_budget(const struct kvi_listeners *lp)
{
    if (lp->cfg.monitors != 0)
        return lp->cfg.monitors < 0 ? 0 : (uint32_t)lp->cfg.monitors;
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur / 8 >= UINT32_MAX)
        return UINT32_MAX;
    return (uint32_t)(rl.rlim_cur / 8);
}

/* What @p target's listeners report: its connections up, 0 when closed, -1 when open unmonitored. */
static int32_t mon_value(const struct lsock *target)
{
    if (target->zs == NULL)
        return 0;
    if (target->mon == NULL || target->mon->sock.zs == NULL)
        return -1;
    return (int32_t)target->mon->n_up;
}

/* Publish @p target's value to its listener (SUB) or to every subscribed member (BIND). */
static void mon_publish(struct lsock *target)
{
    int32_t v = mon_value(target);
    if (target->kind == SK_SUB) {
        struct listener *l = target->owner;
        atomic_store_explicit(&l->pub_peers, v, memory_order_relaxed); /* relaxed: see DESIGN */
    } else if (target->kind == SK_BIND) {
        struct bind_ep *b = target->owner;
        for (size_t i = 0; i < b->n; i++)
            atomic_store_explicit(&b->members[i]->pub_peers, b->members[i]->subscribed ? v : 0,
                                  memory_order_relaxed);
    }
}

/*
 * Attach a monitor to the SUB @p target, just opened and not yet connected or
 * bound. Without one (budget spent, or a ZMQ error) the listeners report
 * connected as unknown. @return whether @p target is monitored.
 */
static bool mon_open(struct lis_thread *t, struct lmon *m, struct lsock *target)
{
    struct kvi_listeners *lp = t->lp;
    if (atomic_fetch_add_explicit(&lp->n_monitors, 1, memory_order_relaxed) >= mon_budget(lp)) {
        atomic_fetch_sub_explicit(&lp->n_monitors, 1, memory_order_relaxed);
        mon_publish(target);
        return false;
    }
    char addr[64];
    snprintf(addr, sizeof addr, "inproc://kvidx-listener-monitor-%llu",
             (unsigned long long)atomic_fetch_add_explicit(&mon_seq, 1, memory_order_relaxed));
    struct lsock *s = &m->sock;
    *s = (struct lsock){.kind = SK_MON, .owner = m};
    m->target = target;
    m->n_up = 0;
    int rc = 0;
    if (zmq_socket_monitor(target->zs, addr, MON_EVENTS) != 0 || (s->zs = zmq_socket(lp->zctx, ZMQ_PAIR)) == NULL) {
        rc = -errno;
    } else {
        atomic_fetch_add_explicit(&t->n_sockets, 1, memory_order_relaxed);
        setopt_int(s->zs, ZMQ_LINGER, 0);
        setopt_int(s->zs, ZMQ_RCVHWM, 0); /* the SUB side drops events when its pipe fills: never fill ours */
        size_t fdlen = sizeof s->fd;
        if (zmq_connect(s->zs, addr) != 0 || zmq_getsockopt(s->zs, ZMQ_FD, &s->fd, &fdlen) != 0)
            rc = -errno;
        else
            rc = sock_poll(t, s);
    }
    if (rc != 0) {
        zmq_socket_monitor(target->zs, NULL, 0);
        sock_close(t, s);
        atomic_fetch_sub_explicit(&lp->n_monitors, 1, memory_order_relaxed);
        if (!lp->cfg.quiet)
            kvi_log_warn("listener thread %u: no connection monitor (%s): connected unknown", t->idx,
                         zmq_strerror(-rc));
        mon_publish(target);
        return false;
    }
    target->mon = m;
    mon_publish(target);
    return true;
}

/* Close @p m's PAIR (the SUB's side goes with the SUB, or was stopped) and forget its connections. */
static void mon_close(struct lis_thread *t, struct lmon *m)
{
    if (m->sock.zs != NULL) {
        sock_close(t, &m->sock);
        atomic_fetch_sub_explicit(&t->lp->n_monitors, 1, memory_order_relaxed);
    }
    free(m->up);
    m->up = NULL;
    m->n_up = m->cap_up = 0;
}

/* One event: a connection of descriptor @p fd came up or went away. */
static void mon_event(struct lmon *m, uint16_t ev, int fd)
{
    uint32_t i = 0;
    while (i < m->n_up && m->up[i] != fd)
        i++;
    if (ev & (ZMQ_EVENT_CONNECTED | ZMQ_EVENT_ACCEPTED)) {
        if (i < m->n_up)
            return;
        if (m->n_up == m->cap_up) {
            m->cap_up = m->cap_up ? m->cap_up * 2 : 4;
            m->up = kvi_xrealloc(m->up, m->cap_up * sizeof *m->up);
        }
        m->up[m->n_up++] = fd;
    } else if (ev & (ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED)) {
        if (i < m->n_up)
            m->up[i] = m->up[--m->n_up];
    }
}

/* Handle what the monitor PAIR received (nf frames in t->fr, or -errno). @return false once it is closed. */
static bool mon_serve(struct lis_thread *t, struct lmon *m, int nf)
{
    struct lsock *target = m->target;
    if (nf < 0) {
        /* Stop the SUB's side too; its listeners report connected as unknown from now on. */
        zmq_socket_monitor(target->zs, NULL, 0);
        mon_close(t, m);
        if (!t->lp->cfg.quiet)
            kvi_log_warn("listener thread %u: connection monitor failed (%s): connected unknown", t->idx,
                         zmq_strerror(-nf));
        mon_publish(target);
        return false;
    }
    if (zmq_msg_size(&t->fr[0]) == 6) { /* [u16 event, u32 value] in host order, then the address */
        const uint8_t *d = zmq_msg_data(&t->fr[0]);
        uint16_t ev;
        uint32_t val;
        memcpy(&ev, d, sizeof ev);
        memcpy(&val, d + 2, sizeof val);
        mon_event(m, ev, (int)val);
        mon_publish(target);
    }
    return true;
}

/* ---- bind endpoints (thread side) ----------------------------------------- */

static struct bind_ep *bind_find(struct lis_thread *t, const char *ep)
{
    for (struct bind_ep *b = t->binds; b != NULL; b = b->next)
        if (strcmp(b->endpoint, ep) == 0)
            return b;
    return NULL;
}

/* Open and bind the shared socket if it is not bound. @return 0 or -errno. */
static int bind_ensure(struct lis_thread *t, struct bind_ep *b)
{
    if (b->bound)
        return 0;
    int rc = sock_open(t, &b->sock, ZMQ_SUB, SK_BIND, b);
    if (rc == 0)
        mon_open(t, &b->mon, &b->sock);
    if (rc == 0 && zmq_bind(b->sock.zs, b->endpoint) != 0)
        rc = -errno;
    if (rc != 0) {
        sock_close(t, &b->sock);
        return rc;
    }
    b->bound = true;
    if (atomic_load_explicit(&t->lp->gate_open, memory_order_acquire))
        sock_poll(t, &b->sock);
    return 0;
}

static void held_free(struct held_msg *h)
{
    for (int i = 0; i < 3; i++)
        zmq_msg_close(&h->fr[i]);
}

/* Close and unlink @p b and free it with what it holds. */
static void bind_free(struct lis_thread *t, struct bind_ep *b)
{
    sock_close(t, &b->sock);
    for (struct bind_ep **pp = &t->binds; *pp != NULL; pp = &(*pp)->next)
        if (*pp == b) {
            *pp = b->next;
            break;
        }
    for (size_t i = 0; i < b->n_held; i++)
        held_free(&b->held[i]);
    free(b->held);
    free(b->members);
    kvi_khash_fini(&b->xt);
    free(b->pfx);
    free(b->prefix);
    free(b->endpoint);
    free(b);
}

/* ---- a bind endpoint's members by topic (owner thread) ---- */

/* Add member @p l to the exact-topic hash (l->exact) or the prefix list. */
static void members_index(struct bind_ep *b, struct listener *l)
{
    if (!l->exact) {
        if (b->n_pfx == b->cap_pfx) {
            b->cap_pfx = b->cap_pfx ? 2 * b->cap_pfx : 8;
            b->pfx = kvi_xrealloc(b->pfx, b->cap_pfx * sizeof *b->pfx);
        }
        b->pfx[b->n_pfx++] = l;
        return;
    }
    l->xnode.key = l->topic;
    l->xnode.len = l->topic_len;
    kvi_khash_add(&b->xt, &l->xnode);
}

static void members_unindex(struct bind_ep *b, struct listener *l)
{
    if (!l->exact) {
        for (size_t i = 0; i < b->n_pfx; i++)
            if (b->pfx[i] == l) {
                b->pfx[i] = b->pfx[--b->n_pfx];
                break;
            }
        return;
    }
    kvi_khash_del(&b->xt, &l->xnode);
}

static void bind_remove_member(struct lis_thread *t, struct bind_ep *b, struct listener *l)
{
    for (size_t i = 0; i < b->n; i++)
        if (b->members[i] == l) {
            b->members[i] = b->members[--b->n];
            break;
        }
    members_unindex(b, l);
    if (b->last_hit == l)
        b->last_hit = NULL;
    if (b->n > 0 || b->held_open)
        return;
    bind_free(t, b);
}

/*
 * The member whose topic is the longest prefix of @p topic (an exact
 * member's only when equal), or NULL. An exact member equal to the topic is
 * found by one hash probe and wins: no prefix member can be longer, and
 * none is as long (a topic is registered once per endpoint). The prefix
 * members are scanned, last_hit first.
 */
static struct listener *bind_match(struct bind_ep *b, const void *topic, size_t len)
{
    struct kvi_khnode *x = kvi_khash_find(&b->xt, topic, len);
    if (x != NULL)
        return (struct listener *)((char *)x - offsetof(struct listener, xnode));
    struct listener *h = b->last_hit;
    struct listener *best = NULL;
    if (h != NULL && h->topic_len <= len && memcmp(h->topic, topic, h->topic_len) == 0) {
        best = h;
        if (b->n_pfx == 1)
            return best;
    }
    for (size_t i = 0; i < b->n_pfx; i++) {
        struct listener *m = b->pfx[i];
        if (m->topic_len <= len && (best == NULL || m->topic_len > best->topic_len) &&
            memcmp(m->topic, topic, m->topic_len) == 0)
            best = m;
    }
    b->last_hit = best;
    return best;
}

/* ---- stream callbacks ----------------------------------------------------- */

/*
 * Admit rank @p r for a batch of @p l (net/listener.h RANKS): the registered
 * rank and ranks already carried always; a new one joins the sorted set
 * while the registration holds fewer than max_ranks (the registered rank
 * included), else it is refused. Owner thread; allocates once per new rank.
 * @return whether the batch may be ingested.
 */
static bool admit_rank(struct listener *l, uint32_t r)
{
    if (r == l->dp_rank)
        return true;
    uint32_t lo = kvi_lower_bound_u32(l->ranks, l->n_ranks, r);
    if (lo < l->n_ranks && l->ranks[lo] == r)
        return true;
    /* relaxed: a setting read on its own (kvi_listeners_set_max_ranks) */
    uint32_t max = atomic_load_explicit(&l->lp->max_ranks, memory_order_relaxed);
    if ((uint64_t)l->n_ranks + 1 >= max)
        return false;
    pthread_mutex_lock(&l->lp->mu); /* kvi_listeners_ranks reads the set */
    if (l->n_ranks == l->cap_ranks) {
        l->cap_ranks = l->cap_ranks ? l->cap_ranks * 2 : 8;
        l->ranks = kvi_xrealloc(l->ranks, l->cap_ranks * sizeof *l->ranks);
    }
    memmove(l->ranks + lo + 1, l->ranks + lo, (l->n_ranks - lo) * sizeof *l->ranks);
    l->ranks[lo] = r;
    l->n_ranks++;
    pthread_mutex_unlock(&l->lp->mu);
    return true;
}

static int cb_apply(void *ctx, uint64_t seq, const void *buf, size_t len)
{
    struct listener *l = ctx;
    struct lis_thread *t = l->thr;
    bool timing = l->lp->cfg.timing;
    uint64_t t0 = timing ? kvi_now_ns() : 0;
    struct kvi_batch b;
    int rc = kvi_decode_batch(t->dec, buf, len, &b);
    uint64_t t1 = timing ? kvi_now_ns() : 0;
    if (timing)
        TCTR(t, decode_ns, t1 - t0);
    if (rc != 0) {
        lis_log(l, KVI_LOG_WARN, "batch %llu dropped: %s", (unsigned long long)seq, kvi_decoder_error_str(t->dec));
        kvi_decoder_trim(t->dec); /* a huge bad frame must not pin its scratch */
        return -EBADMSG;
    }
    if (b.has_dp_rank && !admit_rank(l, b.dp_rank)) {
        CTR(l, ranks_dropped, 1);
        if (!l->ranks_warned && !l->lp->cfg.quiet) /* once per registration, outside the budget */
            kvi_log_warn("listener %s: batch %llu names dp rank %d, beyond the %u distinct ranks a registration "
                         "may hold: dropped (further batches of new ranks are dropped and counted in "
                         "ranks_dropped without a warning)",
                         l->tgt_name, (unsigned long long)seq, (int32_t)b.dp_rank,
                         atomic_load_explicit(&l->lp->max_ranks, memory_order_relaxed));
        l->ranks_warned = true;
        kvi_decoder_trim(t->dec);
        return KVI_STREAM_SKIPPED;
    }
    if (!l->own_rank_seen && (!b.has_dp_rank || b.dp_rank == l->dp_rank)) {
        pthread_mutex_lock(&l->lp->mu); /* once per clear */
        l->own_rank_seen = true;
        pthread_mutex_unlock(&l->lp->mu);
    }
    /* the ops publish W + 1 (before this batch), the batch's last one seq + 1 */
    l->tgt.applied1 = kvi_wm_next(&l->stream.wm);
    l->tgt.applied1_end = seq + 1;
    l->tgt.mirror_pos.seq = seq;
    if (l->tgt.mirror != NULL) /* the same bytes on every replica, others after an engine restart */
        l->tgt.mirror_pos.tag = XXH3_64bits(buf, len);
    kvi_ingest_batch(&l->tgt, &b, t->prod);
    kvi_decoder_trim(t->dec); /* the ops own copies: the events are consumed */
    if (timing)
        TCTR(t, ingest_ns, kvi_now_ns() - t1);
    return 0;
}

/* Publisher restart or clear policy: the rank's state (and any rank its batches named) is gone. */
static void cb_clear(void *ctx)
{
    struct listener *l = ctx;
    l->tgt.applied1 = kvi_wm_next(&l->stream.wm); /* after a restart: W unset, 0 */
    /* a mirrored reset: at the live seq being handled (net/ingest.h) */
    l->tgt.mirror_pos.seq = l->live_seq1 > 0 ? l->live_seq1 - 1 : 0;
    l->tgt.mirror_pos.idx = 0;
    kvi_ingest_reset_rank(&l->tgt, l->dp_rank, l->thr->prod);
    for (uint32_t i = 0; i < l->n_ranks; i++) {
        l->tgt.mirror_pos.idx = i + 1;
        kvi_ingest_reset_rank(&l->tgt, l->ranks[i], l->thr->prod);
    }
    pthread_mutex_lock(&l->lp->mu);
    l->n_ranks = 0;
    l->own_rank_seen = false;
    pthread_mutex_unlock(&l->lp->mu);
}

static int dealer_open(struct listener *l)
{
    struct lis_thread *t = l->thr;
    int rc = sock_open(t, &l->dealer, ZMQ_DEALER, SK_DEALER, l);
    if (rc == 0 && zmq_connect(l->dealer.zs, l->replay_ep) != 0)
        rc = -errno;
    if (rc == 0)
        rc = sock_poll(t, &l->dealer);
    if (rc != 0) {
        sock_close(t, &l->dealer);
        lis_log(l, KVI_LOG_WARN, "failed to connect replay DEALER to %s: %s", l->replay_ep, zmq_strerror(-rc));
    }
    return rc;
}

static int cb_request(void *ctx, uint64_t from)
{
    struct listener *l = ctx;
    if (l->dealer.zs == NULL) {
        int rc = dealer_open(l);
        if (rc != 0)
            return rc;
    }
    uint8_t seq[8];
    kvi_store_be64(seq, from);
    int rc = 0;
    if (zmq_send(l->dealer.zs, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) != 0 ||
        zmq_send(l->dealer.zs, seq, 8, ZMQ_DONTWAIT) != 8)
        rc = -errno;
    set_ready(l->thr, &l->dealer); /* a send may leave the socket readable without an fd event */
    if (rc != 0)
        lis_log(l, KVI_LOG_WARN, "replay request from seq %llu failed: %s", (unsigned long long)from,
                zmq_strerror(-rc));
    return rc;
}

/* Close the DEALER; the next request opens a fresh one, so late replies are never read. */
static void cb_reset_dealer(void *ctx)
{
    struct listener *l = ctx;
    sock_close(l->thr, &l->dealer);
}

/* A stream event worth a log line (net/replay.h), at the level it deserves. */
static void cb_note(void *ctx, const struct kvi_stream_note *n)
{
    struct listener *l = ctx;
    const struct kvi_wm *wm = &l->stream.wm;
    unsigned long long exp = n->expected, seq = n->seq, lost = n->lost, batches = n->batches;
    double ms = (double)n->ns / 1e6;
    char w[32] = "unset";
    if (wm->w_set)
        snprintf(w, sizeof w, "%llu", (unsigned long long)wm->w);
    const char *cleared = n->cleared ? "; rank cleared (gap policy clear)" : "";
    switch (n->type) {
    case KVI_NOTE_GAP:
        if (!wm->w_set) /* nothing applied yet: a join, not a loss */
            lis_log(l, KVI_LOG_INFO, "joined the stream at seq %llu with nothing applied yet: replaying from seq %llu",
                    seq, exp);
        else
            lis_log(l, KVI_LOG_WARN, "gap detected: expected seq %llu, got seq %llu (%llu batches missing)", exp, seq,
                    seq - exp);
        break;
    case KVI_NOTE_LOSS:
        if (!wm->w_set && exp == 0)
            lis_log(l, KVI_LOG_WARN, "joined the stream at seq %llu and no replay endpoint: %llu earlier batches not "
                    "indexed", seq, lost);
        else
            lis_log(l, KVI_LOG_WARN, "gap detected: expected seq %llu, got seq %llu; no replay endpoint: %llu "
                    "batches lost%s", exp, seq, lost, cleared);
        break;
    case KVI_NOTE_RESTART:
        lis_log(l, KVI_LOG_WARN, "publisher restart detected: seq went back from %llu to %llu%s; rank cleared", exp,
                seq, n->in_replay ? " during a replay (the replay and its buffered batches dropped)" : "");
        break;
    case KVI_NOTE_REQUEST:
        if (n->retry == 0)
            lis_log(l, KVI_LOG_INFO, "replay requested from seq %llu (%s)", exp, l->replay_ep);
        else
            lis_log(l, KVI_LOG_INFO, "replay re-requested from seq %llu after missing replies (retry %u of %u)", exp,
                    n->retry, l->lp->cfg.replay_retries);
        break;
    case KVI_NOTE_REPLAY_DONE:
        lis_log(l, KVI_LOG_INFO, "replay from seq %llu done: %llu batches replayed in %.1f ms; watermark %s", exp,
                batches, ms, w);
        break;
    case KVI_NOTE_GIVEN_UP:
        lis_log(l, KVI_LOG_ERROR, "replay from seq %llu (%s) given up, %s, after %.1f ms: %llu batches replayed, "
                "%llu lost%s; watermark %s", exp, l->replay_ep, n->why, ms, batches, lost, cleared, w);
        break;
    case KVI_NOTE_OVERRUN:
        lis_log(l, KVI_LOG_WARN, "replay answered from seq %llu, past the requested seq %llu (engine buffer "
                "overrun): %llu batches lost%s", seq, exp, lost, cleared);
        break;
    case KVI_NOTE_IMPLAUSIBLE:
        lis_log(l, KVI_LOG_WARN, "live seq %llu jumps more than 2^32 past seq %llu: forged or corrupt, dropped "
                "(watermarks unchanged)", seq, exp);
        break;
    case KVI_NOTE_RESYNC:
        lis_log(l, KVI_LOG_WARN, "%u implausible seqs in a row up to %llu (last good seq %llu): taken for a "
                "publisher restart%s; rank cleared, stream restarted at seq %llu", KVI_WM_RESYNC_RUN, seq, exp,
                n->in_replay ? " during a replay (the replay and its buffered batches dropped)" : "", seq);
        break;
    }
}

const struct kvi_stream_ops kvi_lis__stream_ops = {
    .apply = cb_apply,
    .clear = cb_clear,
    .request = cb_request,
    .reset_dealer = cb_reset_dealer,
    .note = cb_note,
};

/* Keep the thread's list of replaying listeners (for deadlines) in step with the stream. */
static void after_stream(struct listener *l)
{
    struct lis_thread *t = l->thr;
    bool r = kvi_stream_replaying(&l->stream);
    publish_wm(l);
    if (r == l->replay_listed)
        return;
    atomic_store_explicit(&l->pub_replaying, r, memory_order_relaxed);
    l->replay_listed = r;
    if (r) {
        if (t->n_replaying == t->cap_replaying) {
            t->cap_replaying = t->cap_replaying ? t->cap_replaying * 2 : 16;
            t->replaying = kvi_xrealloc(t->replaying, t->cap_replaying * sizeof *t->replaying);
        }
        t->replaying[t->n_replaying++] = l;
    } else {
        for (size_t i = 0; i < t->n_replaying; i++)
            if (t->replaying[i] == l) {
                t->replaying[i] = t->replaying[--t->n_replaying];
                break;
            }
    }
}

/* ---- listener activation (thread side) ------------------------------------ */

/* Close every socket of @p l and stop reading; the stream keeps its watermarks. */
static void lis_stop(struct listener *l)
{
    struct lis_thread *t = l->thr;
    l->draining = false;
    sock_close(t, &l->sub);
    sock_close(t, &l->dealer);
    if (l->bind != NULL && l->subscribed) {
        if (l->bind->sock.zs != NULL)
            zmq_setsockopt(l->bind->sock.zs, ZMQ_UNSUBSCRIBE, l->topic, l->topic_len);
        l->subscribed = false;
        atomic_store_explicit(&l->pub_peers, 0, memory_order_relaxed); /* relaxed: DESIGN */
    }
    kvi_stream_abort(&l->stream);
    after_stream(l);
}

static void lis_fail(struct listener *l, const char *what, int err)
{
    lis_stop(l);
    set_state(l, KVI_LISTENER_FAILED, "%s: %s", what, zmq_strerror(err));
    lis_log(l, KVI_LOG_ERROR, "%s: %s", what, zmq_strerror(err));
}

/* Open the sockets; drain them when the gate is open. Sets the state. */
static void lis_start(struct listener *l)
{
    struct lis_thread *t = l->thr;
    bool open = atomic_load_explicit(&l->lp->gate_open, memory_order_acquire);
    if (l->mode == KVI_LISTEN_CONNECT) {
        if (l->sub.zs == NULL) {
            int rc = sock_open(t, &l->sub, ZMQ_SUB, SK_SUB, l);
            if (rc == 0)
                mon_open(t, &l->mon, &l->sub);
            if (rc == 0 && zmq_setsockopt(l->sub.zs, ZMQ_SUBSCRIBE, l->topic, l->topic_len) != 0)
                rc = -errno;
            if (rc == 0 && zmq_connect(l->sub.zs, l->endpoint) != 0)
                rc = -errno;
            if (rc != 0) {
                char what[KVI_LISTEN_EP_MAX + 64];
                snprintf(what, sizeof what, "failed to connect ZMQ SUB socket to %s", l->endpoint);
                lis_fail(l, what, -rc);
                return;
            }
        }
        int rc = open ? sock_poll(t, &l->sub) : 0;
        if (rc != 0) {
            lis_fail(l, "epoll_ctl failed", -rc);
            return;
        }
    } else {
        struct bind_ep *b = l->bind;
        int rc = bind_ensure(t, b);
        if (rc != 0) {
            char what[KVI_LISTEN_EP_MAX + 64];
            snprintf(what, sizeof what, "failed to bind ZMQ SUB socket to %s", l->endpoint);
            lis_fail(l, what, -rc);
            return;
        }
        if (!l->subscribed) {
            if (zmq_setsockopt(b->sock.zs, ZMQ_SUBSCRIBE, l->topic, l->topic_len) != 0) {
                lis_fail(l, "ZMQ_SUBSCRIBE failed", errno);
                return;
            }
            l->subscribed = true;
        }
        atomic_store_explicit(&l->pub_peers, mon_value(&b->sock), memory_order_relaxed); /* relaxed: DESIGN */
    }
    l->draining = open;
    set_state(l, open ? KVI_LISTENER_ACTIVE : KVI_LISTENER_PENDING, NULL);
}

/* ---- message handling ----------------------------------------------------- */

/*
 * Receive one multipart message into t->fr (frames past the 5th are
 * received into fr[4] and discarded). @return the frame count, 0 when
 * nothing is queued, or -errno.
 */
static int recv_frames(struct lis_thread *t, void *zs)
{
    for (;;) {
        if (zmq_msg_recv(&t->fr[0], zs, ZMQ_DONTWAIT) >= 0)
            break;
        if (errno == EAGAIN)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
    int n = 1;
    while (zmq_msg_more(&t->fr[n < 5 ? n - 1 : 4])) {
        zmq_msg_t *m = &t->fr[n < 5 ? n : 4];
        if (zmq_msg_recv(m, zs, 0) < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        n++;
    }
    return n;
}

static void handle_live(struct listener *l, int nf, uint64_t now)
{
    struct lis_thread *t = l->thr;
    if (nf != 3 || zmq_msg_size(&t->fr[1]) != 8) {
        CTR(l, malformed, 1);
        lis_log(l, KVI_LOG_WARN, "malformed message dropped (%d frames, seq frame of %zu bytes)", nf,
                nf >= 2 ? zmq_msg_size(&t->fr[1]) : (size_t)0);
        return;
    }
    uint64_t seq = kvi_load_be64(zmq_msg_data(&t->fr[1]));
    if (seq == KVI_SEQ_SENTINEL) {
        CTR(l, malformed, 1);
        lis_log(l, KVI_LOG_WARN, "live message with the sentinel seq dropped");
        return;
    }
    CTR(l, messages, 1);
    atomic_store_explicit(&l->pub_last_msg_ns, now, memory_order_relaxed); /* relaxed: DESIGN */
    CTR(l, bytes, zmq_msg_size(&t->fr[2]));
    l->live_seq1 = seq + 1;
    kvi_stream_live(&l->stream, seq, &t->fr[2], now);
    after_stream(l);
}

static void handle_reply(struct listener *l, int nf, uint64_t now)
{
    struct lis_thread *t = l->thr;
    /* After the DEALER: ["", seq8, payload] or ["", topic, seq8, payload] (§7.2). */
    zmq_msg_t *seqf = NULL, *pay = NULL;
    if ((nf == 3 || nf == 4) && zmq_msg_size(&t->fr[0]) == 0) {
        seqf = &t->fr[nf - 2];
        pay = &t->fr[nf - 1];
    }
    if (seqf == NULL || zmq_msg_size(seqf) != 8) {
        CTR(l, replay_malformed, 1);
        lis_log(l, KVI_LOG_WARN, "malformed replay reply ignored (%d frames)", nf);
        return;
    }
    uint64_t seq = kvi_load_be64(zmq_msg_data(seqf));
    if (seq == KVI_SEQ_SENTINEL) {
        if (zmq_msg_size(pay) == 0) {
            kvi_stream_sentinel(&l->stream, now);
        } else {
            CTR(l, replay_malformed, 1);
            lis_log(l, KVI_LOG_WARN, "replay reply with the sentinel seq and a payload ignored");
        }
    } else {
        kvi_stream_reply(&l->stream, seq, pay, now);
    }
    after_stream(l);
}

/*
 * Release the frames of the message just handled. zmq_msg_recv would free
 * them on the next receive anyway, but that may be much later (a quiet
 * engine): a rejected frame of up to KVI_DECODE_MAX_FRAME bytes, or larger,
 * must not stay allocated meanwhile.
 */
static void release_frames(struct lis_thread *t)
{
    for (int i = 0; i < 5; i++)
        if (zmq_msg_size(&t->fr[i]) > 0) {
            zmq_msg_close(&t->fr[i]);
            zmq_msg_init(&t->fr[i]);
        }
}

/*
 * Offer the unmatched message in t->fr (nf frames) to an open endpoint's
 * on_unknown; hold it (moved out of t->fr) when accepted, dropping the
 * oldest held one past max_held. @return whether it was held.
 */
static bool bind_hold(struct lis_thread *t, struct bind_ep *b, int nf)
{
    if (b->on_unknown == NULL || nf != 3 || zmq_msg_size(&t->fr[1]) != 8)
        return false;
    uint64_t seq = kvi_load_be64(zmq_msg_data(&t->fr[1]));
    if (!b->on_unknown(b->ctx, b->endpoint, zmq_msg_data(&t->fr[0]), zmq_msg_size(&t->fr[0]), seq,
                       zmq_msg_data(&t->fr[2]), zmq_msg_size(&t->fr[2])))
        return false;
    if (b->n_held == b->max_held) {
        held_free(&b->held[0]);
        memmove(&b->held[0], &b->held[1], (b->n_held - 1) * sizeof *b->held);
        b->n_held--;
        TCTR(t, held_dropped, 1);
    }
    struct held_msg *h = &b->held[b->n_held++];
    for (int i = 0; i < 3; i++) {
        zmq_msg_init(&h->fr[i]);
        zmq_msg_move(&h->fr[i], &t->fr[i]);
    }
    return true;
}

/* Hand the messages held for @p l (bind member, draining) to it, in the order they came. */
static void bind_release_held(struct lis_thread *t, struct bind_ep *b, struct listener *l)
{
    size_t k = 0;
    uint64_t now = kvi_now_ns();
    for (size_t i = 0; i < b->n_held; i++) {
        struct held_msg *h = &b->held[i];
        if (bind_match(b, zmq_msg_data(&h->fr[0]), zmq_msg_size(&h->fr[0])) != l) {
            b->held[k++] = *h;
            continue;
        }
        for (int j = 0; j < 3; j++)
            zmq_msg_move(&t->fr[j], &h->fr[j]);
        held_free(h);
        handle_live(l, 3, now);
        release_frames(t);
    }
    b->n_held = k;
}

/* Handle the message in t->fr (nf > 0 frames) or a receive error (nf < 0). @return false once s is closed. */
static bool serve_one(struct lis_thread *t, struct lsock *s, int nf, uint64_t now)
{
    if (s->kind == SK_MON)
        return mon_serve(t, s->owner, nf);
    if (s->kind == SK_BIND) {
        struct bind_ep *b = s->owner;
        if (nf < 0) {
            sock_close(t, s);
            b->bound = false;
            for (size_t i = 0; i < b->n; i++) {
                struct listener *m = b->members[i];
                lis_stop(m);
                set_state(m, KVI_LISTENER_FAILED, "ZMQ recv failed on %s: %s", b->endpoint, zmq_strerror(-nf));
            }
            return false;
        }
        struct listener *l = bind_match(b, zmq_msg_data(&t->fr[0]), zmq_msg_size(&t->fr[0]));
        if (l != NULL && l->draining)
            handle_live(l, nf, now);
        else if (l != NULL || !bind_hold(t, b, nf))
            TCTR(t, unknown_topic, 1);
        return true;
    }
    struct listener *l = s->owner;
    if (nf < 0) {
        char what[128];
        snprintf(what, sizeof what, "ZMQ recv failed for worker %s", l->tgt_name);
        lis_fail(l, what, -nf);
        return false;
    }
    if (s->kind == SK_SUB)
        handle_live(l, nf, now);
    else
        handle_reply(l, nf, now);
    return true;
}

/* Serve one ready socket. @return true when it may have more (budget used up). */
static bool serve(struct lis_thread *t, struct lsock *s)
{
    uint32_t budget = t->lp->cfg.budget;
    uint64_t now = kvi_now_ns();
    for (uint32_t k = 0; k < budget; k++) {
        if (s->zs == NULL)
            return false;
        int nf = recv_frames(t, s->zs);
        if (nf == 0)
            return false;
        if (nf > 0 && s->kind != SK_MON)
            TCTR(t, messages, 1);
        bool open = serve_one(t, s, nf, now);
        release_frames(t);
        if (!open)
            return false;
    }
    return true;
}

static void serve_ready(struct lis_thread *t)
{
    /*
     * Serve a snapshot: serving may close sockets (unset_ready reorders the
     * list) and open or ready others (those wait for the next turn). Sockets
     * are embedded in listeners and bind endpoints, which only commands free,
     * so every pointer in the snapshot stays valid here.
     */
    size_t n = t->n_ready;
    if (n == 0)
        return;
    if (n > t->cap_snap) {
        t->cap_snap = t->cap_ready;
        t->snap = kvi_xrealloc(t->snap, t->cap_snap * sizeof *t->snap);
    }
    memcpy(t->snap, t->ready, n * sizeof *t->snap);
    for (size_t i = 0; i < n; i++) {
        struct lsock *s = t->snap[i];
        if (s->ready && !serve(t, s))
            unset_ready(t, s);
    }
}

static int next_timeout_ms(struct lis_thread *t)
{
    if (t->n_ready > 0)
        return 0;
    if (t->n_replaying == 0)
        return -1;
    uint64_t now = kvi_now_ns(), first = UINT64_MAX;
    for (size_t i = 0; i < t->n_replaying; i++)
        first = KVI_MIN(first, t->replaying[i]->stream.deadline_ns);
    if (first <= now)
        return 0;
    uint64_t ms = (first - now + 999999) / 1000000;
    return ms > 60000 ? 60000 : (int)ms;
}

static void tick_replays(struct lis_thread *t)
{
    if (t->n_replaying == 0)
        return;
    uint64_t now = kvi_now_ns();
    for (size_t i = 0; i < t->n_replaying;) {
        struct listener *l = t->replaying[i];
        if (kvi_stream_tick(&l->stream, now)) { /* logged by cb_note */
            after_stream(l); /* removes l from the list */
        } else {
            i++;
        }
    }
}

/* ---- commands (thread side) ----------------------------------------------- */

static void thr_add_listener(struct lis_thread *t, struct listener *l)
{
    if (t->n_ls == t->cap_ls) {
        t->cap_ls = t->cap_ls ? t->cap_ls * 2 : 64;
        t->ls = kvi_xrealloc(t->ls, t->cap_ls * sizeof *t->ls);
    }
    t->ls[t->n_ls++] = l;
    atomic_store_explicit(&t->n_listeners, (uint32_t)t->n_ls, memory_order_relaxed);
}

static void thr_del_listener(struct lis_thread *t, struct listener *l)
{
    for (size_t i = 0; i < t->n_ls; i++)
        if (t->ls[i] == l) {
            t->ls[i] = t->ls[--t->n_ls];
            break;
        }
    atomic_store_explicit(&t->n_listeners, (uint32_t)t->n_ls, memory_order_relaxed);
}

static void exec_add(struct lis_thread *t, struct listener *l)
{
    thr_add_listener(t, l);
    if (l->mode == KVI_LISTEN_BIND) {
        struct bind_ep *b = bind_find(t, l->endpoint);
        if (b == NULL) {
            b = kvi_xcalloc(1, sizeof *b);
            b->endpoint = kvi_lis__strdup(l->endpoint);
            b->next = t->binds;
            t->binds = b;
        }
        if (b->n == b->cap) {
            b->cap = b->cap ? b->cap * 2 : 8;
            b->members = kvi_xrealloc(b->members, b->cap * sizeof *b->members);
        }
        b->members[b->n++] = l;
        members_index(b, l);
        l->bind = b;
    }
    lis_start(l);
    if (l->bind != NULL && l->draining && l->bind->n_held > 0)
        bind_release_held(t, l->bind, l);
}

/* Open bind endpoint @p b (CMD_BIND_OPEN): bind and subscribe its prefix. @return 0 or -errno (b freed). */
static int exec_bind_open(struct lis_thread *t, struct bind_ep *b)
{
    b->next = t->binds;
    t->binds = b;
    int rc = bind_ensure(t, b);
    if (rc == 0 && zmq_setsockopt(b->sock.zs, ZMQ_SUBSCRIBE, b->prefix, b->prefix_len) != 0)
        rc = -errno;
    if (rc != 0)
        bind_free(t, b);
    return rc;
}

/* Close open bind endpoint @p ep (CMD_BIND_CLOSE): no more on_unknown, held messages dropped, prefix
 * unsubscribed; the socket goes with its last member (now when it has none). */
static void exec_bind_close(struct lis_thread *t, const char *ep)
{
    struct bind_ep *b = bind_find(t, ep);
    if (b == NULL || !b->held_open)
        return;
    b->held_open = false;
    b->on_unknown = NULL;
    for (size_t i = 0; i < b->n_held; i++)
        held_free(&b->held[i]);
    b->n_held = 0;
    if (b->n == 0) {
        bind_free(t, b);
        return;
    }
    if (b->bound)
        (void)zmq_setsockopt(b->sock.zs, ZMQ_UNSUBSCRIBE, b->prefix, b->prefix_len);
}

static void exec_remove(struct lis_thread *t, struct listener *l)
{
    lis_stop(l);
    if (l->bind != NULL)
        bind_remove_member(t, l->bind, l);
    l->bind = NULL;
    kvi_stream_fini(&l->stream);
    after_stream(l);
    thr_del_listener(t, l);
    kvi_producer_flush(t->prod); /* every op pointing at l's sink is applied */
}

static void exec_gate(struct lis_thread *t)
{
    for (struct bind_ep *b = t->binds; b != NULL; b = b->next)
        if (b->bound)
            sock_poll(t, &b->sock);
    for (size_t i = 0; i < t->n_ls; i++) {
        struct listener *l = t->ls[i];
        pthread_mutex_lock(&t->lp->mu);
        bool pending = l->state == KVI_LISTENER_PENDING;
        pthread_mutex_unlock(&t->lp->mu);
        if (pending)
            lis_start(l);
    }
}

static void exec_cmd(struct lis_thread *t, struct cmd *c)
{
    switch (c->type) {
    case CMD_ADD:
        exec_add(t, c->l);
        break;
    case CMD_REMOVE:
        exec_remove(t, c->l);
        break;
    case CMD_PAUSE:
        lis_stop(c->l);
        set_state(c->l, KVI_LISTENER_PAUSED, NULL);
        break;
    case CMD_RESUME:
        lis_start(c->l);
        break;
    case CMD_GATE:
        exec_gate(t);
        break;
    case CMD_STOP:
        t->stop = true;
        while (t->binds != NULL) /* open ones: registrations' went with them */
            bind_free(t, t->binds);
        break;
    case CMD_BIND_OPEN:
        c->rc = exec_bind_open(t, (struct bind_ep *)(uintptr_t)c->arg);
        break;
    case CMD_BIND_CLOSE:
        exec_bind_close(t, (const char *)(uintptr_t)c->arg);
        break;
    case CMD_SEED:
        /* only before anything was drained: W must name the recovered state */
        if (c->l->draining || c->l->stream.wm.w_set || c->l->stream.wm.l_set) {
            c->rc = -EBUSY;
            break;
        }
        kvi_lis__seed(c->l, c->arg);
        break;
    }
}

static void run_commands(struct lis_thread *t)
{
    uint64_t v;
    if (read(t->evfd, &v, sizeof v) < 0 && errno != EAGAIN)
        kvi_die("eventfd read: %s", strerror(errno));
    pthread_mutex_lock(&t->mu);
    struct cmd *c = t->q_head;
    t->q_head = t->q_tail = NULL;
    pthread_mutex_unlock(&t->mu);
    while (c != NULL) {
        struct cmd *next = c->next;
        exec_cmd(t, c);
        pthread_mutex_lock(&t->mu);
        c->done = true; /* the caller may free c as soon as it sees this */
        pthread_cond_broadcast(&t->cv);
        pthread_mutex_unlock(&t->mu);
        c = next;
    }
}

/* Control side: queue a command and wait until the thread has run it. */
void kvi_lis__call(struct lis_thread *t, uint8_t type, struct listener *l)
{
    (void)kvi_lis__call_arg(t, type, l, 0);
}

int kvi_lis__call_arg(struct lis_thread *t, uint8_t type, struct listener *l, uint64_t arg)
{
    struct cmd c = {.type = type, .l = l, .arg = arg};
    pthread_mutex_lock(&t->mu);
    if (t->q_tail != NULL)
        t->q_tail->next = &c;
    else
        t->q_head = &c;
    t->q_tail = &c;
    pthread_mutex_unlock(&t->mu);
    uint64_t one = 1;
    if (write(t->evfd, &one, sizeof one) != sizeof one)
        kvi_die("eventfd write: %s", strerror(errno));
    pthread_mutex_lock(&t->mu);
    while (!c.done)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    return c.rc;
}

/* ---- the thread ----------------------------------------------------------- */

static void *thread_main(void *arg)
{
    struct lis_thread *t = arg;
    char name[16];
    snprintf(name, sizeof name, "kvi-listen-%u", t->idx);
    pthread_setname_np(pthread_self(), name);
    int rc = 0;
    t->prod = kvi_producer_create(t->lp->writers);
    if (t->prod == NULL)
        rc = -errno;
    if (rc == 0 && (t->dec = kvi_decoder_create()) == NULL)
        rc = -ENOMEM;
    pthread_mutex_lock(&t->mu);
    t->start_rc = rc;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (rc != 0) {
        if (t->prod != NULL)
            kvi_producer_destroy(t->prod);
        return NULL;
    }
    for (int i = 0; i < 5; i++)
        zmq_msg_init(&t->fr[i]);
    bool timing = t->lp->cfg.timing;
    struct epoll_event evs[MAX_EVENTS];
    while (!t->stop) {
        int n = epoll_wait(t->epfd, evs, MAX_EVENTS, next_timeout_ms(t));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            kvi_die("epoll_wait: %s", strerror(errno));
        }
        uint64_t t0 = timing ? kvi_now_ns() : 0;
        TCTR(t, wakeups, 1);
        bool cmds = false;
        for (int i = 0; i < n; i++) {
            struct lsock *s = evs[i].data.ptr;
            if (s->kind == SK_CMD)
                cmds = true;
            else
                set_ready(t, s);
        }
        serve_ready(t);
        tick_replays(t);
        if (cmds)
            run_commands(t);
        if (timing)
            TCTR(t, busy_ns, kvi_now_ns() - t0);
    }
    for (int i = 0; i < 5; i++)
        zmq_msg_close(&t->fr[i]);
    kvi_decoder_destroy(t->dec);
    kvi_producer_destroy(t->prod);
    return NULL;
}

void kvi_lis__thread_cleanup(struct lis_thread *t)
{
    free(t->ls);
    free(t->ready);
    free(t->snap);
    free(t->replaying);
    if (t->epfd >= 0)
        close(t->epfd);
    if (t->evfd >= 0)
        close(t->evfd);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

int kvi_lis__thread_start(struct kvi_listeners *lp, struct lis_thread *t, uint32_t idx)
{
    t->lp = lp;
    t->idx = idx;
    t->epfd = t->evfd = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    t->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (t->epfd < 0 || t->evfd < 0)
        return -errno;
    t->cmd_sock = (struct lsock){.fd = t->evfd, .kind = SK_CMD};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &t->cmd_sock};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->evfd, &ev) != 0)
        return -errno;
    t->start_rc = 1;
    int rc = pthread_create(&t->tid, NULL, thread_main, t);
    if (rc != 0)
        return -rc;
    pthread_mutex_lock(&t->mu);
    while (t->start_rc == 1)
        pthread_cond_wait(&t->cv, &t->mu);
    rc = t->start_rc;
    pthread_mutex_unlock(&t->mu);
    if (rc != 0)
        pthread_join(t->tid, NULL);
    return rc;
}

