/*
 * libFuzzer target: the decoder of a moving client's state
 * (handover_codec.c), which reads what another worker or another binary
 * (-R) sent. The input is one message, of either format it reads. What
 * decodes is encoded again, and that must decode and encode to the same
 * bytes: the encoder writes what the decoder reads.
 */
#include "autoconfig.h"

#include "fuzz.h"
#include "worker/handover_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *msg = fuzz_copy(data, size); /* exactly size bytes: a read past them is caught */
	HandoverClient hc, again;
	HandoverUnits units;
	char err[128];
	(void)handover_peek_units(msg, size, &units);
	if (!handover_decode(msg, size, &hc, err, sizeof(err))) {
		if (!err[0] || strlen(err) >= sizeof(err))
			abort(); /* a refusal says why */
		free(msg);
		return 0;
	}
	PktBuf first, second;
	pktbuf_init(&first, 256);
	pktbuf_init(&second, 256);
	handover_encode(&hc, &first);
	if (!handover_decode(first.buf, first.len, &again, err, sizeof(err)))
		abort();
	handover_encode(&again, &second);
	if (first.len != second.len || memcmp(first.buf, second.buf, first.len) != 0)
		abort();
	if (hc.units_moved != handover_peek_units(first.buf, first.len, &units))
		abort();
	handover_free(&again);
	handover_free(&hc);
	pktbuf_free(&first);
	pktbuf_free(&second);
	free(msg);
	return 0;
}
