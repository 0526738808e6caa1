/* pipelining/executor.c: runs one rank's action list over a range of the
 * model's blocks, owning the step's micro-batches from their first
 * forward to their last backward (trainrun/pipelining.h). */
#include "config.h"

#include <stdlib.h>

#include "trainrun/error.h"
#include "trainrun/log.h"
#include "trainrun/pipelining.h"

typedef enum {
  MB_NONE = 0,         /* not begun */
  MB_FORWARD_DONE = 1, /* forward ran: a backward (B or I) may follow */
  MB_INPUT_DONE = 2,   /* I ran: its W is owed */
  MB_DONE = 3          /* released */
} mb_state_t;

/* After the micro-batch's last backward action: its losses to the caller,
 * then release it. */
static int finish(const tr_pp_exec_t* x, int64_t i, tr_model_mb_t* mb,
                  unsigned char* state, int rc) {
  if (rc == 0 && x->mb_end) rc = x->mb_end(x->arg, i, mb);
  tr_model_mb_release(x->model, mb);
  state[i] = MB_DONE;
  return rc;
}

int tr_pp_exec_run(const tr_pp_exec_t* x, const tr_pp_action_t* acts,
                   int64_t n) {
  if (!x || !x->model || !x->mb_begin || x->n_micro < 1 || n < 0 ||
      (n > 0 && !acts) || x->first_block < 0 ||
      x->last_block > x->model->n_blocks || x->first_block >= x->last_block)
    return TR_EINVAL;
  tr_model_t* m = x->model;
  tr_model_mb_t* mbs = calloc((size_t)x->n_micro, sizeof *mbs);
  unsigned char* state = calloc((size_t)x->n_micro, 1);
  if (!mbs || !state) {
    free(mbs);
    free(state);
    return TR_ENOMEM;
  }
  int rc = 0;
  char name[48];
  for (int64_t k = 0; k < n && rc == 0; k++) {
    const tr_pp_action_t* a = &acts[k];
    int64_t i = a->micro;
    if (a->stage != 0 || i < 0 || i >= x->n_micro) {
      TR_LOG_ERROR(PP, "action %s: stage or micro-batch out of range",
                   tr_pp_action_str(a, name, sizeof name));
      rc = TR_EINVAL;
      break;
    }
    switch (a->type) {
      case TR_PP_F:
        if (state[i] != MB_NONE) {
          TR_LOG_ERROR(PP, "action %s: a second forward",
                       tr_pp_action_str(a, name, sizeof name));
          rc = TR_EINVAL;
          break;
        }
        rc = x->mb_begin(x->arg, i, &mbs[i]);
        if (rc < 0) break;
        state[i] = MB_FORWARD_DONE;
        rc = tr_model_forward(m, &mbs[i], x->first_block, x->last_block);
        break;
      case TR_PP_B:
        if (state[i] != MB_FORWARD_DONE) {
          TR_LOG_ERROR(PP, "action %s: a backward without its forward",
                       tr_pp_action_str(a, name, sizeof name));
          rc = TR_EINVAL;
          break;
        }
        rc = tr_model_backward(m, &mbs[i], x->first_block, x->last_block);
        rc = finish(x, i, &mbs[i], state, rc);
        break;
      case TR_PP_I:
        if (state[i] != MB_FORWARD_DONE) {
          TR_LOG_ERROR(PP, "action %s: an input gradient without its forward",
                       tr_pp_action_str(a, name, sizeof name));
          rc = TR_EINVAL;
          break;
        }
        rc = tr_model_backward_input(m, &mbs[i], x->first_block, x->last_block);
        state[i] = MB_INPUT_DONE;
        break;
      case TR_PP_W:
        if (state[i] != MB_INPUT_DONE) {
          TR_LOG_ERROR(PP,
                       "action %s: a weight gradient without its input "
                       "gradient",
                       tr_pp_action_str(a, name, sizeof name));
          rc = TR_EINVAL;
          break;
        }
        rc =
            tr_model_backward_weight(m, &mbs[i], x->first_block, x->last_block);
        rc = finish(x, i, &mbs[i], state, rc);
        break;
      default:
        TR_LOG_ERROR(PP, "action %s: not run by the one-stage executor",
                     tr_pp_action_str(a, name, sizeof name));
        rc = TR_EUNSUPPORTED;
        break;
    }
  }
  for (int64_t i = 0; i < x->n_micro; i++) {
    if (state[i] == MB_DONE) continue;
    /* the list ended with a micro-batch not (or not fully) run: the
     * step's gradients would be incomplete */
    if (rc == 0) {
      TR_LOG_ERROR(PP, "micro-batch %lld: the list ends before its %s",
                   (long long)i,
                   state[i] == MB_NONE         ? "forward"
                   : state[i] == MB_INPUT_DONE ? "weight gradient"
                                               : "backward");
      rc = TR_EINVAL;
    }
    if (state[i] != MB_NONE) tr_model_mb_release(m, &mbs[i]);
  }
  free(mbs);
  free(state);
  return rc;
}
