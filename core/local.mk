# core/local.mk: errors (codes; a code with a message), logging, parameters,
# tensors, TOML, job config, CRC-32C, atomic file writes, the clock and the
# growable buffer.
libtrainrun_la_SOURCES += \
	core/error.c \
	core/errmsg.c \
	core/log.c \
	core/param.c \
	core/mem.c \
	core/tensor.c \
	core/toml.c \
	core/toml_value.c \
	core/config.c \
	core/crc32c.c \
	core/fsutil.c \
	core/clock.c \
	core/buf.c
noinst_HEADERS += core/toml_internal.h core/internal.h core/clock.h \
	core/buf.h
noinst_HEADERS += core/cuda.h
if HAVE_CUDA
libtrainrun_la_SOURCES += core/cuda.cu
endif
trainruninclude_HEADERS += \
	include/trainrun/error.h \
	include/trainrun/errmsg.h \
	include/trainrun/log.h \
	include/trainrun/param.h \
	include/trainrun/tensor.h \
	include/trainrun/toml.h \
	include/trainrun/config.h \
	include/trainrun/config_schema.h \
	include/trainrun/crc32c.h

check_PROGRAMS += tests/check_core
TESTS += tests/check_core
tests_check_core_SOURCES = tests/check_core.c
tests_check_core_CFLAGS = $(TEST_CFLAGS)
tests_check_core_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/check_tensor
TESTS += tests/check_tensor
tests_check_tensor_SOURCES = tests/check_tensor.c
tests_check_tensor_CFLAGS = $(TEST_CFLAGS)
tests_check_tensor_LDADD = $(TEST_LIBS)

# TOML: the Check suite, the toml-test decoder and the tomllib differential
# test (tests/toml_diff.test runs tests/toml_diff.py over tests/toml/).
check_PROGRAMS += tests/check_toml tests/toml-decoder
TESTS += tests/check_toml tests/toml_diff.test
tests_check_toml_SOURCES = tests/check_toml.c
tests_check_toml_CFLAGS = $(TEST_CFLAGS)
tests_check_toml_LDADD = $(TEST_LIBS)
# The differential test starts the decoder once per corpus document: it is
# built from the parser's sources alone, without libtrainrun's dependencies
# (CUDA, OpenBLAS) or a libtool wrapper script, so it starts in a millisecond.
tests_toml_decoder_SOURCES = tests/toml-decoder.c core/toml.c core/buf.c \
	core/toml_value.c core/error.c
tests_toml_decoder_CFLAGS = $(AM_CFLAGS)
EXTRA_DIST += tests/toml_diff.test tests/toml_diff.py tests/toml

# Job config: the Check suite (man/trainrun.toml.5 is checked by
# tests/man_config.test, tools/local.mk).
check_PROGRAMS += tests/check_config
TESTS += tests/check_config
tests_check_config_SOURCES = tests/check_config.c
tests_check_config_CFLAGS = $(TEST_CFLAGS)
tests_check_config_LDADD = $(TEST_LIBS) $(JANSSON_LIBS)
dist_man_MANS += man/trainrun.toml.5
