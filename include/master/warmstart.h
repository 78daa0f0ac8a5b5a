/*
 * Warm start: the active worker count written atomically (temp file +
 * rename) after every change, and read back at start.
 *
 * File format (worker_state_file), exactly two lines, each ending in "\n":
 *
 *   pgbouncer-workers 1
 *   count 3
 *
 * The first line names the format and its version (1). The count is decimal
 * digits only (no sign, no spaces), at least 1; it is written in
 * 1..WARMSTART_MAX_COUNT, and a larger one is read as it is (the caller
 * clamps it to max_workers, as any count). Nothing may
 * follow the second newline. Requiring the final newline means a file cut
 * short anywhere, even inside the number ("count 1" of "count 12"), is
 * rejected rather than misread.
 */
#ifndef PGB_MASTER_WARMSTART_H
#define PGB_MASTER_WARMSTART_H

#include <stdbool.h>
#include <stddef.h>

#include "shm.h"

#define WARMSTART_MAX_COUNT SHM_MAX_WORKERS /* the largest count written */

/*
 * Read the saved count. Returns true and sets *count when the file holds a
 * valid count; false with a reason in err when it is missing, unreadable,
 * not a regular file (a FIFO is never waited on), truncated or corrupt (the
 * caller then starts min_workers and logs it).
 * The reason does not name the file (the caller does). After a failed
 * open() errno is kept, so errno == ENOENT tells a first start from a
 * broken file.
 */
bool warmstart_read(const char *path, int *count, char *err, size_t errlen) __attribute__((warn_unused_result));

/*
 * Write the count atomically: PATH.tmp in the same directory (whatever is
 * there removed, then created anew, mode 0644), write, fsync, rename over PATH, fsync of the
 * directory. Readers see the old file or the new one, never a partial one.
 * On failure PATH.tmp is removed and PATH is unchanged (unless only the
 * final directory fsync failed); false with a reason in err.
 */
bool warmstart_write(const char *path, int count, char *err, size_t errlen) __attribute__((warn_unused_result));

/* Clamp a restored count to [min, max] (min wins if max < min). */
int warmstart_clamp(int count, int min, int max);

#endif
