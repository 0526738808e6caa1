# flight_recorder/: the flight recorder: per-rank shared-memory ring of collectives, dumps in PyTorch's format, analyzer.
# Included from the top-level Makefile.am.

# Recording: the per-rank ring in shared memory (ring.c reads it, recorder.c
# writes it through the process-group hooks) and the dumps (dump.c).
libtrainrun_la_SOURCES += \
	flight_recorder/ring.c \
	flight_recorder/recorder.c \
	flight_recorder/dump.c
noinst_HEADERS += flight_recorder/ring.h
trainruninclude_HEADERS += include/trainrun/flight_recorder.h

# The recorder's tests: the ring under a concurrent writer, entries of real
# Gloo ops on forked ranks, the pickle loaded by python3, the JSON twin, a
# dump of a killed worker's ring.
check_PROGRAMS += tests/check_fr
TESTS += tests/check_fr
tests_check_fr_SOURCES = tests/check_fr.c $(PG_TEST_SOURCES)
tests_check_fr_CFLAGS = $(TEST_CFLAGS)
tests_check_fr_LDADD = $(TEST_LIBS) $(JANSSON_LIBS) -lm

# The analyzer (`trainrun fr analyze`), by concern: a safe pickle reader
# (unpickle.c), loading the folder's dumps (load.c), matching them into
# findings (match.c), the verdict (verdict.c) and the report, table and JSON
# (output.c); flight_recorder/internal.h is what they share. Its tests build
# dumps with tests/fr/make_dumps.py (python3).
libtrainrun_la_SOURCES += \
	flight_recorder/unpickle.c \
	flight_recorder/load.c \
	flight_recorder/match.c \
	flight_recorder/verdict.c \
	flight_recorder/output.c
noinst_HEADERS += flight_recorder/internal.h
trainruninclude_HEADERS += include/trainrun/fr_analyze.h
check_PROGRAMS += tests/check_fr_analyze
TESTS += tests/check_fr_analyze
tests_check_fr_analyze_SOURCES = tests/check_fr_analyze.c
tests_check_fr_analyze_CFLAGS = $(TEST_CFLAGS)
tests_check_fr_analyze_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
EXTRA_DIST += tests/fr/make_dumps.py tests/fr/pt_gloo_dumps.py \
	tests/fr/pt215_gloo_skip tests/fr/pt215_gloo_type

# End to end on CPU ranks with --debug.fault: a hang on 4 ranks dumps every
# rank within the timeout plus a few seconds (and the verdict names it); two
# nodes on loopback (exception_dump through the store); hang_timeout; a
# killed rank's ring dumped by the daemon; `trainrun fr follow`, `fr dump`
# and SIGUSR1 on a live job.
TESTS += tests/cli_fr.test
EXTRA_DIST += tests/cli_fr.test

# Figures (built by make check, not run): bench/fr_bench -- the cost of
# recording one collective, and the analyzer's time on 1024 ranks x 2000
# entries (bench/fr_bench --analyze-only).
check_PROGRAMS += bench/fr_bench
bench_fr_bench_SOURCES = bench/fr_bench.c
bench_fr_bench_LDADD = libtrainrun.la -lm

# trainrun-fr(1): dumps, triggers, analyze, follow.
dist_man_MANS += man/trainrun-fr.1
