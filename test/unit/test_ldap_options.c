/*
 * Unit tests of the LDAP options (doc/ldap.md): every option, ldapurl's
 * parts, the combination checks and the errors that name the word, and the
 * DN, filter and server URLs a check builds for one user.
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit.h"

#include <stdlib.h>
#include <string.h>

#include "common/ldap_options.h"

static void parse_ok(LdapOptions *o, const char *text)
{
	char err[512];
	if (!ldap_options_parse(o, text, err, sizeof(err)))
		fail_msg("\"%s\" refused: %s", text, err);
}

static void parse_fails(const char *text, const char *want)
{
	LdapOptions o;
	char err[512];
	if (ldap_options_parse(&o, text, err, sizeof(err)))
		fail_msg("\"%s\" accepted", text);
	assert_string_equal(err, want);
}

static void test_simple_bind(void **state)
{
	(void)state;
	LdapOptions o;
	char buf[256];
	parse_ok(&o, "ldapserver=ldap.example.net ldapprefix=\"uid=\" ldapsuffix=\",ou=people,dc=example,dc=net\"");
	assert_false(ldap_options_search(&o));
	assert_int_equal(o.n_servers, 1);
	assert_string_equal(o.servers[0], "ldap.example.net");
	assert_int_equal(ldap_options_port(&o), 389);
	assert_true(ldap_options_bind_dn(&o, "alice", buf, sizeof(buf)));
	assert_string_equal(buf, "uid=alice,ou=people,dc=example,dc=net");
	assert_false(ldap_options_bind_dn(&o, "alice", buf, 10));
	assert_true(ldap_options_server_url(&o, 0, buf, sizeof(buf)));
	assert_string_equal(buf, "ldap://ldap.example.net:389");
	ldap_options_free(&o);

	/* a prefix alone (or a suffix alone) is a simple bind */
	parse_ok(&o, "ldapserver=h ldapsuffix=@example.net");
	assert_true(ldap_options_bind_dn(&o, "bob", buf, sizeof(buf)));
	assert_string_equal(buf, "bob@example.net");
	ldap_options_free(&o);
}

static void test_servers_ports_schemes(void **state)
{
	(void)state;
	LdapOptions o;
	char buf[256];
	parse_ok(&o, "ldapserver=\"  first second\t::1 \" ldapport=1389 ldapprefix=cn=");
	assert_int_equal(o.n_servers, 3);
	assert_string_equal(o.servers[0], "first");
	assert_string_equal(o.servers[1], "second");
	assert_true(ldap_options_server_url(&o, 2, buf, sizeof(buf)));
	assert_string_equal(buf, "ldap://[::1]:1389");
	ldap_options_free(&o);

	parse_ok(&o, "ldapserver=h ldapscheme=ldaps ldapprefix=cn=");
	assert_true(o.ldaps);
	assert_int_equal(ldap_options_port(&o), 636);
	assert_true(ldap_options_server_url(&o, 0, buf, sizeof(buf)));
	assert_string_equal(buf, "ldaps://h:636");
	ldap_options_free(&o);

	parse_ok(&o, "ldapserver=h ldaptls=1 ldapprefix=cn=");
	assert_true(o.starttls);
	assert_false(o.ldaps);
	ldap_options_free(&o);
	/* the last of a repeated option counts */
	parse_ok(&o, "ldapserver=a ldapserver=b ldaptls=1 ldaptls=0 ldapprefix=cn=");
	assert_int_equal(o.n_servers, 1);
	assert_string_equal(o.servers[0], "b");
	assert_false(o.starttls);
	ldap_options_free(&o);
}

static void test_search_bind(void **state)
{
	(void)state;
	LdapOptions o, *c;
	char buf[256];
	parse_ok(&o, "ldapserver=h ldapbasedn=\"dc=example,dc=net\" ldapbinddn=\"cn=reader,dc=example,dc=net\" "
	             "ldapbindpasswd=\"read er\"");
	assert_true(ldap_options_search(&o));
	assert_int_equal(o.scope, LDAP_OPTS_SCOPE_SUB);
	assert_string_equal(o.bindpasswd, "read er");
	assert_true(ldap_options_filter(&o, "alice", buf, sizeof(buf)));
	assert_string_equal(buf, "(uid=alice)");
	/* characters that would change the filter are refused */
	assert_false(ldap_options_filter(&o, "a*", buf, sizeof(buf)));
	assert_false(ldap_options_filter(&o, "a)(uid=b", buf, sizeof(buf)));
	assert_false(ldap_options_filter(&o, "a\\2a", buf, sizeof(buf)));
	c = ldap_options_copy(&o);
	ldap_options_free(&o);
	assert_string_equal(c->binddn, "cn=reader,dc=example,dc=net");
	assert_string_equal(c->servers[0], "h");
	ldap_options_free(c);
	free(c);

	parse_ok(&o, "ldapserver=h ldapbasedn=dc=x ldapsearchattribute=mail");
	assert_true(ldap_options_filter(&o, "a@example.net", buf, sizeof(buf)));
	assert_string_equal(buf, "(mail=a@example.net)");
	ldap_options_free(&o);

	parse_ok(&o, "ldapserver=h ldapbasedn=dc=x ldapsearchfilter=\"(|(uid=$username)(mail=$username))\"");
	assert_true(ldap_options_filter(&o, "bob", buf, sizeof(buf)));
	assert_string_equal(buf, "(|(uid=bob)(mail=bob))");
	assert_false(ldap_options_filter(&o, "bob", buf, 12));
	ldap_options_free(&o);
}

static void test_url(void **state)
{
	(void)state;
	LdapOptions o;
	char buf[256];
	parse_ok(&o, "ldapurl=\"ldap://127.0.0.1:3890/dc=example,dc=net?uid?sub\"");
	assert_int_equal(o.n_servers, 1);
	assert_string_equal(o.servers[0], "127.0.0.1");
	assert_int_equal(o.port, 3890);
	assert_string_equal(o.basedn, "dc=example,dc=net");
	assert_string_equal(o.search_attr, "uid");
	assert_int_equal(o.scope, LDAP_OPTS_SCOPE_SUB);
	assert_null(o.search_filter);
	assert_false(o.ldaps);
	ldap_options_free(&o);

	/* no scope in the URL: base, as in PostgreSQL; a filter; ldaps */
	parse_ok(&o, "ldapurl=\"ldaps://h/ou=people,dc=x??\?(mail=$username)\" ldapbinddn=cn=r ldapbindpasswd=p");
	assert_true(o.ldaps);
	assert_int_equal(ldap_options_port(&o), 636);
	assert_int_equal(o.scope, LDAP_OPTS_SCOPE_BASE);
	assert_true(ldap_options_filter(&o, "a", buf, sizeof(buf)));
	assert_string_equal(buf, "(mail=a)");
	ldap_options_free(&o);

	parse_ok(&o, "ldapurl=ldap://h/dc=x??one ldaptls=1");
	assert_int_equal(o.scope, LDAP_OPTS_SCOPE_ONE);
	assert_true(o.starttls);
	ldap_options_free(&o);

	/* a URL without a host takes ldapserver's */
	parse_ok(&o, "ldapserver=s ldapurl=ldap:///dc=x");
	assert_string_equal(o.servers[0], "s");
	ldap_options_free(&o);
}

static void test_errors_name_the_word(void **state)
{
	(void)state;
	parse_fails("ldapserver=h ldapprefix=cn= ldapfoo=1", "unrecognized LDAP option \"ldapfoo\"");
	parse_fails("ldapserver=h ldapprefix=cn= map=x", "unrecognized LDAP option \"map\"");
	parse_fails("ldapserver=h ldapprefix", "LDAP option not in name=value format: \"ldapprefix\"");
	parse_fails("ldapserver=h =x", "LDAP option not in name=value format: \"=x\"");
	parse_fails("ldapserver=h ldapport=0 ldapprefix=cn=",
	            "invalid ldapport \"0\": must be a port number (1 to 65535)");
	parse_fails("ldapserver=h ldapport=65536 ldapprefix=cn=",
	            "invalid ldapport \"65536\": must be a port number (1 to 65535)");
	parse_fails("ldapserver=h ldapport=38x ldapprefix=cn=",
	            "invalid ldapport \"38x\": must be a port number (1 to 65535)");
	parse_fails("ldapserver=h ldapscheme=ldapi ldapprefix=cn=",
	            "invalid ldapscheme \"ldapi\": must be ldap or ldaps");
	parse_fails("ldapserver=h ldaptls=true ldapprefix=cn=", "invalid ldaptls \"true\": must be 1 or 0");
	parse_fails("ldapserver=\" \" ldapprefix=cn=", "ldapserver is empty");
	parse_fails("ldapurl=http://h/dc=x", "invalid ldapurl \"http://h/dc=x\" (libldap's URL error 3)");
	parse_fails("ldapurl=ldapi:///dc=x", "invalid ldapurl \"ldapi:///dc=x\": the scheme must be ldap or ldaps");
	parse_fails("ldapurl=ldap://h/dc=x????e",
	            "invalid ldapurl \"ldap://h/dc=x????e\": extensions are not supported");
	parse_fails("ldapurl=\"ldap://h/dc=x?uid,mail\"",
	            "invalid ldapurl \"ldap://h/dc=x?uid,mail\": one search attribute at most");
	/* unquoted, a comma ends the word as in an hba line */
	parse_fails("ldapurl=ldap://h/dc=x?uid,mail", "LDAP option not in name=value format: \"mail\"");
	/* the combinations */
	parse_fails("ldapserver=h ldapprefix=cn= ldapbinddn=cn=r",
	            "ldapbinddn cannot be used with ldapprefix or ldapsuffix: search+bind and simple bind do not mix");
	parse_fails("ldapurl=ldap://h/dc=x ldapsuffix=\",dc=x\"",
	            "ldapurl cannot be used with ldapprefix or ldapsuffix: search+bind and simple bind do not mix");
	parse_fails("ldapserver=h", "the LDAP options need ldapbasedn (or an ldapurl: search+bind) or ldapprefix or "
	                            "ldapsuffix (simple bind)");
	parse_fails("ldapserver=h ldapbinddn=cn=r", "the LDAP options need ldapbasedn (or an ldapurl: search+bind) or "
	                                            "ldapprefix or ldapsuffix (simple bind)");
	parse_fails("ldapserver=h ldapbasedn=dc=x ldapsearchattribute=uid ldapsearchfilter=(uid=$username)",
	            "ldapsearchattribute cannot be used with ldapsearchfilter");
	parse_fails("ldapprefix=cn=", "the LDAP options name no server: set ldapserver (or an ldapurl with a host)");
	parse_fails("ldapserver=h ldapscheme=ldaps ldaptls=1 ldapprefix=cn=",
	            "ldaptls=1 (StartTLS) cannot be used with ldaps");
	parse_fails("ldapserver=h ldapprefix=\"cn=", "unterminated quoted string");
	parse_fails("", "the LDAP options need ldapbasedn (or an ldapurl: search+bind) or ldapprefix or ldapsuffix "
	                "(simple bind)");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_simple_bind),          cmocka_unit_test(test_servers_ports_schemes),
	    cmocka_unit_test(test_search_bind),          cmocka_unit_test(test_url),
	    cmocka_unit_test(test_errors_name_the_word),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
