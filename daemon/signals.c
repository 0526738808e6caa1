/* daemon/signals.c: the daemon's signals -- SIGINT, SIGTERM, SIGHUP and
 * SIGCHLD written to a self-pipe the event loop polls, the stop signal
 * received (the rendezvous and the supervision loop give up on it), and
 * signal names and wait statuses in words. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/internal.h"
#include "trainrun/error.h"

static volatile sig_atomic_t sig_fd = -1;
static volatile sig_atomic_t interrupted; /* the last stop signal, or 0 */

static void on_signal(int sig) {
  int saved = errno;
  if (sig != SIGCHLD) interrupted = sig;
  unsigned char b = (unsigned char)sig;
  if (sig_fd >= 0) {
    ssize_t w = write(sig_fd, &b, 1);
    (void)w;
  }
  errno = saved;
}

int tr__daemon_interrupted(void) { return interrupted != 0; }

int tr__daemon_stop_signal(void) { return (int)interrupted; }

const char* tr__daemon_signame(int sig) {
  const char* s = sigabbrev_np(sig);
  return s ? s : "?";
}

const char* tr__daemon_describe_status(int status, char* buf, size_t cap) {
  if (WIFEXITED(status))
    snprintf(buf, cap, "exited with code %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, cap, "was killed by signal %d (SIG%s)%s", WTERMSIG(status),
             tr__daemon_signame(WTERMSIG(status)),
             WCOREDUMP(status) ? ", core dumped" : "");
  else
    snprintf(buf, cap, "ended with wait status %d", status);
  return buf;
}

int tr__daemon_signals_setup(tr__daemon_t* d, struct sigaction* old) {
  if (pipe2(d->sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
    return tr_err_from_errno();
  sig_fd = d->sig_pipe[1];
  interrupted = 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
  for (int i = 0; i < 4; i++) sigaction(sigs[i], &sa, &old[i]);
  struct sigaction ign;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &old[4]);
  return 0;
}

void tr__daemon_signals_restore(tr__daemon_t* d, const struct sigaction* old) {
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
  for (int i = 0; i < 5; i++) sigaction(sigs[i], &old[i], NULL);
  sig_fd = -1;
  for (int i = 0; i < 2; i++)
    if (d->sig_pipe[i] >= 0) close(d->sig_pipe[i]);
}
