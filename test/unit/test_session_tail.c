/*
 * Unit tests for the session-mode count of what a client sent that its
 * server still owes a ReadyForQuery for (worker/session_tail.c), on the
 * message sequences drivers send: simple queries, pipelines, Flush, COPY
 * FROM STDIN by Query and by PQexecParams, and the cases where no guess is
 * made and the link is kept.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "worker/session_tail.h"

/* The client sends these message types, in order, each an empty message ('H': a plain Flush). */
static void sent(SessionTail *t, const char *types)
{
	for (const char *p = types; *p; p++)
		session_tail_client_msg(t, *p, 5);
}

/* A fresh link. */
static SessionTail linked(void)
{
	SessionTail t;
	memset(&t, 0xff, sizeof(t));
	session_tail_reset(&t);
	return t;
}

static void test_reset(void **state)
{
	(void)state;
	SessionTail t = linked();
	assert_int_equal(t.owed, 0);
	assert_int_equal(t.tail_syncs, 0);
	assert_int_equal(t.tail, SESSION_TAIL_OTHER);
	assert_false(t.open);
	assert_int_equal(sizeof(SessionTail), 8); /* in every PgSocket */
}

static void test_simple_queries(void **state)
{
	(void)state;
	SessionTail t = linked();
	sent(&t, "Q");
	assert_int_equal(t.owed, 1);
	assert_true(session_tail_answered(&t));
	/* two pipelined Queries: the first ReadyForQuery answers only one */
	sent(&t, "QQ");
	assert_false(session_tail_answered(&t));
	assert_true(session_tail_answered(&t));
	/* a FunctionCall is owed one too */
	sent(&t, "F");
	assert_true(session_tail_answered(&t));
	assert_int_equal(t.owed, 0);
}

static void test_extended_pipeline(void **state)
{
	(void)state;
	SessionTail t = linked();
	/* Parse, Bind, Describe, Execute, Sync, twice */
	sent(&t, "PBDES");
	sent(&t, "PBDES");
	assert_int_equal(t.owed, 2);
	assert_false(session_tail_answered(&t));
	assert_true(session_tail_answered(&t));
	/* messages after the last Sync: a ReadyForQuery does not answer them */
	sent(&t, "PBDES");
	sent(&t, "PB");
	assert_true(t.open);
	assert_false(session_tail_answered(&t)); /* owed nothing more, but sent more */
	sent(&t, "ES");
	assert_true(session_tail_answered(&t));
}

static void test_flush(void **state)
{
	(void)state;
	SessionTail t = linked();
	/* a plain Flush opens nothing: what it follows is still open until the Sync */
	sent(&t, "PBEH");
	assert_true(t.open);
	assert_int_equal(t.tail, SESSION_TAIL_EXEC);
	sent(&t, "S");
	assert_true(session_tail_answered(&t));
	/* a Flush with a body gets an error, and the server skips to the next Sync: held until then */
	sent(&t, "Q");
	session_tail_client_msg(&t, 'H', 9);
	assert_true(t.open);
	assert_int_equal(t.tail, SESSION_TAIL_BROKEN);
	assert_false(session_tail_answered(&t));
	sent(&t, "S");
	assert_false(t.open);
	assert_true(session_tail_answered(&t));
}

static void test_copy_by_query(void **state)
{
	(void)state;
	SessionTail t = linked();
	/* COPY FROM STDIN by Query: the data and CopyDone are owed nothing */
	sent(&t, "Q");
	assert_int_equal(t.tail, SESSION_TAIL_QUERY);
	session_tail_copy_begun(&t);
	sent(&t, "ddc");
	assert_int_equal(t.owed, 1);
	assert_true(session_tail_answered(&t));
	/* with Syncs sent behind the Query: the server in COPY ignores them */
	sent(&t, "QSS");
	assert_int_equal(t.owed, 3);
	assert_int_equal(t.tail_syncs, 2);
	session_tail_copy_begun(&t);
	assert_int_equal(t.owed, 1);
	sent(&t, "dc");
	assert_true(session_tail_answered(&t));
}

static void test_copy_by_pqexecparams(void **state)
{
	(void)state;
	SessionTail t = linked();
	/* libpq's PQexecParams: Parse, Bind, Describe, Execute, Sync; the COPY begins, the Sync is ignored */
	sent(&t, "PBDES");
	assert_int_equal(t.tail, SESSION_TAIL_EXEC_SYNCS);
	assert_int_equal(t.tail_syncs, 1);
	session_tail_copy_begun(&t);
	assert_int_equal(t.owed, 0);
	assert_int_equal(t.tail, SESSION_TAIL_BROKEN);
	/* the data, CopyDone and the Sync libpq sends after it: one ReadyForQuery ends it all */
	sent(&t, "dddcS");
	assert_int_equal(t.owed, 1);
	assert_true(session_tail_answered(&t));
	/* CopyFail the same */
	sent(&t, "PBES");
	session_tail_copy_begun(&t);
	assert_int_equal(t.owed, 0);
	sent(&t, "fS");
	assert_true(session_tail_answered(&t));
}

/* Where the Syncs behind a COPY cannot be told apart, the count stays: the link is kept, never handed back early. */
static void test_copy_no_guess(void **state)
{
	(void)state;
	SessionTail t = linked();
	/* two Executes before the Sync */
	sent(&t, "PBEBES");
	assert_int_equal(t.tail, SESSION_TAIL_OTHER);
	session_tail_copy_begun(&t);
	assert_int_equal(t.owed, 1);
	/* a second request behind the COPY's: its Sync is answered after the COPY */
	t = linked();
	sent(&t, "ESES");
	assert_int_equal(t.owed, 2);
	session_tail_copy_begun(&t);
	assert_int_equal(t.owed, 2);
	sent(&t, "dc");
	assert_false(session_tail_answered(&t));
	assert_true(session_tail_answered(&t));
	/* another message behind the Execute */
	t = linked();
	sent(&t, "EBS");
	assert_int_equal(t.tail, SESSION_TAIL_OTHER);
	session_tail_copy_begun(&t);
	assert_int_equal(t.owed, 1);
	/* a CopyDone sent ahead of the COPY (asyncpg): the Syncs behind it are answered */
	t = linked();
	sent(&t, "QcS");
	assert_int_equal(t.tail, SESSION_TAIL_OTHER);
	session_tail_copy_begun(&t);
	assert_int_equal(t.owed, 2);
}

static void test_tail_kinds(void **state)
{
	(void)state;
	SessionTail t = linked();
	sent(&t, "E");
	assert_int_equal(t.tail, SESSION_TAIL_EXEC);
	sent(&t, "E");
	assert_int_equal(t.tail, SESSION_TAIL_BROKEN); /* a second Execute since the last Sync */
	sent(&t, "S");
	assert_int_equal(t.tail, SESSION_TAIL_OTHER);
	sent(&t, "ESSS");
	assert_int_equal(t.tail, SESSION_TAIL_EXEC_SYNCS);
	assert_int_equal(t.tail_syncs, 3);
	sent(&t, "Q");
	assert_int_equal(t.tail, SESSION_TAIL_QUERY);
	assert_int_equal(t.tail_syncs, 0);
	sent(&t, "F");
	assert_int_equal(t.tail, SESSION_TAIL_OTHER);
	/* COPY data changes nothing */
	SessionTail before = t;
	sent(&t, "d");
	assert_memory_equal(&t, &before, sizeof(t));
	/* more Syncs than the count holds: no guess */
	t = linked();
	sent(&t, "Q");
	t.tail_syncs = SESSION_TAIL_SYNCS_MAX;
	sent(&t, "S");
	assert_int_equal(t.tail, SESSION_TAIL_BROKEN);
	assert_int_equal(t.tail_syncs, 0);
	assert_int_equal(t.owed, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_reset),
	    cmocka_unit_test(test_simple_queries),
	    cmocka_unit_test(test_extended_pipeline),
	    cmocka_unit_test(test_flush),
	    cmocka_unit_test(test_copy_by_query),
	    cmocka_unit_test(test_copy_by_pqexecparams),
	    cmocka_unit_test(test_copy_no_guess),
	    cmocka_unit_test(test_tail_kinds),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
