/* The maintenance tick: timeouts, lifetimes, min_pool_size, and the stats_period tick. */
#ifndef PGB_WORKER_JANITOR_H
#define PGB_WORKER_JANITOR_H

/* The maintenance tick: timeouts, lifetimes, min_pool_size, retries. */
void janitor_run(void);
/* The stats_period tick: snapshot the counters, log the stats line. */
void stats_period_tick(void);

#endif
