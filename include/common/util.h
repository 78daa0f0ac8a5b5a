/*
 * Small helpers shared by master and workers: time, string buffers,
 * file reading.
 */
#ifndef PGB_COMMON_UTIL_H
#define PGB_COMMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

/* Wall-clock and monotonic time in microseconds. */
usec_t get_time_usec(void);
usec_t get_mono_usec(void);

/* strlcpy semantics: always terminates, returns strlen(src). */
size_t pgb_strlcpy(char *dst, const char *src, size_t size);

/* malloc or die (a broken invariant: out of memory). */
void *xmalloc(size_t size);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t size);
char *xstrdup(const char *s);
char *xstrdup_or_null(const char *s); /* NULL stays NULL */

/* Format a reason into err (when err is non-NULL and errlen > 0) and return false. */
bool set_error(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Read a whole file into a NUL-terminated malloc'd buffer; NULL with errno on failure. */
char *read_file(const char *path, size_t *len_out);
/* The same from an open descriptor, to its end (the caller closes it). */
char *read_fd(int fd, size_t *len_out);

/*
 * The directory of the workers' private sockets (mode 0700):
 * <unix_socket_dir or /tmp>/pgbouncer-workers.<listen_port>; worker N's
 * socket is worker.N/.s.PGSQL.<listen_port> in it, so that libpq reaches it
 * with host=<dir>/worker.N. False if that would be too long for a socket path.
 */
bool private_socket_dir(const char *unix_socket_dir, int listen_port, char *buf, size_t len);

/*
 * The master chose another directory (the usual name was taken by someone
 * else): private_socket_dir() answers with it from now on, in the master
 * and in the workers it forks. NULL: there is none (it answers false).
 */
void private_socket_dir_override(const char *path);

/*
 * The host text and port of an address: an IPv4 or IPv6 address as text,
 * or "unix" with the port a socket file's name carries (.s.PGSQL.N; 0 when
 * it has none, as a client's peer address).
 */
struct sockaddr;
void sockaddr_host_port(const struct sockaddr *sa, char *host, size_t hostlen, int *port);

#endif
