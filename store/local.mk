# store/local.mk: the TCPStore -- libuv server, blocking client, PrefixStore,
# the `trainrun store` man page, its Check suite, the parser's fuzz target
# and the load generator.
libtrainrun_la_SOURCES += \
	store/auth.c \
	store/client.c \
	store/conn.c \
	store/db.c \
	store/prefix.c \
	store/proto.c \
	store/server.c
trainruninclude_HEADERS += include/trainrun/store.h
noinst_HEADERS += store/internal.h
dist_man_MANS += man/trainrun-store.1

check_PROGRAMS += tests/check_store
TESTS += tests/check_store
tests_check_store_SOURCES = tests/check_store.c
tests_check_store_CFLAGS = $(TEST_CFLAGS)
tests_check_store_LDADD = $(TEST_LIBS)

# The fuzz target, replayed over its corpus by a plain main() in every build
# (so the sanitizer build runs it); built for libFuzzer too when configure
# found clang with -fsanitize=fuzzer (`make store-fuzz FUZZ_SECONDS=600`).
check_PROGRAMS += tests/fuzz/store_fuzz_replay
TESTS += tests/fuzz/store_fuzz_replay
tests_fuzz_store_fuzz_replay_SOURCES = tests/fuzz/store_fuzz.c \
	tests/fuzz/replay_main.c
tests_fuzz_store_fuzz_replay_CFLAGS = $(AM_CFLAGS)
tests_fuzz_store_fuzz_replay_CPPFLAGS = $(AM_CPPFLAGS) \
	-DTR_FUZZ_CORPUS='"$(abs_top_srcdir)/tests/fuzz/corpus"'
tests_fuzz_store_fuzz_replay_LDADD = libtrainrun.la
EXTRA_DIST += tests/fuzz/corpus tests/fuzz/make_corpus.py tests/interop

STORE_FUZZ_SRCS = $(top_srcdir)/tests/fuzz/store_fuzz.c \
	$(top_srcdir)/store/auth.c $(top_srcdir)/store/conn.c \
	$(top_srcdir)/store/db.c $(top_srcdir)/store/proto.c \
	$(top_srcdir)/core/error.c $(top_srcdir)/core/log.c \
	$(top_srcdir)/core/param.c $(top_srcdir)/core/buf.c
if HAVE_LIBFUZZER
check_SCRIPTS = tests/fuzz/store_fuzz
tests/fuzz/store_fuzz: $(STORE_FUZZ_SRCS) $(top_srcdir)/store/internal.h \
	$(top_srcdir)/core/buf.h
	$(AM_V_CC)$(MKDIR_P) tests/fuzz && $(FUZZ_CC) -g -O1 -std=gnu11 \
	-fsanitize=fuzzer,address,undefined -I$(top_srcdir)/include \
	-I$(top_srcdir) -I$(top_builddir) -o $@ $(STORE_FUZZ_SRCS) -pthread
CLEANFILES += tests/fuzz/store_fuzz
FUZZ_SECONDS = 60
store-fuzz: tests/fuzz/store_fuzz
	$(MKDIR_P) tests/fuzz/new-corpus
	tests/fuzz/store_fuzz -max_total_time=$(FUZZ_SECONDS) -max_len=4096 \
	tests/fuzz/new-corpus $(top_srcdir)/tests/fuzz/corpus
else
store-fuzz:
	@echo "store-fuzz needs clang with -fsanitize=fuzzer (configure found none)" >&2; exit 1
endif
.PHONY: store-fuzz

# The load generator (built by make check, not run): bench/store_bench -h
check_PROGRAMS += bench/store_bench
bench_store_bench_SOURCES = bench/store_bench.c
bench_store_bench_LDADD = libtrainrun.la $(LIBUV_LIBS)
# bench/store_compare.sh OUTDIR: the figures of docs/PERFORMANCE.md in one run
EXTRA_DIST += bench/store_compare.sh

# The interop driver: our C client through every command against a server
# (tests/interop/store_interop.py runs it against PyTorch's).
check_PROGRAMS += tests/interop/store_drive
tests_interop_store_drive_SOURCES = tests/interop/store_drive.c
tests_interop_store_drive_LDADD = libtrainrun.la
