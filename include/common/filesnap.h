/*
 * The auth files as the master last read them (auth_file, auth_hba_file
 * with its @files, auth_ident_file): a worker it forks later loads these
 * bytes, not an edit made since without a RELOAD, so that every worker
 * answers a login as the others do (doc/architecture.md, "Configuration").
 */
#ifndef PGB_COMMON_FILESNAP_H
#define PGB_COMMON_FILESNAP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

/* Forget what was kept and keep every file filesnap_read() reads until filesnap_record_end() (the master). */
void filesnap_record(void);
void filesnap_record_end(void);
/* Serve the files kept from then on, the disk for any other (a worker, from fork to its first load). */
void filesnap_replay(void);
/* Forget what was kept: the disk from then on (a worker after its first load, and at RELOAD). */
void filesnap_clear(void);

/* A whole file, NUL-terminated (free() it), or NULL with errno set: the kept bytes when replaying. */
char *filesnap_read(const char *path, size_t *len_out);
/* stat() of the file, as it was when kept when replaying; false with errno set. */
bool filesnap_stat(const char *path, struct stat *st);

#endif
