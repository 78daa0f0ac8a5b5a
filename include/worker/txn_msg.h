/*
 * The pure half of transaction pooling's message handling (doc/transaction.md):
 * where the statement names sit in a client's Bind, Describe and Close, and
 * the server's ErrorResponse rewritten with the client's statement name.
 * No sockets, no event loop (test/fuzz/fuzz_txn_msg.c runs it alone); the
 * run-time half is src/worker/pooling/txn.c.
 */
#ifndef PGB_WORKER_TXN_MSG_H
#define PGB_WORKER_TXN_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/pktbuf.h"

/* The first NUL in [p, end), or NULL. Names are short (often empty): a loop beats memchr()'s set-up. */
static inline const uint8_t *txn_find_nul(const uint8_t *p, const uint8_t *end)
{
	for (; p < end; p++)
		if (!*p)
			return p;
	return NULL;
}

/*
 * A Bind message whose first `avail` bytes (header included) are at data:
 * its statement name, and in *after where the rest (formats, parameters)
 * starts. NULL when the portal and statement names are not both there.
 */
static inline const char *txn_bind_stmt_name(const uint8_t *data, uint32_t avail, const uint8_t **after)
{
	/* inline: at every Bind of transaction mode (doc/benchmarks.md) */
	const uint8_t *end = data + avail;
	const uint8_t *p1 = avail > 5 ? txn_find_nul(data + 5, end) : NULL;
	const uint8_t *p2 = p1 ? txn_find_nul(p1 + 1, end) : NULL;
	if (!p2)
		return NULL;
	*after = p2 + 1;
	return (const char *)p1 + 1;
}

/*
 * A whole Describe or Close message of len bytes (header included): its
 * name, and in *what the 'S' (statement) or 'P' (portal) byte. NULL when
 * the message is malformed (no kind byte, or no NUL after the name).
 */
static inline const char *txn_describe_close_name(const uint8_t *data, uint32_t len, uint8_t *what)
{
	/* byte1 'S' or 'P', then the name */
	const uint8_t *nul = len > 6 ? txn_find_nul(data + 6, data + len) : NULL;
	if (!nul)
		return NULL;
	*what = data[5];
	return (const char *)data + 6;
}

/* Where `"PGBOUNCER_<digits>"` starts in text (the quotes included), and its length; NULL if absent. */
const char *txn_find_server_name(const char *text, size_t *len);

/* The C (SQLSTATE) field of a whole ErrorResponse of len bytes (header included); "" if it has none. */
const char *txn_error_sqlstate(const uint8_t *data, uint32_t len);

/*
 * Write into pb (empty) a whole ErrorResponse of len bytes (header
 * included) with `"client_name"` in place of the server-side name in its
 * M field; every other field as it was. False: there was nothing to
 * rename (pb then holds the copy anyway).
 */
bool txn_rename_in_error(PktBuf *pb, const char *client_name, const uint8_t *data, uint32_t len);

/*
 * The result type a whole RowDescription ('T') or NoData ('n') of len
 * bytes (header included) describes, as a 64-bit hash: the number of
 * columns and each column's name, type OID and type modifier, which are
 * what PostgreSQL compares before it says "cached plan must not change
 * result type" (a column's table, position and format code are left out:
 * a table made again with the same columns changes nothing). Never 0; 0
 * for a malformed message.
 */
uint64_t txn_row_desc_hash(const uint8_t *data, uint32_t len);

#endif
