/*
 * The pure half of transaction pooling's message handling: statement names
 * in Bind/Describe/Close and the renaming of the server's errors
 * (doc/transaction.md, "Prepared statements"). See include/worker/txn_msg.h.
 */
#include "autoconfig.h"

#include <string.h>

#include "common/pktbuf.h"
#include "worker/prepare.h"
#include "worker/txn_msg.h"

const char *txn_find_server_name(const char *text, size_t *len)
{
	for (const char *p = strstr(text, "\"" PREPARE_NAME_PREFIX); p; p = strstr(p + 1, "\"" PREPARE_NAME_PREFIX)) {
		const char *q = p + 1 + strlen(PREPARE_NAME_PREFIX);
		const char *d = q;
		while (*d >= '0' && *d <= '9')
			d++;
		if (d > q && *d == '"') {
			*len = (size_t)(d + 1 - p);
			return p;
		}
	}
	return NULL;
}

const char *txn_error_sqlstate(const uint8_t *data, uint32_t len)
{
	const char *sqlstate = "";
	PktReader r;
	uint8_t f;
	const char *v;
	pktreader_init(&r, data + 5, len - 5);
	while (pktreader_get_u8(&r, &f) && f != 0 && pktreader_get_string(&r, &v))
		if (f == 'C')
			sqlstate = v;
	return sqlstate;
}

bool txn_rename_in_error(PktBuf *pb, const char *client_name, const uint8_t *data, uint32_t len)
{
	PktReader r;
	uint8_t f;
	const char *v;
	bool renamed_any = false;
	pktbuf_start_msg(pb, 'E');
	pktreader_init(&r, data + 5, len - 5);
	while (pktreader_get_u8(&r, &f) && f != 0 && pktreader_get_string(&r, &v)) {
		size_t n;
		const char *at = f == 'M' ? txn_find_server_name(v, &n) : NULL;
		pktbuf_put_u8(pb, f);
		if (!at) {
			pktbuf_put_string(pb, v);
			continue;
		}
		pktbuf_put_bytes(pb, v, (size_t)(at - v));
		pktbuf_put_u8(pb, '"');
		pktbuf_put_bytes(pb, client_name, strlen(client_name));
		pktbuf_put_u8(pb, '"');
		pktbuf_put_string(pb, at + n);
		renamed_any = true;
	}
	pktbuf_put_u8(pb, 0);
	pktbuf_finish_msg(pb);
	return renamed_any;
}

/* FNV-1a, 64 bits */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

uint64_t txn_row_desc_hash(const uint8_t *data, uint32_t len)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	if (len < 5)
		return 0;
	h = fnv(h, data, 1); /* NoData differs from a RowDescription of no column */
	if (data[0] != 'T')
		return data[0] == 'n' ? h : 0;
	PktReader r;
	uint16_t n;
	pktreader_init(&r, data + 5, len - 5);
	if (!pktreader_get_u16(&r, &n))
		return 0;
	h = fnv(h, &n, sizeof(n));
	for (uint16_t i = 0; i < n; i++) {
		const char *name;
		const uint8_t *skip, *type, *typmod;
		/* name, table OID and column number (skipped), type OID, type length (skipped), modifier, format */
		if (!pktreader_get_string(&r, &name) || !pktreader_get_bytes(&r, 6, &skip) ||
		    !pktreader_get_bytes(&r, 4, &type) || !pktreader_get_bytes(&r, 2, &skip) ||
		    !pktreader_get_bytes(&r, 4, &typmod) || !pktreader_get_bytes(&r, 2, &skip))
			return 0;
		h = fnv(h, name, strlen(name) + 1);
		h = fnv(h, type, 4);
		h = fnv(h, typmod, 4);
	}
	return h ? h : 1;
}
