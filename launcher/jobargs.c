/* launcher/jobargs.c: the command-line split the job commands share
 * (`trainrun JOB.toml`, `trainrun config`, `trainrun eval`): the job path,
 * the `--section.key value` config overrides, the command's own flags, and
 * the messages for an unknown flag or a second job file. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/commands.h"
#include "trainrun/config.h" /* tr_config_arg_span */
#include "trainrun/error.h"

void tr__jobargs_release(tr__jobargs_t* ja) {
  free(ja->overrides);
  memset(ja, 0, sizeof *ja);
}

int tr__jobargs_parse(tr__jobargs_t* ja, int argc, char** argv,
                      const tr__jobargs_opts_t* o) {
  memset(ja, 0, sizeof *ja);
  /* "trainrun: config: " or "trainrun: " */
  const char* cmd = o->cmd ? o->cmd : "";
  const char* sep = o->cmd ? ": " : "";
  ja->overrides = calloc((size_t)argc + 1, sizeof *ja->overrides);
  if (!ja->overrides) {
    fprintf(stderr, "trainrun: %s\n", tr_strerror(TR_ENOMEM));
    return 1;
  }
  int code = -1;
  for (int i = o->first; i < argc && code < 0;) {
    const char* a = argv[i];
    int span = tr_config_arg_span(argc, argv, i);
    if (span > 0) {
      for (int j = 0; j < span; j++) ja->overrides[ja->n++] = argv[i + j];
      i += span;
      continue;
    }
    if (a[0] == '-' && a[1]) {
      int took = o->flag ? o->flag(o->arg, argc, argv, i, &code) : 0;
      if (took > 0) {
        i += took;
        continue;
      }
      if (took < 0) break; /* the flag set the exit code */
      fprintf(stderr, "trainrun: %s%sunknown flag '%s'%s\n", cmd, sep, a,
              o->cmd ? "" : " (see trainrun --help)");
      if (o->usage) o->usage(stderr);
      code = 2;
      break;
    }
    if (ja->path) {
      fprintf(stderr, "trainrun: %s%smore than one job file ('%s', '%s')\n",
              cmd, sep, ja->path, a);
      code = 2;
      break;
    }
    if (o->check_path) {
      int c = o->check_path(a);
      if (c > 0) {
        code = c;
        break;
      }
    }
    ja->path = a;
    i++;
  }
  if (code >= 0) tr__jobargs_release(ja);
  return code;
}
