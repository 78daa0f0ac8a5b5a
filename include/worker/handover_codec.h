/*
 * The bytes a moving client's state travels in (doc/architecture.md,
 * "The handover codec"): between the workers of one tree (rebalancing) and
 * from a retiring tree to the binary that replaces it (-R). Pure: a plain
 * struct in, bytes out, and back; no sockets, no event loop, no worker
 * state. migrate.c fills the struct from a client and rebuilds a client
 * from it.
 *
 * The fields are listed once, in the table of handover_codec.c
 * (handover_client_fields): encoder, decoder, the checks of the decoded
 * values and the release of what the decoder allocated all walk it.
 */
#ifndef PGB_WORKER_HANDOVER_CODEC_H
#define PGB_WORKER_HANDOVER_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/channel.h"
#include "common/pktbuf.h"
#include "common/scram.h"

#define HANDOVER_MAGIC          0x5047424du /* "PGBM": every format starts with it, then its version (u32) */
#define HANDOVER_MAX_REQUEST    (16 * 1024) /* largest buffered request a waiting client takes along */
#define HANDOVER_CANCEL_KEY_LEN 8           /* a cancel key (protocol 3.0) */

/* A tracked parameter (by name: the receiver's table may list them in another order). */
typedef struct HandoverVar {
	const char *name;  /* the parameter's name */
	const char *value; /* the client's value */
} HandoverVar;

/* A protocol-level prepared statement of the client; the receiver prepares it on a server when first used. */
typedef struct HandoverStmt {
	const char *name;    /* the client's name for it */
	const uint8_t *body; /* the Parse message's body (name cut off: query text, parameter types) */
	uint32_t body_len;   /* bytes of body */
	uint64_t desc;       /* a hash of the result type the client was given (0 = unknown) */
} HandoverStmt;

/* The login's secret, for a receiver that never saw this user (auth_query, PAM, SCRAM pass-through). */
typedef struct HandoverSecret {
	const char *text;                        /* as in auth_file ("" for SECRET_EMPTY) */
	uint32_t kind;                           /* SecretKind */
	bool from_auth_query;                    /* looked up by auth_query: looked up again at the next login */
	bool from_pam;                           /* the password PAM accepted (for server logins only) */
	bool has_scram_keys;                     /* the two keys below are set */
	uint8_t scram_client_key[SCRAM_KEY_LEN]; /* SCRAM pass-through: the client's key */
	uint8_t scram_server_key[SCRAM_KEY_LEN]; /* and the server key */
	uint64_t time;                           /* when auth_query or PAM gave it, usec (0 = unknown) */
} HandoverSecret;

/* The client's units of the client limits that the giver moved to the receiver (same tree only). */
typedef struct HandoverUnits {
	int32_t entry[2]; /* pool_move_client_budget()'s moved[]: the entries held for it, or -1 */
} HandoverUnits;

/* The server connection's units of the server limits (pool, database, user) moved to the receiver. */
typedef struct HandoverServerUnits {
	int32_t entry[3]; /* pool_move_server_budget()'s moved[]: the entries held for it, or -1 */
} HandoverServerUnits;

#define HANDOVER_MAX_SERVER_KEY 256 /* longest BackendKeyData secret taken along (protocol 3.2 allows 256) */

/*
 * The server connection an idle session-mode client takes along (doc/workers.md,
 * "Session-mode clients move too"): PostgreSQL's backend goes on serving the
 * client, with its session, on the receiver.
 */
typedef struct HandoverServer {
	uint64_t id;                    /* SHOW SERVERS id: kept */
	const char *pool_user;          /* the pool's user (the client's, or the database's forced user) */
	struct sockaddr_storage remote; /* PostgreSQL's address: where a cancel for it goes */
	uint64_t connect_time;          /* usec: server_lifetime counts from it */
	uint64_t request_time;          /* usec: its last activity */
	uint32_t backend_pid;           /* from BackendKeyData */
	const uint8_t *key;             /* BackendKeyData's secret */
	uint32_t key_len;
	HandoverVar *vars; /* the tracked values it has applied (what its session has SET) */
	uint32_t nvars;
	uint64_t bytes_in; /* byte counters of its socket */
	uint64_t bytes_out;
	uint32_t session_tail;     /* what its client sent last (SESSION_TAIL_*) */
	bool units_moved;          /* units is set */
	HandoverServerUnits units; /* its units, moved to the receiver */
	uint64_t db_definition;    /* db_definition_hash() of the entry it connected by (0: not told) */
	bool close_needed;         /* the giver would have closed it when released */
} HandoverServer;

/*
 * One moving client. Strings and byte strings are borrowed: from the
 * client when encoding, from the decoded message when decoding (which must
 * outlive the struct). Lists are arrays allocated with malloc by whoever
 * filled them; handover_free() releases the decoder's.
 *
 * Every optional field's default is zero, NULL, empty or false: an encoder
 * leaves out a field that has it, a decoder that does not find one gives
 * it. A nested block that may be absent (such as the secret) is a record
 * with a presence flag; a later one (a session-mode client's server
 * connection, say) is added the same way.
 */
typedef struct HandoverClient {
	uint64_t id;                    /* SHOW CLIENTS id: a moved client keeps it */
	const char *database;           /* database name */
	const char *user;               /* login user name */
	bool is_unix;                   /* came over the unix socket */
	struct sockaddr_storage remote; /* the peer's address */
	struct sockaddr_storage local;  /* our address (the receiver asks its socket; kept for completeness) */
	uint32_t peer_pid;              /* SO_PEERCRED pid (unix socket), else 0 */
	uint32_t peer_uid;              /* SO_PEERCRED uid */
	uint64_t connect_time;          /* usec */
	uint64_t request_time;          /* usec */
	uint32_t auth_method;           /* AUTH_* it logged in with */
	uint8_t cancel_key[HANDOVER_CANCEL_KEY_LEN]; /* its cancel key: moves with it */
	const char *app_name;                        /* application_name as given, NULL = none */
	uint64_t bytes_in;                           /* byte counters of its socket */
	uint64_t bytes_out;
	HandoverVar *vars; /* tracked parameters it set */
	uint32_t nvars;
	HandoverStmt *stmts; /* its prepared statements */
	uint32_t nstmts;
	bool has_secret;        /* secret is set */
	HandoverSecret secret;  /* its login's secret */
	const uint8_t *request; /* a waiting client's buffered request (NULL: it was not waiting) */
	uint32_t request_len;
	uint64_t wait_start;   /* since when it waits, usec */
	bool wait_notice_sent; /* it got its query_wait_notify NOTICE for this wait */
	bool units_moved;      /* units is set */
	HandoverUnits units;   /* its units, moved to the receiver */
	bool has_server;       /* server is set: an idle session-mode client with its server connection */
	HandoverServer server; /* that connection; its socket is the second one attached */
} HandoverClient;

/* ---- the table (exposed for tests: tag uniqueness, each field left out in turn) ---- */

typedef enum HandoverKind {
	HK_BOOL,  /* bool: one byte, 0 or 1 */
	HK_U32,   /* uint32_t: 4 bytes, network order */
	HK_I32,   /* int32_t: 4 bytes, two's complement, network order */
	HK_U64,   /* uint64_t: 8 bytes, network order */
	HK_STR,   /* const char *: its bytes and one NUL, none inside */
	HK_BYTES, /* const uint8_t * and a uint32_t length (aux): the bytes */
	HK_FIXED, /* the member's own bytes, exactly size of them (arrays, sockaddr_storage) */
	HK_LIST, /* an array (element size `size`) and a uint32_t count (aux): u32 count, each element as u32 length + record */
	HK_RECORD, /* an embedded struct of size `size` and a bool presence flag (aux): a record */
} HandoverKind;

#define HF_REQUIRED 0x01 /* a message without it is refused */
#define HF_NONEMPTY 0x02 /* a string that may not be "" */

typedef struct HandoverTable HandoverTable;

typedef struct HandoverField {
	uint16_t tag;             /* on the wire; unique in its record, never reused for another meaning */
	uint8_t kind;             /* HandoverKind */
	uint8_t flags;            /* HF_* */
	const char *name;         /* the member's name, for error messages */
	size_t offset;            /* of the member in the record's struct */
	size_t aux;               /* of the length (BYTES), count (LIST) or presence flag (RECORD) */
	size_t size;              /* FIXED: bytes; LIST: element size; RECORD: struct size */
	uint32_t max;             /* STR: longest strlen; BYTES: longest; U32: largest; LIST: most elements; 0 = any */
	const HandoverTable *sub; /* LIST, RECORD: the element's fields */
} HandoverField;

/* A record: a sequence of fields, each tag (u16), length (u32), value; in any order, each at most once. */
struct HandoverTable {
	const char *name;            /* for error messages */
	const HandoverField *fields; /* at most 64 */
	size_t n;
};

extern const HandoverTable handover_client_fields;

/* ---- encoding and decoding ---- */

/* Append hc in the current format (CLIENT_STATE_VERSION) to out. */
void handover_encode(const HandoverClient *hc, PktBuf *out);

/*
 * Decode a message of the current format or of any format back to
 * CLIENT_STATE_VERSION_OLDEST into *hc (zeroed first), pointing into data.
 * False on anything malformed, out of range or missing, with the reason
 * in err (errlen > 0); *hc then holds nothing to free.
 */
bool handover_decode(const uint8_t *data, size_t len, HandoverClient *hc, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Free what handover_decode() allocated in hc (its lists), leaving it empty. */
void handover_free(HandoverClient *hc);

/*
 * The units the giver moved for this client, found even in a message that
 * does not decode as a whole (the receiver must give them back): true with
 * *units set if the message says some were moved.
 */
bool handover_peek_units(const uint8_t *data, size_t len, HandoverUnits *units);

/* The same for the units of the server connection a session-mode client brings. */
bool handover_peek_server_units(const uint8_t *data, size_t len, HandoverServerUnits *units);

#endif
