# tests/local.mk: tests of the tree as a whole (the module's own suites are
# in each module's local.mk). Included from the top-level Makefile.am.

# The layering rules of DESIGN.md, on the sources and the built objects
# (tests/layers.py prints each violation with its files and symbols).
TESTS += tests/layers.test
EXTRA_DIST += tests/layers.test tests/layers.py

# The GPU protocol's plan over calls (bench/gpu/summarize.py --plan) and its
# concurrent streams (bench/gpu/protocol_streams.sh, a stand-in for the runs), on
# output folders the test makes.
TESTS += tests/bench_plan.test tests/bench_streams.test
EXTRA_DIST += tests/bench_plan.test tests/bench_plan.py tests/bench_streams.test
