/*
 * A worker whose master died (doc/workers.md "When the master dies"): it
 * serves on, waits on its adoption socket for a master started again with
 * the same configuration, and shuts down safely if none comes within
 * worker_orphan_timeout.
 */
#ifndef PGB_WORKER_ORPHAN_H
#define PGB_WORKER_ORPHAN_H

#include <stdbool.h>

/*
 * The control channel closed (why: the error, NULL at EOF). True: the
 * worker goes on (an orphan waiting to be adopted, or finishing a drain
 * it had started); false: it exits, as a worker whose master may not be
 * outlived (CH_SETTLE never came, worker_orphan_timeout 0, or it is
 * shutting down).
 */
bool orphan_begin(const char *why);

/* loop/worker_main.c: fd becomes the control channel from a master (ours at start, or the one adopting us). */
void worker_master_attach(int fd);

#endif
