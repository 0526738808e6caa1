/* trainrun/trainer.h: the per-rank training loop — model, AdamW, the
 * learning-rate schedule, gradient accumulation and clipping, validation,
 * metrics, and the weights written at the end.
 *
 * The trainer does not read the job config: it takes its settings
 * (tr_trainer_settings_t below, one field per key it acts on), which the
 * launcher fills from the resolved config (launcher/compose.c).
 *
 * Typical use (what `trainrun job.toml` does on each rank):
 *
 *     tr_trainer_settings_t s;                 // filled by the launcher
 *     tr_errmsg_t err;
 *     int rc = tr_train(&s, NULL, NULL, &err);
 *     if (rc < 0) fprintf(stderr, "trainrun: %s\n", err.message);
 *
 * or step by step (tests, tools):
 *
 *     tr_trainer_t t;
 *     tr_trainer_init(&t, &s, NULL, &err);
 *     tr_step_stats_t st;
 *     while (t.step < s.training.steps) tr_trainer_step(&t, &st, &err);
 *     tr_trainer_release(&t);
 *
 * One optimizer step:
 *   1. zero the gradients;
 *   2. for each of grad_accum micro-steps: take this rank's B sequences of
 *      the next B × dp samples of the global stream (trainrun/data.h), run
 *      forward and backward; each token's loss is scaled by 1 / (G × T)
 *      (G = global_batch_size), so the summed gradients over micro-steps
 *      and ranks are the gradient of the mean loss over the global batch;
 *   3. dist.post_backward (data parallel: all-reduce SUM of the gradients);
 *   4. the global gradient norm (before clipping; what is logged), the
 *      clipping factor min(1, max_norm / (norm + 1e-6)) (torch's
 *      clip_grad_norm_), folded into the update;
 *   5. AdamW (torch.optim.AdamW semantics) with lr = the schedule's value
 *      for this step. Weight decay applies to tensors of two or more
 *      dimensions — linear weights and embedding tables — and not to norms
 *      or biases, as llm.c (and nanoGPT) group them; torchtitan decays
 *      every parameter. optimizer.name = "Adam" applies weight_decay as an
 *      L2 term added to the gradient instead.
 *
 * On the CPU every run with the same config and seed repeats bit for bit:
 * the kernels sum in a fixed order whatever the thread count, and the data
 * order is fixed by the seed.
 */
#ifndef TRAINRUN_TRAINER_H
#define TRAINRUN_TRAINER_H

#include <stdint.h>
#include <stdio.h>

#include "trainrun/cp.h" /* context parallelism's ring */
#include "trainrun/data.h"
#include "trainrun/dp.h"      /* the data-parallel seam */
#include "trainrun/dtensor.h" /* the tensor-parallel plan and its mesh */
#include "trainrun/errmsg.h"
#include "trainrun/model.h"
#include "trainrun/pipelining.h" /* the step's actions */
#include "trainrun/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- learning-rate schedule (torchtitan's, TOML era) ----
 *
 * With W warmup steps, D decay steps (D = round-half-even(total ×
 * decay_ratio) for WSD, else total - W; warmup and decay are cut to fit
 * total) and S = total + 1 - W - D stable steps (the "+1" is torchtitan's
 * virtual last step that keeps the last lr above 0), optimizer step s
 * (counting from 1) uses lr × f(s - 1) with
 *
 *   f(k) = (k + 1) / W                             k < W
 *        = 1                                       k < W + S
 *        = m + (1 - m) × g(p),  p = (k + 1 - W - S) / D   otherwise
 *
 * g(p) = 1 - p (linear), 1 - sqrt(p) (sqrt), (1 + cos(pi p)) / 2 (cosine),
 * m = min_lr_factor. Steps past total use p = 1 (lr × min_lr_factor).
 */
typedef enum {
  TR_LR_DECAY_LINEAR = 0,
  TR_LR_DECAY_SQRT = 1,
  TR_LR_DECAY_COSINE = 2
} tr_lr_decay_t;

typedef struct {
  double lr; /* peak */
  int64_t total_steps, warmup_steps, stable_steps, decay_steps;
  tr_lr_decay_t decay;
  double min_lr_factor;
} tr_lr_schedule_t;

/* decay_ratio < 0 means unset (decay right after warmup). decay_type:
 * "linear", "sqrt" or "cosine". TR_EINVAL for a bad type, total_steps < 1,
 * negative warmup, or a decay_ratio or min_lr_factor outside [0, 1]. */
int tr_lr_schedule_init(tr_lr_schedule_t* s, double lr, int64_t warmup_steps,
                        int64_t total_steps, double decay_ratio,
                        const char* decay_type, double min_lr_factor,
                        tr_errmsg_t* err);
/* f(step - 1) for optimizer step `step` >= 1, and lr × that. */
double tr_lr_schedule_factor(const tr_lr_schedule_t* s, int64_t step);
double tr_lr_schedule_lr(const tr_lr_schedule_t* s, int64_t step);

/* ---- settings: what a run does ----
 *
 * One field per job-config key the trainer acts on, named as the key
 * (trainrun.toml(5) documents each): the launcher fills them from the
 * config resolved for the world (launcher/compose.c), tests and tools may
 * fill them by hand. Strings are borrowed: they must outlive the trainer.
 * Values are checked where they are used, with messages that name the key
 * ("optimizer.name: unknown 'SGD'"). */

/* [training] */
typedef struct {
  int64_t steps;            /* optimizer steps of the run */
  int64_t local_batch_size; /* sequences per micro-step on a rank */
  /* Sequences per optimizer step over every rank, resolved: a multiple of
   * local_batch_size x the data-parallel size (the quotient is the number
   * of micro-steps). */
  int64_t global_batch_size;
  int64_t seq_len;
  double max_norm;          /* clip the gradient norm to it; 0: no clipping */
  const char* dataset;      /* the dataset's name (messages) */
  const char* dataset_path; /* token shards or text files; NULL: unset */
} tr_trainer_training_t;

/* [optimizer] */
typedef struct {
  const char* name; /* "AdamW", or "Adam" (weight_decay as an L2 term) */
  double lr;        /* peak learning rate */
  double beta1, beta2, eps, weight_decay;
} tr_trainer_optimizer_t;

/* [lr_scheduler] (the schedule above) */
typedef struct {
  int64_t warmup_steps;
  int64_t total_steps;    /* the schedule's length (the launcher: steps) */
  double decay_ratio;     /* < 0: unset (decay right after warmup) */
  const char* decay_type; /* "linear", "sqrt", "cosine" */
  double min_lr_factor;
} tr_trainer_lr_scheduler_t;

/* [validation] */
typedef struct {
  int enable;
  /* its own data; NULL: the last split_fraction of the training data */
  const char* dataset_path;
  double split_fraction;
  int64_t local_batch_size, seq_len;
  int64_t steps; /* batches per validation; -1: every full batch */
  int64_t freq;  /* validate every freq steps (and after the last) */
} tr_trainer_validation_t;

/* [metrics]: the files under dump_folder and the console colours */
typedef struct {
  int64_t log_freq; /* the metric line every log_freq steps */
  int enable_jsonl;
  const char* save_jsonl_file;
  int enable_tensorboard;
  const char* save_tb_folder;
  int save_for_all_ranks;
  int disable_color_printing;
} tr_trainer_metrics_t;

/* [checkpoint] (see "checkpoints" below) */
typedef struct {
  int enable;
  const char* folder; /* under dump_folder */
  int64_t interval;
  int64_t keep_latest_k;
  const char* async_mode; /* "disabled", "async", ... (trainrun/checkpoint.h) */
  int load_only;
  int create_seed_checkpoint;
  int64_t load_step;             /* -1: the latest complete step */
  const char* initial_load_path; /* NULL: none */
  int initial_load_model_only;
  int initial_load_in_hf;
  int enable_first_step_checkpoint;
  int last_save_model_only;
  int last_save_in_hf;
  /* the dtype of model-only saves and of the final model.safetensors */
  const char* export_dtype;
  /* parts not loaded: "model", "optimizer", "train_state", "dataloader" */
  const char* const* exclude_from_loading;
  size_t n_exclude_from_loading;
} tr_trainer_checkpoint_t;

typedef struct {
  /* The model to build ([model] name and flavor, fitted to the run). */
  tr_model_config_t model;
  /* Where it computes ([training] device for this rank's LOCAL_RANK) and
   * in which dtype (on CUDA [training] mixed_precision_param, float32 or
   * bfloat16; TR_F32 on the CPU). */
  tr_device_t device;
  tr_dtype_t compute_dtype;
  const char* dump_folder; /* [job]: metrics, checkpoints, final weights */
  tr_trainer_training_t training;
  tr_trainer_optimizer_t optimizer;
  tr_trainer_lr_scheduler_t lr_scheduler;
  tr_trainer_validation_t validation;
  tr_trainer_metrics_t metrics;
  tr_trainer_checkpoint_t checkpoint;
  /* [activation_checkpoint] (tr_model_set_activation_checkpoint_config) */
  struct {
    const char* mode;
    const char* selective_ac_option;
  } activation_checkpoint;
  /* [debug] */
  struct {
    int seed_set;  /* 0: a seed is picked at start (and printed) */
    uint64_t seed; /* weights' init and data order */
    /* --debug.fault specs (trainrun/fault.h), armed by tr_train */
    const char* const* faults;
    size_t n_faults;
  } debug;
} tr_trainer_settings_t;

/* ---- the trainer ---- */

/* Tensor parallelism: the group of this rank's tp peers (the mesh dim
 * "tp") and the job's mesh shape, on which the TP plan places the
 * parameters before the data-parallel layer composes its shards
 * (trainrun/dtensor.h: tr_tp_plan_apply, tr_tp_install). The tp ranks of
 * one data-parallel replica read the same samples; the gradient norm sums
 * a tp-sharded gradient over the tp ranks and counts a tp-replicated one
 * once. */
typedef struct {
  tr_pg_t* pg;           /* size > 1 */
  tr_mesh_shape_t mesh;  /* with a dim "tp" of pg's size */
  int loss_parallel;     /* 1: vocabulary-sharded cross-entropy */
  int sequence_parallel; /* 1: norms and residuals on sequence shards */
  int comm_timing;       /* [metrics] comm_overlap: time the hook's ops
                            (tr_tp_comm_t) into the step's tp figures */
  int async;             /* [parallelism] enable_async_tensor_parallel:
                            the SP collectives of the layers as rings of
                            chunks overlapped with their GEMMs */
} tr_trainer_tp_t;

/* Pipeline parallelism: the pipeline group (the mesh dim "pp") and the
 * schedule's settings (trainrun/pipelining.h: tr_pp_build_init; the
 * trainer fills n_layers and n_micro). A step's micro-batches are the
 * local batch cut into microbatch_size sequences, times the gradient
 * accumulation steps, all run by one schedule; every rank reads the step's
 * samples (the first stage uses the tokens, the last the targets). Each
 * rank allocates only its stages' parameters; a table tied between the
 * embedding and the output (GPT-2) lives on both end stages, its gradient
 * summed between them and counted once in the norm. */
typedef struct {
  tr_pg_t* pg;                /* size > 1 */
  tr_pp_build_opts_t build;   /* kind, split keys, CSV */
  int64_t microbatch_size;    /* sequences a micro-batch; divides B */
} tr_trainer_pp_t;

typedef struct {
  /* Data parallelism (trainrun/dp.h: tr_ddp_dp, tr_fsdp_dp); NULL: one
   * rank. Copied. */
  const tr_dp_t* dist;
  /* Tensor parallelism; NULL: none. Copied. */
  const tr_trainer_tp_t* tp;
  /* Pipeline parallelism; NULL: none. Copied. */
  const tr_trainer_pp_t* pp;
  /* Context parallelism (trainrun/cp.h): the cp group (the mesh dim "cp")
   * and the rotate method; NULL or a group of one rank: none. Copied. The
   * cp ranks of one replica read the same samples and each keeps its two
   * head-tail chunks of every sequence (training.seq_len a multiple of 2
   * x cp); the data-parallel layer (dist) counts replicas for the data
   * (dp_rank, dp_size without cp) but sums over dp x cp: the losses and
   * token counts of each rank's rows, and the gradients (FSDP shards over
   * dp_shard x cp, as torchtitan). */
  const tr_cp_t* cp;
  /* > 0: with tp or pp, every group's op timeout after the first step
   * ([comm] train_timeout_seconds, tr_pg_set_timeout_all; the
   * data-parallel layer sets it too when there is one) */
  int64_t train_timeout_ms;
  /* Where the metric lines go; NULL: stdout. */
  FILE* console;
  /* 1: no console lines (files are still written). */
  int quiet;
} tr_trainer_opts_t;

/* What one step did. */
typedef struct {
  int64_t step;     /* the optimizer step just taken, from 1 */
  double loss;      /* mean over the global batch */
  double grad_norm; /* before clipping */
  double lr;        /* used by this step */
  int64_t tokens;   /* this rank's tokens of the step: its replica's
                       (B x T x accumulation) over the ranks sharing them
                       (tensor parallel), as torchtitan counts per device */
  double seconds;   /* wall time of the step */
} tr_step_stats_t;

typedef struct tr_trainer {
  tr_trainer_settings_t settings; /* a copy; its strings borrowed */
  tr_model_t model;
  tr_dp_t dist;
  tr_trainer_tp_t tp; /* pg NULL: no tensor parallelism */
  tr_tp_comm_t* tp_comm; /* the tp hook's timing (tp.comm_timing) and
                            the async ring's waits (tp.async) */
  tr_trainer_pp_t pp; /* pg NULL: no pipeline parallelism */
  tr_cp_t cp;         /* pg NULL: no context parallelism (the model's
                         seam points here) */
  tr_pp_build_t* ppb; /* the pipeline's stages and lists (pp.pg) */
  int pp_rank;
  /* under pp: parameters left out of this rank's gradient norm (a tied
   * table's second copy), n_params entries; NULL otherwise */
  unsigned char* norm_skip;
  int32_t* pp_tokens; /* under pp: the step's samples, micro-batch-major */
  int32_t* pp_targets;
  /* under pp with validation: every rank's forward-only lists of a
   * validation batch (tr_pp_build_eval), made at the first validation */
  tr_pp_schedule_t* pp_eval;
  /* this rank among the run's ranks (pipeline x data parallel x context
   * parallel x tensor parallel): rank = ((pp_rank x dp + dp_rank) x cp +
   * its cp coordinate) x tp + its tp coordinate;
   * who prints, writes files and the final weights (rank 0), and the
   * checkpoint's writers */
  int rank, world;
  /* AdamW moments, one pair per parameter (like its grad) */
  tr_tensor_t* adam_m;
  tr_tensor_t* adam_v;
  int64_t step; /* optimizer steps taken */
  tr_lr_schedule_t lr;
  uint64_t seed; /* settings.debug.seed, or the one picked at start */
  /* sizes */
  int64_t B, T, G;    /* local micro-batch, seq_len, global batch */
  int64_t grad_accum; /* micro-steps per optimizer step */
  /* the step's actions (trainrun/pipelining.h): one stage, 1F1B over the
   * grad_accum micro-batches, 2 x grad_accum of them */
  tr_pp_action_t* actions;
  int64_t val_B, val_T, val_steps; /* val_steps: batches per validation */
  double flops_per_token;          /* torchtitan's count, at seq_len T */
  /* data */
  tr_dataset_t* train_data;
  tr_dataset_t* val_data; /* NULL without validation */
  tr_loader_t train;
  tr_loader_t val;
  int has_val;
  int32_t* inputs; /* [max(B*T, val_B*val_T)] */
  int32_t* targets;
  tr_trainer_opts_t opts;
  struct tr_trainer_ckpt*
      ckpt; /* [checkpoint] state (opaque, trainer/checkpointing.c); NULL: disabled */
  /* where it computes (settings.device) */
  tr_device_t device;
  char device_name[96];     /* "cpu", "NVIDIA H100 80GB HBM3" */
  tr_dtype_t compute_dtype; /* settings.compute_dtype */
  tr_tensor_t loss_acc;     /* cuda: per-token losses of the step so far */
} tr_trainer_t;

/* Build everything a run needs from its settings (copied; their strings
 * borrowed): the model (seeded init), the data (training.dataset_path;
 * validation from validation.dataset_path or the last
 * validation.split_fraction of the training data), AdamW state, the
 * schedule. The data-parallel size is opts->dist's. Errors (TR_ECONFIG,
 * data errors, TR_ENOMEM) come with a message; *t needs no release then. */
int tr_trainer_init(tr_trainer_t* t, const tr_trainer_settings_t* s,
                    const tr_trainer_opts_t* opts, tr_errmsg_t* err);
void tr_trainer_release(tr_trainer_t* t);

/* One optimizer step (see the top of this file). TR_ERANGE when the loss
 * or the gradient norm is not finite ("loss is nan at step 12"). */
int tr_trainer_step(tr_trainer_t* t, tr_step_stats_t* st, tr_errmsg_t* err);

/* Mean loss over the validation data (validation.steps batches from its
 * start; -1: every full batch), and the tokens it covered. No gradients.
 * Under pipeline parallelism each batch runs forward only through the
 * stages, in micro-batches of pipeline_parallel_microbatch_size, and every
 * rank gets the last stage's loss. */
int tr_trainer_validate(tr_trainer_t* t, double* loss, int64_t* ntokens,
                        tr_errmsg_t* err);

/* The whole run: with [checkpoint] enable, first a resume from the latest
 * complete checkpoint (tr_trainer_checkpoint_start); steps until
 * training.steps (or SIGINT/SIGTERM, which finish the step in progress,
 * save it when checkpointing, and end the run normally), checkpoints as
 * [checkpoint] asks (tr_trainer_checkpoint_step), the metric line
 * every metrics.log_freq steps and after the last (console on data-parallel
 * rank 0; JSONL and TensorBoard per [metrics]), validation every
 * validation.freq steps when enabled, and at the end the weights as
 * <dump_folder>/model.safetensors (Hugging Face names, dtype
 * checkpoint.export_dtype) with a Hugging Face config.json beside it.
 * *stopped (may be NULL) is set to 1 when a signal ended the run early. */
int tr_train(const tr_trainer_settings_t* s, const tr_trainer_opts_t* opts,
             int* stopped, tr_errmsg_t* err);

/* ---- checkpoints ([checkpoint]; trainer/checkpointing.c) ----
 *
 * A checkpoint of a run (trainrun/checkpoint.h) holds "model.<HF name>"
 * for every parameter, "optimizer.state.<HF name>.exp_avg" and
 * ".exp_avg_sq" (AdamW moments, chunked like their parameter), and a
 * train state: step, tokens seen, the data loader's next global sample
 * (and seed, seq_len, token count), the seed, the LR schedule, the batch
 * layout. Resuming restores all of it, so steps after it repeat bit for
 * bit on the CPU; another data-parallel degree (same global batch)
 * continues the same sample stream. */

/* Called by tr_train after tr_trainer_init when checkpoint.enable: make the
 * saver (unless load_only) and resume from checkpoint.load_step, else the
 * latest complete step of <dump_folder>/<checkpoint.folder>, else
 * initial_load_path (the model alone when initial_load_model_only; a
 * Hugging Face safetensors file when initial_load_in_hf). With
 * create_seed_checkpoint it saves the initialised model as step 0 instead
 * and sets t->step to training.steps (nothing left to train).
 * Progress lines go to con (may be NULL); each committed save's stall and
 * write time to ml (trainrun/metrics.h; may be NULL). No-op when
 * disabled. */
struct tr_metrics_logger;
int tr_trainer_checkpoint_start(tr_trainer_t* t, FILE* con,
                                struct tr_metrics_logger* ml, tr_errmsg_t* err);
/* Called by tr_train after every step (collective) with what the step
 * did: commits a background save once every rank wrote it, and saves when
 * one is due (every interval steps, after step 1 with
 * enable_first_step_checkpoint, and when `last` — the final step,
 * synchronously, model-only in export_dtype with last_save_model_only; or
 * a stop signal, a full synchronous save).
 *
 * It also measures each save's stall, its true cost to training: the time
 * of the save's step and of the two steps after it (st->seconds plus this
 * call's own time) less three times the median time of the last 8 steps
 * that had no save in flight. (The second step after the save counts
 * because on a GPU the host leaves a step before its optimizer update,
 * which may wait for the save's device-to-host copies, has run.) The
 * console gets "checkpoint step N: training stalled S s (...)" and the
 * metrics record of the save, once committed, checkpoint_stall_s = S. */
int tr_trainer_checkpoint_step(tr_trainer_t* t, const tr_step_stats_t* st,
                               int last, tr_errmsg_t* err);
/* Save the current step now, synchronously, whatever the interval
 * (collective: every rank calls it; e.g. on SIGTERM). Waits for a save in
 * flight. TR_EINVAL when checkpointing is not enabled. */
int tr_trainer_checkpoint_now(tr_trainer_t* t, tr_errmsg_t* err);
/* Wait for a save in flight and commit it (collective; end of a run). */
int tr_trainer_checkpoint_finish(tr_trainer_t* t, tr_errmsg_t* err);
/* Load a step folder into t: the model; unless model_only, the AdamW
 * moments and the train state too (parts named in
 * checkpoint.exclude_from_loading are skipped). Any saved layout and world
 * size loads (chunks are matched by overlap). */
int tr_trainer_load_checkpoint(tr_trainer_t* t, const char* step_dir,
                               int model_only, tr_errmsg_t* err);

/* Mean loss of a model over the validation data of s (what `trainrun
 * eval` prints): s->validation, and s->training.dataset_path for a split;
 * the rest of s is not read. */
int tr_eval_loss(tr_model_t* m, const tr_trainer_settings_t* s, double* loss,
                 int64_t* ntokens, tr_errmsg_t* err);

/* ---- sampling ---- */

typedef struct {
  double temperature; /* 0: greedy (argmax) */
  int top_k;          /* 0: the whole vocabulary */
  int64_t max_new_tokens;
  uint64_t seed;
  int stop_at_eot; /* stop after generating TR_BYTE_EOT */
} tr_sample_opts_t;

/* Extend prompt[0..n) by up to max_new_tokens tokens; out receives the new
 * tokens (capacity max_new_tokens), *nout how many. The context is the last
 * cfg.max_seq_len tokens. Same seed, same tokens. */
int tr_sample(tr_model_t* m, const int32_t* prompt, int64_t n,
              const tr_sample_opts_t* o, int32_t* out, int64_t* nout,
              tr_errmsg_t* err);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_TRAINER_H */
