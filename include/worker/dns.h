/*
 * Asynchronous host name resolution for server connections with c-ares,
 * driven by the worker's libevent loop, with a cache that keeps answers for
 * dns_max_ttl and failures for dns_nxdomain_ttl.
 */
#ifndef PGB_WORKER_DNS_H
#define PGB_WORKER_DNS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

typedef enum DnsResult {
	DNS_OK,      /* *ss holds an address (entries rotate round-robin) */
	DNS_PENDING, /* a lookup is running; pools are woken when it ends */
	DNS_FAIL,    /* the name does not resolve (cached for dns_nxdomain_ttl) */
} DnsResult;

/* Create the worker's c-ares channel. Fatal if c-ares cannot start. */
void dns_init(void);

/* Resolve `name` for `port`; see DnsResult. err gets the reason on DNS_FAIL. */
DnsResult dns_lookup(const char *name, int port, struct sockaddr_storage *ss, socklen_t *len, char *err, size_t errlen);

/*
 * The address of `host` (an IP address, a name, a Unix socket directory
 * `/dir`, or an abstract one `@name`) and `port`; names go through
 * dns_lookup().
 */
DnsResult dns_address(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, char *err,
                      size_t errlen);

/* For SHOW DNS_HOSTS: call fn for every cached name (ttl = seconds left, addrs comma-separated). */
void dns_foreach_host(void (*fn)(void *arg, const char *name, long long ttl, const char *addrs), void *arg);

/* Number of cached names and of lookups in flight (SHOW LISTS). */
int dns_name_count(void);
/* How many addresses the cached answer for host has: 1 for an address, a socket or a name not cached. */
int dns_address_count(const char *host);
void dns_for_each_name(void (*fn)(const char *name, void *arg), void *arg); /* every cached host name */
int dns_pending_count(void);

#endif
