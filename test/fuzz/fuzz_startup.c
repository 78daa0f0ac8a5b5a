/*
 * libFuzzer target: the first message of a client, as client.c reads it:
 * the untyped header (StartupMessage, SSLRequest, CancelRequest, ...), the
 * key/value pairs of a StartupMessage and its `replication` value.
 */
#include "autoconfig.h"

#include "common/proto.h"
#include "fuzz.h"

static void fuzz_params(const uint8_t *body, size_t len)
{
	int n = proto_parse_startup(body, len, NULL, 0);
	if (n < 0)
		return;
	StartupParam *params = calloc((size_t)n + 1, sizeof(*params));
	if (proto_parse_startup(body, len, params, n) != n)
		abort(); /* counting and storing must agree */
	for (int i = 0; i < n; i++) {
		const char *k = params[i].key, *v = params[i].value;
		if (!k || !v || (const uint8_t *)k < body || (const uint8_t *)v + strlen(v) >= body + len)
			abort(); /* pairs point into the body, NUL-terminated inside it */
		if (strcmp(k, "replication") == 0) {
			ReplicationMode m = proto_parse_replication(v);
			(void)proto_replication_value(m);
			(void)proto_replication_show_name(m);
		}
	}
	if (n > 0)
		(void)proto_parse_startup(body, len, params, n - 1); /* too many: an error, no overflow */
	free(params);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	PktHdr hdr;
	char hex[64];
	proto_hex_prefix(data, size, hex, sizeof(hex));
	if (proto_parse_header(data, size, true, PROTO_MAX_STARTUP_LEN, &hdr) != HDR_OK)
		return 0;
	if (hdr.body_off > hdr.len)
		abort(); /* HDR_OK promises a whole header */
	if (hdr.len > size)
		return 0;        /* the pooler waits for the rest */
	if (hdr.code >> 16 == 3) /* a StartupMessage of protocol 3.x */
		fuzz_params(data + hdr.body_off, hdr.len - hdr.body_off);
	return 0;
}
