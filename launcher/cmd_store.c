/* launcher/cmd_store.c: `trainrun store`, a standalone TCPStore server.
 *
 *   trainrun store --port P [--host H] [--token-env] [--expected-clients N]
 *
 * Serves until SIGINT or SIGTERM, then exits 0; SIGUSR1 prints the
 * counters. Prints "trainrun store: listening on HOST port P" on stdout
 * once it accepts clients (with --port 0, P is the port the kernel chose).
 * See trainrun-store(1).
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h> /* getaddrinfo: the default bind address */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launcher/commands.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"
#include "trainrun/store.h"

/* Self-pipe for signals: [0] read by the main loop, [1] written by the
 * async-signal-safe handler. */
static int g_sigpipe[2] = {-1, -1};

static void on_signal(int sig) {
  int saved = errno;
  unsigned char b = (unsigned char)sig;
  ssize_t r = write(g_sigpipe[1], &b, 1);
  (void)r;
  errno = saved;
}

static void store_usage(FILE* out) {
  fprintf(out,
          "usage: trainrun store --port P [--host H] [--token-env] "
          "[--expected-clients N]\n"
          "\n"
          "Run a TCPStore server (PyTorch-compatible) until SIGINT/SIGTERM.\n"
          "  --port P              port to listen on; 0 picks a free one\n"
          "  --host H              address to bind (default: the address of "
          "this\n"
          "                        host's name; '::' or 0.0.0.0 for every "
          "interface)\n"
          "  --token-env           require clients to prove the secret in\n"
          "                        TRAINRUN_STORE_TOKEN (trainrun clients "
          "only)\n"
          "  --expected-clients N  size the accept queues for N clients and\n"
          "                        warn when they cannot hold them\n"
          "Limits: TRAINRUN_STORE_* (trainrun --help-env). See "
          "trainrun-store(1).\n");
}

/* The first address the host's own name resolves to, as text. */
static int default_host(char* out, size_t n) {
  char name[256];
  if (gethostname(name, sizeof name - 1) != 0) return tr_err_from_errno();
  name[sizeof name - 1] = '\0';
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int g = getaddrinfo(name, NULL, &hints, &res);
  if (g != 0) {
    fprintf(stderr,
            "trainrun: cannot resolve this host's name '%s': %s; "
            "pass --host\n",
            name, gai_strerror(g));
    return TR_ENOTFOUND;
  }
  g = getnameinfo(res->ai_addr, res->ai_addrlen, out, (socklen_t)n, NULL, 0,
                  NI_NUMERICHOST);
  freeaddrinfo(res);
  return g == 0 ? 0 : TR_ENOTFOUND;
}

static int parse_int(const char* flag, const char* v, long lo, long hi,
                     long* out) {
  char* end;
  errno = 0;
  long x = v ? strtol(v, &end, 10) : 0;
  if (!v || errno || end == v || *end || x < lo || x > hi) {
    fprintf(stderr, "trainrun: %s expects an integer in [%ld, %ld], got '%s'\n",
            flag, lo, hi, v ? v : "");
    return -1;
  }
  *out = x;
  return 0;
}

int tr_cmd_store(int argc, char** argv) {
  long port = -1, expected = 0;
  const char* host = NULL;
  int token_env = 0;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      store_usage(stdout);
      return 0;
    } else if (strcmp(a, "--port") == 0) {
      if (parse_int("--port", i + 1 < argc ? argv[++i] : NULL, 0, 65535,
                    &port) < 0)
        return 2;
    } else if (strcmp(a, "--host") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "trainrun: --host expects an address\n");
        return 2;
      }
      host = argv[++i];
    } else if (strcmp(a, "--token-env") == 0) {
      token_env = 1;
    } else if (strcmp(a, "--expected-clients") == 0) {
      if (parse_int("--expected-clients", i + 1 < argc ? argv[++i] : NULL, 0,
                    1 << 30, &expected) < 0)
        return 2;
    } else {
      fprintf(stderr, "trainrun: store: unknown argument '%s'\n", a);
      store_usage(stderr);
      return 2;
    }
  }
  if (port < 0) {
    fprintf(stderr, "trainrun: store: --port is required\n");
    store_usage(stderr);
    return 2;
  }
  tr_store_server_opts_t o;
  tr_store_server_opts_init(&o);
  char hostbuf[256];
  if (!host) {
    if (default_host(hostbuf, sizeof hostbuf) < 0) return 1;
    host = hostbuf;
  }
  o.host = host;
  o.port = (int)port;
  o.expected_clients = (int)expected;
  const char* token = tr_param_str(TR_PARAM_STORE_TOKEN);
  if (token_env) {
    if (!*token) {
      fprintf(stderr, "trainrun: --token-env given but %s is empty\n",
              tr_param_env_name(TR_PARAM_STORE_TOKEN));
      return 2;
    }
    o.token = token;
  } else if (*token) {
    fprintf(stderr,
            "trainrun: warning: %s is set but --token-env is not "
            "given: clients are not asked for a token\n",
            tr_param_env_name(TR_PARAM_STORE_TOKEN));
  }

  /* Signals go through a self-pipe: libraries loaded with us (OpenBLAS)
   * start threads before main, so a blocked-mask + sigwait scheme would let
   * the default action kill us when the signal lands on one of those. */
  if (pipe(g_sigpipe) != 0) {
    fprintf(stderr, "trainrun: pipe: %s\n", strerror(errno));
    return 1;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    sigaction(sigs[i], &sa, NULL);

  tr_store_server_t* srv;
  int rc = tr_store_server_start(&o, &srv);
  if (rc < 0) {
    fprintf(stderr, "trainrun: cannot start the store on '%s' port %ld: %s\n",
            host, port, tr_strerror(rc));
    return 1;
  }
  printf("trainrun store: listening on %s port %d\n", tr_store_server_host(srv),
         tr_store_server_port(srv));
  fflush(stdout);
  int sig = 0;
  tr_store_server_stats_t st;
  for (;;) {
    unsigned char b;
    ssize_t r = read(g_sigpipe[0], &b, 1);
    if (r != 1) continue;
    sig = b;
    if (sig != SIGUSR1) break;
    tr_store_server_stats(srv, &st);
    fprintf(stderr,
            "trainrun store: %" PRId64 " clients, %" PRId64
            " accepted, %" PRId64 " closed for errors, %" PRId64
            " keys, %" PRId64 " bytes, %" PRId64 " requests\n",
            st.connections, st.accepted, st.closed_errors, st.keys, st.bytes,
            st.requests);
  }
  tr_store_server_stats(srv, &st);
  tr_store_server_stop(srv);
  TR_LOG_INFO(STORE, "store stopped by signal %d after %" PRId64 " requests",
              sig, st.requests);
  return 0;
}
