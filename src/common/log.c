/*
 * Logging in PgBouncer's format to stderr, an append-only log file and
 * syslog. Each line is written with one write() so lines from several
 * processes sharing the file never interleave.
 */
#include "autoconfig.h"

#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define LOG_MSG_MAX 8192

int log_verbose;

static char *logfile_path;  /* configured log file, NULL = none */
static int logfile_fd = -1; /* opened lazily at the first message */
static bool to_stderr = true;
static bool use_syslog;
static bool syslog_open;
static char *syslog_ident_cur;
static int syslog_facility_cur = LOG_DAEMON;
static char log_tag[64];
static void (*fatal_hook)(void);

static const char *const level_names[] = {
    [LG_FATAL] = "FATAL", [LG_ERROR] = "ERROR", [LG_WARNING] = "WARNING",
    [LG_LOG] = "LOG",     [LG_DEBUG] = "DEBUG", [LG_NOISE] = "NOISE",
};

static const int level_syslog[] = {
    [LG_FATAL] = LOG_CRIT, [LG_ERROR] = LOG_ERR,   [LG_WARNING] = LOG_WARNING,
    [LG_LOG] = LOG_INFO,   [LG_DEBUG] = LOG_DEBUG, [LG_NOISE] = LOG_DEBUG,
};

static const struct {
	const char *name;
	int value;
} facilities[] = {
    {"auth", LOG_AUTH},     {"authpriv", LOG_AUTHPRIV}, {"daemon", LOG_DAEMON}, {"user", LOG_USER},
    {"local0", LOG_LOCAL0}, {"local1", LOG_LOCAL1},     {"local2", LOG_LOCAL2}, {"local3", LOG_LOCAL3},
    {"local4", LOG_LOCAL4}, {"local5", LOG_LOCAL5},     {"local6", LOG_LOCAL6}, {"local7", LOG_LOCAL7},
};

static int facility_from_name(const char *name)
{
	for (size_t i = 0; name && i < sizeof(facilities) / sizeof(facilities[0]); i++)
		if (strcmp(facilities[i].name, name) == 0)
			return facilities[i].value;
	return LOG_DAEMON; /* unknown -> daemon, as the spec says */
}

static void replace_str(char **dst, const char *src)
{
	free(*dst);
	*dst = (src && *src) ? strdup(src) : NULL;
}

static int open_log_path(const char *path)
{
	return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

void log_configure(const LogSettings *s)
{
	/*
	 * The file is opened again (rotation): the same path now, so that a
	 * process at its file descriptor limit keeps the one it has instead of
	 * finding none at its next message, which would stop it (a worker,
	 * with its clients); another path at the next message, whose failure
	 * stops the process as at start-up.
	 */
	if (logfile_fd >= 0) {
		bool same = logfile_path && s->logfile && strcmp(logfile_path, s->logfile) == 0;
		int fd = same ? open_log_path(logfile_path) : -1;
		if (fd >= 0 || !same || (errno != EMFILE && errno != ENFILE)) {
			close(logfile_fd);
			logfile_fd = fd;
		}
	}
	replace_str(&logfile_path, s->logfile);
	to_stderr = s->to_stderr;
	log_verbose = s->verbose;

	int facility = facility_from_name(s->syslog_facility);
	const char *ident = s->syslog_ident ? s->syslog_ident : "pgbouncer";
	bool changed = !syslog_ident_cur || strcmp(syslog_ident_cur, ident) != 0 || facility != syslog_facility_cur;
	if (syslog_open && (!s->syslog || changed)) {
		closelog();
		syslog_open = false;
	}
	use_syslog = s->syslog;
	if (changed) {
		replace_str(&syslog_ident_cur, ident);
		syslog_facility_cur = facility;
	}
}

bool log_to_stderr_setting(void)
{
	return to_stderr;
}

void log_stop_stderr(void)
{
	to_stderr = false;
}

void log_set_tag(const char *tag)
{
	if (tag)
		snprintf(log_tag, sizeof(log_tag), "%s", tag);
	else
		log_tag[0] = '\0';
}

void log_set_fatal_hook(void (*hook)(void))
{
	fatal_hook = hook;
}

static bool open_logfile(void)
{
	logfile_fd = open_log_path(logfile_path);
	return logfile_fd >= 0;
}

bool log_open_file_now(void)
{
	if (!logfile_path || logfile_fd >= 0)
		return true;
	return open_logfile();
}

void log_escape_message(const char *in, char *out, size_t outlen)
{
	size_t o = 0;
	if (outlen == 0)
		return;
	for (const char *p = in; *p && o + 2 < outlen; p++) {
		out[o++] = *p;
		if (*p == '\n')
			out[o++] = '\t';
	}
	/* strip trailing whitespace, including the TAB added after a final newline */
	while (o > 0 && (out[o - 1] == ' ' || out[o - 1] == '\t' || out[o - 1] == '\n' || out[o - 1] == '\r'))
		o--;
	out[o] = '\0';
}

/* False (errno set) when a write failed: the rest of the line is dropped. */
static bool write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return false;
		}
		buf += n;
		len -= (size_t)n;
	}
	return true;
}

/*
 * A log file that stops taking lines (a full disk, an I/O error) does not
 * stop the pooler: the first failure is said on standard error (and
 * syslog), once until a write succeeds again (doc/pgbouncer.5.md, logfile).
 */
static bool logfile_failing;

static void logfile_write(const char *line, size_t len)
{
	if (write_all(logfile_fd, line, len)) {
		logfile_failing = false;
		return;
	}
	if (logfile_failing)
		return;
	logfile_failing = true;
	char note[LOG_MSG_MAX];
	int n = snprintf(note, sizeof(note),
	                 "could not write to logfile '%s': %s; its lines are lost until a write succeeds\n",
	                 logfile_path, strerror(errno));
	if (n > 0)
		(void)write_all(STDERR_FILENO, note, (size_t)n < sizeof(note) ? (size_t)n : sizeof(note) - 1);
	if (use_syslog)
		syslog(LOG_WARNING, "could not write to logfile '%s': %m", logfile_path);
}

static void log_emit(LogLevel level, const char *fmt, va_list ap)
{
	char raw[LOG_MSG_MAX], msg[LOG_MSG_MAX], line[LOG_MSG_MAX + 128];
	int save_errno = errno;

	int off = 0;
	if (log_tag[0])
		off = snprintf(raw, sizeof(raw), "%s: ", log_tag);
	vsnprintf(raw + off, sizeof(raw) - off, fmt, ap);
	log_escape_message(raw, msg, sizeof(msg));

	struct timeval tv;
	struct tm tm;
	char tbuf[64], zbuf[16];
	gettimeofday(&tv, NULL);
	localtime_r(&tv.tv_sec, &tm);
	strftime(tbuf, sizeof(tbuf), "%Y-%m-%d %H:%M:%S", &tm);
	strftime(zbuf, sizeof(zbuf), "%Z", &tm);
	int len = snprintf(line, sizeof(line), "%s.%03d %s [%d] %s %s\n", tbuf, (int)(tv.tv_usec / 1000), zbuf,
	                   (int)getpid(), level_names[level], msg);
	if (len < 0)
		goto out;
	if ((size_t)len >= sizeof(line))
		len = sizeof(line) - 1;

	if (to_stderr)
		(void)write_all(STDERR_FILENO, line, (size_t)len);

	if (logfile_path) {
		if (logfile_fd < 0 && !open_logfile()) {
			/* spec: a log file that cannot be opened stops the process */
			fprintf(stderr, "cannot open logfile '%s': %s\n", logfile_path, strerror(errno));
			if (fatal_hook)
				fatal_hook();
			exit(1);
		}
		logfile_write(line, (size_t)len);
	}

	if (use_syslog && level <= LG_LOG) {
		if (!syslog_open) {
			openlog(syslog_ident_cur ? syslog_ident_cur : "pgbouncer", LOG_PID, syslog_facility_cur);
			syslog_open = true;
		}
		syslog(level_syslog[level], "%s", msg);
	}
out:
	errno = save_errno;
}

void log_generic(LogLevel level, const char *fmt, ...)
{
	if (!log_enabled(level))
		return;
	va_list ap;
	va_start(ap, fmt);
	log_emit(level, fmt, ap);
	va_end(ap);
}

void fatal(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	log_emit(LG_FATAL, fmt, ap);
	va_end(ap);
	if (fatal_hook)
		fatal_hook();
	exit(1);
}

#ifdef PGB_CASSERT
void pgb_assert_failed(const char *cond, const char *file, int line)
{
	log_generic(LG_FATAL, "assertion failed: %s (%s:%d)", cond, file, line);
	abort();
}
#endif
