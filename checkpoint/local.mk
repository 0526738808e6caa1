# checkpoint/: sharded asynchronous checkpoints with resharding; safetensors.
# Included from the top-level Makefile.am.
libtrainrun_la_SOURCES += \
	checkpoint/folder.c \
	checkpoint/save.c \
	checkpoint/load.c \
	checkpoint/safetensors.c \
	checkpoint/hf_export.c
noinst_HEADERS += checkpoint/internal.h checkpoint/dma.h
if HAVE_CUDA
libtrainrun_la_SOURCES += checkpoint/stage_cuda.cu
endif
trainruninclude_HEADERS += \
	include/trainrun/checkpoint.h \
	include/trainrun/safetensors.h

check_PROGRAMS += tests/check_checkpoint
TESTS += tests/check_checkpoint
tests_check_checkpoint_SOURCES = tests/check_checkpoint.c tests/fixtures.c
tests_check_checkpoint_CFLAGS = $(TEST_CFLAGS) $(JANSSON_CFLAGS)
tests_check_checkpoint_LDADD = $(TEST_LIBS) $(JANSSON_LIBS) -lm

# Exact resume, resharding, `trainrun ckpt` and damaged checkpoints with
# real runs.
TESTS += tests/ckpt_resume.test
EXTRA_DIST += tests/ckpt_resume.test

# Figures (built by make check, not run): bench/ckpt_bench [--gb 2] --
# async stall and write throughput next to dd, load and reshard.
check_PROGRAMS += bench/ckpt_bench
bench_ckpt_bench_SOURCES = bench/ckpt_bench.c
bench_ckpt_bench_LDADD = libtrainrun.la -lm

dist_man_MANS += man/trainrun-ckpt.1
