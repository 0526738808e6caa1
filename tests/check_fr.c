/* tests/check_fr.c: the flight recorder's recording half -- the ring read
 * by another process while a writer runs, entries of real ops (fake
 * backend in one process, Gloo on forked ranks) with PyTorch's fields,
 * the pickle dump loaded by python3 with every schema field and its type
 * checked, the JSON twin parsed by jansson, and a dump from the ring of a
 * worker killed with SIGKILL. */
#include "config.h"

#include <check.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "flight_recorder/ring.h"
#include "tests/pg_suite.h"
#include "trainrun/error.h"
#include "trainrun/flight_recorder.h"
#include "trainrun/param.h"
#include "trainrun/pg.h"

static char g_dir[256]; /* this test's dump folder */

static void make_dir(void) {
  snprintf(g_dir, sizeof g_dir, "%s/check_fr_XXXXXX",
           getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

/* Dumps at <g_dir>/<name> write their JSON twin to the sibling folder
 * <g_dir>_json: remove both. */
static void rm_dir(void) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s_json'", g_dir, g_dir);
  ck_assert_int_eq(system(cmd), 0);
}

static void shm_name(char* buf, size_t cap, const char* what, int rank) {
  snprintf(buf, cap, "/trainrun-check-%d-%s-%d", (int)getpid(), what, rank);
}

static tr_pg_t* fake_world(void) {
  tr_pg_opts_t o;
  tr_pg_opts_init(&o);
  o.rank = 0;
  o.world_size = 1;
  o.backend = "fake";
  tr_pg_t* pg = NULL;
  ck_assert_int_eq(tr_pg_new(&o, &pg), 0);
  return pg;
}

/* Run python3 on a script with the dump path as argv[1]; its exit code. */
static int run_python(const char* script, const char* path) {
  const char* py = getenv("PYTHON3");
  if (!py || !*py) py = "python3";
  char spath[300];
  snprintf(spath, sizeof spath, "%s/check.py", g_dir);
  FILE* f = fopen(spath, "w");
  ck_assert_ptr_nonnull(f);
  fputs(script, f);
  fclose(f);
  char cmd[3000];
  snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", py, spath, path);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Every PyTorch schema field with its type; argv[2..]: expectations. */
static const char* k_schema_py =
    "import pickle, sys\n"
    "d = pickle.load(open(sys.argv[1], 'rb'))\n"
    "assert isinstance(d, dict), type(d)\n"
    "assert d['version'] == '2.10', d['version']\n"
    "assert isinstance(d['comm_lib_version'], str)\n"
    "assert isinstance(d['pg_config'], dict) and d['pg_config']\n"
    "for k, v in d['pg_config'].items():\n"
    "    assert isinstance(k, str)\n"
    "    assert set(v) == {'name', 'desc', 'ranks'}, v\n"
    "    assert all(isinstance(x, str) for x in v.values()), v\n"
    "    assert isinstance(eval(v['ranks']), list)\n"
    "assert isinstance(d['pg_status'], dict) and d['pg_status']\n"
    "for k, v in d['pg_status'].items():\n"
    "    int(k)\n"
    "    for f in ('last_enqueued_collective', 'last_started_collective',\n"
    "              'last_completed_collective'):\n"
    "        assert type(v[f]) is int, (f, v)\n"
    "E = d['entries']\n"
    "assert isinstance(E, list) and E\n"
    "ints = ('record_id', 'pg_id', 'collective_seq_id', 'p2p_seq_id',\n"
    "        'op_id', 'time_created_ns', 'timeout_ms')\n"
    "prev = -1\n"
    "for e in E:\n"
    "    for f in ints: assert type(e[f]) is int, (f, e)\n"
    "    assert e['record_id'] > prev; prev = e['record_id']\n"
    "    pg = e['process_group']\n"
    "    assert type(pg) is tuple and len(pg) == 2, pg\n"
    "    assert all(isinstance(x, str) for x in pg)\n"
    "    assert isinstance(e['profiling_name'], str)\n"
    "    assert ':' in e['profiling_name']\n"
    "    for f in ('input_sizes', 'output_sizes'):\n"
    "        assert type(e[f]) is list, (f, e)\n"
    "        for s in e[f]: assert all(type(x) is int for x in s), s\n"
    "    for f in ('input_dtypes', 'output_dtypes'):\n"
    "        assert all(isinstance(x, str) for x in e[f]), (f, e)\n"
    "    assert e['state'] in ('scheduled', 'started', 'completed')\n"
    "    for f in ('time_discovered_started_ns',\n"
    "              'time_discovered_completed_ns'):\n"
    "        assert e[f] is None or type(e[f]) is int, (f, e)\n"
    "    assert (e['state'] == 'completed') == \\\n"
    "        (e['time_discovered_completed_ns'] is not None)\n"
    "    assert type(e['retired']) is bool and type(e['is_p2p']) is bool\n"
    "    if 'duration_ms' in e: assert type(e['duration_ms']) is float\n"
    "    assert isinstance(e['thread_id'], str)\n"
    "    assert isinstance(e['thread_name'], str)\n"
    "    assert type(e['frames']) is list\n"
    "    for fr in e['frames']:\n"
    "        assert set(fr) == {'name', 'filename', 'line'}, fr\n"
    "        assert isinstance(fr['name'], str) and type(fr['line']) is int\n"
    "exp = dict(a.split('=', 1) for a in sys.argv[2:] if a)\n"
    "if 'n' in exp: assert len(E) == int(exp['n']), len(E)\n"
    "e0 = E[0]\n"
    "if 'name0' in exp: assert e0['profiling_name'] == exp['name0'], e0\n"
    "if 'in0' in exp: assert e0['input_sizes'] == eval(exp['in0']), e0\n"
    "if 'dt0' in exp: assert e0['input_dtypes'] == [exp['dt0']], e0\n"
    "if 'ranks' in exp:\n"
    "    want = exp['ranks'].replace('_', ' ')\n"
    "    assert d['pg_config']['0']['ranks'] == want, d['pg_config']\n"
    "if 'frames' in exp: assert E[0]['frames'], E[0]\n"
    "if 'last' in exp:\n"
    "    assert E[-1]['state'] == exp['last'], E[-1]\n"
    "    assert E[-1]['retired'] is True\n"
    "if 'dur' in exp: assert all('duration_ms' in e for e in E)\n"
    "sys.exit(0)\n";

static int check_pickle(const char* path, const char* args) {
  char p2[1024];
  snprintf(p2, sizeof p2, "%s' %s '", path, args); /* extra argv items */
  return run_python(k_schema_py, p2);
}

/* The JSON twin: PyTorch's JSON conventions. */
static void check_json(const char* path, size_t want_entries) {
  /* <dir>/<name> -> <dir>_json/<name>.json */
  char jpath[600];
  const char* slash = strrchr(path, '/');
  ck_assert(slash != NULL);
  snprintf(jpath, sizeof jpath, "%.*s_json%s.json", (int)(slash - path), path,
           slash);
  json_error_t err;
  json_t* root = json_load_file(jpath, 0, &err);
  ck_assert_msg(root != NULL, "%s: %s", jpath, err.text);
  ck_assert_str_eq(json_string_value(json_object_get(root, "version")), "2.10");
  json_t* st = json_object_get(root, "pg_status");
  ck_assert(json_is_object(st));
  const char* k;
  json_t* v;
  json_object_foreach(st, k, v) {
    ck_assert(json_is_string(json_object_get(v, "last_completed_collective")));
  }
  json_t* ents = json_object_get(root, "entries");
  ck_assert(json_is_array(ents));
  ck_assert_uint_eq(json_array_size(ents), want_entries);
  size_t i;
  json_array_foreach(ents, i, v) {
    ck_assert(json_is_array(json_object_get(v, "process_group")));
    ck_assert_uint_eq(json_array_size(json_object_get(v, "process_group")), 2);
    ck_assert(
        json_is_integer(json_object_get(v, "time_discovered_started_ns")));
    ck_assert(
        json_is_integer(json_object_get(v, "time_discovered_completed_ns")));
    ck_assert(json_is_boolean(json_object_get(v, "retired")));
    ck_assert_ptr_null(json_object_get(v, "frames"));
  }
  json_decref(root);
}

/* ---- one process, the fake backend ---- */

START_TEST(test_fake_entries_and_dump) {
  make_dir();
  char name[128];
  shm_name(name, sizeof name, "fake", 0);
  tr_fr_opts_t o;
  tr_fr_opts_init(&o);
  o.shm_name = name;
  o.capacity = 16;
  o.stacks = 1;
  o.timing = 1;
  o.dump_dir = g_dir;
  tr_fr_t* fr = NULL;
  ck_assert_int_eq(tr_fr_init(&o, &fr), 0);
  ck_assert_ptr_nonnull(fr);
  tr_fr_t* fr2 = NULL;
  ck_assert_int_eq(tr_fr_init(&o, &fr2), TR_EEXIST);
  tr_pg_t* pg = fake_world();
  ck_assert_int_eq(tr_fr_add_group(fr, pg), 0);
  tr_pg_set_timeout(pg, 4321);
  int64_t shape[2] = {2, 3};
  tr_tensor_t t, big;
  ck_assert_int_eq(tr_tensor_zeros(&t, TR_BF16, TR_DEVICE_CPU, 2, shape), 0);
  int64_t bs[1] = {6};
  ck_assert_int_eq(tr_tensor_zeros(&big, TR_BF16, TR_DEVICE_CPU, 1, bs), 0);
  /* 20 ops in a ring of 16: the oldest 4 are gone */
  for (int i = 0; i < 20; i++)
    ck_assert_int_eq(tr_pg_all_reduce(pg, &t, TR_PG_SUM, NULL), 0);

  tr_fr_snapshot_t s;
  ck_assert_int_eq(tr_fr_snapshot_self(fr, &s), 0);
  ck_assert_uint_eq(s.nentries, 16);
  ck_assert_uint_eq(s.torn, 0);
  ck_assert_int_eq(s.npgs, 1);
  ck_assert_str_eq(s.pgs[0].name, "0");
  ck_assert_str_eq(s.pgs[0].desc, "default_pg");
  ck_assert_int_eq(s.pgs[0].n, 1);
  ck_assert_int_eq(s.pgs[0].last_enqueued, 20);
  ck_assert_int_eq(s.pgs[0].last_completed, 20);
  const tr_fr_entry_t* e = &s.entries[0];
  ck_assert_int_eq(e->record_id, 4);
  ck_assert_int_eq(e->collective_seq_id, 5);
  ck_assert_int_eq(e->op_id, 5);
  ck_assert_int_eq(e->p2p_seq_id, 0);
  ck_assert_str_eq(e->profiling_name, "fake:all_reduce");
  ck_assert_str_eq(e->pg_name, "0");
  ck_assert_int_eq(e->timeout_ms, 4321);
  ck_assert_int_eq(e->state, TR_FR_COMPLETED);
  ck_assert(e->retired && !e->is_p2p && e->has_duration);
  ck_assert(e->time_created_ns > 0 && e->time_started_ns >= e->time_created_ns);
  ck_assert(e->time_completed_ns >= e->time_started_ns);
  ck_assert_int_eq(e->n_inputs, 1);
  ck_assert_int_eq(e->inputs[0].ndim, 2);
  ck_assert_int_eq(e->inputs[0].shape[1], 3);
  ck_assert_int_eq(e->inputs[0].dtype, TR_BF16);
  ck_assert_int_gt(e->nframes, 0);
  ck_assert_int_gt(e->thread_id, 0);
  tr_fr_snapshot_release(&s);

  ck_assert_int_eq(tr_pg_barrier(pg, NULL), 0);
  char path[600];
  ck_assert_int_eq(tr_fr_snapshot_self(fr, &s), 0);
  ck_assert_int_eq(tr_fr_dump_write(&s, NULL, NULL, path, sizeof path), 0);
  char want[600];
  snprintf(want, sizeof want, "%s/rank_0", g_dir);
  ck_assert_str_eq(path, want);
  ck_assert_int_eq(check_pickle(path,
                                "n=16 name0=fake:all_reduce in0=[[2,3]] "
                                "dt0=BFloat16 ranks=[0] frames=1 dur=1"),
                   0);
  check_json(path, 16);
  tr_fr_snapshot_release(&s);

  /* SIGUSR1 asks for a dump of this rank */
  tr_fr_ring_t* ring = NULL;
  ck_assert_int_eq(tr_fr_ring_open(name, &ring), 0);
  tr_fr_ring_info_t info;
  tr_fr_ring_info(ring, &info);
  ck_assert_int_eq(info.dump_req, 0);
  ck_assert_int_eq(info.next_record, 21);
  ck_assert_int_eq(info.in_flight, 0);
  raise(SIGUSR1);
  tr_fr_ring_info(ring, &info);
  ck_assert_int_eq(info.dump_req, 1);
  ck_assert_int_eq(info.dump_scope, 0);
  tr_fr_ring_close(ring);

  tr_tensor_release(&t);
  tr_tensor_release(&big);
  tr_pg_free(pg);
  tr_fr_free(fr);
  ck_assert_int_eq(tr_fr_ring_open(name, &ring), TR_ENOENT);
  rm_dir();
}
END_TEST

/* ---- a reader process while the writer runs ---- */

#define CONC_OPS 40000

/* The child: snapshot until the last record shows up; every entry must be
 * whole (its shape is a function of its sequence number). */
static int reader_main(const char* name) {
  tr_fr_ring_t* r = NULL;
  for (int i = 0; i < 2000 && tr_fr_ring_open(name, &r) != 0; i++) usleep(1000);
  if (!r) return 2;
  int snaps = 0;
  for (;;) {
    tr_fr_snapshot_t s;
    if (tr_fr_snapshot(r, &s) != 0) return 3;
    int64_t prev = -1;
    for (size_t i = 0; i < s.nentries; i++) {
      const tr_fr_entry_t* e = &s.entries[i];
      int64_t want = e->collective_seq_id % 5 + 1;
      if (e->record_id <= prev || e->collective_seq_id != e->record_id + 1 ||
          e->op_id != e->collective_seq_id || e->inputs[0].ndim != 1 ||
          e->inputs[0].shape[0] != want ||
          strcmp(e->profiling_name, "fake:all_reduce") != 0) {
        fprintf(stderr, "torn entry %lld: seq %lld shape %lld\n",
                (long long)e->record_id, (long long)e->collective_seq_id,
                (long long)e->inputs[0].shape[0]);
        return 4;
      }
      prev = e->record_id;
    }
    snaps++;
    int done = s.nentries &&
               s.entries[s.nentries - 1].record_id == CONC_OPS - 1 &&
               s.entries[s.nentries - 1].state == TR_FR_COMPLETED;
    tr_fr_snapshot_release(&s);
    if (done) break;
  }
  tr_fr_ring_close(r);
  return snaps > 1 ? 0 : 5;
}

START_TEST(test_ring_concurrent_reader) {
  char name[128];
  shm_name(name, sizeof name, "conc", 0);
  fflush(stdout);
  fflush(stderr);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) _exit(reader_main(name));
  tr_fr_opts_t o;
  tr_fr_opts_init(&o);
  o.shm_name = name;
  o.capacity = 512;
  o.stacks = 0;
  tr_fr_t* fr = NULL;
  ck_assert_int_eq(tr_fr_init(&o, &fr), 0);
  tr_pg_t* pg = fake_world();
  tr_tensor_t t[5];
  for (int i = 0; i < 5; i++) {
    int64_t n = i + 1;
    ck_assert_int_eq(tr_tensor_zeros(&t[i], TR_F32, TR_DEVICE_CPU, 1, &n), 0);
  }
  for (int i = 1; i <= CONC_OPS; i++)
    ck_assert_int_eq(tr_pg_all_reduce(pg, &t[i % 5], TR_PG_SUM, NULL), 0);
  int st = 0;
  ck_assert_int_eq(waitpid(child, &st, 0), child);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "reader status %d", st);
  for (int i = 0; i < 5; i++) tr_tensor_release(&t[i]);
  tr_pg_free(pg);
  tr_fr_free(fr);
}
END_TEST

/* ---- a worker killed with SIGKILL: its ring outlives it ---- */

START_TEST(test_killed_worker_dump) {
  make_dir();
  char name[128];
  shm_name(name, sizeof name, "killed", 3);
  int pfd[2];
  ck_assert_int_eq(pipe(pfd), 0);
  fflush(stdout);
  fflush(stderr);
  pid_t child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    tr_fr_opts_t o;
    tr_fr_opts_init(&o);
    o.shm_name = name;
    o.rank = 3;
    o.world_size = 4;
    o.capacity = 100;
    o.dump_dir = g_dir;
    o.dump_prefix = "trace_";
    tr_fr_t* fr = NULL;
    if (tr_fr_init(&o, &fr) != 0) _exit(1);
    tr_pg_opts_t po;
    tr_pg_opts_init(&po);
    po.rank = 3;
    po.world_size = 4;
    po.backend = "fake";
    tr_pg_t* pg = NULL;
    if (tr_pg_new(&po, &pg) != 0) _exit(1);
    tr_fr_add_group(fr, pg);
    int64_t n = 8;
    tr_tensor_t a, b;
    tr_tensor_zeros(&a, TR_F32, TR_DEVICE_CPU, 1, &n);
    n = 32;
    tr_tensor_zeros(&b, TR_F32, TR_DEVICE_CPU, 1, &n);
    for (int i = 0; i < 7; i++) tr_pg_all_reduce(pg, &a, TR_PG_SUM, NULL);
    tr_pg_all_gather(pg, &b, &a, NULL);
    char c = 1;
    if (write(pfd[1], &c, 1) != 1) _exit(1);
    for (;;) pause(); /* killed here, the ring still mapped */
  }
  close(pfd[1]);
  char c;
  ck_assert_int_eq(read(pfd[0], &c, 1), 1);
  close(pfd[0]);
  kill(child, SIGKILL);
  int st;
  ck_assert_int_eq(waitpid(child, &st, 0), child);
  ck_assert(WIFSIGNALED(st));

  tr_fr_ring_t* r = NULL;
  ck_assert_int_eq(tr_fr_ring_open(name, &r), 0);
  tr_fr_ring_info_t info;
  tr_fr_ring_info(r, &info);
  ck_assert_int_eq(info.rank, 3);
  ck_assert_int_eq(info.world_size, 4);
  ck_assert_int_eq(info.pid, child);
  ck_assert_int_eq(info.next_record, 8);
  tr_fr_snapshot_t s;
  ck_assert_int_eq(tr_fr_snapshot(r, &s), 0);
  ck_assert_uint_eq(s.nentries, 8);
  ck_assert_str_eq(s.entries[7].profiling_name, "fake:_all_gather_base");
  ck_assert_int_eq(s.entries[7].outputs[0].shape[0], 32);
  char path[600];
  ck_assert_int_eq(tr_fr_dump_write(&s, NULL, NULL, path, sizeof path), 0);
  char want[600];
  snprintf(want, sizeof want, "%s/trace_3", g_dir);
  ck_assert_str_eq(path, want);
  ck_assert_int_eq(check_pickle(path, "n=9"), 1); /* the checker can fail */
  ck_assert_int_eq(
      check_pickle(path, "n=8 ranks=[0,_1,_2,_3] in0=[[8]] dt0=Float"), 0);
  check_json(path, 8);
  /* TRAINRUN_FR_NCCL_NAMES: names torchfrtrace accepts (nccl:) */
  setenv("TRAINRUN_FR_NCCL_NAMES", "1", 1);
  tr_param_reset();
  char ndir[400];
  snprintf(ndir, sizeof ndir, "%s/nccl", g_dir);
  ck_assert_int_eq(tr_fr_dump_write(&s, ndir, "r", path, sizeof path), 0);
  ck_assert_int_eq(check_pickle(path, "n=8 name0=nccl:all_reduce"), 0);
  unsetenv("TRAINRUN_FR_NCCL_NAMES");
  tr_param_reset();
  tr_fr_snapshot_release(&s);
  /* the last entries only (what `trainrun fr follow` polls) */
  ck_assert_int_eq(tr_fr_snapshot_last(r, 3, &s), 0);
  ck_assert_uint_eq(s.nentries, 3);
  ck_assert_int_eq(s.entries[0].record_id, 5);
  ck_assert_int_eq(s.entries[2].record_id, 7);
  tr_fr_snapshot_release(&s);
  tr_fr_ring_close(r);

  /* a slot left half written (a writer killed inside it) is skipped */
  int fd = shm_open(name, O_RDWR, 0);
  ck_assert_int_ge(fd, 0);
  struct stat sst;
  ck_assert_int_eq(fstat(fd, &sst), 0);
  tr__fr_shm_hdr_t* h = mmap(NULL, (size_t)sst.st_size, PROT_READ | PROT_WRITE,
                             MAP_SHARED, fd, 0);
  ck_assert(h != MAP_FAILED);
  close(fd);
  tr__fr_entries(h)[2].seq |= 1;
  ck_assert_int_eq(tr_fr_ring_open(name, &r), 0);
  ck_assert_int_eq(tr_fr_snapshot(r, &s), 0);
  ck_assert_uint_eq(s.nentries, 7);
  ck_assert_uint_eq(s.torn, 1);
  ck_assert_int_eq(s.entries[2].record_id, 3);
  tr_fr_snapshot_release(&s);
  tr_fr_ring_close(r);
  munmap(h, (size_t)sst.st_size);
  ck_assert_int_eq(tr_fr_ring_unlink(name), 0);
  ck_assert_int_eq(tr_fr_ring_open(name, &r), TR_ENOENT);
  rm_dir();
}
END_TEST

#ifdef HAVE_GLOO
/* ---- real Gloo ops on forked ranks ---- */

static void body_gloo(tr_pg_t* world, pg_ctx_t* c) {
  char name[128];
  snprintf(name, sizeof name, "/trainrun-check-%d-gloo-%d", (int)getppid(),
           c->rank);
  tr_fr_opts_t o;
  tr_fr_opts_init(&o);
  o.shm_name = name;
  o.rank = c->rank;
  o.world_size = c->size;
  o.capacity = 64;
  o.dump_dir = g_dir;
  o.timing = 1;
  tr_fr_t* fr = NULL;
  PCHECK_RC(tr_fr_init(&o, &fr));
  PCHECK_RC(tr_fr_add_group(fr, world));
  int n = c->size, r = c->rank;
  int64_t shape[2] = {2, 3};
  tr_tensor_t t, full, s1, d1;
  PCHECK_RC(tr_tensor_zeros(&t, TR_F32, TR_DEVICE_CPU, 2, shape));
  int64_t fs[2] = {2 * n, 3};
  PCHECK_RC(tr_tensor_zeros(&full, TR_F32, TR_DEVICE_CPU, 2, fs));
  int64_t four = 4;
  PCHECK_RC(tr_tensor_zeros(&s1, TR_U8, TR_DEVICE_CPU, 1, &four));
  PCHECK_RC(tr_tensor_zeros(&d1, TR_U8, TR_DEVICE_CPU, 1, &four));
  PCHECK_RC(tr_pg_all_reduce(world, &t, TR_PG_SUM, NULL));
  PCHECK_RC(tr_pg_all_gather(world, &full, &t, NULL));
  int all[16];
  for (int i = 0; i < n; i++) all[i] = n - 1 - i;
  tr_pg_t* sub = NULL;
  PCHECK_RC(tr_pg_new_group(world, all, n, "sub", &sub));
  PCHECK_RC(tr_pg_broadcast(sub, &t, 0, NULL));
  PCHECK_RC(tr_pg_coalesce_begin(world));
  PCHECK_RC(tr_pg_send(world, &s1, (r + 1) % n, 0, NULL));
  PCHECK_RC(tr_pg_recv(world, &d1, (r - 1 + n) % n, 0, NULL));
  PCHECK_RC(tr_pg_coalesce_end(world, NULL));
  PCHECK_RC(tr_pg_barrier(world, NULL));

  /* a waiter may return before the completion hooks ran: give them time */
  tr_fr_snapshot_t s;
  for (int tries = 0;; tries++) {
    PCHECK_RC(tr_fr_snapshot_self(fr, &s));
    int done = s.nentries == 7;
    for (size_t i = 0; done && i < s.nentries; i++)
      done = s.entries[i].state == TR_FR_COMPLETED;
    if (done || tries == 200) break;
    tr_fr_snapshot_release(&s);
    usleep(10000);
  }
  PCHECK(s.nentries == 7 && s.torn == 0 && s.npgs == 2);
  PCHECK(!strcmp(s.pgs[1].name, "1") && !strcmp(s.pgs[1].desc, "sub"));
  PCHECK(s.pgs[1].n == n && s.pgs[1].ranks[0] == 0);
  const tr_fr_entry_t* e = s.entries;
  PCHECK(!strcmp(e[0].profiling_name, "gloo:all_reduce"));
  PCHECK(!strcmp(e[1].profiling_name, "gloo:_all_gather_base"));
  PCHECK(e[1].outputs[0].shape[0] == 2 * n && e[1].collective_seq_id == 2);
  PCHECK(!strcmp(e[2].profiling_name, "gloo:broadcast"));
  PCHECK(!strcmp(e[2].pg_name, "1") && e[2].collective_seq_id == 1);
  char want[64];
  snprintf(want, sizeof want, "gloo:send %d->%d", r, (r + 1) % n);
  PCHECK(!strcmp(e[3].profiling_name, want));
  PCHECK(e[3].is_p2p && e[3].p2p_seq_id == 1 && e[3].n_inputs == 1);
  snprintf(want, sizeof want, "gloo:recv %d<-%d", r, (r - 1 + n) % n);
  PCHECK(!strcmp(e[4].profiling_name, want));
  PCHECK(!strcmp(e[5].profiling_name, "gloo:coalesced") && e[5].is_p2p);
  PCHECK(!strcmp(e[6].profiling_name, "gloo:barrier"));
  for (int i = 0; i < 7; i++)
    PCHECK(e[i].state == TR_FR_COMPLETED && e[i].retired && e[i].has_duration &&
           e[i].duration_ms >= 0);
  PCHECK(s.pgs[0].last_completed == 3); /* all_reduce, all_gather, barrier */
  PCHECK_RC(tr_fr_dump_write(&s, NULL, NULL, NULL, 0));
  tr_fr_snapshot_release(&s);
  tr_pg_free(sub);
  tr_tensor_release(&t);
  tr_tensor_release(&full);
  tr_tensor_release(&s1);
  tr_tensor_release(&d1);
  tr_fr_free(fr);
}

START_TEST(test_gloo_entries) {
  int n = 2 + 2 * _i; /* 2 and 4 ranks */
  make_dir();
  int st[16];
  ck_assert_int_eq(pg_spawn(n, "gloo", TR_DEV_CPU, 1, 30000, body_gloo, 60, st),
                   0);
  for (int r = 0; r < n; r++) { /* a rank that failed left its ring */
    char name[128];
    snprintf(name, sizeof name, "/trainrun-check-%d-gloo-%d", (int)getpid(), r);
    tr_fr_ring_unlink(name);
  }
  for (int r = 0; r < n; r++)
    ck_assert_msg(st[r] == 0, "rank %d: %d", r, st[r]);
  for (int r = 0; r < n; r++) {
    char path[600], args[200];
    snprintf(path, sizeof path, "%s/rank_%d", g_dir, r);
    snprintf(args, sizeof args,
             "n=7 name0=gloo:all_reduce in0=[[2,3]] dt0=Float dur=1 "
             "ranks=%s",
             n == 2 ? "[0,_1]" : "[0,_1,_2,_3]");
    ck_assert_int_eq(check_pickle(path, args), 0);
    check_json(path, 7);
  }
  rm_dir();
}
END_TEST
#endif

static Suite* fr_suite(void) {
  Suite* s = suite_create("flight_recorder");
  TCase* tc = tcase_create("ring");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_fake_entries_and_dump);
  tcase_add_test(tc, test_ring_concurrent_reader);
  tcase_add_test(tc, test_killed_worker_dump);
  suite_add_tcase(s, tc);
#ifdef HAVE_GLOO
  tc = tcase_create("gloo");
  tcase_set_timeout(tc, 90);
  tcase_add_loop_test(tc, test_gloo_entries, 0, 2);
  suite_add_tcase(s, tc);
#endif
  return s;
}

int main(void) {
  SRunner* sr = srunner_create(fr_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
