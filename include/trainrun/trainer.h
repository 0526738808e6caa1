/* trainrun/trainer.h: the per-rank training loop — model, AdamW, the
 * learning-rate schedule, gradient accumulation and clipping, validation,
 * metrics, and the weights written at the end.
 *
 * Typical use (what `trainrun job.toml` does on each rank):
 *
 *     tr_errmsg_t err;
 *     int rc = tr_train(&cfg, NULL, &err);   // cfg resolved for the world
 *     if (rc < 0) fprintf(stderr, "trainrun: %s\n", err.message);
 *
 * or step by step (tests, tools):
 *
 *     tr_trainer_t t;
 *     tr_trainer_init(&t, &cfg, NULL, &err);
 *     tr_step_stats_t st;
 *     while (t.step < cfg.training.steps) tr_trainer_step(&t, &st, &err);
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

#include "trainrun/config.h"
#include "trainrun/data.h"
#include "trainrun/errmsg.h"
#include "trainrun/model.h"
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
/* The schedule from cfg->optimizer.lr and [lr_scheduler] (total_steps
 * unset: training.steps). */
int tr_lr_schedule_from_config(tr_lr_schedule_t* s, const tr_config_t* cfg,
                               tr_errmsg_t* err);
/* f(step - 1) for optimizer step `step` >= 1, and lr × that. */
double tr_lr_schedule_factor(const tr_lr_schedule_t* s, int64_t step);
double tr_lr_schedule_lr(const tr_lr_schedule_t* s, int64_t step);

/* ---- data-parallel seams ---- */

struct tr_trainer;

/* Communication overlap over the steps since the last take (FSDP's and
 * DDP's [metrics] comm_overlap): totals, hidden = 1 - exposed / comm. */
typedef struct {
  int64_t steps;
  double comm_ms, exposed_ms, hidden;
} tr_trainer_comm_t;

/* 1 - exposed_ms / comm_ms clamped to [0, 1] (a wait also covers its own
 * overhead -- event pairs, clock reads, ops queued before the one waited
 * for -- so the raw ratio can pass 1); NAN when comm_ms is not positive. */
double tr_trainer_comm_hidden(double comm_ms, double exposed_ms);

/* Filled by the data-parallel layer; all NULL on one rank. */
typedef struct {
  int dp_rank, dp_size; /* 0 and 1 on one rank */
  /* After the last micro-step's backward, before the gradient norm: make
   * every parameter's grad the SUM over data-parallel ranks (the losses are
   * already scaled by the global token count), e.g. by waiting for the
   * bucketed all-reduces started in the model's post-backward hooks. */
  int (*post_backward)(void* arg, struct tr_trainer* t);
  /* Sum n doubles over the data-parallel ranks, in place (loss sums, token
   * counts; the squared grad norm when grads_sharded). */
  int (*all_reduce_sum)(void* arg, double* vals, int n);
  /* k >= 1 when each rank holds only a shard of every gradient (FSDP)
   * and each shard is held by k ranks (HSDP replicas; 1 for FSDP): the
   * squared norm is summed over ranks and divided by k. 0: whole grads. */
  int grads_sharded;
  /* Called by tr_trainer_init after the model's table is built, before its
   * memory is allocated: set parameter layouts (shards) and install block
   * hooks. NULL: nothing. */
  int (*setup_model)(void* arg, tr_model_t* m);
  /* Called on every rank before rank 0 writes the final weights: make
   * every parameter whole (FSDP all-gathers). NULL: they are. */
  int (*gather_model)(void* arg, tr_model_t* m);
  /* Called before each micro-step's forward, micro = 0 .. n_micro - 1 of
   * this optimizer step. The backward of the last one makes the grads
   * final: DDP's post-backward hooks then start each bucket's all-reduce
   * as soon as its grads are final. NULL: nothing. */
  int (*pre_micro_step)(void* arg, struct tr_trainer* t, int64_t micro,
                        int64_t n_micro);
  /* Called once per optimizer step after the step's device synchronisation
   * (the loss and the norm were read): settle the communication still held
   * and read its timing; the first error. NULL: nothing. */
  int (*step_end)(void* arg);
  /* The communication overlap measured since the last call (steps 0: not
   * measured). NULL: never measured. */
  void (*comm_take)(void* arg, tr_trainer_comm_t* out);
  void* arg;
} tr_trainer_dist_t;

/* ---- the trainer ---- */

typedef struct {
  /* Build this model instead of cfg's [model] name/flavor (tests, tools);
   * NULL: the flavor, with vocab_size and max_seq_len fitted to the run. */
  const tr_model_config_t* model_override;
  /* Data parallelism; NULL: one rank. Copied. */
  const tr_trainer_dist_t* dist;
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
  int64_t tokens;   /* tokens this rank processed in the step */
  double seconds;   /* wall time of the step */
} tr_step_stats_t;

typedef struct tr_trainer {
  const tr_config_t* cfg; /* borrowed */
  tr_model_t model;
  tr_trainer_dist_t dist;
  /* AdamW moments, one pair per parameter (like its grad) */
  tr_tensor_t* adam_m;
  tr_tensor_t* adam_v;
  int64_t step; /* optimizer steps taken */
  tr_lr_schedule_t lr;
  uint64_t seed; /* debug.seed, or the one picked at start */
  /* sizes */
  int64_t B, T, G;    /* local micro-batch, seq_len, global batch */
  int64_t grad_accum; /* micro-steps per optimizer step */
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
  struct tr__trainer_ckpt* ckpt; /* [checkpoint] state; NULL: disabled */
  /* where it computes ([training] device, LOCAL_RANK) */
  tr_device_t device;
  char device_name[96];      /* "cpu", "NVIDIA H100 80GB HBM3" */
  tr_dtype_t compute_dtype;  /* bf16 on cuda by default, f32 on the CPU */
  tr_tensor_t loss_acc;      /* cuda: per-token losses of the step so far */
} tr_trainer_t;

/* Build everything a run needs from a resolved config: the model (seeded
 * init), the data (training.dataset_path; validation from
 * validation.dataset_path or the last validation.split_fraction of the
 * training data), AdamW state, the schedule. Errors (TR_ECONFIG, data
 * errors, TR_ENOMEM) come with a message; *t needs no release then. */
int tr_trainer_init(tr_trainer_t* t, const tr_config_t* cfg,
                    const tr_trainer_opts_t* opts, tr_errmsg_t* err);
void tr_trainer_release(tr_trainer_t* t);

/* One optimizer step (see the top of this file). TR_ERANGE when the loss
 * or the gradient norm is not finite ("loss is nan at step 12"). */
int tr_trainer_step(tr_trainer_t* t, tr_step_stats_t* st, tr_errmsg_t* err);

/* Mean loss over the validation data (validation.steps batches from its
 * start; -1: every full batch), and the tokens it covered. No gradients. */
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
int tr_train(const tr_config_t* cfg, const tr_trainer_opts_t* opts,
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
                                struct tr_metrics_logger* ml,
                                tr_errmsg_t* err);
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
/* Before the weights or AdamW moments change: order the update after an
 * async save's copies of them (tr_trainer_step calls it before its
 * optimizer step; a no-op without one): device copies are waited for on
 * the device (the host goes on), host copies on the host; never the
 * write to disk. */
void tr__trainer_checkpoint_before_update(tr_trainer_t* t);
/* Free the checkpoint state (tr_trainer_release calls it). */
void tr__trainer_checkpoint_release(tr_trainer_t* t);

/* trainer/device.c: what depends on the device. pick: t->device,
 * device_name, compute_dtype from the config (and the current CUDA
 * device); setup (after the weights exist): compute copies and the loss
 * accumulator; loss_add: a micro-batch's losses into *sum (CPU) or the
 * device accumulator; loss_take: the accumulator added into *sum and
 * cleared (one host synchronization); grad_sumsq: *sq += sum of squares of
 * every local grad; adamw: the update of every parameter (and its compute
 * copy). */
int tr__trainer_device_pick(tr_trainer_t* t, tr_errmsg_t* err);
int tr__trainer_device_setup(tr_trainer_t* t);
void tr__trainer_device_release(tr_trainer_t* t);
int tr__trainer_loss_add(tr_trainer_t* t, const tr_model_mb_t* mb,
                         double* sum);
int tr__trainer_loss_take(tr_trainer_t* t, double* sum);
int tr__trainer_grad_sumsq(tr_trainer_t* t, double* sq);
int tr__trainer_adamw(tr_trainer_t* t, double lr, double clip);

/* The model config a run of cfg builds: the [model] flavor with vocab_size
 * kept (256 for the byte-level debug models) and, for llama3 (which has no
 * position table), max_seq_len set to the longest of training and
 * validation seq_len — the context the exported model records and
 * `trainrun sample` slides within. TR_ECONFIG when the flavor is unknown or
 * seq_len exceeds a GPT-2's positions. */
int tr_trainer_model_config(const tr_config_t* cfg, tr_model_config_t* out,
                            tr_errmsg_t* err);

/* Mean loss of a model over the validation data a config names (what
 * `trainrun eval` prints). */
int tr_eval_loss(tr_model_t* m, const tr_config_t* cfg, double* loss,
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
