/*
 * The pidfile: refuse to start next to a live instance, remove a stale
 * file, write ours exclusively, remove it at a normal exit.
 */
#ifndef PGB_MASTER_PIDFILE_H
#define PGB_MASTER_PIDFILE_H

#include <stdbool.h>
#include <sys/types.h>

/* Fatal if `path` names a live process (or cannot be read); removes a stale file. */
void pidfile_check(const char *path);

/* The pid the pidfile names if that process runs (a zombie does not), else 0; 0 without a pidfile. */
pid_t pidfile_running(const char *path);

/* Create `path` exclusively with "<pid>\n", mode 0644. Fatal on failure. */
void pidfile_write(const char *path);

/*
 * Online restart: replace the other master's pidfile with ours (atomically),
 * the new master's after its commit, or the old master's when it resumes.
 * Both are serving then: a failure (a full file system) is logged and
 * returns false, and the caller goes on.
 */
bool pidfile_replace(const char *path);

/* Online restart, old side: the pidfile is the new master's now; never remove it. */
void pidfile_forget(void);

/* Remove the pidfile written by pidfile_write() (no-op if none). */
void pidfile_remove(void);

#endif
