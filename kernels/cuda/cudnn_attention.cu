// kernels/cuda/cudnn_attention.cu: causal, full (unmasked) or document-
// masked (block-causal) attention with grouped-query heads
// through cuDNN's fused flash attention (SDPA), forward and backward, built
// with the cuDNN 9 backend graph API in plain C (cudnn-frontend is not used).
// Compiles to nothing in builds without HAVE_CUDNN.
//
// cuDNN's runtime-fusion engines recognise flash attention as a graph of
// primitive operations (the composition cudnn-frontend's SDPA nodes emit
// for cuDNN 9.0 to 9.20): forward
//   S = Q K^T (fp32) * scale; causal mask (row index >= column index, else
//   -inf, by GEN_INDEX, CMP_GE and BINARY_SELECT; a full graph has none:
//   context parallelism's pairs of a query chunk and an earlier key chunk,
//   whose every row sees every key); M = rowmax S;
//   E = exp(S - M); Z = rowsum E; Stats = M + log Z; O = (E / Z) V,
// backward
//   Dsum = rowsum(dO * O) (a device buffer of ours); P = exp(mask(S) - Stats);
//   dV = P^T dO; dS = P (dO V^T - Dsum) * scale; dK = dS^T Q; dQ = dS K,
// with GQA's dK and dV summed over the query heads of a group by a
// reduction. Our layouts are expressed with strides: Q [B,H,T,D] strides
// [T qs, D, qs, 1], K and V [T kvs, D, kvs, 1] (K passed transposed as
// [B,KVH,D,T]), O and dO [T H D, D, H D, 1], Stats [B,H,T,1] [H T, T, 1, 1].
//
// Stats: exp and log of these pointwise operations are natural, and the
// scale is applied before the max, so Stats is the natural-log log-sum-exp
// of each row of the scaled, masked scores: exactly the lse of
// kernels_cuda.h (cudnn-frontend documents its SDPA "Stats" output as
// max + log(sum(exp(S - max)))). So a cuDNN forward may feed the flash or
// SIMT backward and the other way round.
//
// The backward has two graphs: one whose dQ goes through an fp32
// accumulator in the workspace (atomics: not bit-reproducible; the default,
// as PyTorch's flash and cuDNN backward), and one that writes dQ directly
// (the one cudnn-frontend uses for its deterministic algorithm on Hopper;
// engines noted non-deterministic skipped), first under [debug]
// deterministic. The direct graph's engines keep dS in the workspace, B H
// T^2 bf16 (16 GiB at T = 16384, 105 GB for a 28672-row chunk): any
// engine config whose workspace would take more than a quarter of the
// free device memory is passed over, and a graph with none left declines.
//
// Documents (tr_kern_attn_mask_t's doc_start, no window or shift) run as
// a ragged graph, cudnn-frontend's THD layout for packed variable-length
// sequences: every document is a sequence of its own, its rows where they
// already are. The graph's batch dim is D' sequences of at most S rows;
// Q, K, V, O, dO, dQ, dK, dV and Stats carry a ragged offset tensor
// (CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC: [D'+1] int64 element offsets of
// each sequence's first row, the row times the tensor's row stride); the
// lengths [D'] int32 are SEQ_LEN_Q and SEQ_LEN_KV, which override the
// GEMMs' M/N/K (CUDNN_ATTR_OPERATION_MATMUL_GEMM_*_OVERRIDE_DESC) and feed
// the padding mask (row < len and column < len) that precedes the causal
// one, in cudnn-frontend's order (the backward subtracts Stats between
// them). Stats is [rows, H] there (frontend's ragged LSE), so the
// forward transposes Stats into lse [B,H,T] and the backward back: the
// lse contract above holds with documents too. The backward's Dsum, dQ
// accumulator and GQA per-head dK and dV are dense [D',H,S,*] as in
// cudnn-frontend's path without max_total_seq_len (Dsum and the
// accumulator in the workspace, D' S rows: at most 32 N, see below); the
// path with ragged workspace tensors gave wrong dQ and dK for GQA on
// H100s (check_kernels_cuda, 2026-11-28).
// The documents' count and longest come from the host when it knows them
// (the model counts each micro-batch's table once, when it builds it), else
// from a small scan kernel that the host waits for; the scan also lists
// each document's first row on the device. D' and S are rounded up to
// powers of two (S at
// least 64), padding sequences of length 0, so that one plan serves
// many batches: a few plans per model. Ragged graphs need cuDNN 9.6
// (int64 offsets, GQA with offsets); older ones decline.
//
// Engine configs: a graph runs config 0, the first config of the
// heuristics' list (mode A, then the fallback list) whose execution plan
// finalizes and passes the determinism and workspace filters below. For
// measuring the others (bench/kernels_bench -c), tr_kern_cuda_set_attn_config(k)
// or TRAINRUN_CUDNN_ATTN_CONFIG=k runs config k: the k-th entry after
// config 0 in the heuristics' lists, which go on with variants of config 0
// with one knob changed (each other value of each knob its engine reports,
// min to max by stride, at most KNOB_VALUES a knob); where that entry does
// not build or pass the filters, or there is none, config 0 runs
// (tr_kern_cuda_attn_config_misses counts it). The debug log names each
// entry (engine, knob type = value) and what its plan needed.
//
// Configs timed at first use (TRAINRUN_CUDNN_ATTN_TUNE, 4;
// tr_kern_cuda_set_attn_tune): a graph also builds the next entries of
// that list that build, up to 4 with config 0 (a workspace of at most 256
// MiB or config 0's), and its first call runs each once, then 5 rounds of
// one run each in turn with an event after every run, on the call's
// stream and tensors before the real run (as the GEMM tuning does:
// interleaved, every config sees the same clocks; every run writes the
// whole result, which the real run writes again). Before each step
// (tr_kern_cuda_attn_tune_apply), a graph whose timings have completed
// runs from then on the config with the shortest run where that beats
// config 0's by 3% (and config 0's took 20 us or more: tr__tune_pick). On
// an H200 the forward's second heuristics entry (engine 2 with another
// tile knob) took 7-9% less than the first on every shape kernels_bench
// times; no backward entry beat the first
// (bench/results/2026-11-28-session17). None under [debug] deterministic
// (timed picks vary from run to run) or with a config k set.
//
// Execution plans are built once per (device, direction, shape, strides)
// and cached; a shape cuDNN declines is remembered, warned about once, and
// answered TR_EUNSUPPORTED at once afterwards (the caller falls back to the
// flash or SIMT kernels). One cuDNN handle per device, its stream set at
// each call; workspace from the stream's pool.
#include "kernels/cuda/common.cuh"

#ifdef HAVE_CUDNN

#include <cudnn.h>  // cudnnHandle_t, cudnnBackend* (the graph API)
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainrun/param.h"  // TRAINRUN_CUDNN_ATTN_CONFIG

// ---- tensor ids of a graph ----

enum {
  UID_Q = 1,
  UID_K = 2,
  UID_V = 3,
  UID_O = 4,
  UID_STATS = 5,
  UID_SCALE = 6,
  UID_NEGINF = 7,
  UID_DO = 8,
  UID_DQ = 9,
  UID_DK = 10,
  UID_DV = 11,
  UID_DSUM = 12,
  UID_DQACC = 13,
  UID_ONE = 14,
  // document (ragged) graphs: element offsets of each sequence's first
  // row [D'+1] int64, per layout, and the sequence lengths [D'] int32
  UID_RO_Q = 15,
  UID_RO_KV = 16,
  UID_RO_O = 17,
  UID_RO_STATS = 18,
  UID_RO_DQ = 19,
  UID_RO_DKV = 20,
  UID_LEN_Q = 21,
  UID_LEN_KV = 22,
  UID_VIRTUAL = 100  // virtual tensors count up from here
};

#define GB_MAX_DESC 160
#define GB_MAX_OPS 48

// ---- a graph under construction: every descriptor it created ----

typedef struct {
  cudnnBackendDescriptor_t all[GB_MAX_DESC];
  int n_all;
  cudnnBackendDescriptor_t ops[GB_MAX_OPS];
  int n_ops;
  int64_t next_uid;
  cudnnStatus_t st;  // first failure
  const char* what;  // what failed first
} gb_t;

static void gb_release(gb_t* g) {
  for (int i = g->n_all - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->all[i]);
  g->n_all = 0;
  g->n_ops = 0;
}

static bool gb_ok(gb_t* g, cudnnStatus_t st, const char* what) {
  if (g->st != CUDNN_STATUS_SUCCESS) return false;
  if (st != CUDNN_STATUS_SUCCESS) {
    g->st = st;
    g->what = what;
    return false;
  }
  return true;
}

static cudnnBackendDescriptor_t gb_new(gb_t* g, cudnnBackendDescriptorType_t t,
                                       const char* what) {
  if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
  if (g->n_all == GB_MAX_DESC) {
    gb_ok(g, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors");
    return NULL;
  }
  cudnnBackendDescriptor_t d = NULL;
  if (!gb_ok(g, cudnnBackendCreateDescriptor(t, &d), what)) return NULL;
  g->all[g->n_all++] = d;
  return d;
}

static void gb_set(gb_t* g, cudnnBackendDescriptor_t d,
                   cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t n,
                   const void* val, const char* what) {
  if (g->st != CUDNN_STATUS_SUCCESS || !d) return;
  gb_ok(g, cudnnBackendSetAttribute(d, name, type, n, val), what);
}

static void gb_finalize(gb_t* g, cudnnBackendDescriptor_t d,
                        const char* what) {
  if (g->st != CUDNN_STATUS_SUCCESS || !d) return;
  gb_ok(g, cudnnBackendFinalize(d), what);
}

// A 4-d tensor; uid < 0 takes the next virtual id. ragged (or NULL): the
// [D'+1] tensor of element offsets where each of the D' sequences of the
// first dim begins (CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC): a sequence's
// elements are then at ragged[i] + the strides of the other dims.
static cudnnBackendDescriptor_t gb_tensor_r(gb_t* g, int64_t uid,
                                            cudnnDataType_t dt,
                                            const int64_t dims[4],
                                            const int64_t strides[4],
                                            bool is_virtual, bool by_value,
                                            cudnnBackendDescriptor_t ragged) {
  cudnnBackendDescriptor_t t =
      gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor descriptor");
  if (uid < 0) uid = g->next_uid++;
  int64_t align = 16;
  bool virt = is_virtual, byval = by_value;
  gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt,
         "tensor data type");
  gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims,
         "tensor dimensions");
  gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides,
         "tensor strides");
  gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid,
         "tensor id");
  gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align,
         "tensor alignment");
  gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt,
         "tensor is_virtual");
  if (by_value)
    gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &byval,
           "tensor is_by_value");
  if (ragged)
    gb_set(g, t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC,
           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ragged, "tensor ragged offset");
  gb_finalize(g, t, "tensor finalize");
  return t;
}

static cudnnBackendDescriptor_t gb_tensor(gb_t* g, int64_t uid,
                                          cudnnDataType_t dt,
                                          const int64_t dims[4],
                                          const int64_t strides[4],
                                          bool is_virtual, bool by_value) {
  return gb_tensor_r(g, uid, dt, dims, strides, is_virtual, by_value, NULL);
}

// Virtual tensor of type dt shaped like dims/strides.
static cudnnBackendDescriptor_t gb_virt(gb_t* g, cudnnDataType_t dt,
                                        const int64_t dims[4],
                                        const int64_t strides[4]) {
  return gb_tensor(g, -1, dt, dims, strides, true, false);
}

// A by-value fp32 scalar [1,1,1,1].
static cudnnBackendDescriptor_t gb_scalar(gb_t* g, int64_t uid) {
  static const int64_t one[4] = {1, 1, 1, 1};
  return gb_tensor(g, uid, CUDNN_DATA_FLOAT, one, one, false, true);
}

static void gb_add_op(gb_t* g, cudnnBackendDescriptor_t op) {
  if (g->st != CUDNN_STATUS_SUCCESS || !op) return;
  if (g->n_ops == GB_MAX_OPS) {
    gb_ok(g, CUDNN_STATUS_INTERNAL_ERROR, "too many operations");
    return;
  }
  g->ops[g->n_ops++] = op;
}

// y = mode(x[, b[, t]]) in compute type ct; axis >= 0 for GEN_INDEX.
static void gb_pw(gb_t* g, cudnnPointwiseMode_t mode, cudnnDataType_t ct,
                  cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                  cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                  int64_t axis) {
  cudnnBackendDescriptor_t pw =
      gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor");
  gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode,
         "pointwise mode");
  gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &ct,
         "pointwise math precision");
  if (axis >= 0)
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis,
           "pointwise axis");
  gb_finalize(g, pw, "pointwise descriptor finalize");
  cudnnBackendDescriptor_t op = gb_new(
      g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
  gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op descriptor");
  gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
  if (b)
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "pointwise b");
  if (t)
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "pointwise t");
  gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
  gb_finalize(g, op, "pointwise operation finalize");
  gb_add_op(g, op);
}

// c = a b (batched over the first two dims), fp32 accumulation. m, n, k
// (or NULL): [D',1,1,1] int32 tensors overriding the GEMM's M, N or K per
// batch entry (CUDNN_ATTR_OPERATION_MATMUL_GEMM_*_OVERRIDE_DESC: a
// sequence's real length in a ragged graph).
static void gb_matmul(gb_t* g, cudnnBackendDescriptor_t a,
                      cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
                      cudnnBackendDescriptor_t m, cudnnBackendDescriptor_t n,
                      cudnnBackendDescriptor_t k) {
  cudnnDataType_t ct = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t mm =
      gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor");
  gb_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct,
         "matmul compute type");
  gb_finalize(g, mm, "matmul descriptor finalize");
  cudnnBackendDescriptor_t op = gb_new(
      g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
  gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
  gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "matmul b");
  gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
  gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul op descriptor");
  if (m)
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC,
           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m, "matmul m override");
  if (n)
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, "matmul n override");
  if (k)
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC,
           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k, "matmul k override");
  gb_finalize(g, op, "matmul operation finalize");
  gb_add_op(g, op);
}

// y = reduce(x) over the dims where y has extent 1 (or fewer heads)
static void gb_reduce(gb_t* g, cudnnReduceTensorOp_t mode,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
  cudnnDataType_t ct = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t rd =
      gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor");
  gb_set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR,
         CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction operator");
  gb_set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &ct,
         "reduction compute type");
  gb_finalize(g, rd, "reduction descriptor finalize");
  cudnnBackendDescriptor_t op = gb_new(
      g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction operation");
  gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
  gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
  gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, "reduction op descriptor");
  gb_finalize(g, op, "reduction operation finalize");
  gb_add_op(g, op);
}

// y = x seen with other dims/strides (a transposed view)
static void gb_reshape(gb_t* g, cudnnBackendDescriptor_t x,
                       cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t op = gb_new(
      g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape operation");
  gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reshape x");
  gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reshape y");
  gb_finalize(g, op, "reshape operation finalize");
  gb_add_op(g, op);
}

// ---- plans ----

#define KNOB_MAX 48     // knobs an engine reports (cuDNN 9: 44 types)
#define KNOB_VALUES 32  // values tried of one knob (variants)

typedef struct {
  int dev, bwd, causal;  // causal 0: full attention (no mask)
  int det;               // bwd: tr__cuda_deterministic() at build (the
                         // graph order depends on it)
  int docs;              // 1: a ragged graph of documents: B is then the
                         // bucket D' of sequences and T the bucket S of
                         // their rows (docs_buckets)
  int B, T, H, KVH, D;
  int64_t qs, kvs, dqs, dkvs;
} akey_t;

#define ATUNE_MAX 8                      // TRAINRUN_CUDNN_ATTN_TUNE's bound
#define ATUNE_WS_MAX ((int64_t)1 << 28)  // a candidate's workspace bound

// An engine config's finalized execution plan, the config and what it owns
// (a knob variant's engine and knob choices, alive with cfg).
typedef struct {
  cudnnBackendDescriptor_t plan;
  cudnnBackendDescriptor_t cfg;
  cudnnBackendDescriptor_t own[KNOB_MAX + 1];
  int n_own;
  int64_t ws;  // the plan's workspace bytes
} aexec_t;

enum { ATUNE_OFF, ATUNE_READY, ATUNE_TIMING };

typedef struct {
  akey_t key;
  int supported;  // 0: cuDNN declined (warned once)
  int direct_dq;  // bwd: dQ written by the fused kernel
  // ex[0]: config 0 (or config k); then the candidates timed at first use
  aexec_t ex[ATUNE_MAX];
  int nex;
  int cur;   // the one that runs
  int tune;  // ATUNE_*: candidates not yet run, or their timings in flight
  tr__tune_t timing;
  // the graph's descriptors, kept alive as long as the plans that use them
  gb_t* graph;
  // the workspace a call gives: the largest candidate's while timing
  int64_t ws;
} aplan_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static cudnnHandle_t g_handles[TR_MAX_DEVICES];
static aplan_t** g_plans;
static int g_n_plans, g_cap_plans;
static int g_cfg_pick = -1;   // tr_kern_cuda_set_attn_config; -1: the param
static int64_t g_cfg_misses;  // plans built without the config asked for
static int g_tune = -1;       // tr_kern_cuda_set_attn_tune; -1: the param
static int g_tune_pending;    // plans whose timings are in flight
static int64_t g_tune_timed, g_tune_changed;  // tr_kern_cuda_attn_tune_stats

static const char* st_name(cudnnStatus_t st) { return cudnnGetErrorString(st); }

// Called with g_lock held.
static int handle_get(int dev, cudnnHandle_t* out) {
  if (!g_handles[dev]) {
    cudnnStatus_t st = cudnnCreate(&g_handles[dev]);
    if (st != CUDNN_STATUS_SUCCESS) {
      g_handles[dev] = NULL;
      TR_LOG_WARN(KERN, "cudnnCreate failed: %s", st_name(st));
      return TR_EUNSUPPORTED;
    }
  }
  *out = g_handles[dev];
  return 0;
}

// The engine of cfg (a new descriptor the caller destroys), or NULL.
static cudnnBackendDescriptor_t cfg_engine(cudnnBackendDescriptor_t cfg) {
  cudnnBackendDescriptor_t eng = NULL;
  int64_t n = 0;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) !=
      CUDNN_STATUS_SUCCESS)
    return NULL;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                               &eng) != CUDNN_STATUS_SUCCESS ||
      n != 1) {
    cudnnBackendDestroyDescriptor(eng);
    return NULL;
  }
  return eng;
}

// 1 when engine config cfg is noted non-deterministic.
static bool cfg_nondeterministic(cudnnBackendDescriptor_t cfg) {
  cudnnBackendDescriptor_t eng = cfg_engine(cfg);
  bool nondet = false;
  if (!eng) return false;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t nn = 0;
  if (cudnnBackendGetAttribute(
          eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
          CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) == CUDNN_STATUS_SUCCESS)
    for (int64_t i = 0; i < nn && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; i++)
      if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) nondet = true;
  cudnnBackendDestroyDescriptor(eng);
  return nondet;
}

// cfg's knob choices into type[] and val[] (at most KNOB_MAX): their
// count, or -1 when cuDNN does not say.
static int cfg_knobs(cudnnBackendDescriptor_t cfg, cudnnBackendKnobType_t* type,
                     int64_t* val) {
  cudnnBackendDescriptor_t ch[KNOB_MAX];
  int made = 0, n = -1;
  for (; made < KNOB_MAX; made++)
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
                                     &ch[made]) != CUDNN_STATUS_SUCCESS)
      break;
  int64_t got = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &got,
                               ch) == CUDNN_STATUS_SUCCESS) {
    n = 0;
    for (int64_t i = 0; i < got && i < made; i++) {
      int64_t c = 0;
      if (cudnnBackendGetAttribute(ch[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                   CUDNN_TYPE_KNOB_TYPE, 1, &c,
                                   &type[n]) == CUDNN_STATUS_SUCCESS &&
          cudnnBackendGetAttribute(ch[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                   CUDNN_TYPE_INT64, 1, &c,
                                   &val[n]) == CUDNN_STATUS_SUCCESS)
        n++;
    }
  }
  for (int i = 0; i < made; i++) cudnnBackendDestroyDescriptor(ch[i]);
  return n;
}

// "engine 8, knobs 24=26 14=2" (knob type = value): the debug log's name
// of an engine config ("" when the log would not show it: no queries).
static void cfg_desc(cudnnBackendDescriptor_t cfg, char* buf, size_t len) {
  buf[0] = '\0';
  if (!tr_log_enabled(TR_LOG_DEBUG, TR_SUB_KERN)) return;
  int64_t gidx = -1, n = 0;
  cudnnBackendDescriptor_t eng = cfg_engine(cfg);
  if (eng) {
    (void)cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                   CUDNN_TYPE_INT64, 1, &n, &gidx);
    cudnnBackendDestroyDescriptor(eng);
  }
  cudnnBackendKnobType_t type[KNOB_MAX];
  int64_t val[KNOB_MAX];
  int nk = cfg_knobs(cfg, type, val);
  int o = snprintf(buf, len, "engine %lld, knobs", (long long)gidx);
  for (int i = 0; i < nk && o >= 0 && (size_t)o < len; i++)
    o += snprintf(buf + o, len - (size_t)o, " %d=%lld", (int)type[i],
                  (long long)val[i]);
  if (nk <= 0 && o >= 0 && (size_t)o < len)
    snprintf(buf + o, len - (size_t)o, " none");
}

// One engine config to try: the heuristics' own, or a knob variant made
// here, which owns its engine and knob choices (own[0] the engine).
typedef struct {
  cudnnBackendDescriptor_t cfg;
  cudnnBackendDescriptor_t own[KNOB_MAX + 1];
  int n_own;
  int source;     // 0: heuristics mode A, 1: the fallback list, 2: variant
  int64_t index;  // its place in that heuristics list
} acand_t;

typedef struct {
  acand_t* v;
  int n, cap;
} acands_t;

static void cand_release(acand_t* c) {
  if (c->cfg) cudnnBackendDestroyDescriptor(c->cfg);
  for (int i = c->n_own - 1; i >= 0; i--)
    cudnnBackendDestroyDescriptor(c->own[i]);
  memset(c, 0, sizeof *c);
}

// A new zeroed slot at l's end, or NULL (out of memory).
static acand_t* cands_push(acands_t* l) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 16;
    acand_t* v = (acand_t*)realloc(l->v, sizeof *v * (size_t)cap);
    if (!v) return NULL;
    l->v = v;
    l->cap = cap;
  }
  acand_t* c = &l->v[l->n++];
  memset(c, 0, sizeof *c);
  return c;
}

static void cands_release(acands_t* l) {
  for (int i = 0; i < l->n; i++) cand_release(&l->v[i]);
  free(l->v);
  l->v = NULL;
  l->n = l->cap = 0;
}

// Append heuristics mode `source` (0: A, 1: fallback)'s engine configs for
// graph to l. A cuDNN status; *why names what failed.
static cudnnStatus_t heur_configs(cudnnBackendDescriptor_t graph, int source,
                                  acands_t* l, const char** why) {
  static const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A,
                                                  CUDNN_HEUR_MODE_FALLBACK};
  cudnnBackendDescriptor_t heur = NULL;
  cudnnStatus_t st =
      cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE,
                                  CUDNN_TYPE_HEUR_MODE, 1, &modes[source]);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(heur);
  int64_t count = 0;
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                  NULL);
  if (st != CUDNN_STATUS_SUCCESS || count <= 0) {
    if (st != CUDNN_STATUS_SUCCESS) *why = "engine heuristics";
    cudnnBackendDestroyDescriptor(heur);
    return st;
  }
  cudnnBackendDescriptor_t* cfgs = (cudnnBackendDescriptor_t*)calloc(
      (size_t)count, sizeof(cudnnBackendDescriptor_t));
  if (!cfgs) {
    cudnnBackendDestroyDescriptor(heur);
    return CUDNN_STATUS_ALLOC_FAILED;
  }
  int64_t made = 0, got = 0;
  for (; made < count; made++)
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                     &cfgs[made]) != CUDNN_STATUS_SUCCESS)
      break;
  st =
      cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &got, cfgs);
  if (st != CUDNN_STATUS_SUCCESS) got = 0;
  TR_LOG_DEBUG(KERN, "cuDNN attention: heuristics %d: %lld engine configs",
               source, (long long)got);
  for (int64_t i = 0; i < made; i++) {
    acand_t* c = i < got ? cands_push(l) : NULL;
    if (!c) {
      cudnnBackendDestroyDescriptor(cfgs[i]);
      continue;
    }
    c->cfg = cfgs[i];
    c->source = source;
    c->index = i;
  }
  free(cfgs);
  cudnnBackendDestroyDescriptor(heur);
  return st;
}

// Append to l the variant of an engine config whose knob choices are
// type[n]/val[n] with knob t at v (at: t's place among them, -1: t added),
// on a new engine `gidx` of graph. A variant cuDNN does not finalize is
// dropped.
static void variant_add(cudnnBackendDescriptor_t graph, int64_t gidx,
                        const cudnnBackendKnobType_t* type, const int64_t* val,
                        int n, int at, cudnnBackendKnobType_t t, int64_t v,
                        acands_t* l) {
  int nch = n + (at < 0 ? 1 : 0);
  if (nch > KNOB_MAX) return;
  acand_t c;
  memset(&c, 0, sizeof c);
  c.source = 2;
  cudnnBackendDescriptor_t eng = NULL;
  cudnnStatus_t st =
      cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng);
  if (st == CUDNN_STATUS_SUCCESS) {
    c.own[c.n_own++] = eng;
    st = cudnnBackendSetAttribute(eng, CUDNN_ATTR_ENGINE_OPERATION_GRAPH,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  }
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                  CUDNN_TYPE_INT64, 1, &gidx);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(eng);
  for (int j = 0; j < nch && st == CUDNN_STATUS_SUCCESS; j++) {
    cudnnBackendKnobType_t tj = j < n ? type[j] : t;
    int64_t vj = (j == at || j == n) ? v : val[j];
    cudnnBackendDescriptor_t d = NULL;
    st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &d);
    if (st != CUDNN_STATUS_SUCCESS) break;
    c.own[c.n_own++] = d;
    st = cudnnBackendSetAttribute(d, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                  CUDNN_TYPE_KNOB_TYPE, 1, &tj);
    if (st == CUDNN_STATUS_SUCCESS)
      st = cudnnBackendSetAttribute(d, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                    CUDNN_TYPE_INT64, 1, &vj);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(d);
  }
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                      &c.cfg);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(c.cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &eng);
  if (st == CUDNN_STATUS_SUCCESS && nch > 0)
    st =
        cudnnBackendSetAttribute(c.cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, nch, &c.own[1]);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(c.cfg);
  acand_t* slot = st == CUDNN_STATUS_SUCCESS ? cands_push(l) : NULL;
  if (!slot) {
    cand_release(&c);
    return;
  }
  *slot = c;
}

// Append to l the variants of cfg0 with one knob changed: each other value
// of each knob cfg0's engine reports (min to max by stride, at most
// KNOB_VALUES a knob), the other knobs as cfg0 chose them.
static void knob_variants(cudnnBackendDescriptor_t graph,
                          cudnnBackendDescriptor_t cfg0, acands_t* l) {
  cudnnBackendDescriptor_t eng0 = cfg_engine(cfg0);
  if (!eng0) return;
  cudnnBackendKnobType_t ctype[KNOB_MAX];
  int64_t cval[KNOB_MAX], gidx = 0, c = 0, ni = 0;
  int nc = cfg_knobs(cfg0, ctype, cval);
  cudnnBackendDescriptor_t info[KNOB_MAX];
  int made = 0;
  for (; made < KNOB_MAX; made++)
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_INFO_DESCRIPTOR,
                                     &info[made]) != CUDNN_STATUS_SUCCESS)
      break;
  if (nc < 0 ||
      cudnnBackendGetAttribute(eng0, CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                               CUDNN_TYPE_INT64, 1, &c,
                               &gidx) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(eng0, CUDNN_ATTR_ENGINE_KNOB_INFO,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &ni,
                               info) != CUDNN_STATUS_SUCCESS)
    ni = 0;
  for (int64_t i = 0; i < ni && i < made; i++) {
    cudnnBackendKnobType_t t;
    int64_t lo = 0, hi = -1, step = 1;
    if (cudnnBackendGetAttribute(info[i], CUDNN_ATTR_KNOB_INFO_TYPE,
                                 CUDNN_TYPE_KNOB_TYPE, 1, &c,
                                 &t) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(info[i], CUDNN_ATTR_KNOB_INFO_MINIMUM_VALUE,
                                 CUDNN_TYPE_INT64, 1, &c,
                                 &lo) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(info[i], CUDNN_ATTR_KNOB_INFO_MAXIMUM_VALUE,
                                 CUDNN_TYPE_INT64, 1, &c,
                                 &hi) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(info[i], CUDNN_ATTR_KNOB_INFO_STRIDE,
                                 CUDNN_TYPE_INT64, 1, &c,
                                 &step) != CUDNN_STATUS_SUCCESS)
      continue;
    if (step < 1) step = 1;
    int at = -1;
    for (int j = 0; j < nc; j++)
      if (ctype[j] == t) at = j;
    TR_LOG_DEBUG(KERN,
                 "cuDNN attention: engine %lld knob %d: %lld to %lld by "
                 "%lld, chosen %lld",
                 (long long)gidx, (int)t, (long long)lo, (long long)hi,
                 (long long)step, at >= 0 ? (long long)cval[at] : -1LL);
    int tried = 0;
    for (int64_t v = lo; v <= hi && tried < KNOB_VALUES; v += step) {
      if (at >= 0 && cval[at] == v) continue;
      tried++;
      variant_add(graph, gidx, ctype, cval, nc, at, t, v, l);
    }
  }
  for (int i = 0; i < made; i++) cudnnBackendDestroyDescriptor(info[i]);
  cudnnBackendDestroyDescriptor(eng0);
}

// An execution plan of engine config c on handle h if it builds and
// passes the filters (deterministic engines only when want_deterministic;
// workspace at most max_ws): *plan and its workspace *ws, else NULL with
// *st (and *why when the workspace was the reason). d names c in the log.
static cudnnBackendDescriptor_t plan_try(const acand_t* c, const char* d,
                                         cudnnHandle_t h,
                                         bool want_deterministic,
                                         int64_t max_ws, int64_t* ws,
                                         cudnnStatus_t* st, const char** why) {
  *st = CUDNN_STATUS_NOT_SUPPORTED;
  if (want_deterministic && cfg_nondeterministic(c->cfg)) return NULL;
  cudnnBackendDescriptor_t p = NULL;
  *st =
      cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
  if (*st != CUDNN_STATUS_SUCCESS) return NULL;
  (void)cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                 CUDNN_TYPE_HANDLE, 1, &h);
  *st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c->cfg);
  if (*st == CUDNN_STATUS_SUCCESS) *st = cudnnBackendFinalize(p);
  int64_t n = 0, bytes = 0;
  if (*st == CUDNN_STATUS_SUCCESS)
    *st = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                   CUDNN_TYPE_INT64, 1, &n, &bytes);
  if (*st != CUDNN_STATUS_SUCCESS) {
    TR_LOG_DEBUG(KERN, "cuDNN attention: %s: %s", d, st_name(*st));
    cudnnBackendDestroyDescriptor(p);
    return NULL;
  }
  if (bytes > max_ws) {
    TR_LOG_DEBUG(KERN,
                 "cuDNN attention: %s skipped: workspace %lld bytes, above "
                 "%lld",
                 d, (long long)bytes, (long long)max_ws);
    *why =
        "each engine config that finalized wants a workspace above "
        "a quarter of the free device memory";
    *st = CUDNN_STATUS_NOT_SUPPORTED;
    cudnnBackendDestroyDescriptor(p);
    return NULL;
  }
  TR_LOG_DEBUG(KERN, "cuDNN attention: %s finalized, workspace %lld bytes", d,
               (long long)bytes);
  *ws = bytes;
  return p;
}

// Grow l, the list after config 0 (engine config cfg0): the rest of both
// heuristics' lists (from *source), then the knob variants of cfg0 (once,
// *variants). 0 when nothing is left to add. A heuristics query that fails
// only leaves fewer entries.
static int list_more(cudnnBackendDescriptor_t graph, acands_t* l,
                     cudnnBackendDescriptor_t cfg0, int* source,
                     int* variants) {
  const char* why = "";
  int n0 = l->n;
  while (l->n == n0) {
    if (*source < 2) {
      (void)heur_configs(graph, (*source)++, l, &why);
    } else if (!*variants) {
      *variants = 1;
      knob_variants(graph, cfg0, l);
    } else {
      return 0;
    }
  }
  return 1;
}

// Move candidate c with its plan into e.
static void exec_take(aexec_t* e, acand_t* c, cudnnBackendDescriptor_t plan,
                      int64_t ws) {
  e->plan = plan;
  e->cfg = c->cfg;
  memcpy(e->own, c->own, sizeof e->own);
  e->n_own = c->n_own;
  e->ws = ws;
  c->cfg = NULL;
  c->n_own = 0;
}

static void exec_release(aexec_t* e) {
  if (e->plan) cudnnBackendDestroyDescriptor(e->plan);
  if (e->cfg) cudnnBackendDestroyDescriptor(e->cfg);
  for (int j = e->n_own - 1; j >= 0; j--)
    cudnnBackendDestroyDescriptor(e->own[j]);
  memset(e, 0, sizeof *e);
}

// Finalize the operation graph of g, and take config 0, the first engine
// config of the heuristics' list (mode A, then the fallback list) whose
// execution plan builds and passes the filters (plan_try). With pick K >
// 0, config K is the K-th entry after it in the list that goes on with
// the rest of both heuristics' lists and then the knob variants of config
// 0 (see the top of the file); where it does not build, config 0 runs and
// g_cfg_misses counts it. Else with tune N > 1 the next N - 1 entries of
// that list that build (workspace at most ATUNE_WS_MAX, or config 0's)
// follow config 0 as candidates to time at first use. The plans, their
// configs (with what those own) and workspaces go to out->ex. Returns a
// cuDNN status; *why names what failed. Called with g_lock held.
static cudnnStatus_t plan_from_graph(gb_t* g, cudnnHandle_t h,
                                     bool want_deterministic, int64_t max_ws,
                                     int pick, int tune, aplan_t* out,
                                     const char** why) {
  cudnnBackendDescriptor_t graph =
      gb_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  gb_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
         CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops,
         "operation graph ops");
  // Deprecated in recent cuDNN 9 releases (the handle is given at execute
  // time) but required by older ones: set it, and ignore a refusal.
  if (graph && g->st == CUDNN_STATUS_SUCCESS)
    (void)cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                   CUDNN_TYPE_HANDLE, 1, &h);
  gb_finalize(g, graph, "operation graph finalize");
  if (g->st != CUDNN_STATUS_SUCCESS) {
    *why = g->what;
    return g->st;
  }
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED, st;
  *why = "no engine config finalized an execution plan";
  acands_t l = {NULL, 0, 0};
  cudnnBackendDescriptor_t plan = NULL;
  int64_t ws = 0;
  int keep = -1, source = 0, variants = 0;
  char d[256];
  // config 0
  for (int i = 0; !plan; i++) {
    while (i == l.n && source < 2) {
      st = heur_configs(graph, source++, &l, why);
      if (st != CUDNN_STATUS_SUCCESS) last = st;
    }
    if (i == l.n) break;
    cfg_desc(l.v[i].cfg, d, sizeof d);
    plan = plan_try(&l.v[i], d, h, want_deterministic, max_ws, &ws, &st, why);
    if (plan)
      keep = i;
    else
      last = st;
  }
  if (plan && pick > 0) {
    // the list config K indexes, whole for the debug log
    while (list_more(graph, &l, l.v[keep].cfg, &source, &variants)) {
    }
    for (int i = keep + 1; i < l.n; i++) {
      cfg_desc(l.v[i].cfg, d, sizeof d);
      TR_LOG_DEBUG(KERN, "cuDNN attention: config %d: %s (%s #%lld)", i - keep,
                   d,
                   l.v[i].source == 0   ? "heuristics A"
                   : l.v[i].source == 1 ? "fallback list"
                                        : "knob variant",
                   (long long)l.v[i].index);
    }
    int i = keep + pick;
    int64_t ws_k = 0;
    cudnnBackendDescriptor_t pk = NULL;
    if (i < l.n) {
      cfg_desc(l.v[i].cfg, d, sizeof d);
      pk = plan_try(&l.v[i], d, h, want_deterministic, max_ws, &ws_k, &st, why);
    }
    if (pk) {
      cudnnBackendDestroyDescriptor(plan);
      plan = pk;
      ws = ws_k;
      keep = i;
    } else {
      g_cfg_misses++;
      TR_LOG_DEBUG(KERN, "cuDNN attention: config %d %s: config 0 runs", pick,
                   i < l.n ? "does not build" : "does not exist");
    }
  }
  if (plan) {
    exec_take(&out->ex[0], &l.v[keep], plan, ws);
    out->nex = 1;
    out->cur = 0;
    out->ws = ws;
  }
  if (plan && pick <= 0 && tune > 1) {
    int64_t cap = ws > ATUNE_WS_MAX ? ws : ATUNE_WS_MAX;
    if (cap > max_ws) cap = max_ws;
    const char* whyk = "";
    for (int i = keep + 1; out->nex < tune && out->nex < ATUNE_MAX; i++) {
      // (config 0's engine config has moved to out->ex[0])
      if (i == l.n && !list_more(graph, &l, out->ex[0].cfg, &source, &variants))
        break;
      cfg_desc(l.v[i].cfg, d, sizeof d);
      int64_t ws_k = 0;
      cudnnBackendDescriptor_t pk =
          plan_try(&l.v[i], d, h, want_deterministic, cap, &ws_k, &st, &whyk);
      if (!pk) continue;
      exec_take(&out->ex[out->nex++], &l.v[i], pk, ws_k);
      if (ws_k > out->ws) out->ws = ws_k;
    }
  }
  cands_release(&l);
  return plan ? CUDNN_STATUS_SUCCESS : last;
}

// dims/strides helpers: a [B, heads, rows, cols] tensor, and the row-major
// contiguous strides of one
static void dims4(int64_t* d, int64_t a, int64_t b, int64_t c, int64_t e) {
  d[0] = a;
  d[1] = b;
  d[2] = c;
  d[3] = e;
}

static float neg_inf_value(void) {
  // cudnn-frontend passes the lowest finite float to cuDNN before 9.10
  return cudnnGetVersion() < 91000 ? -3.4028234663852886e38f : -INFINITY;
}

// The causal mask on scores s (virtual fp32 [B,H,T,T]): returns the masked
// scores. The -inf constant is tensor UID_NEGINF.
static cudnnBackendDescriptor_t gb_causal(gb_t* g, cudnnBackendDescriptor_t s,
                                          const int64_t* sd, const int64_t* ss,
                                          cudnnBackendDescriptor_t neginf) {
  cudnnBackendDescriptor_t row = gb_virt(g, CUDNN_DATA_INT32, sd, ss);
  cudnnBackendDescriptor_t col = gb_virt(g, CUDNN_DATA_INT32, sd, ss);
  cudnnBackendDescriptor_t keep = gb_virt(g, CUDNN_DATA_BOOLEAN, sd, ss);
  cudnnBackendDescriptor_t out = gb_virt(g, CUDNN_DATA_FLOAT, sd, ss);
  gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, row, 2);
  gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, s, NULL, NULL, col, 3);
  gb_pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep,
        -1);
  // out = keep ? s : -inf
  gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neginf, keep,
        out, -1);
  return out;
}

// The padding mask of a ragged graph on scores s (virtual fp32
// [D',H,S,S]): entries at row >= len_q or column >= len_kv of their
// sequence become -inf (cudnn-frontend's padding_mask: GEN_INDEX in int32,
// CMP_LT against the lengths, LOGICAL_AND, BINARY_SELECT).
static cudnnBackendDescriptor_t gb_padding(gb_t* g, cudnnBackendDescriptor_t s,
                                           const int64_t* sd, const int64_t* ss,
                                           cudnnBackendDescriptor_t neginf,
                                           cudnnBackendDescriptor_t len_q,
                                           cudnnBackendDescriptor_t len_kv) {
  cudnnBackendDescriptor_t row = gb_virt(g, CUDNN_DATA_INT32, sd, ss);
  cudnnBackendDescriptor_t col = gb_virt(g, CUDNN_DATA_INT32, sd, ss);
  cudnnBackendDescriptor_t rin = gb_virt(g, CUDNN_DATA_BOOLEAN, sd, ss);
  cudnnBackendDescriptor_t cin = gb_virt(g, CUDNN_DATA_BOOLEAN, sd, ss);
  cudnnBackendDescriptor_t keep = gb_virt(g, CUDNN_DATA_BOOLEAN, sd, ss);
  cudnnBackendDescriptor_t out = gb_virt(g, CUDNN_DATA_FLOAT, sd, ss);
  gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, NULL, NULL, row, 2);
  gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, NULL, NULL, col, 3);
  gb_pw(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, row, len_q, NULL, rin,
        -1);
  gb_pw(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, col, len_kv, NULL, cin,
        -1);
  gb_pw(g, CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, rin, cin, NULL,
        keep, -1);
  gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, neginf, keep,
        out, -1);
  return out;
}

// Shared inputs of both graphs: Q, K^T, scale, -inf; scores
// S = Q K^T * scale (virtual fp32), padded in a ragged graph.
typedef struct {
  int64_t qd[4], qstr[4];    // Q
  int64_t ktd[4], ktstr[4];  // K^T
  int64_t vd[4], vstr[4];    // V
  int64_t od[4], ostr[4];    // O, dO
  int64_t sd[4], sstr[4];    // scores [B,H,T,T]
  int64_t rd[4], rstr[4];    // row statistics [B,H,T,1] (virtual)
  int64_t rtstr[4];          // Stats in memory: [B,H,T] as rstr,
                             // or a ragged graph's [rows, H] (TH layout)
  int64_t std_[4], sttr[4];  // transposed scores [B,H,Tk,Tq]
} shapes_t;

// A ragged graph's offsets and lengths (all NULL in a dense graph): the
// element offset where each sequence begins in Q, K and V, O and dO,
// Stats, dQ, dK and dV (rows times each one's row stride), and
// each sequence's rows (SEQ_LEN_Q and SEQ_LEN_KV: the same lengths).
typedef struct {
  cudnnBackendDescriptor_t q, kv, o, st, dq, dkv;
  cudnnBackendDescriptor_t len_q, len_kv;
} rag_t;

static void rag_of(gb_t* g, const akey_t* k, rag_t* r) {
  memset(r, 0, sizeof *r);
  if (!k->docs) return;
  int64_t od[4], ld[4], one[4];
  dims4(od, k->B + 1, 1, 1, 1);
  dims4(ld, k->B, 1, 1, 1);
  dims4(one, 1, 1, 1, 1);
  r->q = gb_tensor(g, UID_RO_Q, CUDNN_DATA_INT64, od, one, false, false);
  r->kv = gb_tensor(g, UID_RO_KV, CUDNN_DATA_INT64, od, one, false, false);
  r->o = gb_tensor(g, UID_RO_O, CUDNN_DATA_INT64, od, one, false, false);
  r->st = gb_tensor(g, UID_RO_STATS, CUDNN_DATA_INT64, od, one, false, false);
  if (k->bwd) {
    r->dq = gb_tensor(g, UID_RO_DQ, CUDNN_DATA_INT64, od, one, false, false);
    r->dkv = gb_tensor(g, UID_RO_DKV, CUDNN_DATA_INT64, od, one, false, false);
  }
  r->len_q = gb_tensor(g, UID_LEN_Q, CUDNN_DATA_INT32, ld, one, false, false);
  r->len_kv = gb_tensor(g, UID_LEN_KV, CUDNN_DATA_INT32, ld, one, false, false);
}

static void shapes_of(const akey_t* k, shapes_t* s) {
  int64_t B = k->B, T = k->T, H = k->H, KVH = k->KVH, D = k->D;
  dims4(s->qd, B, H, T, D);
  dims4(s->qstr, T * k->qs, D, k->qs, 1);
  dims4(s->ktd, B, KVH, D, T);
  dims4(s->ktstr, T * k->kvs, D, 1, k->kvs);
  dims4(s->vd, B, KVH, T, D);
  dims4(s->vstr, T * k->kvs, D, k->kvs, 1);
  dims4(s->od, B, H, T, D);
  dims4(s->ostr, T * H * D, D, H * D, 1);
  dims4(s->sd, B, H, T, T);
  dims4(s->sstr, H * T * T, T * T, T, 1);
  dims4(s->rd, B, H, T, 1);
  dims4(s->rstr, H * T, T, 1, 1);
  if (k->docs)
    dims4(s->rtstr, H * T, 1, H, 1);
  else
    dims4(s->rtstr, H * T, T, 1, 1);
  dims4(s->std_, B, H, T, T);
  dims4(s->sttr, H * T * T, T * T, 1, T);
}

// S = Q K^T * scale, then (ragged) the padding mask. *neginf: the -inf
// constant when a mask will need it (causal or ragged), else NULL (its
// UID is then not bound).
static cudnnBackendDescriptor_t gb_scores(gb_t* g, const shapes_t* s,
                                          const akey_t* k, const rag_t* r,
                                          cudnnBackendDescriptor_t* q_out,
                                          cudnnBackendDescriptor_t* kt_out,
                                          cudnnBackendDescriptor_t* scale_out,
                                          cudnnBackendDescriptor_t* neginf) {
  cudnnBackendDescriptor_t q = gb_tensor_r(
      g, UID_Q, CUDNN_DATA_BFLOAT16, s->qd, s->qstr, false, false, r->q);
  cudnnBackendDescriptor_t kt = gb_tensor_r(
      g, UID_K, CUDNN_DATA_BFLOAT16, s->ktd, s->ktstr, false, false, r->kv);
  cudnnBackendDescriptor_t scale = gb_scalar(g, UID_SCALE);
  cudnnBackendDescriptor_t s0 = gb_virt(g, CUDNN_DATA_FLOAT, s->sd, s->sstr);
  cudnnBackendDescriptor_t s1 = gb_virt(g, CUDNN_DATA_FLOAT, s->sd, s->sstr);
  gb_matmul(g, q, kt, s0, r->len_q, r->len_kv, NULL);
  gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s0, scale, NULL, s1, -1);
  *q_out = q;
  *kt_out = kt;
  *scale_out = scale;
  *neginf = k->causal || k->docs ? gb_scalar(g, UID_NEGINF) : NULL;
  if (!k->docs) return s1;
  return gb_padding(g, s1, s->sd, s->sstr, *neginf, r->len_q, r->len_kv);
}

static void graph_fwd(gb_t* g, const akey_t* k) {
  shapes_t s;
  shapes_of(k, &s);
  rag_t r;
  rag_of(g, k, &r);
  cudnnBackendDescriptor_t q, kt, scale, neginf;
  cudnnBackendDescriptor_t sm =
      gb_scores(g, &s, k, &r, &q, &kt, &scale, &neginf);
  if (k->causal) sm = gb_causal(g, sm, s.sd, s.sstr, neginf);
  cudnnBackendDescriptor_t v = gb_tensor_r(g, UID_V, CUDNN_DATA_BFLOAT16, s.vd,
                                           s.vstr, false, false, r.kv);
  cudnnBackendDescriptor_t o = gb_tensor_r(g, UID_O, CUDNN_DATA_BFLOAT16, s.od,
                                           s.ostr, false, false, r.o);
  cudnnBackendDescriptor_t stats = gb_tensor_r(
      g, UID_STATS, CUDNN_DATA_FLOAT, s.rd, s.rtstr, false, false, r.st);
  cudnnBackendDescriptor_t mx = gb_virt(g, CUDNN_DATA_FLOAT, s.rd, s.rstr);
  cudnnBackendDescriptor_t sub = gb_virt(g, CUDNN_DATA_FLOAT, s.sd, s.sstr);
  cudnnBackendDescriptor_t ex = gb_virt(g, CUDNN_DATA_FLOAT, s.sd, s.sstr);
  cudnnBackendDescriptor_t sum = gb_virt(g, CUDNN_DATA_FLOAT, s.rd, s.rstr);
  cudnnBackendDescriptor_t lg = gb_virt(g, CUDNN_DATA_FLOAT, s.rd, s.rstr);
  // P in the operands' type, as bmm2 requires
  cudnnBackendDescriptor_t p = gb_virt(g, CUDNN_DATA_BFLOAT16, s.sd, s.sstr);
  gb_reduce(g, CUDNN_REDUCE_TENSOR_MAX, sm, mx);
  gb_pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, sm, mx, NULL, sub, -1);
  gb_pw(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, ex, -1);
  gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, ex, sum);
  gb_pw(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, sum, NULL, NULL, lg, -1);
  gb_pw(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, mx, lg, NULL, stats, -1);
  gb_pw(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, ex, sum, NULL, p, -1);
  gb_matmul(g, p, v, o, r.len_q, NULL, r.len_kv);
}

// dK or dV (c) = a b summed over the query heads of a group (GQA), or
// written directly. The per-head products are a virtual [B,H,T,D] tensor,
// in a ragged graph too (cudnn-frontend's path without max_total_seq_len).
static void gb_group_sum(gb_t* g, const akey_t* k, cudnnBackendDescriptor_t a,
                         cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c,
                         const rag_t* r) {
  if (k->H == k->KVH) {
    gb_matmul(g, a, b, c, r->len_kv, NULL, r->len_q);
    return;
  }
  int64_t B = k->B, T = k->T, H = k->H, D = k->D;
  int64_t fd[4], fs[4];
  dims4(fd, B, H, T, D);
  dims4(fs, H * T * D, T * D, D, 1);
  cudnnBackendDescriptor_t full = gb_virt(g, CUDNN_DATA_BFLOAT16, fd, fs);
  gb_matmul(g, a, b, full, r->len_kv, NULL, r->len_q);
  gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, c);
}

// direct_dq: dQ = dS K straight into dQ; else through the fp32 accumulator
// UID_DQACC and an identity into dQ.
static void graph_bwd(gb_t* g, const akey_t* k, bool direct_dq) {
  shapes_t s;
  shapes_of(k, &s);
  rag_t r;
  rag_of(g, k, &r);
  int64_t B = k->B, T = k->T, H = k->H, KVH = k->KVH, D = k->D;
  cudnnBackendDescriptor_t q, kt, scale, neginf;
  cudnnBackendDescriptor_t one = gb_scalar(g, UID_ONE);
  int64_t vtd[4], vtstr[4];
  dims4(vtd, B, KVH, D, T);
  dims4(vtstr, T * k->kvs, D, 1, k->kvs);
  cudnnBackendDescriptor_t vt = gb_tensor_r(g, UID_V, CUDNN_DATA_BFLOAT16, vtd,
                                            vtstr, false, false, r.kv);
  cudnnBackendDescriptor_t o = gb_tensor_r(g, UID_O, CUDNN_DATA_BFLOAT16, s.od,
                                           s.ostr, false, false, r.o);
  cudnnBackendDescriptor_t dout = gb_tensor_r(
      g, UID_DO, CUDNN_DATA_BFLOAT16, s.od, s.ostr, false, false, r.o);
  cudnnBackendDescriptor_t stats = gb_tensor_r(
      g, UID_STATS, CUDNN_DATA_FLOAT, s.rd, s.rtstr, false, false, r.st);
  // Dsum [B,H,T] in the workspace, dense in a ragged graph too
  cudnnBackendDescriptor_t dsum =
      gb_tensor(g, UID_DSUM, CUDNN_DATA_FLOAT, s.rd, s.rstr, false, false);
  int64_t dqstr[4], dkvstr[4];
  dims4(dqstr, T * k->dqs, D, k->dqs, 1);
  dims4(dkvstr, T * k->dkvs, D, k->dkvs, 1);
  cudnnBackendDescriptor_t dq = gb_tensor_r(g, UID_DQ, CUDNN_DATA_BFLOAT16,
                                            s.qd, dqstr, false, false, r.dq);
  cudnnBackendDescriptor_t dk = gb_tensor_r(g, UID_DK, CUDNN_DATA_BFLOAT16,
                                            s.vd, dkvstr, false, false, r.dkv);
  cudnnBackendDescriptor_t dv = gb_tensor_r(g, UID_DV, CUDNN_DATA_BFLOAT16,
                                            s.vd, dkvstr, false, false, r.dkv);

  // Dsum = rowsum(dO * O) * 1
  int64_t pdstr[4];
  dims4(pdstr, H * T * D, T * D, H * D, 1);
  cudnnBackendDescriptor_t dxo = gb_virt(g, CUDNN_DATA_FLOAT, s.od, pdstr);
  cudnnBackendDescriptor_t rsum = gb_virt(g, CUDNN_DATA_FLOAT, s.rd, s.rstr);
  gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, o, NULL, dxo, -1);
  gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dxo, rsum);
  gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, rsum, one, NULL, dsum, -1);

  // P = exp(mask(S) - Stats): a dense graph masks before the subtraction;
  // a ragged one pads before it and applies the causal mask after it (and
  // pads again there before cuDNN 9.10), in cudnn-frontend's order
  cudnnBackendDescriptor_t sm =
      gb_scores(g, &s, k, &r, &q, &kt, &scale, &neginf);
  if (k->causal && !k->docs) sm = gb_causal(g, sm, s.sd, s.sstr, neginf);
  cudnnBackendDescriptor_t sub = gb_virt(g, CUDNN_DATA_FLOAT, s.sd, s.sstr);
  cudnnBackendDescriptor_t p = gb_virt(g, CUDNN_DATA_FLOAT, s.sd, s.sstr);
  gb_pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, sm, stats, NULL, sub, -1);
  if (k->docs) {
    if (cudnnGetVersion() < 91000)
      sub = gb_padding(g, sub, s.sd, s.sstr, neginf, r.len_q, r.len_kv);
    if (k->causal) sub = gb_causal(g, sub, s.sd, s.sstr, neginf);
  }
  gb_pw(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, sub, NULL, NULL, p, -1);

  // dV = P^T dO (summed over the group's query heads for GQA)
  cudnnBackendDescriptor_t pt =
      gb_virt(g, CUDNN_DATA_BFLOAT16, s.std_, s.sttr);
  gb_reshape(g, p, pt);
  gb_group_sum(g, k, pt, dout, dv, &r);

  // dS = P (dO V^T - Dsum) * scale
  cudnnBackendDescriptor_t dp = gb_virt(g, CUDNN_DATA_FLOAT, s.sd, s.sstr);
  cudnnBackendDescriptor_t dp1 = gb_virt(g, CUDNN_DATA_FLOAT, s.sd, s.sstr);
  cudnnBackendDescriptor_t dp2 = gb_virt(g, CUDNN_DATA_FLOAT, s.sd, s.sstr);
  cudnnBackendDescriptor_t ds = gb_virt(g, CUDNN_DATA_FLOAT, s.sd, s.sstr);
  gb_matmul(g, dout, vt, dp, r.len_q, r.len_kv, NULL);
  gb_pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp, dsum, NULL, dp1, -1);
  gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp1, p, NULL, dp2, -1);
  gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp2, scale, NULL, ds, -1);

  // dK = dS^T Q (summed over the group for GQA)
  cudnnBackendDescriptor_t dst =
      gb_virt(g, CUDNN_DATA_BFLOAT16, s.std_, s.sttr);
  gb_reshape(g, ds, dst);
  gb_group_sum(g, k, dst, q, dk, &r);

  // dQ = dS K (K seen untransposed again)
  cudnnBackendDescriptor_t kk = gb_tensor_r(g, -1, CUDNN_DATA_BFLOAT16, s.vd,
                                            s.vstr, true, false, r.kv);
  gb_reshape(g, kt, kk);
  if (direct_dq) {
    gb_matmul(g, ds, kk, dq, r.len_q, NULL, r.len_kv);
  } else {
    // fp32 [B,H,T,D] contiguous, in a ragged graph too (B sequences of
    // T rows: cudnn-frontend's path without max_total_seq_len)
    int64_t fhd[4], fhstr[4];
    dims4(fhd, B, H, T, D);
    dims4(fhstr, H * T * D, T * D, D, 1);
    cudnnBackendDescriptor_t acc = gb_tensor(g, UID_DQACC, CUDNN_DATA_FLOAT,
                                             fhd, fhstr, false, false);
    gb_matmul(g, ds, kk, acc, r.len_q, NULL, r.len_kv);
    gb_pw(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, acc, NULL, NULL, dq,
          -1);
  }
}

static void key_desc(const akey_t* k, char* buf, size_t n) {
  snprintf(buf, n, "%s%s %s=%d %s=%d H=%d/%d D=%d strides %lld/%lld",
           k->bwd ? "backward" : "forward",
           k->docs ? " (documents)" : k->causal ? "" : " (full)",
           k->docs ? "sequences" : "B", k->B, k->docs ? "rows" : "T", k->T,
           k->H, k->KVH, k->D, (long long)k->qs, (long long)k->kvs);
}

// Build the plan for k (g_lock held). A shape cuDNN declines is kept with
// supported = 0 after one warning.
static int plan_build(const akey_t* k, aplan_t** out) {
  cudnnHandle_t h;
  TR_CHECK(handle_get(k->dev, &h));
  aplan_t* p = (aplan_t*)calloc(1, sizeof *p);
  if (!p) return TR_ENOMEM;
  p->key = *k;
  const char* why = "";
  cudnnStatus_t st = CUDNN_STATUS_NOT_SUPPORTED;
  // The backward's two graphs, in order: without debug.deterministic the
  // atomic dQ graph first (an fp32 accumulator of O(T) bytes), then the
  // direct one; with it the direct graph first (bit-reproducible, but its
  // engines keep dS in a workspace of B H T^2 bf16: 16 GiB at T = 16384)
  // and the atomic one only with warn_only.
  int det = k->det;
  int tries = !k->bwd ? 1 : det == 1 ? 1 : 2;
  // Some engine configs want a workspace that grows with T^2 (seen with
  // the full graph of long context-parallel chunks: a 105 GB request at
  // 28672 rows); such a config is passed over when it would take more
  // than a quarter of the device memory free now, and when every one
  // would, cuDNN declines (the flash kernel runs the shape).
  size_t free_b = 0, total_b = 0;
  int64_t max_ws = INT64_MAX;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
    max_ws = (int64_t)(free_b / 4) > ((int64_t)1 << 28) ? (int64_t)(free_b / 4)
                                                        : ((int64_t)1 << 28);
  else
    (void)cudaGetLastError();
  const char* why_direct = ""; /* why the direct-dQ graph got no plan */
  int pick = g_cfg_pick >= 0 ? g_cfg_pick
                             : (int)tr_param_int(TR_PARAM_CUDNN_ATTN_CONFIG);
  // timed picks differ from run to run, as timings do: none under
  // [debug] deterministic
  int tune = g_tune >= 1 ? g_tune : (int)tr_param_int(TR_PARAM_CUDNN_ATTN_TUNE);
  // (before cuDNN 9.6 the caller zeroes the backward's dQ accumulator: once)
  if (tr__cuda_deterministic() || (k->bwd && cudnnGetVersion() < 90600))
    tune = 1;
  for (int t = 0; t < tries && !p->nex; t++) {
    gb_t* g = (gb_t*)calloc(1, sizeof *g);
    if (!g) {
      free(p);
      return TR_ENOMEM;
    }
    g->next_uid = UID_VIRTUAL;
    bool direct = k->bwd && (det ? t == 0 : t == 1);
    if (k->bwd)
      graph_bwd(g, k, direct);
    else
      graph_fwd(g, k);
    st = plan_from_graph(g, h, direct, max_ws, pick, tune, p, &why);
    if (!p->nex) {
      if (direct) why_direct = why;
      gb_release(g);
      free(g);
    } else {
      p->graph = g;
      p->supported = 1;
      p->direct_dq = direct;
      p->tune = p->nex > 1 ? ATUNE_READY : ATUNE_OFF;
      if (p->ex[0].ws > ((int64_t)1 << 28)) {
        char d[128];
        key_desc(k, d, sizeof d);
        TR_LOG_WARN(KERN,
                    "cuDNN attention %s: its plan takes a %.2f GiB "
                    "workspace at each call",
                    d, (double)p->ex[0].ws / (double)((int64_t)1 << 30));
      }
      if (k->bwd && !direct && det) {
        char d[128];
        key_desc(k, d, sizeof d);
        TR_LOG_WARN(KERN,
                    "cuDNN attention %s: no deterministic engine (%s), "
                    "using the atomic dQ graph (results not "
                    "bit-reproducible%s)",
                    d, why_direct,
                    tr__cuda_deterministic()
                        ? "; debug.deterministic_warn_only allows it"
                        : "");
      }
    }
  }
  if (!p->nex) {
    char d[128];
    key_desc(k, d, sizeof d);
    TR_LOG_WARN(KERN,
                "cuDNN %d declined attention %s (%s: %s); the flash/SIMT "
                "kernels take this shape unless cuDNN was asked for "
                "explicitly",
                (int)cudnnGetVersion(), d, why, st_name(st));
  }
  *out = p;
  return 0;
}

// The cached plan for k, built on first use (g_lock held).
static int plan_get(const akey_t* k, aplan_t** out) {
  for (int i = 0; i < g_n_plans; i++)
    if (memcmp(&g_plans[i]->key, k, sizeof *k) == 0) {
      *out = g_plans[i];
      return 0;
    }
  if (g_n_plans == g_cap_plans) {
    int cap = g_cap_plans ? 2 * g_cap_plans : 32;
    aplan_t** np = (aplan_t**)realloc(g_plans, sizeof(aplan_t*) * (size_t)cap);
    if (!np) return TR_ENOMEM;
    g_plans = np;
    g_cap_plans = cap;
  }
  TR_CHECK(plan_build(k, out));
  g_plans[g_n_plans++] = *out;
  return 0;
}

// Run execution plan `plan` with the given tensors (g_lock held): a cuDNN
// status, quiet.
static cudnnStatus_t plan_exec(cudnnBackendDescriptor_t plan, cudnnHandle_t h,
                               int n, const int64_t* uids, void** ptrs,
                               void* ws) {
  cudnnBackendDescriptor_t vp = NULL;
  cudnnStatus_t st =
      cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                  CUDNN_TYPE_INT64, n, uids);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                  CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                  CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(vp);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(h, plan, vp);
  if (vp) cudnnBackendDestroyDescriptor(vp);
  return st;
}

// A candidate's run for tr__tune_rounds: the call's tensors.
typedef struct {
  aplan_t* p;
  cudnnHandle_t h;
  int n;
  const int64_t* uids;
  void** ptrs;
  void* ws;
} cand_ctx_t;

static int cand_run(void* ctx, int i) {
  cand_ctx_t* c = (cand_ctx_t*)ctx;
  return plan_exec(c->p->ex[i].plan, c->h, c->n, c->uids, c->ptrs, c->ws) !=
         CUDNN_STATUS_SUCCESS;
}

// Enqueue the timings of p's candidates on s with the call's tensors,
// before its real run (g_lock held): each candidate once to warm up, then
// interleaved rounds (tr__tune_rounds). Every candidate computes the whole
// result, and the real run after them writes it again. The host never
// waits: tr_kern_cuda_attn_tune_apply reads the timings. A plan whose
// timings cannot start (an error pending, stream capture, a failed launch
// of config 0) keeps config 0. Quiet: what fails here leaves no error
// behind.
static void tune_start(aplan_t* p, cudnnHandle_t h, int n, const int64_t* uids,
                       void** ptrs, void* ws, cudaStream_t s) {
  p->tune = ATUNE_OFF;
  if (!tr__tune_may_start(s)) return;
  cand_ctx_t cc = {p, h, n, uids, ptrs, ws};
  int live[ATUNE_MAX];
  for (int i = 0; i < p->nex; i++) live[i] = cand_run(&cc, i) == 0;  // warm-up
  (void)cudaGetLastError();  // a candidate's failure is not the caller's
  if (tr__tune_rounds(&p->timing, p->nex, live, cand_run, &cc, s)) {
    p->tune = ATUNE_TIMING;
    __atomic_store_n(&g_tune_pending, 1, __ATOMIC_RELAXED);
  }
}

// Read p's timings when they have completed (no wait; g_lock held) and run
// the candidate tr__tune_pick keeps from now on. The plans not chosen stay
// built until the plans are dropped (a real run of config 0 may still be
// in flight).
static void tune_finish(aplan_t* p) {
  float best[ATUNE_MAX];
  int got = tr__tune_read(&p->timing, p->nex, best);
  if (got == 0) return;
  p->tune = ATUNE_OFF;
  int pick = got > 0 ? tr__tune_pick(best, p->nex) : -1;
  p->ws = p->ex[pick > 0 ? pick : 0].ws;
  if (pick < 0) return;
  g_tune_timed++;
  char d[128];
  key_desc(&p->key, d, sizeof d);
  TR_LOG_DEBUG(KERN,
               "cuDNN attention %s: config 0 %.4f ms, candidate %d of %d "
               "%.4f ms: %s",
               d, (double)best[0], pick, p->nex, (double)best[pick],
               pick ? "switched" : "config 0 kept");
  if (pick) {
    g_tune_changed++;
    p->cur = pick;
  }
}

// Run plan p's chosen config with the given tensors (g_lock held); its
// candidates' timings first at its first run.
static int plan_run(aplan_t* p, cudnnHandle_t h, int n, const int64_t* uids,
                    void** ptrs, void* ws, cudaStream_t s) {
  if (p->tune == ATUNE_READY) tune_start(p, h, n, uids, ptrs, ws, s);
  cudnnStatus_t st = plan_exec(p->ex[p->cur].plan, h, n, uids, ptrs, ws);
  if (st != CUDNN_STATUS_SUCCESS) {
    TR_LOG_ERROR(KERN, "cuDNN attention execute failed: %s", st_name(st));
    return TR_ECUDA;
  }
  return 0;
}

// Plan and handle for k with the stream set (takes g_lock; the caller
// unlocks). TR_EUNSUPPORTED when cuDNN declined this shape.
static int prepare(const akey_t* k, cudaStream_t s, aplan_t** p,
                   cudnnHandle_t* h) {
  pthread_mutex_lock(&g_lock);
  int rc = plan_get(k, p);
  if (rc == 0 && !(*p)->supported) rc = TR_EUNSUPPORTED;
  if (rc == 0) rc = handle_get(k->dev, h);
  if (rc == 0) {
    cudnnStatus_t st = cudnnSetStream(*h, s);
    if (st != CUDNN_STATUS_SUCCESS) {
      TR_LOG_ERROR(KERN, "cudnnSetStream failed: %s", st_name(st));
      rc = TR_ECUDA;
    }
  }
  return rc;
}

static size_t round256(int64_t n) { return (size_t)((n + 255) / 256 * 256); }

// ---- y[r, c] += x[r, c] over rows x width, strides ys (y) and xs (x) ----

static __global__ void acc_rows_kernel(bf16* y, const bf16* x, int64_t rows,
                                int width, int64_t ys, int64_t xs) {
  int64_t n = rows * width;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / width, c = i % width;
    float v = __bfloat162float(y[r * ys + c]) + __bfloat162float(x[r * xs + c]);
    y[r * ys + c] = __float2bfloat16_rn(v);
  }
}

static int acc_rows(bf16* y, const bf16* x, int64_t rows, int width,
                    int64_t ys, int64_t xs, cudaStream_t s) {
  if (rows * width == 0) return 0;
  unsigned b = tr__blocks(rows * width, 256);
  acc_rows_kernel<<<b < 8192u ? b : 8192u, 256, 0, s>>>(y, x, rows, width, ys,
                                                        xs);
  return TR_CUDA_LAUNCHED("acc_rows_kernel");
}

// ---- documents: doc_start [B*T] -> the sequences of a ragged graph ----
//
// A sequence starts at each row whose position is 0 or whose doc_start
// differs from the row before; the table is one of contiguous documents
// (what the ragged graph computes exactly) when each such row's doc_start
// is its own position. docs_scan_kernel (one block) writes the first row
// of each sequence in order, then the row count after the last, and
// info = {sequences, longest, not contiguous documents}.

#define DOCS_THREADS 1024

static __device__ inline bool docs_starts(const int32_t* ds, int64_t r,
                                          int T) {
  return r % T == 0 || ds[r] != ds[r - 1];
}

static __global__ void __launch_bounds__(DOCS_THREADS)
    docs_scan_kernel(int32_t* starts, int32_t* info, const int32_t* ds, int T,
                     int64_t N) {
  __shared__ int32_t warp_sum[DOCS_THREADS / 32];
  __shared__ int32_t s_longest, s_bad;
  int t = threadIdx.x, lane = t % 32, w = t / 32;
  int64_t per = (N + DOCS_THREADS - 1) / DOCS_THREADS;
  int64_t r0 = per * t < N ? per * t : N;
  int64_t r1 = r0 + per < N ? r0 + per : N;
  if (t == 0) s_longest = s_bad = 0;
  int cnt = 0, bad = 0;
  for (int64_t r = r0; r < r1; r++)
    if (docs_starts(ds, r, T)) {
      cnt++;
      if (ds[r] != (int32_t)(r % T)) bad = 1;
    }
  // exclusive prefix sum of the counts: within each warp, then over warps
  int x = cnt;
  for (int o = 1; o < 32; o *= 2) {
    int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sum[w] = x;
  __syncthreads();
  if (w == 0) {
    int v = warp_sum[lane];
    for (int o = 1; o < 32; o *= 2) {
      int y = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += y;
    }
    warp_sum[lane] = v;
  }
  __syncthreads();
  int first = x - cnt + (w ? warp_sum[w - 1] : 0);
  int n = warp_sum[DOCS_THREADS / 32 - 1];
  int at = first;
  for (int64_t r = r0; r < r1; r++)
    if (docs_starts(ds, r, T)) starts[at++] = (int32_t)r;
  if (t == 0) starts[n] = (int32_t)N;
  if (bad) atomicOr(&s_bad, 1);
  __syncthreads();
  int longest = 0;
  for (int j = first; j < first + cnt; j++)
    longest = max(longest, starts[j + 1] - starts[j]);
  atomicMax(&s_longest, longest);
  __syncthreads();
  if (t == 0) {
    info[0] = n;
    info[1] = s_longest;
    info[2] = s_bad;
  }
}

// The element offsets of a ragged graph: RO_N arrays of pitch entries,
// array j holding sequence i's first row times mult[j] for i <= nseq
// (sequences from n = info[0], the scan's count, on are empty: they begin
// at the end, N), and len[i] each sequence's rows, at most the graph's
// rows (a host count that was not exact gives wrong attention, never an
// access beyond the graph's buffers).
enum { RO_Q, RO_KV, RO_O, RO_STATS, RO_DQ, RO_DKV, RO_N };

typedef struct {
  int64_t v[RO_N];
} ro_mult_t;

static __global__ void docs_fill_kernel(int64_t* ro, int32_t* len,
                                        const int32_t* starts,
                                        const int32_t* info, int nseq, int rows,
                                        int64_t pitch, int64_t N,
                                        ro_mult_t mult) {
  int n = min(info[0], nseq);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= nseq;
       i += gridDim.x * blockDim.x) {
    int64_t row = i < n ? starts[i] : N;
    for (int j = 0; j < RO_N; j++) ro[j * pitch + i] = row * mult.v[j];
    if (i < nseq) len[i] = i < n ? min(starts[i + 1] - starts[i], rows) : 0;
  }
}

// lse [B,H,T] <-> the ragged graph's Stats [B*T, H] (to_rows: lse to
// rows)
static __global__ void lse_rows_kernel(float* rows, float* lse, int64_t N,
                                       int T, int H, int to_rows) {
  int64_t n = N * H;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = e / H, h = e % H, b = r / T, t = r % T;
    float* l = lse + (b * H + h) * T + t;
    if (to_rows)
      rows[e] = *l;
    else
      *l = rows[e];
  }
}

static int lse_rows(float* rows, float* lse, int64_t N, int T, int H,
                    int to_rows, cudaStream_t s) {
  unsigned b = tr__blocks(N * H, 256);
  lse_rows_kernel<<<b < 8192u ? b : 8192u, 256, 0, s>>>(rows, lse, N, T, H,
                                                        to_rows);
  return TR_CUDA_LAUNCHED("lse_rows_kernel");
}

static int64_t pow2_at_least(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

// A call's documents: their first rows (device, freed by docs_release)
// and the buckets of its plan.
typedef struct {
  int32_t* starts;  // [n + 1] device, from the stream's pool
  int32_t* info;    // the scan's {count, longest, not contiguous}, device
  int n;            // documents
  int nseq, rows;   // buckets: sequences D' and rows S of the graph
} docs_t;

static void docs_release(docs_t* d, cudaStream_t s) {
  tr__cuda_tmp_free(d->starts, s);
  d->starts = NULL;
}

// Find the documents of m's doc_start and choose the buckets: D' the next
// power of two of the count and S that of the longest (at least 64, as
// cudnn-frontend's tests take: cuDNN has a known problem with 1 x 1
// sequences), so that a plan serves many batches. The count comes from
// the host (m->n_docs, m->longest_doc) or, when it has none, from the
// device, the host waiting for the stream here; the first rows are always
// found on the device, in the stream's order. 1: the documents go to a
// ragged graph; 0: plain causal (one document per row, d->starts NULL);
// TR_EUNSUPPORTED: not contiguous documents, or buckets whose padding
// would cost more than it saves (D' S above 32 B T rows: the fused
// kernels run a tile per 128 rows of each padded sequence and head), or
// whose backward's dense Dsum and dQ accumulator (D' S H (D + 1) fp32)
// would take more than a quarter of the free device memory, or H not a
// multiple of 4 (a sequence's Stats rows [rows, H] fp32 would not start
// 16-byte aligned). Not contiguous documents are found only by the
// device count (a host count vouches for its table).
static int docs_find(docs_t* d, const tr_kern_attn_mask_t* m, int B, int T,
                     int H, int D, cudaStream_t s) {
  memset(d, 0, sizeof *d);
  int64_t N = (int64_t)B * T;
  if (cudnnGetVersion() < 90600) {
    static int warned;
    if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
      TR_LOG_WARN(KERN,
                  "cuDNN %d: document masks need cuDNN 9.6 or later (64-bit "
                  "ragged offsets with grouped-query heads); the flash/SIMT "
                  "kernels take them",
                  (int)cudnnGetVersion());
    return TR_EUNSUPPORTED;
  }
  if (N >= INT32_MAX || H % 4 != 0) return TR_EUNSUPPORTED;
  int counted = m->n_docs > 0;
  int32_t h[3] = {m->n_docs, m->longest_doc, 0};
  if (counted && h[0] == B) return 0; /* one document per row: causal */
  size_t sb = round256((N + 1) * (int64_t)sizeof(int32_t));
  void* p = NULL;
  TR_CHECK(tr__cuda_tmp_alloc(&p, sb + 256, s));
  d->starts = (int32_t*)p;
  d->info = (int32_t*)((char*)p + sb);
  docs_scan_kernel<<<1, DOCS_THREADS, 0, s>>>(d->starts, d->info, m->doc_start,
                                              T, N);
  int rc = TR_CUDA_LAUNCHED("docs_scan_kernel");
  if (rc == 0 && !counted)
    rc = TR_CUDA_CALL(
        cudaMemcpyAsync(h, d->info, sizeof h, cudaMemcpyDeviceToHost, s));
  if (rc == 0 && !counted) rc = TR_CUDA_CALL(cudaStreamSynchronize(s));
  d->n = h[0];
  int64_t nseq = pow2_at_least(h[0]);
  int64_t rows = pow2_at_least(h[1] > 64 ? h[1] : 64);
  if (rc == 0 && h[2]) {
    TR_LOG_DEBUG(KERN, "cuDNN attention: doc_start is not a table of "
                       "contiguous documents");
    rc = TR_EUNSUPPORTED;
  } else if (rc == 0 && nseq * rows > 32 * N) {
    TR_LOG_DEBUG(KERN,
                 "cuDNN attention: %d documents of up to %d rows in %lld "
                 "rows: too much padding for a ragged graph",
                 h[0], h[1], (long long)N);
    rc = TR_EUNSUPPORTED;
  }
  if (rc == 0 && h[0] != B) {
    // the backward's dense Dsum and dQ accumulator over the padded rows
    int64_t need = nseq * rows * H * (int64_t)(D + 1) * 4;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess &&
        need > (int64_t)(free_b / 4)) {
      TR_LOG_DEBUG(KERN,
                   "cuDNN attention: %d documents of up to %d rows would "
                   "take %.2f GiB of workspace, more than a quarter of the "
                   "free device memory",
                   h[0], h[1], need / 1073741824.0);
      rc = TR_EUNSUPPORTED;
    } else {
      rc = 1;
    }
  }  // else one document per row: causal
  if (rc != 1) docs_release(d, s);
  d->nseq = (int)nseq;
  d->rows = (int)rows;
  return rc;
}

// The offsets and lengths of d's graph at ro (RO_N arrays of pitch
// entries, 256-byte aligned) and len.
static int64_t docs_pitch(const docs_t* d) {
  return (d->nseq + 1 + 31) / 32 * 32;
}

static size_t docs_bytes(const docs_t* d) {
  return round256(RO_N * docs_pitch(d) * (int64_t)sizeof(int64_t)) +
         round256(d->nseq * (int64_t)sizeof(int32_t));
}

static int docs_fill(const docs_t* d, char* at, int64_t N,
                     const ro_mult_t* mult, int64_t** ro, int32_t** len,
                     cudaStream_t s) {
  int64_t pitch = docs_pitch(d);
  *ro = (int64_t*)at;
  *len = (int32_t*)(at + round256(RO_N * pitch * (int64_t)sizeof(int64_t)));
  unsigned b = tr__blocks(d->nseq + 1, 256), grid = b < 1024u ? b : 1024u;
  docs_fill_kernel<<<grid, 256, 0, s>>>(*ro, *len, d->starts, d->info,
                                        d->nseq, d->rows, pitch, N, *mult);
  return TR_CUDA_LAUNCHED("docs_fill_kernel");
}

// ---- variant packs ----

#define VP_MAX 32

typedef struct {
  int64_t uids[VP_MAX];
  void* ptrs[VP_MAX];
  int n;
} vpack_t;

static void vp_add(vpack_t* vp, int64_t uid, void* ptr) {
  if (vp->n < VP_MAX) {
    vp->uids[vp->n] = uid;
    vp->ptrs[vp->n] = ptr;
    vp->n++;
  }
}

// The offsets and lengths of a ragged graph (k->docs).
static void vp_add_docs(vpack_t* vp, const akey_t* k, int64_t* ro,
                        int32_t* len, int64_t pitch) {
  vp_add(vp, UID_RO_Q, ro + RO_Q * pitch);
  vp_add(vp, UID_RO_KV, ro + RO_KV * pitch);
  vp_add(vp, UID_RO_O, ro + RO_O * pitch);
  vp_add(vp, UID_RO_STATS, ro + RO_STATS * pitch);
  if (k->bwd) {
    vp_add(vp, UID_RO_DQ, ro + RO_DQ * pitch);
    vp_add(vp, UID_RO_DKV, ro + RO_DKV * pitch);
  }
  vp_add(vp, UID_LEN_Q, len);
  vp_add(vp, UID_LEN_KV, len);
}

// ---- entry points (common.cuh) ----

int tr__cudnn_attn_applies(tr_dtype_t dt, int D, const void* q, const void* k,
                           const void* v, int64_t qs, int64_t kvs) {
  return dt == TR_BF16 && D % 8 == 0 && D > 0 && D <= 128 &&
         tr__aligned16(q) && tr__aligned16(k) && tr__aligned16(v) &&
         qs % 8 == 0 && kvs % 8 == 0;
}

// The key of a call; with documents (d->starts set) the ragged graph of
// d's buckets.
static void key_of(akey_t* key, int bwd, int B, int T, int H, int KVH, int D,
                   int64_t qs, int64_t kvs, int causal, const docs_t* d) {
  memset(key, 0, sizeof *key);  // padding bytes too: keys are memcmp'd
  key->bwd = bwd;
  key->causal = causal != 0;
  key->docs = d->starts != NULL;
  key->B = key->docs ? d->nseq : B;
  key->T = key->docs ? d->rows : T;
  key->H = H;
  key->KVH = KVH;
  key->D = D;
  key->qs = qs;
  key->kvs = kvs;
}

int tr__cudnn_attn_fwd(bf16* out, float* lse, const bf16* q, const bf16* k,
                       const bf16* v, int B, int T, int H, int KVH, int D,
                       int64_t qs, int64_t kvs, int causal,
                       const tr_kern_attn_mask_t* docs_mask, cudaStream_t s) {
  int64_t N = (int64_t)B * T;
  docs_t docs;
  memset(&docs, 0, sizeof docs);
  if (docs_mask) {
    int found = docs_find(&docs, docs_mask, B, T, H, D, s);
    if (found < 0) return found;
  }
  akey_t key;
  key_of(&key, 0, B, T, H, KVH, D, qs, kvs, causal, &docs);
  int rc = tr__cuda_device(&key.dev);
  if (rc < 0) {
    docs_release(&docs, s);
    return rc;
  }
  aplan_t* p = NULL;
  cudnnHandle_t h = NULL;
  rc = prepare(&key, s, &p, &h);
  // one workspace: the plan's, then (documents) the offsets and lengths
  // and the Stats rows [B*T, H]
  size_t o_docs = p ? round256(p->ws) : 0;
  size_t o_rows = o_docs + (key.docs ? docs_bytes(&docs) : 0);
  size_t total = o_rows + (key.docs ? round256(N * H * 4) : 0);
  char* ws = NULL;
  if (rc == 0) rc = tr__cuda_tmp_alloc((void**)&ws, total, s);
  if (rc == 0) {
    float scale = 1.0f / sqrtf((float)D), ninf = neg_inf_value();
    float* stats = key.docs ? (float*)(ws + o_rows) : lse;
    vpack_t vp;
    vp.n = 0;
    vp_add(&vp, UID_Q, (void*)q);
    vp_add(&vp, UID_K, (void*)k);
    vp_add(&vp, UID_V, (void*)v);
    vp_add(&vp, UID_O, out);
    vp_add(&vp, UID_STATS, stats);
    vp_add(&vp, UID_SCALE, &scale);
    if (key.causal || key.docs) vp_add(&vp, UID_NEGINF, &ninf);
    if (key.docs) {
      ro_mult_t m = {{qs, kvs, (int64_t)H * D, H, 0, 0}};
      int64_t* ro = NULL;
      int32_t* len = NULL;
      rc = docs_fill(&docs, ws + o_docs, N, &m, &ro, &len, s);
      vp_add_docs(&vp, &key, ro, len, docs_pitch(&docs));
    }
    if (rc == 0) rc = plan_run(p, h, vp.n, vp.uids, vp.ptrs, ws, s);
    if (rc == 0 && key.docs) rc = lse_rows(stats, lse, N, T, H, 0, s);
    tr__cuda_tmp_free(ws, s);
  }
  pthread_mutex_unlock(&g_lock);
  docs_release(&docs, s);
  return rc;
}

int tr__cudnn_attn_bwd(bf16* dq, bf16* dk, bf16* dv, const bf16* dout,
                       const bf16* q, const bf16* k, const bf16* v,
                       const bf16* out, const float* lse, int B, int T, int H,
                       int KVH, int D, int64_t qs, int64_t kvs, int accumulate,
                       int causal, const tr_kern_attn_mask_t* docs_mask,
                       cudaStream_t s) {
  int64_t HD = (int64_t)H * D, KD = (int64_t)KVH * D, N = (int64_t)B * T;
  docs_t docs;
  memset(&docs, 0, sizeof docs);
  if (docs_mask) {
    int found = docs_find(&docs, docs_mask, B, T, H, D, s);
    if (found < 0) return found;
  }
  akey_t key;
  key_of(&key, 1, B, T, H, KVH, D, qs, kvs, causal, &docs);
  key.det = tr__cuda_deterministic();
  // accumulate: cuDNN writes contiguous temporaries that are then added
  key.dqs = accumulate ? HD : qs;
  key.dkvs = accumulate ? KD : kvs;
  int rc = tr__cuda_device(&key.dev);
  if (rc < 0) {
    docs_release(&docs, s);
    return rc;
  }
  aplan_t* p = NULL;
  cudnnHandle_t h = NULL;
  rc = prepare(&key, s, &p, &h);
  if (rc < 0) {
    pthread_mutex_unlock(&g_lock);
    docs_release(&docs, s);
    return rc;
  }
  // one workspace: the plan's, Dsum [B,H,T] fp32 and the dQ accumulator
  // (atomic graph only: [B,H,T,D] fp32), both over the graph's B and T
  // (documents: D' sequences of S rows), the temporaries of accumulate;
  // with documents also the offsets and lengths and the Stats rows
  // [B*T, H]
  int64_t GN = (int64_t)key.B * key.T; /* the graph's rows */
  size_t o_dsum = round256(p->ws);
  size_t o_acc = o_dsum + round256(GN * H * (int64_t)sizeof(float));
  size_t acc_bytes = p->direct_dq ? 0 : round256(GN * HD * 4);
  size_t o_tmp = o_acc + acc_bytes;
  size_t tmp_bytes = accumulate ? round256(N * HD * 2) + 2 * round256(N * KD * 2)
                                : 0;
  size_t o_docs = o_tmp + tmp_bytes;
  size_t o_rows = o_docs + (key.docs ? docs_bytes(&docs) : 0);
  size_t total = o_rows + (key.docs ? round256(N * H * 4) : 0);
  char* ws = NULL;
  rc = tr__cuda_tmp_alloc((void**)&ws, total, s);
  if (rc == 0) {
    void* acc = p->direct_dq ? NULL : ws + o_acc;
    if (acc && cudnnGetVersion() < 90600)  // before 9.6 the caller zeroes it
      rc = TR_CUDA_CALL(cudaMemsetAsync(acc, 0, acc_bytes, s));
    bf16 *tq = dq, *tk = dk, *tv = dv;
    if (accumulate) {
      tq = (bf16*)(ws + o_tmp);
      tk = (bf16*)(ws + o_tmp + round256(N * HD * 2));
      tv = (bf16*)(ws + o_tmp + round256(N * HD * 2) + round256(N * KD * 2));
    }
    float* stats = (float*)lse;
    if (key.docs) {
      stats = (float*)(ws + o_rows);
      if (rc == 0) rc = lse_rows(stats, (float*)lse, N, T, H, 1, s);
    }
    float scale = 1.0f / sqrtf((float)D), ninf = neg_inf_value(), one = 1.0f;
    vpack_t vp;
    vp.n = 0;
    vp_add(&vp, UID_Q, (void*)q);
    vp_add(&vp, UID_K, (void*)k);
    vp_add(&vp, UID_V, (void*)v);
    vp_add(&vp, UID_O, (void*)out);
    vp_add(&vp, UID_DO, (void*)dout);
    vp_add(&vp, UID_STATS, stats);
    vp_add(&vp, UID_DQ, tq);
    vp_add(&vp, UID_DK, tk);
    vp_add(&vp, UID_DV, tv);
    vp_add(&vp, UID_DSUM, ws + o_dsum);
    vp_add(&vp, UID_SCALE, &scale);
    if (key.causal || key.docs) vp_add(&vp, UID_NEGINF, &ninf);
    vp_add(&vp, UID_ONE, &one);
    if (acc) vp_add(&vp, UID_DQACC, acc);
    if (key.docs) {
      ro_mult_t m = {{qs, kvs, HD, H, key.dqs, key.dkvs}};
      int64_t* ro = NULL;
      int32_t* len = NULL;
      if (rc == 0) rc = docs_fill(&docs, ws + o_docs, N, &m, &ro, &len, s);
      vp_add_docs(&vp, &key, ro, len, docs_pitch(&docs));
    }
    if (rc == 0) rc = plan_run(p, h, vp.n, vp.uids, vp.ptrs, ws, s);
    if (rc == 0 && accumulate) {
      rc = acc_rows(dq, tq, N, (int)HD, qs, HD, s);
      if (rc == 0) rc = acc_rows(dk, tk, N, (int)KD, kvs, KD, s);
      if (rc == 0) rc = acc_rows(dv, tv, N, (int)KD, kvs, KD, s);
    }
    tr__cuda_tmp_free(ws, s);
  }
  pthread_mutex_unlock(&g_lock);
  docs_release(&docs, s);
  return rc;
}

// Drop every cached plan (g_lock held).
static void plans_drop(void) {
  for (int i = 0; i < g_n_plans; i++) {
    aplan_t* p = g_plans[i];
    tr__tune_free(&p->timing);
    for (int j = 0; j < p->nex; j++) exec_release(&p->ex[j]);
    if (p->graph) {
      gb_release(p->graph);
      free(p->graph);
    }
    free(p);
  }
  free(g_plans);
  g_plans = NULL;
  g_n_plans = g_cap_plans = 0;
}

extern "C" void tr_kern_cuda_set_attn_config(int k) {
  pthread_mutex_lock(&g_lock);
  g_cfg_pick = k < 0 ? -1 : k;
  plans_drop();
  pthread_mutex_unlock(&g_lock);
}

extern "C" int64_t tr_kern_cuda_attn_config_misses(void) {
  pthread_mutex_lock(&g_lock);
  int64_t n = g_cfg_misses;
  pthread_mutex_unlock(&g_lock);
  return n;
}

extern "C" void tr_kern_cuda_set_attn_tune(int n) {
  pthread_mutex_lock(&g_lock);
  g_tune = n < 1 ? -1 : n;
  plans_drop();
  pthread_mutex_unlock(&g_lock);
}

extern "C" void tr_kern_cuda_attn_tune_apply(void) {
  // every step calls this: once the timings are read, it takes no lock
  if (__atomic_load_n(&g_tune_pending, __ATOMIC_RELAXED) == 0) return;
  pthread_mutex_lock(&g_lock);
  int64_t t0 = g_tune_timed, c0 = g_tune_changed, left = 0;
  for (int i = 0; i < g_n_plans; i++) {
    if (g_plans[i]->tune == ATUNE_TIMING) tune_finish(g_plans[i]);
    left += g_plans[i]->tune == ATUNE_TIMING;
  }
  if (!left) __atomic_store_n(&g_tune_pending, 0, __ATOMIC_RELAXED);
  if (g_tune_timed > t0)
    TR_LOG_INFO(KERN,
                "cuDNN attention tuning: %lld more graph(s) timed, another "
                "engine config than the heuristics' first kept for %lld (so "
                "far %lld of %lld)",
                (long long)(g_tune_timed - t0),
                (long long)(g_tune_changed - c0), (long long)g_tune_changed,
                (long long)g_tune_timed);
  pthread_mutex_unlock(&g_lock);
}

extern "C" void tr_kern_cuda_attn_tune_stats(int64_t* timed, int64_t* changed) {
  pthread_mutex_lock(&g_lock);
  if (timed) *timed = g_tune_timed;
  if (changed) *changed = g_tune_changed;
  pthread_mutex_unlock(&g_lock);
}

void tr__cudnn_attn_release(void) {
  pthread_mutex_lock(&g_lock);
  plans_drop();
  for (int d = 0; d < TR_MAX_DEVICES; d++)
    if (g_handles[d]) {
      cudnnDestroy(g_handles[d]);
      g_handles[d] = NULL;
    }
  pthread_mutex_unlock(&g_lock);
}

#else

extern "C" void tr_kern_cuda_set_attn_config(int k) { (void)k; }
extern "C" int64_t tr_kern_cuda_attn_config_misses(void) { return 0; }
extern "C" void tr_kern_cuda_set_attn_tune(int n) { (void)n; }
extern "C" void tr_kern_cuda_attn_tune_apply(void) {}
extern "C" void tr_kern_cuda_attn_tune_stats(int64_t* timed, int64_t* changed) {
  if (timed) *timed = 0;
  if (changed) *changed = 0;
}

#endif  // HAVE_CUDNN
