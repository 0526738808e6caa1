# launcher/local.mk: the trainrun command line.
bin_PROGRAMS += trainrun
trainrun_SOURCES = launcher/main.c
trainrun_LDADD = libtrainrun.la
