/*
 * The session-mode count of what a client sent that its server still owes
 * a ReadyForQuery for, and what it sent last (include/worker/session_tail.h).
 * Pure: no socket, no clock, no configuration.
 */
#include "autoconfig.h"

#include "worker/session_tail.h"

/* An Execute, or another message, behind what the tail says: one Execute alone is the only guess kept. */
static unsigned after_exec(const SessionTail *t, unsigned kind)
{
	return t->tail == SESSION_TAIL_EXEC || t->tail == SESSION_TAIL_BROKEN ? SESSION_TAIL_BROKEN : kind;
}

void session_tail_client_msg(SessionTail *t, char type, uint32_t len)
{
	switch (type) {
	case 'Q':
	case 'F':
		t->owed++;
		t->open = false;
		t->tail = type == 'Q' ? SESSION_TAIL_QUERY : SESSION_TAIL_OTHER;
		t->tail_syncs = 0;
		break;
	case 'S':
		t->owed++;
		t->open = false;
		if (t->tail == SESSION_TAIL_EXEC)
			t->tail = SESSION_TAIL_EXEC_SYNCS;
		if (t->tail != SESSION_TAIL_EXEC_SYNCS && t->tail != SESSION_TAIL_QUERY) {
			t->tail = SESSION_TAIL_OTHER;
			t->tail_syncs = 0;
		} else if (t->tail_syncs == SESSION_TAIL_SYNCS_MAX) {
			t->tail = SESSION_TAIL_BROKEN; /* more than it counts: no guess */
			t->tail_syncs = 0;
		} else {
			t->tail_syncs++;
		}
		break;
	case 'E':
		t->open = true;
		/* a second Execute since the last Sync: no guess until the next one */
		t->tail = after_exec(t, SESSION_TAIL_EXEC);
		t->tail_syncs = 0;
		break;
	case 'H':
		/*
		 * One with a body is answered by an error, and the server
		 * skips all up to the next Sync: the link holds until then.
		 */
		if (len != 5) {
			t->open = true;
			t->tail = SESSION_TAIL_BROKEN;
		}
		break;
	case 'd':
		break; /* COPY data of a request already counted */
	case 'c':
	case 'f':
		t->tail = SESSION_TAIL_BROKEN; /* the Syncs behind it are answered */
		break;
	default:
		t->open = true;
		t->tail = after_exec(t, SESSION_TAIL_OTHER);
		break;
	}
}

void session_tail_copy_begun(SessionTail *t)
{
	uint32_t tail = t->tail_syncs;
	if ((t->tail == SESSION_TAIL_EXEC_SYNCS && t->owed == tail) ||
	    (t->tail == SESSION_TAIL_QUERY && t->owed == tail + 1))
		t->owed -= tail;
	t->tail = SESSION_TAIL_BROKEN;
	t->tail_syncs = 0;
}
