# collectives/local.mk: process groups -- the engine (groups, works, the CPU
# communication thread, the watchdog, local reductions), the compute's
# waits for works and their timing (waits.c), and the backends:
# fake always, Gloo (C++), MPI and NCCL when configure found them.
libtrainrun_la_SOURCES += \
	collectives/group.c \
	collectives/pg.c \
	collectives/work.c \
	collectives/queue.c \
	collectives/watchdog.c \
	collectives/reduce.c \
	collectives/waits.c \
	collectives/fake.c
noinst_HEADERS += collectives/internal.h
trainruninclude_HEADERS += include/trainrun/pg.h include/trainrun/pg_waits.h
if HAVE_GLOO
libtrainrun_la_SOURCES += collectives/gloo.cc
libtrainrun_la_LIBADD += $(GLOO_LIBS)
endif
if HAVE_MPI
libtrainrun_la_SOURCES += collectives/mpi.c
libtrainrun_la_LIBADD += $(MPI_LIBS)
AM_CPPFLAGS += $(MPI_CFLAGS)
endif
noinst_HEADERS += collectives/nccl_cuda.h
if HAVE_NCCL
libtrainrun_la_SOURCES += collectives/nccl.c collectives/nccl_cuda.cu
endif

# Check suites: one process (fake backend) and Gloo on forked ranks; MPI
# under mpirun (exit 77 without it); NCCL on GPUs (exit 77 without two).
PG_TEST_SOURCES = tests/pg_suite.c tests/pg_suite.h
check_PROGRAMS += tests/check_pg
TESTS += tests/check_pg
tests_check_pg_SOURCES = tests/check_pg.c $(PG_TEST_SOURCES)
tests_check_pg_CFLAGS = $(TEST_CFLAGS)
tests_check_pg_LDADD = $(TEST_LIBS) -lm

check_PROGRAMS += tests/check_pg_mpi
TESTS += tests/check_pg_mpi
tests_check_pg_mpi_SOURCES = tests/check_pg_mpi.c $(PG_TEST_SOURCES)
tests_check_pg_mpi_CFLAGS = $(TEST_CFLAGS)
tests_check_pg_mpi_LDADD = $(TEST_LIBS) -lm

check_PROGRAMS += tests/check_pg_nccl
TESTS += tests/check_pg_nccl
tests_check_pg_nccl_SOURCES = tests/check_pg_nccl.c $(PG_TEST_SOURCES)
tests_check_pg_nccl_CFLAGS = $(TEST_CFLAGS)
tests_check_pg_nccl_LDADD = $(TEST_LIBS) -lm

# Bus bandwidth of the collectives (built by make check, not run):
# bench/coll_bench -h
check_PROGRAMS += bench/coll_bench
bench_coll_bench_SOURCES = bench/coll_bench.c
bench_coll_bench_LDADD = libtrainrun.la $(CUDA_LIBS) -lm
