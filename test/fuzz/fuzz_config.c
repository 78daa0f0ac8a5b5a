/*
 * libFuzzer target: the ini loader (config_load) on a file holding the
 * input, then what a loaded Config is used for: a deep copy, the checks
 * across parameters, SHOW CONFIG formatting and the lookups.
 */
#include "autoconfig.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "fuzz.h"

static char dir[256];
static char path[300];

static void cleanup(void)
{
	unlink(path);
	rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof(dir), "%s/pgb-fuzz-config-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		abort();
	snprintf(path, sizeof(path), "%s/pgbouncer.ini", dir);
	atexit(cleanup);
	LogSettings quiet = {.to_stderr = false};
	log_configure(&quiet); /* warnings about parameters would drown libFuzzer's output */
	return 0;
}

static void use_config(const Config *cf)
{
	char buf[1024];
	Config copy;
	(void)config_validate(cf, buf, sizeof(buf));
	if (!config_copy(&copy, cf))
		abort();
	for (const CfParam *p = cf_params; p->name; p++) {
		(void)config_format_value(&copy, p, buf, sizeof(buf));
		(void)config_format_value(cf, p, buf, 8);
	}
	for (int i = 0; i < cf->n_dbs; i++)
		if (config_find_db(&copy, cf->dbs[i].name) == NULL)
			abort();
	for (int i = 0; i < cf->n_users; i++)
		if (config_find_user(&copy, cf->users[i].name) == NULL)
			abort();
	(void)config_find_peer(&copy, 1);
	(void)config_list_contains(cf->g.admin_users, "admin");
	(void)config_list_contains(cf->g.ignore_startup_parameters, "extra_float_digits");
	config_free(&copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		abort();
	if (write(fd, data, size) != (ssize_t)size)
		abort();
	close(fd);
	Config cf;
	char err[CF_ERRMSG_LEN];
	config_init(&cf);
	if (config_load(&cf, path, err, sizeof(err)))
		use_config(&cf);
	else if (strlen(err) >= sizeof(err))
		abort();
	config_free(&cf);
	return 0;
}
