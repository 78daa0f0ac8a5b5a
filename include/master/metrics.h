/*
 * The built-in Prometheus endpoint (metrics_listen, doc/monitoring.md): the
 * master serves GET /metrics over HTTP/1.x connections it bounds in number
 * (metrics_max_connections), size and time. Pool, stats, database and list
 * figures come from the merged admin console of one worker, asked over its
 * private socket; worker and scaler figures from shared memory.
 */
#ifndef PGB_MASTER_METRICS_H
#define PGB_MASTER_METRICS_H

#include <event2/event.h>

#include "common/config.h"
#include "shm.h"

/* Open metrics_listen if set (fatal when it cannot be bound). `cf` stays the running config. */
void metrics_start(struct event_base *base, const Config *cf, ShmSegment *shm);

/* Close the listener and its connections, abandoning scrapes in progress (exit). */
void metrics_stop(void);

/*
 * Online restart, old side, at retirement: close the listener, so that the
 * new master, which binds the same port (SO_REUSEPORT), takes every new
 * scrape; ours have no active worker left to ask. Connections already
 * accepted are answered.
 */
void metrics_retire(void);

/*
 * In a freshly forked worker: close the metrics socket, every open metrics
 * connection and the scrapes' console connections, touching no event.
 */
void metrics_forget_in_child(void);

#endif
