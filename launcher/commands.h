/* launcher/commands.h: the subcommands and the default job path of the
 * trainrun CLI, called by main.c's dispatch. Each takes the arguments after
 * the program name (argv[0] is the subcommand, or the first argument when
 * there is none), prints its own messages prefixed "trainrun: ", and
 * returns the exit code: 0 success, 1 runtime failure, 2 bad usage or bad
 * input. */
#ifndef TRAINRUN_LAUNCHER_COMMANDS_H
#define TRAINRUN_LAUNCHER_COMMANDS_H

#include <stdint.h>
#include <stdio.h> /* FILE */

#include "trainrun/config.h"

/* `trainrun config [JOB.toml] [overrides] [--world-size N] [--json]`. */
int tr_cmd_config(int argc, char** argv);

/* `trainrun plan JOB.toml [overrides] [--world-size N]`: mesh and memory
 * per rank (launcher/cmd_plan.c). */
int tr_cmd_plan(int argc, char** argv);

/* `trainrun store --port P [--host H] [--token-env]`: run a TCPStore server
 * until SIGINT/SIGTERM (launcher/cmd_store.c). */
int tr_cmd_store(int argc, char** argv);

/* `trainrun data prepare FILE... -o DIR` (launcher/cmd_data.c). */
int tr_cmd_data(int argc, char** argv);

/* `trainrun eval JOB.toml --weights FILE` (launcher/cmd_eval.c). */
int tr_cmd_eval(int argc, char** argv);

/* `trainrun sample --weights FILE --prompt TEXT` (launcher/cmd_sample.c). */
int tr_cmd_sample(int argc, char** argv);

/* `trainrun status`: what the node daemons running on this machine report
 * (launcher/cmd_status.c). */
int tr_cmd_status(int argc, char** argv);

/* `trainrun ckpt ls|inspect|verify|export|import` (launcher/cmd_ckpt.c). */
int tr_cmd_ckpt(int argc, char** argv);

/* `trainrun fr COMMAND`: the flight recorder's commands (analyze, ...)
 * through their own table (launcher/cmd_fr.c). */
int tr_cmd_fr(int argc, char** argv);
/* `trainrun fr dump` and `trainrun fr follow`: through the daemons' status
 * sockets (launcher/cmd_fr_live.c); argv[0] is "dump" / "follow". */
int tr__fr_cmd_dump(int argc, char** argv);
int tr__fr_cmd_follow(int argc, char** argv);

/* The exit code for a trainer error: 2 for bad input (config, data and
 * weight files, arguments), 1 for other failures, 0 for 0
 * (launcher/cmd_data.c). */
int tr__cmd_exit_code(int rc);

/* `trainrun [flags] JOB.toml [overrides]`: load and resolve the job config,
 * then run the job. */
int tr_launch_job(int argc, char** argv);

/* ---- the job path and config overrides (launcher/jobargs.c) ----
 *
 * The commands that load a job (`trainrun JOB.toml`, `config`, `eval`)
 * split their arguments the same way: every `--section.key value` /
 * `--section.key=value` (tr_config_arg_span) is a config override, other
 * flags belong to the command, and the one bare word is the job path:
 *
 *     tr__jobargs_opts_t o = {.cmd = "eval", .first = 1, .flag = eval_flag,
 *                             .arg = &state};
 *     tr__jobargs_t ja;
 *     int code = tr__jobargs_parse(&ja, argc, argv, &o);
 *     if (code >= 0) return code;       // --help, or a message printed
 *     tr_config_load(&cfg, ja.path, ja.n, ja.overrides, &err);
 *     ...
 *     tr__jobargs_release(&ja);
 */
typedef struct {
  const char* path; /* the job file (an element of argv); NULL: none */
  char** overrides; /* the override arguments, in order (argv elements) */
  int n;
} tr__jobargs_t;

typedef struct {
  /* the subcommand named in messages ("trainrun: config: unknown flag
   * ..."); NULL for the default command, whose messages end with "(see
   * trainrun --help)" */
  const char* cmd;
  int first; /* index of the first argument to split */
  /* The command's own flag at argv[i] (may be NULL: it has none): return
   * how many arguments it took (>= 1), 0 when it is not one of its flags
   * (an unknown flag), or -1 to stop with *exit_code (0 after --help, 2
   * after printing what was wrong with a value). */
  int (*flag)(void* arg, int argc, char** argv, int i, int* exit_code);
  /* Check a bare word before it becomes the job path (may be NULL): 0
   * accepts it, > 0 is the exit code (the message printed). */
  int (*check_path)(const char* word);
  /* Printed to stderr after the unknown-flag message (may be NULL). */
  void (*usage)(FILE* out);
  void* arg; /* passed to flag */
} tr__jobargs_opts_t;

/* Split argv[o->first .. argc) into *ja. Returns -1 when the arguments
 * are fine (release *ja with tr__jobargs_release), else the exit code the
 * command returns, its message printed and *ja released: an unknown flag
 * or a second job file (2), a flag callback's code, out of memory (1). */
int tr__jobargs_parse(tr__jobargs_t* ja, int argc, char** argv,
                      const tr__jobargs_opts_t* o);
void tr__jobargs_release(tr__jobargs_t* ja);

/* ---- the job checks (launcher/jobcheck.c) ---- */

/* Everything a run refuses before it starts, for every command that takes
 * a job (the run, --dry-run, config, plan): tr_config_resolve for a world
 * of `world` ranks (under [comm] mode = "fake_backend", for
 * comm.fake_world_size, and world must be 1 or that), the fault specs and
 * the backend list through their modules' parsers, and the keys whose
 * feature is not built. TR_ECONFIG with the message in err, naming
 * file:line:col or the flag. */
int tr__job_check(tr_config_t* cfg, int64_t world, tr_errmsg_t* err);

/* 1 when the job trains over MPI: a CPU job whose [comm] backend serves
 * CPU tensors with mpi (its ranks are then MPI's processes, started by
 * mpirun: launcher/mpirun.c). */
int tr__job_uses_mpi(const tr_config_t* cfg);

/* One "trainrun: note: ..." line on out for each key set to a value that
 * changes nothing in trainrun (torchtitan keys of features it lacks),
 * saying why. */
void tr__job_notes(const tr_config_t* cfg, FILE* out);

#endif /* TRAINRUN_LAUNCHER_COMMANDS_H */
