/*
 * The console state the master hands to the workers it starts
 * (include/common/console_state.h, doc/workers.md "Console state").
 */
#include "autoconfig.h"

#include <stdlib.h>
#include <string.h>

#include "common/console_state.h"
#include "common/util.h"

static void reserve(ConsoleState *cs, size_t more)
{
	if (cs->len + more <= cs->cap)
		return;
	size_t cap = cs->cap ? cs->cap : 64;
	while (cap < cs->len + more)
		cap *= 2;
	cs->buf = xrealloc(cs->buf, cap);
	cs->cap = cap;
}

void console_state_begin(ConsoleState *cs, char pause)
{
	reserve(cs, 1);
	cs->buf[0] = pause;
	cs->len = 1;
}

void console_state_add(ConsoleState *cs, char kind, const char *name)
{
	if (!cs->buf)
		console_state_begin(cs, CS_RUNNING);
	size_t n = strlen(name) + 1;
	reserve(cs, 1 + n);
	cs->buf[cs->len] = kind;
	memcpy(cs->buf + cs->len + 1, name, n);
	cs->len += 1 + n;
}

void console_state_free(ConsoleState *cs)
{
	free(cs->buf);
	*cs = (ConsoleState){0};
}

char console_state_pause(const ConsoleState *cs)
{
	return cs->len ? cs->buf[0] : CS_RUNNING;
}

void console_state_set_pause(ConsoleState *cs, char pause)
{
	if (!cs->buf)
		console_state_begin(cs, pause);
	else
		cs->buf[0] = pause;
}

bool console_state_next(const ConsoleState *cs, size_t *pos, char *kind, const char **name)
{
	size_t p = *pos ? *pos : 1;
	if (p >= cs->len)
		return false;
	*kind = cs->buf[p];
	*name = cs->buf + p + 1;
	*pos = p + 1 + strlen(*name) + 1;
	return true;
}

void console_state_remove(ConsoleState *cs, char kind, const char *name)
{
	size_t pos = 0, at = 1;
	char k;
	const char *n;
	while (console_state_next(cs, &pos, &k, &n)) {
		if (k == kind && strcmp(n, name) == 0) {
			memmove(cs->buf + at, cs->buf + pos, cs->len - pos);
			cs->len -= pos - at;
			return;
		}
		at = pos;
	}
}

bool console_state_has(const ConsoleState *cs, char kind, const char *name)
{
	size_t pos = 0;
	char k;
	const char *n;
	while (console_state_next(cs, &pos, &k, &n))
		if (k == kind && strcmp(n, name) == 0)
			return true;
	return false;
}

bool console_state_decode(ConsoleState *cs, const char *data, size_t len)
{
	if (len < 1 || len > CS_MAX_LEN)
		return false;
	if (data[0] != CS_RUNNING && data[0] != CS_PAUSED && data[0] != CS_SUSPENDED)
		return false;
	for (size_t p = 1; p < len;) {
		if (data[p] != CS_DB_PAUSED && data[p] != CS_DB_DISABLED)
			return false;
		const char *end = memchr(data + p + 1, '\0', len - p - 1);
		if (!end || end == data + p + 1)
			return false; /* no terminator, or an empty name */
		p = (size_t)(end - data) + 1;
	}
	reserve(cs, len);
	memcpy(cs->buf, data, len);
	cs->len = len;
	return true;
}
