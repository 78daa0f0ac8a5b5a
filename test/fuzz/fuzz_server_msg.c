/*
 * libFuzzer target: what a PostgreSQL server sends the pooler while it
 * logs in, through the pure parsers server.c uses: message headers, the
 * authentication requests (the SASL mechanism list, then SASLContinue and
 * SASLFinal fed to the SCRAM client with pass-through keys), ErrorResponse
 * and NoticeResponse fields, ParameterStatus, BackendKeyData. The input is
 * a sequence of backend messages as they come off the socket.
 */
#include "autoconfig.h"

#include "common/pktbuf.h"
#include "common/proto.h"
#include "common/scram.h"
#include "fuzz.h"

#define FUZZ_MAX_LOGIN_PACKET (64 * 1024) /* server.c's SERVER_LOGIN_MAX_PACKET */
#define FUZZ_CLIENT_NONCE     "rOprNGfwEbeRWgbNEkqO"

static void check_string(const char *s, const uint8_t *body, uint32_t len)
{
	/* every string the parsers hand back lies inside the body and ends there */
	if ((const uint8_t *)s < body || (const uint8_t *)s >= body + len)
		abort();
	if (!memchr(s, 0, (size_t)(body + len - (const uint8_t *)s)))
		abort();
}

static void auth_request(ScramClient **sc, const uint8_t *body, uint32_t len)
{
	static const uint8_t client_key[SCRAM_KEY_LEN] = {1, 2, 3}, server_key[SCRAM_KEY_LEN] = {4, 5, 6};
	PktReader r;
	uint32_t code;
	char buf[SCRAM_MAX_MSG], err[128];
	pktreader_init(&r, body, len);
	if (!pktreader_get_u32(&r, &code))
		return;
	switch (code) {
	case 10:
		if (!proto_sasl_has_mech(body + 4, len - 4, "SCRAM-SHA-256"))
			return;
		free(*sc);
		*sc = calloc(1, sizeof(**sc));
		scram_client_init_keys(*sc, client_key, server_key);
		scram_set_test_nonce(FUZZ_CLIENT_NONCE);
		if (!scram_client_first(*sc, buf, sizeof(buf)))
			abort();
		scram_set_test_nonce(NULL);
		break;
	case 11:
		if (*sc &&
		    !scram_client_final(*sc, (const char *)body + 4, len - 4, buf, sizeof(buf), err, sizeof(err))) {
			free(*sc);
			*sc = NULL;
		}
		break;
	case 12:
		if (*sc)
			(void)scram_client_verify_final(*sc, (const char *)body + 4, len - 4, err, sizeof(err));
		free(*sc);
		*sc = NULL;
		break;
	default:
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ScramClient *sc = NULL;
	while (size > 0) {
		PktHdr hdr;
		if (proto_parse_header(data, size, false, FUZZ_MAX_LOGIN_PACKET, &hdr) != HDR_OK || hdr.len > size)
			break;
		uint32_t blen = hdr.len - hdr.body_off;
		uint8_t *body = fuzz_copy(data + hdr.body_off, blen);
		const char *a, *b, *c;
		(void)proto_msg_name(hdr.type, true);
		switch (hdr.type) {
		case 'R':
			auth_request(&sc, body, blen);
			break;
		case 'E':
		case 'N':
			if (proto_parse_error(body, blen, &a, &b, &c)) {
				check_string(a, body, blen);
				check_string(b, body, blen);
				check_string(c, body, blen);
			}
			break;
		case 'S':
			if (proto_parse_param_status(body, blen, &a, &b)) {
				check_string(a, body, blen);
				check_string(b, body, blen);
				if (b + strlen(b) + 1 != (const char *)body + blen)
					abort(); /* nothing may follow the value */
			}
			break;
		case 'K': {
			PktReader r;
			uint32_t pid;
			const uint8_t *key;
			pktreader_init(&r, body, blen);
			if (pktreader_get_u32(&r, &pid))
				(void)pktreader_get_bytes(&r, pktreader_remaining(&r), &key);
			break;
		}
		default:
			break;
		}
		free(body);
		data += hdr.len;
		size -= hdr.len;
	}
	free(sc);
	return 0;
}
