/* launcher/compose.h: the composition root -- the one place that reads the
 * job config (trainrun/config.h) and turns it into each module's own
 * options: the trainer's settings (trainrun/trainer.h), the mesh degrees
 * (trainrun/dtensor.h), FSDP's and DDP's options (trainrun/fsdp2.h,
 * trainrun/ddp.h). The modules below never see the config.
 *
 * Part of libtrainrun (its top layer) but not installed: the trainrun
 * commands (launcher/run.c, cmd_eval.c, cmd_plan.c) and the tests use it.
 *
 * Every function takes a config resolved for its world (tr_config_resolve:
 * the degrees, the global batch and the schedule's length are solved
 * there, once) and leaves it unchanged; what it fills borrows the config's
 * strings, so the config must outlive it. Errors are TR_ECONFIG (or the
 * device's) with a message naming the key, in err. */
#ifndef TRAINRUN_LAUNCHER_COMPOSE_H
#define TRAINRUN_LAUNCHER_COMPOSE_H

#include "trainrun/config.h"
#include "trainrun/ddp.h"
#include "trainrun/dtensor.h"
#include "trainrun/errmsg.h"
#include "trainrun/fsdp2.h"
#include "trainrun/model.h"
#include "trainrun/pg.h"
#include "trainrun/trainer.h"

/* The model a run of cfg builds: the [model] flavor with vocab_size kept
 * (256 for the byte-level debug models) and, for llama3 (which has no
 * position table), max_seq_len set to the longest of training and
 * validation seq_len -- the context the exported model records and
 * `trainrun sample` slides within. TR_ECONFIG when the flavor is unknown or
 * seq_len exceeds a GPT-2's positions. */
int tr_compose_model_config(const tr_config_t* cfg, tr_model_config_t* out,
                            tr_errmsg_t* err);

/* The trainer's settings for a run of cfg: the model above, every key the
 * trainer acts on, and the device: [training] device for local rank
 * local_rank (tr_config_device) and, on CUDA, the compute dtype from
 * [training] mixed_precision_param; local_rank < 0: the CPU in float32
 * whatever the config says (tools that evaluate on the CPU). */
int tr_compose_trainer(const tr_config_t* cfg, int local_rank,
                       tr_trainer_settings_t* s, tr_errmsg_t* err);

/* The [parallelism] degrees as cfg resolved them (data_parallel_shard_degree
 * is never -1 here), size-1 dims kept and flattened dims added
 * (tr_mesh_degrees_init's defaults). */
void tr_compose_mesh_degrees(const tr_config_t* cfg, tr_mesh_degrees_t* d);

/* FSDP's options for local rank local_rank (no groups yet):
 * reshard_after_forward and prefetch_depth from [parallelism]
 * fsdp_reshard_after_forward and fsdp_prefetch_depth, reduce_dtype from
 * [training] mixed_precision_reduce, param_dtype from mixed_precision_param
 * when the rank computes on CUDA (float32 on the CPU), divide factor 1 (the
 * trainer scales the loss by the global batch), the [comm] train timeout,
 * comm_timing from [metrics] comm_overlap. */
int tr_compose_fsdp_opts(const tr_config_t* cfg, int local_rank,
                         tr_fsdp_opts_t* o, tr_errmsg_t* err);

/* The mesh of a worker of a job over world: cfg's resolved degrees in
 * torchtitan's order [pp, dp_replicate, dp_shard, cp, tp], without
 * size-1 dims, and with dp_shard and cp both above 1 their flattened dim
 * "dp_shard_cp" (FSDP's group) (*out, the caller's: tr_mesh_free after
 * the layers built on it). Collective over world. */
int tr_compose_mesh(const tr_config_t* cfg, tr_pg_t* world, tr_mesh_t** out,
                    tr_errmsg_t* err);

/* FSDP (HSDP when data_parallel_replicate_degree > 1) over mesh (LOCAL_RANK
 * picks its device): its dp_shard and dp_replicate groups -- under context
 * parallelism dp_shard x cp (dp_shard_cp, or cp alone), as torchtitan
 * shards over dp_shard_cp whenever cp > 1 -- the placements on mesh's
 * shape with dp_shard and cp as one dim "dp_shard" (so composed onto a TP
 * plan on the same shape), the options above. TR_ECONFIG (message in err)
 * for bad values or no rank to shard over; *out is NULL then. */
int tr_compose_fsdp(const tr_config_t* cfg, const tr_mesh_t* mesh,
                    tr_fsdp_t** out, tr_errmsg_t* err);

/* Tensor parallelism over mesh's dim "tp": its group and the mesh's shape
 * (dp_shard and cp merged as for FSDP),
 * loss parallel unless [parallelism] disable_loss_parallel. Returns 1 and
 * fills *out when the dim has more than one rank, else 0 and *out zeroed. */
int tr_compose_tp(const tr_config_t* cfg, const tr_mesh_t* mesh,
                  tr_trainer_tp_t* out);

/* Context parallelism over mesh's dim "cp": its group and [parallelism]
 * context_parallel_rotate_method. Returns 1 and fills *out when the dim
 * has more than one rank, else 0 and *out zeroed; TR_ECONFIG for an
 * unknown method. */
int tr_compose_cp(const tr_config_t* cfg, const tr_mesh_t* mesh, tr_cp_t* out);

/* The pipeline's settings for a run of cfg and model mc: the schedule
 * kind, the split keys, the CSV, the micro-batch count (gradient
 * accumulation steps x local_batch_size / pipeline_parallel_microbatch_
 * size). TR_ECONFIG for a schedule name the generators do not know. */
int tr_compose_pp_build(const tr_config_t* cfg, const tr_model_config_t* mc,
                        tr_pp_build_opts_t* o);

/* Pipeline parallelism over mesh's dim "pp": its group and the settings
 * above. Returns 1 and fills *out when the dim has
 * more than one rank, else 0 (*out zeroed); a negative error. */
int tr_compose_pp(const tr_config_t* cfg, const tr_mesh_t* mesh,
                  tr_trainer_pp_t* out);

/* DDP's options over pg (tr_ddp_opts_init's defaults, then): the [comm]
 * train timeout and comm_timing from [metrics] comm_overlap. */
void tr_compose_ddp_opts(const tr_config_t* cfg, tr_pg_t* pg, tr_ddp_opts_t* o);

#endif /* TRAINRUN_LAUNCHER_COMPOSE_H */
