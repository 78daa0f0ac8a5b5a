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

const char *txn_bind_stmt_name(const uint8_t *data, uint32_t avail, const uint8_t **after)
{
	const uint8_t *end = data + avail;
	const uint8_t *p1 = avail > 5 ? txn_find_nul(data + 5, end) : NULL;
	const uint8_t *p2 = p1 ? txn_find_nul(p1 + 1, end) : NULL;
	if (!p2)
		return NULL;
	*after = p2 + 1;
	return (const char *)p1 + 1;
}

const char *txn_describe_close_name(const uint8_t *data, uint32_t len, uint8_t *what)
{
	/* byte1 'S' or 'P', then the name */
	const uint8_t *nul = len > 6 ? txn_find_nul(data + 6, data + len) : NULL;
	if (!nul)
		return NULL;
	*what = data[5];
	return (const char *)data + 6;
}

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
