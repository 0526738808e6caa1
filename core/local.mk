# core/local.mk: errors, logging, parameters, tensors, TOML, job config.
libtrainrun_la_SOURCES += \
	core/error.c \
	core/log.c \
	core/param.c \
	core/mem.c \
	core/tensor.c
noinst_HEADERS += core/cuda.h
if HAVE_CUDA
libtrainrun_la_SOURCES += core/cuda.cu
endif
trainruninclude_HEADERS += \
	include/trainrun/error.h \
	include/trainrun/log.h \
	include/trainrun/param.h \
	include/trainrun/tensor.h

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
