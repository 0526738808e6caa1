# dtensor/: DeviceMesh, placements, DTensor and redistribute.
# Included from the top-level Makefile.am.
libtrainrun_la_SOURCES += \
	dtensor/mesh.c \
	dtensor/placement.c \
	dtensor/dtensor.c \
	dtensor/redistribute.c \
	dtensor/param.c \
	dtensor/tp.c \
	dtensor/cp.c
noinst_HEADERS += dtensor/internal.h
trainruninclude_HEADERS += include/trainrun/dtensor.h include/trainrun/cp.h

# Check suite: meshes and placement math in one process (fake backend),
# then every redistribute transition on 2 and 4 forked Gloo ranks.
check_PROGRAMS += tests/check_dtensor
TESTS += tests/check_dtensor
tests_check_dtensor_SOURCES = tests/check_dtensor.c $(PG_TEST_SOURCES)
tests_check_dtensor_CFLAGS = $(TEST_CFLAGS)
tests_check_dtensor_LDADD = $(TEST_LIBS) -lm

# Check suite: tensor parallelism -- the plan's placements, the strided
# q|k|v shard, and GPT-2 / Llama debug models on 2 and 4 forked Gloo ranks
# against one rank (init, loss, gradients, AdamW steps).
check_PROGRAMS += tests/check_tp
TESTS += tests/check_tp
tests_check_tp_SOURCES = tests/check_tp.c $(PG_TEST_SOURCES) \
	tests/train_steps.c tests/train_steps.h tests/fixtures.c \
	tests/procs.c tests/procs.h
tests_check_tp_CFLAGS = $(TEST_CFLAGS)
tests_check_tp_LDADD = $(TEST_LIBS) -lm

# Check suite: async tensor parallel's chunked all-gather and
# reduce-scatter rings against the blocking collectives, on 2 and 4 forked
# Gloo ranks.
check_PROGRAMS += tests/check_tp_async
TESTS += tests/check_tp_async
tests_check_tp_async_SOURCES = tests/check_tp_async.c $(PG_TEST_SOURCES)
tests_check_tp_async_CFLAGS = $(TEST_CFLAGS)
tests_check_tp_async_LDADD = $(TEST_LIBS) -lm
