/*
 * The master's listening sockets: TCP addresses resolved once at start,
 * SO_REUSEPORT on every TCP socket so each worker can own a slot of its
 * own, and the unix socket file with its lock, mode and group. Under
 * systemd socket activation the sockets systemd passed replace all of
 * that (doc/packaging.md, "Socket activation").
 */
#include "autoconfig.h"

#include "master/listen.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "common/log.h"
#include "common/util.h"

/* "host:port" or "[v6]:port" of a TCP address, for the log. */
static void format_listen_addr(const struct sockaddr *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";
	int port;
	if (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) {
		snprintf(buf, len, "?");
		return;
	}
	sockaddr_host_port(sa, host, sizeof(host), &port);
	snprintf(buf, len, sa->sa_family == AF_INET6 ? "[%s]:%d" : "%s:%d", host, port);
}

/* Fill a sockaddr_un for the unix socket; abstract names start with '@'. */
static socklen_t unix_sockaddr(const CfGlobals *g, struct sockaddr_un *un, char *path, size_t pathlen)
{
	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	snprintf(path, pathlen, "%s/.s.PGSQL.%d", g->unix_socket_dir, g->listen_port);
	if (strlen(path) >= sizeof(un->sun_path))
		fatal("unix socket path too long: %s", path);
	memcpy(un->sun_path, path, strlen(path));
	if (path[0] == '@') {
		un->sun_path[0] = '\0';
		return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path));
	}
	return (socklen_t)sizeof(*un);
}

static bool have_unix_socket(const CfGlobals *g)
{
	return g->unix_socket_dir && g->unix_socket_dir[0];
}

/*
 * Sockets passed by systemd. The protocol is three environment variables
 * and fds from 3 on, so it is read here directly rather than through
 * sd_listen_fds(): one code path whether or not the build has libsystemd.
 */
#define SD_FIRST_FD   3
#define MAX_INHERITED 64
static struct {
	int n;
	int fd[MAX_INHERITED];
	char name[MAX_INHERITED][64];
} inherited;

int listen_take_inherited(void)
{
	const char *pid_s = getenv("LISTEN_PID");
	const char *fds_s = getenv("LISTEN_FDS");
	const char *names = getenv("LISTEN_FDNAMES");
	inherited.n = 0;
	if (!pid_s || !fds_s)
		return 0;
	char *end;
	errno = 0;
	unsigned long pid = strtoul(pid_s, &end, 10);
	bool for_us = errno == 0 && *end == '\0' && end != pid_s && pid == (unsigned long)getpid();
	long n = strtol(fds_s, &end, 10);
	if (for_us && (*end != '\0' || end == fds_s || n < 0)) {
		log_warning("LISTEN_FDS=%s is not a count of sockets: ignored", fds_s);
		for_us = false;
	}
	if (for_us && n > MAX_INHERITED) {
		log_warning("systemd passed %ld sockets; only the first %d are used", n, MAX_INHERITED);
		n = MAX_INHERITED;
	}
	if (for_us) {
		const char *p = names;
		for (int i = 0; i < n; i++) {
			int fd = SD_FIRST_FD + i;
			if (fcntl(fd, F_GETFD) < 0) {
				log_warning("LISTEN_FDS names fd %d, which is not open", fd);
				continue;
			}
			fcntl(fd, F_SETFD, FD_CLOEXEC);
			inherited.fd[inherited.n] = fd;
			inherited.name[inherited.n][0] = '\0';
			if (p) {
				size_t len = strcspn(p, ":");
				snprintf(inherited.name[inherited.n], sizeof(inherited.name[0]), "%.*s", (int)len, p);
				p = p[len] ? p + len + 1 : NULL;
			}
			inherited.n++;
		}
	}
	/* LISTEN_PID names another process (a parent's): not ours, and not for anything we start */
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return inherited.n;
}

bool listen_unix_in_use(const CfGlobals *g)
{
	/* under socket activation the socket answering is systemd's own */
	if (!have_unix_socket(g) || inherited.n > 0)
		return false;
	struct sockaddr_un un;
	char path[256];
	socklen_t len = unix_sockaddr(g, &un, path, sizeof(path));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		fatal("socket() failed: %s", strerror(errno));
	int rc = connect(fd, (struct sockaddr *)&un, len);
	close(fd);
	return rc == 0;
}

void listen_check_unix_in_use(const CfGlobals *g)
{
	if (listen_unix_in_use(g))
		fatal("unix socket is in use, cannot continue");
}

static void set_nonblocking(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		fatal("fcntl() failed: %s", strerror(errno));
}

static int open_tcp(const ListenAddr *a, const CfGlobals *g, char *err, size_t errlen)
{
	int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket() failed: %s", strerror(errno));
		return -1;
	}
	int on = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
	/* every worker owns its own socket on the same port: reuseport is implied */
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on)) < 0) {
		snprintf(err, errlen, "setsockopt(SO_REUSEPORT) failed: %s", strerror(errno));
		close(fd);
		return -1;
	}
	if (a->sa.ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
	if (g->tcp_defer_accept) {
		int val = 1;
		if (setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &val, sizeof(val)) < 0)
			log_warning("setsockopt(TCP_DEFER_ACCEPT) failed: %s", strerror(errno));
	}
	if (g->tcp_socket_buffer > 0) {
		/*
		 * Accepted sockets inherit these, and TCP agrees on its window
		 * before accept(): set after it, a smaller buffer than the window
		 * offered makes the kernel drop data (doc/pgbouncer.5.md).
		 */
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &g->tcp_socket_buffer, sizeof(int));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &g->tcp_socket_buffer, sizeof(int));
	}
	if (bind(fd, (const struct sockaddr *)&a->sa, a->salen) < 0) {
		snprintf(err, errlen, "bind(): %s", strerror(errno));
		close(fd);
		return -1;
	}
	if (listen(fd, g->listen_backlog) < 0) {
		snprintf(err, errlen, "listen(): %s", strerror(errno));
		close(fd);
		return -1;
	}
	set_nonblocking(fd);
	return fd;
}

/*
 * Our own sockets always carry SO_REUSEPORT (one per worker), so binding
 * them would succeed beside another process's SO_REUSEPORT socket and
 * split the port's connections with it. Without so_reuseport, as in
 * PgBouncer, a port another process listens on is refused: a socket
 * without the option cannot bind there (doc/pgbouncer.5.md "so_reuseport").
 */
static bool tcp_port_taken(const ListenAddr *a, char *err, size_t errlen)
{
	int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false; /* open_tcp() reports it */
	int on = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
	if (a->sa.ss_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
	bool taken = bind(fd, (const struct sockaddr *)&a->sa, a->salen) < 0 && errno == EADDRINUSE;
	if (taken)
		snprintf(err, errlen, "bind(): %s (another process listens there; so_reuseport = 1 allows it)",
		         strerror(EADDRINUSE));
	close(fd);
	return taken;
}

int listen_open_slot(const ListenSet *ls, int addr_index, const CfGlobals *g)
{
	if (ls->addrs[addr_index].inherited_fd >= 0) {
		/*
		 * Binding another socket beside systemd's would need its user and
		 * SO_REUSEPORT on it: every worker accepts from the one queue.
		 */
		int fd = fcntl(ls->addrs[addr_index].inherited_fd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			log_error("cannot share %s: dup failed: %s", ls->addrs[addr_index].desc, strerror(errno));
		return fd;
	}
	char err[256];
	int fd = open_tcp(&ls->addrs[addr_index], g, err, sizeof(err));
	if (fd < 0)
		log_error("cannot listen on %s: %s", ls->addrs[addr_index].desc, err);
	return fd;
}

bool listen_addr_same(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return false;
	if (a->sa_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
		return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
	}
	if (a->sa_family == AF_INET6) {
		const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
		return x->sin6_port == y->sin6_port && memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0;
	}
	return false;
}

void listen_apply_options(int fd, const CfGlobals *g)
{
	int val = g->tcp_defer_accept ? 1 : 0;
	if (setsockopt(fd, IPPROTO_TCP, TCP_DEFER_ACCEPT, &val, sizeof(val)) < 0)
		log_warning("setsockopt(TCP_DEFER_ACCEPT) failed: %s", strerror(errno));
	if (g->tcp_socket_buffer > 0) {
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &g->tcp_socket_buffer, sizeof(int));
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &g->tcp_socket_buffer, sizeof(int));
	}
	/* listen() again on a listening socket changes only its backlog */
	if (listen(fd, g->listen_backlog) < 0)
		log_warning("listen() failed: %s", strerror(errno));
}

/* The old master's socket of slot 0 bound to `sa`, taken out of `inh`; -1 if none. */
static int take_inherited(InheritedSocket *inh, int n_inh, const struct sockaddr *sa)
{
	for (int i = 0; i < n_inh; i++)
		if (inh[i].fd >= 0 && inh[i].slot == 0 && listen_addr_same((struct sockaddr *)&inh[i].sa, sa)) {
			int fd = inh[i].fd;
			inh[i].fd = -1;
			return fd;
		}
	return -1;
}

/* Address `a` served by listening socket `fd`: one more entry of ls->addrs and ls->tcp (slot 0's socket). */
static void add_tcp(ListenSet *ls, const ListenAddr *a, int fd)
{
	ls->addrs = xrealloc(ls->addrs, sizeof(*ls->addrs) * (ls->n_addrs + 1));
	ls->tcp = xrealloc(ls->tcp, sizeof(*ls->tcp) * (ls->n_tcp + 1));
	ls->addrs[ls->n_addrs] = *a;
	Listener *l = &ls->tcp[ls->n_tcp++];
	l->fd = fd;
	l->addr_index = ls->n_addrs++;
	snprintf(l->desc, sizeof(l->desc), "%s", a->desc);
}

/*
 * No worker would accept on an address beyond LISTEN_MAX_TCP: its
 * connections would wait in a queue nobody serves. Refused instead, so
 * that they are refused at once, and said in the log.
 */
static bool too_many_tcp(const ListenSet *ls, const char *desc)
{
	if (ls->n_tcp < LISTEN_MAX_TCP)
		return false;
	log_error("cannot listen on %s: at most %d TCP addresses are served", desc, LISTEN_MAX_TCP);
	return true;
}

/* Resolve one listen_addr item and open a socket for every address it gives. */
static void setup_tcp_item(ListenSet *ls, const char *item, const CfGlobals *g, char *lasterr, size_t errlen,
                           InheritedSocket *inh, int n_inh)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
	struct addrinfo *res = NULL;
	char port[16];
	snprintf(port, sizeof(port), "%d", g->listen_port);
	const char *host = strcmp(item, "*") == 0 ? NULL : item;
	int rc = getaddrinfo(host, port, &hints, &res);
	if (rc != 0) {
		snprintf(lasterr, errlen, "%s: %s", item, gai_strerror(rc));
		log_warning("cannot listen on %s: getaddrinfo(): %s", item, gai_strerror(rc));
		return;
	}
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
			continue;
		ListenAddr a = {.inherited_fd = -1};
		memcpy(&a.sa, ai->ai_addr, ai->ai_addrlen);
		a.salen = ai->ai_addrlen;
		format_listen_addr(ai->ai_addr, a.desc, sizeof(a.desc));
		if (too_many_tcp(ls, a.desc))
			continue;
		char err[256];
		int fd = take_inherited(inh, n_inh, ai->ai_addr);
		bool taken = fd >= 0;
		if (taken)
			listen_apply_options(fd, g);
		else if (!g->so_reuseport && tcp_port_taken(&a, err, sizeof(err)))
			fd = -1;
		else
			fd = open_tcp(&a, g, err, sizeof(err));
		if (fd < 0) {
			snprintf(lasterr, errlen, "%s: %s", a.desc, err);
			log_warning("cannot listen on %s: %s", a.desc, err);
			continue;
		}
		add_tcp(ls, &a, fd);
		log_info("listening on %s%s", a.desc, taken ? " (taken over from the old process)" : "");
	}
	freeaddrinfo(res);
}

static void setup_unix(ListenSet *ls, const CfGlobals *g, InheritedSocket *inh, int n_inh)
{
	struct sockaddr_un un;
	socklen_t len = unix_sockaddr(g, &un, ls->unix_path, sizeof(ls->unix_path));
	bool abstract = ls->unix_path[0] == '@';

	for (int i = 0; i < n_inh; i++)
		if (inh[i].fd >= 0 && inh[i].slot < 0) {
			/* the same file: the old master found us through this configuration */
			ls->unix_sock.fd = inh[i].fd;
			inh[i].fd = -1;
			ls->unix_borrowed = true;
			ls->unix_sock.addr_index = -1;
			snprintf(ls->unix_sock.desc, sizeof(ls->unix_sock.desc), "unix:%s", ls->unix_path);
			log_info("listening on unix:%s (taken over from the old process)", ls->unix_path);
			return;
		}

	if (!abstract) {
		char lock[300];
		struct stat st;
		snprintf(lock, sizeof(lock), "%s.lock", ls->unix_path);
		if (stat(lock, &st) == 0)
			fatal("unix port %d is in use", g->listen_port);
		/* nobody answered in listen_check_unix_in_use(): a leftover file */
		if (unlink(ls->unix_path) < 0 && errno != ENOENT)
			fatal("unlink(%s) failed: %s", ls->unix_path, strerror(errno));
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		fatal("socket() failed: %s", strerror(errno));
	if (bind(fd, (struct sockaddr *)&un, len) < 0)
		fatal("bind(%s) failed: %s", ls->unix_path, strerror(errno));
	if (!abstract) {
		if (chmod(ls->unix_path, (mode_t)g->unix_socket_mode) < 0)
			fatal("chmod(%s) failed: %s", ls->unix_path, strerror(errno));
		if (g->unix_socket_group && g->unix_socket_group[0]) {
			struct group *gr = getgrnam(g->unix_socket_group);
			if (!gr)
				fatal("unix_socket_group: unknown group '%s'", g->unix_socket_group);
			if (chown(ls->unix_path, (uid_t)-1, gr->gr_gid) < 0)
				fatal("chown(%s) failed: %s", ls->unix_path, strerror(errno));
		}
	}
	if (listen(fd, g->listen_backlog) < 0)
		fatal("listen(%s) failed: %s", ls->unix_path, strerror(errno));
	set_nonblocking(fd);
	ls->unix_sock.fd = fd;
	ls->unix_sock.addr_index = -1;
	snprintf(ls->unix_sock.desc, sizeof(ls->unix_sock.desc), "unix:%s", ls->unix_path);
	log_info("listening on unix:%s", ls->unix_path);
}

/* A socket systemd passed: one listening stream socket, TCP or unix. */
static void adopt_inherited(ListenSet *ls, int fd, const char *name)
{
	int type = 0, acc = 0;
	socklen_t optlen = sizeof(type);
	struct sockaddr_storage ss;
	socklen_t sslen = sizeof(ss);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &optlen) < 0 || type != SOCK_STREAM) {
		log_warning("systemd passed fd %d (%s), which is not a stream socket: ignored", fd, name);
		close(fd);
		return;
	}
	optlen = sizeof(acc);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &optlen) < 0 || !acc) {
		log_warning("systemd passed fd %d (%s), which is not listening (Accept=yes is not supported): ignored",
		            fd, name);
		close(fd);
		return;
	}
	memset(&ss, 0, sizeof(ss));
	if (getsockname(fd, (struct sockaddr *)&ss, &sslen) < 0) {
		log_warning("getsockname() on fd %d failed: %s", fd, strerror(errno));
		close(fd);
		return;
	}
	set_nonblocking(fd);
	if (ss.ss_family == AF_UNIX) {
		const struct sockaddr_un *un = (const struct sockaddr_un *)&ss;
		if (ls->unix_sock.fd >= 0) {
			log_warning("systemd passed a second unix socket (fd %d): only one is served", fd);
			close(fd);
			return;
		}
		size_t plen =
		    sslen > offsetof(struct sockaddr_un, sun_path) ? sslen - offsetof(struct sockaddr_un, sun_path) : 0;
		if (plen > 0 && un->sun_path[0] == '\0')
			snprintf(ls->unix_path, sizeof(ls->unix_path), "@%.*s", (int)(plen - 1), un->sun_path + 1);
		else
			snprintf(ls->unix_path, sizeof(ls->unix_path), "%.*s", (int)strnlen(un->sun_path, plen),
			         un->sun_path);
		ls->unix_sock.fd = fd;
		ls->unix_sock.addr_index = -1;
		ls->unix_inherited = true;
		snprintf(ls->unix_sock.desc, sizeof(ls->unix_sock.desc), "unix:%s", ls->unix_path);
		log_info("listening on unix:%s (passed by systemd)", ls->unix_path);
		return;
	}
	if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) {
		log_warning("systemd passed fd %d of address family %d: ignored", fd, ss.ss_family);
		close(fd);
		return;
	}
	ListenAddr a = {.inherited_fd = fd};
	memcpy(&a.sa, &ss, sslen);
	a.salen = sslen;
	format_listen_addr((struct sockaddr *)&ss, a.desc, sizeof(a.desc));
	if (too_many_tcp(ls, a.desc)) {
		close(fd);
		return;
	}
	add_tcp(ls, &a, fd);
	log_info("listening on %s (passed by systemd)", a.desc);
}

static void setup_inherited(ListenSet *ls, const CfGlobals *g)
{
	if (g->listen_addr && g->listen_addr[0])
		log_warning("listen_addr is not used: the listening sockets come from systemd");
	if (have_unix_socket(g))
		log_warning("unix_socket_dir gets no listening socket: the listening sockets come from systemd");
	for (int i = 0; i < inherited.n; i++)
		adopt_inherited(ls, inherited.fd[i], inherited.name[i][0] ? inherited.name[i] : "unnamed");
	if (ls->n_tcp == 0 && ls->unix_sock.fd < 0)
		fatal("nowhere to listen on: none of the sockets systemd passed can be used");
}

void listen_setup(ListenSet *ls, const CfGlobals *g, InheritedSocket *inh, int n_inh)
{
	memset(ls, 0, sizeof(*ls));
	ls->unix_sock.fd = -1;
	if (inherited.n > 0) {
		setup_inherited(ls, g);
		return;
	}

	bool want_tcp = false;
	char lasterr[512] = "";
	if (g->listen_addr && g->listen_addr[0]) {
		char *list = xstrdup(g->listen_addr), *save = NULL;
		for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
			while (*tok == ' ' || *tok == '\t')
				tok++;
			char *end = tok + strlen(tok);
			while (end > tok && (end[-1] == ' ' || end[-1] == '\t'))
				*--end = '\0';
			if (!*tok)
				continue;
			want_tcp = true;
			setup_tcp_item(ls, tok, g, lasterr, sizeof(lasterr), inh, n_inh);
		}
		free(list);
	}
	if (want_tcp && ls->n_tcp == 0)
		fatal("failed to listen on any address in listen_addr list: %s", lasterr);
	if (have_unix_socket(g))
		setup_unix(ls, g, inh, n_inh);
	if (ls->n_tcp == 0 && ls->unix_sock.fd < 0)
		fatal("nowhere to listen on");
}

void listen_close_all(ListenSet *ls)
{
	for (int i = 0; i < ls->n_tcp; i++)
		if (ls->tcp[i].fd >= 0)
			close(ls->tcp[i].fd);
	if (ls->unix_sock.fd >= 0) {
		close(ls->unix_sock.fd);
		ls->unix_sock.fd = -1;
		if (ls->unix_path[0] && ls->unix_path[0] != '@' && !ls->unix_inherited && !ls->unix_borrowed)
			unlink(ls->unix_path);
	}
	free(ls->tcp);
	free(ls->addrs);
	ls->tcp = NULL;
	ls->addrs = NULL;
	ls->n_tcp = ls->n_addrs = 0;
}
