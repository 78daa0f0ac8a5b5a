/*
 * libFuzzer target: a client's SASL messages as the pooler reads them at
 * login (auth.c): SASLInitialResponse (mechanism, int32 length, data)
 * whose data goes to the SCRAM server as the client-first-message, then
 * SASLResponse whose whole body is the client-final-message. The input is
 * a sequence of 'p' messages as they come off the socket. The verifier is
 * that of password "pencil" and the server nonce is fixed, as in
 * fuzz_scram_server.c, so that a seed can reach the success path.
 */
#include "autoconfig.h"

#include "common/pktbuf.h"
#include "common/proto.h"
#include "common/scram.h"
#include "fuzz.h"

#define FUZZ_SERVER_NONCE "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
#define FUZZ_MAX_PACKET   (64 * 1024)

static ScramSecret secret;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	fuzz_scram_secret(&secret);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ScramServer *st = NULL;
	char err[128], final[SCRAM_MAX_MSG];
	scram_set_test_nonce(FUZZ_SERVER_NONCE);
	while (size > 0) {
		PktHdr hdr;
		if (proto_parse_header(data, size, false, FUZZ_MAX_PACKET, &hdr) != HDR_OK || hdr.len > size ||
		    hdr.type != 'p')
			break;
		uint32_t blen = hdr.len - hdr.body_off;
		uint8_t *body = fuzz_copy(data + hdr.body_off, blen);
		bool go_on = true;
		if (!st) {
			const char *mech;
			const uint8_t *d;
			uint32_t dlen;
			if (!proto_parse_sasl_initial(body, blen, &mech, &d, &dlen) ||
			    strcmp(mech, "SCRAM-SHA-256") != 0 || !d)
				go_on = false;
			else if (d + dlen > body + blen)
				abort(); /* the data must lie inside the message */
			if (go_on) {
				st = calloc(1, sizeof(*st));
				go_on = scram_server_first(st, &secret, (const char *)d, dlen, err, sizeof(err));
			}
		} else {
			go_on =
			    scram_server_final(st, (const char *)body, blen, final, sizeof(final), err, sizeof(err));
			if (go_on && strncmp(final, "v=", 2) != 0)
				abort();
			go_on = false; /* the exchange is over either way */
		}
		free(body);
		if (!go_on)
			break;
		data += hdr.len;
		size -= hdr.len;
	}
	scram_set_test_nonce(NULL);
	free(st);
	return 0;
}
