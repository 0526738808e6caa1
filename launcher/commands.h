/* launcher/commands.h: the subcommands and the default job path of the
 * trainrun CLI, called by main.c's dispatch. Each takes the arguments after
 * the program name (argv[0] is the subcommand, or the first argument when
 * there is none), prints its own messages prefixed "trainrun: ", and
 * returns the exit code: 0 success, 1 runtime failure, 2 bad usage or bad
 * input. */
#ifndef TRAINRUN_LAUNCHER_COMMANDS_H
#define TRAINRUN_LAUNCHER_COMMANDS_H

/* `trainrun config [JOB.toml] [overrides] [--world-size N] [--json]`. */
int tr_cmd_config(int argc, char** argv);

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

/* The exit code for a trainer error: 2 for bad input (config, data and
 * weight files, arguments), 1 for other failures, 0 for 0
 * (launcher/cmd_data.c). */
int tr__cmd_exit_code(int rc);

/* `trainrun [flags] JOB.toml [overrides]`: load and resolve the job config,
 * then run the job. */
int tr_launch_job(int argc, char** argv);

#endif /* TRAINRUN_LAUNCHER_COMMANDS_H */
