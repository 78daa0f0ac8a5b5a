/*
 * Set-up shared by the cmocka programs: a private temporary directory, files
 * written into it, and its removal. Include after <cmocka.h>; link
 * test/unit/unit.c (Makefile.am adds it to every unit program).
 */
#ifndef PGB_TEST_UNIT_H
#define PGB_TEST_UNIT_H

#include <stddef.h>

/* Make a new directory /tmp/<prefix>.XXXXXX into dir (at least 64 bytes); fails the test if it cannot. */
void unit_tmpdir(const char *prefix, char *dir, size_t len);

/* Remove dir and everything in it; fails the test if it cannot. */
void unit_rmtree(const char *dir);

/* Write text to dir/name (creating or replacing it); the path goes to path (may be NULL). */
void unit_write_file(const char *dir, const char *name, const char *text, char *path, size_t pathlen);

#endif
