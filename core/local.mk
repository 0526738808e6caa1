# core/local.mk: errors, logging, parameters, tensors, TOML, job config.
libtrainrun_la_SOURCES += \
	core/error.c \
	core/log.c \
	core/param.c
trainruninclude_HEADERS += \
	include/trainrun/error.h \
	include/trainrun/log.h \
	include/trainrun/param.h

check_PROGRAMS += tests/check_core
TESTS += tests/check_core
tests_check_core_SOURCES = tests/check_core.c
tests_check_core_CFLAGS = $(TEST_CFLAGS)
tests_check_core_LDADD = $(TEST_LIBS)
