# model/local.mk: GPT-2 and Llama-3 models — parameter table, blocks with
# forward and backward passes, hooks (calls kernels only).
libtrainrun_la_SOURCES += \
	model/config.c \
	model/params.c \
	model/model.c \
	model/gpt2.c \
	model/llama3.c
noinst_HEADERS += model/internal.h
trainruninclude_HEADERS += include/trainrun/model.h

check_PROGRAMS += tests/check_model
TESTS += tests/check_model
tests_check_model_SOURCES = tests/check_model.c
tests_check_model_CFLAGS = $(TEST_CFLAGS)
tests_check_model_LDADD = $(TEST_LIBS)
