/* launcher/jobcheck.c: the checks every command that takes a job runs
 * before it acts -- `trainrun JOB.toml` (the launcher once for the whole
 * world, then each rank), --dry-run, `trainrun config` and `trainrun plan`
 * -- so that all of them accept and refuse the same jobs:
 *
 *  - the config's cross-field resolution (tr_config_resolve) for the world
 *    the job runs in ([comm] mode = "fake_backend": comm.fake_world_size);
 *  - the grammars that other modules own, through their parsers: fault
 *    specs (trainer/fault.c), process-group backend lists
 *    (collectives/pg.c);
 *  - keys whose feature trainrun does not build, refused with where they
 *    were set, what they would need and what to use instead;
 *  - keys that only work together (and the model's flavor and length),
 *    checked here once rather than when the trainer reaches them.
 *
 * Keys accepted only so that torchtitan job files load, or that apply only
 * under a parallelism trainrun does not build, change nothing; when one is
 * set to another value than its default, tr__job_notes says so. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "launcher/commands.h"
#include "trainrun/config.h"
#include "trainrun/error.h"
#include "trainrun/fault.h" /* the fault-spec grammar */
#include "trainrun/param.h" /* TRAINRUN_ATTENTION */
#include "trainrun/pg.h"    /* the backend grammar */
#include "trainrun/tensor.h"
#include "launcher/compose.h" /* the model config of a job */

/* err = "<where key was set>: <key>: <message>" (after file:line:col the
 * key is named; a flag names it itself; a message from another module's
 * parser that starts with the key's name names it too). Returns
 * TR_ECONFIG. */
static int key_fail(const tr_config_t* cfg, tr_errmsg_t* err,
                    tr_config_key_id_t id, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int key_fail(const tr_config_t* cfg, tr_errmsg_t* err,
                    tr_config_key_id_t id, const char* fmt, ...) {
  char msg[sizeof err->message], where[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char* at = tr_config_origin(cfg, id, where, sizeof where);
  const char* name = tr_config_key(id)->name;
  if (strncmp(msg, name, strlen(name)) == 0) {
    if (!at || at[0] == '-') return tr_errmsg_set(err, TR_ECONFIG, "%s", msg);
    return tr_errmsg_set(err, TR_ECONFIG, "%s: %s", at, msg);
  }
  if (at && at[0] == '-') /* the flag names the key */
    return tr_errmsg_set(err, TR_ECONFIG, "%s: %s", at, msg);
  if (at) return tr_errmsg_set(err, TR_ECONFIG, "%s: %s: %s", at, name, msg);
  return tr_errmsg_set(err, TR_ECONFIG, "%s: %s", name, msg);
}

/* Does the job compute on a GPU (training.device cuda, or auto with one
 * visible)? */
static int job_on_cuda(const tr_config_t* cfg) {
  const char* d = cfg->training.device;
  return strcmp(d, "cuda") == 0 ||
         (strcmp(d, "auto") == 0 && tr_cuda_device_count() > 0);
}

/* [comm] mode and the fake world: the world size to resolve for. */
static int check_mode(const tr_config_t* cfg, int64_t* world,
                      tr_errmsg_t* err) {
  const typeof(cfg->comm)* c = &cfg->comm;
  if (strcmp(c->mode, "local_tensor") == 0)
    return key_fail(cfg, err, TR_CFG_K_comm_mode,
                    "local_tensor (every rank simulated in one process) is "
                    "not implemented; use fake_backend to check a layout's "
                    "shapes and memory in one process, or default");
  if (strcmp(c->mode, "fake_backend") != 0) {
    if (!tr_config_is_default(cfg, TR_CFG_K_comm_fake_world_size))
      return key_fail(cfg, err, TR_CFG_K_comm_fake_world_size,
                      "applies under comm.mode = \"fake_backend\" only; set "
                      "that mode, or leave this key out");
    if (!tr_config_is_default(cfg, TR_CFG_K_comm_fake_rank))
      return key_fail(cfg, err, TR_CFG_K_comm_fake_rank,
                      "applies under comm.mode = \"fake_backend\" only; set "
                      "that mode, or leave this key out");
    return 0;
  }
  if (*world != 1 && *world != c->fake_world_size)
    return key_fail(cfg, err, TR_CFG_K_comm_mode,
                    "fake_backend runs one process that plays rank "
                    "comm.fake_rank of comm.fake_world_size (%lld) ranks, "
                    "but the launch asks for %lld processes; drop "
                    "--nproc-per-node / --nnodes, and set "
                    "comm.fake_world_size for the world to play",
                    (long long)c->fake_world_size, (long long)*world);
  if (c->fake_rank >= c->fake_world_size)
    return key_fail(cfg, err, TR_CFG_K_comm_fake_rank,
                    "rank %lld is not below comm.fake_world_size %lld",
                    (long long)c->fake_rank, (long long)c->fake_world_size);
  *world = c->fake_world_size;
  return 0;
}

/* [comm] backend through the process groups' own parser. */
static int check_backend(const tr_config_t* cfg, tr_errmsg_t* err) {
  tr_pg_backend_spec_t bs;
  tr_errmsg_t perr;
  if (tr_pg_backend_parse(cfg->comm.backend, &bs, &perr) < 0)
    return key_fail(cfg, err, TR_CFG_K_comm_backend, "%s", perr.message);
  if (bs.cpu == TR_PG_BACKEND_FAKE || bs.cuda == TR_PG_BACKEND_FAKE)
    return key_fail(cfg, err, TR_CFG_K_comm_backend,
                    "the fake backend moves no data: use comm.mode = "
                    "\"fake_backend\" (one process that plays one rank)");
  int cuda = job_on_cuda(cfg);
  tr_pg_backend_t mine = cuda ? bs.cuda : bs.cpu;
  if (mine == TR_PG_BACKEND_NONE)
    return key_fail(cfg, err, TR_CFG_K_comm_backend,
                    "'%s' has no backend for %s tensors, where this job "
                    "computes (training.device); add %s",
                    cfg->comm.backend, cuda ? "cuda" : "cpu",
                    cuda ? "cuda:nccl" : "cpu:gloo or cpu:mpi");
  if (cuda && bs.cpu == TR_PG_BACKEND_MPI)
    return key_fail(cfg, err, TR_CFG_K_comm_backend,
                    "mpi serves the CPU tensors of CPU jobs; a GPU job uses "
                    "cpu:gloo,cuda:nccl");
  /* (a GPU job may be checked and planned with a build that lacks NCCL;
   * a CPU job over mpi runs with the build that checks it) */
  if (mine == TR_PG_BACKEND_MPI && !tr_pg_backend_available(mine))
    return key_fail(cfg, err, TR_CFG_K_comm_backend,
                    "this build of trainrun has no MPI (configure found no "
                    "Open MPI); use cpu:gloo");
  return 0;
}

/* [debug] fault through the fault injector's own parser. */
static int check_faults(const tr_config_t* cfg, int64_t world,
                        tr_errmsg_t* err) {
  const tr_config_list_t* l = &cfg->debug.fault;
  for (size_t i = 0; i < l->n; i++) {
    tr_fault_t f;
    tr_errmsg_t ferr;
    if (tr_fault_parse(l->v[i], &f, &ferr) < 0)
      return key_fail(cfg, err, TR_CFG_K_debug_fault, "%s", ferr.message);
    if (f.rank >= world)
      return key_fail(cfg, err, TR_CFG_K_debug_fault,
                      "debug.fault '%s': rank %d is not below the world "
                      "size %lld",
                      f.spec, f.rank, (long long)world);
  }
  return 0;
}

/* Keys whose feature is not built: refused when set to what needs it. */
static int check_unbuilt(const tr_config_t* cfg, tr_errmsg_t* err) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  if (p->expert_parallel_degree > 1)
    return key_fail(cfg, err, TR_CFG_K_parallelism_expert_parallel_degree,
                    "%lld: expert parallelism needs mixture-of-experts "
                    "layers, which trainrun's models (llama3, gpt2) do not "
                    "have; leave it 1",
                    (long long)p->expert_parallel_degree);
  if (cfg->training.enable_cpu_offload)
    return key_fail(cfg, err, TR_CFG_K_training_enable_cpu_offload,
                    "FSDP CPU offload (shards, gradients and optimizer "
                    "state in pinned host memory, the optimizer step on "
                    "the CPU) is not implemented; on a CPU device "
                    "everything is in host memory already. Save GPU memory "
                    "with more ranks in data_parallel_shard_degree or with "
                    "activation_checkpoint.mode");
  if (strcmp(cfg->training.dtype, "float32") != 0)
    return key_fail(cfg, err, TR_CFG_K_training_dtype,
                    "%s parameters without float32 master weights are not "
                    "supported; use training.mixed_precision_param = "
                    "\"bfloat16\" (bf16 compute over float32 master weights "
                    "on GPUs)",
                    cfg->training.dtype);
  if (cfg->optimizer.early_step_in_backward)
    return key_fail(cfg, err, TR_CFG_K_optimizer_early_step_in_backward,
                    "stepping each parameter during backward is not "
                    "implemented (trainrun steps once per step, after the "
                    "gradient sync and clipping); leave it false");
  if (cfg->validation.enable && !cfg->validation.dataset_path &&
      cfg->validation.split_fraction == 0)
    return key_fail(cfg, err, TR_CFG_K_validation_enable,
                    "validation needs data, and dataset '%s' is a name, not "
                    "a path (trainrun downloads nothing): set "
                    "validation.dataset_path or validation.split_fraction",
                    cfg->validation.dataset);
  return 0;
}

/* A message from another module that starts with "section.key: ": with
 * where that key was set in front. */
static int fail_named(const tr_config_t* cfg, tr_errmsg_t* err,
                      const char* msg) {
  for (size_t i = 0; i < tr_config_nkeys(); i++) {
    const char* name = tr_config_key(i)->name;
    size_t n = strlen(name);
    if (strncmp(msg, name, n) == 0 && (msg[n] == ':' || msg[n] == ' '))
      return key_fail(cfg, err, (tr_config_key_id_t)i, "%s", msg);
  }
  return tr_errmsg_set(err, TR_ECONFIG, "%s", msg);
}

/* Tensor parallelism: the degree divides what the plan splits (heads, KV
 * heads, every split dim: the plan's own check on the model's table), and
 * what is not built with it; async tensor parallel needs it (and its
 * sequence parallel, always on with it). */
static int check_tp(const tr_config_t* cfg, const tr_model_config_t* mc,
                    tr_errmsg_t* err) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  if (p->enable_async_tensor_parallel && p->tensor_parallel_degree <= 1)
    return key_fail(cfg, err, TR_CFG_K_parallelism_enable_async_tensor_parallel,
                    "asynchronous tensor parallelism overlaps the "
                    "sequence-parallel all-gathers and reduce-scatters of "
                    "tensor parallelism with the GEMMs, and this job has "
                    "none: set tensor_parallel_degree above 1 or leave it "
                    "false");
  if (p->tensor_parallel_degree <= 1) return 0;
  tr_model_t m;
  int rc = tr_model_init(&m, mc); /* the table only: no tensor memory */
  if (rc < 0)
    return tr_errmsg_set(err, rc, "cannot build the model: %s",
                         tr_strerror(rc));
  tr_mesh_shape_t s;
  const char* names[1] = {"tp"};
  int size = (int)p->tensor_parallel_degree, coord = 0;
  tr_errmsg_t perr;
  rc = tr_mesh_shape_init(&s, 1, names, &size, &coord);
  if (rc == 0) rc = tr_tp_plan_apply(&m, &s, &perr);
  tr_model_release(&m);
  if (rc < 0)
    return key_fail(cfg, err, TR_CFG_K_parallelism_tensor_parallel_degree, "%s",
                    rc == TR_ECONFIG ? perr.message : tr_strerror(rc));
  if (p->disable_loss_parallel && job_on_cuda(cfg) &&
      mc->vocab_size % p->tensor_parallel_degree == 0)
    return key_fail(cfg, err, TR_CFG_K_parallelism_disable_loss_parallel,
                    "gathering the logits of a vocabulary split over %lld "
                    "ranks is built for CPU tensors only; leave it false "
                    "on cuda (loss parallel gives the same losses)",
                    (long long)p->tensor_parallel_degree);
  return 0;
}

/* Context parallelism: what it is not built with. */
static int check_cp(const tr_config_t* cfg, tr_errmsg_t* err) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  int64_t cp = p->context_parallel_degree, tp = p->tensor_parallel_degree;
  if (strcmp(p->context_parallel_load_balancer, "headtail") != 0)
    return key_fail(cfg, err,
                    TR_CFG_K_parallelism_context_parallel_load_balancer,
                    "'%s' is not built: trainrun's ring balances the causal "
                    "work with torchtitan's head-tail chunks (rank r holds "
                    "chunks r and 2N-1-r); ptrr's per-document round robin "
                    "is FlexAttention's. Use \"headtail\"",
                    p->context_parallel_load_balancer);
  if (cp <= 1) return 0;
  if (tp > 1 && (cfg->training.seq_len / cp) % tp)
    return key_fail(cfg, err, TR_CFG_K_training_seq_len,
                    "training.seq_len %lld: each of the %lld cp ranks keeps "
                    "%lld tokens, which sequence parallelism cannot split "
                    "over tensor_parallel_degree %lld",
                    (long long)cfg->training.seq_len, (long long)cp,
                    (long long)(cfg->training.seq_len / cp), (long long)tp);
  if (cfg->validation.enable && cfg->validation.seq_len % (2 * cp))
    return key_fail(cfg, err, TR_CFG_K_validation_seq_len,
                    "validation.seq_len %lld must be a multiple of 2 x "
                    "context_parallel_degree = %lld",
                    (long long)cfg->validation.seq_len, (long long)(2 * cp));
  return 0;
}

/* Pipeline parallelism: what is not built with it, and the schedule the
 * workers will build (split, generator or CSV, lowering), built here the
 * same way so its errors come before any worker starts. */
static int check_pp(const tr_config_t* cfg, const tr_model_config_t* mc,
                    tr_errmsg_t* err) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  if (p->pipeline_parallel_degree <= 1) return 0;
  /* validation runs its batches through the stages in micro-batches */
  if (cfg->validation.enable &&
      cfg->validation.local_batch_size % p->pipeline_parallel_microbatch_size)
    return key_fail(cfg, err, TR_CFG_K_validation_local_batch_size,
                    "%lld is not a multiple of "
                    "parallelism.pipeline_parallel_microbatch_size %lld "
                    "(validation batches run through the pipeline in "
                    "micro-batches)",
                    (long long)cfg->validation.local_batch_size,
                    (long long)p->pipeline_parallel_microbatch_size);
  tr_pp_build_opts_t o;
  if (tr_compose_pp_build(cfg, mc, &o) < 0)
    return key_fail(cfg, err, TR_CFG_K_parallelism_pipeline_parallel_schedule,
                    "unknown schedule '%s'", p->pipeline_parallel_schedule);
  tr_pp_build_t b;
  char msg[sizeof err->message - 64];
  int rc = tr_pp_build_init(&b, &o, msg, sizeof msg);
  if (rc == 0) {
    tr_pp_build_release(&b);
    return 0;
  }
  const char* csv = p->pipeline_parallel_schedule_csv;
  if (csv && csv[0] && strncmp(msg, csv, strlen(csv)) == 0)
    return tr_errmsg_set(err, TR_ECONFIG, "%s", msg); /* FILE:row:col */
  /* the key it starts with ("pipeline_parallel_layers_per_stage: ..."),
   * else the first it names */
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < tr_config_nkeys(); i++) {
      const char* name = tr_config_key(i)->name;
      const char* dot = strchr(name, '.');
      if (strncmp(name, "parallelism.pipeline", 20) != 0 || !dot) continue;
      size_t n = strlen(dot + 1);
      if (pass ? strstr(msg, dot + 1) != NULL
               : strncmp(msg, dot + 1, n) == 0 && msg[n] == ':')
        return key_fail(cfg, err, (tr_config_key_id_t)i, "%s", msg);
    }
  return key_fail(cfg, err, TR_CFG_K_parallelism_pipeline_parallel_schedule,
                  "%s", msg);
}

/* Keys that only make sense together, and the model the job names. */
static int check_combinations(const tr_config_t* cfg, tr_errmsg_t* err) {
  tr_model_config_t mc;
  tr_errmsg_t merr;
  if (tr_compose_model_config(cfg, &mc, &merr) < 0) /* flavor, seq_len */
    return fail_named(cfg, err, merr.message);
  TR_CHECK(check_tp(cfg, &mc, err));
  TR_CHECK(check_cp(cfg, err));
  TR_CHECK(check_pp(cfg, &mc, err));
  /* TRAINRUN_PP_TRACE traces a pipeline step the run takes */
  if (tr_param_str(TR_PARAM_PP_TRACE)[0]) {
    if (cfg->parallelism.pipeline_parallel_degree <= 1)
      return key_fail(cfg, err, TR_CFG_K_parallelism_pipeline_parallel_degree,
                      "TRAINRUN_PP_TRACE traces a pipeline step, and this "
                      "job has no pipeline parallelism; unset it or set "
                      "pipeline_parallel_degree above 1");
    if (tr_param_int(TR_PARAM_PP_TRACE_STEP) > cfg->training.steps)
      return key_fail(cfg, err, TR_CFG_K_training_steps,
                      "TRAINRUN_PP_TRACE_STEP %lld is after the run's last "
                      "step (%lld): nothing would be traced",
                      (long long)tr_param_int(TR_PARAM_PP_TRACE_STEP),
                      (long long)cfg->training.steps);
  }
  const typeof(cfg->checkpoint)* ck = &cfg->checkpoint;
  if (ck->enable && ck->last_save_in_hf && !ck->last_save_model_only)
    return key_fail(cfg, err, TR_CFG_K_checkpoint_last_save_in_hf,
                    "checkpoint.last_save_in_hf needs "
                    "checkpoint.last_save_model_only = true (only the model "
                    "is saved as Hugging Face safetensors)");
  /* cuDNN's attention graphs have no window, and no per-row bounds for
   * the documents of a context-parallel chunk pair (documents alone run
   * as its ragged graph, whose Stats rows need heads per rank in fours) */
  int64_t tpd = cfg->parallelism.tensor_parallel_degree;
  int64_t heads = mc.n_heads / (tpd > 1 ? tpd : 1); /* a rank's */
  int docs = mc.attn_mask != TR_ATTN_CAUSAL;
  int docs_cp = docs && cfg->parallelism.context_parallel_degree > 1;
  int docs_h4 = docs && heads % 4 != 0;
  if ((mc.sliding_window > 0 || docs_cp || docs_h4) && job_on_cuda(cfg) &&
      strcmp(tr_param_str(TR_PARAM_ATTENTION), "cudnn") == 0)
    return key_fail(cfg, err,
                    mc.sliding_window > 0 ? TR_CFG_K_model_sliding_window
                                          : TR_CFG_K_model_attn_mask_type,
                    "TRAINRUN_ATTENTION=cudnn: cuDNN's attention takes no "
                    "sliding-window masks, nor documents under context "
                    "parallelism or with a number of attention heads per "
                    "rank (%lld) that is not a multiple of 4; leave "
                    "TRAINRUN_ATTENTION unset (auto runs those on the flash "
                    "or SIMT kernel) or set it to flash or simt",
                    (long long)heads);
  if (job_on_cuda(cfg) && strcmp(cfg->optimizer.name, "Adam") == 0 &&
      cfg->optimizer.weight_decay != 0)
    return key_fail(cfg, err, TR_CFG_K_optimizer_name,
                    "'Adam' with weight_decay (an L2 term) runs on the CPU "
                    "only; use AdamW on cuda, or weight_decay = 0");
  return 0;
}

int tr__job_check(tr_config_t* cfg, int64_t world, tr_errmsg_t* err) {
  TR_CHECK(check_mode(cfg, &world, err));
  TR_CHECK(check_unbuilt(cfg, err)); /* before the degrees meet the world */
  TR_CHECK(tr_config_resolve(cfg, world, err));
  TR_CHECK(check_combinations(cfg, err));
  TR_CHECK(check_backend(cfg, err));
  return check_faults(cfg, world, err);
}

int tr__job_uses_mpi(const tr_config_t* cfg) {
  tr_pg_backend_spec_t bs;
  return strcmp(cfg->comm.mode, "fake_backend") != 0 && !job_on_cuda(cfg) &&
         tr_pg_backend_parse(cfg->comm.backend, &bs, NULL) == 0 &&
         bs.cpu == TR_PG_BACKEND_MPI;
}

/* ---- keys that change nothing ---- */

#define UNDER_CP "it applies under context_parallel_degree > 1"
#define UNDER_EP                                                        \
  "it applies under expert parallelism, and trainrun's models have no " \
  "mixture-of-experts layers"

static const struct {
  tr_config_key_id_t id;
  const char* why;
} inert[] = {
    {TR_CFG_K_model_hf_assets_path,
     "trainrun reads no Hugging Face assets: its tokenizer is byte-level "
     "(token shards are tokenized already) and config.json is written from "
     "the model config"},
    {TR_CFG_K_training_gc_freq, "trainrun has no garbage collector to pace"},
    {TR_CFG_K_parallelism_expert_tensor_parallel_degree, UNDER_EP},
    {TR_CFG_K_parallelism_context_parallel_rotate_method, UNDER_CP},
    {TR_CFG_K_parallelism_expert_parallel_comm_backend, UNDER_EP},
    {TR_CFG_K_debug_moe_force_load_balance,
     "trainrun's models have no mixture-of-experts layers"},
    {TR_CFG_K_checkpoint_enable_ft_dataloader_checkpoints,
     "TorchFT is not part of trainrun"},
    {TR_CFG_K_optimizer_implementation,
     "trainrun has one AdamW update, a fused kernel over each flat "
     "parameter buffer, and every choice runs it (the three give the same "
     "numbers in PyTorch too)"},
    {TR_CFG_K_activation_checkpoint_memory_budget,
     "it applies under mode = \"memory_budget\", which is refused"},
    {TR_CFG_K_activation_checkpoint_preserve_rng_state,
     "trainrun's models have no dropout or other random state to preserve"},
    {TR_CFG_K_activation_checkpoint_early_stop,
     "a recomputation runs its whole layer"},
    {TR_CFG_K_activation_checkpoint_debug,
     "trainrun logs the policy at info level and each recomputation at "
     "debug level (TRAINRUN_LOG_LEVEL=debug), whatever this says"},
};

void tr__job_notes(const tr_config_t* cfg, FILE* out) {
  char where[300];
  for (size_t i = 0; i < sizeof inert / sizeof inert[0]; i++) {
    if (tr_config_is_default(cfg, inert[i].id)) continue;
    if (inert[i].id == TR_CFG_K_parallelism_context_parallel_rotate_method &&
        cfg->parallelism.context_parallel_degree > 1)
      continue; /* the ring's method: it acts */
    const char* at = tr_config_origin(cfg, inert[i].id, where, sizeof where);
    const char* name = tr_config_key(inert[i].id)->name;
    if (at && at[0] == '-') /* the flag names the key */
      fprintf(out, "trainrun: note: %s has no effect: %s\n", at, inert[i].why);
    else
      fprintf(out, "trainrun: note: %s%s%s has no effect: %s\n", at ? at : "",
              at ? ": " : "", name, inert[i].why);
  }
  if (cfg->debug.deterministic_warn_only && !cfg->debug.deterministic)
    fprintf(out,
            "trainrun: note: debug.deterministic_warn_only has no effect "
            "without debug.deterministic\n");
}
