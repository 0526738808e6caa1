# daemon/local.mk: trainrund, the node daemon -- launcher flags and cluster
# environments, rendezvous, worker spawn and output, supervision and
# restarts, the status socket; the trainrund program; its tests.
libtrainrun_la_SOURCES += \
	daemon/opts.c \
	daemon/nodelist.c \
	daemon/rendezvous.c \
	daemon/spawn.c \
	daemon/output.c \
	daemon/signals.c \
	daemon/supervise.c \
	daemon/status.c \
	daemon/fr.c
noinst_HEADERS += daemon/internal.h
trainruninclude_HEADERS += include/trainrun/daemon.h

# CPU affinity near each GPU: hwloc's flags only for the file that uses it.
noinst_LTLIBRARIES = daemon/libtrdevices.la
daemon_libtrdevices_la_SOURCES = daemon/devices.c
daemon_libtrdevices_la_CPPFLAGS = $(AM_CPPFLAGS) $(HWLOC_CFLAGS)
daemon_libtrdevices_la_LIBADD = $(HWLOC_LIBS)
libtrainrun_la_LIBADD += daemon/libtrdevices.la

bin_PROGRAMS += trainrund
trainrund_SOURCES = daemon/main.c
trainrund_LDADD = libtrainrun.la
dist_man_MANS += man/trainrund.8

# The daemon's unit tests (options, Slurm host lists, rendezvous, output)
# and its multi-process tests with tests/fake_worker: spawn, output,
# filters, restarts, signals, two nodes on loopback, start-up time.
# tests/procs.[ch]: running trainrun processes in the suites that do.
noinst_HEADERS += tests/procs.h
check_PROGRAMS += tests/check_daemon tests/fake_worker
TESTS += tests/check_daemon
tests_check_daemon_SOURCES = tests/check_daemon.c tests/procs.c
tests_check_daemon_CFLAGS = $(TEST_CFLAGS)
tests_check_daemon_LDADD = $(TEST_LIBS)
tests_fake_worker_SOURCES = tests/fake_worker.c

# Supervision of real training jobs: faults, heartbeats, restarts from a
# checkpoint, signals, status and metrics, many nodes, clear errors.
check_PROGRAMS += tests/check_super
TESTS += tests/check_super
tests_check_super_SOURCES = tests/check_super.c tests/procs.c
tests_check_super_CFLAGS = $(TEST_CFLAGS)
tests_check_super_LDADD = $(TEST_LIBS) -lm

# Figures (built by make check, not run): bench/startup -- start to the end
# of the first step for 8 nodes x 1 rank on loopback, and the rendezvous of
# 64 daemons (run from the build folder; docs/PERFORMANCE.md).
check_PROGRAMS += bench/startup
bench_startup_SOURCES = bench/startup.c

# --version names the commit (build_commit.h, Makefile.am)
daemon/main.$(OBJEXT): build_commit.h
