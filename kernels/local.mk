# kernels/local.mk: local compute kernels (CPU fp32; the CUDA table plugs in
# through tr_kern_register) behind one dispatch table.
libtrainrun_la_SOURCES += \
	kernels/dispatch.c \
	kernels/cpu/threads.c \
	kernels/cpu/ops.c \
	kernels/cpu/encoder.c \
	kernels/cpu/layernorm.c \
	kernels/cpu/rmsnorm.c \
	kernels/cpu/matmul.c \
	kernels/cpu/rope.c \
	kernels/cpu/attention.c \
	kernels/cpu/gelu.c \
	kernels/cpu/swiglu.c \
	kernels/cpu/crossentropy.c \
	kernels/cpu/adamw.c \
	kernels/cpu/global_norm.c \
	kernels/cpu/residual.c
noinst_HEADERS += kernels/cpu/cpu.h
trainruninclude_HEADERS += include/trainrun/kernels.h
if HAVE_OPENBLAS
libtrainrun_la_LIBADD += $(OPENBLAS_LIBS)
AM_CPPFLAGS += $(OPENBLAS_CFLAGS)
endif

check_PROGRAMS += tests/check_kernels
TESTS += tests/check_kernels
tests_check_kernels_SOURCES = tests/check_kernels.c tests/lin_kinds.h
tests_check_kernels_CFLAGS = $(TEST_CFLAGS)
tests_check_kernels_LDADD = $(TEST_LIBS)

# Training throughput on the CPU kernels (built by make check, not run):
# bench/cpu_train --header; bench/llmc_compare.sh runs it beside llm.c.
check_PROGRAMS += bench/cpu_train
bench_cpu_train_SOURCES = bench/cpu_train.c
bench_cpu_train_LDADD = libtrainrun.la
EXTRA_DIST += bench/llmc_compare.sh
