/* daemon/opts.c: the launcher flags (torchrun's), the node flags a cluster
 * gives through its environment (Slurm's srun, Open MPI's mpirun), and the
 * checks of their combination. */
#include "core/buf.h" /* TR_GROW */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/param.h"

#define DEFAULT_PORT 29500

void tr_daemon_opts_init(tr_daemon_opts_t* o) {
  memset(o, 0, sizeof *o);
  o->nnodes_min = o->nnodes_max = 1;
  o->nproc_per_node = TR_DAEMON_NPROC_UNSET;
  o->node_rank = -1;
  o->rdzv_port = DEFAULT_PORT;
  o->monitor_interval = 0.1;
  o->join_timeout = 600;
  o->last_call_timeout = 30;
  o->keep_alive_interval = 5;
  o->keep_alive_max_attempt = 3;
  o->read_timeout = 60;
  o->is_host = -1;
  o->worker_timeout = 300;
  o->metrics_port = -1;
  o->prog = "trainrun";
}

static void std_release(tr_daemon_std_t* s) {
  free(s->rank);
  free(s->value);
  memset(s, 0, sizeof *s);
}

void tr_daemon_opts_release(tr_daemon_opts_t* o) {
  free(o->rdzv_host);
  free(o->run_id);
  free(o->log_dir);
  free(o->ranks_filter);
  free(o->role);
  std_release(&o->redirects);
  std_release(&o->tee);
  memset(o, 0, sizeof *o);
}

int tr_daemon_std_for(const tr_daemon_std_t* s, int r) {
  for (int i = 0; i < s->n; i++)
    if (s->rank[i] == r) return s->value[i];
  return s->def;
}

/* ---- value parsers ---- */

static int parse_int(const char* s, long lo, long hi, long* out) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_seconds(const char* s, double lo, double hi, double* out) {
  char* end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
  *out = v;
  return 0;
}

/* "3" or "0:1,1:2" (torchrun's Std.from_str). */
static int parse_std(const char* s, tr_daemon_std_t* out) {
  tr_daemon_std_t st = {0};
  size_t rcap = 0, vcap = 0;
  long v;
  if (!strchr(s, ':')) {
    if (parse_int(s, 0, 3, &v) < 0) return -1;
    std_release(out);
    out->def = (int)v;
    return 0;
  }
  const char* p = s;
  while (*p) {
    size_t n = strcspn(p, ",");
    char item[64];
    if (n == 0 || n >= sizeof item) goto out_bad;
    memcpy(item, p, n);
    item[n] = '\0';
    char* colon = strchr(item, ':');
    long r;
    if (!colon) goto out_bad;
    *colon = '\0';
    if (parse_int(item, 0, INT_MAX, &r) < 0 ||
        parse_int(colon + 1, 0, 3, &v) < 0)
      goto out_bad;
    if (TR_GROW(st.rank, (size_t)st.n + 1, rcap) < 0 ||
        TR_GROW(st.value, (size_t)st.n + 1, vcap) < 0)
      goto out_bad;
    st.rank[st.n] = (int)r;
    st.value[st.n++] = (int)v;
    p += n;
    if (*p == ',') p++;
  }
  std_release(out);
  *out = st;
  return 0;
out_bad:
  std_release(&st);
  return -1;
}

/* "0,2,4-7" into a malloc()ed list. */
static int parse_rank_list(const char* s, int** out, int* n) {
  int* v = NULL;
  int k = 0;
  size_t cap = 0;
  const char* p = s;
  if (!*p) return -1;
  while (*p) {
    size_t len = strcspn(p, ",");
    char item[48];
    long a, b;
    if (len == 0 || len >= sizeof item) goto out_bad;
    memcpy(item, p, len);
    item[len] = '\0';
    char* dash = strchr(item, '-');
    if (dash) {
      *dash = '\0';
      if (parse_int(item, 0, INT_MAX, &a) < 0 ||
          parse_int(dash + 1, 0, INT_MAX, &b) < 0 || b < a || b - a > 65535)
        goto out_bad;
    } else {
      if (parse_int(item, 0, INT_MAX, &a) < 0) goto out_bad;
      b = a;
    }
    for (long r = a; r <= b; r++) {
      if (TR_GROW(v, (size_t)k + 1, cap) < 0) goto out_bad;
      v[k++] = (int)r;
    }
    p += len;
    if (*p == ',') p++;
  }
  *out = v;
  *n = k;
  return 0;
out_bad:
  free(v);
  return -1;
}

/* "host", "host:port", "[v6]:port" into host and *port (kept when none). */
static int parse_endpoint(const char* s, char** host, int* port,
                          int* has_port) {
  const char* h = s;
  size_t hlen;
  const char* rest;
  *has_port = 0;
  if (*s == '[') {
    const char* close = strchr(s, ']');
    if (!close || close == s + 1) return -1;
    h = s + 1;
    hlen = (size_t)(close - h);
    rest = close + 1;
    if (*rest && *rest != ':') return -1;
  } else {
    const char* colon = strrchr(s, ':');
    /* a bare IPv6 address has several colons and no port */
    if (colon && strchr(s, ':') != colon) colon = NULL;
    hlen = colon ? (size_t)(colon - s) : strlen(s);
    rest = colon ? colon : s + strlen(s);
  }
  if (hlen == 0) return -1;
  if (*rest == ':') {
    long p;
    if (parse_int(rest + 1, 1, 65535, &p) < 0) return -1;
    *port = (int)p;
    *has_port = 1;
  }
  char* copy = strndup(h, hlen);
  if (!copy) return -1;
  free(*host);
  *host = copy;
  return 0;
}

static int set_str(char** dst, const char* v) {
  char* c = strdup(v);
  if (!c) return TR_ENOMEM;
  free(*dst);
  *dst = c;
  return 0;
}

/* --rdzv-conf join_timeout=600,last_call_timeout=30,... */
static int parse_rdzv_conf(tr_daemon_opts_t* o, const char* s,
                           tr_errmsg_t* err) {
  const char* p = s;
  while (*p) {
    size_t n = strcspn(p, ",");
    char item[128];
    if (n == 0 || n >= sizeof item)
      return tr_errmsg_set(err, TR_EINVAL,
                           "--rdzv-conf: expected key=value,..., got '%s'", s);
    memcpy(item, p, n);
    item[n] = '\0';
    char* eq = strchr(item, '=');
    if (!eq)
      return tr_errmsg_set(err, TR_EINVAL,
                           "--rdzv-conf: expected key=value, got '%s'", item);
    *eq = '\0';
    const char* k = item;
    const char* v = eq + 1;
    double d;
    long l;
    int bad = 0;
    if (strcmp(k, "join_timeout") == 0 || strcmp(k, "timeout") == 0)
      bad = parse_seconds(v, 0.001, 1e7, &o->join_timeout);
    else if (strcmp(k, "last_call_timeout") == 0)
      bad = parse_seconds(v, 0, 1e7, &o->last_call_timeout);
    else if (strcmp(k, "keep_alive_interval") == 0)
      bad = parse_seconds(v, 0.01, 1e6, &o->keep_alive_interval);
    else if (strcmp(k, "keep_alive_max_attempt") == 0) {
      bad = parse_int(v, 1, 1000000, &l);
      if (!bad) o->keep_alive_max_attempt = (int)l;
    } else if (strcmp(k, "read_timeout") == 0)
      bad = parse_seconds(v, 0.001, 1e7, &o->read_timeout);
    else if (strcmp(k, "is_host") == 0) {
      if (strcasecmp(v, "true") == 0 || strcmp(v, "1") == 0)
        o->is_host = 1;
      else if (strcasecmp(v, "false") == 0 || strcmp(v, "0") == 0)
        o->is_host = 0;
      else
        bad = -1;
    } else
      return tr_errmsg_set(
          err, TR_EINVAL,
          "--rdzv-conf: unknown key '%s' (known: join_timeout, "
          "last_call_timeout, keep_alive_interval, keep_alive_max_attempt, "
          "read_timeout, is_host)",
          k);
    (void)d;
    if (bad)
      return tr_errmsg_set(err, TR_EINVAL, "--rdzv-conf: bad value '%s' for %s",
                           v, k);
    p += n;
    if (*p == ',') p++;
  }
  return 0;
}

/* ---- the flag table ---- */

enum {
  F_NNODES,
  F_NPROC,
  F_NODE_RANK,
  F_ENDPOINT,
  F_RUN_ID,
  F_BACKEND,
  F_CONF,
  F_STANDALONE,
  F_MAX_RESTARTS,
  F_MONITOR,
  F_FILTER,
  F_TEE,
  F_LOG_DIR,
  F_REDIRECTS,
  F_ROLE,
  F_MASTER_ADDR,
  F_MASTER_PORT,
  F_WORKER_TIMEOUT,
  F_METRICS_PORT
};

static const struct {
  const char* name; /* with dashes */
  int id;
  int has_value;
} flags[] = {
    {"nnodes", F_NNODES, 1},
    {"nproc-per-node", F_NPROC, 1},
    {"node-rank", F_NODE_RANK, 1},
    {"rdzv-endpoint", F_ENDPOINT, 1},
    {"rdzv-id", F_RUN_ID, 1},
    {"rdzv-backend", F_BACKEND, 1},
    {"rdzv-conf", F_CONF, 1},
    {"standalone", F_STANDALONE, 0},
    {"max-restarts", F_MAX_RESTARTS, 1},
    {"monitor-interval", F_MONITOR, 1},
    {"local-ranks-filter", F_FILTER, 1},
    {"tee", F_TEE, 1},
    {"log-dir", F_LOG_DIR, 1},
    {"redirects", F_REDIRECTS, 1},
    {"role", F_ROLE, 1},
    {"master-addr", F_MASTER_ADDR, 1},
    {"master-port", F_MASTER_PORT, 1},
    {"worker-timeout", F_WORKER_TIMEOUT, 1},
    {"metrics-port", F_METRICS_PORT, 1},
};

/* The flag's name in argv[i] ("--nproc_per_node=4" -> "nproc-per-node"),
 * normalised into buf; NULL when argv[i] is no long flag. */
static const char* flag_name(const char* arg, char* buf, size_t cap,
                             const char** inline_value) {
  if (strncmp(arg, "--", 2) != 0 || !arg[2]) return NULL;
  const char* s = arg + 2;
  size_t n = strcspn(s, "=");
  if (n >= cap) return NULL;
  for (size_t k = 0; k < n; k++) buf[k] = s[k] == '_' ? '-' : s[k];
  buf[n] = '\0';
  *inline_value = s[n] == '=' ? s + n + 1 : NULL;
  return buf;
}

int tr_daemon_opts_flag(tr_daemon_opts_t* o, int argc, char* const* argv, int i,
                        tr_errmsg_t* err) {
  char name[48];
  const char* v = NULL;
  if (i >= argc || !flag_name(argv[i], name, sizeof name, &v)) return 0;
  int id = -1, has_value = 0;
  for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
    if (strcmp(name, flags[k].name) == 0) {
      id = flags[k].id;
      has_value = flags[k].has_value;
    }
  if (id < 0) return 0;
  int used = 1;
  if (has_value && !v) {
    if (i + 1 >= argc)
      return tr_errmsg_set(err, TR_EINVAL, "--%s: missing value", name);
    v = argv[i + 1];
    used = 2;
  }
  if (!has_value && v)
    return tr_errmsg_set(err, TR_EINVAL, "--%s takes no value", name);
  long l;
  int rc = 0;
  switch (id) {
    case F_NNODES: {
      const char* colon = strchr(v, ':');
      long a, b;
      if (colon) {
        char lo[32];
        size_t n = (size_t)(colon - v);
        if (n >= sizeof lo) goto out_bad;
        memcpy(lo, v, n);
        lo[n] = '\0';
        if (parse_int(lo, 1, 1 << 20, &a) < 0 ||
            parse_int(colon + 1, 1, 1 << 20, &b) < 0 || a > b)
          return tr_errmsg_set(err, TR_EINVAL,
                               "--nnodes: expected N or MIN:MAX with 1 <= MIN "
                               "<= MAX, got '%s'",
                               v);
      } else {
        if (parse_int(v, 1, 1 << 20, &a) < 0)
          return tr_errmsg_set(err, TR_EINVAL,
                               "--nnodes: expected N or MIN:MAX with 1 <= MIN "
                               "<= MAX, got '%s'",
                               v);
        b = a;
      }
      o->nnodes_min = (int)a;
      o->nnodes_max = (int)b;
      o->tr__given |= TR__DOPT_NNODES;
      break;
    }
    case F_NPROC:
      if (strcmp(v, "gpu") == 0)
        o->nproc_per_node = TR_DAEMON_NPROC_GPU;
      else if (strcmp(v, "cpu") == 0)
        o->nproc_per_node = TR_DAEMON_NPROC_CPU;
      else if (strcmp(v, "auto") == 0)
        o->nproc_per_node = TR_DAEMON_NPROC_AUTO;
      else if (parse_int(v, 1, 65536, &l) == 0)
        o->nproc_per_node = (int)l;
      else
        return tr_errmsg_set(err, TR_EINVAL,
                             "--nproc-per-node: expected a number, gpu, cpu "
                             "or auto, got '%s'",
                             v);
      o->tr__given |= TR__DOPT_NPROC;
      break;
    case F_NODE_RANK:
      if (parse_int(v, -1, 1 << 20, &l) < 0)
        return tr_errmsg_set(
            err, TR_EINVAL, "--node-rank: expected a number >= 0, got '%s'", v);
      o->node_rank = (int)l;
      o->tr__given |= TR__DOPT_NODE_RANK;
      break;
    case F_ENDPOINT:
    case F_MASTER_ADDR: {
      int has_port = 0;
      if (parse_endpoint(v, &o->rdzv_host, &o->rdzv_port, &has_port) < 0)
        return tr_errmsg_set(err, TR_EINVAL,
                             "--%s: expected HOST[:PORT], got '%s'", name, v);
      o->tr__given |= TR__DOPT_ENDPOINT | (has_port ? TR__DOPT_PORT : 0);
      break;
    }
    case F_MASTER_PORT:
      if (parse_int(v, 1, 65535, &l) < 0)
        return tr_errmsg_set(err, TR_EINVAL,
                             "--master-port: expected a port 1-65535, got '%s'",
                             v);
      o->rdzv_port = (int)l;
      o->tr__given |= TR__DOPT_PORT;
      break;
    case F_RUN_ID:
      if (!*v || strpbrk(v, "/ \t\n"))
        return tr_errmsg_set(err, TR_EINVAL,
                             "--rdzv-id: expected a word without '/' or "
                             "spaces, got '%s'",
                             v);
      rc = set_str(&o->run_id, v);
      o->tr__given |= TR__DOPT_RUN_ID;
      break;
    case F_BACKEND:
      if (strcmp(v, "c10d") != 0 && strcmp(v, "static") != 0)
        return tr_errmsg_set(err, TR_EINVAL,
                             "--rdzv-backend: '%s' is not supported (trainrun "
                             "rendezvouses through its own TCPStore: c10d or "
                             "static)",
                             v);
      break;
    case F_CONF:
      rc = parse_rdzv_conf(o, v, err);
      break;
    case F_STANDALONE:
      o->standalone = 1;
      break;
    case F_MAX_RESTARTS:
      if (parse_int(v, 0, 1000000, &l) < 0)
        return tr_errmsg_set(err, TR_EINVAL,
                             "--max-restarts: expected a number >= 0, got "
                             "'%s'",
                             v);
      o->max_restarts = (int)l;
      break;
    case F_MONITOR:
      if (parse_seconds(v, 0.001, 3600, &o->monitor_interval) < 0)
        return tr_errmsg_set(err, TR_EINVAL,
                             "--monitor-interval: expected seconds (0.001 to "
                             "3600), got '%s'",
                             v);
      break;
    case F_FILTER: {
      int* list = NULL;
      int n = 0;
      if (parse_rank_list(v, &list, &n) < 0)
        return tr_errmsg_set(err, TR_EINVAL,
                             "--local-ranks-filter: expected ranks such as "
                             "0,2,4-7, got '%s'",
                             v);
      free(o->ranks_filter);
      o->ranks_filter = list;
      o->nranks_filter = n;
      break;
    }
    case F_TEE:
    case F_REDIRECTS:
      if (parse_std(v, id == F_TEE ? &o->tee : &o->redirects) < 0)
        return tr_errmsg_set(err, TR_EINVAL,
                             "--%s: expected 0-3 (none, stdout, stderr, both) "
                             "or LOCAL_RANK:0-3,..., got '%s'",
                             name, v);
      break;
    case F_LOG_DIR:
      if (!*v) goto out_bad;
      rc = set_str(&o->log_dir, v);
      break;
    case F_ROLE:
      if (!*v) goto out_bad;
      rc = set_str(&o->role, v);
      break;
    case F_WORKER_TIMEOUT:
      if (parse_seconds(v, 0, 86400 * 7, &o->worker_timeout) < 0)
        return tr_errmsg_set(err, TR_EINVAL,
                             "--worker-timeout: expected seconds (0 to "
                             "604800; 0: off), got '%s'",
                             v);
      break;
    case F_METRICS_PORT: {
      char* end;
      errno = 0;
      long port = strtol(v, &end, 10);
      if (!*v || *end || errno || port < 0 || port > 65535)
        return tr_errmsg_set(err, TR_EINVAL,
                             "--metrics-port: expected a port 0 to 65535 (0: "
                             "any free one), got '%s'",
                             v);
      o->metrics_port = (int)port;
      break;
    }
  }
  if (rc < 0) return rc;
  return used;
out_bad:
  return tr_errmsg_set(err, TR_EINVAL, "--%s: bad value '%s'", name, v);
}

/* ---- the cluster's environment ---- */

static int from_slurm(tr_daemon_opts_t* o, tr_errmsg_t* err) {
  int nodes = (int)tr_param_int(TR_PARAM_SLURM_STEP_NUM_NODES);
  int tasks = tr_param_is_set(TR_PARAM_SLURM_STEP_NUM_TASKS)
                  ? (int)tr_param_int(TR_PARAM_SLURM_STEP_NUM_TASKS)
                  : nodes;
  int per_task = tasks > nodes; /* several tasks per node: a task is a node */
  if (!(o->tr__given & TR__DOPT_NNODES))
    o->nnodes_min = o->nnodes_max = per_task ? tasks : nodes;
  if (!(o->tr__given & TR__DOPT_NODE_RANK))
    o->node_rank = (int)tr_param_int(per_task ? TR_PARAM_SLURM_PROCID
                                              : TR_PARAM_SLURM_NODEID);
  if (per_task && !(o->tr__given & TR__DOPT_NPROC)) o->nproc_per_node = 1;
  if (!(o->tr__given & TR__DOPT_ENDPOINT)) {
    const char* list = tr_param_str(TR_PARAM_SLURM_STEP_NODELIST);
    const char* var = "SLURM_STEP_NODELIST";
    if (!*list) {
      list = tr_param_str(TR_PARAM_SLURM_JOB_NODELIST);
      var = "SLURM_JOB_NODELIST";
    }
    char first[256];
    int rc = *list ? tr_nodelist_first(list, first, sizeof first) : TR_EINVAL;
    if (rc < 0)
      return tr_errmsg_set(err, TR_EINVAL,
                           "%s: cannot read the first host of '%s' (give "
                           "--rdzv-endpoint HOST:PORT)",
                           var, list);
    TR_CHECK(set_str(&o->rdzv_host, first));
  }
  if (!(o->tr__given & TR__DOPT_RUN_ID) && *tr_param_str(TR_PARAM_SLURM_JOB_ID))
    TR_CHECK(set_str(&o->run_id, tr_param_str(TR_PARAM_SLURM_JOB_ID)));
  o->env_source = "slurm";
  return 0;
}

static int from_ompi(tr_daemon_opts_t* o, tr_errmsg_t* err) {
  int size = (int)tr_param_int(TR_PARAM_OMPI_SIZE);
  int local = (int)tr_param_int(TR_PARAM_OMPI_LOCAL_SIZE);
  if (!(o->tr__given & TR__DOPT_NNODES)) o->nnodes_min = o->nnodes_max = size;
  if (!(o->tr__given & TR__DOPT_NODE_RANK))
    o->node_rank = (int)tr_param_int(TR_PARAM_OMPI_RANK);
  if (local > 1 && !(o->tr__given & TR__DOPT_NPROC)) o->nproc_per_node = 1;
  if (!(o->tr__given & TR__DOPT_ENDPOINT)) {
    if (*tr_param_str(TR_PARAM_MASTER_ADDR)) {
      TR_CHECK(set_str(&o->rdzv_host, tr_param_str(TR_PARAM_MASTER_ADDR)));
      if (!(o->tr__given & TR__DOPT_PORT))
        o->rdzv_port = (int)tr_param_int(TR_PARAM_MASTER_PORT);
    } else if (local == size) {
      TR_CHECK(set_str(&o->rdzv_host, "127.0.0.1"));
    } else if (size > 1) {
      return tr_errmsg_set(err, TR_EINVAL,
                           "under mpirun across hosts the rendezvous host is "
                           "unknown: give --rdzv-endpoint HOST:PORT, or "
                           "export MASTER_ADDR (mpirun -x MASTER_ADDR=HOST)");
    }
  }
  o->env_source = "openmpi";
  return 0;
}

int tr_daemon_opts_from_env(tr_daemon_opts_t* o, tr_errmsg_t* err) {
  if (o->standalone) return 0;
  if (tr_param_is_set(TR_PARAM_SLURM_STEP_NUM_NODES)) return from_slurm(o, err);
  if (tr_param_is_set(TR_PARAM_OMPI_SIZE)) return from_ompi(o, err);
  if (tr_param_int(TR_PARAM_SLURM_NNODES) > 1 &&
      !(o->tr__given & TR__DOPT_NNODES))
    TR_LOG_INFO(LAUNCH,
                "this Slurm allocation has %lld nodes but no srun step: "
                "running on this node only (srun trainrun ... uses them all)",
                (long long)tr_param_int(TR_PARAM_SLURM_NNODES));
  return 0;
}

static int cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return 1;
}

int tr_daemon_opts_finish(tr_daemon_opts_t* o, tr_daemon_device_t device,
                          tr_errmsg_t* err) {
  if (o->standalone) {
    if (o->nnodes_max != 1)
      return tr_errmsg_set(err, TR_EINVAL,
                           "--standalone runs one node; it cannot be "
                           "combined with --nnodes %d",
                           o->nnodes_max);
    if (o->tr__given & TR__DOPT_ENDPOINT)
      return tr_errmsg_set(err, TR_EINVAL,
                           "--standalone picks its own endpoint; drop "
                           "--rdzv-endpoint");
  }
  int n = o->nproc_per_node;
  if (n == TR_DAEMON_NPROC_UNSET)
    n = device == TR_DAEMON_DEVICE_GPU   ? TR_DAEMON_NPROC_GPU
        : device == TR_DAEMON_DEVICE_CPU ? 1
                                         : TR_DAEMON_NPROC_AUTO;
  if (n == TR_DAEMON_NPROC_GPU || n == TR_DAEMON_NPROC_AUTO) {
    int g = tr_daemon_gpu_count();
    if (g == 0 && n == TR_DAEMON_NPROC_GPU)
      return tr_errmsg_set(err, TR_EINVAL,
                           "--nproc-per-node gpu: no GPU found (none in "
                           "/proc/driver/nvidia/gpus%s)",
                           tr_param_is_set(TR_PARAM_CUDA_VISIBLE_DEVICES)
                               ? " or CUDA_VISIBLE_DEVICES"
                               : "");
    n = g > 0 ? g : 1;
  } else if (n == TR_DAEMON_NPROC_CPU) {
    n = cpu_count();
  }
  o->nproc_per_node = n;
  if (o->node_rank >= o->nnodes_max)
    return tr_errmsg_set(err, TR_EINVAL,
                         "--node-rank %d is not below the %d node%s of "
                         "--nnodes",
                         o->node_rank, o->nnodes_max,
                         o->nnodes_max == 1 ? "" : "s");
  /* one node found by srun or mpirun: a private store, no fixed port that
   * another job on this machine may hold */
  if (o->nnodes_max == 1 && o->rdzv_host && o->env_source &&
      !(o->tr__given & TR__DOPT_ENDPOINT)) {
    free(o->rdzv_host);
    o->rdzv_host = NULL;
  }
  if (o->nnodes_max > 1 && !o->rdzv_host)
    return tr_errmsg_set(err, TR_EINVAL,
                         "--nnodes %d needs --rdzv-endpoint HOST:PORT (or a "
                         "run under srun or mpirun)",
                         o->nnodes_max);
  if (!o->run_id) TR_CHECK(set_str(&o->run_id, "none"));
  if (!o->role) TR_CHECK(set_str(&o->role, "default"));
  if (!o->prog) o->prog = "trainrun";
  return 0;
}
