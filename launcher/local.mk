# launcher/local.mk: the trainrun command line.
bin_PROGRAMS += trainrun
trainrun_SOURCES = launcher/main.c launcher/cmd_config.c launcher/run.c \
	launcher/cmd_plan.c \
	launcher/cmd_store.c launcher/cmd_fr.c launcher/cmd_fr_live.c \
	launcher/cmd_data.c launcher/cmd_eval.c launcher/cmd_sample.c \
	launcher/cmd_ckpt.c \
	launcher/jobargs.c \
	launcher/launch.c launcher/launch.h launcher/preflight.c \
	launcher/dumplock.c \
	launcher/commands.h
trainrun_LDADD = libtrainrun.la $(JANSSON_LIBS)
dist_man_MANS += man/trainrun.1

# `trainrun config`: exit codes and messages of the command line.
TESTS += tests/cli_config.test
EXTRA_DIST += tests/cli_config.test

# Regenerate man/trainrun.toml.5 from the config schema.
update-man-config: trainrun$(EXEEXT)
	./trainrun$(EXEEXT) config --man > $(srcdir)/man/trainrun.toml.5
