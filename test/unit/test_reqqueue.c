/*
 * Unit tests for reqqueue.c and prepare.c: the release decision of
 * transaction and statement mode on message sequences (simple queries,
 * pipelines, errors in the middle, COPY), and the prepared-statement
 * registry, client maps and the servers' LRU sets, with what a change of
 * a statement's result type does to them (txn_row_desc_hash() from
 * txn_msg.c).
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/config.h"
#include "common/pktbuf.h"
#include "worker/prepare.h"
#include "worker/reqqueue.h"
#include "worker/txn_msg.h"

/* Push the requests of a client message sequence ("PBDES" = Parse, Bind, Describe, Execute, Sync). */
static void client_sends(ReqQueue *q, const char *msgs)
{
	for (const char *m = msgs; *m; m++) {
		switch (*m) {
		case 'Q':
			reqqueue_push(q, REQ_QUERY, ANS_CLIENT);
			break;
		case 'S':
			q->skipping = false;
			if (!q->copy_in)
				reqqueue_push(q, REQ_SYNC, ANS_CLIENT);
			break;
		case 'P':
			reqqueue_push(q, REQ_PARSE, ANS_CLIENT);
			break;
		case 'B':
			reqqueue_push(q, REQ_BIND, ANS_CLIENT);
			break;
		case 'D':
			reqqueue_push(q, REQ_DESCRIBE, ANS_CLIENT);
			break;
		case 'E':
			reqqueue_push(q, REQ_EXECUTE, ANS_CLIENT);
			break;
		case 'C':
			reqqueue_push(q, REQ_CLOSE, ANS_CLIENT);
			break;
		case 'c': /* CopyDone: before the server began the COPY, marked where it was sent (txn.c) */
			if (q->copy_in)
				q->copy_in = false;
			else if (q->count)
				reqqueue_tail(q)->copy_end = true;
			break;
		default:
			fail_msg("unknown client message %c", *m);
		}
	}
}

/*
 * Feed server messages; after each ReadyForQuery (written "Z<status>")
 * record the release decision: 'k' keep, 'r' return, 'v' violation.
 */
static void server_sends(ReqQueue *q, int mode, const char *msgs, char *decisions)
{
	size_t n = 0;
	for (const char *m = msgs; *m; m++) {
		Request r;
		ReqPop pop = reqqueue_server_msg(q, *m, &r, NULL, NULL);
		assert_int_not_equal(pop, POP_UNKNOWN);
		if (pop == POP_ANSWER) {
			free(r.error);
			free(r.stmt_name);
		}
		if (*m == 'Z') {
			char st = *++m;
			ReleaseDecision d = reqqueue_release_decision(mode, st, q);
			decisions[n++] = d == RELEASE_KEEP ? 'k' : d == RELEASE_RETURN ? 'r' : 'v';
		}
	}
	decisions[n] = '\0';
}

static void check(int mode, const char *client, const char *server, const char *want)
{
	ReqQueue q = {0};
	char got[64];
	client_sends(&q, client);
	server_sends(&q, mode, server, got);
	assert_string_equal(got, want);
	reqqueue_free(&q);
}

static void test_simple_query(void **state)
{
	check(POOL_TRANSACTION, "Q", "TDCZI", "r");
	check(POOL_TRANSACTION, "Q", "CZT", "k"); /* BEGIN */
	check(POOL_TRANSACTION, "Q", "EZE", "k"); /* failed transaction */
	check(POOL_SESSION, "Q", "TDCZI", "k");
	check(POOL_STATEMENT, "Q", "TDCZI", "r");
	check(POOL_STATEMENT, "Q", "CZT", "v");
	/* a block opened in the middle of a pipeline is refused at once */
	check(POOL_STATEMENT, "QQQ", "CZT", "v");
	check(POOL_STATEMENT, "PBESPBES", "12CZT", "v");
	/* two statements in one Query: only the last ReadyForQuery counts */
	check(POOL_TRANSACTION, "QQ", "CZICZI", "kr");
}

static void test_pipeline_keeps_server_until_last_sync(void **state)
{
	check(POOL_TRANSACTION, "PBDESPBDES", "12nCZI12TDCZI", "kr");
	/* a pipeline without Sync yet: nothing releases */
	check(POOL_TRANSACTION, "PBDE", "12nC", "");
}

static void test_error_skips_to_sync(void **state)
{
	ReqQueue q = {0};
	char got[16];
	/* the first Bind fails: its Describe/Execute get no answer; the Sync's ReadyForQuery releases */
	client_sends(&q, "PBDES");
	server_sends(&q, POOL_TRANSACTION, "1EZI", got);
	assert_string_equal(got, "r");
	/* an error before the client's Sync arrived: skipping until it comes */
	client_sends(&q, "PBDE");
	server_sends(&q, POOL_TRANSACTION, "E", got);
	assert_true(q.skipping);
	assert_int_equal(q.count, 0);
	client_sends(&q, "S");
	assert_false(q.skipping);
	server_sends(&q, POOL_TRANSACTION, "ZI", got);
	assert_string_equal(got, "r");
	/* several Syncs with an error in the middle */
	client_sends(&q, "PBESPBESPBES");
	server_sends(&q, POOL_TRANSACTION, "12CZI1EZI12CZI", got);
	assert_string_equal(got, "kkr");
	reqqueue_free(&q);
}

static void test_copy_in(void **state)
{
	ReqQueue q = {0};
	char got[16];
	/* simple COPY: kept while the client sends data, released at the end */
	client_sends(&q, "Q");
	server_sends(&q, POOL_TRANSACTION, "G", got);
	assert_true(q.copy_in);
	client_sends(&q, "c");
	server_sends(&q, POOL_TRANSACTION, "CZI", got);
	assert_string_equal(got, "r");
	/* a failed COPY ends at the server's error: the client's late data is not waited for */
	client_sends(&q, "Q");
	server_sends(&q, POOL_TRANSACTION, "GEZI", got);
	assert_false(q.copy_in);
	assert_string_equal(got, "r");
	/* extended COPY: the Sync sent right behind Execute is ignored by the server */
	client_sends(&q, "PBES");
	server_sends(&q, POOL_TRANSACTION, "12G", got);
	assert_int_equal(q.count, 1); /* the Execute */
	client_sends(&q, "cS");
	server_sends(&q, POOL_TRANSACTION, "CZI", got);
	assert_string_equal(got, "r");
	reqqueue_free(&q);
}

static void test_copy_in_sent_ahead(void **state)
{
	ReqQueue q = {0};
	char got[16];
	/* the data and CopyDone right behind the Query (asyncpg): no copy_in left behind */
	client_sends(&q, "Qc");
	server_sends(&q, POOL_TRANSACTION, "GCZI", got);
	assert_false(q.copy_in);
	assert_string_equal(got, "r");
	/* and a query behind it */
	client_sends(&q, "QcQ");
	server_sends(&q, POOL_TRANSACTION, "GCZITDCZI", got);
	assert_string_equal(got, "kr");
	/* extended, all at once: the Sync before CopyDone is ignored, the one after it answers */
	client_sends(&q, "PBEScS");
	server_sends(&q, POOL_TRANSACTION, "12G", got);
	assert_false(q.copy_in);
	assert_int_equal(q.count, 2); /* the Execute and the last Sync */
	server_sends(&q, POOL_TRANSACTION, "CZI", got);
	assert_string_equal(got, "r");
	/* the COPY fails: the server ignores the CopyDone, the mark goes with the Query */
	client_sends(&q, "Qc");
	server_sends(&q, POOL_TRANSACTION, "EZI", got);
	assert_string_equal(got, "r");
	assert_int_equal(q.count, 0);
	/* ... and the next COPY waits for its own CopyDone */
	client_sends(&q, "Q");
	server_sends(&q, POOL_TRANSACTION, "G", got);
	assert_true(q.copy_in);
	reqqueue_free(&q);
}

static void dropped_parse(Request *r, void *arg)
{
	if (r->kind == REQ_PARSE)
		(*(int *)arg)++;
}

static void test_dropped_requests_reported(void **state)
{
	ReqQueue q = {0};
	int parses = 0;
	Request r;
	client_sends(&q, "BPPES");
	assert_int_equal(reqqueue_server_msg(&q, 'E', &r, dropped_parse, &parses), POP_ANSWER);
	assert_int_equal(r.kind, REQ_BIND);
	assert_int_equal(parses, 2);
	assert_int_equal(q.count, 1);
	reqqueue_free(&q);
}

static void record_order(Request *r, void *arg)
{
	char *order = arg;
	size_t n = strlen(order);
	order[n] = r->kind == REQ_CLOSE ? 'C' : r->kind == REQ_PARSE ? 'P' : r->kind == REQ_BIND ? 'B' : '?';
	order[n + 1] = '\0';
}

static void test_skipped_requests_undone_last_first(void **state)
{
	/* an eviction Close of X, then a Parse of X, both skipped: undo the Parse before the Close */
	ReqQueue q = {0};
	char order[16] = "";
	Request r;
	client_sends(&q, "BCPBS");
	assert_int_equal(reqqueue_server_msg(&q, 'E', &r, record_order, order), POP_ANSWER);
	assert_int_equal(r.kind, REQ_BIND);
	assert_string_equal(order, "BPC");
	assert_int_equal(q.count, 1);
	reqqueue_free(&q);
}

static void test_unknown_answer(void **state)
{
	ReqQueue q = {0};
	Request r;
	assert_int_equal(reqqueue_server_msg(&q, '2', &r, NULL, NULL), POP_UNKNOWN);
	client_sends(&q, "P");
	assert_int_equal(reqqueue_server_msg(&q, '2', &r, NULL, NULL), POP_UNKNOWN);
	/* data rows, notices and parameter changes answer nothing */
	assert_int_equal(reqqueue_server_msg(&q, 'D', &r, NULL, NULL), POP_NONE);
	assert_int_equal(reqqueue_server_msg(&q, 'N', &r, NULL, NULL), POP_NONE);
	reqqueue_free(&q);
}

static void test_queue_grows(void **state)
{
	ReqQueue q = {0};
	for (int i = 0; i < 1000; i++)
		client_sends(&q, "BE");
	client_sends(&q, "S");
	Request r;
	for (int i = 0; i < 1000; i++) {
		assert_int_equal(reqqueue_server_msg(&q, '2', &r, NULL, NULL), POP_ANSWER);
		assert_int_equal(reqqueue_server_msg(&q, 'C', &r, NULL, NULL), POP_ANSWER);
	}
	assert_int_equal(reqqueue_server_msg(&q, 'Z', &r, NULL, NULL), POP_ANSWER);
	assert_int_equal(q.count, 0);
	reqqueue_free(&q);
}

/* ---- prepare.c ---- */

static PreparedStmt *stmt(const char *query)
{
	return prepare_stmt_get((const uint8_t *)query, strlen(query) + 1);
}

static void test_registry_shares_identical_queries(void **state)
{
	PreparedStmt *a = stmt("SELECT 1"), *b = stmt("SELECT 1"), *c = stmt("SELECT 2");
	assert_ptr_equal(a, b);
	assert_ptr_not_equal(a, c);
	assert_int_equal(strncmp(prepare_stmt_name(a), "PGBOUNCER_", 10), 0);
	assert_string_not_equal(prepare_stmt_name(a), prepare_stmt_name(c));
	prepare_stmt_unref(a);
	prepare_stmt_unref(b);
	prepare_stmt_unref(c);
	assert_int_equal(prepare_registry_count(), 0);
}

/* The last statement found is remembered; a statement removed or detached is never found through it. */
static void test_client_map_last(void **state)
{
	(void)state;
	ClientStmtMap map = {0};
	PreparedStmt *ps = stmt("SELECT 1");
	ClientStmt *a = prepare_client_add(&map, "a", ps);
	ClientStmt *b = prepare_client_add(&map, "b", ps);
	prepare_stmt_unref(ps);
	assert_ptr_equal(prepare_client_find(&map, "a"), a);
	assert_ptr_equal(prepare_client_find(&map, "a"), a);
	assert_ptr_equal(prepare_client_find(&map, "b"), b);
	prepare_client_detach(&map, b); /* Close: the name is gone until its answer */
	assert_null(prepare_client_find(&map, "b"));
	prepare_client_reattach(&map, b);
	assert_ptr_equal(prepare_client_find(&map, "b"), b);
	assert_true(prepare_client_remove_gen(&map, prepare_client_gen(b)));
	assert_null(prepare_client_find(&map, "b"));
	assert_ptr_equal(prepare_client_find(&map, "a"), a);
	prepare_client_clear(&map);
	assert_null(prepare_client_find(&map, "a"));
	assert_null(map.head);
	assert_int_equal(prepare_registry_count(), 0);
}

static void test_client_map(void **state)
{
	ClientStmtMap map = {0};
	PreparedStmt *ps = stmt("SELECT $1");
	ClientStmt *cs = prepare_client_add(&map, "S_1", ps);
	prepare_stmt_unref(ps); /* the map holds it */
	assert_ptr_equal(prepare_client_find(&map, "S_1"), cs);
	assert_null(prepare_client_find(&map, "S_2"));
	assert_int_equal(prepare_client_count(&map), 1);
	assert_true(prepare_client_remove_gen(&map, prepare_client_gen(cs)));
	assert_false(prepare_client_remove_gen(&map, 12345));
	assert_null(map.head);
	assert_null(map.last);
	assert_int_equal(prepare_registry_count(), 0);
}

static void test_server_lru(void **state)
{
	ServerStmt *set = NULL;
	PreparedStmt *s[4];
	for (int i = 0; i < 4; i++) {
		char q[32];
		snprintf(q, sizeof(q), "SELECT %d", i);
		s[i] = stmt(q);
	}
	prepare_server_add(&set, s[0]);
	prepare_server_add(&set, s[1]);
	prepare_server_add(&set, s[2]);
	/* using s[0] makes s[1] the least recently used */
	assert_true(prepare_server_has(&set, s[0], true));
	prepare_server_add(&set, s[3]);
	PreparedStmt *out = prepare_server_evict(&set, 3, s[3]);
	assert_ptr_equal(out, s[1]);
	prepare_stmt_unref(out);
	assert_null(prepare_server_evict(&set, 3, s[3]));
	assert_false(prepare_server_has(&set, s[1], false));
	/* the one just added is never the victim, even with a limit of 1 */
	out = prepare_server_evict(&set, 1, s[3]);
	assert_ptr_equal(out, s[2]);
	prepare_stmt_unref(out);
	out = prepare_server_evict(&set, 1, s[3]);
	assert_ptr_equal(out, s[0]);
	prepare_stmt_unref(out);
	assert_int_equal(prepare_server_count(&set), 1);
	prepare_server_remove_id(&set, prepare_stmt_id(s[3]));
	assert_int_equal(prepare_server_count(&set), 0);
	for (int i = 0; i < 4; i++)
		prepare_stmt_unref(s[i]);
	assert_int_equal(prepare_registry_count(), 0);
}

/*
 * Stand-ins (a skipped eviction of a statement nobody holds): under the
 * name given, else the id's; a failed Parse of that id takes its
 * stand-in out too.
 */
static void test_stand_in(void **state)
{
	ServerStmt *set = NULL;
	prepare_server_add_stand_in(&set, 7, NULL);
	prepare_server_add_stand_in(&set, 8, PREPARE_NAME_PREFIX "3");
	assert_int_equal(prepare_server_count(&set), 2);
	PreparedStmt *first = prepare_server_evict(&set, 1, NULL);
	assert_string_equal(prepare_stmt_name(first), PREPARE_NAME_PREFIX "7");
	assert_true(prepare_stmt_retired(first));
	prepare_stmt_unref(first);
	prepare_server_remove_id(&set, 9); /* neither */
	assert_int_equal(prepare_server_count(&set), 1);
	prepare_server_remove_id(&set, 3);
	assert_int_equal(prepare_server_count(&set), 0);
	assert_int_equal(prepare_registry_count(), 0);
}

/* A statement whose text now has another result type: retired, a stand-in keeps its name on the server. */
static void test_retired_statement(void **state)
{
	ClientStmtMap map = {0};
	ServerStmt *set = NULL;
	PreparedStmt *ps = stmt("SELECT * FROM t");
	char name[PREPARE_NAME_LEN];
	snprintf(name, sizeof(name), "%s", prepare_stmt_name(ps));
	ClientStmt *old = prepare_client_add(&map, "old", ps);
	ClientStmt *mine = prepare_client_add(&map, "mine", ps);
	prepare_server_add(&set, ps);
	prepare_stmt_set_desc(ps, 42);
	prepare_stmt_unref(ps); /* the map and the set hold it */
	assert_ptr_equal(prepare_server_find_id(&set, prepare_stmt_id(ps)), ps);

	prepare_stmt_retire(ps);
	assert_true(prepare_stmt_retired(ps));
	assert_int_equal(prepare_registry_count(), 0);
	PreparedStmt *fresh = stmt("SELECT * FROM t"); /* the same text: a new entry, a new name */
	assert_ptr_not_equal(fresh, ps);
	assert_string_not_equal(prepare_stmt_name(fresh), name);
	assert_int_equal(prepare_stmt_desc(fresh), 0);
	prepare_client_set_stmt(mine, fresh);
	prepare_stmt_unref(fresh);
	assert_ptr_equal(prepare_client_stmt(mine), fresh);
	assert_ptr_equal(prepare_client_stmt(old), ps);

	prepare_server_orphan(&set, ps);
	assert_int_equal(prepare_server_count(&set), 1); /* still on the server, under its name */
	assert_false(prepare_server_has(&set, ps, false));
	assert_null(prepare_server_find_id(&set, prepare_stmt_id(ps)));
	PreparedStmt *stub = prepare_server_evict(&set, 0, NULL);
	assert_non_null(stub);
	assert_string_equal(prepare_stmt_name(stub), name);
	assert_true(prepare_stmt_retired(stub));
	prepare_stmt_unref(stub);
	assert_int_equal(prepare_server_count(&set), 0);

	prepare_client_clear(&map); /* frees the retired entry with its last holder */
	assert_int_equal(prepare_registry_count(), 0);
}

/* Append one RowDescription field. */
static void put_field(PktBuf *pb, const char *name, uint32_t table, uint16_t col, uint32_t type, uint32_t typmod,
                      uint16_t format)
{
	pktbuf_put_string(pb, name);
	pktbuf_put_u32(pb, table);
	pktbuf_put_u16(pb, col);
	pktbuf_put_u32(pb, type);
	pktbuf_put_u16(pb, 4);
	pktbuf_put_u32(pb, typmod);
	pktbuf_put_u16(pb, format);
}

/* The hash of a RowDescription of columns a and b, b of type btype. */
static uint64_t two_columns(uint32_t table, uint32_t btype, uint32_t btypmod, uint16_t format, const char *bname)
{
	PktBuf pb;
	pktbuf_init(&pb, 64);
	pktbuf_start_msg(&pb, 'T');
	pktbuf_put_u16(&pb, 2);
	put_field(&pb, "a", table, 1, 23, 0xffffffff, format);
	put_field(&pb, bname, table, 2, btype, btypmod, format);
	pktbuf_finish_msg(&pb);
	uint64_t h = txn_row_desc_hash(pb.buf, (uint32_t)pb.len);
	pktbuf_free(&pb);
	return h;
}

static void test_row_desc_hash(void **state)
{
	uint64_t base = two_columns(16384, 23, 0xffffffff, 0, "b");
	assert_int_not_equal(base, 0);
	/* the table and the format do not count: a table made again, a Bind's result formats */
	assert_int_equal(two_columns(16999, 23, 0xffffffff, 1, "b"), base);
	/* a column's type, modifier or name does */
	assert_int_not_equal(two_columns(16384, 25, 0xffffffff, 0, "b"), base);
	assert_int_not_equal(two_columns(16384, 23, 8, 0, "b"), base);
	assert_int_not_equal(two_columns(16384, 23, 0xffffffff, 0, "c"), base);
	/* NoData, a RowDescription of no column, and a cut or foreign message */
	static const uint8_t nodata[] = {'n', 0, 0, 0, 4};
	static const uint8_t empty[] = {'T', 0, 0, 0, 6, 0, 0};
	static const uint8_t cut[] = {'T', 0, 0, 0, 8, 0, 1, 'a', 0};
	static const uint8_t other[] = {'Z', 0, 0, 0, 5, 'I'};
	assert_int_not_equal(txn_row_desc_hash(nodata, sizeof(nodata)), 0);
	assert_int_not_equal(txn_row_desc_hash(empty, sizeof(empty)), 0);
	assert_int_not_equal(txn_row_desc_hash(nodata, sizeof(nodata)), txn_row_desc_hash(empty, sizeof(empty)));
	assert_int_equal(txn_row_desc_hash(cut, sizeof(cut)), 0);
	assert_int_equal(txn_row_desc_hash(other, sizeof(other)), 0);
}

static void test_has_answer(void **state)
{
	ReqQueue q = {0};
	reqqueue_push(&q, REQ_PARSE, ANS_SWALLOW);
	reqqueue_push(&q, REQ_DESCRIBE, ANS_CHECK);
	assert_true(reqqueue_has_answer(&q, ANS_CHECK));
	assert_false(reqqueue_has_answer(&q, ANS_LEARN));
	reqqueue_pop(&q, NULL);
	reqqueue_pop(&q, NULL);
	assert_false(reqqueue_has_answer(&q, ANS_CHECK));
	reqqueue_free(&q);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_simple_query),
	    cmocka_unit_test(test_pipeline_keeps_server_until_last_sync),
	    cmocka_unit_test(test_error_skips_to_sync),
	    cmocka_unit_test(test_copy_in),
	    cmocka_unit_test(test_copy_in_sent_ahead),
	    cmocka_unit_test(test_dropped_requests_reported),
	    cmocka_unit_test(test_skipped_requests_undone_last_first),
	    cmocka_unit_test(test_unknown_answer),
	    cmocka_unit_test(test_queue_grows),
	    cmocka_unit_test(test_registry_shares_identical_queries),
	    cmocka_unit_test(test_client_map),
	    cmocka_unit_test(test_client_map_last),
	    cmocka_unit_test(test_server_lru),
	    cmocka_unit_test(test_stand_in),
	    cmocka_unit_test(test_retired_statement),
	    cmocka_unit_test(test_row_desc_hash),
	    cmocka_unit_test(test_has_answer),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
