/* launcher/compose.c: the composition root -- the resolved job config
 * turned into each module's options: the trainer's settings, the mesh
 * degrees, FSDP's and DDP's options, FSDP over its mesh (over dp_shard x
 * cp under context parallelism), tensor, pipeline and context parallelism
 * (launcher/compose.h). */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "launcher/compose.h"
#include "trainrun/error.h"
#include "trainrun/fault.h" /* DDP's --debug.fault hook */
#include "trainrun/param.h" /* LOCAL_RANK */

/* [model] attn_mask_type, eos_id, sliding_window, document_positions
 * into the model config; the messages name the key (jobcheck.c puts
 * where it was set in front) */
static int compose_mask(const tr_config_t* cfg, tr_model_config_t* out,
                        tr_errmsg_t* err) {
  const typeof(cfg->model)* mo = &cfg->model;
  int block = strcmp(mo->attn_mask_type, "block_causal") == 0;
  out->attn_mask = block ? TR_ATTN_BLOCK_CAUSAL : TR_ATTN_CAUSAL;
  if (mo->eos_id.set && !block)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "model.eos_id: only block_causal masks use an "
                         "end-of-text token; set model.attn_mask_type = "
                         "\"block_causal\" or leave eos_id unset");
  if (mo->eos_id.set) out->eos_id = (int32_t)mo->eos_id.value;
  if (block && out->eos_id >= out->vocab_size)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "model.eos_id: %d is not a token of %s %s's "
                         "%d-token vocabulary",
                         (int)out->eos_id, mo->name, mo->flavor,
                         out->vocab_size);
  if (mo->document_positions && !block)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "model.document_positions: positions restart at "
                         "document starts, which only block_causal masks "
                         "have; set model.attn_mask_type = \"block_causal\"");
  out->document_positions = mo->document_positions;
  int64_t T = cfg->training.seq_len;
  if (cfg->validation.enable && cfg->validation.seq_len > T)
    T = cfg->validation.seq_len;
  if (mo->sliding_window > T)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "model.sliding_window: %" PRId64 " is longer than "
                         "the %" PRId64 "-token sequences (every token would "
                         "see all earlier ones: use 0 for no window)",
                         mo->sliding_window, T);
  out->sliding_window = (int)mo->sliding_window;
  return 0;
}

int tr_compose_model_config(const tr_config_t* cfg, tr_model_config_t* out,
                            tr_errmsg_t* err) {
  int rc = tr_model_config_get(cfg->model.name, cfg->model.flavor, out);
  if (rc < 0) {
    char list[256] = "";
    const char* const* fl = tr_model_flavors(cfg->model.name);
    for (size_t i = 0; fl && fl[i]; i++) {
      size_t w = strlen(list);
      snprintf(list + w, sizeof list - w, "%s%s", i ? ", " : "", fl[i]);
    }
    return tr_errmsg_set(err, TR_ECONFIG,
                         "model.flavor: unknown flavor '%s' of %s (flavors: "
                         "%s)",
                         cfg->model.flavor, cfg->model.name, list);
  }
  int64_t T = cfg->training.seq_len;
  if (cfg->validation.enable && cfg->validation.seq_len > T)
    T = cfg->validation.seq_len;
  TR_CHECK(compose_mask(cfg, out, err));
  if (tr_model_fixed_context(out)) { /* a position table (GPT-2) */
    if (T > out->max_seq_len)
      return tr_errmsg_set(
          err, TR_ECONFIG,
          "training.seq_len: %" PRId64 " exceeds the %d positions of %s %s", T,
          out->max_seq_len, tr_model_family_name(out->family),
          cfg->model.flavor);
    return 0;
  }
  /* no position table (Llama): the longest sequence the run trains on is
   * the context the exported model claims (and `trainrun sample` keeps) */
  if (cfg->validation.seq_len > T) T = cfg->validation.seq_len; /* eval */
  if (T > INT32_MAX)
    return tr_errmsg_set(err, TR_ECONFIG, "training.seq_len: too large");
  out->max_seq_len = (int)T;
  return 0;
}

/* The rank's device and, on CUDA, the compute dtype (mixed_precision_param;
 * the CPU kernels are float32). */
static int compose_device(const tr_config_t* cfg, int local_rank,
                          tr_device_t* dev, tr_dtype_t* dtype,
                          tr_errmsg_t* err) {
  *dev = TR_DEVICE_CPU;
  *dtype = TR_F32;
  if (local_rank < 0) return 0;
  TR_CHECK(tr_config_device(cfg, local_rank, dev, err));
  if (dev->type == TR_DEV_CUDA &&
      tr_dtype_parse(cfg->training.mixed_precision_param, dtype) < 0)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "training.mixed_precision_param: '%s' is not "
                         "float32 or bfloat16",
                         cfg->training.mixed_precision_param);
  return 0;
}

int tr_compose_trainer(const tr_config_t* cfg, int local_rank,
                       tr_trainer_settings_t* s, tr_errmsg_t* err) {
  memset(s, 0, sizeof *s);
  TR_CHECK(compose_device(cfg, local_rank, &s->device, &s->compute_dtype, err));
  TR_CHECK(tr_compose_model_config(cfg, &s->model, err));
  s->dump_folder = cfg->job.dump_folder;

  const typeof(cfg->training)* tr = &cfg->training;
  s->training =
      (tr_trainer_training_t){.steps = tr->steps,
                              .local_batch_size = tr->local_batch_size,
                              .global_batch_size = tr->global_batch_size,
                              .seq_len = tr->seq_len,
                              .max_norm = tr->max_norm,
                              .dataset = tr->dataset,
                              .dataset_path = tr->dataset_path};

  const typeof(cfg->optimizer)* o = &cfg->optimizer;
  s->optimizer = (tr_trainer_optimizer_t){.name = o->name,
                                          .lr = o->lr,
                                          .beta1 = o->beta1,
                                          .beta2 = o->beta2,
                                          .eps = o->eps,
                                          .weight_decay = o->weight_decay};

  const typeof(cfg->lr_scheduler)* l = &cfg->lr_scheduler;
  s->lr_scheduler = (tr_trainer_lr_scheduler_t){
      .warmup_steps = l->warmup_steps,
      .total_steps = l->total_steps.set ? l->total_steps.value : tr->steps,
      .decay_ratio = l->decay_ratio.set ? l->decay_ratio.value : -1.0,
      .decay_type = l->decay_type,
      .min_lr_factor = l->min_lr_factor};

  const typeof(cfg->validation)* v = &cfg->validation;
  s->validation =
      (tr_trainer_validation_t){.enable = v->enable,
                                .dataset_path = v->dataset_path,
                                .split_fraction = v->split_fraction,
                                .local_batch_size = v->local_batch_size,
                                .seq_len = v->seq_len,
                                .steps = v->steps,
                                .freq = v->freq};

  const typeof(cfg->metrics)* m = &cfg->metrics;
  s->metrics = (tr_trainer_metrics_t){
      .log_freq = m->log_freq,
      .enable_jsonl = m->enable_jsonl,
      .save_jsonl_file = m->save_jsonl_file,
      .enable_tensorboard = m->enable_tensorboard,
      .save_tb_folder = m->save_tb_folder,
      .save_for_all_ranks = m->save_for_all_ranks,
      .disable_color_printing = m->disable_color_printing};

  const typeof(cfg->checkpoint)* c = &cfg->checkpoint;
  s->checkpoint = (tr_trainer_checkpoint_t){
      .enable = c->enable,
      .folder = c->folder,
      .interval = c->interval,
      .keep_latest_k = c->keep_latest_k,
      .async_mode = c->async_mode,
      .load_only = c->load_only,
      .create_seed_checkpoint = c->create_seed_checkpoint,
      .load_step = c->load_step,
      .initial_load_path = c->initial_load_path,
      .initial_load_model_only = c->initial_load_model_only,
      .initial_load_in_hf = c->initial_load_in_hf,
      .enable_first_step_checkpoint = c->enable_first_step_checkpoint,
      .last_save_model_only = c->last_save_model_only,
      .last_save_in_hf = c->last_save_in_hf,
      .export_dtype = c->export_dtype,
      .exclude_from_loading = (const char* const*)c->exclude_from_loading.v,
      .n_exclude_from_loading = c->exclude_from_loading.n};

  s->activation_checkpoint.mode = cfg->activation_checkpoint.mode;
  s->activation_checkpoint.selective_ac_option =
      cfg->activation_checkpoint.selective_ac_option;

  s->debug.seed_set = cfg->debug.seed.set;
  s->debug.seed = (uint64_t)cfg->debug.seed.value;
  s->debug.faults = (const char* const*)cfg->debug.fault.v;
  s->debug.n_faults = cfg->debug.fault.n;
  return 0;
}

void tr_compose_mesh_degrees(const tr_config_t* cfg, tr_mesh_degrees_t* d) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  tr_mesh_degrees_init(d);
  d->pp = (int)p->pipeline_parallel_degree;
  d->dp_replicate = (int)p->data_parallel_replicate_degree;
  d->dp_shard = (int)p->data_parallel_shard_degree; /* resolved */
  d->cp = (int)p->context_parallel_degree;
  d->tp = (int)p->tensor_parallel_degree;
}

int tr_compose_fsdp_opts(const tr_config_t* cfg, int local_rank,
                         tr_fsdp_opts_t* o, tr_errmsg_t* err) {
  tr_fsdp_opts_init(o);
  if (tr_fsdp_reshard_parse(cfg->parallelism.fsdp_reshard_after_forward,
                            &o->reshard_after_forward) < 0)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "parallelism.fsdp_reshard_after_forward: unknown "
                         "'%s'",
                         cfg->parallelism.fsdp_reshard_after_forward);
  if (tr_dtype_parse(cfg->training.mixed_precision_reduce, &o->reduce_dtype) <
      0)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "training.mixed_precision_reduce: unknown '%s'",
                         cfg->training.mixed_precision_reduce);
  /* mixed_precision_param applies to CUDA compute; the CPU kernels are
   * float32 */
  tr_device_t dev;
  TR_CHECK(tr_config_device(cfg, local_rank, &dev, err));
  o->param_dtype = TR_F32;
  if (dev.type == TR_DEV_CUDA &&
      tr_dtype_parse(cfg->training.mixed_precision_param, &o->param_dtype) < 0)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "training.mixed_precision_param: unknown '%s'",
                         cfg->training.mixed_precision_param);
  o->divide_factor = 1; /* the trainer scales the loss by the global batch */
  o->train_timeout_ms = cfg->comm.train_timeout_seconds * 1000;
  o->prefetch_depth = (int)cfg->parallelism.fsdp_prefetch_depth;
  o->comm_timing = cfg->metrics.comm_overlap;
  return 0;
}

int tr_compose_mesh(const tr_config_t* cfg, tr_pg_t* world, tr_mesh_t** out,
                    tr_errmsg_t* err) {
  tr_mesh_degrees_t d;
  tr_compose_mesh_degrees(cfg, &d);
  d.keep_size1 = 0; /* no one-rank groups */
  d.flatten = 0;    /* the layers use the plain dims */
  TR_CHECK(tr_mesh_from_degrees(world, &d, out, err));
  if (d.cp < 2 || d.dp_shard < 2) return 0;
  /* FSDP's group under context parallelism (torchtitan's dp_shard_cp) */
  static const char* const parts[2] = {"dp_shard", "cp"};
  int rc = tr_mesh_flatten(*out, parts, 2, "dp_shard_cp", err);
  if (rc < 0) {
    tr_mesh_free(*out);
    *out = NULL;
  }
  return rc;
}

/* The shape the parameters are placed on: the mesh's dims, with dp_shard
 * and cp as one dim "dp_shard" of dp_shard x cp ranks under context
 * parallelism (FSDP shards over both, torchtitan's dp_shard_cp; the
 * parameters are whole on the cp ranks otherwise). */
static void placement_shape(const tr_mesh_t* mesh, tr_mesh_shape_t* out) {
  tr_mesh_shape_t s;
  tr_mesh_get_shape(mesh, &s);
  int c = tr_mesh_shape_index(&s, "cp"),
      d = tr_mesh_shape_index(&s, "dp_shard");
  *out = s;
  if (c < 0) return;
  out->ndim = 0;
  for (int i = 0; i < s.ndim; i++) {
    if (i == c && d >= 0) continue; /* merged into dp_shard */
    int j = out->ndim++;
    snprintf(out->names[j], sizeof out->names[j], "%s",
             i == c ? "dp_shard" : s.names[i]);
    out->sizes[j] = s.sizes[i];
    out->coords[j] = s.coords[i];
    if (i == d) { /* dp_shard's coordinate major, cp's minor */
      out->sizes[j] = s.sizes[d] * s.sizes[c];
      out->coords[j] = s.coords[d] * s.sizes[c] + s.coords[c];
    }
  }
}

int tr_compose_cp(const tr_config_t* cfg, const tr_mesh_t* mesh, tr_cp_t* out) {
  memset(out, 0, sizeof *out);
  tr_pg_t* pg = tr_mesh_dim_pg(mesh, "cp");
  if (!pg || tr_pg_size(pg) < 2) return 0;
  if (tr_cp_rotate_parse(cfg->parallelism.context_parallel_rotate_method,
                         &out->rotate) < 0)
    return TR_ECONFIG; /* the schema's choices are the ring's */
  out->pg = pg;
  return 1;
}

int tr_compose_fsdp(const tr_config_t* cfg, const tr_mesh_t* mesh,
                    tr_fsdp_t** out, tr_errmsg_t* err) {
  *out = NULL;
  tr_fsdp_opts_t o;
  TR_CHECK(tr_compose_fsdp_opts(cfg, (int)tr_param_int(TR_PARAM_LOCAL_RANK), &o,
                                err));
  /* under context parallelism over dp_shard x cp (or cp alone) */
  o.shard_pg = tr_mesh_dim_pg(mesh, "dp_shard_cp");
  if (!o.shard_pg) o.shard_pg = tr_mesh_dim_pg(mesh, "dp_shard");
  if (!o.shard_pg) o.shard_pg = tr_mesh_dim_pg(mesh, "cp");
  o.replicate_pg = tr_mesh_dim_pg(mesh, "dp_replicate");
  tr_mesh_shape_t shape; /* the placements are on the job's mesh */
  placement_shape(mesh, &shape);
  o.mesh = &shape;
  if (!o.shard_pg)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "fsdp needs data_parallel_shard_degree or "
                         "context_parallel_degree > 1");
  int rc = tr_fsdp_new(&o, out);
  if (rc < 0) return tr_errmsg_set(err, rc, "fsdp: %s", tr_strerror(rc));
  return 0;
}

int tr_compose_tp(const tr_config_t* cfg, const tr_mesh_t* mesh,
                  tr_trainer_tp_t* out) {
  memset(out, 0, sizeof *out);
  tr_pg_t* pg = tr_mesh_dim_pg(mesh, "tp");
  if (!pg || tr_pg_size(pg) < 2) return 0;
  out->pg = pg;
  placement_shape(mesh, &out->mesh); /* FSDP composes onto it */
  out->loss_parallel = !cfg->parallelism.disable_loss_parallel;
  out->sequence_parallel = 1; /* torchtitan's TP always runs it */
  out->comm_timing = cfg->metrics.comm_overlap;
  out->async = cfg->parallelism.enable_async_tensor_parallel;
  return 1;
}

int tr_compose_pp_build(const tr_config_t* cfg, const tr_model_config_t* mc,
                        tr_pp_build_opts_t* o) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  memset(o, 0, sizeof *o);
  if (tr_pp_kind_parse(p->pipeline_parallel_schedule, &o->kind) < 0)
    return TR_ECONFIG; /* the schema's choices are the generators' */
  o->n_layers = mc->n_layers;
  o->pp = (int)p->pipeline_parallel_degree;
  int64_t accum = cfg->derived.grad_accum_steps;
  o->n_micro = (accum > 0 ? accum : 1) * (cfg->training.local_batch_size /
                                          p->pipeline_parallel_microbatch_size);
  o->layers_per_stage = p->pipeline_parallel_layers_per_stage.set
                            ? (int)p->pipeline_parallel_layers_per_stage.value
                            : 0;
  o->first_less = (int)p->pipeline_parallel_first_stage_less_layers;
  o->last_less = (int)p->pipeline_parallel_last_stage_less_layers;
  o->schedule_csv = p->pipeline_parallel_schedule_csv;
  return 0;
}

int tr_compose_pp(const tr_config_t* cfg, const tr_mesh_t* mesh,
                  tr_trainer_pp_t* out) {
  memset(out, 0, sizeof *out);
  tr_pg_t* pg = tr_mesh_dim_pg(mesh, "pp");
  if (!pg || tr_pg_size(pg) < 2) return 0;
  tr_model_config_t mc;
  TR_CHECK(tr_compose_model_config(cfg, &mc, NULL));
  TR_CHECK(tr_compose_pp_build(cfg, &mc, &out->build));
  out->pg = pg;
  out->microbatch_size = cfg->parallelism.pipeline_parallel_microbatch_size;
  return 1;
}

void tr_compose_ddp_opts(const tr_config_t* cfg, tr_pg_t* pg,
                         tr_ddp_opts_t* o) {
  tr_ddp_opts_init(o);
  o->pg = pg;
  o->bucket_bytes = tr_param_int(TR_PARAM_DDP_BUCKET_MB) << 20;
  o->train_timeout_ms = cfg->comm.train_timeout_seconds * 1000;
  o->comm_timing = cfg->metrics.comm_overlap;
  o->sync_fault = tr_fault_grad_sync; /* --debug.fault on DDP's buckets */
}
