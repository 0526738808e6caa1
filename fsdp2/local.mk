# fsdp2/: data parallelism, all of it -- FSDP2, HSDP and DDP, sharing the
# scalar sum (reduce.c) behind the trainer's seam (trainrun/dp.h); the
# compute's waits with their stall timer are collectives/waits.c.
# Included from the top-level Makefile.am.
libtrainrun_la_SOURCES += \
	fsdp2/plan.c \
	fsdp2/fsdp.c \
	fsdp2/reduce.c \
	fsdp2/ddp.c
noinst_HEADERS += fsdp2/internal.h
trainruninclude_HEADERS += include/trainrun/fsdp2.h include/trainrun/ddp.h \
	include/trainrun/dp.h

# Units on 2 and 4 forked Gloo ranks: shard math, padding, copy-in/out,
# gradients against one rank, reshard policies, prefetch, HSDP, memory.
check_PROGRAMS += tests/check_fsdp2
TESTS += tests/check_fsdp2
tests_check_fsdp2_SOURCES = tests/check_fsdp2.c tests/pg_suite.c \
	tests/pg_suite.h tests/fixtures.c
tests_check_fsdp2_CFLAGS = $(TEST_CFLAGS)
tests_check_fsdp2_LDADD = $(TEST_LIBS) -lm

# Jobs through the launcher: FSDP 2 and 4, HSDP 2x2, DDP 4 against 1 rank.
check_PROGRAMS += tests/check_fsdp2_train
TESTS += tests/check_fsdp2_train
tests_check_fsdp2_train_SOURCES = tests/check_fsdp2_train.c tests/procs.c
tests_check_fsdp2_train_CFLAGS = $(TEST_CFLAGS)
tests_check_fsdp2_train_LDADD = $(TEST_LIBS) -lm

# DDP on forked ranks over Gloo (the pg suite's harness; tests/fixtures.c
# comes with the trainer layer).
# Data parallel on forked ranks over Gloo (the pg suite's harness).
check_PROGRAMS += tests/check_ddp
TESTS += tests/check_ddp
tests_check_ddp_SOURCES = tests/check_ddp.c tests/fixtures.c \
	$(PG_TEST_SOURCES)
tests_check_ddp_CFLAGS = $(TEST_CFLAGS)
tests_check_ddp_LDADD = $(TEST_LIBS) -lm
