# trainer/local.mk: the per-rank training loop — data (token shards, byte
# tokenizer, loader, `data prepare`), LR schedule, AdamW steps, metrics
# (console, JSONL, TensorBoard), safetensors weights, eval and sampling.
libtrainrun_la_SOURCES += \
	trainer/data.c \
	trainer/prepare.c \
	trainer/lr.c \
	trainer/tensorboard.c \
	trainer/metrics.c \
	trainer/train.c \
	trainer/device.c \
	trainer/pipeline.c \
	trainer/checkpointing.c \
	trainer/fault.c \
	trainer/heartbeat.c
trainruninclude_HEADERS += \
	include/trainrun/data.h \
	include/trainrun/metrics.h \
	include/trainrun/trainer.h \
	include/trainrun/fault.h \
	include/trainrun/heartbeat.h

# tests/fixtures.[ch]: helpers the trainer layer's suites share.
noinst_HEADERS += trainer/internal.h tests/fixtures.h
check_PROGRAMS += tests/check_data
TESTS += tests/check_data
tests_check_data_SOURCES = tests/check_data.c tests/fixtures.c
tests_check_data_CFLAGS = $(TEST_CFLAGS)
tests_check_data_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/check_trainer
TESTS += tests/check_trainer
tests_check_trainer_SOURCES = tests/check_trainer.c tests/fixtures.c
tests_check_trainer_CFLAGS = $(TEST_CFLAGS) $(JANSSON_CFLAGS)
tests_check_trainer_LDADD = $(TEST_LIBS) $(JANSSON_LIBS) -lm


# `trainrun data prepare`, `eval`, `sample`: exit codes and messages.
TESTS += tests/cli_trainer.test
EXTRA_DIST += tests/cli_trainer.test

# CPU training bit-identical to the numbers recorded before the seams
# redesign (1 rank, FSDP 4, HSDP 2x2, DDP 4, GPT-2 1 and FSDP 2).
TESTS += tests/identity.test
EXTRA_DIST += tests/identity.test tests/identity/reference.txt
