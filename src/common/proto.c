/*
 * PostgreSQL wire-protocol parsing that needs no connection state: message
 * headers (typed and startup-phase), StartupMessage key/value pairs, and the
 * hex and name helpers used in log lines and "bad packet header" errors.
 */
#include "autoconfig.h"

#include "common/proto.h"
#include "common/pktbuf.h"

#include <string.h>
#include <strings.h>

/*
 * The body is "key\0value\0" pairs followed by one more NUL, which must be
 * the last byte. An empty key is that terminator, so anything after it, a
 * key without a value, or a body not ending in the terminator is an error.
 */
int proto_parse_startup(const uint8_t *body, size_t len, StartupParam *params, int max_params)
{
	size_t pos = 0;
	int count = 0;

	for (;;) {
		const uint8_t *key_end;
		const uint8_t *val_end;
		size_t key_pos, val_pos;

		if (pos >= len)
			return -1; /* ran out before the terminator */
		if (body[pos] == 0)
			return pos == len - 1 ? count : -1;

		key_pos = pos;
		key_end = memchr(body + key_pos, 0, len - key_pos);
		if (!key_end)
			return -1;
		val_pos = (size_t)(key_end - body) + 1;
		if (val_pos >= len)
			return -1; /* key without a value */
		val_end = memchr(body + val_pos, 0, len - val_pos);
		if (!val_end)
			return -1;

		if (params) {
			if (count >= max_params)
				return -1;
			params[count].key = (const char *)(body + key_pos);
			params[count].value = (const char *)(body + val_pos);
		}
		count++;
		pos = (size_t)(val_end - body) + 1;
	}
}

/*
 * PostgreSQL's boolean words: any case-insensitive prefix of true, false,
 * yes, no; "on"; a prefix of "off" of two letters or more; "1" and "0".
 * Returns false for anything else.
 */
static bool parse_pg_bool(const char *v, bool *out)
{
	size_t n = strlen(v);
	if (n == 0)
		return false;
	static const struct {
		const char *word;
		size_t min; /* shortest accepted prefix */
		bool value;
	} words[] = {{"true", 1, true}, {"false", 1, false}, {"yes", 1, true}, {"no", 1, false},
	             {"on", 2, true},   {"off", 2, false},   {"1", 1, true},   {"0", 1, false}};
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
		if (n >= words[i].min && n <= strlen(words[i].word) && strncasecmp(v, words[i].word, n) == 0) {
			*out = words[i].value;
			return true;
		}
	}
	return false;
}

ReplicationMode proto_parse_replication(const char *value)
{
	bool on;
	if (!value)
		return REPLICATION_NONE;
	if (strcmp(value, "database") == 0)
		return REPLICATION_LOGICAL;
	if (parse_pg_bool(value, &on) && on)
		return REPLICATION_PHYSICAL;
	return REPLICATION_NONE;
}

const char *proto_replication_value(ReplicationMode mode)
{
	switch (mode) {
	case REPLICATION_PHYSICAL:
		return "yes";
	case REPLICATION_LOGICAL:
		return "database";
	default:
		return "no";
	}
}

const char *proto_replication_show_name(ReplicationMode mode)
{
	switch (mode) {
	case REPLICATION_PHYSICAL:
		return "physical";
	case REPLICATION_LOGICAL:
		return "logical";
	default:
		return "none";
	}
}

void proto_hex_prefix(const uint8_t *buf, size_t len, char *out, size_t outlen)
{
	static const char digits[] = "0123456789abcdef";
	size_t o = 0;

	if (outlen == 0)
		return;
	if (len > 8)
		len = 8;
	/* Only whole bytes: two digits plus room for the final NUL. */
	for (size_t i = 0; i < len && o + 2 < outlen; i++) {
		out[o++] = digits[buf[i] >> 4];
		out[o++] = digits[buf[i] & 0x0f];
	}
	out[o] = '\0';
}

const char *proto_msg_name(char type, bool from_server)
{
	if (from_server) {
		switch (type) {
		case 'R':
			return "Authentication";
		case 'K':
			return "BackendKeyData";
		case '2':
			return "BindComplete";
		case '3':
			return "CloseComplete";
		case 'C':
			return "CommandComplete";
		case 'd':
			return "CopyData";
		case 'c':
			return "CopyDone";
		case 'G':
			return "CopyInResponse";
		case 'H':
			return "CopyOutResponse";
		case 'W':
			return "CopyBothResponse";
		case 'D':
			return "DataRow";
		case 'I':
			return "EmptyQueryResponse";
		case 'E':
			return "ErrorResponse";
		case 'V':
			return "FunctionCallResponse";
		case 'v':
			return "NegotiateProtocolVersion";
		case 'n':
			return "NoData";
		case 'N':
			return "NoticeResponse";
		case 'A':
			return "NotificationResponse";
		case 't':
			return "ParameterDescription";
		case 'S':
			return "ParameterStatus";
		case '1':
			return "ParseComplete";
		case 's':
			return "PortalSuspended";
		case 'Z':
			return "ReadyForQuery";
		case 'T':
			return "RowDescription";
		}
	} else {
		switch (type) {
		case 0:
			return "StartupMessage";
		case 'B':
			return "Bind";
		case 'C':
			return "Close";
		case 'd':
			return "CopyData";
		case 'c':
			return "CopyDone";
		case 'f':
			return "CopyFail";
		case 'D':
			return "Describe";
		case 'E':
			return "Execute";
		case 'H':
			return "Flush";
		case 'F':
			return "FunctionCall";
		case 'P':
			return "Parse";
		case 'p':
			return "PasswordMessage"; /* also SASLInitialResponse, SASLResponse, GSSResponse */
		case 'Q':
			return "Query";
		case 'S':
			return "Sync";
		case 'X':
			return "Terminate";
		}
	}
	return "unknown";
}

bool proto_parse_error(const uint8_t *body, uint32_t len, const char **sev, const char **code, const char **msg)
{
	*sev = "ERROR";
	*code = "08P01";
	*msg = "";
	PktReader r;
	pktreader_init(&r, body, len);
	uint8_t t;
	const char *v;
	int seen = 0;
	for (;;) {
		if (!pktreader_get_u8(&r, &t))
			return false; /* no terminating zero */
		if (t == 0)
			break;
		if (!pktreader_get_string(&r, &v))
			return false;
		if (t == 'S')
			*sev = v, seen |= 1;
		else if (t == 'C')
			*code = v, seen |= 2;
		else if (t == 'M')
			*msg = v, seen |= 4;
	}
	return seen == 7 && pktreader_remaining(&r) == 0;
}

bool proto_parse_param_status(const uint8_t *body, uint32_t len, const char **name, const char **value)
{
	PktReader r;
	pktreader_init(&r, body, len);
	return pktreader_get_string(&r, name) && pktreader_get_string(&r, value) && pktreader_remaining(&r) == 0;
}

bool proto_sasl_has_mech(const uint8_t *list, uint32_t len, const char *mech)
{
	PktReader r;
	const char *m;
	bool found = false;
	pktreader_init(&r, list, len);
	while (pktreader_get_string(&r, &m) && *m)
		if (strcmp(m, mech) == 0)
			found = true;
	return found;
}

bool proto_parse_sasl_initial(const uint8_t *body, uint32_t len, const char **mech, const uint8_t **data,
                              uint32_t *dlen)
{
	PktReader r;
	pktreader_init(&r, body, len);
	*data = NULL;
	if (!pktreader_get_string(&r, mech) || !pktreader_get_u32(&r, dlen))
		return false;
	if (*dlen != 0xffffffffu && !pktreader_get_bytes(&r, *dlen, data))
		*data = NULL;
	return true;
}
