/*
 * Unit tests for the console state the master keeps for the workers it
 * starts later (include/common/console_state.h): building it, reading it
 * back, and refusing malformed reports from a worker.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/console_state.h"

static void test_unset_reads_as_running(void **state)
{
	(void)state;
	ConsoleState cs = {0};
	assert_int_equal(console_state_pause(&cs), CS_RUNNING);
	assert_false(console_state_has(&cs, CS_DB_DISABLED, "db"));
	size_t pos = 0;
	char kind;
	const char *name;
	assert_false(console_state_next(&cs, &pos, &kind, &name));
}

static void test_flags_round_trip(void **state)
{
	(void)state;
	ConsoleState cs = {0};
	console_state_begin(&cs, CS_PAUSED);
	console_state_add(&cs, CS_DB_DISABLED, "app");
	console_state_add(&cs, CS_DB_PAUSED, "reports");
	console_state_add(&cs, CS_DB_DISABLED, "reports");
	assert_int_equal(console_state_pause(&cs), CS_PAUSED);
	assert_true(console_state_has(&cs, CS_DB_DISABLED, "app"));
	assert_false(console_state_has(&cs, CS_DB_PAUSED, "app"));
	assert_true(console_state_has(&cs, CS_DB_PAUSED, "reports"));
	assert_true(console_state_has(&cs, CS_DB_DISABLED, "reports"));
	assert_false(console_state_has(&cs, CS_DB_DISABLED, "ap"));

	ConsoleState copy = {0};
	assert_true(console_state_decode(&copy, cs.buf, cs.len));
	assert_int_equal(copy.len, cs.len);
	assert_memory_equal(copy.buf, cs.buf, cs.len);
	size_t pos = 0;
	char kind;
	const char *name;
	char seen[64] = "";
	while (console_state_next(&copy, &pos, &kind, &name)) {
		size_t n = strlen(seen);
		snprintf(seen + n, sizeof(seen) - n, "%c:%s ", kind, name);
	}
	assert_string_equal(seen, "d:app p:reports d:reports ");

	console_state_remove(&copy, CS_DB_PAUSED, "reports");
	console_state_remove(&copy, CS_DB_PAUSED, "app"); /* not there: nothing changes */
	assert_false(console_state_has(&copy, CS_DB_PAUSED, "reports"));
	assert_true(console_state_has(&copy, CS_DB_DISABLED, "reports"));
	assert_true(console_state_has(&copy, CS_DB_DISABLED, "app"));
	console_state_remove(&copy, CS_DB_DISABLED, "reports"); /* the last entry */
	console_state_remove(&copy, CS_DB_DISABLED, "app");     /* the first */
	assert_int_equal(copy.len, 1);
	console_state_add(&copy, CS_DB_DISABLED, "app");
	console_state_set_pause(&copy, CS_RUNNING);
	assert_int_equal(console_state_pause(&copy), CS_RUNNING);
	assert_true(console_state_has(&copy, CS_DB_DISABLED, "app")); /* the flags stay */
	console_state_free(&cs);
	console_state_free(&copy);
}

static void expect_refused(const char *data, size_t len)
{
	ConsoleState cs = {0};
	console_state_begin(&cs, CS_PAUSED);
	console_state_add(&cs, CS_DB_DISABLED, "kept");
	assert_false(console_state_decode(&cs, data, len));
	/* a refused report leaves the state as it was */
	assert_int_equal(console_state_pause(&cs), CS_PAUSED);
	assert_true(console_state_has(&cs, CS_DB_DISABLED, "kept"));
	console_state_free(&cs);
}

static void test_decode_refuses_malformed(void **state)
{
	(void)state;
	expect_refused("", 0);        /* empty */
	expect_refused("X", 1);       /* unknown pause byte */
	expect_refused("Nxdb", 5);    /* unknown flag kind */
	expect_refused("Npdb", 4);    /* name without its NUL */
	expect_refused("Np\0", 3);    /* empty name */
	expect_refused("Ndb\0p", 5);  /* flag kind cut off */
	expect_refused("Npdb\0d", 6); /* second entry without a name */
	ConsoleState ok = {0};
	assert_true(console_state_decode(&ok, "S", 1)); /* suspended, no flags */
	assert_int_equal(console_state_pause(&ok), CS_SUSPENDED);
	assert_true(console_state_decode(&ok, "Ndb\0", 4)); /* database "b" disabled */
	assert_int_equal(console_state_pause(&ok), CS_RUNNING);
	assert_true(console_state_has(&ok, CS_DB_DISABLED, "b"));
	console_state_free(&ok);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_unset_reads_as_running),
	    cmocka_unit_test(test_flags_round_trip),
	    cmocka_unit_test(test_decode_refuses_malformed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
