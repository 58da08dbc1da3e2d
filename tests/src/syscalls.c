/* The attacks of the isolation tests: each system call the run user's
 * seccomp denylist names, tried with arguments that change nothing, and
 * its outcome printed as `name=ok` or `name=ERRNO` (one per line). Built
 * statically by `attack::syscalls_binary` so it runs in any image. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static void report(const char *name, long rc) {
  if (rc >= 0) {
    printf("%s=ok\n", name);
  } else if (errno == EPERM) {
    printf("%s=EPERM\n", name);
  } else if (errno == ENOSYS) {
    printf("%s=ENOSYS\n", name);
  } else {
    printf("%s=errno%d\n", name, errno);
  }
  fflush(stdout);
}

int main(void) {
  /* A bad target pointer: EFAULT when the kernel looks, EPERM when the
   * filter answers first. */
  report("mount", syscall(SYS_mount, NULL, (char *)1, NULL, 0, NULL));
  report("umount2", syscall(SYS_umount2, (char *)1, 0));
  report("bpf", syscall(SYS_bpf, -1, NULL, 0));
  report("io_uring_setup", syscall(SYS_io_uring_setup, 0, NULL));
  report("perf_event_open", syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0));
  report("keyctl", syscall(SYS_keyctl, -1, 0, 0, 0, 0));
  report("userfaultfd", syscall(SYS_userfaultfd, -1));
  report("open_by_handle_at", syscall(SYS_open_by_handle_at, -1, NULL, 0));
  report("clone3", syscall(SYS_clone3, NULL, 0));
  long pid = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);
  if (pid == 0) _exit(0);
  if (pid > 0) waitpid((pid_t)pid, NULL, 0);
  report("clone_user", pid);
  /* Still allowed: a plain fork. */
  pid = fork();
  if (pid == 0) _exit(0);
  if (pid > 0) waitpid((pid_t)pid, NULL, 0);
  report("fork", pid);
  /* Last (each changes this process): a user namespace of its own, then
   * its parent as its tracer (no signal comes after, so it never stops). */
  report("unshare_user", syscall(SYS_unshare, CLONE_NEWUSER));
  report("ptrace", syscall(SYS_ptrace, 0 /* PTRACE_TRACEME */, 0, 0, 0));
  return 0;
}
