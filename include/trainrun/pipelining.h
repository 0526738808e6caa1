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
 * This version runs one-stage lists: F, B, and the split backward I then
 * W (model.h: tr_model_backward_input / _weight, the same bits as B; a
 * micro-batch is handed back after its W). The communication and FSDP
 * actions belong to multi-stage schedules and are refused
 * (TR_EUNSUPPORTED). */
#ifndef TRAINRUN_PIPELINING_H
#define TRAINRUN_PIPELINING_H

#include <stddef.h>
#include <stdint.h>

#include "trainrun/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the action IR ---- */

typedef enum {
  TR_PP_F = 0,           /* forward */
  TR_PP_I = 1,           /* backward, input gradient */
  TR_PP_W = 2,           /* backward, weight gradient */
  TR_PP_B = 3,           /* full backward */
  TR_PP_UNSHARD = 4,     /* FSDP all-gather of the stage's parameters */
  TR_PP_RESHARD = 5,     /* FSDP free of them */
  TR_PP_SEND_F = 6,      /* send the forward's output to the next stage */
  TR_PP_RECV_F = 7,      /* receive the forward's input */
  TR_PP_SEND_B = 8,      /* send the input gradient to the previous stage */
  TR_PP_RECV_B = 9,      /* receive the output gradient */
  TR_PP_REDUCE_GRAD = 10 /* FSDP reduce-scatter of the stage's grads */
} tr_pp_type_t;

typedef struct {
  int stage;
  tr_pp_type_t type;
  int64_t micro; /* -1 for UNSHARD, RESHARD, REDUCE_GRAD */
} tr_pp_action_t;

/* PyTorch's name of a type: "F", "I", "W", "B", "UNSHARD", "RESHARD",
 * "SEND_F", "RECV_F", "SEND_B", "RECV_B", "REDUCE_GRAD". */
const char* tr_pp_type_name(tr_pp_type_t t);

/* The text form of a ("0F1", "1UNSHARD") into buf; returns buf. */
const char* tr_pp_action_str(const tr_pp_action_t* a, char* buf, size_t n);

/* Parse PyTorch's text form (`(\d+)(F|I|B|W|UNSHARD|...)(\d*)`, the whole
 * string): TR_EINVAL for anything else, a micro-batch on an FSDP action or
 * none on a compute or communication action. */
int tr_pp_action_parse(const char* s, tr_pp_action_t* out);

/* The one-stage schedule of n_micro micro-batches (1F1B on one stage:
 * F0 B0 F1 B1 ...): 2 * n_micro actions into out (the caller's array of
 * that many). TR_EINVAL for n_micro < 1. */
int tr_pp_schedule_one_stage(int64_t n_micro, tr_pp_action_t* out);

/* ---- the executor ---- */

typedef struct {
  tr_model_t* model;
  int first_block, last_block; /* the stage's blocks [first, last) */
  int64_t n_micro;             /* micro-batches of the step */
  /* Before micro-batch `micro`'s first forward: fill *mb
   * (tr_model_mb_init, loss scale, ...). A negative return stops the
   * step; mb must then hold nothing. */
  int (*mb_begin)(void* arg, int64_t micro, tr_model_mb_t* mb);
  /* After micro-batch `micro`'s last backward, before the executor
   * releases it (its losses). NULL: nothing. */
  int (*mb_end)(void* arg, int64_t micro, tr_model_mb_t* mb);
  void* arg;
} tr_pp_exec_t;

/* Run one rank's actions in order. Micro-batches still held when an
 * action fails are released. Returns 0, TR_EINVAL for a malformed list
 * (a backward before its forward, a W before its I, a B after an I, a
 * micro-batch out of range, a stage other than 0, a micro-batch the list
 * leaves unfinished), TR_EUNSUPPORTED for
 * actions this executor does not run, or the first error of a block or a
 * callback. */
int tr_pp_exec_run(const tr_pp_exec_t* x, const tr_pp_action_t* acts,
                   int64_t n);

#ifdef __cplusplus
}
#endif
#endif /* TRAINRUN_PIPELINING_H */
