/* tests/pg_suite.h: the multi-rank process-group test bodies shared by
 * check_pg (Gloo), check_pg_mpi (MPI under mpirun) and check_pg_nccl (NCCL
 * on GPUs), and the harness that runs a body on N forked ranks that
 * rendezvous through a store server on 127.0.0.1 (port 0).
 *
 * A body runs in a rank's process; PCHECK failures print the rank, file,
 * line and expression and _exit(1), so the parent sees a nonzero status. */
#ifndef TRAINRUN_TESTS_PG_SUITE_H
#define TRAINRUN_TESTS_PG_SUITE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include "trainrun/pg.h"
#include "trainrun/store.h"
#include "trainrun/tensor.h"

typedef struct {
  const char* backend;  /* the world's backend spec */
  tr_device_type_t dev; /* tensors of the body */
  int cpu_float_sums;   /* backend reduces bf16/f16 sums in float */
  tr_store_client_t* store;
  int rank, size;
} pg_ctx_t;

typedef void (*pg_body_fn)(tr_pg_t* world, pg_ctx_t* ctx);

#define PCHECK(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", pg_test_rank, \
              __FILE__, __LINE__, #cond);                                 \
      fflush(stderr);                                                     \
      _exit(1);                                                           \
    }                                                                     \
  } while (0)

#define PCHECK_RC(call)                                                      \
  do {                                                                       \
    int rc_ = (call);                                                        \
    if (rc_ != 0) {                                                          \
      fprintf(stderr, "rank %d: %s:%d: %s returned %d (%s)\n", pg_test_rank, \
              __FILE__, __LINE__, #call, rc_, tr_err_name(rc_));             \
      fflush(stderr);                                                        \
      _exit(1);                                                              \
    }                                                                        \
  } while (0)

extern int pg_test_rank;
/* tr_pg_opts_t.failure_key of the worlds pg_spawn creates (NULL: none). */
extern const char* pg_failure_key;

/* Run body on n forked ranks with backend; each rank gets a world with
 * timeout_ms, and cuda_device = rank. status[i]: the rank's exit code,
 * 128 + signal, or -1 when it was still running after limit_s seconds (then
 * killed). Returns 0 when the server and the forks worked. */
int pg_spawn(int n, const char* backend, tr_device_type_t dev,
             int cpu_float_sums, int64_t timeout_ms, pg_body_fn body,
             int limit_s, int* status);

/* A store server for a test (127.0.0.1, port 0). */
tr_store_server_t* pg_server_start(int* port);
/* The same in a forked process (kill it with SIGKILL); -1 on failure. */
pid_t pg_server_fork(int* port);
/* A client of it. */
tr_store_client_t* pg_client(int port);

/* The bodies. */
void pg_body_ops(tr_pg_t* world, pg_ctx_t* ctx);       /* every op x dtype */
void pg_body_subgroups(tr_pg_t* world, pg_ctx_t* ctx); /* new_group, split */
void pg_body_async(tr_pg_t* world, pg_ctx_t* ctx);     /* overlap, test, cb */
void pg_body_timeout(tr_pg_t* world, pg_ctx_t* ctx);   /* 2 ranks */
void pg_body_die(tr_pg_t* world, pg_ctx_t* ctx);       /* last rank dies */
void pg_body_hooks(tr_pg_t* world, pg_ctx_t* ctx);     /* recorder hooks */
void pg_body_timing(tr_pg_t* world, pg_ctx_t* ctx);    /* op durations */
void pg_body_waits(tr_pg_t* world, pg_ctx_t* ctx);     /* pg_waits.h */
/* 2 ranks, pg_failure_key set: rank 1 stays out of an all-reduce and writes
 * a failure report there; rank 0's op fails with it within seconds. */
void pg_body_job_failure(tr_pg_t* world, pg_ctx_t* ctx);

/* Exit status the dying rank of pg_body_die uses. */
#define PG_DIE_STATUS 3

#endif /* TRAINRUN_TESTS_PG_SUITE_H */
