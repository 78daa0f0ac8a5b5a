/*
 * Unit tests for the hba and ident files: every column form, quoting and
 * comments, lines that are skipped with a warning, first-match order,
 * address matching (CIDR, mask column, IPv6), @file includes and ident maps.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/hba.h"
#ifdef HAVE_LDAP
#include "common/ldap_options.h"
#endif

/* ---- helpers ---- */

/* The warnings a parse reported. */
typedef struct Warnings {
	char msgs[64][600];
	int n;
} Warnings;

static void collect(void *arg, const char *msg)
{
	Warnings *w = arg;
	assert_true(w->n < 64);
	snprintf(w->msgs[w->n++], sizeof(w->msgs[0]), "%s", msg);
}

/* Parse text (no @files) and check that exactly the given lines were skipped (0-terminated). */
static void parse_expect(HbaRules *rules, const char *text, const int *bad_lines)
{
	Warnings w = {.n = 0};
	int n_bad = 0;
	hba_parse(rules, text, ".", collect, &w);
	for (; bad_lines && bad_lines[n_bad]; n_bad++) {
		char prefix[64];
		snprintf(prefix, sizeof(prefix), "could not parse hba config line %d: ", bad_lines[n_bad]);
		assert_true(n_bad < w.n);
		if (strncmp(w.msgs[n_bad], prefix, strlen(prefix)) != 0)
			fail_msg("warning %d is \"%s\", expected the prefix \"%s\"", n_bad, w.msgs[n_bad], prefix);
	}
	if (w.n != n_bad)
		fail_msg("%d warnings, expected %d (first: %s)", w.n, n_bad, w.n ? w.msgs[0] : "-");
}

static struct sockaddr_storage addr_of(const char *ip)
{
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof(ss));
	struct sockaddr_in *in = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
	if (inet_pton(AF_INET, ip, &in->sin_addr) == 1) {
		in->sin_family = AF_INET;
	} else {
		assert_int_equal(inet_pton(AF_INET6, ip, &in6->sin6_addr), 1);
		in6->sin6_family = AF_INET6;
	}
	return ss;
}

/* Line number of the rule a TCP client without TLS matches, or 0. */
static int tcp_line(const HbaRules *rules, const char *ip, const char *db, const char *user)
{
	struct sockaddr_storage ss = addr_of(ip);
	const HbaRule *r = hba_match(rules, false, false, db, user, false, (struct sockaddr *)&ss);
	return r ? r->line : 0;
}

static int unix_line(const HbaRules *rules, const char *db, const char *user)
{
	const HbaRule *r = hba_match(rules, true, false, db, user, false, NULL);
	return r ? r->line : 0;
}

static char tmpdir[64];

static void write_file(const char *name, const char *text)
{
	unit_write_file(tmpdir, name, text, NULL, 0);
}

static void remove_file(const char *name)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	unlink(path);
}

static int setup_dir(void **state)
{
	(void)state;
	unit_tmpdir("test_hba", tmpdir, sizeof(tmpdir));
	return 0;
}

static int teardown_dir(void **state)
{
	(void)state;
	unit_rmtree(tmpdir);
	return 0;
}

/* ---- columns ---- */

static void test_connection_types(void **state)
{
	HbaRules rules;
	struct sockaddr_storage ss = addr_of("10.0.0.1");
	const struct sockaddr *sa = (struct sockaddr *)&ss;
	(void)state;

	parse_expect(&rules,
	             "hostssl all all 0.0.0.0/0 cert\n"
	             "hostnossl all all 0.0.0.0/0 md5\n"
	             "local all all peer\n"
	             "host all all 0.0.0.0/0 trust\n",
	             NULL);
	assert_int_equal(rules.n_rules, 4);
	assert_int_equal(rules.rules[0].type, HBA_HOSTSSL);
	assert_int_equal(rules.rules[0].method, AUTH_CERT);
	assert_int_equal(rules.rules[1].type, HBA_HOSTNOSSL);
	assert_int_equal(rules.rules[2].type, HBA_LOCAL);
	assert_int_equal(rules.rules[3].type, HBA_HOST);

	assert_int_equal(hba_match(&rules, false, true, "db", "u", false, sa)->line, 1);
	assert_int_equal(hba_match(&rules, false, false, "db", "u", false, sa)->line, 2);
	assert_int_equal(hba_match(&rules, true, false, "db", "u", false, NULL)->line, 3);
	/* a unix client over "TLS" cannot happen, but local still only means the socket type */
	assert_int_equal(hba_match(&rules, true, true, "db", "u", false, NULL)->line, 3);
	hba_free(&rules);

	/* host matches TCP with and without TLS, never the Unix socket */
	parse_expect(&rules, "host all all all trust\n", NULL);
	assert_int_equal(hba_match(&rules, false, true, "db", "u", false, sa)->line, 1);
	assert_int_equal(hba_match(&rules, false, false, "db", "u", false, sa)->line, 1);
	assert_null(hba_match(&rules, true, false, "db", "u", false, NULL));
	hba_free(&rules);

	/* no rules: nothing matches */
	parse_expect(&rules, "", NULL);
	assert_int_equal(rules.n_rules, 0);
	assert_null(hba_match(&rules, true, false, "db", "u", false, NULL));
	assert_null(hba_match(NULL, true, false, "db", "u", false, NULL));
	hba_free(&rules);
}

static void test_methods_and_options(void **state)
{
	HbaRules rules;
	(void)state;
	parse_expect(&rules,
	             "local all all trust\n"
	             "local all all reject\n"
	             "local all all md5\n"
	             "local all all password\n"
	             "local all all peer map=omicron\n"
	             "local all all cert map=\"with space\"\n"
	             "local all all scram-sha-256\n"
	             "local all all peer map=first map=second\n",
	             NULL);
	assert_int_equal(rules.n_rules, 8);
	const int methods[] = {AUTH_TRUST, AUTH_REJECT, AUTH_MD5,           AUTH_PLAIN,
	                       AUTH_PEER,  AUTH_CERT,   AUTH_SCRAM_SHA_256, AUTH_PEER};
	for (int i = 0; i < 8; i++) {
		assert_int_equal(rules.rules[i].method, methods[i]);
		assert_int_equal(rules.rules[i].line, i + 1);
	}
	assert_null(rules.rules[0].map);
	assert_string_equal(rules.rules[4].map, "omicron");
	assert_string_equal(rules.rules[5].map, "with space");
	assert_null(rules.rules[6].ldap);
	assert_string_equal(rules.rules[7].map, "second");
	assert_true(hba_uses_cert(&rules));
	hba_free(&rules);

	parse_expect(&rules, "local all all peer\nhost all all all md5\n", NULL);
	assert_false(hba_uses_cert(&rules));
	hba_free(&rules);
	assert_false(hba_uses_cert(NULL));
}

/* pam is a method in a build with PAM, an unsupported word (the line is skipped) without */
static void test_pam_method(void **state)
{
	HbaRules rules;
	(void)state;
#ifdef HAVE_PAM
	parse_expect(&rules, "host all all all pam\n", NULL);
	assert_int_equal(rules.n_rules, 1);
	assert_int_equal(rules.rules[0].method, AUTH_PAM);
#else
	int bad[] = {1, 0};
	parse_expect(&rules, "host all all all pam\n", bad);
	assert_int_equal(rules.n_rules, 0);
#endif
	hba_free(&rules);
}

/*
 * ldap takes the rest of the line as its LDAP options (doc/ldap.md): comma
 * lists and quotes as in any column; a bad option skips the line with a
 * warning that names it. Without LDAP the method is an unsupported word.
 */
static void test_ldap_method(void **state)
{
	HbaRules rules;
	(void)state;
#ifdef HAVE_LDAP
	parse_expect(&rules,
	             "local all all ldap ldapserver=ldap.example.net ldapprefix=\"cn=\" ldapsuffix=\", dc=example\"\n"
	             "host all all all ldap ldapserver=\"a b\",ldapbasedn=dc=x ldapsearchattribute=mail ldaptls=1\n"
	             "host all all all ldap ldapserver=a ldapprefix=cn= ldapfoo=1\n"
	             "host all all all ldap ldapserver=a ldapprefix=cn= ldapbasedn=dc=x\n"
	             "host all all all ldap ldapserver=a\n"
	             "host all all all ldap ldapserver=a ldapprefix=cn= map=x\n"
	             "host all all all ldap ldapserver=a ldapport=x ldapprefix=cn=\n"
	             "host all all all ldap ldapurl=\"ldaps://h:1636/dc=example,dc=net?uid?sub\"\n",
	             (int[]){3, 4, 5, 6, 7, 0});
	assert_int_equal(rules.n_rules, 3);
	const LdapOptions *o = rules.rules[0].ldap;
	assert_int_equal(rules.rules[0].method, AUTH_LDAP);
	assert_int_equal(o->n_servers, 1);
	assert_string_equal(o->servers[0], "ldap.example.net");
	assert_string_equal(o->prefix, "cn=");
	assert_string_equal(o->suffix, ", dc=example");
	assert_false(ldap_options_search(o));
	o = rules.rules[1].ldap;
	assert_int_equal(o->n_servers, 2);
	assert_string_equal(o->servers[1], "b");
	assert_string_equal(o->basedn, "dc=x");
	assert_string_equal(o->search_attr, "mail");
	assert_true(o->starttls);
	o = rules.rules[2].ldap;
	assert_true(o->ldaps);
	assert_int_equal(o->port, 1636);
	assert_string_equal(o->basedn, "dc=example,dc=net");
	assert_int_equal(rules.rules[2].line, 8);
	hba_free(&rules);

	/* the warning names the word */
	Warnings w = {.n = 0};
	hba_parse(&rules, "host all all all ldap ldapserver=a ldapprefix=cn= ldapfoo=1\n", ".", collect, &w);
	assert_int_equal(w.n, 1);
	assert_string_equal(w.msgs[0], "could not parse hba config line 1: unrecognized LDAP option \"ldapfoo\"");
	hba_free(&rules);
#else
	parse_expect(&rules, "host all all all ldap ldapserver=a ldapprefix=cn=\n", (int[]){1, 0});
	assert_int_equal(rules.n_rules, 0);
	hba_free(&rules);
#endif
}

static void test_database_column(void **state)
{
	HbaRules rules;
	(void)state;
	parse_expect(&rules,
	             "local sameuser all trust\n"
	             "local app1,app2 all trust\n"
	             "local replication all trust\n"
	             "local \"all\" all trust\n"
	             "local \"sameuser\",\"replication\" all trust\n"
	             "local all all reject\n",
	             NULL);
	assert_int_equal(unix_line(&rules, "bob", "bob"), 1);
	assert_int_equal(unix_line(&rules, "app1", "bob"), 2);
	assert_int_equal(unix_line(&rules, "app2", "bob"), 2);
	/* case-sensitive names */
	assert_int_equal(unix_line(&rules, "App1", "bob"), 6);
	/* the keyword replication matches physical replication only, which matches nothing else */
	assert_int_equal(unix_line(&rules, "replication", "bob"), 5); /* by the quoted name on line 5 */
	assert_int_equal(hba_match(&rules, true, false, "app1", "bob", true, NULL)->line, 3);
	assert_int_equal(hba_match(&rules, true, false, "bob", "bob", true, NULL)->line, 3);
	/* quoted keywords are plain names */
	assert_int_equal(unix_line(&rules, "all", "bob"), 4);
	assert_int_equal(unix_line(&rules, "sameuser", "bob"), 5);
	assert_int_equal(unix_line(&rules, "replication", "x"), 5);
	assert_int_equal(unix_line(&rules, "other", "bob"), 6);
	hba_free(&rules);

	/* physical replication does not match `all`, nor anything when no line has the keyword */
	parse_expect(&rules, "local all all trust\n", NULL);
	assert_null(hba_match(&rules, true, false, "db", "bob", true, NULL));
	hba_free(&rules);
}

static void test_user_column(void **state)
{
	HbaRules rules;
	(void)state;
	parse_expect(&rules,
	             "local all alice trust\n"
	             "local all bob, carol md5\n"
	             "local all \"Dave\",\"e,f\" password\n"
	             "local all \"all\" scram-sha-256\n"
	             "local all all reject\n",
	             NULL);
	assert_int_equal(unix_line(&rules, "db", "alice"), 1);
	assert_int_equal(unix_line(&rules, "db", "bob"), 2);
	assert_int_equal(unix_line(&rules, "db", "carol"), 2);
	assert_int_equal(unix_line(&rules, "db", "Dave"), 3);
	assert_int_equal(unix_line(&rules, "db", "dave"), 5);
	assert_int_equal(unix_line(&rules, "db", "e,f"), 3);
	assert_int_equal(unix_line(&rules, "db", "e"), 5);
	assert_int_equal(unix_line(&rules, "db", "all"), 4);
	assert_int_equal(unix_line(&rules, "db", "zed"), 5);
	hba_free(&rules);
}

static void test_quoting_and_comments(void **state)
{
	HbaRules rules;
	(void)state;
	parse_expect(&rules,
	             "# a comment line\n"
	             "   # an indented one\n"
	             "\n"
	             "\t \r\n"
	             "local \"my db\" \"we\"\"ird\" trust # the rest is a comment\n"
	             "local \"#notacomment\" u md5#comment right after the method\n"
	             "local db\"x y\"z u password\n"
	             "local \"\" u reject\n"
	             "local all all scram-sha-256\r\n",
	             NULL);
	assert_int_equal(rules.n_rules, 5);
	assert_int_equal(rules.rules[0].line, 5);
	assert_string_equal(rules.rules[0].db.names[0], "my db");
	assert_string_equal(rules.rules[0].user.names[0], "we\"ird");
	assert_int_equal(unix_line(&rules, "my db", "we\"ird"), 5);
	assert_int_equal(unix_line(&rules, "#notacomment", "u"), 6);
	assert_int_equal(rules.rules[1].method, AUTH_MD5);
	/* a quoted part inside a word */
	assert_string_equal(rules.rules[2].db.names[0], "dbx yz");
	assert_int_equal(unix_line(&rules, "dbx yz", "u"), 7);
	/* an empty quoted name is a name that no client has */
	assert_int_equal(rules.rules[3].db.n_names, 1);
	assert_string_equal(rules.rules[3].db.names[0], "");
	assert_int_equal(rules.rules[4].method, AUTH_SCRAM_SHA_256);
	assert_int_equal(unix_line(&rules, "x", "u"), 9);
	hba_free(&rules);
}

static void test_bad_lines_are_skipped(void **state)
{
	HbaRules rules;
	(void)state;
	const char *text = "hostgssenc all all 0.0.0.0/0 trust\n"             /* 1 */
	                   "local samerole all trust\n"                       /* 2 */
	                   "local samegroup all trust\n"                      /* 3 */
	                   "local all +admins trust\n"                        /* 4 */
	                   "host all all samehost trust\n"                    /* 5 */
	                   "host all all samenet trust\n"                     /* 6 */
	                   "host all all db.example.com trust\n"              /* 7 */
	                   "host all all 10.0.0.0/33 trust\n"                 /* 8 */
	                   "host all all ::/129 trust\n"                      /* 9 */
	                   "host all all 10.0.0.0/x trust\n"                  /* 10 */
	                   "host all all 10.0.0.0/ trust\n"                   /* 11 */
	                   "host all all 10.0.0.0 trust\n"                    /* 12: trust is not a mask */
	                   "host all all 10.0.0.0 ffff:: trust\n"             /* 13: mask of another family */
	                   "local all all radius\n"                           /* 14 */
	                   "local all all ident\n"                            /* 15 */
	                   "local all all gss\n"                              /* 16 */
	                   "local all all any\n"                              /* 17 */
	                   "local all all trust clientcert=verify-full\n"     /* 18 */
	                   "local all all peer map=\n"                        /* 19 */
	                   "local all all\n"                                  /* 20 */
	                   "host all all 0.0.0.0/0\n"                         /* 21 */
	                   "local \"unterminated all trust\n"                 /* 22 */
	                   "local a, all trust\n"                             /* 23: list continues: no method */
	                   "local a,,b all trust\n"                           /* 24 */
	                   "local a, # comment\n"                             /* 25 */
	                   "local all all trust,md5\n"                        /* 26 */
	                   "host all all 10.0.0.1,10.0.0.2 255.0.0.0 trust\n" /* 27 */
	                   "local all all md5 map=a,b\n"                      /* 28 */
	                   "local all all @\n"                                /* 29 */
	                   "local @ all trust\n"                              /* 30: empty file name */
	                   "local @no-such-file all trust\n"                  /* 31 */
	                   "Local all all trust\n"                            /* 32 */
	                   "local all all Trust\n"                            /* 33 */
	                   "local all all trust\n";                           /* 34: the only good line */
	int bad[34];
	for (int i = 0; i < 33; i++)
		bad[i] = i + 1;
	bad[33] = 0;
	parse_expect(&rules, text, bad);
	assert_int_equal(rules.n_rules, 1);
	assert_int_equal(rules.rules[0].line, 34);
	assert_int_equal(unix_line(&rules, "db", "u"), 34);
	hba_free(&rules);

	/* a NULL callback is allowed */
	hba_parse(&rules, "bogus line\nlocal all all trust\n", ".", NULL, NULL);
	assert_int_equal(rules.n_rules, 1);
	hba_free(&rules);
}

static void test_warning_text(void **state)
{
	HbaRules rules;
	Warnings w = {.n = 0};
	(void)state;
	hba_parse(&rules, "local all all trust\n\nlocal all all radius\n", ".", collect, &w);
	assert_int_equal(w.n, 1);
	assert_string_equal(w.msgs[0],
	                    "could not parse hba config line 3: unsupported authentication method \"radius\"");
	hba_free(&rules);
}

static void test_first_match_wins(void **state)
{
	HbaRules rules;
	(void)state;
	parse_expect(&rules,
	             "host app alice 10.1.0.0/16 reject\n"
	             "host app all 10.0.0.0/8 md5\n"
	             "host all alice all scram-sha-256\n"
	             "host all all 10.0.0.0/8 trust\n"
	             "host all all 10.1.2.3/32 reject\n",
	             NULL);
	assert_int_equal(tcp_line(&rules, "10.1.2.3", "app", "alice"), 1);
	assert_int_equal(tcp_line(&rules, "10.2.2.3", "app", "alice"), 2);
	assert_int_equal(tcp_line(&rules, "10.1.2.3", "app", "bob"), 2);
	assert_int_equal(tcp_line(&rules, "192.168.0.1", "app", "alice"), 3);
	assert_int_equal(tcp_line(&rules, "10.1.2.3", "other", "bob"), 4); /* never line 5 */
	assert_int_equal(tcp_line(&rules, "192.168.0.1", "other", "bob"), 0);
	hba_free(&rules);
}

static void test_addresses_v4(void **state)
{
	HbaRules rules;
	(void)state;
	parse_expect(&rules,
	             "host all a 192.168.1.0/24 trust\n"
	             "host all b 192.168.1.77/24 trust\n" /* host bits are ignored */
	             "host all c 10.0.0.1/32 trust\n"
	             "host all d 0.0.0.0/0 trust\n"
	             "host all e 172.16.0.0 255.240.0.0 trust\n"
	             "host all f 127.0.0.1 255.255.255.255 md5\n",
	             NULL);
	assert_int_equal(tcp_line(&rules, "192.168.1.1", "db", "a"), 1);
	assert_int_equal(tcp_line(&rules, "192.168.1.255", "db", "a"), 1);
	assert_int_equal(tcp_line(&rules, "192.168.2.1", "db", "a"), 0);
	assert_int_equal(tcp_line(&rules, "192.168.1.9", "db", "b"), 2);
	assert_int_equal(tcp_line(&rules, "10.0.0.1", "db", "c"), 3);
	assert_int_equal(tcp_line(&rules, "10.0.0.2", "db", "c"), 0);
	assert_int_equal(tcp_line(&rules, "8.8.8.8", "db", "d"), 4);
	assert_int_equal(tcp_line(&rules, "172.31.255.1", "db", "e"), 5);
	assert_int_equal(tcp_line(&rules, "172.32.0.1", "db", "e"), 0);
	assert_int_equal(tcp_line(&rules, "127.0.0.1", "db", "f"), 6);
	assert_int_equal(tcp_line(&rules, "127.0.0.2", "db", "f"), 0);
	/* an IPv6 client never matches an IPv4 rule, except an IPv4-mapped one */
	assert_int_equal(tcp_line(&rules, "::1", "db", "d"), 0);
	assert_int_equal(tcp_line(&rules, "::ffff:192.168.1.4", "db", "a"), 1);
	assert_int_equal(tcp_line(&rules, "::ffff:192.168.2.4", "db", "a"), 0);
	/* the rule's address is only for TCP clients: a Unix client skips it */
	assert_int_equal(unix_line(&rules, "db", "d"), 0);
	hba_free(&rules);
}

static void test_addresses_v6(void **state)
{
	HbaRules rules;
	(void)state;
	parse_expect(&rules,
	             "host all a ::1/128 trust\n"
	             "host all b 2001:db8::/32 trust\n"
	             "host all c ::/0 trust\n"
	             "host all d fe80:: ffff:ffff:ffff:ffff:: trust\n"
	             "host all e 2001:db8::/33 trust\n",
	             NULL);
	assert_int_equal(rules.rules[0].family, AF_INET6);
	assert_int_equal(tcp_line(&rules, "::1", "db", "a"), 1);
	assert_int_equal(tcp_line(&rules, "::2", "db", "a"), 0);
	assert_int_equal(tcp_line(&rules, "2001:db8:ffff::1", "db", "b"), 2);
	assert_int_equal(tcp_line(&rules, "2001:db9::1", "db", "b"), 0);
	assert_int_equal(tcp_line(&rules, "1234::5", "db", "c"), 3);
	assert_int_equal(tcp_line(&rules, "127.0.0.1", "db", "c"), 0); /* IPv4 never matches IPv6 */
	assert_int_equal(tcp_line(&rules, "fe80::abcd", "db", "d"), 4);
	assert_int_equal(tcp_line(&rules, "fe80:0:0:1::abcd", "db", "d"), 0);
	assert_int_equal(tcp_line(&rules, "2001:db8:7fff::1", "db", "e"), 5);
	assert_int_equal(tcp_line(&rules, "2001:db8:8000::1", "db", "e"), 0);
	hba_free(&rules);
}

/* ---- @file ---- */

static void test_include_files(void **state)
{
	HbaRules rules;
	Warnings w = {.n = 0};
	char path[256], text[1024];
	(void)state;

	write_file("dbs.txt", "sales, \"hr dept\"\n# comment\nops dev # trailing\n\n");
	write_file("users.txt", "alice,bob\ncarol\n");
	write_file("hba.conf", "local @dbs.txt @users.txt md5\n"
	                       "local @dbs.txt,extra all trust\n"
	                       "local all @missing.txt trust\n"
	                       "local all all reject\n");
	snprintf(path, sizeof(path), "%s/hba.conf", tmpdir);
	assert_true(hba_load(&rules, path, collect, &w, NULL, 0));
	assert_int_equal(w.n, 1);
	assert_non_null(strstr(w.msgs[0], "could not parse hba config line 3: could not open file "));
	assert_non_null(strstr(w.msgs[0], "missing.txt"));
	assert_int_equal(rules.n_rules, 3);
	assert_int_equal(unix_line(&rules, "sales", "alice"), 1);
	assert_int_equal(unix_line(&rules, "hr dept", "carol"), 1);
	assert_int_equal(unix_line(&rules, "dev", "bob"), 1);
	assert_int_equal(unix_line(&rules, "ops", "dave"), 2);
	assert_int_equal(unix_line(&rules, "extra", "dave"), 2);
	assert_int_equal(unix_line(&rules, "hr", "alice"), 4);
	assert_int_equal(unix_line(&rules, "comment", "alice"), 4);
	hba_free(&rules);

	/* an absolute @path; hba_parse() with a directory for relative ones */
	snprintf(text, sizeof(text), "local @%s/users.txt all trust\nlocal @dbs.txt all md5\n", tmpdir);
	w.n = 0;
	hba_parse(&rules, text, tmpdir, collect, &w);
	assert_int_equal(w.n, 0);
	assert_int_equal(unix_line(&rules, "carol", "x"), 1);
	assert_int_equal(unix_line(&rules, "ops", "x"), 2);
	hba_free(&rules);

	/* a broken @file rejects the line */
	write_file("broken.txt", "ok \"unterminated\n");
	w.n = 0;
	hba_parse(&rules, "local @broken.txt all trust\n", tmpdir, collect, &w);
	assert_int_equal(w.n, 1);
	assert_int_equal(rules.n_rules, 0);
	hba_free(&rules);

	remove_file("broken.txt");
	remove_file("dbs.txt");
	remove_file("users.txt");
	remove_file("hba.conf");
}

static void test_load_missing(void **state)
{
	HbaRules rules;
	IdentMap im;
	char err[256];
	(void)state;
	assert_false(hba_load(&rules, "/nonexistent/dir/hba.conf", NULL, NULL, err, sizeof(err)));
	assert_string_equal(err, "could not open auth_hba_file /nonexistent/dir/hba.conf: No such file or directory");
	assert_int_equal(rules.n_rules, 0);
	hba_free(&rules);
	assert_false(ident_load(&im, "/nonexistent/ident", NULL, NULL, err, sizeof(err)));
	assert_string_equal(err, "could not open auth_ident_file /nonexistent/ident: No such file or directory");
	assert_int_equal(im.n_entries, 0);
	ident_free(&im);
}

/* ---- ident ---- */

static void test_ident_maps(void **state)
{
	IdentMap im;
	Warnings w = {.n = 0};
	(void)state;
	ident_parse(&im,
	            "# map system db\n"
	            "ops root postgres\n"
	            "ops   alice alice   # comment\n"
	            "ops alice bob\n"
	            "any admin all\n"
	            "quoted \"John Smith\" \"all\"\n"
	            "\n"
	            "broken only-two\n"
	            "broken a b c\n"
	            "regex /^(.*)$ \\1\n"
	            "grp x +admins\n"
	            "list a,b c\n"
	            "include other.conf\n"
	            "open \"unterminated x\n",
	            collect, &w);
	assert_int_equal(w.n, 7);
	const int bad[] = {8, 9, 10, 11, 12, 13, 14};
	for (int i = 0; i < 7; i++) {
		char prefix[64];
		snprintf(prefix, sizeof(prefix), "could not parse ident config line %d: ", bad[i]);
		assert_int_equal(strncmp(w.msgs[i], prefix, strlen(prefix)), 0);
	}
	assert_int_equal(im.n_entries, 5);

	assert_true(ident_map_allows(&im, "ops", "root", "postgres"));
	assert_false(ident_map_allows(&im, "ops", "root", "alice"));
	assert_true(ident_map_allows(&im, "ops", "alice", "alice"));
	assert_true(ident_map_allows(&im, "ops", "alice", "bob"));
	assert_false(ident_map_allows(&im, "ops", "Alice", "bob")); /* case-sensitive */
	assert_false(ident_map_allows(&im, "other", "root", "postgres"));
	assert_true(ident_map_allows(&im, "any", "admin", "whoever"));
	assert_false(ident_map_allows(&im, "any", "root", "whoever"));
	/* a quoted "all" is a user name */
	assert_true(ident_map_allows(&im, "quoted", "John Smith", "all"));
	assert_false(ident_map_allows(&im, "quoted", "John Smith", "john"));
	assert_false(ident_map_allows(&im, "broken", "a", "b"));
	assert_false(ident_map_allows(&im, NULL, "root", "postgres"));
	assert_false(ident_map_allows(NULL, "ops", "root", "postgres"));
	ident_free(&im);
}

static void test_ident_load(void **state)
{
	IdentMap im;
	char path[256];
	(void)state;
	write_file("ident.conf", "m u1 db1\nm u2 all\n");
	snprintf(path, sizeof(path), "%s/ident.conf", tmpdir);
	assert_true(ident_load(&im, path, NULL, NULL, NULL, 0));
	assert_int_equal(im.n_entries, 2);
	assert_true(ident_map_allows(&im, "m", "u1", "db1"));
	assert_true(ident_map_allows(&im, "m", "u2", "x"));
	ident_free(&im);
	remove_file("ident.conf");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_connection_types),     cmocka_unit_test(test_methods_and_options),
	    cmocka_unit_test(test_database_column),      cmocka_unit_test(test_user_column),
	    cmocka_unit_test(test_quoting_and_comments), cmocka_unit_test(test_bad_lines_are_skipped),
	    cmocka_unit_test(test_warning_text),         cmocka_unit_test(test_pam_method),
	    cmocka_unit_test(test_ldap_method),          cmocka_unit_test(test_first_match_wins),
	    cmocka_unit_test(test_addresses_v4),         cmocka_unit_test(test_addresses_v6),
	    cmocka_unit_test(test_include_files),        cmocka_unit_test(test_load_missing),
	    cmocka_unit_test(test_ident_maps),           cmocka_unit_test(test_ident_load),
	};
	return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
