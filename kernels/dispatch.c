/* kernels/dispatch.c: the tensor entry points (tr_kern_*): check dtypes,
 * devices, contiguity and shapes, then call the table registered for the
 * tensors' device type. */
#include "config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"
#include "trainrun/error.h"
#include "trainrun/kernels.h"
#include "trainrun/log.h"

/* ---- the tables ---- */

static const tr_kern_ops_t* tables[2] = {&tr__cpu_ops, NULL};
static __thread void* tls_stream;

const tr_kern_ops_t* tr_kern_ops(tr_device_type_t type) {
  if ((unsigned)type >= sizeof tables / sizeof tables[0]) return NULL;
  return __atomic_load_n(&tables[type], __ATOMIC_ACQUIRE);
}

int tr_kern_register(tr_device_type_t type, const tr_kern_ops_t* ops) {
  if (type == TR_DEV_CPU || (unsigned)type >= sizeof tables / sizeof tables[0])
    return TR_EINVAL;
  __atomic_store_n(&tables[type], ops, __ATOMIC_RELEASE);
  return 0;
}

void tr_kern_set_stream(void* stream) { tls_stream = stream; }
void* tr_kern_get_stream(void) { return tls_stream; }

/* ---- argument checks ---- */

static int bad(const char* op, const char* what, const tr_tensor_t* t,
               const char* want) {
  char buf[96];
  TR_LOG_ERROR(KERN, "%s: %s has shape %s, %s", op, what,
               t ? tr_tensor_shape_str(t, buf, sizeof buf) : "(none)", want);
  return TR_ESHAPE;
}

typedef struct {
  const char* op;
  tr_device_t dev;
  int have_dev;
  tr_dtype_t act; /* dtype of activations and weights: f32 or bf16 */
  int have_act;
} chk_t;

/* t must exist, have dtype dt, sit on the same device as the arguments
 * checked before it, and be contiguous when `contiguous` is set (strided
 * arguments are checked by the caller: row_view). */
static int arg(chk_t* c, const tr_tensor_t* t, const char* what, tr_dtype_t dt,
               int contiguous) {
  if (!t || (!t->storage && tr_tensor_numel(t) != 0)) {
    TR_LOG_ERROR(KERN, "%s: %s is missing", c->op, what);
    return TR_EINVAL;
  }
  if (t->dtype != dt) {
    TR_LOG_ERROR(KERN, "%s: %s is %s, expected %s", c->op, what,
                 tr_dtype_name(t->dtype), tr_dtype_name(dt));
    return TR_EDTYPE;
  }
  if (!c->have_dev) {
    c->dev = t->device;
    c->have_dev = 1;
  } else if (!tr_device_eq(c->dev, t->device)) {
    char a[32], b[32];
    TR_LOG_ERROR(KERN, "%s: %s is on %s, other arguments on %s", c->op, what,
                 tr_device_str(t->device, a, sizeof a),
                 tr_device_str(c->dev, b, sizeof b));
    return TR_EDEVICE;
  }
  if (contiguous && !tr_tensor_is_contiguous(t)) {
    TR_LOG_ERROR(KERN, "%s: %s must be contiguous", c->op, what);
    return TR_EINVAL;
  }
  return 0;
}

static int opt(chk_t* c, const tr_tensor_t* t, const char* what,
               tr_dtype_t dt) {
  return t ? arg(c, t, what, dt, 1) : 0;
}

/* An activation or weight: f32 or bf16, the same dtype as the op's other
 * activations (the first one decides). */
static int act(chk_t* c, const tr_tensor_t* t, const char* what,
               int contiguous) {
  if (t && !c->have_act) {
    if (t->dtype != TR_F32 && t->dtype != TR_BF16) {
      TR_LOG_ERROR(KERN, "%s: %s is %s, expected float32 or bfloat16", c->op,
                   what, tr_dtype_name(t->dtype));
      return TR_EDTYPE;
    }
    c->act = t->dtype;
    c->have_act = 1;
  }
  return arg(c, t, what, c->have_act ? c->act : TR_F32, contiguous);
}

static int opt_act(chk_t* c, const tr_tensor_t* t, const char* what) {
  return t ? act(c, t, what, 1) : 0;
}

/* The table for the checked device, and within it the one for the
 * activations' dtype. */
static const tr_kern_ops_t* table(chk_t* c, int* rc) {
  const tr_kern_ops_t* ops = tr_kern_ops(c->dev.type);
  char buf[32];
  if (!ops) {
    TR_LOG_ERROR(KERN, "%s: no kernels for %s tensors in this build", c->op,
                 tr_device_str(c->dev, buf, sizeof buf));
    *rc = TR_EUNSUPPORTED;
    return NULL;
  }
  if (c->have_act && c->act == TR_BF16) {
    if (!ops->bf16) {
      TR_LOG_ERROR(KERN, "%s: no bfloat16 kernels for %s tensors", c->op,
                   tr_device_str(c->dev, buf, sizeof buf));
      *rc = TR_EDTYPE;
    }
    return ops->bf16;
  }
  return ops;
}

#define F(t) ((float*)tr_tensor_data(t))
#define CF(t) ((const float*)tr_tensor_data(t))
#define OF(t) ((t) ? F(t) : NULL)
#define I(t) ((const int32_t*)tr_tensor_data(t))

static int64_t last_dim(const tr_tensor_t* t) {
  return t->ndim ? t->shape[t->ndim - 1] : 1;
}
static int64_t rows(const tr_tensor_t* t) {
  int64_t c = last_dim(t);
  return c ? tr_tensor_numel(t) / c : 0;
}
static int is_vec(const tr_tensor_t* t, int64_t n) {
  return t->ndim == 1 && t->shape[0] == n;
}
/* [N, C] as [N, C] or [B, T, C]: same rows and last dim */
static int same_rows(const tr_tensor_t* a, const tr_tensor_t* b) {
  return rows(a) == rows(b) && last_dim(a) == last_dim(b);
}
static int fits_int(int64_t v) { return v >= 0 && v <= 0x7fffffff; }

/* A row-strided 2-D or 3-D view: last dim contiguous, rows evenly spaced.
 * Gives the row count, width and row stride. */
static int row_view(const tr_tensor_t* t, int64_t* n, int64_t* w,
                    int64_t* stride) {
  if (t->ndim < 2 || t->ndim > 3 || t->stride[t->ndim - 1] != 1) return -1;
  *w = t->shape[t->ndim - 1];
  *stride = t->stride[t->ndim - 2];
  *n = rows(t);
  if (t->ndim == 3 && t->shape[1] > 0 &&
      t->stride[0] != t->shape[1] * t->stride[1] && t->shape[0] > 1)
    return -1;
  if (*stride<*w&& * n> 1) return -1;
  return 0;
}

/* Row stride of an activation whose rows may be padded (a column slice of
 * a wider buffer). */
static int row_ld(const chk_t* c, const tr_tensor_t* t, const char* what,
                  int64_t* ld) {
  int64_t n, w;
  if (tr_tensor_is_contiguous(t)) {
    *ld = last_dim(t);
    return 0;
  }
  if (row_view(t, &n, &w, ld) < 0)
    return bad(c->op, what, t, "expected rows with unit column stride");
  return 0;
}

/* ---- embedding ---- */

/* Tokens outside [0, vocab) on the host: TR_EINVAL naming the first. */
static int check_tokens(const chk_t* c, const tr_tensor_t* tokens,
                        int64_t vocab) {
  if (c->dev.type != TR_DEV_CPU) return 0;
  const int32_t* tok = I(tokens);
  for (int64_t i = 0; i < tr_tensor_numel(tokens); i++)
    if (tok[i] < 0 || tok[i] >= vocab) {
      TR_LOG_ERROR(KERN, "token %d at position %lld is outside [0, %lld)",
                   tok[i], (long long)i, (long long)vocab);
      return TR_EINVAL;
    }
  return 0;
}

/* The shapes every embedding entry checks: tokens [B, T], the table
 * (wte or its gradient, named tab[0], rows named tab[1]) [rows, C], x (the
 * output or its gradient, named xname) [B, T, C], the optional positions
 * (named pname) [>= T, C]. */
static int emb_shapes(const chk_t* c, const tr_tensor_t* tokens,
                      const tr_tensor_t* t, const char* const tab[2],
                      const tr_tensor_t* x, const char* xname,
                      const tr_tensor_t* pos, const char* pname, int64_t* B,
                      int64_t* T, int64_t* rows, int64_t* C) {
  char want[32];
  if (tokens->ndim != 2) return bad(c->op, "tokens", tokens, "expected [B, T]");
  *B = tokens->shape[0];
  *T = tokens->shape[1];
  snprintf(want, sizeof want, "expected [%s, C]", tab[1]);
  if (t->ndim != 2) return bad(c->op, tab[0], t, want);
  *rows = t->shape[0];
  *C = t->shape[1];
  if (x->ndim != 3 || x->shape[0] != *B || x->shape[1] != *T ||
      x->shape[2] != *C)
    return bad(c->op, xname, x, "expected [B, T, C]");
  if (pos && (pos->ndim != 2 || pos->shape[0] < *T || pos->shape[1] != *C))
    return bad(c->op, pname, pos, "expected [>= T, C]");
  return 0;
}

int tr_kern_embedding_fwd(tr_tensor_t* out, const tr_tensor_t* tokens,
                          const tr_tensor_t* wte, const tr_tensor_t* wpe) {
  chk_t c = {.op = "embedding_fwd"};
  int rc = 0;
  TR_CHECK(act(&c, out, "out", 1));
  TR_CHECK(arg(&c, tokens, "tokens", TR_I32, 1));
  TR_CHECK(act(&c, wte, "wte", 1));
  TR_CHECK(opt_act(&c, wpe, "wpe"));
  static const char* const tab[2] = {"wte", "V"};
  int64_t B, T, V, C;
  TR_CHECK(emb_shapes(&c, tokens, wte, tab, out, "out", wpe, "wpe", &B, &T, &V,
                      &C));
  if (!fits_int(B) || !fits_int(T) || !fits_int(C)) return TR_EINVAL;
  TR_CHECK(check_tokens(&c, tokens, V));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->embedding_fwd(F(out), I(tokens), CF(wte), wpe ? CF(wpe) : NULL,
                            (int)B, (int)T, (int)C);
}

int tr_kern_embedding_bwd(tr_tensor_t* dwte, tr_tensor_t* dwpe,
                          const tr_tensor_t* dout, const tr_tensor_t* tokens) {
  chk_t c = {.op = "embedding_bwd"};
  int rc = 0;
  TR_CHECK(arg(&c, dwte, "dwte", TR_F32, 1));
  TR_CHECK(opt(&c, dwpe, "dwpe", TR_F32));
  TR_CHECK(act(&c, dout, "dout", 1));
  TR_CHECK(arg(&c, tokens, "tokens", TR_I32, 1));
  static const char* const tab[2] = {"dwte", "V"};
  int64_t B, T, V, C;
  TR_CHECK(emb_shapes(&c, tokens, dwte, tab, dout, "dout", dwpe, "dwpe", &B, &T,
                      &V, &C));
  TR_CHECK(check_tokens(&c, tokens, V));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->embedding_bwd(F(dwte), OF(dwpe), CF(dout), I(tokens), (int)B,
                            (int)T, (int)C);
}

/* An entry a table may lack: TR_EUNSUPPORTED naming the op. */
static int have(const chk_t* c, const void* fn) {
  if (fn) return 0;
  TR_LOG_ERROR(KERN, "%s: not in the %s kernels", c->op,
               c->dev.type == TR_DEV_CPU ? "cpu" : "device");
  return TR_EUNSUPPORTED;
}

int tr_kern_embedding_rows_fwd(tr_tensor_t* out, const tr_tensor_t* tokens,
                               const tr_tensor_t* wte, int64_t row0,
                               int64_t vocab) {
  chk_t c = {.op = "embedding_rows_fwd"};
  int rc = 0;
  TR_CHECK(act(&c, out, "out", 1));
  TR_CHECK(arg(&c, tokens, "tokens", TR_I32, 1));
  TR_CHECK(act(&c, wte, "wte", 1));
  static const char* const tab[2] = {"wte", "Vl"};
  int64_t B, T, Vl, C;
  TR_CHECK(emb_shapes(&c, tokens, wte, tab, out, "out", NULL, NULL, &B, &T, &Vl,
                      &C));
  if (row0 < 0 || row0 + Vl > vocab || !fits_int(B) || !fits_int(T) ||
      !fits_int(C))
    return TR_EINVAL;
  TR_CHECK(check_tokens(&c, tokens, vocab));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  TR_CHECK(have(&c, ops->embedding_rows_fwd));
  return ops->embedding_rows_fwd(F(out), I(tokens), CF(wte), row0, Vl, (int)B,
                                 (int)T, (int)C);
}

int tr_kern_embedding_rows_bwd(tr_tensor_t* dwte, tr_tensor_t* dwpe,
                               const tr_tensor_t* dout,
                               const tr_tensor_t* tokens, int64_t row0) {
  chk_t c = {.op = "embedding_rows_bwd"};
  int rc = 0;
  TR_CHECK(arg(&c, dwte, "dwte", TR_F32, 1));
  TR_CHECK(opt(&c, dwpe, "dwpe", TR_F32));
  TR_CHECK(act(&c, dout, "dout", 1));
  TR_CHECK(arg(&c, tokens, "tokens", TR_I32, 1));
  static const char* const tab[2] = {"dwte", "Vl"};
  int64_t B, T, Vl, C;
  TR_CHECK(emb_shapes(&c, tokens, dwte, tab, dout, "dout", dwpe, "dwpe", &B, &T,
                      &Vl, &C));
  if (row0 < 0) return TR_EINVAL;
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  TR_CHECK(have(&c, ops->embedding_rows_bwd));
  return ops->embedding_rows_bwd(F(dwte), OF(dwpe), CF(dout), I(tokens), row0,
                                 Vl, (int)B, (int)T, (int)C);
}

/* ---- norms ---- */

/* The checks a forward norm of inp shares with its fused residual form:
 * out shaped like inp (out_want names inp in the message), mean (NULL for
 * RMSNorm) and rstd one per row, weight and bias (NULL: none) [C]. Sets *N
 * and *C. */
static int norm_fwd_args(chk_t* c, const tr_tensor_t* out,
                         const tr_tensor_t* mean, const tr_tensor_t* rstd,
                         const tr_tensor_t* inp, const char* inp_name,
                         const char* out_want, const tr_tensor_t* weight,
                         const tr_tensor_t* bias, int64_t* N, int64_t* C) {
  TR_CHECK(act(c, out, "out", 1));
  if (mean) TR_CHECK(arg(c, mean, "mean", TR_F32, 1));
  TR_CHECK(arg(c, rstd, "rstd", TR_F32, 1));
  TR_CHECK(act(c, inp, inp_name, 1));
  TR_CHECK(act(c, weight, "weight", 1));
  TR_CHECK(opt_act(c, bias, "bias"));
  *N = rows(inp);
  *C = last_dim(inp);
  if (!same_rows(out, inp)) return bad(c->op, "out", out, out_want);
  if (mean && tr_tensor_numel(mean) != *N)
    return bad(c->op, "mean", mean, "expected N rows");
  if (tr_tensor_numel(rstd) != *N)
    return bad(c->op, mean ? "mean" : "rstd", mean ? mean : rstd,
               "expected N rows");
  if (!is_vec(weight, *C)) return bad(c->op, "weight", weight, "expected [C]");
  if (bias && !is_vec(bias, *C))
    return bad(c->op, "bias", bias, "expected [C]");
  return fits_int(*C) ? 0 : TR_EINVAL;
}

int tr_kern_layernorm_fwd(tr_tensor_t* out, tr_tensor_t* mean,
                          tr_tensor_t* rstd, const tr_tensor_t* inp,
                          const tr_tensor_t* weight, const tr_tensor_t* bias,
                          float eps) {
  chk_t c = {.op = "layernorm_fwd"};
  int rc = 0;
  int64_t N, C;
  TR_CHECK(norm_fwd_args(&c, out, mean, rstd, inp, "inp", "expected inp's",
                         weight, bias, &N, &C));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->layernorm_fwd(F(out), F(mean), F(rstd), CF(inp), CF(weight),
                            bias ? CF(bias) : NULL, N, (int)C, eps);
}

/* The residual operands of a fused residual norm: resid and b shaped like
 * a (activations). */
static int residual_args(chk_t* c, const tr_tensor_t* resid,
                         const tr_tensor_t* a, const tr_tensor_t* b) {
  TR_CHECK(act(c, resid, "resid", 1));
  TR_CHECK(act(c, a, "a", 1));
  TR_CHECK(act(c, b, "b", 1));
  if (!same_rows(b, a)) return bad(c->op, "b", b, "expected a's");
  if (!same_rows(resid, a)) return bad(c->op, "resid", resid, "expected a's");
  return 0;
}

/* resid = a + b, then out = layernorm(resid): one pass where the table has
 * the fused entry, else the two ops (a table filled before it existed) */
int tr_kern_residual_layernorm_fwd(tr_tensor_t* resid, tr_tensor_t* out,
                                   tr_tensor_t* mean, tr_tensor_t* rstd,
                                   const tr_tensor_t* a, const tr_tensor_t* b,
                                   const tr_tensor_t* weight,
                                   const tr_tensor_t* bias, float eps) {
  chk_t c = {.op = "residual_layernorm_fwd"};
  int rc = 0;
  int64_t N, C;
  TR_CHECK(residual_args(&c, resid, a, b));
  TR_CHECK(norm_fwd_args(&c, out, mean, rstd, a, "a", "expected a's", weight,
                         bias, &N, &C));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  if (!ops->residual_layernorm_fwd) {
    TR_CHECK(ops->add(F(resid), CF(a), CF(b), N * C));
    return ops->layernorm_fwd(F(out), F(mean), F(rstd), CF(resid), CF(weight),
                              bias ? CF(bias) : NULL, N, (int)C, eps);
  }
  return ops->residual_layernorm_fwd(F(resid), F(out), F(mean), F(rstd), CF(a),
                                     CF(b), CF(weight), bias ? CF(bias) : NULL,
                                     N, (int)C, eps);
}

int tr_kern_layernorm_bwd(tr_tensor_t* dinp, tr_tensor_t* dweight,
                          tr_tensor_t* dbias, const tr_tensor_t* dout,
                          const tr_tensor_t* inp, const tr_tensor_t* weight,
                          const tr_tensor_t* mean, const tr_tensor_t* rstd) {
  chk_t c = {.op = "layernorm_bwd"};
  int rc = 0;
  TR_CHECK(opt_act(&c, dinp, "dinp"));
  TR_CHECK(opt(&c, dweight, "dweight", TR_F32));
  TR_CHECK(opt(&c, dbias, "dbias", TR_F32));
  TR_CHECK(act(&c, dout, "dout", 1));
  TR_CHECK(act(&c, inp, "inp", 1));
  TR_CHECK(act(&c, weight, "weight", 1));
  TR_CHECK(arg(&c, mean, "mean", TR_F32, 1));
  TR_CHECK(arg(&c, rstd, "rstd", TR_F32, 1));
  int64_t N = rows(inp), C = last_dim(inp);
  if (!same_rows(dout, inp)) return bad(c.op, "dout", dout, "expected inp's");
  if (dinp && !same_rows(dinp, inp))
    return bad(c.op, "dinp", dinp, "expected inp's");
  if (!is_vec(weight, C)) return bad(c.op, "weight", weight, "expected [C]");
  if (dweight && !is_vec(dweight, C))
    return bad(c.op, "dweight", dweight, "expected [C]");
  if (dbias && !is_vec(dbias, C))
    return bad(c.op, "dbias", dbias, "expected [C]");
  if (tr_tensor_numel(mean) != N || tr_tensor_numel(rstd) != N)
    return bad(c.op, "mean", mean, "expected N rows");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->layernorm_bwd(OF(dinp), OF(dweight), OF(dbias), CF(dout), CF(inp),
                            CF(weight), CF(mean), CF(rstd), N, (int)C);
}

int tr_kern_rmsnorm_fwd(tr_tensor_t* out, tr_tensor_t* rstd,
                        const tr_tensor_t* inp, const tr_tensor_t* weight,
                        float eps) {
  chk_t c = {.op = "rmsnorm_fwd"};
  int rc = 0;
  int64_t N, C;
  TR_CHECK(norm_fwd_args(&c, out, NULL, rstd, inp, "inp", "expected inp's",
                         weight, NULL, &N, &C));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->rmsnorm_fwd(F(out), F(rstd), CF(inp), CF(weight), N, (int)C, eps);
}

int tr_kern_residual_rmsnorm_fwd(tr_tensor_t* resid, tr_tensor_t* out,
                                 tr_tensor_t* rstd, const tr_tensor_t* a,
                                 const tr_tensor_t* b,
                                 const tr_tensor_t* weight, float eps) {
  chk_t c = {.op = "residual_rmsnorm_fwd"};
  int rc = 0;
  int64_t N, C;
  TR_CHECK(residual_args(&c, resid, a, b));
  TR_CHECK(norm_fwd_args(&c, out, NULL, rstd, a, "a", "expected a's", weight,
                         NULL, &N, &C));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  if (!ops->residual_rmsnorm_fwd) {
    TR_CHECK(ops->add(F(resid), CF(a), CF(b), N * C));
    return ops->rmsnorm_fwd(F(out), F(rstd), CF(resid), CF(weight), N, (int)C,
                            eps);
  }
  return ops->residual_rmsnorm_fwd(F(resid), F(out), F(rstd), CF(a), CF(b),
                                   CF(weight), N, (int)C, eps);
}

int tr_kern_rmsnorm_bwd(tr_tensor_t* dinp, tr_tensor_t* dweight,
                        const tr_tensor_t* dout, const tr_tensor_t* inp,
                        const tr_tensor_t* weight, const tr_tensor_t* rstd) {
  chk_t c = {.op = "rmsnorm_bwd"};
  int rc = 0;
  TR_CHECK(opt_act(&c, dinp, "dinp"));
  TR_CHECK(opt(&c, dweight, "dweight", TR_F32));
  TR_CHECK(act(&c, dout, "dout", 1));
  TR_CHECK(act(&c, inp, "inp", 1));
  TR_CHECK(act(&c, weight, "weight", 1));
  TR_CHECK(arg(&c, rstd, "rstd", TR_F32, 1));
  int64_t N = rows(inp), C = last_dim(inp);
  if (!same_rows(dout, inp)) return bad(c.op, "dout", dout, "expected inp's");
  if (dinp && !same_rows(dinp, inp))
    return bad(c.op, "dinp", dinp, "expected inp's");
  if (!is_vec(weight, C)) return bad(c.op, "weight", weight, "expected [C]");
  if (dweight && !is_vec(dweight, C))
    return bad(c.op, "dweight", dweight, "expected [C]");
  if (tr_tensor_numel(rstd) != N)
    return bad(c.op, "rstd", rstd, "expected N rows");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->rmsnorm_bwd(OF(dinp), OF(dweight), CF(dout), CF(inp), CF(weight),
                          CF(rstd), N, (int)C);
}

/* ---- linear and GEMM ---- */

/* A [B, n, W] view whose slices are not n W elements apart (async tensor
 * parallel's chunk of rows of every sequence): it sends a linear down the
 * batched path. */
static int sliced(const tr_tensor_t* t) {
  return t && t->ndim == 3 && t->shape[0] > 1 && t->shape[1] > 0 &&
         t->stride[0] != t->shape[1] * t->stride[1];
}

/* An operand of the batched path: [B, n, width], packed rows, slices at
 * least n width elements apart. */
static int slice_arg(chk_t* c, const tr_tensor_t* t, const char* what,
                     int64_t B, int64_t n, int64_t width) {
  TR_CHECK(act(c, t, what, 0));
  if (t->ndim != 3 || t->shape[0] != B || t->shape[1] != n ||
      t->shape[2] != width || t->stride[2] != 1 ||
      (n > 1 && t->stride[1] != width) || (B > 1 && t->stride[0] < n * width))
    return bad(c->op, what, t,
               "expected a [B, n, W] view with packed rows, as the input's");
  return 0;
}

static int64_t slice_stride(const tr_tensor_t* t) {
  return t->shape[0] > 1 ? t->stride[0] : 0;
}

/* The linears on batch-strided views (kernels.h): x is inp (forward) or
 * dout (DINP kinds), out is out or dinp. One call of the table's
 * linear_batched, or without one its entries once a slice. */
static int lin_slices(const char* op, tr_kern_lin_kind_t kind, tr_tensor_t* out,
                      const tr_tensor_t* pre, const tr_tensor_t* x,
                      const tr_tensor_t* weight, const tr_tensor_t* bias,
                      const tr_tensor_t* dweight, const tr_tensor_t* dbias) {
  chk_t c = {.op = op};
  int rc = 0, dinp = kind >= TR_KERN_LIN_DINP;
  if (dweight || dbias) {
    TR_LOG_ERROR(KERN,
                 "%s: a weight or bias gradient over batch-strided views (it "
                 "sums every row: run it on the whole tensors)",
                 op);
    return TR_EINVAL;
  }
  TR_CHECK(act(&c, x, dinp ? "dout" : "inp", 0));
  TR_CHECK(act(&c, weight, "weight", 1));
  if (weight->ndim != 2) return bad(op, "weight", weight, "expected [OC, IC]");
  int64_t OC = weight->shape[0], IC = weight->shape[1];
  if (x->ndim != 3) return bad(op, "x", x, "expected [B, n, W]");
  int64_t B = x->shape[0], n = x->shape[1];
  TR_CHECK(slice_arg(&c, x, dinp ? "dout" : "inp", B, n, dinp ? OC : IC));
  TR_CHECK(slice_arg(&c, out, dinp ? "dinp" : "out", B, n, dinp ? IC : OC));
  if (kind == TR_KERN_LIN_FWD_GELU || kind == TR_KERN_LIN_DINP_DGELU)
    TR_CHECK(slice_arg(&c, pre, "pre", B, n, dinp ? IC : OC));
  TR_CHECK(opt_act(&c, bias, "bias"));
  if (bias && !is_vec(bias, OC)) return bad(op, "bias", bias, "expected [OC]");
  if (!fits_int(IC) || !fits_int(OC)) return TR_EINVAL;
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  tr_kern_lin_batch_t l = {
      .kind = kind,
      .out = F(out),
      .pre = pre ? F(pre) : NULL,
      .x = CF(x),
      .w = CF(weight),
      .bias = bias ? CF(bias) : NULL,
      .batch = B,
      .N = n,
      .IC = (int)IC,
      .OC = (int)OC,
      .out_stride = slice_stride(out),
      .pre_stride = pre ? slice_stride(pre) : 0,
      .x_stride = slice_stride(x),
  };
  if (ops->linear_batched) return ops->linear_batched(&l);
  size_t es = tr_dtype_size(x->dtype);
  for (int64_t b = 0; b < B && rc == 0; b++) { /* the entries a slice */
    float* o = (float*)((char*)l.out + (size_t)(b * l.out_stride) * es);
    float* p =
        pre ? (float*)((char*)l.pre + (size_t)(b * l.pre_stride) * es) : NULL;
    const float* xb =
        (const float*)((const char*)l.x + (size_t)(b * l.x_stride) * es);
    switch (kind) {
      case TR_KERN_LIN_FWD:
        rc = ops->linear_fwd(o, xb, l.w, l.bias, n, l.IC, l.OC, l.OC);
        break;
      case TR_KERN_LIN_FWD_GELU:
        rc = ops->linear_gelu_fwd(o, p, xb, l.w, l.bias, n, l.IC, l.OC);
        break;
      case TR_KERN_LIN_DINP_WRITE:
        if (ops->linear_bwd_write)
          rc = ops->linear_bwd_write(o, NULL, NULL, xb, NULL, l.w, n, l.IC,
                                     l.OC, l.OC);
        else if ((rc = ops->zero(o, n * IC)) == 0) /* zero, then add */
          rc = ops->linear_bwd(o, NULL, NULL, xb, NULL, l.w, n, l.IC, l.OC,
                               l.OC);
        break;
      case TR_KERN_LIN_DINP:
        rc = ops->linear_bwd(o, NULL, NULL, xb, NULL, l.w, n, l.IC, l.OC, l.OC);
        break;
      case TR_KERN_LIN_DINP_DGELU:
        rc = ops->linear_dgelu_bwd(o, NULL, NULL, xb, NULL, l.w, p, n, l.IC,
                                   l.OC);
        break;
    }
  }
  return rc;
}

int tr_kern_linear_fwd(tr_tensor_t* out, const tr_tensor_t* inp,
                       const tr_tensor_t* weight, const tr_tensor_t* bias) {
  if (sliced(out) || sliced(inp))
    return lin_slices("linear_fwd", TR_KERN_LIN_FWD, out, NULL, inp, weight,
                      bias, NULL, NULL);
  chk_t c = {.op = "linear_fwd"};
  int rc = 0;
  TR_CHECK(act(&c, out, "out", 0));
  TR_CHECK(act(&c, inp, "inp", 1));
  TR_CHECK(act(&c, weight, "weight", 1));
  TR_CHECK(opt_act(&c, bias, "bias"));
  int64_t ldo;
  TR_CHECK(row_ld(&c, out, "out", &ldo));
  int64_t N = rows(inp), IC = last_dim(inp);
  if (weight->ndim != 2 || weight->shape[1] != IC)
    return bad(c.op, "weight", weight, "expected [OC, IC]");
  int64_t OC = weight->shape[0];
  if (rows(out) != N || last_dim(out) != OC)
    return bad(c.op, "out", out, "expected [N, OC]");
  if (bias && !is_vec(bias, OC))
    return bad(c.op, "bias", bias, "expected [OC]");
  if (!fits_int(IC) || !fits_int(OC)) return TR_EINVAL;
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->linear_fwd(F(out), CF(inp), CF(weight), bias ? CF(bias) : NULL, N,
                         (int)IC, (int)OC, ldo);
}

static int linear_bwd(const char* op, int write, tr_tensor_t* dinp,
                      tr_tensor_t* dweight, tr_tensor_t* dbias,
                      const tr_tensor_t* dout, const tr_tensor_t* inp,
                      const tr_tensor_t* weight) {
  if (sliced(dinp) || sliced(dout) || sliced(inp))
    return lin_slices(op, write ? TR_KERN_LIN_DINP_WRITE : TR_KERN_LIN_DINP,
                      dinp, NULL, dout, weight, NULL, dweight, dbias);
  chk_t c = {.op = op};
  int rc = 0;
  TR_CHECK(opt_act(&c, dinp, "dinp"));
  TR_CHECK(opt(&c, dweight, "dweight", TR_F32));
  TR_CHECK(opt(&c, dbias, "dbias", TR_F32));
  TR_CHECK(act(&c, dout, "dout", 0));
  TR_CHECK(act(&c, inp, "inp", 1));
  TR_CHECK(act(&c, weight, "weight", 1));
  int64_t ldd;
  TR_CHECK(row_ld(&c, dout, "dout", &ldd));
  int64_t N = rows(inp), IC = last_dim(inp);
  if (weight->ndim != 2 || weight->shape[1] != IC)
    return bad(c.op, "weight", weight, "expected [OC, IC]");
  int64_t OC = weight->shape[0];
  if (rows(dout) != N || last_dim(dout) != OC)
    return bad(c.op, "dout", dout, "expected [N, OC]");
  if (dinp && !same_rows(dinp, inp))
    return bad(c.op, "dinp", dinp, "expected inp's");
  if (dweight && !tr_tensor_same_shape(dweight, weight))
    return bad(c.op, "dweight", dweight, "expected weight's");
  if (dbias && !is_vec(dbias, OC))
    return bad(c.op, "dbias", dbias, "expected [OC]");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  if (write && dinp && ops->linear_bwd_write)
    return ops->linear_bwd_write(F(dinp), OF(dweight), OF(dbias), CF(dout),
                                 CF(inp), CF(weight), N, (int)IC, (int)OC, ldd);
  if (write && dinp) /* a table without the entry: zero, then accumulate */
    TR_CHECK(ops->zero(F(dinp), tr_tensor_numel(dinp)));
  return ops->linear_bwd(OF(dinp), OF(dweight), OF(dbias), CF(dout), CF(inp),
                         CF(weight), N, (int)IC, (int)OC, ldd);
}

int tr_kern_linear_bwd(tr_tensor_t* dinp, tr_tensor_t* dweight,
                       tr_tensor_t* dbias, const tr_tensor_t* dout,
                       const tr_tensor_t* inp, const tr_tensor_t* weight) {
  return linear_bwd("linear_bwd", 0, dinp, dweight, dbias, dout, inp, weight);
}

int tr_kern_linear_bwd_write(tr_tensor_t* dinp, tr_tensor_t* dweight,
                             tr_tensor_t* dbias, const tr_tensor_t* dout,
                             const tr_tensor_t* inp,
                             const tr_tensor_t* weight) {
  return linear_bwd("linear_bwd_write", 1, dinp, dweight, dbias, dout, inp,
                    weight);
}

int tr_kern_linear_gelu_fwd(tr_tensor_t* out, tr_tensor_t* pre,
                            const tr_tensor_t* inp, const tr_tensor_t* weight,
                            const tr_tensor_t* bias) {
  if (sliced(out) || sliced(pre) || sliced(inp))
    return lin_slices("linear_gelu_fwd", TR_KERN_LIN_FWD_GELU, out, pre, inp,
                      weight, bias, NULL, NULL);
  chk_t c = {.op = "linear_gelu_fwd"};
  int rc = 0;
  TR_CHECK(act(&c, out, "out", 1));
  TR_CHECK(act(&c, pre, "pre", 1));
  TR_CHECK(act(&c, inp, "inp", 1));
  TR_CHECK(act(&c, weight, "weight", 1));
  TR_CHECK(opt_act(&c, bias, "bias"));
  int64_t N = rows(inp), IC = last_dim(inp);
  if (weight->ndim != 2 || weight->shape[1] != IC)
    return bad(c.op, "weight", weight, "expected [OC, IC]");
  int64_t OC = weight->shape[0];
  if (rows(out) != N || last_dim(out) != OC)
    return bad(c.op, "out", out, "expected [N, OC]");
  if (!same_rows(pre, out)) return bad(c.op, "pre", pre, "expected out's");
  if (bias && !is_vec(bias, OC))
    return bad(c.op, "bias", bias, "expected [OC]");
  if (!fits_int(IC) || !fits_int(OC)) return TR_EINVAL;
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->linear_gelu_fwd(F(out), F(pre), CF(inp), CF(weight),
                              bias ? CF(bias) : NULL, N, (int)IC, (int)OC);
}

int tr_kern_linear_dgelu_bwd(tr_tensor_t* dinp, tr_tensor_t* dweight,
                             tr_tensor_t* dbias, const tr_tensor_t* dout,
                             const tr_tensor_t* inp, const tr_tensor_t* weight,
                             const tr_tensor_t* pre) {
  if (sliced(dinp) || sliced(dout) || sliced(inp) || sliced(pre))
    return lin_slices("linear_dgelu_bwd", TR_KERN_LIN_DINP_DGELU, dinp, pre,
                      dout, weight, NULL, dweight, dbias);
  chk_t c = {.op = "linear_dgelu_bwd"};
  int rc = 0;
  TR_CHECK(act(&c, dinp, "dinp", 1));
  TR_CHECK(opt(&c, dweight, "dweight", TR_F32));
  TR_CHECK(opt(&c, dbias, "dbias", TR_F32));
  TR_CHECK(act(&c, dout, "dout", 1));
  TR_CHECK(act(&c, inp, "inp", 1));
  TR_CHECK(act(&c, weight, "weight", 1));
  TR_CHECK(act(&c, pre, "pre", 1));
  int64_t N = rows(inp), IC = last_dim(inp);
  if (weight->ndim != 2 || weight->shape[1] != IC)
    return bad(c.op, "weight", weight, "expected [OC, IC]");
  int64_t OC = weight->shape[0];
  if (rows(dout) != N || last_dim(dout) != OC)
    return bad(c.op, "dout", dout, "expected [N, OC]");
  if (!same_rows(dinp, inp)) return bad(c.op, "dinp", dinp, "expected inp's");
  if (!same_rows(pre, inp)) return bad(c.op, "pre", pre, "expected inp's");
  if (dweight && !tr_tensor_same_shape(dweight, weight))
    return bad(c.op, "dweight", dweight, "expected weight's");
  if (dbias && !is_vec(dbias, OC))
    return bad(c.op, "dbias", dbias, "expected [OC]");
  if (!fits_int(IC) || !fits_int(OC)) return TR_EINVAL;
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->linear_dgelu_bwd(F(dinp), OF(dweight), OF(dbias), CF(dout),
                               CF(inp), CF(weight), CF(pre), N, (int)IC,
                               (int)OC);
}

int tr_kern_gemm(tr_tensor_t* cm, const tr_tensor_t* a, int transa,
                 const tr_tensor_t* b, int transb, float alpha, float beta) {
  chk_t c = {.op = "gemm"};
  int rc = 0;
  TR_CHECK(act(&c, cm, "c", 0));
  TR_CHECK(act(&c, a, "a", 0));
  TR_CHECK(act(&c, b, "b", 0));
  const tr_tensor_t* ts[3] = {cm, a, b};
  for (int i = 0; i < 3; i++)
    if (ts[i]->ndim != 2 || ts[i]->stride[1] != 1 ||
        (ts[i]->shape[0] > 1 && ts[i]->stride[0] < ts[i]->shape[1]))
      return bad(c.op,
                 i == 0   ? "c"
                 : i == 1 ? "a"
                          : "b",
                 ts[i], "expected a 2-D matrix with unit column stride");
  int64_t M = transa ? a->shape[1] : a->shape[0];
  int64_t K = transa ? a->shape[0] : a->shape[1];
  int64_t Kb = transb ? b->shape[1] : b->shape[0];
  int64_t N = transb ? b->shape[0] : b->shape[1];
  if (K != Kb) return bad(c.op, "b", b, "inner dims differ");
  if (cm->shape[0] != M || cm->shape[1] != N)
    return bad(c.op, "c", cm, "expected [M, N]");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
#define LD(t) ((t)->shape[0] > 1 ? (t)->stride[0] : (t)->shape[1])
  return ops->gemm(transa, transb, M, N, K, alpha, CF(a), LD(a), CF(b), LD(b),
                   beta, F(cm), LD(cm));
#undef LD
}

/* ---- rope and attention ---- */

int tr_kern_rope(tr_tensor_t* x, int n_heads, const tr_tensor_t* cos_t,
                 const tr_tensor_t* sin_t, int inverse) {
  chk_t c = {.op = "rope"};
  int rc = 0;
  TR_CHECK(act(&c, x, "x", 0));
  TR_CHECK(arg(&c, cos_t, "cos", TR_F32, 1));
  TR_CHECK(arg(&c, sin_t, "sin", TR_F32, 1));
  int64_t n, w, stride;
  if (x->ndim != 3 || row_view(x, &n, &w, &stride) < 0)
    return bad(c.op, "x", x, "expected [B, T, H*D] with contiguous rows");
  if (n_heads <= 0 || w % n_heads || (w / n_heads) % 2)
    return bad(c.op, "x", x, "width must be n_heads * even head_dim");
  int64_t B = x->shape[0], T = x->shape[1], D = w / n_heads;
  if (cos_t->ndim != 2 || cos_t->shape[0] < T || cos_t->shape[1] != D / 2 ||
      !tr_tensor_same_shape(cos_t, sin_t))
    return bad(c.op, "cos", cos_t, "expected [>= T, D/2] like sin");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->rope(F(x), CF(cos_t), CF(sin_t), (int)B, (int)T, n_heads, (int)D,
                   stride, inverse);
}

static int attn_args(chk_t* c, const tr_tensor_t* q, const tr_tensor_t* k,
                     const tr_tensor_t* v, int H, int KVH, int64_t* B,
                     int64_t* T, int64_t* D, int64_t* qs, int64_t* kvs) {
  int64_t n, w, vs;
  if (H <= 0 || KVH <= 0 || H % KVH) {
    TR_LOG_ERROR(KERN, "%s: %d heads do not split into %d kv groups", c->op, H,
                 KVH);
    return TR_EINVAL;
  }
  if (q->ndim != 3 || row_view(q, &n, &w, qs) < 0 || w % H)
    return bad(c->op, "q", q, "expected [B, T, H*D] with contiguous rows");
  *B = q->shape[0];
  *T = q->shape[1];
  *D = w / H;
  if (k->ndim != 3 || row_view(k, &n, &w, kvs) < 0 || k->shape[0] != *B ||
      k->shape[1] != *T || w != KVH * *D)
    return bad(c->op, "k", k, "expected [B, T, KVH*D]");
  if (v->ndim != 3 || row_view(v, &n, &w, &vs) < 0 || vs != *kvs ||
      !tr_tensor_same_shape(v, k))
    return bad(c->op, "v", v, "expected k's shape and row stride");
  return 0;
}

/* The mask of a masked attention call: doc_start [B, T] int32 on the
 * device of the tensors checked before it (or NULL), window >= 0; a CPU
 * doc_start has every row's start in [doc_start[i - 1], i], and its
 * documents are n_docs with the longest of longest_doc rows when these
 * are given (n_docs > 0). */
static int attn_mask(chk_t* c, const tr_tensor_t* doc_start, int n_docs,
                     int longest_doc, int window, int q_shift, int64_t B,
                     int64_t T, tr_kern_attn_mask_t* mask) {
  *mask = (tr_kern_attn_mask_t){
      .doc_start = NULL, .window = window, .q_shift = q_shift};
  if (window < 0) {
    TR_LOG_ERROR(KERN, "%s: sliding window %d is negative", c->op, window);
    return TR_EINVAL;
  }
  if (!doc_start) return 0;
  TR_CHECK(arg(c, doc_start, "doc_start", TR_I32, 1));
  if (tr_tensor_numel(doc_start) != B * T)
    return bad(c->op, "doc_start", doc_start, "expected [B, T]");
  if (n_docs < 0 || longest_doc < 0 ||
      (n_docs > 0 &&
       (n_docs < B || n_docs > B * T || longest_doc < 1 || longest_doc > T))) {
    TR_LOG_ERROR(KERN,
                 "%s: %d documents of at most %d rows cannot be those of a "
                 "[%" PRId64 ", %" PRId64 "] doc_start",
                 c->op, n_docs, longest_doc, B, T);
    return TR_EINVAL;
  }
  mask->doc_start = tr_tensor_data(doc_start);
  if (n_docs > 0) {
    mask->n_docs = n_docs;
    mask->longest_doc = longest_doc;
  }
  if (doc_start->device.type != TR_DEV_CPU) return 0;
  if (n_docs > 0) {
    int n = 0, longest = 0;
    tr_kern_attn_doc_count(mask->doc_start, (int)B, (int)T, &n, &longest);
    if (n != n_docs || longest != longest_doc) {
      TR_LOG_ERROR(KERN,
                   "%s: doc_start holds %d documents of at most %d rows, "
                   "not the %d of at most %d given",
                   c->op, n, longest, n_docs, longest_doc);
      return TR_EINVAL;
    }
  }
  int64_t ahead = q_shift > 0 ? q_shift : 0; /* a shifted row's own key */
  for (int64_t i = 0; i < B * T; i++) {
    int32_t lo = i % T ? mask->doc_start[i - 1] : 0;
    if (mask->doc_start[i] < lo || mask->doc_start[i] > i % T + ahead) {
      TR_LOG_ERROR(KERN,
                   "%s: doc_start[%" PRId64 ", %" PRId64 "] = %" PRId32
                   " is not a position in [%" PRId32 ", %" PRId64 "]",
                   c->op, i / T, i % T, mask->doc_start[i], lo, i % T + ahead);
      return TR_EINVAL;
    }
  }
  return 0;
}

int tr_kern_attention_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                          const tr_tensor_t* q, const tr_tensor_t* k,
                          const tr_tensor_t* v, int n_heads, int n_kv_heads) {
  return tr_kern_attention_masked_fwd(out, lse, q, k, v, n_heads, n_kv_heads,
                                      NULL, 0, 0);
}

int tr_kern_attention_masked_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                                 const tr_tensor_t* q, const tr_tensor_t* k,
                                 const tr_tensor_t* v, int n_heads,
                                 int n_kv_heads, const tr_tensor_t* doc_start,
                                 int window, int q_shift) {
  return tr_kern_attention_docs_fwd(out, lse, q, k, v, n_heads, n_kv_heads,
                                    doc_start, 0, 0, window, q_shift);
}

int tr_kern_attention_docs_fwd(tr_tensor_t* out, tr_tensor_t* lse,
                               const tr_tensor_t* q, const tr_tensor_t* k,
                               const tr_tensor_t* v, int n_heads,
                               int n_kv_heads, const tr_tensor_t* doc_start,
                               int n_docs, int longest_doc, int window,
                               int q_shift) {
  chk_t c = {.op = "attention_fwd"};
  int rc = 0;
  TR_CHECK(act(&c, out, "out", 1));
  TR_CHECK(arg(&c, lse, "lse", TR_F32, 1));
  TR_CHECK(act(&c, q, "q", 0));
  TR_CHECK(act(&c, k, "k", 0));
  TR_CHECK(act(&c, v, "v", 0));
  int64_t B, T, D, qs, kvs;
  TR_CHECK(attn_args(&c, q, k, v, n_heads, n_kv_heads, &B, &T, &D, &qs, &kvs));
  if (out->ndim != 3 || out->shape[0] != B || out->shape[1] != T ||
      out->shape[2] != n_heads * D)
    return bad(c.op, "out", out, "expected [B, T, H*D]");
  if (tr_tensor_numel(lse) != B * n_heads * T)
    return bad(c.op, "lse", lse, "expected [B, H, T]");
  tr_kern_attn_mask_t mask;
  TR_CHECK(attn_mask(&c, doc_start, n_docs, longest_doc, window, q_shift, B, T,
                     &mask));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->attention_fwd(F(out), F(lse), CF(q), CF(k), CF(v), (int)B, (int)T,
                            n_heads, n_kv_heads, (int)D, qs, kvs,
                            doc_start || window || q_shift ? &mask : NULL);
}

int tr_kern_attention_bwd(tr_tensor_t* dq, tr_tensor_t* dk, tr_tensor_t* dv,
                          const tr_tensor_t* dout, const tr_tensor_t* q,
                          const tr_tensor_t* k, const tr_tensor_t* v,
                          const tr_tensor_t* out, const tr_tensor_t* lse,
                          int n_heads, int n_kv_heads) {
  return tr_kern_attention_masked_bwd(dq, dk, dv, dout, q, k, v, out, lse,
                                      n_heads, n_kv_heads, NULL, 0, 0);
}

int tr_kern_attention_masked_bwd(tr_tensor_t* dq, tr_tensor_t* dk,
                                 tr_tensor_t* dv, const tr_tensor_t* dout,
                                 const tr_tensor_t* q, const tr_tensor_t* k,
                                 const tr_tensor_t* v, const tr_tensor_t* out,
                                 const tr_tensor_t* lse, int n_heads,
                                 int n_kv_heads, const tr_tensor_t* doc_start,
                                 int window, int q_shift) {
  return tr_kern_attention_docs_bwd(dq, dk, dv, dout, q, k, v, out, lse,
                                    n_heads, n_kv_heads, doc_start, 0, 0,
                                    window, q_shift);
}

int tr_kern_attention_docs_bwd(tr_tensor_t* dq, tr_tensor_t* dk,
                               tr_tensor_t* dv, const tr_tensor_t* dout,
                               const tr_tensor_t* q, const tr_tensor_t* k,
                               const tr_tensor_t* v, const tr_tensor_t* out,
                               const tr_tensor_t* lse, int n_heads,
                               int n_kv_heads, const tr_tensor_t* doc_start,
                               int n_docs, int longest_doc, int window,
                               int q_shift) {
  chk_t c = {.op = "attention_bwd"};
  int rc = 0;
  TR_CHECK(act(&c, dq, "dq", 0));
  TR_CHECK(act(&c, dk, "dk", 0));
  TR_CHECK(act(&c, dv, "dv", 0));
  TR_CHECK(act(&c, dout, "dout", 1));
  TR_CHECK(act(&c, q, "q", 0));
  TR_CHECK(act(&c, k, "k", 0));
  TR_CHECK(act(&c, v, "v", 0));
  TR_CHECK(act(&c, out, "out", 1));
  TR_CHECK(arg(&c, lse, "lse", TR_F32, 1));
  int64_t B, T, D, qs, kvs, B2, T2, D2, dqs, dkvs;
  TR_CHECK(attn_args(&c, q, k, v, n_heads, n_kv_heads, &B, &T, &D, &qs, &kvs));
  TR_CHECK(attn_args(&c, dq, dk, dv, n_heads, n_kv_heads, &B2, &T2, &D2, &dqs,
                     &dkvs));
  if (B2 != B || T2 != T || D2 != D || dqs != qs || dkvs != kvs)
    return bad(c.op, "dq", dq, "expected q's shape and strides");
  if (!tr_tensor_same_shape(out, dout) || out->ndim != 3 ||
      out->shape[0] != B || out->shape[1] != T || out->shape[2] != n_heads * D)
    return bad(c.op, "out", out, "expected [B, T, H*D] like dout");
  if (tr_tensor_numel(lse) != B * n_heads * T)
    return bad(c.op, "lse", lse, "expected [B, H, T]");
  tr_kern_attn_mask_t mask;
  TR_CHECK(attn_mask(&c, doc_start, n_docs, longest_doc, window, q_shift, B, T,
                     &mask));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->attention_bwd(F(dq), F(dk), F(dv), CF(dout), CF(q), CF(k), CF(v),
                            CF(out), CF(lse), (int)B, (int)T, n_heads,
                            n_kv_heads, (int)D, qs, kvs,
                            doc_start || window || q_shift ? &mask : NULL);
}

int tr_kern_attn_merge(tr_tensor_t* acc, tr_tensor_t* lse,
                       const tr_tensor_t* pout, const tr_tensor_t* plse,
                       int n_heads) {
  chk_t c = {.op = "attn_merge"};
  int rc = 0;
  TR_CHECK(act(&c, pout, "pout", 1));
  TR_CHECK(arg(&c, acc, "acc", TR_F32, 1));
  TR_CHECK(arg(&c, lse, "lse", TR_F32, 1));
  TR_CHECK(arg(&c, plse, "plse", TR_F32, 1));
  if (n_heads < 1 || pout->ndim != 3 || pout->shape[2] % n_heads)
    return bad(c.op, "pout", pout, "expected [B, T, H*D]");
  int64_t B = pout->shape[0], T = pout->shape[1], D = pout->shape[2] / n_heads;
  if (!tr_tensor_same_shape(acc, pout))
    return bad(c.op, "acc", acc, "expected pout's shape");
  if (tr_tensor_numel(lse) != B * n_heads * T ||
      tr_tensor_numel(plse) != B * n_heads * T)
    return bad(c.op, "lse", lse, "expected [B, H, T] (and plse too)");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->attn_merge(F(acc), F(lse), CF(pout), CF(plse), (int)B, (int)T,
                         n_heads, (int)D);
}

/* ---- activations ---- */

int tr_kern_gelu_fwd(tr_tensor_t* out, const tr_tensor_t* inp) {
  chk_t c = {.op = "gelu_fwd"};
  int rc = 0;
  TR_CHECK(act(&c, out, "out", 1));
  TR_CHECK(act(&c, inp, "inp", 1));
  if (tr_tensor_numel(out) != tr_tensor_numel(inp))
    return bad(c.op, "out", out, "expected inp's size");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->gelu_fwd(F(out), CF(inp), tr_tensor_numel(inp));
}

int tr_kern_gelu_bwd(tr_tensor_t* dinp, const tr_tensor_t* dout,
                     const tr_tensor_t* inp) {
  chk_t c = {.op = "gelu_bwd"};
  int rc = 0;
  TR_CHECK(act(&c, dinp, "dinp", 1));
  TR_CHECK(act(&c, dout, "dout", 1));
  TR_CHECK(act(&c, inp, "inp", 1));
  int64_t n = tr_tensor_numel(inp);
  if (tr_tensor_numel(dinp) != n || tr_tensor_numel(dout) != n)
    return bad(c.op, "dout", dout, "expected inp's size");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->gelu_bwd(F(dinp), CF(dout), CF(inp), n);
}

int tr_kern_swiglu_fwd(tr_tensor_t* out, const tr_tensor_t* gate,
                       const tr_tensor_t* up) {
  chk_t c = {.op = "swiglu_fwd"};
  int rc = 0;
  TR_CHECK(act(&c, out, "out", 1));
  TR_CHECK(act(&c, gate, "gate", 1));
  TR_CHECK(act(&c, up, "up", 1));
  int64_t n = tr_tensor_numel(gate);
  if (tr_tensor_numel(out) != n || tr_tensor_numel(up) != n)
    return bad(c.op, "up", up, "expected gate's size");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->swiglu_fwd(F(out), CF(gate), CF(up), n);
}

static int swiglu_bwd(const char* op, int write, tr_tensor_t* dgate,
                      tr_tensor_t* dup, const tr_tensor_t* dout,
                      const tr_tensor_t* gate, const tr_tensor_t* up) {
  chk_t c = {.op = op};
  int rc = 0;
  TR_CHECK(act(&c, dgate, "dgate", 1));
  TR_CHECK(act(&c, dup, "dup", 1));
  TR_CHECK(act(&c, dout, "dout", 1));
  TR_CHECK(act(&c, gate, "gate", 1));
  TR_CHECK(act(&c, up, "up", 1));
  int64_t n = tr_tensor_numel(gate);
  if (tr_tensor_numel(dgate) != n || tr_tensor_numel(dup) != n ||
      tr_tensor_numel(dout) != n || tr_tensor_numel(up) != n)
    return bad(c.op, "dout", dout, "expected gate's size");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  if (write && ops->swiglu_bwd_write)
    return ops->swiglu_bwd_write(F(dgate), F(dup), CF(dout), CF(gate), CF(up),
                                 n);
  if (write) { /* a table without the entry: zero, then accumulate */
    TR_CHECK(ops->zero(F(dgate), n));
    TR_CHECK(ops->zero(F(dup), n));
  }
  return ops->swiglu_bwd(F(dgate), F(dup), CF(dout), CF(gate), CF(up), n);
}

int tr_kern_swiglu_bwd(tr_tensor_t* dgate, tr_tensor_t* dup,
                       const tr_tensor_t* dout, const tr_tensor_t* gate,
                       const tr_tensor_t* up) {
  return swiglu_bwd("swiglu_bwd", 0, dgate, dup, dout, gate, up);
}

int tr_kern_swiglu_bwd_write(tr_tensor_t* dgate, tr_tensor_t* dup,
                             const tr_tensor_t* dout, const tr_tensor_t* gate,
                             const tr_tensor_t* up) {
  return swiglu_bwd("swiglu_bwd_write", 1, dgate, dup, dout, gate, up);
}

/* ---- cross-entropy ---- */

/* The checks of the forward and the fused forward+backward. */
static int xent_args(chk_t* c, const tr_tensor_t* losses,
                     const tr_tensor_t* lse, const tr_tensor_t* logits,
                     const tr_tensor_t* targets, int64_t* N, int64_t* V,
                     int64_t* ld) {
  TR_CHECK(arg(c, losses, "losses", TR_F32, 1));
  TR_CHECK(arg(c, lse, "lse", TR_F32, 1));
  TR_CHECK(act(c, logits, "logits", 0));
  TR_CHECK(arg(c, targets, "targets", TR_I32, 1));
  TR_CHECK(row_ld(c, logits, "logits", ld));
  *N = rows(logits);
  *V = last_dim(logits);
  if (tr_tensor_numel(targets) != *N || tr_tensor_numel(losses) != *N ||
      tr_tensor_numel(lse) != *N)
    return bad(c->op, "targets", targets, "expected one per logits row");
  if (!fits_int(*V) || *V == 0) return TR_EINVAL;
  return 0;
}

int tr_kern_xent_fwd(tr_tensor_t* losses, tr_tensor_t* lse,
                     const tr_tensor_t* logits, const tr_tensor_t* targets) {
  chk_t c = {.op = "xent_fwd"};
  int rc = 0;
  int64_t N, V, ld;
  TR_CHECK(xent_args(&c, losses, lse, logits, targets, &N, &V, &ld));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->xent_fwd(F(losses), F(lse), CF(logits), I(targets), N, (int)V,
                       ld);
}

int tr_kern_xent_bwd(tr_tensor_t* logits, const tr_tensor_t* lse,
                     const tr_tensor_t* targets, float scale) {
  chk_t c = {.op = "xent_bwd"};
  int rc = 0;
  TR_CHECK(act(&c, logits, "logits", 0));
  TR_CHECK(arg(&c, lse, "lse", TR_F32, 1));
  TR_CHECK(arg(&c, targets, "targets", TR_I32, 1));
  int64_t ld;
  TR_CHECK(row_ld(&c, logits, "logits", &ld));
  int64_t N = rows(logits), V = last_dim(logits);
  if (tr_tensor_numel(targets) != N || tr_tensor_numel(lse) != N)
    return bad(c.op, "targets", targets, "expected one per logits row");
  if (!fits_int(V) || V == 0) return TR_EINVAL;
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->xent_bwd(F(logits), CF(lse), I(targets), N, (int)V, ld, scale);
}

int tr_kern_xent_fused(tr_tensor_t* losses, tr_tensor_t* lse,
                       tr_tensor_t* logits, const tr_tensor_t* targets,
                       float scale) {
  chk_t c = {.op = "xent_fused"};
  int rc = 0;
  int64_t N, V, ld;
  TR_CHECK(xent_args(&c, losses, lse, logits, targets, &N, &V, &ld));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->xent_fused(F(losses), F(lse), F(logits), I(targets), N, (int)V,
                         ld, scale);
}

/* [N] fp32 vectors of the shard steps */
static int vec_args(chk_t* c, int64_t N, const tr_tensor_t* const* ts,
                    const char* const* names, int n) {
  for (int i = 0; i < n; i++) {
    TR_CHECK(arg(c, ts[i], names[i], TR_F32, 1));
    if (tr_tensor_numel(ts[i]) != N)
      return bad(c->op, names[i], ts[i], "expected one per logits row");
  }
  return 0;
}

int tr_kern_xent_shard_stats(tr_tensor_t* max, tr_tensor_t* tgt,
                             const tr_tensor_t* logits,
                             const tr_tensor_t* targets, int64_t voff,
                             int64_t vocab) {
  chk_t c = {.op = "xent_shard_stats"};
  int rc = 0;
  int64_t ld;
  TR_CHECK(act(&c, logits, "logits", 0));
  TR_CHECK(row_ld(&c, logits, "logits", &ld));
  int64_t N = rows(logits), V = last_dim(logits);
  const tr_tensor_t* v[] = {max, tgt};
  const char* nm[] = {"max", "tgt"};
  TR_CHECK(vec_args(&c, N, v, nm, 2));
  TR_CHECK(arg(&c, targets, "targets", TR_I32, 1));
  if (tr_tensor_numel(targets) != N)
    return bad(c.op, "targets", targets, "expected one per logits row");
  if (!fits_int(V) || V == 0 || voff < 0 || voff + V > vocab) return TR_EINVAL;
  if (c.dev.type == TR_DEV_CPU) {
    const int32_t* t = I(targets);
    for (int64_t i = 0; i < N; i++)
      if (t[i] != TR_IGNORE_INDEX && (t[i] < 0 || t[i] >= vocab)) {
        TR_LOG_ERROR(KERN, "target %d at position %lld is outside [0, %lld)",
                     t[i], (long long)i, (long long)vocab);
        return TR_EINVAL;
      }
  }
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  TR_CHECK(have(&c, ops->xent_shard_stats));
  return ops->xent_shard_stats(F(max), F(tgt), CF(logits), I(targets), N,
                               (int)V, ld, voff);
}

int tr_kern_xent_shard_sumexp(tr_tensor_t* sum, const tr_tensor_t* logits,
                              const tr_tensor_t* max) {
  chk_t c = {.op = "xent_shard_sumexp"};
  int rc = 0;
  int64_t ld;
  TR_CHECK(act(&c, logits, "logits", 0));
  TR_CHECK(row_ld(&c, logits, "logits", &ld));
  int64_t N = rows(logits), V = last_dim(logits);
  const tr_tensor_t* v[] = {sum, max};
  const char* nm[] = {"sum", "max"};
  TR_CHECK(vec_args(&c, N, v, nm, 2));
  if (!fits_int(V) || V == 0) return TR_EINVAL;
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  TR_CHECK(have(&c, ops->xent_shard_sumexp));
  return ops->xent_shard_sumexp(F(sum), CF(logits), CF(max), N, (int)V, ld);
}

int tr_kern_xent_shard_loss(tr_tensor_t* losses, tr_tensor_t* lse,
                            const tr_tensor_t* max, const tr_tensor_t* sum,
                            const tr_tensor_t* tgt,
                            const tr_tensor_t* targets) {
  chk_t c = {.op = "xent_shard_loss"};
  int rc = 0;
  int64_t N = tr_tensor_numel(targets);
  const tr_tensor_t* v[] = {losses, lse, max, sum, tgt};
  const char* nm[] = {"losses", "lse", "max", "sum", "tgt"};
  TR_CHECK(vec_args(&c, N, v, nm, 5));
  TR_CHECK(arg(&c, targets, "targets", TR_I32, 1));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  TR_CHECK(have(&c, ops->xent_shard_loss));
  return ops->xent_shard_loss(F(losses), F(lse), CF(max), CF(sum), CF(tgt),
                              I(targets), N);
}

int tr_kern_xent_shard_bwd(tr_tensor_t* logits, const tr_tensor_t* lse,
                           const tr_tensor_t* targets, int64_t voff,
                           float scale) {
  chk_t c = {.op = "xent_shard_bwd"};
  int rc = 0;
  int64_t ld;
  TR_CHECK(act(&c, logits, "logits", 0));
  TR_CHECK(row_ld(&c, logits, "logits", &ld));
  int64_t N = rows(logits), V = last_dim(logits);
  const tr_tensor_t* v[] = {lse};
  const char* nm[] = {"lse"};
  TR_CHECK(vec_args(&c, N, v, nm, 1));
  TR_CHECK(arg(&c, targets, "targets", TR_I32, 1));
  if (tr_tensor_numel(targets) != N)
    return bad(c.op, "targets", targets, "expected one per logits row");
  if (!fits_int(V) || V == 0 || voff < 0) return TR_EINVAL;
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  TR_CHECK(have(&c, ops->xent_shard_bwd));
  return ops->xent_shard_bwd(F(logits), CF(lse), I(targets), N, (int)V, ld,
                             voff, scale);
}

/* ---- optimizer, norms, elementwise ---- */

int tr_kern_adamw(tr_tensor_t* param, const tr_tensor_t* grad, tr_tensor_t* m,
                  tr_tensor_t* v, const tr_adamw_args_t* args) {
  chk_t c = {.op = "adamw"};
  int rc = 0;
  TR_CHECK(arg(&c, param, "param", TR_F32, 1));
  TR_CHECK(arg(&c, grad, "grad", TR_F32, 1));
  TR_CHECK(arg(&c, m, "m", TR_F32, 1));
  TR_CHECK(arg(&c, v, "v", TR_F32, 1));
  int64_t n = tr_tensor_numel(param);
  if (tr_tensor_numel(grad) != n || tr_tensor_numel(m) != n ||
      tr_tensor_numel(v) != n)
    return bad(c.op, "grad", grad, "expected param's size");
  if (!args || args->step < 1) return TR_EINVAL;
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->adamw(F(param), CF(grad), F(m), F(v), n, args);
}

int tr_kern_sum_squares(const tr_tensor_t* x, double* out) {
  chk_t c = {.op = "sum_squares"};
  int rc = 0;
  TR_CHECK(act(&c, x, "x", 1));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  double s = 0.0;
  TR_CHECK(ops->sum_squares(&s, CF(x), tr_tensor_numel(x)));
  *out += s;
  return 0;
}

/* The sets as the table's tensors (*ts, *k of them: empty ones left out;
 * *lowp: one has a compute copy), every tensor checked on c's device. */
static int adamw_tensors(chk_t* c, const tr_kern_adamw_set_t* sets, int n,
                         tr_kern_adamw_tensor_t** out, int* k, int* lowp) {
  int rc = 0;
  tr_kern_adamw_tensor_t* ts = calloc((size_t)n + 1, sizeof *ts);
  if (!ts) return TR_ENOMEM;
  *k = *lowp = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const tr_kern_adamw_set_t* e = &sets[i];
    rc = arg(c, e->param, "param", TR_F32, 1);
    if (rc == 0) rc = arg(c, e->grad, "grad", TR_F32, 1);
    if (rc == 0) rc = arg(c, e->m, "m", TR_F32, 1);
    if (rc == 0) rc = arg(c, e->v, "v", TR_F32, 1);
    if (rc == 0) rc = opt(c, e->compute, "compute", TR_BF16);
    int64_t numel = rc == 0 ? tr_tensor_numel(e->param) : 0;
    if (rc == 0 &&
        (tr_tensor_numel(e->grad) != numel || tr_tensor_numel(e->m) != numel ||
         tr_tensor_numel(e->v) != numel ||
         (e->compute && tr_tensor_numel(e->compute) != numel)))
      rc = bad(c->op, "grad", e->grad, "expected param's size");
    if (rc < 0 || numel == 0) continue;
    ts[(*k)++] = (tr_kern_adamw_tensor_t){
        .param = F(e->param),
        .grad = CF(e->grad),
        .m = F(e->m),
        .v = F(e->v),
        .param_bf16 = e->compute ? tr_tensor_data(e->compute) : NULL,
        .n = numel,
        .decay = e->decay != 0};
    *lowp |= e->compute != NULL;
  }
  if (rc < 0) {
    free(ts);
    return rc;
  }
  *out = ts;
  return 0;
}

/* xs as spans (*k of them: empty ones left out), each f32 or bf16, all on
 * c's device. */
static int sq_spans(chk_t* c, const tr_tensor_t* const* xs, int n,
                    tr_kern_span_t** out, int* k) {
  int rc = 0;
  tr_kern_span_t* sp = calloc((size_t)n + 1, sizeof *sp);
  if (!sp) return TR_ENOMEM;
  *k = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    if (tr_tensor_numel(xs[i]) == 0) continue;
    /* each span its own dtype: mixed f32 / bf16 lists are fine */
    c->have_act = 0;
    rc = act(c, xs[i], "x", 1);
    if (rc == 0)
      sp[(*k)++] = (tr_kern_span_t){tr_tensor_data((tr_tensor_t*)xs[i]),
                                    xs[i]->dtype, tr_tensor_numel(xs[i])};
  }
  c->have_act = 0; /* the table of the device, not of a dtype */
  if (rc < 0) {
    free(sp);
    return rc;
  }
  *out = sp;
  return 0;
}

int tr_kern_adamw_multi(const tr_kern_adamw_set_t* sets, int n,
                        const tr_adamw_args_t* args) {
  if (n < 0 || (n > 0 && !sets) || !args || args->step < 1) return TR_EINVAL;
  if (n == 0) return 0;
  /* every tensor on one device, checked as the single entry does */
  chk_t c = {.op = "adamw_multi"};
  tr_kern_adamw_tensor_t* ts = NULL;
  int k, lowp;
  int rc = adamw_tensors(&c, sets, n, &ts, &k, &lowp);
  const tr_kern_ops_t* ops = rc == 0 && k > 0 ? table(&c, &rc) : NULL;
  if (ops && ops->adamw_multi) {
    rc = ops->adamw_multi(ts, k, args);
  } else if (ops && lowp) {
    TR_LOG_ERROR(KERN, "adamw_multi: no fused update of compute copies here");
    rc = TR_EUNSUPPORTED;
  } else if (ops) { /* one tensor at a time, in list order */
    tr_adamw_args_t a = *args;
    for (int i = 0; i < k && rc == 0; i++) {
      a.weight_decay = ts[i].decay ? args->weight_decay : 0.0f;
      rc = ops->adamw(ts[i].param, ts[i].grad, ts[i].m, ts[i].v, ts[i].n, &a);
    }
  }
  free(ts);
  return rc;
}

int tr_kern_sum_squares_multi(const tr_tensor_t* const* xs, int n,
                              double* out) {
  if (n < 0 || (n > 0 && !xs) || !out) return TR_EINVAL;
  chk_t c = {.op = "sum_squares_multi"};
  tr_kern_span_t* sp = NULL;
  int k;
  int rc = sq_spans(&c, xs, n, &sp, &k);
  const tr_kern_ops_t* ops = rc == 0 && k > 0 ? table(&c, &rc) : NULL;
  if (ops && ops->sum_squares_multi) {
    double v = 0.0;
    rc = ops->sum_squares_multi(&v, sp, k);
    if (rc == 0) *out += v;
  } else if (ops) { /* span by span, as tr_kern_sum_squares adds them */
    for (int i = 0; i < k && rc == 0; i++) {
      const tr_kern_ops_t* t = sp[i].dtype == TR_BF16 ? ops->bf16 : ops;
      double v = 0.0;
      rc = t ? t->sum_squares(&v, (const float*)sp[i].x, sp[i].n) : TR_EDTYPE;
      if (rc == 0) *out += v;
    }
  }
  free(sp);
  return rc;
}

int tr_kern_step_tail(const tr_kern_adamw_set_t* sets, int n,
                      const tr_adamw_args_t* args,
                      const tr_tensor_t* const* grads, int ngrads,
                      double max_norm, tr_tensor_t* losses) {
  if (n < 1 || !sets || !args || args->step < 1 || ngrads < 0 ||
      (ngrads > 0 && !grads))
    return TR_EINVAL;
  chk_t c = {.op = "step_tail"};
  tr_kern_adamw_tensor_t* ts = NULL;
  tr_kern_span_t* sp = NULL;
  int k = 0, nsp = 0, lowp;
  int rc = adamw_tensors(&c, sets, n, &ts, &k, &lowp);
  if (rc == 0) rc = sq_spans(&c, grads, ngrads, &sp, &nsp);
  if (rc == 0 && losses) rc = arg(&c, losses, "losses", TR_F32, 1);
  const tr_kern_ops_t* ops = rc == 0 ? table(&c, &rc) : NULL;
  if (ops && !ops->step_tail) rc = TR_EUNSUPPORTED; /* the caller's own way */
  if (ops && ops->step_tail)
    rc = ops->step_tail(ts, k, args, sp, nsp, max_norm,
                        losses ? F(losses) : NULL,
                        losses ? tr_tensor_numel(losses) : 0);
  free(ts);
  free(sp);
  return rc;
}

int tr_kern_step_tail_wait(tr_device_type_t type, double* sumsq,
                           double* loss_sum) {
  const tr_kern_ops_t* ops = tr_kern_ops(type);
  if (!ops || !ops->step_tail_wait) return TR_EUNSUPPORTED;
  if (!sumsq || !loss_sum) return TR_EINVAL;
  return ops->step_tail_wait(sumsq, loss_sum);
}

void tr_kern_step_tail_release(tr_device_type_t type) {
  const tr_kern_ops_t* ops = tr_kern_ops(type);
  if (ops && ops->step_tail_release) ops->step_tail_release();
}

void tr_kern_step_begin(tr_device_type_t type) {
  const tr_kern_ops_t* ops = tr_kern_ops(type);
  if (ops && ops->step_begin) ops->step_begin();
}

double tr_kern_clip_coef(double total_norm, double max_norm) {
  double coef = max_norm / (total_norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

int tr_kern_scale(tr_tensor_t* x, float s) {
  chk_t c = {.op = "scale"};
  int rc = 0;
  TR_CHECK(act(&c, x, "x", 1));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->scale(F(x), s, tr_tensor_numel(x));
}

int tr_kern_add(tr_tensor_t* out, const tr_tensor_t* a, const tr_tensor_t* b) {
  chk_t c = {.op = "add"};
  int rc = 0;
  TR_CHECK(act(&c, out, "out", 1));
  TR_CHECK(act(&c, a, "a", 1));
  TR_CHECK(act(&c, b, "b", 1));
  int64_t n = tr_tensor_numel(out);
  if (tr_tensor_numel(a) != n || tr_tensor_numel(b) != n)
    return bad(c.op, "a", a, "expected out's size");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->add(F(out), CF(a), CF(b), n);
}

int tr_kern_accumulate(tr_tensor_t* y, const tr_tensor_t* x) {
  chk_t c = {.op = "accumulate"};
  int rc = 0;
  TR_CHECK(act(&c, y, "y", 1));
  TR_CHECK(act(&c, x, "x", 1));
  if (tr_tensor_numel(x) != tr_tensor_numel(y))
    return bad(c.op, "x", x, "expected y's size");
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->accumulate(F(y), CF(x), tr_tensor_numel(y));
}

int tr_kern_zero(tr_tensor_t* x) {
  chk_t c = {.op = "zero"};
  int rc = 0;
  TR_CHECK(act(&c, x, "x", 1));
  const tr_kern_ops_t* ops = table(&c, &rc);
  if (!ops) return rc;
  return ops->zero(F(x), tr_tensor_numel(x));
}
