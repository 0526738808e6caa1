/* launcher/cmd_plan.c: `trainrun plan`, which shows what a job would lay
 * out for a world size without running it: the device mesh of its
 * [parallelism] degrees, the data-parallel mode (DDP, FSDP, HSDP), the
 * FSDP groups, the tensor-parallel plan (which parameter is split how),
 * and the memory per rank for parameters, gradients, optimizer state and
 * the largest unsharded group (trainrun/fsdp2.h, trainrun/dtensor.h). */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/commands.h"
#include "launcher/compose.h" /* the model config of a job */
#include "trainrun/config.h"
#include "trainrun/dtensor.h" /* the tensor-parallel plan */
#include "trainrun/error.h"
#include "trainrun/fsdp2.h" /* shard arithmetic and the memory plan */
#include "trainrun/model.h"       /* the parameter table */
#include "trainrun/pipelining.h"  /* the pipeline's stages and schedule */

static void plan_usage(FILE* out) {
  fprintf(out,
          "usage: trainrun plan JOB.toml [--section.key value ...] "
          "[--world-size N | --nnodes N --nproc-per-node M]\n"
          "       [--schedule-csv FILE]\n"
          "\n"
          "Print the device mesh the job's [parallelism] degrees make for a "
          "world of N\n"
          "ranks (default 1), the data-parallel mode, the FSDP groups and "
          "the memory\n"
          "each rank holds for parameters, gradients, optimizer state and "
          "the largest\n"
          "unsharded group; with pipeline parallelism the stages, each "
          "rank's actions\n"
          "and the simulated bubble (--schedule-csv FILE writes the schedule "
          "as PyTorch's\n"
          "CSV). Nothing runs.\n");
}

static int parse_pos(const char* text, long long* out) {
  char* end;
  errno = 0;
  long long v = text ? strtoll(text, &end, 10) : 0;
  if (!text || errno || end == text || *end || v < 1) return -1;
  *out = v;
  return 0;
}

/* "1.50 GiB" */
static const char* human(int64_t b, char* buf, size_t n) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, n, "%" PRId64 " B", b);
  else
    snprintf(buf, n, "%.2f %s", v, units[u]);
  return buf;
}

static void row(FILE* out, const char* what, int64_t bytes) {
  char h[32];
  fprintf(out, "  %-34s %16" PRId64 "  %12s\n", what, bytes,
          human(bytes, h, sizeof h));
}

static void print_mesh(FILE* out, const tr_config_t* cfg, int64_t world) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  int64_t pp = p->pipeline_parallel_degree,
          rep = p->data_parallel_replicate_degree,
          shard = p->data_parallel_shard_degree,
          cp = p->context_parallel_degree, tp = p->tensor_parallel_degree;
  fprintf(out,
          "mesh: pp %" PRId64 " x dp_replicate %" PRId64 " x dp_shard %" PRId64
          " x cp %" PRId64 " x tp %" PRId64 " = %" PRId64 " rank%s\n",
          pp, rep, shard, cp, tp, world, world == 1 ? "" : "s");
  /* the data-parallel grid, row-major: dp_shard varies fastest after
   * cp x tp */
  int64_t inner = cp * tp;
  if (world > 64) {
    fprintf(out, "  (%" PRId64 " ranks: grid not shown)\n", world);
    return;
  }
  for (int64_t a = 0; a < pp; a++)
    for (int64_t r = 0; r < rep; r++) {
      fprintf(out, "  ");
      if (pp > 1) fprintf(out, "pp %" PRId64 " ", a);
      fprintf(out, "dp_replicate %" PRId64 ": dp_shard ranks", r);
      for (int64_t s = 0; s < shard; s++) {
        int64_t base = ((a * rep + r) * shard + s) * inner;
        if (inner == 1)
          fprintf(out, " %" PRId64, base);
        else
          fprintf(out, " %" PRId64 "-%" PRId64, base, base + inner - 1);
      }
      fprintf(out, "\n");
    }
}

/* The block range's content: "embedding, layers 0-2", "layers 3-5, head". */
static void blocks_str(const tr_model_t* m, tr_pp_range_t r, char* buf,
                       size_t n) {
  int L = m->cfg.n_layers, lo = r.first < 1 ? 1 : r.first,
      hi = r.last > L + 1 ? L + 1 : r.last; /* layer blocks 1..L */
  snprintf(buf, n, "%s", r.first == 0 ? "embedding" : "");
  size_t w = strlen(buf);
  if (hi > lo)
    snprintf(buf + w, n - w, "%slayer%s %d%s%.0d", w ? ", " : "",
             hi - lo > 1 ? "s" : "", lo - 1, hi - lo > 1 ? "-" : "",
             hi - lo > 1 ? hi - 2 : 0);
  w = strlen(buf);
  if (r.last == L + 2) snprintf(buf + w, n - w, "%shead", w ? ", " : "");
}

/* FLOPs a token of the training step costs in blocks r (forward and
 * backward: 6 per matrix element, the attention's 12 H D T a layer, as
 * tr_model_flops_per_token counts): the embedding block's tables are
 * lookups; a table tied to the output counts in the head. */
static double range_flops(const tr_model_t* m, tr_pp_range_t r, int64_t T) {
  double f = 0;
  int L = m->cfg.n_layers;
  for (int b = r.first; b < r.last; b++) {
    if (b == 0) continue;
    for (int i = 0; i < m->n_params; i++) {
      const tr_param_t* p = &m->params[i];
      if (p->ndim != 2 || !tr_model_param_in_blocks(m, i, b, b + 1)) continue;
      f += 6.0 * (double)p->shape[0] * (double)p->shape[1];
    }
    if (b <= L) f += 12.0 * m->cfg.n_heads * m->cfg.head_dim * (double)T;
  }
  return f;
}

/* The schedule simulated with each stage's FLOPs as its cost (F one part,
 * B two, I and W one each: a matrix's forward, input gradient and weight
 * gradient cost the same), and the bubble and idle time per rank that
 * gives. */
static void print_flops_sim(const tr_pp_build_t* b, const double* stage,
                            FILE* out) {
  const tr_pp_split_t* sp = &b->split;
  double* cost = calloc((size_t)sp->n_stages * 4, sizeof *cost);
  double* busy = calloc((size_t)b->compute.n_ranks, sizeof *busy);
  double span = 0;
  char msg[256];
  if (cost && busy) {
    for (int s = 0; s < sp->n_stages; s++) {
      double f = stage[s] / 3; /* a forward's share of 6 per element */
      cost[4 * s + 0] = f;
      cost[4 * s + 1] = 2 * f;
      cost[4 * s + 2] = f;
      cost[4 * s + 3] = f;
    }
    if (tr_pp_simulate_costs(&b->compute, sp->n_stages, cost, &span, busy, msg,
                             sizeof msg) == 0 &&
        span > 0) {
      double all = 0;
      for (int r = 0; r < b->compute.n_ranks; r++) all += busy[r];
      fprintf(out,
              "  simulated with each stage's FLOPs as its cost (B twice F, I "
              "and W each F): bubble %.1f%%; idle per rank:",
              100.0 * (1 - all / (span * b->compute.n_ranks)));
      for (int r = 0; r < b->compute.n_ranks; r++)
        fprintf(out, " %d: %.1f%%", r, 100.0 * (1 - busy[r] / span));
      fprintf(out, "\n");
    }
  }
  free(cost);
  free(busy);
}

/* Pipeline parallelism: the stages, each rank's compute actions (the
 * first 24), the simulated bubble and in-flight micro-batches; the
 * schedule as PyTorch's compute_only CSV into csv_path when given. */
/* Activations under pipeline parallelism: in, a micro-batch's rows on
 * this rank, the tp degree and the compute dtype's size; out, the most a
 * pipeline rank holds at once: over its stages, each stage's micro-batch
 * (tr_model_activation_bytes of its blocks) times its peak in-flight
 * micro-batches in the lock-step simulation. */
typedef struct {
  int64_t rows;
  int tp, size;
  int64_t peak;
  int peak_rank;
} pp_act_t;

static int print_pp(const tr_config_t* cfg, const tr_model_t* m,
                    const char* csv_path, FILE* out, int64_t* most,
                    pp_act_t* act, tr_errmsg_t* err) {
  tr_pp_build_opts_t o;
  if (tr_compose_pp_build(cfg, &m->cfg, &o) < 0)
    return tr_errmsg_set(err, TR_ECONFIG, "unknown pipeline schedule");
  tr_pp_build_t b;
  char msg[sizeof err->message];
  int rc = tr_pp_build_init(&b, &o, msg, sizeof msg);
  if (rc < 0) return tr_errmsg_set(err, rc, "%s", msg);
  const tr_pp_split_t* sp = &b.split;
  fprintf(out,
          "pipeline parallel: %d ranks, schedule %s, %d stage%s (%d a rank, "
          "%s placement), %" PRId64 " micro-batches of %lld sequences a step\n",
          sp->pp, tr_pp_kind_name(o.kind), sp->n_stages,
          sp->n_stages == 1 ? "" : "s", sp->v,
          sp->placement == TR_PP_PLACE_V ? "V" : "loop", b.n_micro,
          (long long)cfg->parallelism.pipeline_parallel_microbatch_size);
  double* flops = calloc((size_t)sp->n_stages, sizeof *flops);
  if (!flops) {
    tr_pp_build_release(&b);
    return TR_ENOMEM;
  }
  double total = 0;
  for (int s = 0; s < sp->n_stages; s++)
    total += flops[s] = range_flops(m, sp->blocks[s], cfg->training.seq_len);
  for (int s = 0; s < sp->n_stages; s++) {
    char what[96];
    blocks_str(m, sp->blocks[s], what, sizeof what);
    fprintf(out,
            "  stage %d on pp rank %d: blocks [%d, %d) (%s): %.3g GFLOP a "
            "token, %.1f%%\n",
            s, sp->stage_rank[s], sp->blocks[s].first, sp->blocks[s].last, what,
            flops[s] / 1e9, total > 0 ? 100.0 * flops[s] / total : 0.0);
  }
  /* the parameter elements of each rank's stages (a tied table on both
   * end stages' ranks; tp pieces as the plan cut them) */
  *most = 0;
  for (int r = 0; r < sp->pp; r++) {
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) {
      int held = 0;
      for (int s = 0; s < sp->n_stages && !held; s++)
        held = sp->stage_rank[s] == r &&
               tr_model_param_in_blocks(m, i, sp->blocks[s].first,
                                        sp->blocks[s].last);
      if (!held) continue;
      int64_t k = 1;
      for (int d = 0; d < m->params[i].ndim; d++)
        k *= m->params[i].layout.shape[d];
      n += k;
    }
    if (n > *most) *most = n;
  }
  fprintf(out, "  actions a rank (compute only; PyTorch's text form):\n");
  for (int r = 0; r < b.compute.n_ranks; r++) {
    fprintf(out, "    rank %d:", r);
    int64_t shown = 0;
    for (int64_t k = 0; k < b.compute.len[r] && shown < 24; k++) {
      char a[TR_PP_ACTION_STRLEN];
      if (b.compute.acts[r][k].type == TR_PP_NONE) continue;
      fprintf(out, " %s", tr_pp_action_str(&b.compute.acts[r][k], a, sizeof a));
      shown++;
    }
    int64_t n = 0;
    for (int64_t k = 0; k < b.compute.len[r]; k++)
      n += b.compute.acts[r][k].type != TR_PP_NONE;
    if (n > shown) fprintf(out, " ... (%" PRId64 " in all)", n);
    fprintf(out, "\n");
  }
  tr_pp_sim_t sim;
  rc = tr_pp_simulate(&b.compute, sp->n_stages, &sim, NULL, msg, sizeof msg);
  if (rc == 0) {
    fprintf(out,
            "  simulated in lock step (each action one time step): %" PRId64
            " steps, bubble %.1f%%; peak in-flight micro-batches per stage:",
            sim.steps, 100.0 * sim.bubble);
    for (int s = 0; s < sim.n_stages; s++)
      fprintf(out, " %" PRId64, sim.peak_inflight[s]);
    fprintf(out, "\n");
    act->peak = 0;
    for (int r = 0; r < sp->pp; r++) {
      int64_t held = 0;
      for (int s = 0; s < sp->n_stages; s++)
        if (sp->stage_rank[s] == r)
          held += sim.peak_inflight[s] *
                  tr_model_activation_bytes(&m->cfg, sp->blocks[s].first,
                                            sp->blocks[s].last, act->rows,
                                            act->tp, act->size);
      if (held > act->peak) {
        act->peak = held;
        act->peak_rank = r;
      }
    }
    tr_pp_sim_release(&sim);
    print_flops_sim(&b, flops, out);
  }
  free(flops);
  if (rc == 0 && csv_path) {
    rc = tr_pp_csv_save(&b.compute, csv_path);
    if (rc < 0)
      tr_errmsg_set(err, rc, "--schedule-csv: cannot write '%s': %s", csv_path,
                    tr_strerror(rc));
    else
      fprintf(out, "  wrote the schedule to %s (PyTorch's compute_only CSV)\n",
              csv_path);
  } else if (rc < 0) {
    tr_errmsg_set(err, rc, "%s", msg);
  }
  tr_pp_build_release(&b);
  return rc;
}

/* FSDP over a piece in parts (GPT-2's c_attn under TP): the first such
 * parameter's global rows that tp rank 0 holds at each dp_shard
 * coordinate, as dp_shard composes onto the tp placement (cutting the
 * q|k|v piece in its row order, PyTorch's _StridedShard), e.g.
 *   transformer.h.0.attn.c_attn.weight: dp_shard 0 rows 0-63 128-159;
 *   dp_shard 1 rows 160-191 256-319 */
static int print_strided_fsdp(const tr_model_t* m, int shard, FILE* out) {
  for (int i = 0; i < m->n_params; i++) {
    const tr_param_t* p = &m->params[i];
    if (p->layout.parts <= 1) continue;
    tr_param_placement_t pl;
    TR_CHECK(tr_param_placement_compose(tr_dtensor_param_placement(p), NULL,
                                        "dp_shard", 0, p->ndim, &pl));
    fprintf(out,
            "fsdp over tensor parallel: dp_shard cuts each tp piece on dim 0 "
            "after tp (Shard(0) cutting last, PyTorch's _StridedShard); "
            "%s's piece of %d parts of %" PRId64
            " rows, tp rank 0's global "
            "rows:",
            p->name, p->layout.parts, p->layout.part_rows);
    for (int c = 0; c < shard; c++) {
      tr_param_layout_t l;
      tr_param_run_t runs[TR_PARAM_MAX_RUNS];
      TR_CHECK(tr_param_placement_layout(&pl, p->ndim, p->shape, "dp_shard", c,
                                         0, &l));
      int n = tr_param_layout_runs(&l, p->shape[0], runs);
      TR_CHECK(n);
      fprintf(out, "%s dp_shard %d rows", c ? ";" : "", c);
      for (int j = 0; j < n; j++)
        if (runs[j].rows > 0)
          fprintf(out, " %" PRId64 "-%" PRId64, runs[j].global,
                  runs[j].global + runs[j].rows - 1);
    }
    fprintf(out, "\n");
    return 0;
  }
  return 0;
}

static int plan_print(const tr_config_t* cfg, const char* csv_path, FILE* out,
                      tr_errmsg_t* err) {
  const typeof(cfg->parallelism)* p = &cfg->parallelism;
  int64_t world = cfg->derived.world_size;
  int rep = (int)p->data_parallel_replicate_degree;
  int cp = (int)p->context_parallel_degree;
  /* FSDP shards over dp_shard x cp under context parallelism */
  int shard = (int)p->data_parallel_shard_degree * cp;
  tr_model_config_t mc;
  TR_CHECK(tr_compose_model_config(cfg, &mc, err));
  tr_model_t m;
  int rc = tr_model_init(&m, &mc);
  if (rc < 0) {
    char why[256] = "";
    tr_model_config_check(&mc, why, sizeof why);
    return tr_errmsg_set(err, rc, "cannot build the model: %s",
                         why[0] ? why : tr_strerror(rc));
  }
  tr_dtype_t master = TR_F32, param = TR_F32;
  int cuda =
      strcmp(cfg->training.device, "cuda") == 0 ||
      (strcmp(cfg->training.device, "auto") == 0 && tr_cuda_device_count() > 0);
  if (cuda && shard > 1 &&
      tr_dtype_parse(cfg->training.mixed_precision_param, &param) < 0)
    param = TR_F32;
  int tp = (int)p->tensor_parallel_degree;
  if (tp > 1) { /* rank 0's pieces on the job's mesh */
    static const char* const names[3] = {"dp_replicate", "dp_shard", "tp"};
    int sizes[3] = {rep, shard, tp}, coords[3] = {0, 0, 0};
    tr_mesh_shape_t s;
    rc = tr_mesh_shape_init(&s, 3, names, sizes, coords);
    if (rc == 0) rc = tr_tp_plan_apply(&m, &s, err);
    if (rc < 0) {
      tr_model_release(&m);
      return rc;
    }
  }
  tr_fsdp_plan_t pl;
  rc = tr_fsdp_plan(&m, rep, shard, master, param, &pl);
  if (rc < 0) {
    tr_model_release(&m);
    return tr_errmsg_set(err, rc, "cannot plan: %s", tr_strerror(rc));
  }
  fprintf(out, "job '%s': %s %s, %" PRId64 " parameters\n",
          cfg->job.description, cfg->model.name, cfg->model.flavor,
          tr_model_num_params(&m));
  print_mesh(out, cfg, world);
  const char* mode = shard > 1 ? (rep > 1 ? "HSDP" : "FSDP")
                     : rep > 1 ? "DDP"
                               : "one replica";
  int piped = p->pipeline_parallel_degree > 1;
  fprintf(out, "data parallel: %s", mode);
  if (shard > 1 && piped)
    fprintf(out,
            " (each parameter sharded on dim 0 over %d ranks%s; under "
            "pipeline parallelism a stage's groups are %s, their "
            "gradients reduce-scattered once after its last backward; "
            "all-gather %s, reduce-scatter %s)",
            shard, rep > 1 ? ", gradients all-reduced across replicas" : "",
            strcmp(p->fsdp_reshard_after_forward, "always") == 0
                ? "freed after each forward and gathered again in the "
                  "backward (reshard_after_forward always)"
                : "gathered once a step and held through its micro-batches",
            tr_dtype_name(param), cfg->training.mixed_precision_reduce);
  else if (shard > 1)
    fprintf(out,
            " (each parameter sharded on dim 0 over %d ranks%s; "
            "reshard_after_forward %s; all-gather %s, reduce-scatter %s)",
            shard, rep > 1 ? ", gradients all-reduced across replicas" : "",
            p->fsdp_reshard_after_forward, tr_dtype_name(param),
            cfg->training.mixed_precision_reduce);
  else if (rep > 1)
    fprintf(out, " (gradients all-reduced over %d ranks%s)", rep,
            piped ? " once a step, after the pipeline's schedule" : "");
  fprintf(out, "\n");
  if (shard > 1)
    fprintf(out,
            "fsdp groups: %d layers + root (embedding, final norm, "
            "output)\n",
            mc.n_layers);
  if (cp > 1)
    fprintf(out,
            "context parallel: %d ranks (rotate method %s, load balancer "
            "%s); each sequence of %lld tokens cut into %d chunks of %lld, "
            "rank r keeps chunks r and %d-r (%lld tokens), the key/value "
            "chunks of every layer %s; FSDP shards over dp_shard x cp = %d "
            "ranks\n",
            cp, p->context_parallel_rotate_method,
            p->context_parallel_load_balancer, (long long)cfg->training.seq_len,
            2 * cp, (long long)(cfg->training.seq_len / (2 * cp)), 2 * cp - 1,
            (long long)(cfg->training.seq_len / cp),
            strcmp(p->context_parallel_rotate_method, "alltoall") == 0
                ? "rotating around the ring (send/recv)"
                : "all-gathered (dK, dV reduce-scattered back)",
            shard);
  if (tp > 1) {
    fprintf(out,
            "tensor parallel: %d ranks (the innermost mesh dim); heads %d "
            "and KV heads %d split to %d and %d a rank; sequence parallel "
            "(two all-gathers and two reduce-scatters per layer forward, "
            "the mirrors and the norms' gradient sums backward%s), loss "
            "parallel %s; rank 0's pieces:\n",
            tp, mc.n_heads, mc.n_kv_heads, mc.n_heads / tp, mc.n_kv_heads / tp,
            p->enable_async_tensor_parallel
                ? "; async: the layers' all-gathers and reduce-scatters cut "
                  "into tp chunks passed around a ring of send/recv while "
                  "the chunks' GEMMs run"
                : "",
            p->disable_loss_parallel ? "off (the logits gathered)" : "on");
    rc = tr_tp_plan_describe(&m, out);
    if (rc == 0 && shard > 1) rc = print_strided_fsdp(&m, shard, out);
    if (rc < 0) {
      tr_model_release(&m);
      return tr_errmsg_set(err, rc, "cannot print the plan: %s",
                           tr_strerror(rc));
    }
  }
  /* activations: the compute dtype's elements over this rank's rows (its
   * chunks under cp) of a micro-batch */
  tr_dtype_t act_dtype = TR_F32;
  if (cuda &&
      tr_dtype_parse(cfg->training.mixed_precision_param, &act_dtype) < 0)
    act_dtype = TR_F32;
  int64_t mbs = p->pipeline_parallel_degree > 1
                    ? p->pipeline_parallel_microbatch_size
                    : cfg->training.local_batch_size;
  pp_act_t act = {.rows = mbs * cfg->training.seq_len / cp,
                  .tp = tp,
                  .size = (int)tr_dtype_size(act_dtype)};
  int64_t pp_most = 0;
  if (p->pipeline_parallel_degree > 1) {
    rc = print_pp(cfg, &m, csv_path, out, &pp_most, &act, err);
    if (rc < 0) {
      tr_model_release(&m);
      return rc;
    }
    /* the pipeline rank holding the most stages, its elements sharded
     * over dp_shard (padding aside); under FSDP its stages' parameters
     * (param_dtype) and fp32 gradients are held unsharded for the step */
    int64_t sharded = (pp_most + shard - 1) / shard;
    pl.param_bytes = pl.grad_bytes = sharded * (int64_t)tr_dtype_size(master);
    pl.optim_bytes = 2 * pl.param_bytes;
    pl.group_bytes = pp_most * (int64_t)(tr_dtype_size(param) + 4);
  }
  fprintf(out, "memory per rank (%s):\n",
          pp_most ? "the pipeline rank holding the most parameters"
                  : "rank 0 holds the largest shards");
  fprintf(out, "  %-34s %16s  %12s\n", "", "bytes", "");
  row(out, "parameters", pl.param_bytes);
  row(out, "gradients", pl.grad_bytes);
  row(out, "optimizer state (AdamW m, v)", pl.optim_bytes);
  char what[96];
  if (shard > 1) {
    if (pp_most)
      snprintf(what, sizeof what, "held unsharded a step (stages)");
    else
      snprintf(what, sizeof what, "largest unsharded group (%s)",
               pl.group_name);
    row(out, what, pl.group_bytes);
  }
  int64_t total = pl.param_bytes + pl.grad_bytes + pl.optim_bytes +
                  (shard > 1 ? pl.group_bytes : 0);
  row(out, "total (before activations)", total);
  if (shard > 1) row(out, "unsharded, for comparison", pl.unsharded_bytes);
  if (p->pipeline_parallel_degree > 1) {
    snprintf(what, sizeof what,
             "activations, the schedule's peak (pp rank %d)", act.peak_rank);
    row(out, what, act.peak);
  } else {
    snprintf(what, sizeof what, "activations, a micro-batch (%lld tokens)",
             (long long)act.rows);
    row(out, what,
        tr_model_activation_bytes(&mc, 0, mc.n_layers + 2, act.rows, tp,
                                  act.size));
  }
  tr_model_release(&m);
  return 0;
}

int tr_cmd_plan(int argc, char** argv) {
  const char* path = NULL, *csv_path = NULL;
  long long world = 0, nnodes = 1, nproc = 1;
  int rc;
  char** overrides = calloc((size_t)argc + 1, sizeof *overrides);
  int n = 0;
  if (!overrides) {
    fprintf(stderr, "trainrun: %s\n", tr_strerror(TR_ENOMEM));
    return 1;
  }
  for (int i = 1; i < argc;) {
    const char* a = argv[i];
    int span = tr_config_arg_span(argc, argv, i);
    if (span > 0) {
      for (int j = 0; j < span; j++) overrides[n++] = argv[i + j];
      i += span;
      continue;
    }
    static const char* const sizes[] = {"--world-size", "--nnodes",
                                        "--nproc-per-node"};
    int which = -1;
    size_t len = 0;
    for (int k = 0; k < 3; k++) {
      len = strlen(sizes[k]);
      if (strncmp(a, sizes[k], len) == 0 && (a[len] == 0 || a[len] == '=')) {
        which = k;
        break;
      }
    }
    if (strncmp(a, "--schedule-csv", 14) == 0 && (a[14] == 0 || a[14] == '=')) {
      csv_path = a[14] == '=' ? a + 15 : i + 1 < argc ? argv[++i] : NULL;
      if (!csv_path || !csv_path[0]) {
        fprintf(stderr, "trainrun: --schedule-csv: expected a file name\n");
        rc = 2;
        goto out;
      }
      i++;
      continue;
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      plan_usage(stdout);
      rc = 0;
      goto out;
    } else if (which >= 0) {
      const char* v = a[len] == '='  ? a + len + 1
                      : i + 1 < argc ? argv[++i]
                                     : NULL;
      long long* dst = which == 0 ? &world : which == 1 ? &nnodes : &nproc;
      if (parse_pos(v, dst) < 0) {
        fprintf(stderr, "trainrun: %s: expected a positive integer, got '%s'\n",
                sizes[which], v ? v : "");
        rc = 2;
        goto out;
      }
    } else if (a[0] == '-' && a[1]) {
      fprintf(stderr, "trainrun: plan: unknown flag '%s'\n", a);
      plan_usage(stderr);
      rc = 2;
      goto out;
    } else if (path) {
      fprintf(stderr, "trainrun: plan: more than one job file ('%s', '%s')\n",
              path, a);
      rc = 2;
      goto out;
    } else {
      path = a;
    }
    i++;
  }
  if (world == 0) world = nnodes * nproc;
  tr_config_t cfg;
  tr_errmsg_t err;
  if (tr_config_load(&cfg, path, n, overrides, &err) < 0 ||
      tr__job_check(&cfg, world, &err) < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    rc = 2;
  } else {
    tr_errmsg_t perr;
    int prc = plan_print(&cfg, csv_path, stdout, &perr);
    if (prc < 0) {
      fprintf(stderr, "trainrun: %s\n", perr.message);
      rc = tr__cmd_exit_code(prc);
    } else {
      rc = fflush(stdout) == 0 ? 0 : 1;
    }
  }
  tr_config_release(&cfg);
out:
  free(overrides);
  return rc;
}
