/*
 * Intrusive doubly-linked lists: every connection state is a list, and an
 * object moves between lists by unlinking its node and appending it.
 */
#ifndef PGB_COMMON_LIST_H
#define PGB_COMMON_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct List {
	struct List *next;
	struct List *prev;
} List;

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void list_init(List *l)
{
	l->next = l->prev = l;
}

static inline bool list_empty(const List *l)
{
	return l->next == l;
}

/* True if the node is linked into some list (nodes must be list_init()ed when created). */
static inline bool list_linked(const List *n)
{
	return n->next != n;
}

static inline void list_insert_between(List *n, List *prev, List *next)
{
	n->prev = prev;
	n->next = next;
	prev->next = n;
	next->prev = n;
}

static inline void list_append(List *head, List *n)
{
	list_insert_between(n, head->prev, head);
}

static inline void list_prepend(List *head, List *n)
{
	list_insert_between(n, head, head->next);
}

static inline void list_del(List *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

static inline List *list_first(const List *head)
{
	return list_empty(head) ? NULL : head->next;
}

static inline List *list_last(const List *head)
{
	return list_empty(head) ? NULL : head->prev;
}

static inline int list_count(const List *head)
{
	int n = 0;
	for (const List *i = head->next; i != head; i = i->next)
		n++;
	return n;
}

#define list_for_each(item, head) for ((item) = (head)->next; (item) != (head); (item) = (item)->next)
#define list_for_each_safe(item, head, tmp)                                                                            \
	for ((item) = (head)->next, (tmp) = (item)->next; (item) != (head); (item) = (tmp), (tmp) = (item)->next)

#endif
