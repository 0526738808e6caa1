# pipelining/: the schedule IR (PyTorch's actions, `0F1`), the schedules
# of every rank (generators, validator, lock-step simulator, PyTorch's CSV),
# and the executor that runs one rank's list over a range of blocks.
# Included from the top-level Makefile.am.
libtrainrun_la_SOURCES += \
	pipelining/schedule.c \
	pipelining/plan.c \
	pipelining/generators.c \
	pipelining/validate.c \
	pipelining/simulate.c \
	pipelining/csv.c \
	pipelining/split.c \
	pipelining/lower.c \
	pipelining/trace.c \
	pipelining/build.c \
	pipelining/params.c \
	pipelining/executor.c \
	pipelining/stamps.c pipelining/internal.h
trainruninclude_HEADERS += include/trainrun/pipelining.h

# The IR's text form, the one-stage schedule, the generators against
# PyTorch's fixtures (tests/pipelining), the validator, the simulator, the
# CSV, and the executor against the plain forward/backward loop (bit for
# bit).
check_PROGRAMS += tests/check_pipelining
TESTS += tests/check_pipelining
tests_check_pipelining_SOURCES = tests/check_pipelining.c
tests_check_pipelining_CFLAGS = $(TEST_CFLAGS)
tests_check_pipelining_LDADD = $(TEST_LIBS)
EXTRA_DIST += tests/pipelining

# Pipeline parallelism end to end: every generator's schedule lowered and
# run by the executor on 2 and 4 forked Gloo ranks, both families, against
# one rank (losses, gradient norms, 20 AdamW steps); the bad input that
# stops a pipeline.
check_PROGRAMS += tests/check_pp_exec
TESTS += tests/check_pp_exec
tests_check_pp_exec_SOURCES = tests/check_pp_exec.c $(PG_TEST_SOURCES) \
	tests/train_steps.c tests/train_steps.h
tests_check_pp_exec_CFLAGS = $(TEST_CFLAGS)
tests_check_pp_exec_LDADD = $(TEST_LIBS) -lm
