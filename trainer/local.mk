# trainer/local.mk: the per-rank training loop — data (token shards, byte
# tokenizer, loader, `data prepare`), LR schedule, AdamW steps, metrics
# (console, JSONL, TensorBoard), safetensors weights, eval and sampling.
libtrainrun_la_SOURCES += \
	trainer/errmsg.c \
	trainer/fsutil.c \
	trainer/data.c \
	trainer/prepare.c \
	trainer/lr.c \
	trainer/tensorboard.c \
	trainer/metrics.c \
	trainer/safetensors.c \
	trainer/train.c \
	trainer/ddp.c
noinst_HEADERS += trainer/internal.h
trainruninclude_HEADERS += \
	include/trainrun/errmsg.h \
	include/trainrun/data.h \
	include/trainrun/metrics.h \
	include/trainrun/safetensors.h \
	include/trainrun/trainer.h \
	include/trainrun/ddp.h

check_PROGRAMS += tests/check_data
TESTS += tests/check_data
tests_check_data_SOURCES = tests/check_data.c
tests_check_data_CFLAGS = $(TEST_CFLAGS)
tests_check_data_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/check_trainer
TESTS += tests/check_trainer
tests_check_trainer_SOURCES = tests/check_trainer.c
tests_check_trainer_CFLAGS = $(TEST_CFLAGS) $(JANSSON_CFLAGS)
tests_check_trainer_LDADD = $(TEST_LIBS) $(JANSSON_LIBS) -lm

# `trainrun data prepare`, `eval`, `sample`: exit codes and messages.
TESTS += tests/cli_trainer.test
EXTRA_DIST += tests/cli_trainer.test
