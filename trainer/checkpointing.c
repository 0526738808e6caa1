/* trainer/checkpointing.c: the trainer's [checkpoint] — what a checkpoint
 * of a run holds (model, AdamW moments, train state), when it is saved
 * (interval, first step, last step — as Hugging Face safetensors too with
 * last_save_in_hf —, on a stop signal), resuming from the
 * latest complete step at start, and loading any step folder
 * (trainrun/trainer.h; the format is trainrun/checkpoint.h). */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h> /* the train state */

#include "core/clock.h" /* tr__now */
#include "trainrun/checkpoint.h"
#include "trainrun/error.h"
#include "trainrun/heartbeat.h"
#include "trainrun/kernels.h" /* zeroing the AdamW moments */
#include "trainrun/log.h"
#include "trainrun/metrics.h"     /* stall and write times */
#include "trainrun/safetensors.h" /* model config JSON; last_save_in_hf */
#include "trainer/internal.h"     /* the step's device and checkpoint parts */
#include "trainrun/trainer.h"

/* A save's true cost to training (its stall): the time of the step it
 * follows and of the next TR__STALL_STEPS - 1 steps (each step's own time
 * plus the checkpoint work after it), less that many times the median of
 * the last TR__BASE_STEPS steps that had no save in flight. The window
 * holds the step after the next one because on a GPU the host returns from
 * a step before its optimizer update has run: an update that waited for
 * the device-to-host copies shows in the step after it. */
#define TR__STALL_STEPS 3
#define TR__BASE_STEPS 8

struct tr_trainer_ckpt {
  tr_ckpt_saver_t* saver;
  char* folder; /* <dump_folder>/<checkpoint.folder> */
  FILE* con;
  tr_metrics_logger_t* ml;
  int64_t saved_step; /* last step saved (or loaded); -1: none */
  /* steps without a save in flight (a ring) */
  double base[TR__BASE_STEPS];
  int nbase, base_pos;
  /* the save being measured: its window's steps so far and their time */
  int64_t win_step; /* -1: none */
  int win_n;
  double win_s;
  double blocked_s;     /* the last save: what the saver held the thread */
  double win_blocked_s; /* win_step's (its stall when no step measures it:
                         * the seed checkpoint, tr_trainer_checkpoint_now) */
  /* reported once both the stall and the commit of win_step are known */
  int stall_known, commit_known;
  double stall_s;
  tr_ckpt_stats_t commit;
};

/* ---- what a checkpoint holds ---- */

/* Names: "model.<HF name>", "optimizer.state.<HF name>.exp_avg",
 * "optimizer.state.<HF name>.exp_avg_sq" (torchtitan's flattened keys). */
static char* item_name(const tr_param_t* p, int which) {
  static const char* const suffix[3] = {"", ".exp_avg", ".exp_avg_sq"};
  size_t n = strlen(p->name) + 40;
  char* s = malloc(n);
  if (s)
    snprintf(s, n, "%s%s%s", which == 0 ? "model." : "optimizer.state.",
             p->name, suffix[which]);
  return s;
}

/* The checkpoint items of a save or load: one chunk per run of rows of a
 * parameter's layout (tr_param_layout_runs), each a box of the global
 * tensor and a view of the rank's tensor: one for most, P for a
 * tensor-parallel piece cut in P parts (GPT-2's c_attn), up to P for an
 * FSDP shard of such a piece (its rows may straddle q|k or k|v). Names and
 * views are the list's. */
typedef struct {
  tr_ckpt_item_t* items;
  tr_tensor_t* views;
  size_t n, cap;
} items_t;

static void items_release(items_t* l) {
  for (size_t i = 0; i < l->n; i++) {
    free((char*)l->items[i].name);
    tr_tensor_release(&l->views[i]);
  }
  free(l->items);
  free(l->views);
  memset(l, 0, sizeof *l);
}

/* Append the items of the parameters (which 0), or of the first (1) or
 * second (2) moments of every parameter. */
static int items_add(tr_trainer_t* t, int which, items_t* l) {
  tr_model_t* m = &t->model;
  size_t need = l->n;
  for (int i = 0; i < m->n_params; i++) need += TR_PARAM_MAX_RUNS;
  if (need > l->cap) {
    tr_ckpt_item_t* it = realloc(l->items, need * sizeof *it);
    if (it) l->items = it;
    tr_tensor_t* v = realloc(l->views, need * sizeof *v);
    if (v) l->views = v;
    if (!it || !v) return TR_ENOMEM;
    l->cap = need;
    for (size_t k = 0; k < l->n; k++) l->items[k].tensor = &l->views[k];
  }
  for (int i = 0; i < m->n_params; i++) {
    tr_param_t* p = &m->params[i];
    if (!p->data.storage) continue; /* another pipeline stage's */
    tr_tensor_t* src = which == 0   ? &p->data
                       : which == 1 ? &t->adam_m[i]
                                    : &t->adam_v[i];
    tr_param_run_t runs[TR_PARAM_MAX_RUNS];
    int nrun = tr_param_layout_runs(&p->layout, p->shape[0], runs);
    TR_CHECK(nrun);
    /* a rank holding the whole tensor in a world of several holds a
     * replica (DDP, a tp-replicated parameter); a sharded layout (FSDP,
     * TP) holds its own chunk. Under pipeline parallelism not every rank
     * holds it: each holder writes its copy (the metadata keeps one). */
    int whole = !t->pp.pg;
    for (int d = 0; d < p->ndim; d++)
      whole &= p->layout.offset[d] == 0 && p->layout.shape[d] == p->shape[d];
    for (int j = 0; j < nrun; j++) {
      tr_ckpt_item_t* it = &l->items[l->n];
      tr_tensor_t* v = &l->views[l->n];
      memset(it, 0, sizeof *it);
      memset(v, 0, sizeof *v);
      it->name = item_name(p, which);
      if (!it->name) return TR_ENOMEM;
      l->n++;
      it->ndim = p->ndim;
      memcpy(it->shape, p->shape, sizeof it->shape);
      memcpy(it->offset, p->layout.offset, sizeof it->offset);
      it->replicated = whole && t->world > 1;
      if (nrun == 1 && runs[0].rows == p->layout.shape[0]) {
        tr_tensor_view(v, src);
      } else { /* run j: its rows, at their global rows */
        TR_CHECK(tr_tensor_narrow(v, src, 0, runs[j].local, runs[j].rows));
      }
      it->offset[0] = runs[j].global;
      it->tensor = v;
    }
  }
  return 0;
}

static char* train_state_json(const tr_trainer_t* t) {
  tr_loader_state_t ls;
  tr_loader_get_state(&t->train, &ls);
  json_t* dl = json_pack("{sIsIsIsI}", "sample", (json_int_t)ls.sample, "seed",
                         (json_int_t)ls.seed, "seq_len", (json_int_t)ls.seq_len,
                         "ntokens", (json_int_t)ls.ntokens);
  json_t* lr =
      json_pack("{sIsfsfsIsIsIsI}", "step", (json_int_t)t->step, "last_lr",
                t->step > 0 ? tr_lr_schedule_lr(&t->lr, t->step) : 0.0, "lr",
                t->lr.lr, "total_steps", (json_int_t)t->lr.total_steps,
                "warmup_steps", (json_int_t)t->lr.warmup_steps, "stable_steps",
                (json_int_t)t->lr.stable_steps, "decay_steps",
                (json_int_t)t->lr.decay_steps);
  json_t* root = json_pack(
      "{sIsIsosos{sI}s{sIsIsI}}", "step", (json_int_t)t->step, "tokens_seen",
      (json_int_t)(t->step * t->G * t->T), "dataloader", dl, "lr_scheduler", lr,
      "rng", "seed", (json_int_t)t->seed, "batch", "global", (json_int_t)t->G,
      "local", (json_int_t)t->B, "dp", (json_int_t)t->dist.dp_size);
  if (root && t->tp.pg)
    json_object_set_new(json_object_get(root, "batch"), "tp",
                        json_integer(tr_pg_size(t->tp.pg)));
  if (root && t->cp.pg) /* the ranks each sample's chunks went to */
    json_object_set_new(json_object_get(root, "batch"), "cp",
                        json_integer(tr_pg_size(t->cp.pg)));
  /* the model config, so `trainrun ckpt export` can rebuild the model */
  char* mc = tr_model_config_to_json(&t->model.cfg);
  json_error_t je;
  json_t* mj = mc ? json_loads(mc, 0, &je) : NULL;
  free(mc);
  if (root && mj) json_object_set_new(root, "model", mj);
  char* s = root && mj ? json_dumps(root, JSON_COMPACT) : NULL;
  if (!root) json_decref(mj);
  json_decref(root);
  return s;
}

static int excluded(const tr_trainer_t* t, const char* part) {
  const tr_trainer_checkpoint_t* c = &t->settings.checkpoint;
  for (size_t i = 0; i < c->n_exclude_from_loading; i++)
    if (strcmp(c->exclude_from_loading[i], part) == 0) return 1;
  return 0;
}

/* ---- loading ---- */

static int load_items(tr_trainer_t* t, const tr_ckpt_t* ck, int which,
                      tr_errmsg_t* err) {
  items_t l = {0};
  int rc = items_add(t, which, &l);
  if (rc < 0)
    rc = tr_errmsg_set(err, rc, "checkpoint items: %s", tr_strerror(rc));
  else
    rc = tr_ckpt_load(ck, l.items, l.n, err);
  items_release(&l);
  return rc;
}

static int restore_state(tr_trainer_t* t, const tr_ckpt_t* ck,
                         tr_errmsg_t* err) {
  json_error_t je;
  json_t* st = json_loads(ck->train_state_json, 0, &je);
  if (!st)
    return tr_errmsg_set(err, TR_EFORMAT, "'%s': bad train_state", ck->dir);
  json_int_t step, seed, sample, sseed, seq_len, ntokens;
  int bad = json_unpack(st, "{sIs{sI}}", "step", &step, "rng", "seed", &seed);
  json_t* dl = json_object_get(st, "dataloader");
  int rc = 0;
  if (bad || step < 0) {
    rc = tr_errmsg_set(err, TR_EFORMAT, "'%s': train_state has no step",
                       ck->dir);
    goto out;
  }
  if (!excluded(t, "train_state")) t->step = step;
  if (dl && !excluded(t, "dataloader")) {
    if (json_unpack(dl, "{sIsIsIsI}", "sample", &sample, "seed", &sseed,
                    "seq_len", &seq_len, "ntokens", &ntokens) < 0) {
      rc =
          tr_errmsg_set(err, TR_EFORMAT, "'%s': bad dataloader state", ck->dir);
      goto out;
    }
    if ((uint64_t)sseed != t->seed) {
      /* the data order follows the seed the run started with */
      t->seed = (uint64_t)sseed;
      t->train.seed = (uint64_t)sseed;
    }
    tr_loader_state_t ls = {.sample = sample,
                            .seed = (uint64_t)sseed,
                            .seq_len = seq_len,
                            .ntokens = ntokens};
    rc = tr_loader_restore(&t->train, &ls, err);
  }
out:
  json_decref(st);
  return rc;
}

int tr_trainer_load_checkpoint(tr_trainer_t* t, const char* step_dir,
                               int model_only, tr_errmsg_t* err) {
  tr_ckpt_t* ck;
  TR_CHECK(tr_ckpt_open(&ck, step_dir, err));
  int rc = tr_ckpt_check_files(ck, err); /* a cut file: before any read */
  if (rc == 0 && !excluded(t, "model")) rc = load_items(t, ck, 0, err);
  int has_opt = 0;
  if (t->model.n_params > 0) {
    char* n = item_name(&t->model.params[0], 1);
    has_opt = n && tr_ckpt_find(ck, n) != NULL;
    free(n);
  }
  if (rc == 0 && !model_only) {
    if (has_opt && !excluded(t, "optimizer")) {
      rc = load_items(t, ck, 1, err);
      if (rc == 0) rc = load_items(t, ck, 2, err);
    } else if (!has_opt) {
      TR_LOG_WARN(TRAIN, "'%s' holds no optimizer state: AdamW starts fresh",
                  step_dir);
    }
    if (rc == 0) rc = restore_state(t, ck, err);
  }
  if (rc == 0) rc = tr_model_refresh_compute(&t->model); /* bf16 copies */
  if (rc < 0) tr_errmsg_prefix(err, rc, "cannot load checkpoint");
  tr_ckpt_close(ck);
  return rc;
}

/* ---- saving ---- */

static int sum_all(void* arg, double* vals, int n) {
  return tr__trainer_sum_all(arg, vals, n);
}

static int save(tr_trainer_t* t, int model_only, int sync, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  int parts = model_only ? 1 : 3;
  items_t l = {0};
  int rc = 0;
  for (int w = 0; w < parts && rc == 0; w++) rc = items_add(t, w, &l);
  char* state = rc == 0 ? train_state_json(t) : NULL;
  if (rc < 0 || !state) {
    free(state);
    items_release(&l);
    return tr_errmsg_set(err, rc < 0 ? rc : TR_ENOMEM, "checkpoint items: %s",
                         tr_strerror(rc < 0 ? rc : TR_ENOMEM));
  }
  tr_dtype_t dt = TR_F32;
  int convert = model_only &&
                tr_dtype_parse(t->settings.checkpoint.export_dtype, &dt) == 0 &&
                dt != TR_F32;
  /* the daemon allows a rank writing a checkpoint twice --worker-timeout */
  tr_heartbeat_phase("checkpoint");
  double t0 = tr__now();
  rc = tr_ckpt_save(c->saver, t->step, l.items, l.n, state,
                    convert ? &dt : NULL, err);
  if (rc == 0 && sync) rc = tr_ckpt_wait(c->saver, err);
  c->blocked_s = tr__now() - t0;
  tr_heartbeat_phase("step");
  free(state);
  items_release(&l);
  if (rc < 0) return rc;
  c->saved_step = t->step;
  if (c->con) {
    if (tr_ckpt_pending(c->saver))
      fprintf(c->con,
              "checkpoint step %" PRId64
              "%s: save started in %.3f s, writing in the background\n",
              t->step, model_only ? " (model only)" : "", c->blocked_s);
    else
      fprintf(c->con, "checkpoint step %" PRId64 "%s: saved in %.3f s\n",
              t->step, model_only ? " (model only)" : "", c->blocked_s);
    fflush(c->con);
  }
  return 0;
}

/* checkpoint.last_save_in_hf: the model-only step just committed, also
 * as a Hugging Face folder in the same step folder (torchtitan's layout:
 * model-00001-of-0000N.safetensors + model.safetensors.index.json; plus
 * config.json). As DCP's Hugging Face writer, every rank has written its
 * own chunks (the step's rank files) and the files are then consolidated:
 * each rank writes every world-th file, and after all did (a sum), rank 0
 * writes the index, so its presence means the export is whole. */
static int save_hf(tr_trainer_t* t, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  char dir[4096];
  tr_ckpt_step_dir(c->folder, t->step, dir, sizeof dir);
  tr_st_export_opts_t o = {.sharded_names = 1,
                           .part = TR_ST_EXPORT_FILES,
                           .rank = t->rank,
                           .world = t->world};
  tr_heartbeat_phase("checkpoint");
  tr_ckpt_t* ck = NULL;
  tr_errmsg_t lerr;
  tr_errmsg_clear(&lerr);
  int rc = tr_ckpt_open(&ck, dir, &lerr);
  if (rc == 0) rc = tr_st_export_checkpoint(ck, dir, &o, &lerr);
  for (int phase = 0; phase < 2; phase++) {
    double v[1] = {rc < 0 ? 1 : 0};
    int src = tr__trainer_sum_all(t, v, 1);
    if (rc < 0) {
      tr_errmsg_set(err, rc, "last_save_in_hf: %s", lerr.message);
      break;
    }
    if (src < 0 || v[0] > 0) {
      rc = src < 0 ? src : TR_EIO;
      tr_errmsg_set(err, rc, "last_save_in_hf: %s",
                    src < 0 ? tr_strerror(src)
                    : phase ? "rank 0 could not write the index"
                            : "a rank could not write its files");
      break;
    }
    if (phase == 1 || t->rank != 0) continue;
    o.part = TR_ST_EXPORT_INDEX;
    rc = tr_st_export_checkpoint(ck, dir, &o, &lerr);
  }
  tr_heartbeat_phase("step");
  tr_ckpt_close(ck);
  if (rc == 0 && c->con) {
    fprintf(c->con,
            "checkpoint step %" PRId64
            ": Hugging Face safetensors in '%s' (" TR_CKPT_HF_INDEX ")\n",
            t->step, dir);
    fflush(c->con);
  }
  return rc;
}

/* ---- the stall of a save, and its report ---- */

static double median(const double* v, int n) {
  double s[TR__BASE_STEPS];
  memcpy(s, v, (size_t)n * sizeof *s);
  for (int i = 1; i < n; i++) /* insertion sort: n <= 8 */
    for (int k = i; k > 0 && s[k - 1] > s[k]; k--) {
      double x = s[k];
      s[k] = s[k - 1];
      s[k - 1] = x;
    }
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

/* The record of win_step once its stall and commit are both known: the
 * metrics record (checkpoint_stall_s is the stall). */
static int report(tr_trainer_t* t, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (!c->stall_known || !c->commit_known) return 0;
  c->stall_known = c->commit_known = 0;
  return tr_metrics_log_ckpt(c->ml, c->commit.committed_step, c->stall_s,
                             c->commit.write_s, c->commit.bytes, err);
}

/* Close the window of the save being measured: its stall against the
 * steps without a save (none yet: after the next one, unless `now`). */
static int close_window(tr_trainer_t* t, int now, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (c->win_step < 0 || (c->nbase == 0 && !now)) return 0;
  if (c->win_n == 0 || c->nbase == 0) /* nothing to compare with */
    c->stall_s = c->win_blocked_s;
  else
    c->stall_s = c->win_s - c->win_n * median(c->base, c->nbase);
  if (c->stall_s < 0) c->stall_s = 0; /* noise */
  if (c->con) {
    char steps[64];
    if (c->win_n == 1)
      snprintf(steps, sizeof steps, "step %" PRId64, c->win_step);
    else
      snprintf(steps, sizeof steps, "steps %" PRId64 "-%" PRId64, c->win_step,
               c->win_step + c->win_n - 1);
    if (c->win_n > 0 && c->nbase > 0)
      fprintf(c->con,
              "checkpoint step %" PRId64
              ": training stalled %.3f s (%s took %.3f s, %.3f s each "
              "without a save)\n",
              c->win_step, c->stall_s, steps, c->win_s,
              median(c->base, c->nbase));
    else
      fprintf(c->con, "checkpoint step %" PRId64 ": training stalled %.3f s\n",
              c->win_step, c->stall_s);
    fflush(c->con);
  }
  c->win_step = -1;
  c->stall_known = 1;
  return report(t, err);
}

/* Start measuring the save just made. */
static void open_window(struct tr_trainer_ckpt* c, int64_t step) {
  c->win_step = step;
  c->win_n = 0;
  c->win_s = 0;
  c->win_blocked_s = c->blocked_s;
}

/* One step's time (its own and the checkpoint work after it): in the
 * window of the save being measured, or a step to compare with. */
static int account(tr_trainer_t* t, double seconds, int saved,
                   tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (saved) {
    TR_CHECK(close_window(t, 1, err)); /* saves closer than the window */
    open_window(c, t->step);
  }
  if (c->win_step >= 0 && c->win_n < TR__STALL_STEPS) {
    c->win_s += seconds;
    if (++c->win_n == TR__STALL_STEPS) return close_window(t, 0, err);
    return 0;
  }
  if (tr_ckpt_pending(c->saver)) return 0; /* a write in flight */
  c->base[c->base_pos] = seconds;
  c->base_pos = (c->base_pos + 1) % TR__BASE_STEPS;
  if (c->nbase < TR__BASE_STEPS) c->nbase++;
  return close_window(t, 0, err); /* one waiting for a step to compare */
}

/* After a commit completes (in the background or not), report it once:
 * a console line now, the metrics record with the save's stall. */
static int report_commit(tr_trainer_t* t, int64_t before, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  tr_ckpt_stats_t s;
  tr_ckpt_saver_stats(c->saver, &s);
  if (s.committed_step < 0 || s.committed_step == before) return 0;
  if (c->con) {
    char copied[96] = "";
    if (s.copy_bytes > 0 && s.copy_s > 0)
      snprintf(copied, sizeof copied,
               " (%.1f MB copied from the device in %.3f s, %.1f GB/s)",
               (double)s.copy_bytes / 1e6, s.copy_s,
               (double)s.copy_bytes / s.copy_s / 1e9);
    fprintf(c->con,
            "checkpoint step %" PRId64
            " complete: %.1f MB written by rank 0 "
            "in %.3f s%s\n",
            s.committed_step, (double)s.bytes / 1e6, s.write_s, copied);
    fflush(c->con);
  }
  c->commit = s;
  c->commit_known = 1;
  return report(t, err);
}

/* Allocate the staging buffers of a full save now (async modes), so that
 * the first save does not pay for page-locking them. */
static int reserve(tr_trainer_t* t, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  items_t l = {0};
  int rc = 0;
  for (int w = 0; w < 3 && rc == 0; w++) rc = items_add(t, w, &l);
  double t0 = tr__now();
  int64_t bytes = 0;
  if (rc < 0)
    rc = tr_errmsg_set(err, rc, "checkpoint items: %s", tr_strerror(rc));
  else
    rc = tr_ckpt_reserve(c->saver, l.items, l.n, &bytes, err);
  items_release(&l);
  if (rc == 0 && bytes > 0 && c->con) {
    fprintf(
        c->con, "checkpoint: %.2f GB of staging buffers (%s) ready in %.2f s\n",
        (double)bytes / 1e9, t->settings.checkpoint.async_mode, tr__now() - t0);
    fflush(c->con);
  }
  return rc;
}

/* Errors that say a step's files are damaged (cut, flipped bits, gone, a
 * metadata file that does not parse): an older step may still load. Others
 * (another model, another data stream) fail every step alike. */
static int damage(int rc) {
  return rc == TR_ECHECKSUM || rc == TR_EFORMAT || rc == TR_ENOENT ||
         rc == TR_EIO;
}

/* The newest complete step below `below` (-1: any) of the folder; -1. */
static int64_t complete_below(const char* folder, int64_t below) {
  tr_ckpt_entry_t* v;
  size_t n;
  if (tr_ckpt_list(folder, &v, &n, NULL) < 0) return -1;
  int64_t step = -1;
  for (size_t i = n; i-- > 0 && step < 0;)
    if (v[i].complete && (below < 0 || v[i].step < below)) step = v[i].step;
  free(v);
  return step;
}

/* Resume from the newest complete step every rank can load. A damaged one
 * is skipped, loudly (which, why), for the next older: every rank tries
 * the same step, and the ranks agree on each outcome, since a shard may be
 * damaged on one rank only. *step: the step resumed from, -1 when there is
 * none. Errors other than damage end it (as does damage in every step,
 * reported for the newest). */
static int resume_latest(tr_trainer_t* t, int64_t* step, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  tr_errmsg_t lerr;
  *step = -1;
  int rc = tr_ckpt_latest(c->folder, step, &lerr); /* warns of the others */
  if (rc == TR_ENOTFOUND) {
    *step = -1;
    return 0;
  }
  if (rc < 0) return tr_errmsg_set(err, rc, "%s", lerr.message);
  int64_t newest = *step;
  char dir[4096], why[sizeof err->message] = "";
  while (*step >= 0) {
    tr_ckpt_step_dir(c->folder, *step, dir, sizeof dir);
    rc = tr_trainer_load_checkpoint(t, dir, 0, err);
    double bad[2] = {rc < 0 && damage(rc), rc < 0 && !damage(rc)};
    if (t->world > 1) {
      int arc = tr__trainer_sum_all(t, bad, 2);
      if (arc < 0)
        return tr_errmsg_set(err, arc,
                             "agreeing on checkpoint step %" PRId64
                             " with the other ranks: %s",
                             *step, tr_strerror(arc));
    }
    if (bad[1] > 0) /* a rank failed otherwise: stop with its error */
      return rc < 0 ? rc
                    : tr_errmsg_set(err, TR_EABORTED,
                                    "another rank could not load '%s'", dir);
    if (bad[0] == 0) break;
    /* each rank that found damage says what */
    if (rc < 0)
      TR_LOG_WARN(CKPT, "checkpoint step %" PRId64 " does not load: %s", *step,
                  err->message);
    if (!why[0])
      snprintf(why, sizeof why, "%s",
               rc < 0 ? err->message : "damaged on another rank");
    int64_t older = complete_below(c->folder, *step);
    if (older < 0)
      return tr_errmsg_set(
          err, TR_ECHECKSUM,
          "no complete checkpoint in '%s' loads: the newest, step %" PRId64
          ", %s (set checkpoint.enable = false, or another "
          "checkpoint.folder, to start afresh)",
          c->folder, newest, why);
    /* a failed try may have loaded part of the moments: none is stale */
    for (int i = 0; i < t->model.n_params; i++) {
      if (!t->adam_m[i].storage) continue; /* another pipeline stage's */
      TR_CHECK(tr_kern_zero(&t->adam_m[i]));
      TR_CHECK(tr_kern_zero(&t->adam_v[i]));
    }
    *step = older;
  }
  if (c->con) {
    if (*step != newest)
      fprintf(c->con,
              "resumed from '%s' at step %" PRId64
              ", the newest step that loads: step %" PRId64
              " is damaged (%s); to choose, set checkpoint.load_step\n",
              dir, t->step, newest, why);
    else
      fprintf(c->con, "resumed from '%s' at step %" PRId64 "\n", dir, t->step);
    fflush(c->con);
  }
  return 0;
}

int tr_trainer_checkpoint_start(tr_trainer_t* t, FILE* con,
                                struct tr_metrics_logger* ml,
                                tr_errmsg_t* err) {
  const tr_trainer_settings_t* s = &t->settings;
  const tr_trainer_checkpoint_t* ck = &s->checkpoint;
  if (!ck->enable) return 0;
  if (ck->last_save_in_hf && !ck->last_save_model_only)
    return tr_errmsg_set(err, TR_ECONFIG,
                         "checkpoint.last_save_in_hf needs "
                         "checkpoint.last_save_model_only = true (only the "
                         "model is saved as Hugging Face safetensors)");
  struct tr_trainer_ckpt* c = calloc(1, sizeof *c);
  if (!c) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  t->ckpt = c;
  c->con = con;
  c->ml = ml;
  c->saved_step = -1;
  c->win_step = -1;
  size_t n = strlen(s->dump_folder) + strlen(ck->folder) + 2;
  c->folder = malloc(n);
  if (!c->folder) return tr_errmsg_set(err, TR_ENOMEM, "out of memory");
  snprintf(c->folder, n, "%s/%s", s->dump_folder, ck->folder);
  tr_ckpt_saver_opts_t o = {
      .folder = c->folder,
      .comm = {.rank = t->rank,
               .world = t->world,
               .all_reduce_sum = t->world > 1 ? sum_all : NULL,
               .arg = t},
      .keep_latest_k = (int)ck->keep_latest_k};
  if (tr_ckpt_mode_parse(ck->async_mode, &o.mode) < 0)
    return tr_errmsg_set(err, TR_ECONFIG, "checkpoint.async_mode: unknown '%s'",
                         ck->async_mode);
  char layout[192];
  int cp = t->cp.pg ? tr_pg_size(t->cp.pg) : 1;
  snprintf(layout, sizeof layout,
           "{\"kind\":\"%s\",\"dp\":%d,\"tp\":%d,\"cp\":%d,"
           "\"global_batch\":%" PRId64 ",\"local_batch\":%" PRId64 "}",
           t->tp.pg   ? "tensor_parallel"
           : t->cp.pg ? "context_parallel"
                      : "data_parallel",
           t->dist.dp_size, t->world / t->dist.dp_size / cp, cp, t->G, t->B);
  o.layout_json = layout;
  if (!ck->load_only) TR_CHECK(tr_ckpt_saver_new(&o, &c->saver, err));

  if (ck->create_seed_checkpoint && c->saver) {
    /* torchtitan's seed checkpoint: the initialised model as step 0 */
    TR_CHECK(save(t, 1, 1, err));
    open_window(c, t->step);
    TR_CHECK(report_commit(t, -1, err));
    TR_CHECK(close_window(t, 1, err));
    if (con) {
      fprintf(con,
              "wrote the seed checkpoint %s/step-0; not training "
              "(checkpoint.create_seed_checkpoint)\n",
              c->folder);
      fflush(con);
    }
    t->step = s->training.steps; /* tr_train's loop has nothing to do */
    return 0;
  }
  /* resume: load_step, else the newest complete step that loads, else
   * initial_load_path */
  int64_t step = ck->load_step;
  int rc = 0;
  char dir[4096];
  if (step >= 0) {
    tr_ckpt_step_dir(c->folder, step, dir, sizeof dir);
    TR_CHECK(tr_trainer_load_checkpoint(t, dir, 0, err));
    if (con) {
      fprintf(con, "resumed from '%s' at step %" PRId64 "\n", dir, t->step);
      fflush(con);
    }
  } else {
    TR_CHECK(resume_latest(t, &step, err));
  }
  if (step >= 0) {
    c->saved_step = t->step;
  } else if (ck->initial_load_path && ck->initial_load_in_hf) {
    /* Hugging Face weights (whole tensors on every rank) */
    TR_CHECK(tr_st_import_model(&t->model, ck->initial_load_path, err));
    TR_CHECK(tr_model_refresh_compute(&t->model)); /* bf16 copies */
    if (con) {
      fprintf(con, "loaded the Hugging Face weights '%s'\n",
              ck->initial_load_path);
      fflush(con);
    }
  } else if (ck->initial_load_path) {
    int model_only = ck->initial_load_model_only;
    TR_CHECK(
        tr_trainer_load_checkpoint(t, ck->initial_load_path, model_only, err));
    if (con) {
      fprintf(con, "loaded %s'%s'\n", model_only ? "the model of " : "",
              ck->initial_load_path);
      fflush(con);
    }
  }
  if (rc == 0 && c->saver) rc = reserve(t, err);
  return rc;
}

/* Wait for (wait) or poll the save in flight; report its commit. */
static int settle(tr_trainer_t* t, int wait, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (!tr_ckpt_pending(c->saver)) return 0;
  tr_ckpt_stats_t before;
  tr_ckpt_saver_stats(c->saver, &before);
  TR_CHECK(wait ? tr_ckpt_wait(c->saver, err) : tr_ckpt_poll(c->saver, err));
  return report_commit(t, before.committed_step, err);
}

/* Save now (after the previous save is committed and reported). */
static int save_now(tr_trainer_t* t, int model_only, int sync,
                    tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  TR_CHECK(settle(t, 1, err));
  tr_ckpt_stats_t before;
  tr_ckpt_saver_stats(c->saver, &before);
  TR_CHECK(save(t, model_only, sync, err));
  return report_commit(t, before.committed_step, err);
}

/* tr_trainer_checkpoint_step's work after a step; *saved: it saved. */
static int after_step(tr_trainer_t* t, int last, int* saved, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (!c || !c->saver) return 0;
  const tr_trainer_checkpoint_t* ck = &t->settings.checkpoint;
  TR_CHECK(settle(t, 0, err));
  int at_end = t->step >= t->settings.training.steps;
  int due = t->step % ck->interval == 0 || last ||
            (t->step == 1 && ck->enable_first_step_checkpoint);
  if (!due || t->step == c->saved_step) return 0;
  /* the last step's save is synchronous and, with last_save_model_only,
   * holds the model alone (in export_dtype), and with last_save_in_hf
   * also as Hugging Face safetensors */
  int model_only = at_end && ck->last_save_model_only;
  *saved = 1;
  TR_CHECK(save_now(t, model_only, last, err));
  if (model_only && last && ck->last_save_in_hf) return save_hf(t, err);
  return 0;
}

int tr_trainer_checkpoint_step(tr_trainer_t* t, const tr_step_stats_t* st,
                               int last, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (!c || !c->saver) return 0;
  double t0 = tr__now();
  int saved = 0;
  TR_CHECK(after_step(t, last, &saved, err));
  return account(t, st->seconds + (tr__now() - t0), saved, err);
}

int tr_trainer_checkpoint_now(tr_trainer_t* t, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (!c || !c->saver)
    return tr_errmsg_set(err, TR_EINVAL, "checkpointing is not enabled");
  if (t->step == c->saved_step) return settle(t, 1, err);
  TR_CHECK(close_window(t, 1, err));
  TR_CHECK(save_now(t, 0, 1, err));
  open_window(c, t->step);
  return close_window(t, 1, err);
}

int tr_trainer_checkpoint_finish(tr_trainer_t* t, tr_errmsg_t* err) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (!c || !c->saver) return 0;
  TR_CHECK(settle(t, 1, err));
  return close_window(t, 1, err);
}

void tr__trainer_checkpoint_before_update(tr_trainer_t* t) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (c && c->saver) tr_ckpt_wait_staged(c->saver);
}

void tr__trainer_checkpoint_release(tr_trainer_t* t) {
  struct tr_trainer_ckpt* c = t->ckpt;
  if (!c) return;
  tr_ckpt_saver_free(c->saver);
  free(c->folder);
  free(c);
  t->ckpt = NULL;
}
