/* trainrun/param.h: the registry of environment variables.
 *
 * Every environment variable trainrun reads is one line of TR_PARAM_MAP
 * (name, type, default, bounds, description), as NCCL_PARAM and Redis's
 * static config table do. A value is read from the environment once, on
 * first use, checked against its type and bounds, and cached; a bad value
 * is reported once with a warning naming the variable and the default is
 * used. `trainrun --help-env` prints the table (tr_param_print).
 *
 * To add a variable: add one XX line below; read it with
 * tr_param_int(TR_PARAM_<NAME>) and friends.
 */
#ifndef TRAINRUN_PARAM_H
#define TRAINRUN_PARAM_H

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TR_PARAM_T_INT,    /* int64, bounds inclusive */
  TR_PARAM_T_DOUBLE, /* double, bounds inclusive */
  TR_PARAM_T_BOOL,   /* 0/1/true/false/yes/no/on/off */
  TR_PARAM_T_STRING  /* any text */
} tr_param_type_t;

/* XX(ID, "ENV_NAME", type, "default", min, max, "description") */
#define TR_PARAM_MAP(XX)                                                       \
  XX(LOG_LEVEL, "TRAINRUN_LOG_LEVEL", STRING, "warn", 0, 0,                    \
     "log level: none, error, warn, info, debug, trace")                       \
  XX(LOG_SUBSYS, "TRAINRUN_LOG_SUBSYS", STRING, "all", 0, 0,                   \
     "subsystems to log: comma list of core,config,store,coll,fr,kernels,"     \
     "model,dtensor,fsdp,pp,ckpt,train,daemon,launch; all; ^name excludes")    \
  XX(NUM_THREADS, "TRAINRUN_NUM_THREADS", INT, "0", 0, 4096,                   \
     "CPU kernel threads per rank; 0 = OMP_NUM_THREADS, else the cores")       \
  XX(OMP_NUM_THREADS, "OMP_NUM_THREADS", INT, "0", 0, 4096,                  \
     "read when TRAINRUN_NUM_THREADS is 0: CPU kernel threads; 0 = cores")     \
  XX(PP_TRACE, "TRAINRUN_PP_TRACE", STRING, "", 0, 0,                         \
     "pipeline parallelism: write step TRAINRUN_PP_TRACE_STEP's executed "    \
     "actions of every pipeline rank as a Chrome trace to this file")         \
  XX(PP_TRACE_STEP, "TRAINRUN_PP_TRACE_STEP", INT, "2", 1, INT64_MAX,         \
     "the step TRAINRUN_PP_TRACE records")                                    \
  XX(DDP_BUCKET_MB, "TRAINRUN_DDP_BUCKET_MB", INT, "25", 1, 65536,             \
     "DDP: gradient bucket size in MiB (PyTorch DDP's bucket_cap_mb)")        \
  XX(GEMM_TUNE, "TRAINRUN_GEMM_TUNE", INT, "8", 1, 16,                         \
     "CUDA GEMMs: cuBLASLt algorithms timed at each GEMM shape's first use, "  \
     "the fastest kept where 3% faster than the heuristic's first (1: that "  \
     "one, no timing)")                                                        \
  XX(ATTENTION, "TRAINRUN_ATTENTION", STRING, "auto", 0, 0,                    \
     "CUDA attention kernels: auto (cuDNN, else flash, else simt), cudnn, "    \
     "flash or simt")                                                          \
  XX(CUDNN_ATTN_CONFIG, "TRAINRUN_CUDNN_ATTN_CONFIG", INT, "0", 0, 4096,      \
     "cuDNN attention: run each graph's engine config k (0: the "             \
     "heuristics' first that builds; k: the k-th entry after it in their "    \
     "list, then variants of it with one knob changed; config 0 where k "     \
     "does not build), for measuring the others")                              \
  XX(CUDNN_ATTN_TUNE, "TRAINRUN_CUDNN_ATTN_TUNE", INT, "4", 1, 8,              \
     "cuDNN attention: engine configs timed at each graph's first use (the "  \
     "heuristics' first that builds and the next that build), the fastest "   \
     "kept where 3% faster than the first (1: the first, no timing)")         \
  XX(STORE_TOKEN, "TRAINRUN_STORE_TOKEN", STRING, "", 0, 0,                    \
     "shared secret trainrun store clients prove before any command")          \
  XX(STORE_MAX_KEY, "TRAINRUN_STORE_MAX_KEY_BYTES", INT, "8192", 1, 1048576,   \
     "largest key the store server accepts")                                   \
  XX(STORE_MAX_VALUE, "TRAINRUN_STORE_MAX_VALUE_BYTES", INT, "67108864", 1,    \
     4294967296, "largest value the store server accepts")                     \
  XX(STORE_MAX_MEMORY, "TRAINRUN_STORE_MAX_MEMORY_BYTES", INT, "4294967296",   \
     1048576, INT64_MAX, "total key+value bytes the store server holds")      \
  XX(STORE_MAX_CONNS, "TRAINRUN_STORE_MAX_CONNECTIONS", INT, "262144", 1,      \
     16777216, "connections the store server accepts at once")                 \
  XX(STORE_THREADS, "TRAINRUN_STORE_THREADS", INT, "0", 0, 64,                \
     "store server I/O threads; 0: a quarter of the CPUs, 1 to 4 (an accept "  \
     "fence orders a closed client's SET before later connections)")          \
  XX(STORE_LISTENERS, "TRAINRUN_STORE_LISTENERS", INT, "0", 0, 16,            \
     "store server accept queues (SO_REUSEPORT sockets); 0: ceil(expected "    \
     "clients / somaxconn)")                                                   \
  XX(STORE_MAX_KEYS, "TRAINRUN_STORE_MAX_KEYS_PER_REQUEST", INT, "131072", 1, \
     16777216, "keys in one store CHECK, WAIT, MULTI_GET or MULTI_SET")        \
  XX(STORE_MAX_REQUEST, "TRAINRUN_STORE_MAX_REQUEST_BYTES", INT, "268435456", \
     1024, 17179869184, "largest store request, and largest MULTI_GET reply") \
  XX(ALLOC_ALIGN, "TRAINRUN_HOST_ALLOC_ALIGN", INT, "64", 16, 4096,            \
     "alignment in bytes of host tensor allocations (a power of two)")         \
  XX(GLOO_SOCKET_IFNAME, "TRAINRUN_GLOO_SOCKET_IFNAME", STRING, "", 0, 0,      \
     "network interface Gloo binds; empty: the address that routes to the "   \
     "store")                                                                  \
  XX(PG_WATCHDOG_MS, "TRAINRUN_PG_WATCHDOG_MS", INT, "100", 10, 60000,         \
     "period of the process-group watchdog (op timeouts, error reports)")     \
  XX(CKPT_TEST_WRITE_BPS, "TRAINRUN_CKPT_TEST_WRITE_BPS", INT, "0", 0,       \
     INT64_MAX, "tests only: cap a checkpoint's background writer at this "   \
     "many bytes per second (0: no cap), to check training never waits "     \
     "for the disk write")                                                     \
  XX(FR_SHM, "TRAINRUN_FR_SHM", STRING, "", 0, 0,                              \
     "worker: the shared-memory name of its flight-recorder ring (set by "    \
     "the daemon, which reads the ring)")                                      \
  XX(FR_STACK, "TRAINRUN_FR_STACK", BOOL, "0", 0, 1,                           \
     "flight recorder: keep the native stack (frames) of every collective")   \
  XX(FR_TIMING, "TRAINRUN_FR_TIMING", BOOL, "1", 0, 1,                         \
     "flight recorder: write duration_ms (start to completion) in dumps")     \
  XX(FR_NCCL_NAMES, "TRAINRUN_FR_NCCL_NAMES", BOOL, "0", 0, 1,                 \
     "flight recorder: dumps name every op nccl:<op> (gloo:all_reduce -> "    \
     "nccl:all_reduce): torchfrtrace accepts only nccl: and xccl: names")     \
  XX(WORKER, "TRAINRUN_WORKER", BOOL, "0", 0, 1,                               \
     "set by the daemon in each worker: `trainrun JOB.toml` runs one rank "   \
     "of the world RANK and WORLD_SIZE describe")                              \
  XX(RANK, "RANK", INT, "0", 0, 2147483647,                                    \
     "worker: its global rank (set by the daemon, as torchrun does)")         \
  XX(LOCAL_RANK, "LOCAL_RANK", INT, "0", 0, 2147483647,                        \
     "worker: its rank among the workers of its host")                        \
  XX(WORLD_SIZE, "WORLD_SIZE", INT, "1", 1, 2147483647,                        \
     "worker: the number of ranks of the job")                                 \
  XX(RESTART_COUNT, "TRAINRUN_RESTART_COUNT", INT, "0", 0, 2147483647,        \
     "worker: the daemon's round (restarts so far); names its collective "   \
     "keys in the store")                                                      \
  XX(FAILURE_KEY, "TRAINRUN_FAILURE_KEY", STRING, "", 0, 0,                   \
     "worker: the store key where the daemon reports the round's failure; "  \
     "collectives waiting on a peer give up once it exists")                 \
  XX(HEARTBEAT_FD, "TRAINRUN_HEARTBEAT_FD", INT, "-1", -1, 1048576,            \
     "worker: the daemon's heartbeat page (trainrun/heartbeat.h); -1: none")  \
  XX(STOP_TIMEOUT, "TRAINRUN_STOP_TIMEOUT", DOUBLE, "3", 0, 86400,             \
     "seconds the daemon waits after SIGTERM before it kills a worker it "    \
     "stops because its round failed (a failed round has no step left to "    \
     "finish)")                                                                \
  XX(TMPDIR, "TMPDIR", STRING, "/tmp", 0, 0,                                   \
     "folder of the daemons' status sockets and of default log folders")      \
  XX(PATH, "PATH", STRING, "/usr/local/bin:/usr/bin:/bin", 0, 0,               \
     "where the daemon looks for a worker program named without a '/'")       \
  XX(CUDA_VISIBLE_DEVICES, "CUDA_VISIBLE_DEVICES", STRING, "", 0, 0,           \
     "GPUs the workers may use: passed on as is; counted by "                 \
     "--nproc-per-node gpu")                                                   \
  XX(CUDA_DEVICE_ORDER, "CUDA_DEVICE_ORDER", STRING, "", 0, 0,                 \
     "unset: the daemon gives workers PCI_BUS_ID, the order its CPU "         \
     "affinity assumes")                                                       \
  XX(MASTER_ADDR, "MASTER_ADDR", STRING, "", 0, 0,                             \
     "under mpirun: the rendezvous host when --rdzv-endpoint is not given")   \
  XX(MASTER_PORT, "MASTER_PORT", INT, "29500", 1, 65535,                       \
     "under mpirun: the rendezvous port with MASTER_ADDR")                     \
  XX(SLURM_JOB_ID, "SLURM_JOB_ID", STRING, "", 0, 0,                           \
     "Slurm: the default --rdzv-id")                                           \
  XX(SLURM_STEP_NUM_NODES, "SLURM_STEP_NUM_NODES", INT, "1", 1, 16777216,     \
     "srun: nodes of the step (--nnodes); marks a run under srun")             \
  XX(SLURM_STEP_NUM_TASKS, "SLURM_STEP_NUM_TASKS", INT, "1", 1, 16777216,     \
     "srun: tasks of the step; more than nodes: every task is a node")         \
  XX(SLURM_STEP_NODELIST, "SLURM_STEP_NODELIST", STRING, "", 0, 0,             \
     "srun: hosts of the step; the first is the rendezvous endpoint")         \
  XX(SLURM_JOB_NODELIST, "SLURM_JOB_NODELIST", STRING, "", 0, 0,               \
     "Slurm: hosts of the job, when SLURM_STEP_NODELIST is not set")           \
  XX(SLURM_NODEID, "SLURM_NODEID", INT, "0", 0, 16777216,                      \
     "srun: this node's index in the step (--node-rank)")                      \
  XX(SLURM_PROCID, "SLURM_PROCID", INT, "0", 0, 16777216,                      \
     "srun: this task's rank (--node-rank with several tasks per node)")       \
  XX(SLURM_NNODES, "SLURM_NNODES", INT, "1", 1, 16777216,                      \
     "Slurm: nodes of the allocation (a hint to use srun when > 1)")           \
  XX(OMPI_SIZE, "OMPI_COMM_WORLD_SIZE", INT, "1", 1, 16777216,                 \
     "mpirun: processes (--nnodes); marks a run under Open MPI")               \
  XX(OMPI_RANK, "OMPI_COMM_WORLD_RANK", INT, "0", 0, 16777216,                 \
     "mpirun: this process's rank (--node-rank)")                              \
  XX(OMPI_LOCAL_SIZE, "OMPI_COMM_WORLD_LOCAL_SIZE", INT, "1", 1, 16777216,     \
     "mpirun: processes on this host; > 1: one worker per process")

typedef enum {
#define TR__PARAM_ENUM(id, env, type, def, lo, hi, doc) TR_PARAM_##id,
  TR_PARAM_MAP(TR__PARAM_ENUM)
#undef TR__PARAM_ENUM
  TR_PARAM__COUNT
} tr_param_id_t;

/* Cached values. Calling the getter of another type aborts (a bug). */
int64_t tr_param_int(tr_param_id_t id);
double tr_param_double(tr_param_id_t id);
int tr_param_bool(tr_param_id_t id);
const char* tr_param_str(tr_param_id_t id); /* never NULL; owned by registry */

/* 1 when the variable was set in the environment and valid. */
int tr_param_is_set(tr_param_id_t id);

/* Environment name of a parameter ("TRAINRUN_LOG_LEVEL"). */
const char* tr_param_env_name(tr_param_id_t id);

/* Print the table (name, type, default, bounds, current, description). */
void tr_param_print(FILE* out);

/* Forget cached values so the next read sees the environment again (tests,
 * and the daemon after it rewrites a worker's environment). Not thread-safe
 * against concurrent readers. */
void tr_param_reset(void);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_PARAM_H */
