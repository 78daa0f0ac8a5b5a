/*
 * c-ares in the worker's event loop: one channel, its sockets watched with
 * libevent, its timeouts on a timer; answers cached per name. When a lookup
 * ends, every pool with waiting clients gets another chance to connect.
 */
#include "autoconfig.h"

#include "worker/dns.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "common/log.h"
#include "common/util.h"
#include "worker/cancel.h"
#include "worker/pool.h"
#include "worker/worker.h"

#define DNS_MAX_ADDRS 16
#define DNS_MAX_SOCKS 16

typedef struct DnsEntry {
	List node;
	char name[256];
	struct sockaddr_storage addrs[DNS_MAX_ADDRS]; /* port 0; set per lookup */
	int n_addrs;
	int next;       /* round-robin position */
	usec_t expires; /* answer (or failure) valid until */
	bool pending;   /* lookup in flight */
	bool failed;    /* last lookup failed */
	char err[320];
} DnsEntry;

static ares_channel channel;
static List entries;
/* inside ares_getaddrinfo(): an answer now is the caller's own (e.g. from /etc/hosts) */
static bool looking_up;
/*
 * The entry whose answer is being handed out: to the lookup that asked, or
 * to the pools woken by it. It is used even if already expired, so that
 * dns_max_ttl = 0 (no caching) still connects instead of asking again
 * forever.
 */
static const DnsEntry *answering;
static struct event *timer;
static struct {
	int fd;
	struct event *ev;
} socks[DNS_MAX_SOCKS];

static void arm_timer(void)
{
	struct timeval max = {1, 0}, tv;
	struct timeval *t = ares_timeout(channel, &max, &tv);
	evtimer_add(timer, t);
}

static void on_sock(evutil_socket_t fd, short what, void *arg)
{
	worker_clock_tick();
	ares_process_fd(channel, (what & EV_READ) ? fd : ARES_SOCKET_BAD, (what & EV_WRITE) ? fd : ARES_SOCKET_BAD);
	arm_timer();
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	worker_clock_tick();
	ares_process_fd(channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
	arm_timer();
}

/* c-ares tells which of its sockets want reading/writing. */
static void sock_state(void *data, ares_socket_t fd, int readable, int writable)
{
	int slot = -1, free_slot = -1;
	for (int i = 0; i < DNS_MAX_SOCKS; i++) {
		if (socks[i].ev && socks[i].fd == fd)
			slot = i;
		else if (!socks[i].ev && free_slot < 0)
			free_slot = i;
	}
	if (slot >= 0) {
		event_free(socks[slot].ev);
		socks[slot].ev = NULL;
	}
	if (!readable && !writable)
		return;
	if (slot < 0)
		slot = free_slot;
	if (slot < 0) {
		log_warning("dns: too many resolver sockets");
		return;
	}
	short what = (short)(EV_PERSIST | (readable ? EV_READ : 0) | (writable ? EV_WRITE : 0));
	socks[slot].fd = fd;
	socks[slot].ev = event_new(wk.base, fd, what, on_sock, NULL);
	event_add(socks[slot].ev, NULL);
}

void dns_init(void)
{
	list_init(&entries);
	int rc = ares_library_init(ARES_LIB_INIT_ALL);
	if (rc != ARES_SUCCESS)
		fatal("ares_library_init() failed: %s", ares_strerror(rc));
	struct ares_options opts = {.sock_state_cb = sock_state};
	int mask = ARES_OPT_SOCK_STATE_CB;
	if (wk.cf.g.resolv_conf && *wk.cf.g.resolv_conf) {
		opts.resolvconf_path = wk.cf.g.resolv_conf;
		mask |= ARES_OPT_RESOLVCONF;
	}
	rc = ares_init_options(&channel, &opts, mask);
	if (rc != ARES_SUCCESS)
		fatal("ares_init_options() failed: %s", ares_strerror(rc));
	timer = evtimer_new(wk.base, on_timer, NULL);
}

static DnsEntry *find(const char *name)
{
	List *i;
	list_for_each(i, &entries)
	{
		DnsEntry *e = container_of(i, DnsEntry, node);
		if (strcmp(e->name, name) == 0)
			return e;
	}
	return NULL;
}

static void wake_pools(void)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *p = container_of(i, PgPool, node);
		if (!list_empty(&p->waiting_clients))
			pool_maybe_launch(p);
	}
	cancel_peers_wake();
}

/* Whether a is one of the n addresses of set (the port aside). */
static bool addr_in(const struct sockaddr_storage *set, int n, const PeerAddr *a)
{
	for (int k = 0; k < n; k++) {
		if (set[k].ss_family != a->sa.sa_family)
			continue;
		if (a->sa.sa_family == AF_INET &&
		    ((const struct sockaddr_in *)&set[k])->sin_addr.s_addr == a->in.sin_addr.s_addr)
			return true;
		if (a->sa.sa_family == AF_INET6 && memcmp(&((const struct sockaddr_in6 *)&set[k])->sin6_addr,
		                                          &a->in6.sin6_addr, sizeof(a->in6.sin6_addr)) == 0)
			return true;
	}
	return false;
}

/* Whether name is an entry of a comma-separated host list. */
static bool host_list_has(const char *list, const char *name)
{
	size_t nl = strlen(name);
	for (const char *p = list; p && *p;) {
		size_t l = strcspn(p, ",");
		const char *q = p;
		while (l > 0 && *q == ' ')
			q++, l--;
		while (l > 0 && q[l - 1] == ' ')
			l--;
		if (l == nl && memcmp(q, name, nl) == 0)
			return true;
		p += strcspn(p, ",");
		if (*p)
			p++;
	}
	return false;
}

/*
 * The name now resolves to other addresses: servers connected to one it
 * lost reconnect once they are free (doc/pgbouncer.5.md, dns_max_ttl).
 */
static void mark_moved_servers(const DnsEntry *e, const struct sockaddr_storage *old, int n_old)
{
	List *i;
	list_for_each(i, &wk.pools)
	{
		PgPool *pool = container_of(i, PgPool, node);
		if (!host_list_has(pool->db->cf.host, e->name))
			continue;
		List *lists[] = {&pool->active_servers, &pool->idle_servers, &pool->used_servers, &pool->tested_servers,
		                 &pool->new_servers};
		for (size_t l = 0; l < sizeof(lists) / sizeof(lists[0]); l++) {
			List *j;
			list_for_each(j, lists[l])
			{
				PgSocket *s = container_of(j, PgSocket, node);
				if (!s->close_needed && addr_in(old, n_old, &s->remote) &&
				    !addr_in(e->addrs, e->n_addrs, &s->remote)) {
					s->close_needed = true;
					s->addr_gone = true;
				}
			}
		}
	}
}

static void on_answer(void *arg, int status, int timeouts, struct ares_addrinfo *res)
{
	DnsEntry *e = arg;
	usec_t now = get_time_usec();
	struct sockaddr_storage old[DNS_MAX_ADDRS];
	int n_old = e->n_addrs;
	memcpy(old, e->addrs, sizeof(old));
	e->pending = false;
	e->n_addrs = 0;
	if (status == ARES_SUCCESS && res) {
		for (struct ares_addrinfo_node *n = res->nodes; n && e->n_addrs < DNS_MAX_ADDRS; n = n->ai_next) {
			if (n->ai_family != AF_INET && n->ai_family != AF_INET6)
				continue;
			memset(&e->addrs[e->n_addrs], 0, sizeof(e->addrs[0]));
			memcpy(&e->addrs[e->n_addrs], n->ai_addr, n->ai_addrlen);
			e->n_addrs++;
		}
	}
	if (res)
		ares_freeaddrinfo(res);
	if (e->n_addrs > 0) {
		e->failed = false;
		e->expires = now + wk.cf.g.dns_max_ttl;
		if (n_old > 0)
			mark_moved_servers(e, old, n_old);
	} else {
		e->failed = true;
		snprintf(e->err, sizeof(e->err), "could not resolve host \"%s\": %s", e->name,
		         status == ARES_SUCCESS ? "no addresses" : ares_strerror(status));
		log_warning("%s", e->err);
		e->expires = now + wk.cf.g.dns_nxdomain_ttl;
	}
	/*
	 * An answer given at once goes to the launch that asked (dns_lookup()
	 * returns it); waking the pools from here would start a second
	 * connection of that pool before the first one exists.
	 */
	if (!looking_up) {
		const DnsEntry *outer = answering;
		answering = e;
		wake_pools();
		answering = outer;
	}
}

DnsResult dns_lookup(const char *name, int port, struct sockaddr_storage *ss, socklen_t *len, char *err, size_t errlen)
{
	DnsEntry *e = find(name);
	usec_t now = get_time_usec();
	if (e && e->pending)
		return DNS_PENDING;
	if (e && (now < e->expires || e == answering)) {
		if (e->failed) {
			snprintf(err, errlen, "%s", e->err);
			return DNS_FAIL;
		}
		*ss = e->addrs[e->next++ % e->n_addrs];
		if (ss->ss_family == AF_INET) {
			((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
			*len = sizeof(struct sockaddr_in);
		} else {
			((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
			*len = sizeof(struct sockaddr_in6);
		}
		return DNS_OK;
	}
	if (!e) {
		if (strlen(name) >= sizeof(e->name)) {
			snprintf(err, errlen, "host name too long");
			return DNS_FAIL;
		}
		e = xcalloc(1, sizeof(*e));
		pgb_strlcpy(e->name, name, sizeof(e->name));
		list_append(&entries, &e->node);
	}
	e->pending = true;
	struct ares_addrinfo_hints hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	looking_up = true;
	ares_getaddrinfo(channel, name, NULL, &hints, on_answer, e);
	looking_up = false;
	if (e->pending) {
		arm_timer();
		return DNS_PENDING;
	}
	/* answered at once (e.g. from /etc/hosts) */
	const DnsEntry *outer = answering;
	answering = e;
	DnsResult r = dns_lookup(name, port, ss, len, err, errlen);
	answering = outer;
	return r;
}

void dns_foreach_host(void (*fn)(void *arg, const char *name, long long ttl, const char *addrs), void *arg)
{
	usec_t now = get_time_usec();
	List *i;
	list_for_each(i, &entries)
	{
		DnsEntry *e = container_of(i, DnsEntry, node);
		if (e->pending)
			continue;
		char addrs[DNS_MAX_ADDRS * (INET6_ADDRSTRLEN + 8)] = ""; /* "[addr]:0," each */
		size_t off = 0;
		for (int k = 0; k < e->n_addrs && off < sizeof(addrs); k++) {
			char host[INET6_ADDRSTRLEN] = "";
			int port;
			const struct sockaddr_storage *a = &e->addrs[k];
			/* with the port (0: the cache has none), IPv6 in brackets, as PgBouncer shows them */
			sockaddr_host_port((const struct sockaddr *)a, host, sizeof(host), &port);
			off += (size_t)snprintf(addrs + off, sizeof(addrs) - off,
			                        a->ss_family == AF_INET6 ? "%s[%s]:%d" : "%s%s:%d", k ? "," : "", host,
			                        port);
		}
		long long ttl = e->expires > now ? (e->expires - now) / USEC_PER_SEC : 0;
		fn(arg, e->name, ttl, addrs);
	}
}

int dns_name_count(void)
{
	return list_count(&entries);
}

void dns_for_each_name(void (*fn)(const char *name, void *arg), void *arg)
{
	List *i;
	list_for_each(i, &entries) fn(container_of(i, DnsEntry, node)->name, arg);
}

int dns_address_count(const char *host)
{
	const DnsEntry *e = find(host);
	return e && !e->failed && e->n_addrs > 1 ? e->n_addrs : 1;
}

int dns_pending_count(void)
{
	int n = 0;
	List *i;
	list_for_each(i, &entries) n += container_of(i, DnsEntry, node)->pending;
	return n;
}

DnsResult dns_address(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, char *err, size_t errlen)
{
	memset(ss, 0, sizeof(*ss));
	if (host[0] == '/' || host[0] == '@') {
		struct sockaddr_un *un = (struct sockaddr_un *)ss;
		un->sun_family = AF_UNIX;
		int n = snprintf(un->sun_path, sizeof(un->sun_path), "%s/.s.PGSQL.%d", host, port);
		if (n < 0 || (size_t)n >= sizeof(un->sun_path)) {
			snprintf(err, errlen, "unix socket path too long");
			return DNS_FAIL;
		}
		if (host[0] == '@') {
			un->sun_path[0] = '\0';
			*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)n);
		} else {
			*len = sizeof(*un);
		}
		return DNS_OK;
	}
	struct sockaddr_in *in = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)port);
		*len = sizeof(*in);
		return DNS_OK;
	}
	if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*in6);
		return DNS_OK;
	}
	return dns_lookup(host, port, ss, len, err, errlen);
}
