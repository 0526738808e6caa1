/* launcher/cmd_fr.c: `trainrun fr SUBCOMMAND`, the flight recorder's
 * commands. The table below dispatches them; each entry is a function in
 * this file (or one it calls) taking the arguments after `fr`.
 *
 *   trainrun fr analyze DIR [-p PREFIX] [-j] [--selected-ranks R...]
 *                           [--pg-filters NAME...] [--mismatch-cap N]
 *                           [--allow-incomplete-ranks] [-v] [--json]
 *
 * Exit codes of analyze: 0 nothing wrong found, 1 the analysis found a
 * problem (the verdict names it), 2 bad usage or unreadable dumps. See
 * trainrun-fr(1).
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/commands.h"
#include "trainrun/error.h"
#include "trainrun/fr_analyze.h"

static void analyze_usage(FILE* out) {
  fprintf(out,
          "usage: trainrun fr analyze DIR [options]\n"
          "\n"
          "Read the per-rank flight-recorder dumps in DIR (trainrun's or "
          "PyTorch's,\n"
          "pickle or JSON) and report which rank diverged, and where.\n"
          "  -p, --prefix P              file-name prefix before the rank "
          "(default:\n"
          "                              inferred)\n"
          "  -j, --just-print-entries    table of entries, one column per "
          "rank\n"
          "  --selected-ranks R...       -j: only these ranks\n"
          "  --pg-filters NAME...        -j: only these process groups (name "
          "or desc)\n"
          "  --mismatch-cap N            findings reported per group "
          "(default 10)\n"
          "  --allow-incomplete-ranks    analyze although some ranks left no "
          "dump\n"
          "  -v, --verbose               more detail in each -j cell\n"
          "  --json                      the analysis as one JSON object\n"
          "Exit: 0 nothing found, 1 a problem found, 2 bad usage or input.\n"
          "See trainrun-fr(1).\n");
}

static int is_flag(const char* s) { return s[0] == '-' && s[1] != '\0'; }

static int parse_int(const char* flag, const char* v, int* out) {
  char* end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || end == v || x < 0 || x > 1 << 24) {
    fprintf(stderr, "trainrun: %s: '%s' is not a non-negative integer\n", flag,
            v);
    return -1;
  }
  *out = (int)x;
  return 0;
}

static int fr_analyze(int argc, char** argv) {
  tr_fra_opts_t o;
  tr_fra_opts_init(&o);
  const char* dir = NULL;
  int just_print = 0, as_json = 0, rc = 2;
  int* ranks = calloc((size_t)argc + 1, sizeof *ranks);
  const char** pgs = calloc((size_t)argc + 1, sizeof *pgs);
  size_t nranks = 0, npgs = 0;
  int sel = 0, pgf = 0;
  if (!ranks || !pgs) goto out;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      analyze_usage(stdout);
      rc = 0;
      goto out;
    } else if (strcmp(a, "-p") == 0 || strcmp(a, "--prefix") == 0) {
      if (++i >= argc) goto missing_value;
      o.prefix = argv[i];
    } else if (strcmp(a, "-j") == 0 || strcmp(a, "--just_print_entries") == 0 ||
               strcmp(a, "--just-print-entries") == 0) {
      just_print = 1;
    } else if (strcmp(a, "--selected-ranks") == 0 ||
               strcmp(a, "--selected_ranks") == 0) {
      sel = 1;
      while (i + 1 < argc && !is_flag(argv[i + 1])) {
        if (parse_int(a, argv[++i], &ranks[nranks]) < 0) goto out;
        nranks++;
      }
    } else if (strcmp(a, "--pg-filters") == 0 ||
               strcmp(a, "--pg_filters") == 0) {
      pgf = 1;
      while (i + 1 < argc && !is_flag(argv[i + 1])) pgs[npgs++] = argv[++i];
    } else if (strcmp(a, "--mismatch-cap") == 0 ||
               strcmp(a, "--mismatch_cap") == 0) {
      if (++i >= argc) goto missing_value;
      if (parse_int(a, argv[i], &o.mismatch_cap) < 0) goto out;
    } else if (strcmp(a, "--allow-incomplete-ranks") == 0) {
      o.allow_incomplete_ranks = 1;
    } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
      o.verbose = 1;
    } else if (strcmp(a, "--json") == 0) {
      as_json = 1;
    } else if (is_flag(a)) {
      fprintf(stderr, "trainrun: fr analyze: unknown option '%s'\n", a);
      analyze_usage(stderr);
      goto out;
    } else if (!dir) {
      dir = a;
    } else {
      fprintf(stderr, "trainrun: fr analyze: one folder only ('%s', '%s')\n",
              dir, a);
      goto out;
    }
  }
  if (!dir) {
    analyze_usage(stderr);
    goto out;
  }
  if ((sel || pgf) && !just_print) {
    /* torchfrtrace asserts the same */
    fprintf(stderr,
            "trainrun: fr analyze: --selected-ranks and --pg-filters need "
            "-j\n");
    goto out;
  }
  if (sel && nranks == 0) {
    fprintf(stderr, "trainrun: --selected-ranks: give at least one rank\n");
    goto out;
  }
  if (pgf && npgs == 0) {
    fprintf(stderr, "trainrun: --pg-filters: give at least one group\n");
    goto out;
  }
  if (sel) {
    o.selected_ranks = ranks;
    o.n_selected_ranks = nranks;
  }
  if (pgf) {
    o.pg_filters = pgs;
    o.n_pg_filters = npgs;
  }
  tr_fra_t* a = NULL;
  tr_errmsg_t err;
  tr_errmsg_clear(&err);
  int r = tr_fra_load_dir(&a, dir, &o, &err);
  if (r < 0) {
    fprintf(stderr, "trainrun: %s\n", err.message);
    goto out;
  }
  if (just_print) {
    r = tr_fra_print_entries(a, stdout);
    if (r < 0) fprintf(stderr, "trainrun: fr analyze: %s\n", tr_strerror(r));
    tr_fra_free(a);
    rc = r < 0 ? 2 : 0;
    goto out;
  }
  r = tr_fra_analyze(a, &err);
  int pr = 0;
  if (r != TR_ENOMEM)
    pr =
        as_json ? tr_fra_print_json(a, stdout) : tr_fra_print_report(a, stdout);
  if (r < 0) fprintf(stderr, "trainrun: %s\n", err.message);
  if (pr < 0) fprintf(stderr, "trainrun: fr analyze: %s\n", tr_strerror(pr));
  rc = r == TR_ENOMEM || pr < 0 ? 2 : r == 0 ? 0 : 1;
  tr_fra_free(a);
  goto out;
missing_value:
  fprintf(stderr, "trainrun: fr analyze: '%s' needs a value\n", argv[argc - 1]);
out:
  free(ranks);
  free(pgs);
  fflush(stdout);
  return rc;
}

/* The fr subcommands: `trainrun fr NAME args...` calls fn(argc, argv) with
 * argv[0] == NAME. Add an entry here for a new one (and a line to usage). */
static const struct {
  const char* name;
  int (*fn)(int argc, char** argv);
  const char* help;
} fr_commands[] = {
    {"analyze", fr_analyze,
     "analyze DIR [options]    which rank hung where, from the dumps"},
    {"dump", tr__fr_cmd_dump,
     "dump                     the running job's rings to dump files now"},
    {"follow", tr__fr_cmd_follow,
     "follow [options]         live collectives of the running job"},
};

static void fr_usage(FILE* out) {
  fprintf(out, "usage: trainrun fr COMMAND [args]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof fr_commands / sizeof fr_commands[0]; i++)
    fprintf(out, "  %s\n", fr_commands[i].help);
  fprintf(out, "\nSee trainrun-fr(1).\n");
}

int tr_cmd_fr(int argc, char** argv) {
  if (argc < 2) {
    fr_usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
    fr_usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof fr_commands / sizeof fr_commands[0]; i++)
    if (strcmp(argv[1], fr_commands[i].name) == 0)
      return fr_commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "trainrun: fr: unknown command '%s'\n", argv[1]);
  fr_usage(stderr);
  return 2;
}
