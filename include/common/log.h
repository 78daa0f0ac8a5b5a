/*
 * Logging to stderr, a log file and syslog in PgBouncer's line format:
 * "YYYY-MM-DD HH:MM:SS.mmm TZ [PID] LEVEL message".
 * Verbosity is checked before anything is formatted.
 */
#ifndef PGB_COMMON_LOG_H
#define PGB_COMMON_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdnoreturn.h>

typedef enum LogLevel {
	LG_FATAL,   /* syslog crit; the process exits after logging */
	LG_ERROR,   /* syslog err */
	LG_WARNING, /* syslog warning */
	LG_LOG,     /* syslog info; also the stats line */
	LG_DEBUG,   /* verbose >= 1 */
	LG_NOISE,   /* verbose >= 2 */
} LogLevel;

typedef struct LogSettings {
	const char *logfile; /* NULL or "" = none */
	bool to_stderr;      /* false with -q or -d */
	bool syslog;
	const char *syslog_ident;
	const char *syslog_facility;
	int verbose;
} LogSettings;

/* Current verbosity; read it via log_enabled(). */
extern int log_verbose;

static inline bool log_enabled(LogLevel level)
{
	return level <= LG_LOG || (int)level - (int)LG_LOG <= log_verbose;
}

/*
 * Apply settings; (re)opens the log file lazily at the next message and
 * reopens syslog when ident or facility changed. Call on start and reload.
 */
void log_configure(const LogSettings *s);

/*
 * Open the log file now (at start-up) so that an unusable path is a fatal
 * start-up error instead of a silent loss. Returns false with errno set.
 */
bool log_open_file_now(void) __attribute__((warn_unused_result));

/* Whether messages currently go to stderr (workers re-apply it on reload). */
bool log_to_stderr_setting(void);

/* Stop logging to stderr (-d, once detached); the log file stays open. */
void log_stop_stderr(void);

/* A tag such as "master" or "worker 3" put before every message; NULL = none. */
void log_set_tag(const char *tag);

/* Log one message. Use the macros below, which skip formatting when filtered. */
void log_generic(LogLevel level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_fatal_noexit(...) log_generic(LG_FATAL, __VA_ARGS__)
#define log_error(...)        log_generic(LG_ERROR, __VA_ARGS__)
#define log_warning(...)      log_generic(LG_WARNING, __VA_ARGS__)
#define log_info(...)         log_generic(LG_LOG, __VA_ARGS__)
#define log_debug(...)                                                                                                 \
	do {                                                                                                           \
		if (log_enabled(LG_DEBUG))                                                                             \
			log_generic(LG_DEBUG, __VA_ARGS__);                                                            \
	} while (0)
#define log_noise(...)                                                                                                 \
	do {                                                                                                           \
		if (log_enabled(LG_NOISE))                                                                             \
			log_generic(LG_NOISE, __VA_ARGS__);                                                            \
	} while (0)

/* Log at FATAL and exit(1). Only at start-up or for a broken invariant. */
noreturn void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * pgb_assert(cond): an internal invariant. With ./configure --enable-cassert
 * (scripts/test builds so) a false one logs where and aborts (a core dump to
 * look at); without it the condition is not evaluated.
 */
#ifdef PGB_CASSERT
noreturn void pgb_assert_failed(const char *cond, const char *file, int line);
#define pgb_assert(cond) ((cond) ? (void)0 : pgb_assert_failed(#cond, __FILE__, __LINE__))
#else
/* not evaluated, but what it names counts as used (no unused-function warnings) */
#define pgb_assert(cond) ((void)sizeof(!(cond)))
#endif

/* Called by fatal() before exit (removes pidfile, socket file); may be NULL. */
void log_set_fatal_hook(void (*hook)(void));

/* Turn embedded newlines into newline+TAB and strip trailing whitespace (in place-ish, into out). */
void log_escape_message(const char *in, char *out, size_t outlen);

#endif
