# launcher/local.mk: the trainrun command line, and the composition root
# (compose.c: the job config -> each module's options), which the library
# carries as its top layer so that the tests can use it too.
libtrainrun_la_SOURCES += launcher/compose.c
noinst_HEADERS += launcher/compose.h
bin_PROGRAMS += trainrun
trainrun_SOURCES = launcher/main.c launcher/cmd_config.c launcher/run.c \
	launcher/cmd_plan.c \
	launcher/cmd_store.c launcher/cmd_fr.c launcher/cmd_fr_live.c \
	launcher/cmd_data.c launcher/cmd_eval.c launcher/cmd_sample.c \
	launcher/cmd_ckpt.c launcher/cmd_status.c \
	launcher/jobargs.c launcher/jobcheck.c launcher/mpirun.c \
	launcher/launch.c launcher/launch.h launcher/preflight.c \
	launcher/dumplock.c \
	launcher/commands.h
trainrun_LDADD = libtrainrun.la $(JANSSON_LIBS)
dist_man_MANS += man/trainrun.1

# `trainrun config`: exit codes and messages of the command line.
TESTS += tests/cli_config.test
EXTRA_DIST += tests/cli_config.test

# Every key of the job-config schema acts or is refused (a table that a key
# added later must join).
TESTS += tests/cli_keys.test
EXTRA_DIST += tests/cli_keys.test

# tensor_parallel_degree end to end: TP, FSDP x TP, DDP x TP against one
# rank, checkpoints across layouts, bad degrees.
TESTS += tests/cli_tp.test tests/cli_cp.test
EXTRA_DIST += tests/cli_tp.test tests/cli_cp.test tests/parallel.sh

# pipeline_parallel_degree end to end: every schedule at pp 2, pp 4, GPT-2's
# tied table, pp x tp, accumulation, checkpoints across layouts, bad
# settings.
TESTS += tests/cli_pp.test
EXTRA_DIST += tests/cli_pp.test

# --version names the commit (build_commit.h, Makefile.am)
launcher/main.$(OBJEXT): build_commit.h
