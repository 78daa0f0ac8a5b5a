/*
 * The one function the master calls into the worker: the entry point of a
 * forked worker process, and the sockets it is handed. With include/shm.h
 * this is all the master knows of the worker (doc/architecture.md).
 */
#ifndef PGB_WORKER_ENTRY_H
#define PGB_WORKER_ENTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "common/config.h"
#include "common/console_state.h"
#include "common/tls.h"
#include "shm.h"

/*
 * TCP addresses served at most: a listener id is slot * LISTEN_MAX_TCP +
 * address, the numbering an online restart (-R) passes to the new master.
 */
#define LISTEN_MAX_TCP 16

/* A listening socket the master hands to a new worker. */
typedef struct WorkerSocket {
	int fd;
	uint32_t id;  /* the master's listener id (for hand-over messages) */
	bool is_unix; /* the Unix-domain socket */
} WorkerSocket;

/*
 * Run worker `id` in the forked child until it exits; returns the exit
 * status. cf, tls, console (the console's pause and database flags, which
 * the worker takes over) and shm are the master's (the worker takes its own
 * copies and references); the worker takes over the n sockets and frees
 * the `sockets` array (malloc()ed by the caller). master_fd is the
 * worker's end of its control channel; shm_fd the memfd behind shm (-1 =
 * none), kept for a master that adopts the worker should its own die.
 */
int worker_main(int id, Config *cf, const TlsContexts *tls, const ConsoleState *console, WorkerSocket *sockets, int n,
                int master_fd, int cmdline_verbose, ShmSegment *shm, int shm_fd);

#endif
