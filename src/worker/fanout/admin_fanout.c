/*
 * The console answers for the whole pooler: a command given to one worker's
 * console is also sent to every other worker over its private unix socket,
 * and the answers are merged with this worker's own (doc/workers.md).
 * Everything runs in the event loop; a worker that does not answer in time
 * is left out and named in a NOTICE. This is the console's transport, a
 * room below its commands: what it needs of them (a follow-up run here, the
 * stats written, the state told to the master) it asks through
 * hooks.console (include/worker/hooks.h).
 */
#include "autoconfig.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/pktbuf.h"
#include "common/proto.h"
#include "common/util.h"
#include "worker/admin_fanout.h"
#include "worker/hooks.h"
#include "worker/objects.h"
#include "worker/worker.h"

#define FANOUT_TIMEOUT_SEC 2         /* a peer that has not answered by then is left out */
#define FANOUT_MAX_MSG     (1 << 20) /* longest message accepted from a peer */

/* What one worker answered to the command in progress. */
typedef struct Answer {
	bool involved; /* asked (this worker, or a peer that was active or draining) */
	bool done;     /* its ReadyForQuery came */
	bool missing;  /* left out: `why` says why */
	char why[160];
	PktBuf rowdesc; /* its RowDescription message */
	int ncols;
	char ***rows; /* DataRows: ncols values each, NULL = SQL NULL */
	int n_rows, cap_rows;
	char *tag;        /* CommandComplete tag, NULL if none */
	PktBuf error;     /* its ErrorResponse message (len 0 if none) */
	PktBuf notices;   /* its NoticeResponse messages */
	int32_t pid;      /* the process asked */
	bool undone;      /* FM_COMMAND: its finished part was undone (or the undo is on its way) */
	char late[96];    /* the first undo or follow-up sent to it */
	bool unconfirmed; /* it did not answer that in time: `why` says so */
} Answer;

/* The connection of one console to one other worker's private socket. */
typedef struct Peer {
	struct AdminFanout *fo;  /* the console's fan-out this belongs to */
	int worker;              /* the worker it reaches */
	struct bufferevent *bev; /* NULL = not connected */
	int32_t pid;             /* the worker process it reaches */
	bool ready;              /* logged in: its first ReadyForQuery came */
	bool query_sent;         /* the current command went out */
	bool has_key;            /* BackendKeyData seen (for passing on a cancel) */
	uint8_t key[8];          /* its pid (4 bytes) and secret (4 bytes), as sent */
	int skip;                /* answers still to come to an undo or a follow-up (not the command's own answer) */
} Peer;

typedef struct AdminFanout {
	PgSocket *console;
	Peer peers[SHM_MAX_WORKERS];
	/* the command in progress */
	bool active;
	uint64_t live_at_begin; /* the workers it reached or meant to (those it drops later stay in it) */
	FanoutMerge merge;
	int which;  /* FM_STATS: which SHOW */
	bool waits; /* a live peer may take long */
	char *query;
	char *undo;          /* FM_COMMAND: undoes one worker's finished part (NULL: nothing does) */
	FanoutFollow follow; /* FM_COMMAND: what follows the answers */
	char *db;            /* FOLLOW_DISABLE: the database */
	bool state;          /* FM_COMMAND: it may change the console's state (FanoutCommand.state) */
	bool dispatched;     /* the query may go to the peers (this worker has run it) */
	bool failing;        /* a worker refused: the command fails and the finished parts are undone */
	bool cancelled;      /* the console cancelled it: the finished parts are undone */
	bool followed;       /* the follow-ups went out */
	Answer ans[SHM_MAX_WORKERS];
	struct event *timer;  /* FANOUT_TIMEOUT_SEC, then re-checks of waiting peers */
	struct event *finish; /* answers the console from the loop, never from inside its own callbacks */
} AdminFanout;

/* ---- answers ---- */

static void answer_reset(Answer *a)
{
	pktbuf_free(&a->rowdesc);
	pktbuf_free(&a->error);
	pktbuf_free(&a->notices);
	for (int r = 0; r < a->n_rows; r++) {
		for (int k = 0; k < a->ncols; k++)
			free(a->rows[r][k]);
		free(a->rows[r]);
	}
	free(a->rows);
	free(a->tag);
	memset(a, 0, sizeof(*a));
}

static void answer_add_row(Answer *a, const uint8_t *body, uint32_t len)
{
	PktReader r;
	uint16_t n;
	pktreader_init(&r, body, len);
	if (!pktreader_get_u16(&r, &n) || n != a->ncols)
		return;
	char **row = xcalloc((size_t)n + 1, sizeof(char *));
	for (int k = 0; k < n; k++) {
		uint32_t vlen;
		const uint8_t *v;
		if (!pktreader_get_u32(&r, &vlen))
			break;
		if (vlen == 0xffffffffu)
			continue;
		if (!pktreader_get_bytes(&r, vlen, &v))
			break;
		row[k] = xmalloc(vlen + 1);
		memcpy(row[k], v, vlen);
		row[k][vlen] = '\0';
	}
	if (a->n_rows == a->cap_rows) {
		a->cap_rows = a->cap_rows ? a->cap_rows * 2 : 16;
		a->rows = xrealloc(a->rows, sizeof(*a->rows) * (size_t)a->cap_rows);
	}
	a->rows[a->n_rows++] = row;
}

static void put_message(PktBuf *pb, uint8_t type, const uint8_t *body, uint32_t len)
{
	pktbuf_start_msg(pb, (char)type);
	pktbuf_put_bytes(pb, body, len);
	pktbuf_finish_msg(pb);
}

/* One message of the answer to the command in progress; true at its ReadyForQuery. */
static bool answer_message(Answer *a, uint8_t type, const uint8_t *body, uint32_t len)
{
	switch (type) {
	case 'T': {
		uint16_t n = 0;
		PktReader r;
		pktreader_init(&r, body, len);
		(void)pktreader_get_u16(&r, &n);
		a->ncols = n;
		pktbuf_reset(&a->rowdesc);
		put_message(&a->rowdesc, type, body, len);
		break;
	}
	case 'D':
		answer_add_row(a, body, len);
		break;
	case 'C': {
		PktReader r;
		const char *tag;
		pktreader_init(&r, body, len);
		if (pktreader_get_string(&r, &tag)) {
			free(a->tag);
			a->tag = xstrdup(tag);
		}
		break;
	}
	case 'E':
		pktbuf_reset(&a->error);
		put_message(&a->error, type, body, len);
		break;
	case 'N':
		put_message(&a->notices, type, body, len);
		break;
	case 'Z':
		a->done = true;
		return true;
	}
	return false;
}

/* The M field of an ErrorResponse/NoticeResponse message. */
static const char *message_text(const PktBuf *m, size_t off)
{
	const uint8_t *p = m->buf + off + 5, *end = m->buf + off + 1 +
	                                            ((uint32_t)m->buf[off + 1] << 24 | (uint32_t)m->buf[off + 2] << 16 |
	                                             (uint32_t)m->buf[off + 3] << 8 | m->buf[off + 4]);
	while (p < end && *p) {
		const uint8_t *val = p + 1;
		size_t n = strnlen((const char *)val, (size_t)(end - val));
		if (*p == 'M')
			return (const char *)val;
		p = val + n + 1;
	}
	return "";
}

/* ---- finishing a command ---- */

static void schedule_finish(AdminFanout *fo)
{
	event_active(fo->finish, 0, 0);
}

/* Every involved worker answered (or is left out), its undo or follow-up too. */
static bool all_done(const AdminFanout *fo)
{
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (fo->ans[i].involved && !fo->ans[i].missing && (!fo->ans[i].done || fo->peers[i].skip))
			return false;
	return true;
}

static void peer_close(Peer *p)
{
	if (p->bev)
		bufferevent_free(p->bev);
	p->bev = NULL;
	p->pid = 0;
	p->ready = p->query_sent = p->has_key = false;
	p->skip = 0;
}

/* Leave worker i out of the command in progress. */
static void leave_out(AdminFanout *fo, int i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void leave_out(AdminFanout *fo, int i, const char *fmt, ...)
{
	Answer *a = &fo->ans[i];
	if (!fo->active || !a->involved || a->done || a->missing)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(a->why, sizeof(a->why), fmt, ap);
	va_end(ap);
	a->missing = true;
	log_warning("console command \"%s\": %s", fo->query, a->why);
	if (all_done(fo))
		schedule_finish(fo);
}

/* Merged rows in first-seen order. */
typedef struct MergedRow {
	char **v;
	int seq; /* first-seen order */
} MergedRow;

typedef struct Merged {
	MergedRow *rows; /* copies, folded into by fold_row() */
	int n, cap;
} Merged;

static bool is_key(FanoutMerge m, int col)
{
	switch (m) {
	case FM_POOLS:
		return col <= 1;
	case FM_DATABASES:
	case FM_USERS:
	case FM_MEM:
	case FM_STATE:
	case FM_DNS:
		return col == 0;
	default:
		return false;
	}
}

static bool same_key(FanoutMerge m, int ncols, char **a, char **b)
{
	for (int k = 0; k < ncols; k++)
		if (is_key(m, k) && strcmp(a[k] ? a[k] : "", b[k] ? b[k] : "") != 0)
			return false;
	return true;
}

static char *sum_text(const char *a, const char *b)
{
	char buf[32];
	snprintf(buf, sizeof(buf), "%lld", (a ? atoll(a) : 0) + (b ? atoll(b) : 0));
	return xstrdup(buf);
}

static char *max_text(const char *a, const char *b)
{
	long long x = a ? atoll(a) : 0, y = b ? atoll(b) : 0;
	return xstrdup(x >= y ? (a ? a : "0") : b);
}

/* Fold row `src` into the merged row `dst` (a copy owned by the merge). */
static void fold_row(FanoutMerge m, int ncols, char **dst, char **src)
{
	for (int k = 0; k < ncols; k++) {
		char *nv = NULL;
		switch (m) {
		case FM_POOLS:
			if (k >= 2 && k <= 12)
				nv = sum_text(dst[k], src[k]);
			else if (k == 13) {
				/* maxwait and maxwait_us move together */
				long long a = dst[13] ? atoll(dst[13]) * 1000000 + (dst[14] ? atoll(dst[14]) : 0) : 0;
				long long b = src[13] ? atoll(src[13]) * 1000000 + (src[14] ? atoll(src[14]) : 0) : 0;
				if (b > a) {
					free(dst[13]);
					free(dst[14]);
					dst[13] = src[13] ? xstrdup(src[13]) : NULL;
					dst[14] = src[14] ? xstrdup(src[14]) : NULL;
				}
				k = 14;
				continue;
			}
			break;
		case FM_DATABASES:
			if (k == 12 || k == 14)
				nv = sum_text(dst[k], src[k]);
			else if (k == 15 || k == 16)
				nv = max_text(dst[k], src[k]);
			break;
		case FM_USERS:
			if (k == 5 || k == 7)
				nv = sum_text(dst[k], src[k]);
			break;
		case FM_MEM:
			if (k >= 2)
				nv = sum_text(dst[k], src[k]);
			break;
		case FM_STATE:
			if (k == 1) {
				bool all = strcmp(dst[0] ? dst[0] : "", "active") == 0;
				bool x = dst[1] && strcmp(dst[1], "yes") == 0, y = src[1] && strcmp(src[1], "yes") == 0;
				nv = xstrdup((all ? x && y : x || y) ? "yes" : "no");
			}
			break;
		default:
			break;
		}
		if (nv) {
			free(dst[k]);
			dst[k] = nv;
		}
	}
}

static char **copy_row(int ncols, char **src)
{
	char **row = xcalloc((size_t)ncols + 1, sizeof(char *));
	for (int k = 0; k < ncols; k++)
		row[k] = src[k] ? xstrdup(src[k]) : NULL;
	return row;
}

static int merged_cmp_pools(const void *x, const void *y)
{
	const MergedRow *a = x, *b = y;
	int c = strcmp(a->v[0] ? a->v[0] : "", b->v[0] ? b->v[0] : "");
	if (c == 0)
		c = strcmp(a->v[1] ? a->v[1] : "", b->v[1] ? b->v[1] : "");
	return c ? c : a->seq - b->seq;
}

static int merged_cmp_name(const void *x, const void *y)
{
	const MergedRow *a = x, *b = y;
	int c = strcmp(a->v[0] ? a->v[0] : "", b->v[0] ? b->v[0] : "");
	return c ? c : a->seq - b->seq;
}

/*
 * SHOW CLIENTS, SERVERS, SOCKETS: where a row goes in one PgBouncer's order.
 * Logging-in clients come first (SOCKETS), then the pools by (database, user),
 * each with its clients and then its servers in list order, then the
 * peer-forwarding entries; columns 1, 2 and 4 are user, database and state.
 */
static int socket_row_group(char **v)
{
	if (v[4] && strcmp(v[4], "cl_login") == 0)
		return 0;
	return v[2] && strcmp(v[2], "(nodb)") == 0 ? 2 : 1;
}

static int socket_row_rank(char **v)
{
	static const char *const client_states[] = {"active", "waiting", "active_cancel_req", "waiting_cancel_req"};
	static const char *const server_states[] = {"active", "idle",          "used",          "tested",
	                                            "new",    "active_cancel", "being_canceled"};
	bool server = v[0] && strcmp(v[0], "S") == 0;
	const char *const *states = server ? server_states : client_states;
	int n = server ? 7 : 4, base = server ? 4 : 0; /* a pool's clients before its servers */
	const char *st = v[4] ? v[4] : "";
	if (strncmp(st, "cl_", 3) == 0 || strncmp(st, "sv_", 3) == 0)
		st += 3; /* SOCKETS' names */
	if (!server && strcmp(st, "idle") == 0)
		st = "active"; /* an idle client is on the active list */
	if (server && strcmp(st, "login") == 0)
		st = "new";
	for (int k = 0; k < n; k++)
		if (strcmp(states[k], st) == 0)
			return base + k;
	return base + n;
}

static int merged_cmp_sockets(const void *x, const void *y)
{
	const MergedRow *a = x, *b = y;
	int c = socket_row_group(a->v) - socket_row_group(b->v);
	if (c == 0 && socket_row_group(a->v) == 1) {
		c = strcmp(a->v[2] ? a->v[2] : "", b->v[2] ? b->v[2] : "");
		if (c == 0)
			c = strcmp(a->v[1] ? a->v[1] : "", b->v[1] ? b->v[1] : "");
		if (c == 0)
			c = socket_row_rank(a->v) - socket_row_rank(b->v);
	}
	return c ? c : a->seq - b->seq;
}

/* Rows of every answering worker, merged by the command's rule, into pb. */
static void write_merged_rows(AdminFanout *fo, PktBuf *pb, int ncols)
{
	Merged mg = {0};
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Answer *a = &fo->ans[i];
		if (!a->done || a->missing || a->error.len || a->ncols != ncols)
			continue;
		for (int r = 0; r < a->n_rows; r++) {
			char **row = a->rows[r];
			int found = -1;
			if (fo->merge != FM_CONCAT)
				for (int k = 0; k < mg.n && found < 0; k++)
					if (same_key(fo->merge, ncols, mg.rows[k].v, row))
						found = k;
			if (found >= 0) {
				fold_row(fo->merge, ncols, mg.rows[found].v, row);
				continue;
			}
			if (mg.n == mg.cap) {
				mg.cap = mg.cap ? mg.cap * 2 : 32;
				mg.rows = xrealloc(mg.rows, sizeof(*mg.rows) * (size_t)mg.cap);
			}
			mg.rows[mg.n].v = copy_row(ncols, row);
			mg.rows[mg.n].seq = mg.n;
			mg.n++;
		}
	}
	if (fo->merge == FM_CONCAT && ncols > 4)
		qsort(mg.rows, (size_t)mg.n, sizeof(*mg.rows), merged_cmp_sockets);
	else if (fo->merge == FM_POOLS)
		qsort(mg.rows, (size_t)mg.n, sizeof(*mg.rows), merged_cmp_pools);
	else if (fo->merge == FM_DATABASES || fo->merge == FM_USERS || fo->merge == FM_DNS)
		qsort(mg.rows, (size_t)mg.n, sizeof(*mg.rows), merged_cmp_name);
	for (int k = 0; k < mg.n; k++) {
		pktbuf_write_data_row(pb, ncols, (const char *const *)mg.rows[k].v);
		for (int c = 0; c < ncols; c++)
			free(mg.rows[k].v[c]);
		free(mg.rows[k].v);
	}
	free(mg.rows);
}

static int dbstats_cmp(const void *x, const void *y)
{
	return strcmp(((const DbStats *)x)->name, ((const DbStats *)y)->name);
}

/*
 * SHOW STATS & co: every worker answered STATS_RAW (database, then its
 * totals, its older snapshot and its rates, one column per counter each);
 * sum per database.
 */
static void write_stats(AdminFanout *fo, PktBuf *pb)
{
	enum { NF = sizeof(PgStats) / sizeof(uint64_t) };
	DbStats *arr = NULL;
	int n = 0, cap = 0;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Answer *a = &fo->ans[i];
		if (!a->done || a->missing || a->error.len || a->ncols != 1 + 3 * NF)
			continue;
		for (int r = 0; r < a->n_rows; r++) {
			char **row = a->rows[r];
			if (!row[0])
				continue;
			DbStats *d = NULL;
			for (int k = 0; k < n && !d; k++)
				if (strcmp(arr[k].name, row[0]) == 0)
					d = &arr[k];
			if (!d) {
				if (n == cap) {
					cap = cap ? cap * 2 : 16;
					arr = xrealloc(arr, sizeof(*arr) * (size_t)cap);
				}
				d = &arr[n++];
				memset(d, 0, sizeof(*d));
				d->name = row[0];
			}
			uint64_t *dst[2] = {(uint64_t *)&d->total, (uint64_t *)&d->older};
			for (int s = 0; s < 2; s++)
				for (int f = 0; f < NF; f++) {
					const char *v = row[1 + s * NF + f];
					dst[s][f] += v ? strtoull(v, NULL, 10) : 0;
				}
			for (int f = 0; f < NF; f++) {
				const char *v = row[1 + 2 * NF + f];
				d->rate[f] += v ? strtod(v, NULL) : 0;
			}
		}
	}
	qsort(arr, (size_t)n, sizeof(*arr), dbstats_cmp);
	hooks.console.write_stats(pb, fo->which, arr, n, true); /* admin_write_stats() */
	free(arr);
}

static int cmp_text(const char *a, const char *b)
{
	return strcmp(a ? a : "", b ? b : "");
}

/* Name rows of LISTS_RAW: by list, database, user. */
static int name_row_cmp(const void *x, const void *y)
{
	char **a = *(char **const *)x, **b = *(char **const *)y;
	int c = cmp_text(a[0], b[0]);
	if (c == 0)
		c = cmp_text(a[2], b[2]);
	return c ? c : cmp_text(a[3], b[3]);
}

/*
 * SHOW LISTS: every worker answered LISTS_RAW. Databases, users, pools and
 * DNS names exist in every worker that uses them: each distinct one counts
 * once. Peers come from the configuration, the same everywhere: the largest.
 * The rest are connections or queries of one worker each: summed.
 */
static void write_lists(AdminFanout *fo, PktBuf *pb)
{
	static const char *const names[] = {"list", "items"};
	static const char *const distinct[] = {"databases", "users", "pools", "dns_names"};
	enum { NDISTINCT = sizeof(distinct) / sizeof(distinct[0]) };
	long long n_distinct[NDISTINCT] = {0};
	const char *order[32];
	long long items[32];
	int n = 0;
	char ***name_rows = NULL;
	int n_names = 0, cap_names = 0;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Answer *a = &fo->ans[i];
		if (!a->done || a->missing || a->error.len || a->ncols != 4)
			continue;
		for (int r = 0; r < a->n_rows; r++) {
			char **row = a->rows[r];
			if (!row[0])
				continue;
			if (row[2] || row[3]) {
				if (n_names == cap_names) {
					cap_names = cap_names ? cap_names * 2 : 64;
					name_rows = xrealloc(name_rows, sizeof(*name_rows) * (size_t)cap_names);
				}
				name_rows[n_names++] = row;
				continue;
			}
			long long v = row[1] ? atoll(row[1]) : 0;
			int k = 0;
			while (k < n && strcmp(order[k], row[0]) != 0)
				k++;
			if (k == n) {
				if (n == 32)
					continue;
				order[n] = row[0];
				items[n++] = 0;
			}
			items[k] = strcmp(row[0], "peers") == 0 ? (v > items[k] ? v : items[k]) : items[k] + v;
		}
	}
	qsort(name_rows, (size_t)n_names, sizeof(*name_rows), name_row_cmp);
	for (int r = 0; r < n_names; r++) {
		if (r > 0 && name_row_cmp(&name_rows[r - 1], &name_rows[r]) == 0)
			continue; /* the same object in another worker */
		for (int k = 0; k < NDISTINCT; k++)
			if (strcmp(name_rows[r][0], distinct[k]) == 0)
				n_distinct[k]++;
	}
	free(name_rows);
	pktbuf_write_row_description(pb, "Ti", names);
	for (int k = 0; k < n; k++) {
		long long v = items[k];
		for (int d = 0; d < NDISTINCT; d++)
			if (strcmp(order[k], distinct[d]) == 0)
				v = n_distinct[d];
		char buf[32];
		snprintf(buf, sizeof(buf), "%lld", v);
		const char *vals[] = {order[k], buf};
		pktbuf_write_data_row(pb, 2, vals);
	}
	pktbuf_write_command_complete(pb, "SHOW");
}

static void end_command(AdminFanout *fo)
{
	fo->active = false;
	free(fo->query);
	free(fo->undo);
	free(fo->db);
	fo->query = fo->undo = fo->db = NULL;
	fo->follow = FOLLOW_NONE;
	fo->state = false;
	fo->dispatched = fo->failing = fo->cancelled = fo->followed = false;
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		answer_reset(&fo->ans[i]);
	evtimer_del(fo->timer);
}

/* Notices of every worker, each text once. */
static void write_notices(AdminFanout *fo, PktBuf *pb)
{
	char *seen[64];
	int n_seen = 0;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		PktBuf *nb = &fo->ans[i].notices;
		for (size_t off = 0; off + 5 <= nb->len;) {
			uint32_t len = (uint32_t)nb->buf[off + 1] << 24 | (uint32_t)nb->buf[off + 2] << 16 |
			               (uint32_t)nb->buf[off + 3] << 8 | nb->buf[off + 4];
			const char *text = message_text(nb, off);
			bool dup = false;
			for (int k = 0; k < n_seen; k++)
				dup |= strcmp(seen[k], text) == 0;
			if (!dup) {
				pktbuf_put_bytes(pb, nb->buf + off, 1 + len);
				if (n_seen < 64)
					seen[n_seen++] = (char *)text;
			}
			off += 1 + len;
		}
	}
}

/* ---- a process command's outcome (FM_COMMAND) ---- */

bool admin_error_is_absence(const char *msg)
{
	static const char not_paused[] = " is not paused";
	size_t n = strlen(msg), k = sizeof(not_paused) - 1;
	return strncmp(msg, "no such database: ", 18) == 0 || strcmp(msg, "client not found") == 0 ||
	       strcmp(msg, "pooler is not paused/suspended") == 0 ||
	       (strncmp(msg, "database ", 9) == 0 && n > k && strcmp(msg + n - k, not_paused) == 0);
}

static void send_cancel(AdminFanout *fo, int i);

/* An answer that refuses the command: an error other than "nothing here" (admin_error_is_absence()). */
static bool refused(const Answer *a)
{
	return a->done && !a->tag && a->error.len && !admin_error_is_absence(message_text(&a->error, 0));
}

static bool absent(const Answer *a)
{
	return a->done && !a->tag && a->error.len && admin_error_is_absence(message_text(&a->error, 0));
}

static void ensure_timer(AdminFanout *fo)
{
	struct timeval tv = {0, 250000};
	if (!evtimer_pending(fo->timer, NULL))
		evtimer_add(fo->timer, &tv);
}

/* Send worker i a query whose answer nobody reads but the command waits for (an undo or a follow-up). */
static bool send_extra(AdminFanout *fo, int i, const char *query)
{
	Peer *p = &fo->peers[i];
	if (!p->bev || !p->ready)
		return false;
	pktbuf_send_query(p->bev, query);
	p->skip++;
	if (!fo->ans[i].late[0])
		pgb_strlcpy(fo->ans[i].late, query, sizeof(fo->ans[i].late));
	ensure_timer(fo);
	return true;
}

/* Worker i's part is done and the command is failing or cancelled: undo it, if anything can. */
static void undo_peer(AdminFanout *fo, int i)
{
	Answer *a = &fo->ans[i];
	if (fo->undo && !a->undone && send_extra(fo, i, fo->undo))
		a->undone = true;
}

/*
 * A worker refused the command: it fails as a whole. Peers that have not
 * got it yet never will, those done are undone, those still waiting are
 * cancelled (their part aborts and undoes itself), and so is this worker's.
 */
static void fail_command(AdminFanout *fo)
{
	fo->failing = true;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Answer *a = &fo->ans[i];
		if (i == wk.id || !a->involved || a->missing)
			continue;
		if (!a->done && !fo->peers[i].query_sent)
			a->involved = false;
		else if (a->done && a->tag)
			undo_peer(fo, i);
		else if (!a->done && fo->waits)
			send_cancel(fo, i);
	}
	Answer *own = &fo->ans[wk.id];
	if (!own->done || own->tag) {
		own->undone = own->tag && fo->undo;
		/* may answer into the capture (a bare ReadyForQuery): the finish is scheduled, never run from here */
		hooks.console.abandon_part(fo->console, fo->query, own->done); /* admin_abandon_part() */
	}
}

/* Worker i has answered the command. */
static void answer_ended(AdminFanout *fo, int i)
{
	Answer *a = &fo->ans[i];
	if (fo->merge == FM_COMMAND) {
		if (!fo->failing && refused(a))
			fail_command(fo);
		else if (a->tag && (fo->failing || fo->cancelled) && i != wk.id)
			undo_peer(fo, i); /* it finished after the cancel or the refusal went out */
	}
	if (all_done(fo))
		schedule_finish(fo);
}

static bool has_row(const Answer *a, const char *name)
{
	for (int r = 0; r < a->n_rows; r++)
		if (a->ncols == 1 && a->rows[r][0] && strcmp(a->rows[r][0], name) == 0)
			return true;
	return false;
}

/* "VERB "name"": the name as a quoted identifier. */
static char *quoted_command(const char *verb, const char *name)
{
	size_t n = strlen(verb), k = n + 2;
	char *q = xmalloc(n + 2 * strlen(name) + 4);
	memcpy(q, verb, n);
	q[n] = ' ';
	q[n + 1] = '"';
	for (const char *p = name; *p; p++) {
		if (*p == '"')
			q[k++] = '"';
		q[k++] = *p;
	}
	q[k++] = '"';
	q[k] = '\0';
	return q;
}

/* Apply a follow-up to worker i; true if it went to a peer (its answer is awaited). */
static bool follow_worker(AdminFanout *fo, int i, const char *verb, const char *name, bool *here)
{
	if (i == wk.id) {
		if (fo->follow == FOLLOW_KILL)
			hooks.console.kill_here(name); /* admin_kill_here() */
		else
			hooks.console.disable_later(name); /* admin_disable_later() */
		*here = true;
		return false;
	}
	char *q = quoted_command(verb, name);
	bool sent = send_extra(fo, i, q);
	free(q);
	return sent;
}

/*
 * Every worker has answered a command that succeeded: make the workers
 * agree where their own answers could not (FanoutFollow). True if
 * follow-ups went to peers: the reply waits for their answers.
 */
static bool follow_up(AdminFanout *fo)
{
	bool sent = false, here = false;
	fo->followed = true;
	if (fo->follow == FOLLOW_KILL) {
		/* each database a worker paused, once: the workers that answered without it kill it too */
		for (int i = 0; i < SHM_MAX_WORKERS; i++) {
			const Answer *a = &fo->ans[i];
			if (!a->involved || a->missing || !a->tag || a->ncols != 1)
				continue;
			for (int r = 0; r < a->n_rows; r++) {
				const char *name = a->rows[r][0];
				bool seen = false;
				for (int k = 0; name && k < i && !seen; k++)
					seen = fo->ans[k].tag && has_row(&fo->ans[k], name);
				for (int k = 0; k < r && name && !seen; k++)
					seen = a->rows[k][0] && strcmp(a->rows[k][0], name) == 0;
				if (!name || seen)
					continue;
				for (int j = 0; j < SHM_MAX_WORKERS; j++) {
					const Answer *b = &fo->ans[j];
					if (j != i && b->involved && !b->missing && b->tag && !has_row(b, name))
						sent |= follow_worker(fo, j, "KILL", name, &here);
				}
			}
		}
	} else if (fo->follow == FOLLOW_DISABLE && fo->db) {
		/* if a worker has the database, those without it remember the flag for when they create it through "*" */
		bool somewhere = false;
		for (int i = 0; i < SHM_MAX_WORKERS; i++)
			somewhere |= fo->ans[i].involved && !fo->ans[i].missing && fo->ans[i].tag;
		for (int j = 0; somewhere && j < SHM_MAX_WORKERS; j++) {
			const Answer *b = &fo->ans[j];
			if (b->involved && !b->missing && absent(b))
				sent |= follow_worker(fo, j, "DISABLE_LATER", fo->db, &here);
		}
	}
	if (here)
		hooks.console.report_state(); /* admin_state_report() */
	return sent;
}

/* The NOTICEs of a process command's outcome, and its reply (CommandComplete or ErrorResponse). */
static void write_command_outcome(AdminFanout *fo, PktBuf *pb)
{
	int ok = -1, refusal = -1, absence = -1;
	bool aborted = false, agreed = true;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		const Answer *a = &fo->ans[i];
		if (!a->involved || a->missing)
			continue;
		int *slot = a->tag ? &ok : refused(a) ? &refusal : absent(a) ? &absence : NULL;
		if (!slot)
			aborted = true; /* a cancelled PAUSE/SUSPEND/WAIT_CLOSE: bare ReadyForQuery */
		else if (*slot < 0 || i == wk.id)
			*slot = i; /* this worker's answer first */
		agreed &= refused(a);
	}
	/* a cancelled PAUSE [db] or SUSPEND is undone wherever it was done: it ends as abandoned, not as done */
	if (fo->cancelled && fo->undo)
		aborted = true;
	if (fo->failing && refusal >= 0) {
		for (int i = 0; i < SHM_MAX_WORKERS; i++) {
			const Answer *a = &fo->ans[i];
			char msg[256];
			if (!a->involved || a->missing)
				continue;
			if (refused(a) && !agreed && i != refusal)
				snprintf(msg, sizeof(msg), "worker %d (pid %d) refused it too: %s", i, (int)a->pid,
				         message_text(&a->error, 0));
			else if (refused(a) && !agreed)
				snprintf(msg, sizeof(msg), "worker %d (pid %d) refused it", i, (int)a->pid);
			else if (a->tag && !a->undone)
				snprintf(msg, sizeof(msg),
				         "worker %d (pid %d) had carried it out already: that is not undone", i,
				         (int)a->pid);
			else
				continue;
			pktbuf_write_notice(pb, msg);
		}
		pktbuf_put_bytes(pb, fo->ans[refusal].error.buf, fo->ans[refusal].error.len);
	} else if (aborted) {
		/* nothing but the ReadyForQuery */
	} else if (ok >= 0) {
		pktbuf_write_command_complete(pb, fo->ans[ok].tag);
	} else if (absence >= 0) {
		/* no worker had anything to act on: this worker's error says why (the others say the same) */
		pktbuf_put_bytes(pb, fo->ans[absence].error.buf, fo->ans[absence].error.len);
		if (fo->console)
			hooks.console.log_command_error(fo->console, message_text(&fo->ans[absence].error, 0));
	}
}

/*
 * The workers a state command leaves out: those that did not answer it (or
 * its undo or follow-up) in time, and, when the console goes away before the
 * reply, those that have not answered yet. Their connections from this
 * console are closed, so a query still on its way there is refused as stale
 * (run_command() in admin.c); the master hands them the state this worker
 * reported instead.
 */
static uint64_t missed(const AdminFanout *fo);

static uint64_t left_out(const AdminFanout *fo, bool console_gone)
{
	uint64_t mask = fo->state ? missed(fo) : 0; /* started meanwhile: they never got it */
	for (int i = 0; fo->state && i < SHM_MAX_WORKERS; i++) {
		const Answer *a = &fo->ans[i];
		if (i != wk.id && a->involved &&
		    (a->missing || a->unconfirmed || (console_gone && (!a->done || fo->peers[i].skip))))
			mask |= UINT64_C(1) << i;
	}
	return mask;
}

static void on_finish(evutil_socket_t fd, short what, void *arg)
{
	AdminFanout *fo = arg;
	worker_clock_tick();
	if (!fo->active || !all_done(fo))
		return;
	/* a cancel only abandons waits: a KILL or DISABLE that it came too late for still has its follow-ups */
	if (fo->merge == FM_COMMAND && !fo->failing && !fo->followed && follow_up(fo))
		return; /* called again once the follow-ups are answered */
	PgSocket *c = fo->console;
	Answer *own = &fo->ans[wk.id];
	PktBuf pb;
	pktbuf_init(&pb, 1024);
	write_notices(fo, &pb);
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Answer *a = &fo->ans[i];
		char msg[256];
		if (!a->involved || i == wk.id)
			continue;
		if (a->missing)
			snprintf(msg, sizeof(msg), "%s", a->why);
		else if (a->error.len && fo->merge != FM_COMMAND)
			snprintf(msg, sizeof(msg), "worker %d answered: %s", i, message_text(&a->error, 0));
		else if (a->unconfirmed)
			snprintf(msg, sizeof(msg), "%s", a->why);
		else
			continue;
		pktbuf_write_notice(&pb, msg);
	}

	bool aborted = false;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Answer *a = &fo->ans[i];
		if (a->involved && !a->missing && !a->tag && !a->error.len)
			aborted = true; /* a cancelled SHOW? only a command waits: a bare ReadyForQuery */
	}
	if (fo->merge == FM_COMMAND) {
		write_command_outcome(fo, &pb);
	} else if (aborted) {
		/* nothing but the ReadyForQuery */
	} else if (own->error.len) {
		pktbuf_put_bytes(&pb, own->error.buf, own->error.len);
	} else if (fo->merge == FM_STATS) {
		write_stats(fo, &pb);
	} else if (fo->merge == FM_LISTS) {
		write_lists(fo, &pb);
	} else {
		if (own->rowdesc.len)
			pktbuf_put_bytes(&pb, own->rowdesc.buf, own->rowdesc.len);
		write_merged_rows(fo, &pb, own->ncols);
		pktbuf_write_command_complete(&pb, own->tag ? own->tag : "SHOW");
	}
	pktbuf_write_ready(&pb, 'I');
	hooks.console.left_out(left_out(fo, false)); /* admin_state_left_out() */
	end_command(fo);
	bool ok = sbuf_send(&c->sb, pb.buf, pb.len);
	pktbuf_free(&pb);
	if (!ok) {
		disconnect_client(c, false, "client send failed");
		return;
	}
	/* a query that came meanwhile waited for this */
	sbuf_continue(&c->sb);
}

/* ---- peers ---- */

/* The private socket of worker i (private_socket_dir() left room for the name). */
static void peer_address(int i, struct sockaddr_un *sa)
{
	char path[sizeof(sa->sun_path) + 32];
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	snprintf(path, sizeof(path), "%s/worker.%d/.s.PGSQL.%d", worker_private_dir(), i, wk.cf.g.listen_port);
	pgb_strlcpy(sa->sun_path, path, sizeof(sa->sun_path));
}

static void peer_send_query(AdminFanout *fo, Peer *p)
{
	pktbuf_send_query(p->bev, fo->query);
	p->query_sent = true;
}

static void peer_failed(Peer *p, const char *what)
{
	int32_t pid = p->pid;
	AdminFanout *fo = p->fo;
	peer_close(p);
	leave_out(fo, p->worker, "worker %d (pid %d) is left out: %s", p->worker, (int)pid, what);
	if (fo->active && all_done(fo))
		schedule_finish(fo); /* it owed only the answer to an undo or follow-up */
}

/* Messages from a peer: its login, then its answers to the command in progress. */
static void on_peer_read(struct bufferevent *bev, void *arg)
{
	Peer *p = arg;
	AdminFanout *fo = p->fo;
	Answer *a = &fo->ans[p->worker];
	struct evbuffer *in = bufferevent_get_input(bev);
	wk.now = get_time_usec();
	for (;;) {
		uint8_t hdr[5];
		if (evbuffer_copyout(in, hdr, 5) < 5)
			return;
		uint32_t len = (uint32_t)hdr[1] << 24 | (uint32_t)hdr[2] << 16 | (uint32_t)hdr[3] << 8 | hdr[4];
		if (len < 4 || len > FANOUT_MAX_MSG) {
			peer_failed(p, "bad message");
			return;
		}
		if (evbuffer_get_length(in) < (size_t)len + 1)
			return;
		const uint8_t *msg = evbuffer_pullup(in, (ev_ssize_t)len + 1);
		const uint8_t *body = msg + 5;
		uint32_t blen = len - 4;
		if (!p->ready) {
			if (hdr[0] == 'E') {
				char why[200];
				PktBuf tmp;
				pktbuf_init(&tmp, len + 1);
				pktbuf_put_bytes(&tmp, msg, len + 1);
				snprintf(why, sizeof(why), "login refused: %s", message_text(&tmp, 0));
				pktbuf_free(&tmp);
				peer_failed(p, why);
				return;
			}
			if (hdr[0] == 'R' && (blen < 4 || (body[0] | body[1] | body[2] | body[3]))) {
				peer_failed(p, "login asks for a password");
				return;
			}
			if (hdr[0] == 'K' && blen >= 8) {
				memcpy(p->key, body, 8);
				p->has_key = true;
			}
			if (hdr[0] == 'Z') {
				p->ready = true;
				if (fo->active && fo->dispatched && a->involved && !a->missing && !a->done &&
				    !p->query_sent)
					peer_send_query(fo, p);
			}
			evbuffer_drain(in, (size_t)len + 1);
			continue;
		}
		if (p->skip) {
			/* the answer to an undo or follow-up, sent after the command's and before any later one's */
			evbuffer_drain(in, (size_t)len + 1);
			if (hdr[0] == 'Z' && --p->skip == 0 && fo->active && all_done(fo))
				schedule_finish(fo);
			continue;
		}
		bool end = false;
		if (fo->active && a->involved && !a->missing && p->query_sent)
			end = answer_message(a, hdr[0], body, blen);
		evbuffer_drain(in, (size_t)len + 1);
		if (end) {
			p->query_sent = false;
			answer_ended(fo, p->worker);
		}
	}
}

static void on_peer_event(struct bufferevent *bev, short what, void *arg)
{
	Peer *p = arg;
	worker_clock_tick();
	if (what & BEV_EVENT_EOF) {
		peer_failed(p, "its connection closed");
	} else if (what & BEV_EVENT_ERROR) {
		char why[160];
		snprintf(why, sizeof(why), "could not reach it: %s", strerror(EVUTIL_SOCKET_ERROR()));
		peer_failed(p, why);
	}
}

static bool peer_connect(Peer *p, int32_t pid)
{
	struct sockaddr_un sa;
	peer_address(p->worker, &sa);
	p->bev = bufferevent_socket_new(wk.base, -1, BEV_OPT_CLOSE_ON_FREE);
	if (!p->bev)
		return false;
	p->pid = pid;
	bufferevent_setcb(p->bev, on_peer_read, NULL, on_peer_event, p);
	bufferevent_enable(p->bev, EV_READ | EV_WRITE);
	if (bufferevent_socket_connect(p->bev, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return false;
	/* StartupMessage, protocol 3.0: the same-UID "pgbouncer" login of the console */
	char app[64];
	snprintf(app, sizeof(app), "console of worker %d", wk.id);
	PktBuf pb;
	pktbuf_init(&pb, 128);
	pktbuf_put_console_login(&pb, app);
	bufferevent_write(p->bev, pb.buf, pb.len);
	pktbuf_free(&pb);
	return true;
}

/* ---- the command's life ---- */

static bool slot_serving(int i, int32_t *pid)
{
	if (!wk.slot || !wk.shm)
		return false;
	WorkerSlot *s = &wk.shm->slots[i];
	uint32_t st = atomic_load(&s->state);
	*pid = atomic_load(&s->pid);
	return *pid > 0 && (st == SLOT_ACTIVE || st == SLOT_DRAINING);
}

/*
 * The workers a console command of c (on this worker) does not reach as
 * peers: every other live one when it does not fan out, else those its
 * fan-out did not involve, such as a worker that was still starting when it
 * began (its slot not ACTIVE yet). The master hands them what the command
 * left (doc/workers.md "Console state").
 */
static uint64_t missed(const AdminFanout *fo)
{
	uint64_t mask = 0;
	for (int i = 0; wk.slot && wk.shm && i < SHM_MAX_WORKERS; i++) {
		if (i == wk.id || (fo && (fo->live_at_begin >> i & 1)))
			continue;
		uint32_t st = atomic_load(&wk.shm->slots[i].state);
		if (atomic_load(&wk.shm->slots[i].pid) > 0 &&
		    (st == SLOT_STARTING || st == SLOT_ACTIVE || st == SLOT_DRAINING))
			mask |= UINT64_C(1) << i;
	}
	return mask;
}

uint64_t admin_fanout_missed(const PgSocket *c)
{
	/* a console on a worker's private socket speaks for that worker only */
	if (c->is_private && !c->from_master)
		return 0;
	/* a fan-out object left from an earlier command says nothing of this one */
	return missed(c->fanout && c->fanout->active ? c->fanout : NULL);
}

/* A peer is alive while its loop keeps publishing (every 100 ms) and its slot is the same process. */
static bool peer_alive(const Peer *p)
{
	int32_t pid;
	if (!slot_serving(p->worker, &pid) || pid != p->pid)
		return false;
	struct timespec mono;
	clock_gettime(CLOCK_MONOTONIC, &mono);
	uint64_t now_ns = (uint64_t)mono.tv_sec * 1000000000u + (uint64_t)mono.tv_nsec;
	uint64_t seen = atomic_load(&wk.shm->slots[p->worker].sample_time_ns);
	return now_ns < seen + (uint64_t)FANOUT_TIMEOUT_SEC * 1000000000u;
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	AdminFanout *fo = arg;
	wk.now = get_time_usec();
	if (!fo->active)
		return;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Answer *a = &fo->ans[i];
		Peer *p = &fo->peers[i];
		if (i == wk.id || !a->involved || a->missing || (a->done && !p->skip))
			continue;
		/* PAUSE and friends may wait long on a live worker, and so may an undo; a stopped or hung one is left out */
		if ((fo->waits || a->done) && p->bev && peer_alive(p))
			continue;
		int32_t pid = p->pid;
		peer_close(p); /* a late answer must not be taken for the next command's */
		if (!a->done) {
			leave_out(fo, i, "worker %d (pid %d) did not answer within %d seconds and is left out", i,
			          (int)pid, FANOUT_TIMEOUT_SEC);
			continue;
		}
		snprintf(a->why, sizeof(a->why),
		         "worker %d (pid %d) did not answer \"%s\" in time: its state may differ", i, (int)pid,
		         a->late);
		a->unconfirmed = true;
		log_warning("console command \"%s\": %s", fo->query, a->why);
	}
	if (all_done(fo))
		schedule_finish(fo);
	else
		ensure_timer(fo);
}

bool admin_fanout_from_worker(int pid)
{
	if (!wk.slot || !wk.shm || pid <= 0)
		return false;
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (i != wk.id && atomic_load(&wk.shm->slots[i].pid) == pid)
			return true;
	return false;
}

bool admin_fanout_wanted(const PgSocket *c)
{
	if ((c->is_private && !c->from_master) || !wk.slot || !worker_private_dir()[0])
		return false;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		int32_t pid;
		if (i != wk.id && slot_serving(i, &pid))
			return true;
	}
	return false;
}

static AdminFanout *fanout_new(PgSocket *c)
{
	AdminFanout *fo = xcalloc(1, sizeof(*fo));
	fo->console = c;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		fo->peers[i].fo = fo;
		fo->peers[i].worker = i;
	}
	fo->timer = evtimer_new(wk.base, on_timer, fo);
	fo->finish = event_new(wk.base, -1, 0, on_finish, fo);
	return fo;
}

void admin_fanout_begin(PgSocket *c, const char *query, FanoutMerge merge, int which, bool waits,
                        const FanoutCommand *cmd)
{
	if (!c->fanout)
		c->fanout = fanout_new(c);
	AdminFanout *fo = c->fanout;
	fo->active = true;
	fo->merge = merge;
	fo->which = which;
	fo->waits = waits;
	fo->query = xstrdup(query);
	if (cmd) {
		fo->undo = cmd->undo ? xstrdup(cmd->undo) : NULL;
		fo->follow = cmd->follow;
		fo->db = cmd->db ? xstrdup(cmd->db) : NULL;
		fo->state = cmd->state;
	}
	fo->ans[wk.id].involved = true;
	fo->ans[wk.id].pid = (int32_t)getpid();
	uint64_t hung = 0;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Peer *p = &fo->peers[i];
		int32_t pid = 0;
		if (i == wk.id)
			continue;
		if (!slot_serving(i, &pid)) {
			peer_close(p);
			continue;
		}
		fo->ans[i].involved = true;
		fo->ans[i].pid = pid;
		if (atomic_load(&wk.shm->slots[i].hung)) {
			hung |= UINT64_C(1) << i; /* left out below, without waiting FANOUT_TIMEOUT_SEC for it */
			continue;
		}
		if (p->bev && p->pid != pid)
			peer_close(p); /* the slot has a new process */
		if (!p->bev && !peer_connect(p, pid)) {
			char why[160];
			snprintf(why, sizeof(why), "could not reach it: %s", strerror(errno));
			peer_failed(p, why);
			continue;
		}
	}
	fo->live_at_begin = 0;
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (fo->ans[i].involved)
			fo->live_at_begin |= UINT64_C(1) << i;
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		if (hung >> i & 1)
			leave_out(fo, i, "worker %d (pid %d) is left out: it is hung (worker_watchdog_timeout)", i,
			          (int)fo->ans[i].pid);
	struct timeval tv = {FANOUT_TIMEOUT_SEC, 0};
	evtimer_add(fo->timer, &tv);
}

void admin_fanout_dispatch(PgSocket *c)
{
	AdminFanout *fo = c->fanout;
	if (!fo || !fo->active || fo->dispatched)
		return;
	fo->dispatched = true;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Peer *p = &fo->peers[i];
		Answer *a = &fo->ans[i];
		/* the others log in first: they get it at their first ReadyForQuery */
		if (i != wk.id && a->involved && !a->missing && !a->done && p->ready && !p->query_sent)
			peer_send_query(fo, p);
	}
}

bool admin_fanout_capture(PgSocket *c, const uint8_t *buf, size_t len)
{
	AdminFanout *fo = c->fanout;
	if (!fo || !fo->active || fo->ans[wk.id].done)
		return false;
	Answer *own = &fo->ans[wk.id];
	for (size_t off = 0; off + 5 <= len;) {
		uint32_t mlen = (uint32_t)buf[off + 1] << 24 | (uint32_t)buf[off + 2] << 16 |
		                (uint32_t)buf[off + 3] << 8 | buf[off + 4];
		bool end = answer_message(own, buf[off], buf + off + 5, mlen - 4);
		off += 1 + mlen;
		if (end) {
			answer_ended(fo, wk.id);
			break;
		}
	}
	return true;
}

bool admin_console_busy(const PgSocket *c)
{
	return c->fanout && c->fanout->active;
}

const char *admin_fanout_command(const PgSocket *c, bool *done_here)
{
	const AdminFanout *fo = c->fanout;
	if (!fo || !fo->active)
		return NULL;
	*done_here = fo->ans[wk.id].done && fo->ans[wk.id].tag;
	return fo->query;
}

/* Pass a CancelRequest for the console on to worker i, with the key of the console's connection there. */
static void send_cancel(AdminFanout *fo, int i)
{
	Peer *p = &fo->peers[i];
	if (!p->bev || !p->has_key)
		return;
	struct sockaddr_un sa;
	peer_address(i, &sa);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	uint8_t pkt[16] = {0, 0, 0, 16};
	uint32_t code = PROTO_CANCEL_CODE;
	for (int k = 0; k < 4; k++)
		pkt[4 + k] = (uint8_t)(code >> (24 - 8 * k));
	memcpy(pkt + 8, p->key, 8);
	/* a unix socket connects at once (or fails): 16 bytes never block */
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || write(fd, pkt, sizeof(pkt)) != sizeof(pkt))
		log_warning("could not pass a console cancel to worker %d: %s", i, strerror(errno));
	close(fd);
}

void admin_fanout_cancel(PgSocket *c)
{
	AdminFanout *fo = c->fanout;
	if (!fo || !fo->active)
		return;
	fo->cancelled = true;
	for (int i = 0; i < SHM_MAX_WORKERS; i++) {
		Answer *a = &fo->ans[i];
		if (i == wk.id || !a->involved || a->missing || !fo->peers[i].bev)
			continue;
		if (a->done) {
			/* its part succeeded already: nothing to cancel there, undo it */
			if (a->tag)
				undo_peer(fo, i);
		} else if (!fo->peers[i].query_sent) {
			a->involved = false; /* still logging in: it never gets the command */
		} else if (fo->waits) {
			send_cancel(fo, i); /* (a command that does not wait has nothing to abandon there) */
		}
	}
	if (all_done(fo))
		schedule_finish(fo);
}

void admin_fanout_client_gone(PgSocket *c)
{
	AdminFanout *fo = c->fanout;
	c->fanout = NULL;
	if (!fo)
		return;
	uint64_t mask = fo->active ? left_out(fo, true) : 0;
	end_command(fo);
	for (int i = 0; i < SHM_MAX_WORKERS; i++)
		peer_close(&fo->peers[i]);
	hooks.console.left_out(mask); /* after the close: what the peers still read is stale */
	event_free(fo->timer);
	event_free(fo->finish);
	free(fo);
}
