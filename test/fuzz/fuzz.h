/*
 * Helpers shared by the libFuzzer targets of test/fuzz: exact-size copies
 * (so that AddressSanitizer sees a read one byte past a field) and the
 * splitting of one input into several fields at NUL bytes.
 */
#ifndef PGB_TEST_FUZZ_H
#define PGB_TEST_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/scram.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The SCRAM secret of password "pencil" (RFC 7677's example salt, 4096 rounds) that the SCRAM targets log in against. */
static inline void fuzz_scram_secret(ScramSecret *secret)
{
	static const uint8_t salt[] = "W22ZaJ0SNY7soEsUEjb6gQ==";
	if (!scram_build_secret_salt("pencil", salt, sizeof(salt) - 1, 4096, secret))
		abort();
}

/* A copy of data in a buffer of exactly size bytes (at least one, so never NULL). */
static inline uint8_t *fuzz_copy(const uint8_t *data, size_t size)
{
	uint8_t *p = malloc(size ? size : 1);
	if (p && size)
		memcpy(p, data, size);
	return p;
}

/* A NUL-terminated copy of data (which may hold NULs of its own). */
static inline char *fuzz_strndup(const uint8_t *data, size_t size)
{
	char *p = malloc(size + 1);
	if (p) {
		if (size)
			memcpy(p, data, size);
		p[size] = '\0';
	}
	return p;
}

/*
 * Split data into at most n fields at its first n-1 NUL bytes; missing
 * fields are empty. Fields point into data; lens[] gets their lengths.
 */
static inline void fuzz_split(const uint8_t *data, size_t size, int n, const uint8_t **fields, size_t *lens)
{
	for (int i = 0; i < n; i++) {
		const uint8_t *nul = i + 1 < n && size ? memchr(data, 0, size) : NULL;
		size_t len = nul ? (size_t)(nul - data) : size;
		fields[i] = data;
		lens[i] = len;
		data += len;
		size -= len;
		if (nul) {
			data++;
			size--;
		}
	}
}

#endif
