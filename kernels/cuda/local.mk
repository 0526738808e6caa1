# kernels/cuda/local.mk: the CUDA kernels (bf16 and fp32: cuBLASLt GEMMs,
# fused norms, RoPE, activations, classifier, attention, AdamW, grad norm)
# and the "cuda" table they register; built when configure found CUDA.
trainruninclude_HEADERS += include/trainrun/kernels_cuda.h
noinst_HEADERS += kernels/cuda/common.cuh
KERNELS_CUDA_SOURCES = \
	kernels/cuda/runtime.cu \
	kernels/cuda/cublaslt_load.cu \
	kernels/cuda/elementwise.cu \
	kernels/cuda/gelu.cu \
	kernels/cuda/swiglu.cu \
	kernels/cuda/reduce.cu \
	kernels/cuda/norms.cu \
	kernels/cuda/tune.cu \
	kernels/cuda/matmul.cu \
	kernels/cuda/encoder.cu \
	kernels/cuda/rope.cu \
	kernels/cuda/classifier.cu \
	kernels/cuda/adamw.cu \
	kernels/cuda/global_norm.cu \
	kernels/cuda/attention.cu \
	kernels/cuda/flash_attention.cu \
	kernels/cuda/cudnn_attention.cu \
	kernels/cuda/ops.cu
if HAVE_CUDA
libtrainrun_la_SOURCES += $(KERNELS_CUDA_SOURCES)
# nvcc objects have no dependency tracking: rebuild them when the shared
# headers change
$(KERNELS_CUDA_SOURCES:.cu=.lo): $(srcdir)/kernels/cuda/common.cuh \
	$(srcdir)/include/trainrun/kernels_cuda.h \
	$(srcdir)/include/trainrun/kernels.h \
	$(srcdir)/include/trainrun/param.h \
	$(srcdir)/include/trainrun/log.h \
	$(srcdir)/include/trainrun/error.h
endif

# The GPU test: every kernel against the CPU kernels (exits 77 without a
# GPU, or in builds without CUDA).
check_PROGRAMS += tests/check_kernels_cuda
TESTS += tests/check_kernels_cuda
tests_check_kernels_cuda_SOURCES = tests/check_kernels_cuda.c tests/lin_kinds.h
tests_check_kernels_cuda_CFLAGS = $(TEST_CFLAGS)
tests_check_kernels_cuda_LDADD = $(TEST_LIBS)

# Per-kernel timings on a GPU (built by `make check`, run by hand:
# bench/kernels_bench [-q] [-f filter]).
if HAVE_CUDA
check_PROGRAMS += bench/kernels_bench
bench_kernels_bench_SOURCES = bench/kernels_bench.c
bench_kernels_bench_LDADD = libtrainrun.la $(CUDA_LIBS) -lm
endif
EXTRA_DIST += tests/gpu/kernels.sh tests/gpu/cp.sh
# bench/gpu_train.sh: trainrun next to llm.c and PyTorch on one GPU.
EXTRA_DIST += bench/gpu_train.sh bench/benchlib.sh bench/gpu/gpt2_124m.toml \
	bench/gpu/llama3_1b.toml bench/gpu/make_shard.py bench/gpu/summarize.py \
	bench/peers/benchlib.py bench/peers/gpt2_torch.py bench/peers/llama_torch.py \
	bench/peers/llama_fsdp2.py
