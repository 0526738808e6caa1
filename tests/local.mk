# tests/local.mk: tests of the tree as a whole (the module's own suites are
# in each module's local.mk). Included from the top-level Makefile.am.

# The layering rules of DESIGN.md, on the sources and the built objects
# (tests/layers.py prints each violation with its files and symbols).
# Expected to fail until the model/, dtensor/, fsdp2/ and trainer/ parts of
# issue 17 land: trainrun/config.h in dtensor.h, fsdp2.h and trainer.h;
# fsdp2.h includes trainer.h and fsdp.c calls tr_trainer_comm_hidden; file
# cycles in model/ (model.c -> recompute.c -> gpt2.c/llama3.c -> model.c)
# and dtensor/ (dtensor.c <-> redistribute.c). Drop it from XFAIL_TESTS
# when `make check TESTS=tests/layers.test` passes (XPASS fails the run).
TESTS += tests/layers.test
XFAIL_TESTS = tests/layers.test
EXTRA_DIST += tests/layers.test tests/layers.py
