/* trainrun/store.h: the TCPStore -- a key-value server every rank and daemon
 * rendezvouses on, its blocking client, and PrefixStore.
 *
 * The wire protocol is PyTorch's TCPStore protocol (2.4 to 2.11): a PyTorch
 * `TCPStore(host, port, is_master=False)` can use a trainrun server, and a
 * trainrun client can use a PyTorch server. Keys a user passes are sent with
 * a leading "/" exactly as PyTorch's client sends them, so `store.set("k")`
 * in Python and tr_store_client_set(c, "k", ...) in C name the same key.
 *
 * Server
 * ------
 * The server is an acceptor thread and a few libuv I/O loops, each on a
 * thread of its own (opts.threads, opts.listeners below):
 *
 *   tr_store_server_opts_t o;
 *   tr_store_server_opts_init(&o);         // limits from TRAINRUN_STORE_*
 *   o.host = "127.0.0.1"; o.port = 0;       // port 0: the kernel picks one
 *   tr_store_server_t* srv;
 *   TR_CHECK(tr_store_server_start(&o, &srv));
 *   int port = tr_store_server_port(srv);
 *   ...
 *   tr_store_server_stop(srv);             // closes everything, frees srv
 *
 * A client that breaks the protocol or a limit (key, value, request size,
 * keys per request, total memory) is closed alone with a warning naming its
 * address; every other client keeps being served.
 *
 * Client
 * ------
 * A client is one TCP connection, used by one thread at a time (like
 * PyTorch's, at most one request is in flight). Every call has a deadline
 * (opts.timeout_ms, the store timeout). Connecting retries refused or reset
 * connections with exponential backoff and jitter until the deadline. When a
 * call fails because the connection broke or timed out, the connection is
 * dropped and the *next* call reconnects first; a request is never resent
 * on its own, so an ADD is never applied twice.
 *
 * Values returned by the client are malloc()ed and owned by the caller,
 * who frees them with free().
 *
 * Token
 * -----
 * With a token set on the server (opts.token, from TRAINRUN_STORE_TOKEN with
 * `trainrun store --token-env`), a client must prove it knows the token by a
 * challenge-response (HMAC-SHA256 over two random nonces, both directions)
 * right after the handshake and before any other command; the token itself
 * never crosses the wire. PyTorch clients cannot connect to such a server;
 * without a token the server is byte-compatible with them.
 */
#ifndef TRAINRUN_STORE_H
#define TRAINRUN_STORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- server ---- */

typedef struct tr_store_server_s tr_store_server_t;

typedef struct {
  /* Address to bind: a numeric IPv4/IPv6 address or a host name (its first
   * address that binds is used). NULL means "127.0.0.1". "::" or "0.0.0.0"
   * bind every interface; a caller must ask for that explicitly. */
  const char* host;
  int port;                  /* 0: an ephemeral port (read it back) */
  const char* token;         /* NULL or "": no authentication */
  int backlog;               /* 0: /proc/sys/net/core/somaxconn */
  int expected_clients;      /* > 0: warn when the backlog is smaller */
  int64_t max_key_bytes;     /* largest key */
  int64_t max_value_bytes;   /* largest value */
  int64_t max_request_bytes; /* largest request, and largest MULTI_GET reply */
  int64_t max_keys;          /* keys in one CHECK/WAIT/MULTI_GET/MULTI_SET */
  int64_t max_memory_bytes;  /* key + value + queued bytes held in total */
  int64_t max_connections;   /* clients connected at once */
  /* I/O threads: 0 picks min(4, max(1, CPUs / 4)); TRAINRUN_STORE_THREADS,
   * when set, gives it (opts_init). Requests of one client execute in order;
   * clients are served in parallel. A request sent after a reply was
   * received is ordered after whatever that reply reflected, as with one
   * thread. An accept fence keeps the one other ordering clients rely on:
   * a connection accepted after another client's SET (not acknowledged in
   * the protocol) was sent and that client closed or kept quiet, observes
   * the SET. Beyond that, two clients' concurrent unacknowledged SETs and
   * reads on other connections are not ordered (nor are they in PyTorch's
   * server, except by the kernel's delivery order). */
  int threads;
  /* Accept queues: the server listens on this many sockets of one
   * SO_REUSEPORT group at host:port, each with its own backlog, so a burst
   * of connecting clients overflows none. 0 picks
   * ceil(expected_clients / backlog), 1 to 16. Where SO_REUSEPORT cannot be
   * used the server falls back to one socket and logs why. Linux lets only
   * sockets of the same effective user join a group; the server also
   * claims host:port so another trainrun server cannot join it. */
  int listeners;
} tr_store_server_opts_t;

/* Fill opts with the defaults: host NULL, port 0, no token, and the limits
 * read from the TRAINRUN_STORE_* parameters (param.h). */
void tr_store_server_opts_init(tr_store_server_opts_t* opts);

/* Bind, listen (opts.listeners sockets) and start the server's threads: an
 * acceptor and opts.threads I/O loops (the key-value state is shared under one lock held
 * only while requests execute). On success *out is the new
 * server, owned by the caller until tr_store_server_stop(). Bind errors are
 * returned here (e.g. TR_EADDRINUSE), not on the thread. Raises the soft
 * RLIMIT_NOFILE to the hard limit so the connection count is limited only
 * by it. */
int tr_store_server_start(const tr_store_server_opts_t* opts,
                          tr_store_server_t** out);

/* The port the server is bound to (the one the kernel picked for port 0). */
int tr_store_server_port(const tr_store_server_t* srv);

/* The bound address as text ("127.0.0.1", "::1"); owned by srv. */
const char* tr_store_server_host(const tr_store_server_t* srv);

typedef struct {
  int64_t connections;   /* clients connected now */
  int64_t accepted;      /* connections accepted since start */
  int64_t closed_errors; /* clients closed for a protocol or limit breach */
  int64_t keys;          /* keys stored (what GETNUMKEYS answers) */
  int64_t bytes;         /* key + value + queued bytes held */
  int64_t requests;      /* requests executed */
} tr_store_server_stats_t;

/* A snapshot of the server's counters; callable from any thread. */
void tr_store_server_stats(const tr_store_server_t* srv,
                           tr_store_server_stats_t* stats);

/* Stop the loop, close every client, join the thread and free srv. Waiting
 * clients see their connection closed. NULL is a no-op. */
void tr_store_server_stop(tr_store_server_t* srv);

/* ---- client ---- */

typedef struct tr_store_client_s tr_store_client_t;

typedef struct {
  const char* host;   /* server host name or address (required) */
  int port;           /* server port (required) */
  int64_t timeout_ms; /* deadline of connect and of every call; default
                         300000 like PyTorch's Store::kDefaultTimeout */
  /* > 0: after connecting, ADD 1 to the "init/" worker counter as PyTorch
   * clients given a world size do (once, not on reconnects). */
  int world_size;
  /* Shared secret to prove; NULL: TRAINRUN_STORE_TOKEN; "": none. */
  const char* token;
  int no_ping; /* 1: skip PING after VALIDATE (PyTorch <= 2.4 server) */
  /* 1: without a token, ask a trainrun server whether it requires one
   * (AUTH_HELLO after PING) and fail at connect with TR_EAUTH when it does,
   * instead of at the first command with a closed connection. Only for
   * trainrun servers: PyTorch's closes the connection at AUTH_HELLO. */
  int probe_auth;
  int64_t backoff_initial_ms; /* first connect retry delay; default 100 */
  int64_t backoff_max_ms;     /* cap of the delay (x1.5 each try); 5000 */
} tr_store_client_opts_t;

/* Fill opts with the defaults (host NULL: the caller sets host and port). */
void tr_store_client_opts_init(tr_store_client_opts_t* opts);

/* Connect, handshake (VALIDATE, token proof when a token is set, PING) and,
 * with opts->world_size > 0, ADD "init/" 1. Retries until opts->timeout_ms.
 * On success *out is a new client owned by the caller (tr_store_client_free).
 * Errors: TR_ETIMEDOUT (deadline passed; the last connect error is logged),
 * TR_EAUTH (token refused, or the server cannot prove the token, or the
 * server requires a token this client lacks), TR_EPROTO (bad PING echo). */
int tr_store_client_connect(const tr_store_client_opts_t* opts,
                            tr_store_client_t** out);

/* A second, independent connection to the same server with the same options
 * (PyTorch's store.clone()); it does not ADD "init/". */
int tr_store_client_clone(const tr_store_client_t* c, tr_store_client_t** out);

/* Close the connection and free c. NULL is a no-op. */
void tr_store_client_free(tr_store_client_t* c);

/* Change the deadline of later calls (ms > 0). */
void tr_store_client_set_timeout(tr_store_client_t* c, int64_t ms);
int64_t tr_store_client_timeout(const tr_store_client_t* c);

/* Key-value calls. key is a NUL-terminated string, sent as "/" + key. A call
 * that does not finish by the deadline returns TR_ETIMEDOUT; a broken
 * connection TR_ECONNRESET or TR_ECLOSED (the server closes a client that
 * breaks a limit). */
int tr_store_client_set(tr_store_client_t* c, const char* key, const void* val,
                        size_t len);

/* Wait until key exists (until the deadline), then fetch it. *val is
 * malloc()ed (NUL-terminated for convenience, not counted in *len). */
int tr_store_client_get(tr_store_client_t* c, const char* key, void** val,
                        size_t* len);

/* Add delta to the ASCII decimal counter at key (missing: 0); *result (may
 * be NULL) is the new value. */
int tr_store_client_add(tr_store_client_t* c, const char* key, int64_t delta,
                        int64_t* result);

/* Atomically replace key's value with desired if it equals expected (an
 * empty expected matches a missing key). *cur receives the value now stored
 * (PyTorch's rule: for a missing key and non-empty expected, expected). */
int tr_store_client_compare_set(tr_store_client_t* c, const char* key,
                                const void* expected, size_t elen,
                                const void* desired, size_t dlen, void** cur,
                                size_t* clen);

/* *ready = 1 when every key exists now (a non-empty queue counts), else 0. */
int tr_store_client_check(tr_store_client_t* c, const char* const* keys,
                          size_t n, int* ready);

/* Block until every key exists. timeout_ms <= 0 uses the client deadline.
 * On expiry the pending wait is canceled on the server (CANCEL_WAIT) and
 * TR_ETIMEDOUT returned; the connection stays usable. */
int tr_store_client_wait(tr_store_client_t* c, const char* const* keys,
                         size_t n, int64_t timeout_ms);

/* *n = the number of keys stored (queues not counted; "init/" counted). */
int tr_store_client_num_keys(tr_store_client_t* c, int64_t* n);

/* *deleted = 1 when key existed and was removed (may be NULL). */
int tr_store_client_delete_key(tr_store_client_t* c, const char* key,
                               int* deleted);

/* Append to key's value, creating it when missing. */
int tr_store_client_append(tr_store_client_t* c, const char* key,
                           const void* val, size_t len);

/* Wait for all keys, then fetch them in one round trip. vals[i] (malloc()ed)
 * and lens[i] are filled for i < n; on error none are left allocated. */
int tr_store_client_multi_get(tr_store_client_t* c, const char* const* keys,
                              size_t n, void** vals, size_t* lens);

/* Set n keys in one request. */
int tr_store_client_multi_set(tr_store_client_t* c, const char* const* keys,
                              size_t n, const void* const* vals,
                              const size_t* lens);

/* Queues (PyTorch 2.8+, libuv server): push to the tail of queue key. */
int tr_store_client_queue_push(tr_store_client_t* c, const char* key,
                               const void* val, size_t len);

/* Pop the head of queue key. block: first wait (until the deadline) for the
 * queue to be non-empty. An empty queue returns TR_ENOTFOUND. */
int tr_store_client_queue_pop(tr_store_client_t* c, const char* key, int block,
                              void** val, size_t* len);

int tr_store_client_queue_len(tr_store_client_t* c, const char* key,
                              int64_t* len);

/* Round trip a PING; checks the echo. */
int tr_store_client_ping(tr_store_client_t* c);

/* What the process that hosts the server does for PyTorch's
 * wait_for_workers: poll "init/" (WAIT then GET, every 10 ms) until it
 * reaches world_size. TR_ETIMEDOUT after timeout_ms (<= 0: the client
 * deadline), with a warning "X/Y clients joined". */
int tr_store_client_wait_workers(tr_store_client_t* c, int world_size,
                                 int64_t timeout_ms);

/* "host:port" of the server this client talks to; owned by c. */
const char* tr_store_client_peer(const tr_store_client_t* c);

/* ---- PrefixStore ---- */

/* A view of a client in which key K becomes prefix + "/" + K, as PyTorch's
 * PrefixStore does; nest views with tr_store_prefix_nest. The view does not
 * own the client: free the view (tr_store_prefix_release) before or after
 * the client, but use it only while the client lives. */
typedef struct {
  tr_store_client_t* client;
  char* prefix; /* the composed prefix, without the trailing "/" */
} tr_store_prefix_t;

/* Fill p as PrefixStore(prefix, client). */
int tr_store_prefix_init(tr_store_prefix_t* p, tr_store_client_t* client,
                         const char* prefix);

/* Fill p as PrefixStore(prefix, parent): keys become
 * parent_prefix/prefix/K on the wire (then "/" is added by the client). */
int tr_store_prefix_nest(tr_store_prefix_t* p, const tr_store_prefix_t* parent,
                         const char* prefix);

/* Free p's prefix; the client is untouched. */
void tr_store_prefix_release(tr_store_prefix_t* p);

/* The key passed to the client for K: prefix/K; malloc()ed, caller frees. */
char* tr_store_prefix_key(const tr_store_prefix_t* p, const char* key);

/* The same calls as the client's, with keys mapped through the prefix. */
int tr_store_prefix_set(tr_store_prefix_t* p, const char* key, const void* val,
                        size_t len);
int tr_store_prefix_get(tr_store_prefix_t* p, const char* key, void** val,
                        size_t* len);
int tr_store_prefix_add(tr_store_prefix_t* p, const char* key, int64_t delta,
                        int64_t* result);
int tr_store_prefix_compare_set(tr_store_prefix_t* p, const char* key,
                                const void* expected, size_t elen,
                                const void* desired, size_t dlen, void** cur,
                                size_t* clen);
int tr_store_prefix_check(tr_store_prefix_t* p, const char* const* keys,
                          size_t n, int* ready);
int tr_store_prefix_wait(tr_store_prefix_t* p, const char* const* keys,
                         size_t n, int64_t timeout_ms);
int tr_store_prefix_delete_key(tr_store_prefix_t* p, const char* key,
                               int* deleted);
int tr_store_prefix_append(tr_store_prefix_t* p, const char* key,
                           const void* val, size_t len);
int tr_store_prefix_multi_get(tr_store_prefix_t* p, const char* const* keys,
                              size_t n, void** vals, size_t* lens);
int tr_store_prefix_multi_set(tr_store_prefix_t* p, const char* const* keys,
                              size_t n, const void* const* vals,
                              const size_t* lens);
int tr_store_prefix_queue_push(tr_store_prefix_t* p, const char* key,
                               const void* val, size_t len);
int tr_store_prefix_queue_pop(tr_store_prefix_t* p, const char* key, int block,
                              void** val, size_t* len);
int tr_store_prefix_queue_len(tr_store_prefix_t* p, const char* key,
                              int64_t* len);
/* Like PyTorch's PrefixStore.num_keys: the whole store's count. */
int tr_store_prefix_num_keys(tr_store_prefix_t* p, int64_t* n);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_STORE_H */
