/*
 * The console's pooler-wide state, as the master keeps it for the workers
 * it starts later (doc/workers.md, "Console state"): whether the pooler is
 * paused or suspended, and which databases are paused (PAUSE db, KILL db)
 * or disabled (DISABLE db). A worker reports it after a console command
 * changes it; a worker the master forks starts with it.
 *
 * One flat byte string, the same in the report and in the master:
 * a pause byte ('N' running, 'P' paused, 'S' suspended), then one entry per
 * database flag, a kind byte ('p' paused, 'd' disabled) and the name, NUL
 * ended.
 */
#ifndef PGB_COMMON_CONSOLE_STATE_H
#define PGB_COMMON_CONSOLE_STATE_H

#include <stdbool.h>
#include <stddef.h>

#define CS_RUNNING   'N'
#define CS_PAUSED    'P'
#define CS_SUSPENDED 'S'

#define CS_DB_PAUSED   'p'
#define CS_DB_DISABLED 'd'

/* The longest state a worker reports or the master reads. */
#define CS_MAX_LEN (1u << 20)

typedef struct ConsoleState {
	char *buf; /* malloc'd; NULL = never set (read as running, no flags) */
	size_t len;
	size_t cap;
} ConsoleState;

/* Start a state with pause byte `pause`, without database flags. */
void console_state_begin(ConsoleState *cs, char pause);
/* Add a flag of database `name`. */
void console_state_add(ConsoleState *cs, char kind, const char *name);
void console_state_free(ConsoleState *cs);

/* CS_RUNNING, CS_PAUSED or CS_SUSPENDED. */
char console_state_pause(const ConsoleState *cs);
/* Change the pause byte, keeping the database flags. */
void console_state_set_pause(ConsoleState *cs, char pause);
/* Remove the flag `kind` of database `name` (if it has it). */
void console_state_remove(ConsoleState *cs, char kind, const char *name);
/* Whether database `name` has the flag `kind`. */
bool console_state_has(const ConsoleState *cs, char kind, const char *name);
/*
 * The next database flag after *pos (start at 0): its kind and name, or
 * false at the end.
 */
bool console_state_next(const ConsoleState *cs, size_t *pos, char *kind, const char **name);

/*
 * Take `len` bytes from a report; false (and *cs untouched) if they are
 * not a well-formed state.
 */
bool console_state_decode(ConsoleState *cs, const char *data, size_t len);

#endif
