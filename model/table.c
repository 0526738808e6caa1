/* model/table.c: the parameter-table builder the families call from their
 * build function — one row per parameter (name, shape, init rule, HF
 * layout, tp style) added to the table and to its block's list. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h" /* TR_GROW */
#include "model/internal.h"
#include "trainrun/error.h"

tr_init_rule_t tr__rule(tr_init_kind_t k, float std, float lo, float hi) {
  tr_init_rule_t r = {k, std, lo, hi};
  return r;
}

int tr__table_add(tr__table_t* t, int blk, tr__pdecl_t d, int ndim, int64_t d0,
                  int64_t d1, const char* fmt, ...) {
  tr_model_t* m = t->m;
  if (TR_GROW(m->params, (size_t)m->n_params + 1, t->cap) < 0)
    return TR_ENOMEM;
  tr_param_t* p = &m->params[m->n_params];
  memset(p, 0, sizeof *p);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->name, sizeof p->name, fmt, ap);
  va_end(ap);
  p->ndim = ndim;
  p->shape[0] = d0;
  p->shape[1] = d1;
  p->hf_layout = d.hf_transposed ? TR_HF_TRANSPOSED : TR_HF_SAME;
  p->init = d.init;
  p->tp_style = d.tp;
  p->tp_parts = d.tp_parts > 1 ? d.tp_parts : 1;
  p->block = blk;
  p->decay = ndim >= 2;
  for (int i = 0; i < ndim; i++) p->layout.shape[i] = p->shape[i];
  p->layout.parts = 1;
  tr__table_use(t, blk, m->n_params);
  return m->n_params++;
}

void tr__table_use(tr__table_t* t, int blk, int idx) {
  tr_model_block_t* bl = &t->m->blocks[blk];
  bl->params[bl->n_params++] = idx;
}

int tr__hf_append(tr_hf_field_t* out, int cap, int* n, const tr_hf_field_t* f,
                  int k) {
  if (k > cap - *n) return TR_ERANGE;
  memcpy(out + *n, f, (size_t)k * sizeof *f);
  *n += k;
  return 0;
}
