/*
 * libFuzzer target: the message handling transaction pooling adds
 * (txn_msg.c): the statement names of Bind (also with only part of the
 * message buffered, as txn.c sees it), Describe and Close, and the
 * server's ErrorResponse with the client's statement name put back, and
 * the result type hash of a RowDescription or NoData. The
 * input is a client name, NUL, then a sequence of messages; each message is
 * also tried cut at every length the first byte after it gives.
 */
#include "autoconfig.h"

#include "common/pktbuf.h"
#include "common/proto.h"
#include "fuzz.h"
#include "worker/txn_msg.h"

#define FUZZ_MAX_PACKET (64 * 1024)

static void check_in(const void *p, const uint8_t *msg, uint32_t len)
{
	if ((const uint8_t *)p < msg || (const uint8_t *)p > msg + len)
		abort();
}

static void one(PktBuf *pb, const char *client_name, const uint8_t *msg, uint32_t len, uint32_t cut)
{
	const uint8_t *after;
	const char *name;
	uint8_t what;
	switch (msg[0]) {
	case 'B':
		if (cut > len)
			cut = len;
		name = txn_bind_stmt_name(msg, cut, &after);
		if (name) {
			check_in(name, msg, cut);
			check_in(after, msg, cut);
			if (strlen(name) >= (size_t)(msg + cut - (const uint8_t *)name))
				abort();
		}
		break;
	case 'D':
	case 'C':
		name = txn_describe_close_name(msg, len, &what);
		if (name && strlen(name) >= (size_t)(msg + len - (const uint8_t *)name))
			abort();
		break;
	case 'E': {
		(void)txn_error_sqlstate(msg, len);
		pktbuf_reset(pb);
		bool renamed = txn_rename_in_error(pb, client_name, msg, len);
		PktHdr hdr;
		if (proto_parse_header(pb->buf, pb->len, false, UINT32_MAX, &hdr) != HDR_OK || hdr.len != pb->len ||
		    pb->buf[0] != 'E' || pb->buf[pb->len - 1] != 0)
			abort(); /* the rewritten error is one whole message */
		if (renamed) {
			/* and it holds no server-side name in M any more, unless the client's name is one */
			size_t n;
			char *copy = fuzz_strndup(pb->buf, pb->len);
			if (!txn_find_server_name(client_name, &n) && pb->len > 6) {
				PktReader r;
				uint8_t f;
				const char *v;
				pktreader_init(&r, (const uint8_t *)copy + 5, pb->len - 5);
				while (pktreader_get_u8(&r, &f) && f != 0 && pktreader_get_string(&r, &v))
					if (f == 'M' && txn_find_server_name(v, &n) && !strstr(v, client_name))
						abort();
			}
			free(copy);
		}
		break;
	}
	case 'T':
	case 'n':
		/* a description: read within the message, whatever its fields say */
		(void)txn_row_desc_hash(msg, len);
		break;
	default:
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, 0, size);
	if (!nul)
		return 0;
	char *client_name = fuzz_strndup(data, (size_t)(nul - data));
	size -= (size_t)(nul + 1 - data);
	data = nul + 1;
	PktBuf pb;
	pktbuf_init(&pb, 256);
	while (size > 0) {
		PktHdr hdr;
		if (proto_parse_header(data, size, false, FUZZ_MAX_PACKET, &hdr) != HDR_OK || hdr.len > size)
			break;
		uint8_t *msg = fuzz_copy(data, hdr.len);
		uint32_t cut = hdr.len < size ? data[hdr.len] : hdr.len;
		one(&pb, client_name, msg, hdr.len, cut);
		free(msg);
		if (cut < hdr.len) {
			/* only the first cut bytes buffered: the parser must not look past them */
			msg = fuzz_copy(data, cut);
			if (cut >= 5 && data[0] == 'B')
				one(&pb, client_name, msg, hdr.len, cut);
			free(msg);
		}
		data += hdr.len;
		size -= hdr.len;
	}
	pktbuf_free(&pb);
	free(client_name);
	return 0;
}
