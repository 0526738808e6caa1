# model/local.mk: GPT-2 and Llama-3 models — parameter table, blocks with
# forward and backward passes, hooks (calls kernels only).
libtrainrun_la_SOURCES += \
	model/act.c \
	model/table.c \
	model/config.c \
	model/params.c \
	model/model.c \
	model/gpt2.c \
	model/llama3.c \
	model/mask.c \
	model/recompute.c
noinst_HEADERS += model/internal.h
trainruninclude_HEADERS += include/trainrun/model.h

check_PROGRAMS += tests/check_model
TESTS += tests/check_model
tests_check_model_SOURCES = tests/check_model.c
tests_check_model_CFLAGS = $(TEST_CFLAGS)
tests_check_model_LDADD = $(TEST_LIBS)

# Activation checkpointing (model/recompute.c): bit-identical results,
# memory, the policy strings, FSDP over 2 ranks (runs ./trainrun).
check_PROGRAMS += tests/check_recompute
TESTS += tests/check_recompute
tests_check_recompute_SOURCES = tests/check_recompute.c tests/procs.c
tests_check_recompute_CFLAGS = $(TEST_CFLAGS)
tests_check_recompute_LDADD = $(TEST_LIBS) -lm
TESTS += tests/cli_recompute.test
EXTRA_DIST += tests/cli_recompute.test
