/*
 * The calls that go up a room, as pointers the loop sets at start
 * (include/worker/hooks.h has the list and its order; doc/architecture.md
 * "Rooms of the worker").
 */
#include "autoconfig.h"

#include "common/log.h"
#include "worker/hooks.h"

Hooks hooks;

List auth_query_queue = {&auth_query_queue, &auth_query_queue};

void hooks_check(void)
{
	for (int k = 0; k < CLIENT_GONE_STEPS; k++)
		if ((k == CLIENT_GONE_CLOSED) != !hooks.client_gone[k])
			fatal("hooks.h: client_gone step %d is %s", k,
			      hooks.client_gone[k] ? "taken by objects.c" : "unset");
	for (int k = 0; k < SERVER_GONE_STEPS; k++)
		if ((k == SERVER_GONE_CLOSED) != !hooks.server_gone[k])
			fatal("hooks.h: server_gone step %d is %s", k,
			      hooks.server_gone[k] ? "taken by objects.c" : "unset");
	const struct {
		const char *name;
		bool set;
	} one[] = {
	    {"pool_gone", hooks.pool_gone},
	    {"db_added", hooks.db_added},
	    {"lookups_waiting", hooks.lookups_waiting},
	    {"lookups_wake", hooks.lookups_wake},
	    {"lookups_fail", hooks.lookups_fail},
	    {"lookup_packet", hooks.lookup_packet},
	    {"console_cancel", hooks.console_cancel},
	    {"console.write_stats", hooks.console.write_stats},
	    {"console.abandon_part", hooks.console.abandon_part},
	    {"console.kill_here", hooks.console.kill_here},
	    {"console.disable_later", hooks.console.disable_later},
	    {"console.log_command_error", hooks.console.log_command_error},
	    {"console.report_state", hooks.console.report_state},
	    {"console.left_out", hooks.console.left_out},
	    {"accept", hooks.accept},
	    {"count_movable", hooks.count_movable},
	};
	for (size_t k = 0; k < sizeof(one) / sizeof(one[0]); k++)
		if (!one[k].set)
			fatal("hooks.h: %s is unset (connect_rooms() in worker_main.c)", one[k].name);
}
