/*
 * The kernel's per-task scheduler statistics (/proc/<pid>/schedstat): the
 * time a task ran on a CPU and the time it was runnable but waited in a run
 * queue, both in nanoseconds since the task started. A worker publishes its
 * wait next to its busy time, so that the scaler sees a worker starved of
 * CPU as saturated (doc/workers.md, "The saturation signal").
 */
#ifndef PGB_COMMON_SCHEDSTAT_H
#define PGB_COMMON_SCHEDSTAT_H

#include <stdbool.h>
#include <stdint.h>

/*
 * Parse "<on-cpu ns> <run-queue wait ns> <timeslices>\n". False (outputs
 * untouched) unless the first two fields are decimal numbers.
 */
bool schedstat_parse(const char *text, uint64_t *on_cpu_ns, uint64_t *wait_ns);

/* Open this process's (its main thread's) statistics: an fd for schedstat_read(), -1 if the kernel has none. */
int schedstat_open_self(void);

/* Read the statistics from an fd of schedstat_open_self() (pread at 0: no reopen); false if it cannot. */
bool schedstat_read(int fd, uint64_t *on_cpu_ns, uint64_t *wait_ns);

#endif
