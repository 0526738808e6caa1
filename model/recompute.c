/* model/recompute.c: activation checkpointing of the transformer layers
 * (torchtitan's [activation_checkpoint] modes none, full and selective
 * with a layer frequency or "op").
 *
 * Every layer pass of model.c goes through tr__ac_layer_fwd/_bwd/
 * _bwd_input, which wrap the family's record (m->family: gpt2.c,
 * llama3.c) in one of their own:
 *
 *  - REC_KEEP: the family's record as it is (mode none, and the layers a
 *    layer frequency leaves alone);
 *  - REC_RECOMPUTE: a view of the layer's input only. The forward ran as
 *    under no_grad, so nothing else was kept; the backward re-runs the
 *    forward from the input and then the backward. It runs between the
 *    block's pre- and post-backward hooks, so FSDP's pre-backward gather
 *    serves both passes and the forward hooks are not run a second time
 *    (FSDP2's forward hooks likewise do nothing in a recomputation);
 *  - REC_SLIM: the family's record without the norm outputs and the
 *    GELU / SwiGLU product, which the backward recomputes first.
 *
 * The model has no dropout or other random state, so there is nothing to
 * preserve between the two forwards ([activation_checkpoint]
 * preserve_rng_state has nothing to act on), and the kernels are
 * deterministic: recomputed activations equal the first pass's bit for
 * bit. The recomputation computes the layer's output too (it is dropped);
 * early_stop is not implemented. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "model/internal.h"
#include "trainrun/error.h"
#include "trainrun/log.h"

typedef enum { REC_KEEP = 0, REC_RECOMPUTE = 1, REC_SLIM = 2 } rec_kind_t;

typedef struct {
  rec_kind_t kind;
  void* inner;   /* the family's record: REC_KEEP, REC_SLIM */
  tr_tensor_t x; /* REC_RECOMPUTE: the layer's input */
} ac_rec_t;

/* ---- the policy ---- */

int tr_model_ac_recomputes(const tr_model_t* m, int layer) {
  switch ((tr_model_ac_mode_t)m->ac_mode) {
    case TR_AC_FULL:
      return 1;
    case TR_AC_LAYERS:
      /* torchtitan counts wrapped layers from 1 and checkpoints every
       * N-th: with N = 2, the second, fourth, ... layer */
      return m->ac_every > 0 && (layer + 1) % m->ac_every == 0;
    case TR_AC_NONE:
    case TR_AC_OPS:
      break;
  }
  return 0;
}

static rec_kind_t policy(const tr_model_t* m, int blk) {
  if (tr_model_ac_recomputes(m, m->blocks[blk].layer)) return REC_RECOMPUTE;
  return m->ac_mode == TR_AC_OPS ? REC_SLIM : REC_KEEP;
}

int tr_model_set_activation_checkpoint(tr_model_t* m, tr_model_ac_mode_t mode,
                                       int every_n) {
  switch (mode) {
    case TR_AC_NONE:
    case TR_AC_FULL:
    case TR_AC_OPS:
      every_n = 0;
      break;
    case TR_AC_LAYERS:
      if (every_n < 1) return TR_EINVAL;
      break;
    default:
      return TR_EINVAL;
  }
  m->ac_mode = (int)mode;
  m->ac_every = every_n;
  return 0;
}

/* "1, 3, 5" (0-based layer indices that recompute), cut to fit */
static void layer_list(const tr_model_t* m, char* buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int l = 0; l < m->cfg.n_layers; l++) {
    if (!tr_model_ac_recomputes(m, l)) continue;
    int n = snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", l);
    if (n < 0 || (size_t)n >= cap - len) {
      if (cap > 4) strcpy(buf + cap - 4, "...");
      return;
    }
    len += (size_t)n;
  }
}

int tr_model_set_activation_checkpoint_config(tr_model_t* m, const char* mode,
                                              const char* option,
                                              tr_errmsg_t* err) {
  tr_model_ac_mode_t am;
  int every = 0;
  if (!mode || strcasecmp(mode, "none") == 0) {
    am = TR_AC_NONE;
  } else if (strcasecmp(mode, "full") == 0) {
    am = TR_AC_FULL;
  } else if (strcasecmp(mode, "selective") == 0) {
    const char* o = option ? option : "";
    char* end = NULL;
    long n = strtol(o, &end, 10);
    if (strcmp(o, "op") == 0) {
      am = TR_AC_OPS;
    } else if (o[0] >= '0' && o[0] <= '9' && *end == '\0' && n >= 1 &&
               n <= 1000000) {
      am = TR_AC_LAYERS;
      every = (int)n;
    } else {
      return tr_errmsg_set(err, TR_ECONFIG,
                           "activation_checkpoint.selective_ac_option: "
                           "expected 'op' or a positive number, got '%s'",
                           o);
    }
  } else if (strcasecmp(mode, "memory_budget") == 0) {
    return tr_errmsg_set(err, TR_ECONFIG,
                         "activation_checkpoint.mode: memory_budget needs a "
                         "compiler's graph partitioner, which trainrun does "
                         "not have; use none, selective or full");
  } else {
    return tr_errmsg_set(err, TR_ECONFIG,
                         "activation_checkpoint.mode: expected selective, "
                         "full, memory_budget or none, got '%s'",
                         mode);
  }
  TR_CHECK(tr_model_set_activation_checkpoint(m, am, every));
  char layers[160];
  layer_list(m, layers, sizeof layers);
  switch (am) {
    case TR_AC_NONE:
      TR_LOG_INFO(MODEL, "activation checkpointing: none");
      break;
    case TR_AC_OPS:
      TR_LOG_INFO(MODEL,
                  "activation checkpointing: selective op (every layer "
                  "recomputes its norms and %s in backward)",
                  m->family->ac_op_name);
      break;
    case TR_AC_FULL:
    case TR_AC_LAYERS:
      TR_LOG_INFO(MODEL,
                  "activation checkpointing: %s, layers %s recompute their "
                  "forward in backward",
                  am == TR_AC_FULL ? "full" : "selective", layers);
      break;
  }
  return 0;
}

/* ---- the passes ---- */

void tr__ac_layer_free(tr_model_t* m, void* saved) {
  ac_rec_t* r = saved;
  if (!r) return;
  if (r->inner) m->family->layer_free(r->inner);
  tr_tensor_release(&r->x);
  free(r);
}

int tr__ac_layer_fwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void** saved) {
  *saved = NULL;
  if (mb->no_grad) {
    void* none = NULL; /* the family keeps nothing under no_grad */
    return m->family->layer_fwd(m, mb, blk, &none);
  }
  ac_rec_t* r = calloc(1, sizeof *r);
  if (!r) return TR_ENOMEM;
  r->kind = policy(m, blk);
  int rc;
  if (r->kind == REC_RECOMPUTE) {
    /* keep the input; run as under no_grad so the family frees the rest
     * as it goes */
    tr_tensor_view(&r->x, &mb->hidden);
    mb->no_grad = 1;
    rc = m->family->layer_fwd(m, mb, blk, &r->inner);
    mb->no_grad = 0;
  } else {
    rc = m->family->layer_fwd(m, mb, blk, &r->inner);
    if (rc == 0 && r->kind == REC_SLIM) m->family->layer_slim(r->inner);
  }
  if (rc < 0) {
    tr__ac_layer_free(m, r);
    return rc;
  }
  *saved = r;
  return 0;
}

/* Re-run the layer's forward from the saved input; *inner receives the
 * family's full record. The recomputed output is dropped, and mb->hidden
 * (whatever a schedule keeps there) is left as it was. */
static int recompute(tr_model_t* m, tr_model_mb_t* mb, int blk, ac_rec_t* r,
                     void** inner) {
  TR_LOG_DEBUG(MODEL, "block %s: recomputing the forward", m->blocks[blk].name);
  tr_tensor_t keep = mb->hidden;
  int no_grad = mb->no_grad;
  memset(&mb->hidden, 0, sizeof mb->hidden);
  tr_tensor_view(&mb->hidden, &r->x);
  mb->no_grad = 0;
  int rc = m->family->layer_fwd(m, mb, blk, inner);
  mb->no_grad = no_grad;
  tr_tensor_release(&mb->hidden);
  mb->hidden = keep;
  return rc;
}

/* The family's full record for the backward: recomputed (REC_RECOMPUTE),
 * refilled (REC_SLIM) or as kept; consumes r. */
static int full_record(tr_model_t* m, tr_model_mb_t* mb, int blk, ac_rec_t* r,
                       void** inner) {
  *inner = r->inner;
  r->inner = NULL;
  int rc = 0;
  if (r->kind == REC_RECOMPUTE)
    rc = recompute(m, mb, blk, r, inner);
  else if (r->kind == REC_SLIM)
    rc = m->family->layer_refill(m, mb, blk, *inner);
  tr__ac_layer_free(m, r); /* the input stays referenced by `inner` */
  if (rc < 0) {
    if (*inner) m->family->layer_free(*inner);
    *inner = NULL;
  }
  return rc;
}

int tr__ac_layer_bwd(tr_model_t* m, tr_model_mb_t* mb, int blk, void* saved) {
  void* inner;
  TR_CHECK(full_record(m, mb, blk, saved, &inner));
  return m->family->layer_bwd(m, mb, blk, inner); /* consumes inner */
}

int tr__ac_layer_bwd_input(tr_model_t* m, tr_model_mb_t* mb, int blk,
                           void* saved, void** wrec) {
  void* inner;
  *wrec = NULL;
  TR_CHECK(full_record(m, mb, blk, saved, &inner));
  int rc = m->family->layer_bwd_input(m, mb, blk, inner);
  if (rc < 0) {
    m->family->layer_free(inner);
    return rc;
  }
  *wrec = inner; /* the W pass consumes it */
  return 0;
}
