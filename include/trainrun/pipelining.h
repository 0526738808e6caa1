/* trainrun/pipelining.h: the step as a list of actions, and the executor
 * that runs one rank's list over a range of the model's blocks.
 *
 * Actions are PyTorch's schedule IR (torch/distributed/pipelining,
 * _Action): a stage index, a computation type and a micro-batch index,
 * written `<stage><TYPE><micro>` — `0F1` is stage 0's forward of
 * micro-batch 1, `1B0` a full backward, `0I2` / `0W2` the input- and
 * weight-gradient halves of a backward (zero-bubble schedules), `1SEND_F3`
 * a send of an activation, `0UNSHARD` / `0RESHARD` / `0REDUCE_GRAD` FSDP's
 * actions (no micro-batch).
 *
 * A step of the trainer is such a list. Without pipeline parallelism the
 * list is one stage's 1F1B over the step's micro-batches (PyTorch's
 * Schedule1F1B with one stage: warm-up of one forward, then backward /
 * forward pairs): `0F0 0B0 0F1 0B1 ...`, which is the plain
 * gradient-accumulation loop, run by the same executor a pipeline stage
 * uses.
 *
 * The executor (tr_pp_exec_run) owns the step's micro-batches: it asks the
 * caller to fill one before its first forward (mb_begin: data, loss
 * scale), runs the stage's blocks forward and backward on it, and hands it
 * back after its last backward (mb_end: the losses) before freeing it.
 * It runs F, B, and the split backward I then W (model.h:
 * tr_model_backward_input / _weight, the same bits as B; a micro-batch is
 * handed back after its W), for one stage or for the several stages a
 * pipeline rank holds, with the activations and gradients between ranks
 * over the pipeline group's send / receive (tr_pp_exec_step).
 *
 * A pipeline step: tr_pp_split_init (the stages' blocks and ranks),
 * tr_pp_generate or tr_pp_csv_load (every rank's compute-only list),
 * tr_pp_lower (the lists with comms), then on each rank tr_pp_exec_step
 * with its own list. */
#ifndef TRAINRUN_PIPELINING_H
#define TRAINRUN_PIPELINING_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/model.h"
#include "trainrun/pg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the action IR ---- */

typedef enum {
  TR_PP_F = 0,            /* forward */
  TR_PP_I = 1,            /* backward, input gradient */
  TR_PP_W = 2,            /* backward, weight gradient */
  TR_PP_B = 3,            /* full backward */
  TR_PP_UNSHARD = 4,      /* FSDP all-gather of the stage's parameters */
  TR_PP_RESHARD = 5,      /* FSDP free of them */
  TR_PP_SEND_F = 6,       /* send the forward's output to the next stage */
  TR_PP_RECV_F = 7,       /* receive the forward's input */
  TR_PP_SEND_B = 8,       /* send the input gradient to the previous stage */
  TR_PP_RECV_B = 9,       /* receive the output gradient */
  TR_PP_REDUCE_GRAD = 10, /* FSDP reduce-scatter of the stage's grads */
  TR_PP_NONE = 11,        /* an idle slot of a schedule (PyTorch's None) */
  TR_PP_OVERLAP_F_B = 12  /* a forward and a backward overlapped (sub) */
} tr_pp_type_t;

typedef struct {
  int stage;
  tr_pp_type_t type;
  int64_t micro; /* -1 for UNSHARD, RESHARD, REDUCE_GRAD, OVERLAP_F_B */
  /* OVERLAP_F_B (stage -1): its forward and its backward, `(0F3;3B1)`
   * in text form (PyTorch's sub_actions, DualPipeV's) */
  struct tr_pp_sub {
    int stage;
    tr_pp_type_t type;
    int64_t micro;
  } sub[2];
} tr_pp_action_t;

/* PyTorch's name of a type: "F", "I", "W", "B", "UNSHARD", "RESHARD",
 * "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD", "OVERLAP_F_B";
 * "" for NONE. */
const char* tr_pp_type_name(tr_pp_type_t t);

/* Room for any action's text form. */
#define TR_PP_ACTION_STRLEN 96

/* The text form of a ("0F1", "1UNSHARD", "(0F3;3B1)OVERLAP_F_B"; "" for an
 * idle slot) into buf; returns buf. */
const char* tr_pp_action_str(const tr_pp_action_t* a, char* buf, size_t n);

/* Parse PyTorch's text form (`(\d+)(F|I|B|W|UNSHARD|...)(\d*)`, the whole
 * string, or `(<F>;<B or I>)OVERLAP_F_B` of a forward and a backward):
 * TR_EINVAL for anything else, a micro-batch on an FSDP action or none on
 * a compute or communication action. */
int tr_pp_action_parse(const char* s, tr_pp_action_t* out);

/* The one-stage schedule of n_micro micro-batches (1F1B on one stage:
 * F0 B0 F1 B1 ...): 2 * n_micro actions into out (the caller's array of
 * that many). TR_EINVAL for n_micro < 1. */
int tr_pp_schedule_one_stage(int64_t n_micro, tr_pp_action_t* out);

/* ---- schedules of every rank (pipelining/plan.c) ----
 *
 * A schedule is PyTorch's pipeline_order: for each pipeline rank, its list
 * of actions in time steps, an idle step being a TR_PP_NONE action (None
 * in PyTorch). Stages are numbered over the whole pipeline (pp ranks × v
 * stages per rank). */

typedef struct {
  int n_ranks;
  int64_t* len;          /* actions of each rank */
  int64_t* cap;          /* allocated */
  tr_pp_action_t** acts; /* each rank's list */
} tr_pp_schedule_t;

/* n_ranks empty lists. TR_EINVAL for n_ranks < 1, TR_ENOMEM. */
int tr_pp_schedule_init(tr_pp_schedule_t* s, int n_ranks);
void tr_pp_schedule_release(tr_pp_schedule_t* s);
/* Append a to rank's list (TR_EINVAL for a rank out of range). */
int tr_pp_schedule_push(tr_pp_schedule_t* s, int rank, tr_pp_action_t a);
/* The longest list: the schedule's number of steps. */
int64_t tr_pp_schedule_steps(const tr_pp_schedule_t* s);

/* PyTorch's _format_pipeline_order: a Step × Rank grid, one row per step
 * ("Step 07: 0F1 1B0 ...", columns padded to their widest cell, an idle
 * slot blank) under a header of "Rank N" labels; error_step >= 0 appends
 * " <-- ERROR HERE" to that step's row. A malloc'd string (the caller
 * frees it), NULL when out of memory. */
char* tr_pp_schedule_format(const tr_pp_schedule_t* s, int64_t error_step);

/* ---- generators (pipelining/generators.c) ---- */

typedef enum {
  TR_PP_GPIPE = 0,            /* ScheduleGPipe: all F, then all B */
  TR_PP_1F1B = 1,             /* Schedule1F1B */
  TR_PP_INTERLEAVED_1F1B = 2, /* ScheduleInterleaved1F1B (depth first) */
  TR_PP_LOOPED_BFS = 3,       /* ScheduleLoopedBFS (breadth first) */
  TR_PP_INTERLEAVED_ZB = 4,   /* ScheduleInterleavedZeroBubble (ZB1P) */
  TR_PP_ZBV = 5,              /* ScheduleZBVZeroBubble: the V, 2 stages */
  TR_PP_DUALPIPEV = 6         /* ScheduleDualPipeV: the V, OVERLAP_F_B */
} tr_pp_kind_t;

/* PyTorch's class name without "Schedule": "GPipe", "1F1B",
 * "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
 * "ZBVZeroBubble", "DualPipeV". */
const char* tr_pp_kind_name(tr_pp_kind_t k);
/* get_schedule_class's lookup: case-insensitive name into *out;
 * TR_ENOTFOUND for another name. */
int tr_pp_kind_parse(const char* name, tr_pp_kind_t* out);

/* The compute-only schedule of kind k for pp ranks, n_micro micro-batches
 * and v stages per rank (stage s on rank s % pp; ZBVZeroBubble's and
 * DualPipeV's V: rank r holds stages r and 2pp - 1 - r), into *out
 * (initialised here; release it). The lists are PyTorch's pipeline_order
 * of the class, idle slots included, with two exceptions for the
 * single-stage classes, whose pipeline_order in torch 2.11 is only
 * informative (they do not run it): here they are lock-step plans, idle
 * slots where the rank waits (PyTorch drops them in its _add_reduce_grad),
 * and 1F1B's last rank runs F0 B0 F1 B1 ... (PyTorch's lists F1 B0 F2 B1
 * ... F<m> B<m-1> there, a micro-batch it does not have).
 * tr_pp_add_reduce_grad of these lists is PyTorch's list everywhere else
 * (tests/pipelining/fixtures). Refused with TR_EINVAL and a message in err (may be NULL) as PyTorch
 * refuses: pp < 1, n_micro < 1, v < 1, v != 1 for GPipe and 1F1B,
 * n_micro < pp for 1F1B, v != 2 for ZBVZeroBubble and DualPipeV,
 * n_micro < 2 pp for DualPipeV, and for the interleaved two n_micro not
 * a multiple of max(1, n_micro / pp). */
int tr_pp_generate(tr_pp_schedule_t* out, tr_pp_kind_t k, int pp,
                   int64_t n_micro, int v, char* err, size_t errlen);

/* PyTorch's _add_reduce_grad on one rank's list: idle slots dropped, and
 * `<s>REDUCE_GRAD` right after stage s's n_micro-th B or W (an
 * OVERLAP_F_B's backward counts). out holds n + (stages on the rank)
 * actions at most; *n_out is set. */
int tr_pp_add_reduce_grad(const tr_pp_action_t* in, int64_t n, int64_t n_micro,
                          tr_pp_action_t* out, int64_t* n_out);

/* ---- Chrome trace (pipelining/trace.c) ---- */

/* PyTorch's _dump_chrometrace of a schedule (a simulated timeline from
 * tr_pp_simulate, or any schedule): {"traceEvents": [...]} with one
 * complete event per action (idle slots skipped), rank by rank — name its
 * text form, cat "computation" for F, B and W and "communication" for
 * every other type (PyTorch's split, I and OVERLAP_F_B included), ph "X",
 * pid and tid the rank, ts its step, dur 1 — written as Python's
 * json.dump writes it (", " and ": " separators). A malloc'd string, NULL
 * when out of memory. */
char* tr_pp_trace_format(const tr_pp_schedule_t* s);
/* An executed schedule as a Chrome trace: as tr_pp_trace_format, but each
 * action at its measured time: times[r] holds rank r's 2 doubles per
 * action of s's list (tr_pp_exec_t.times: start, end, in seconds), and ts
 * and dur are microseconds from the earliest start (idle slots skipped,
 * an action without times left out). The ranks' clocks must be one clock
 * (one host's monotonic clock). */
char* tr_pp_trace_format_timed(const tr_pp_schedule_t* s,
                               const double* const* times);
/* tr_pp_trace_format_timed into a file (created or truncated). */
int tr_pp_trace_write_timed(const tr_pp_schedule_t* s,
                            const double* const* times, const char* path);
/* tr_pp_trace_format into a file (created or truncated). */
int tr_pp_trace_write(const tr_pp_schedule_t* s, const char* path);

/* ---- lowering (pipelining/lower.c) ----
 *
 * PyTorch's _prepare_schedule_with_comms: a compute-only schedule becomes
 * what each rank runs, with FSDP's and the communication actions. */

/* PyTorch's _add_unshard_reshard on one rank's list (idle slots dropped):
 * before each action, RESHARD the active stages not among the next
 * max_active distinct stages the list computes (ascending, as Python
 * iterates a set of small ints), then UNSHARD those of them not active
 * (in the order they come); at the end RESHARD what is still active.
 * *out is malloc'd (the caller frees it), *n_out its length. */
int tr_pp_add_unshard_reshard(const tr_pp_action_t* in, int64_t n,
                              int max_active, tr_pp_action_t** out,
                              int64_t* n_out);

/* PyTorch's _add_send_recv over every rank's list (no idle slots; an
 * idle slot is skipped): in lock-step passes over the ranks in order,
 * a rank's next action is appended when it is ready — F of stage s > 0
 * after its RECV_F or F of s-1 on this rank, I or B below the last stage
 * after its RECV_B or I/B of s+1 on this rank, anything else at once (an
 * OVERLAP_F_B when both halves are) — followed, when its result goes to
 * a stage on another rank (F: to s+1, I or B: to s-1), by `<s>SEND_F<m>`
 * / `<s>SEND_B<m>`, and the matching `<s+1>RECV_F<m>` / `<s-1>RECV_B<m>`
 * is appended to the receiver's list at that moment: the sender places
 * the receives, so the sends and receives between two ranks come in the
 * same order on both. Stages next to each other on one rank exchange
 * nothing. TR_EINVAL with "malformed compute schedule, can't schedule
 * sends/recvs:" and each stuck rank's next action in err when no rank
 * can move (a deadlock), or for a stage or micro-batch out of range. */
int tr_pp_add_send_recv(const tr_pp_schedule_t* in, const int* stage_rank,
                        int n_stages, int64_t n_micro, tr_pp_schedule_t* out,
                        char* err, size_t errlen);

/* The whole lowering of a compute-only schedule for pp ranks: the
 * validator (tr_pp_validate, its stage -> rank map into stage_rank when
 * not NULL, n_stages entries), then per rank tr_pp_add_unshard_reshard
 * (max_active 3; only with unshard_reshard != 0 — PyTorch always adds
 * them, its runtime ignores them without FSDP) and tr_pp_add_reduce_grad,
 * then tr_pp_add_send_recv. Into *out (initialised here; release it).
 * Errors as the three passes, with their message in err; a
 * communication or FSDP action in the input: TR_EPARSE. */
int tr_pp_lower(const tr_pp_schedule_t* compute, int pp, int n_stages,
                int64_t n_micro, int unshard_reshard, tr_pp_schedule_t* out,
                int* stage_rank, char* err, size_t errlen);

/* PyTorch's two CSV formats (_load_csv's format): compute_only (F, I, W,
 * B, OVERLAP_F_B and idle cells) and compute_comms (the lowered lists:
 * every action type, no idle cell). */
typedef enum { TR_PP_COMPUTE_ONLY = 0, TR_PP_COMPUTE_COMMS = 1 } tr_pp_format_t;

/* Check a parsed schedule against a format: TR_EPARSE with "name:row:
 * cell N: expected a compute-only schedule but found communication
 * action '0SEND_F1' at rank 0, position 3" (PyTorch's words) or "...: an
 * idle slot at rank R, position P: a compute_comms schedule lists only
 * actions" in err (may be NULL). */
int tr_pp_schedule_check_format(const tr_pp_schedule_t* s, tr_pp_format_t fmt,
                                const char* name, char* err, size_t errlen);

/* ---- the model over the stages (pipelining/split.c) ---- */

/* 1 for the classes that run one stage per rank (GPipe, 1F1B). */
int tr_pp_kind_single_stage(tr_pp_kind_t k);
/* 1 for the V-placed classes (ZBVZeroBubble, DualPipeV). */
int tr_pp_kind_v(tr_pp_kind_t k);

typedef enum {
  TR_PP_PLACE_LOOP = 0, /* stage s on rank s % pp */
  TR_PP_PLACE_V = 1     /* rank r holds stages r and 2pp - 1 - r */
} tr_pp_placement_t;

typedef struct {
  int first, last; /* the model's blocks [first, last) */
} tr_pp_range_t;

typedef struct {
  int pp;                      /* pipeline ranks */
  int v;                       /* stages per rank */
  int n_stages;                /* pp * v */
  tr_pp_placement_t placement; /* V for ZBVZeroBubble and DualPipeV */
  tr_pp_range_t* blocks;       /* each stage's blocks (n_stages) */
  int* stage_rank;             /* each stage's pipeline rank (n_stages) */
} tr_pp_split_t;

/* torchtitan's split of n_layers layers (blocks: 0 the embedding,
 * 1..n_layers the layers, n_layers+1 final norm + output + loss) for
 * schedule kind on pp ranks. Stages per rank: with layers_per_stage > 0
 * (pipeline_parallel_layers_per_stage), ceil((n_layers + first_less +
 * last_less) / layers_per_stage) / pp, which must divide, be 1 for
 * GPipe and 1F1B and at least 2 for the others; without (0), 1 for GPipe
 * and 1F1B, 2 for the others; the V classes need exactly 2. Then
 * generate_llm_fqn_per_model_part: the embedding weighs first_less
 * layers (pipeline_parallel_first_stage_less_layers, torchtitan's default
 * 1) and the output last_less; the n_layers + first_less + last_less
 * effective layers go evenly over the stages, the first `remainder`
 * stages one more; stage 0 gets the embedding and its share less
 * first_less layers, the last stage its share less last_less and the
 * head. TR_ECONFIG with a message naming the key and the numbers in err
 * (may be NULL) for layers that do not split: more stages than effective
 * layers, first_less or last_less above the smallest share, a stage count
 * not a multiple of pp or not what the schedule runs. Release *out. */
int tr_pp_split_init(tr_pp_split_t* out, int n_layers, int pp,
                     tr_pp_kind_t kind, int layers_per_stage, int first_less,
                     int last_less, char* err, size_t errlen);
void tr_pp_split_release(tr_pp_split_t* sp);
/* The rank of a stage (PyTorch's generate_stage_to_rank_mapping): loop
 * s % pp; V ranks 0..pp-1 then pp-1..0, alternating per group of pp. */
int tr_pp_stage_rank(int stage, int pp, tr_pp_placement_t placement);
/* The stages of rank (ascending) into out (room for sp->v); returns
 * their number, TR_EINVAL for a rank out of range. */
int tr_pp_split_rank_stages(const tr_pp_split_t* sp, int rank, int* out);

/* ---- the validator (pipelining/validate.c) ---- */

/* PyTorch's _validate_schedule on a compute-only schedule: pp ranks
 * present, every stage in [0, n_stages) and on one rank only, per stage
 * and micro-batch (in [0, n_micro)) F before B or I and I before W; per
 * stage F count == n_micro, #I == #W and B + (I + W) / 2 == n_micro.
 * An OVERLAP_F_B is checked as its forward then its backward at its step.
 * Communication and FSDP actions only map their stage. stage_to_rank
 * (n_stages entries, may be NULL) gets the map. TR_EINVAL with, in err
 * (may be NULL), PyTorch's message ("Rank 1, step 4: Running Full
 * Backward for stage 1, microbatch 0 without first running Forward") and,
 * for an action's fault, "Full pipeline schedule:" and the Step × Rank
 * grid with "<-- ERROR HERE" on its step. */
int tr_pp_validate(const tr_pp_schedule_t* s, int pp, int n_stages,
                   int64_t n_micro, int* stage_to_rank, char* err,
                   size_t errlen);

/* ---- the lock-step simulator (pipelining/simulate.c) ---- */

typedef struct {
  int64_t steps;          /* time steps until the last action ran */
  int64_t busy;           /* rank-steps that ran an action */
  double bubble;          /* idle fraction: 1 - busy / (steps * ranks) */
  int64_t* peak_inflight; /* per stage (n_stages): the most micro-batches
                             forwarded and not yet fully backwarded (B, or
                             W after I) at once; malloc'd */
  int n_stages;
} tr_pp_sim_t;

/* Run a compute-only schedule in lock step, every action one step: each
 * step every rank runs its next action (its idle slots skipped) if what it
 * needs ran in an earlier step — F of stage s > 0 needs F of s - 1, B or
 * I needs its F and, below the last stage, B or I of s + 1, W needs I; an
 * OVERLAP_F_B runs, in one step, when both its halves can — and else
 * idles.
 * TR_EINVAL with a message in err (may be NULL) naming each stuck rank's
 * next action when no rank can move (a deadlock), or for a stage out of
 * range. Release *out with tr_pp_sim_release. timeline (may be NULL):
 * the schedule as it ran, each action at its step, idle slots where a rank
 * waited (initialised here; release it). */
int tr_pp_simulate(const tr_pp_schedule_t* s, int n_stages, tr_pp_sim_t* out,
                   tr_pp_schedule_t* timeline, char* err, size_t errlen);
void tr_pp_sim_release(tr_pp_sim_t* sim);

/* ---- timed simulation and the idle time of an executed step
 * (pipelining/simulate.c) ---- */

/* s's step when every computation runs in its rank's order as soon as
 * the rank is free and its inputs exist (tr_pp_simulate's dependencies),
 * each taking cost[stage * 4 + kind], kind 0 F, 1 B, 2 I, 3 W (an
 * OVERLAP_F_B the sum of its halves'), communication free: *span its
 * length, busy[r] (NULL: not wanted) each rank's computing time in it.
 * TR_EINVAL with err when an action is outside n_stages or the list does
 * not progress. */
int tr_pp_simulate_costs(const tr_pp_schedule_t* s, int n_stages,
                         const double* cost, double* span, double* busy,
                         char* err, size_t errlen);

typedef struct {
  int n_ranks;
  double span;    /* seconds from the step's first computation's start to
                     its last one's end, over every rank */
  double* busy;   /* per rank: seconds its computations ran */
  double* idle;   /* per rank: 1 - busy / span, measured */
  double sim_span;  /* the simulated step with the measured costs */
  double* sim_idle; /* per rank: 1 - busy / sim_span, predicted */
} tr_pp_idle_t;

/* The measured idle fraction of each rank in an executed step of s (every
 * rank's list, as run; times[r] as tr_pp_exec_t.times left it, on one
 * clock) and the simulator's prediction with the costs measured there:
 * every computation in its rank's order, as soon as the rank is free and
 * its inputs exist (tr_pp_simulate's dependencies), F, B, I and W each
 * taking the mean measured time of its kind on its stage, an OVERLAP_F_B
 * its own; communication free. The difference is what the executor loses
 * to communication, host overhead and waits the schedule does not imply.
 * TR_EINVAL with err when a computation has no time or the list does not
 * progress. Release *out with tr_pp_idle_release. */
int tr_pp_idle_measure(const tr_pp_schedule_t* s, int n_stages,
                       const double* const* times, tr_pp_idle_t* out,
                       char* err, size_t errlen);
void tr_pp_idle_release(tr_pp_idle_t* st);

/* ---- PyTorch's CSV, compute_only (pipelining/csv.c) ---- */

/* Parse _dump_csv's text: row r (\n or \r\n ended) is rank r's list, its
 * comma-separated cells actions in text form (`0F1`), an empty (or blank)
 * cell an idle slot. Into *out (initialised here). A cell that is no
 * action: TR_EPARSE and "name:row:col: bad action 'X'" in err (row and
 * column from 1, col the cell's first character). */
int tr_pp_csv_parse(const char* text, size_t n, const char* name,
                    tr_pp_schedule_t* out, char* err, size_t errlen);
/* tr_pp_csv_parse of a file's contents (name: its path). */
int tr_pp_csv_load(const char* path, tr_pp_schedule_t* out, char* err,
                   size_t errlen);
/* _dump_csv: one row per rank, "\r\n" ended as Python's csv.writer ends
 * them. A malloc'd string, NULL when out of memory. */
char* tr_pp_csv_format(const tr_pp_schedule_t* s);
/* tr_pp_csv_format into a file (created or truncated). */
int tr_pp_csv_save(const tr_pp_schedule_t* s, const char* path);

/* ---- the executor (pipelining/executor.c) ---- */

typedef struct {
  tr_model_t* model;
  /* One stage (n_stages 0): the stage's blocks [first, last), its list
   * stage 0's, no process group. */
  int first_block, last_block;
  int64_t n_micro; /* micro-batches of the step */
  /* Before micro-batch `micro`'s forward on each stage of this rank:
   * fill *mb (tr_model_mb_init with tokens and targets, loss scale, ...;
   * every stage gets the micro-batch's tokens: the first embeds them, and
   * every stage's attention reads them for a document mask and positions).
   * A negative return stops the step; mb must then hold nothing. */
  int (*mb_begin)(void* arg, int64_t micro, tr_model_mb_t* mb);
  /* After micro-batch `micro`'s last backward on the last stage, before
   * the executor releases it (its losses). NULL: nothing. */
  int (*mb_end)(void* arg, int64_t micro, tr_model_mb_t* mb);
  void* arg;
  /* Several stages (n_stages >= 1): the whole pipeline's stages, this
   * rank (tr_pg_rank(pg), 0 without pg) running those whose stage_rank
   * is its own; stage_blocks[s] is stage s's blocks (tr_pp_split_t's
   * blocks and stage_rank fit). */
  int n_stages;
  const tr_pp_range_t* stage_blocks;
  const int* stage_rank;
  /* the pipeline's group (pp ranks); NULL when every stage is here */
  tr_pg_t* pg;
  /* the micro-batch's shape: received activations and gradients are
   * [B, T, dim] in the model's compute dtype on its device */
  int B, T;
  /* UNSHARD, RESHARD and REDUCE_GRAD of a stage (FSDP; PyTorch's runtime
   * unshards, reshards, reduce-scatters): called with the action; NULL:
   * they do nothing, as PyTorch's runtime does for a stage without FSDP. */
  int (*fsdp_action)(void* arg, const tr_pp_action_t* a);
  /* 1: a forward-only list (tr_pp_build_eval's: F, SEND_F, RECV_F), as
   * PyTorch's schedule.eval() runs: every forward is no_grad (keeps no
   * activations) and finishes its micro-batch, the last stage's handed
   * to mb_end after its F. 0: training lists. */
  int forward_only;
  /* NULL, or 2 doubles per action of the list: each action's start and
   * end on the host's monotonic clock, in seconds (a posted receive or
   * send: its posting; a computation: from the end of its wait for its
   * input). On CUDA a computation's span is the compute stream's,
   * measured with events (the step then synchronizes the device at its
   * start and end); the host's posting of sends and receives stays the
   * host's. Never-run actions keep 0. */
  double* times;
} tr_pp_exec_t;

/* The step's loss as every pipeline rank learns it. */
typedef struct {
  double loss_sum; /* the last stage's mb->loss_sum over the micro-batches
                      (as the head left it, before mb_end; 0 under
                      defer_loss) */
  int64_t n_valid; /* its mb->n_valid summed */
} tr_pp_result_t;

/* Run one rank's lowered list (tr_pp_lower's, or a compute-only list of a
 * rank whose stages exchange nothing with another rank) in order:
 *
 *  - F runs the stage's blocks on the micro-batch: the first stage's input
 *    comes from mb_begin's tokens, another stage's from its RECV_F (waited
 *    here) or, when stage s-1 is on this rank, from s-1's output handed
 *    over in place; the output goes to stage s+1 here in place, or waits
 *    for its SEND_F;
 *  - B, or I then W (the zero-bubble split), the same way backwards: the
 *    output gradient from RECV_B or stage s+1 here, the input gradient to
 *    stage s-1 here or to SEND_B; OVERLAP_F_B runs its F then its B;
 *  - RECV_F / RECV_B post a receive from the neighbour stage's rank (early:
 *    where the list has them) into a new [B, T, dim] tensor, waited by
 *    the computation that needs it; SEND_F / SEND_B post a send, waited
 *    at the end of the step. The sends and receives between two ranks,
 *    both directions together, come in one order on both
 *    (tr_pp_add_send_recv: each pair is appended to both lists at once),
 *    tagged by (receiving stage, micro-batch, direction), so nothing
 *    waits on a peer that waits on it: each wait is for an op that comes
 *    earlier in the lowering's global order (also where a backend runs a
 *    pair's or a group's p2p ops in posting order, as NCCL does);
 *  - UNSHARD, RESHARD, REDUCE_GRAD call fsdp_action; an idle slot is
 *    skipped.
 *
 * Then, when out is given and the group has several ranks, the last
 * stage's loss_sum and n_valid are broadcast from its rank to every rank
 * of pg, into *out (NULL: no broadcast; a caller that sums its own
 * figures over the group, as the trainer does, needs none). Micro-batches and tensors still held when an action fails are
 * released. Returns 0, TR_EINVAL for a malformed list (a computation
 * before its input arrived, a backward before its forward, a W before its
 * I, a B after an I, a stage this rank does not hold, a micro-batch out
 * of range, a micro-batch the list leaves unfinished, a tensor it
 * receives or makes and never uses or sends), TR_EUNSUPPORTED for a
 * communication action without pg, or the first error of a block, a
 * callback or the group. */
int tr_pp_exec_step(const tr_pp_exec_t* x, const tr_pp_action_t* acts,
                    int64_t n, tr_pp_result_t* out);
/* tr_pp_exec_step without the result (the one-stage trainer's call). */
int tr_pp_exec_run(const tr_pp_exec_t* x, const tr_pp_action_t* acts,
                   int64_t n);

/* ---- the parameters over the ranks (pipelining/params.c) ---- */

/* 1 when a stage of rank uses parameter idx (it holds data and grad). */
int tr_pp_param_used(const tr_model_t* m, const tr_pp_split_t* sp, int rank,
                     int idx);
/* 1 when rank counts parameter idx in a whole-model sum (gradient norm,
 * clipping): the rank of the first stage that uses it, so a table tied
 * between the end stages counts once, on stage 0's rank. */
int tr_pp_param_counted(const tr_model_t* m, const tr_pp_split_t* sp, int rank,
                        int idx);
/* After the step's backward: the gradient of each parameter used by both
 * the first and the last stage (GPT-2's tied wte) summed between their
 * ranks, so both end stages step it alike (nothing when one rank holds
 * both). Called by every rank of pg (rank: its pipeline rank), a group
 * that holds both end ranks — the pp group, where the ranks between join
 * with zeros, or a group of the two. The first error of the group. */
int tr_pp_sum_tied_grads(tr_model_t* m, const tr_pp_split_t* sp, tr_pg_t* pg,
                         int rank);

/* ---- a pipeline's set-up (pipelining/build.c) ---- */

typedef struct {
  int n_layers;         /* the model's layers */
  int pp;               /* pipeline_parallel_degree */
  tr_pp_kind_t kind;    /* pipeline_parallel_schedule */
  int64_t n_micro;      /* micro-batches a step */
  int layers_per_stage; /* pipeline_parallel_layers_per_stage; 0: unset */
  int first_less;       /* pipeline_parallel_first_stage_less_layers (1) */
  int last_less;        /* pipeline_parallel_last_stage_less_layers (1) */
  /* pipeline_parallel_schedule_csv: a compute_only CSV used instead of
   * kind's generator (kind still sets the stages per rank and their
   * placement, as in torchtitan); NULL or "": none */
  const char* schedule_csv;
  int unshard_reshard; /* lower with UNSHARD / RESHARD (FSDP stages) */
} tr_pp_build_opts_t;

typedef struct {
  tr_pp_split_t split;      /* the stages' blocks and ranks */
  tr_pp_schedule_t compute; /* every rank's compute-only list */
  tr_pp_schedule_t lowered; /* every rank's list to run (tr_pp_lower) */
  int64_t n_micro;
} tr_pp_build_t;

/* The set-up every rank computes alike: tr_pp_split_init, then the
 * compute-only schedule — tr_pp_generate of kind with the split's stages
 * per rank, or the CSV (tr_pp_csv_load, compute_only format, pp rows,
 * tr_pp_validate against the split's stages, each stage on the rank the
 * split places it) — then tr_pp_lower. TR_ECONFIG with the message in err
 * for settings that do not fit (the split's, the generator's in PyTorch's
 * words: "Number of microbatches (2) must be greater than or equal to the
 * number of stages (4)."; the CSV's "FILE: 3 rows (ranks), but
 * pipeline_parallel_degree is 2", its validator fault, "FILE: stage 1
 * runs on rank 0, but schedule 1F1B places it on rank 1"), TR_EPARSE
 * for a CSV cell that is no action ("FILE:row:col: bad action 'X'") or a
 * communication action in it, the file's errno code when it cannot be
 * read; the lowering's errors. Release *b with tr_pp_build_release. */
int tr_pp_build_init(tr_pp_build_t* b, const tr_pp_build_opts_t* o, char* err,
                     size_t errlen);
void tr_pp_build_release(tr_pp_build_t* b);
/* The forward-only lists of n_micro micro-batches over b's split, for
 * evaluation: each rank runs its stages in ascending order, every
 * micro-batch's F on one before the next (a deadlock-free order on the
 * loop and the V placements), lowered with its sends and receives
 * (tr_pp_add_send_recv). Into *out (initialised here; release it); run
 * with tr_pp_exec_t.forward_only and n_micro. Errors as
 * tr_pp_add_send_recv's, the message in err. */
int tr_pp_build_eval(const tr_pp_build_t* b, int64_t n_micro,
                     tr_pp_schedule_t* out, char* err, size_t errlen);
/* Fill x's n_micro, n_stages, stage_blocks and stage_rank from b (the
 * caller sets model, pg, B, T and the callbacks; rank r runs
 * b->lowered.acts[r], b->lowered.len[r]). */
void tr_pp_build_exec(const tr_pp_build_t* b, tr_pp_exec_t* x);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_PIPELINING_H */
