// kernels/cuda/cublaslt_load.cu: cuBLASLt loaded with dlopen on first use.
//
// libcublasLt is large and runs static constructors and faults in its data
// pages when it is mapped; linked into libtrainrun, every process (launcher,
// daemon, CPU workers) paid that at start-up without running a GEMM. Instead
// the first handle creation (matmul.cu) calls tr__cublaslt(), which opens the
// library once and resolves the functions of TR__CUBLASLT_FUNCS into a table;
// matmul.cu calls cuBLASLt only through that table. cublasLt.h still gives
// the types, enums and prototypes (the table's pointer types).
#include "kernels/cuda/common.cuh"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#define TR__STR_(x) #x
#define TR__STR(x) TR__STR_(x)

// The library of the headers' major version first (cuBLAS keeps its ABI
// within a major), then the development link of the toolkit.
static const char* const lt_names[] = {
    "libcublasLt.so." TR__STR(CUBLAS_VER_MAJOR),
    "libcublasLt.so",
};

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static tr__cublaslt_t lt_table;
static int lt_rc;  // 0 once the table is filled, else the load's TR_E* code

static void lt_load(void) {
  void* h = NULL;
  const char* name = NULL;
  char err[512] = "";
  for (size_t i = 0; i < sizeof lt_names / sizeof lt_names[0] && !h; i++) {
    name = lt_names[i];
    h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      if (i == 0) snprintf(err, sizeof err, "%s", e ? e : "unknown error");
    }
  }
  if (!h) {
    TR_LOG_ERROR(KERN,
                 "cannot load cuBLASLt (%s, nor %s): %s; is the CUDA "
                 "toolkit's lib64 in the library path?",
                 lt_names[0], lt_names[1], err);
    lt_rc = TR_ECUDA;
    return;
  }
  tr__cublaslt_t t;
#define TR__LT_RESOLVE(fn)                                        \
  {                                                               \
    dlerror();                                                    \
    t.fn = (decltype(&::fn))dlsym(h, #fn);                        \
    if (!t.fn) {                                                  \
      const char* e = dlerror();                                  \
      TR_LOG_ERROR(KERN, "cuBLASLt (%s) lacks %s: %s", name, #fn, \
                   e ? e : "null symbol");                        \
      dlclose(h);                                                 \
      lt_rc = TR_ECUDA;                                           \
      return;                                                     \
    }                                                             \
  }
  TR__CUBLASLT_FUNCS(TR__LT_RESOLVE)
#undef TR__LT_RESOLVE
  size_t ver = t.cublasLtGetVersion();
  if (ver / 10000 != CUBLAS_VER_MAJOR) {
    TR_LOG_ERROR(KERN,
                 "cuBLASLt %s is version %zu, trainrun was built for "
                 "major version %d",
                 name, ver, CUBLAS_VER_MAJOR);
    dlclose(h);
    lt_rc = TR_ECUDA;
    return;
  }
  // kept open for the life of the process: plans and handles point into it
  lt_table = t;
  lt_rc = 0;
}

int tr__cublaslt(const tr__cublaslt_t** out) {
  pthread_once(&lt_once, lt_load);
  if (lt_rc < 0) return lt_rc;
  *out = &lt_table;
  return 0;
}
