/*
 * Listening sockets, created by the master only: per TCP listen address a
 * set of SO_REUSEPORT sockets (listener slots), and one unix socket.
 */
#ifndef PGB_MASTER_LISTEN_H
#define PGB_MASTER_LISTEN_H

#include <stdbool.h>
#include <sys/socket.h>

#include "common/config.h"
#include "worker_entry.h" /* LISTEN_MAX_TCP */

typedef struct ListenAddr {
	struct sockaddr_storage sa; /* resolved address with the port */
	socklen_t salen;
	char desc[128];   /* "127.0.0.1:6432", "[::1]:6432" */
	int inherited_fd; /* a socket passed by systemd, shared by every worker; -1 = ours */
} ListenAddr;

typedef struct Listener {
	int fd;         /* listening socket */
	int addr_index; /* index into ListenSet.addrs; -1 for the unix socket */
	char desc[300]; /* for logs */
} Listener;

/*
 * A listening socket received from the old master at an online restart
 * (-R): its listener slot (-1 for the unix socket) and its bound address.
 * fd is -1 once someone took it.
 */
typedef struct InheritedSocket {
	int fd;
	uint32_t id; /* the listener id it had in the old tree (UINT32_MAX: the unix socket) */
	int slot;
	struct sockaddr_storage sa;
	socklen_t salen;
} InheritedSocket;

typedef struct ListenSet {
	ListenAddr *addrs; /* TCP addresses that could be bound */
	int n_addrs;
	Listener *tcp; /* first listener slot of each address */
	int n_tcp;
	Listener unix_sock; /* fd -1 when there is no unix socket */
	char unix_path[256];
	bool unix_inherited; /* passed by systemd: its file is not ours to remove */
	bool unix_borrowed;  /* taken over (-R) and not yet ours: never unlink unix_path */
} ListenSet;

/*
 * Socket activation (doc/packaging.md): take the sockets systemd passed
 * (LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES) before anything else opens a
 * file, and clear those variables. Returns how many there are.
 */
int listen_take_inherited(void);

/* Boot step 4: fatal "unix socket is in use, cannot continue" if another process answers. */
void listen_check_unix_in_use(const CfGlobals *g);

/* Whether a process accepts on the configured unix socket (what listen_check_unix_in_use() refuses). */
bool listen_unix_in_use(const CfGlobals *g);

/*
 * Open every listener the config asks for; fatal when nothing works
 * (doc/pgbouncer.1.md, "EXIT STATUS"). An address (or the unix socket) that
 * one of `inh` (online restart; may be NULL) is bound to takes that socket
 * of slot 0 instead of binding a new one.
 */
void listen_setup(ListenSet *ls, const CfGlobals *g, InheritedSocket *inh, int n_inh);

/* A socket taken over (-R): this configuration's tcp_defer_accept, tcp_socket_buffer, listen_backlog. */
void listen_apply_options(int fd, const CfGlobals *g);

/* Same family, address and port. */
bool listen_addr_same(const struct sockaddr *a, const struct sockaddr *b);

/*
 * Open one more SO_REUSEPORT socket on address `addr_index`, or for a socket
 * passed by systemd a duplicate of it (one accept queue for every worker);
 * -1 on failure (logged).
 */
int listen_open_slot(const ListenSet *ls, int addr_index, const CfGlobals *g);

/* Close everything and remove the unix socket file (at exit). */
void listen_close_all(ListenSet *ls);

#endif
