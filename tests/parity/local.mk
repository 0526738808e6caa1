# tests/parity/local.mk: the PyTorch parity check, run by hand where torch
# and transformers are installed (tests/parity/parity.py; see its header).
# `make check` builds its C side, tr_parity; it is never installed and the
# script is not in TESTS.
check_PROGRAMS += tests/parity/tr_parity
tests_parity_tr_parity_SOURCES = tests/parity/tr_parity.c
tests_parity_tr_parity_LDADD = libtrainrun.la
EXTRA_DIST += tests/parity/parity.py
