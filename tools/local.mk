# tools/local.mk: programs that generate parts of the tree from its
# sources, built with the library and never installed.

# man/trainrun.toml.5's key table from the config schema:
# `make update-man-config` regenerates the page, and the test fails when the
# committed page differs from what the schema generates.
noinst_PROGRAMS += tools/man_config
tools_man_config_SOURCES = tools/man_config.c
tools_man_config_LDADD = libtrainrun.la

update-man-config: tools/man_config$(EXEEXT)
	./tools/man_config$(EXEEXT) > $(srcdir)/man/trainrun.toml.5
.PHONY: update-man-config

TESTS += tests/man_config.test
EXTRA_DIST += tests/man_config.test
