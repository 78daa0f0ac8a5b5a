/*
 * Unit tests for the shared-memory contract (include/shm.h): cache-line
 * layout, lock-free atomics, and that what one process stores in a
 * MAP_SHARED segment the other one sees, across fork().
 */
#include "autoconfig.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "shm.h"

#define ADDS 100000 /* increments by each process in the race test */

static void test_layout(void **state)
{
	assert_int_equal(SHM_CACHELINE, 64);
	assert_int_equal(sizeof(WorkerSlot) % SHM_CACHELINE, 0);
	assert_int_equal(alignof(WorkerSlot), SHM_CACHELINE);
	assert_int_equal(alignof(ScalerView), SHM_CACHELINE);
	assert_int_equal(sizeof(ScalerView) % SHM_CACHELINE, 0);
	assert_int_equal(alignof(ShmSegment), SHM_CACHELINE);
	assert_int_equal(offsetof(ShmSegment, scaler) % SHM_CACHELINE, 0);
	assert_int_equal(offsetof(ShmSegment, slots) % SHM_CACHELINE, 0);
	/* the header fields and the scaler view share no line with a slot */
	assert_true(offsetof(ShmSegment, slots) >= offsetof(ShmSegment, scaler) + sizeof(ScalerView));
	assert_int_equal(sizeof(((ShmSegment *)0)->slots) / sizeof(WorkerSlot), SHM_MAX_WORKERS);
	assert_int_equal(sizeof(((ScalerView *)0)->busy_milli) / sizeof(uint32_t), SHM_MAX_WORKERS);
	assert_int_equal(sizeof(((ScalerView *)0)->busy_avg_milli) / sizeof(uint32_t), SHM_MAX_WORKERS);
	assert_int_equal(sizeof(((ScalerView *)0)->wait_milli) / sizeof(uint32_t), SHM_MAX_WORKERS);
	assert_int_equal(sizeof(((ScalerView *)0)->wait_avg_milli) / sizeof(uint32_t), SHM_MAX_WORKERS);
	assert_int_equal(sizeof(((ScalerView *)0)->last_reason), 128);
}

/* A lock-based atomic would take a per-process lock: useless across processes. */
static void test_atomics_are_lock_free(void **state)
{
	WorkerSlot slot;
	ScalerView view;
	assert_true(atomic_is_lock_free(&slot.state));
	assert_true(atomic_is_lock_free(&slot.pid));
	assert_true(atomic_is_lock_free(&slot.busy_ns));
	assert_true(atomic_is_lock_free(&slot.wait_ns));
	assert_true(atomic_is_lock_free(&slot.cl_active));
	assert_true(atomic_is_lock_free(&view.last_change_us));
	assert_true(atomic_is_lock_free(&view.busy_milli[0]));
	assert_true(atomic_is_lock_free(&view.wait_milli[0]));
}

static ShmSegment *map_segment(void)
{
	void *p = mmap(NULL, sizeof(ShmSegment), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(p != MAP_FAILED);
	assert_int_equal((uintptr_t)p % SHM_CACHELINE, 0);
	return p;
}

/* Run child(seg) in a forked process; assert it exited with 0. */
static void run_child(ShmSegment *seg, int (*child)(ShmSegment *))
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(child(seg));
	int status = 0;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* The worker side: check what the master wrote before fork, publish into slot 3. */
static int child_publish(ShmSegment *seg)
{
	if (seg->magic != SHM_MAGIC || seg->version != SHM_VERSION || seg->slot_size != sizeof(WorkerSlot))
		return 2;
	WorkerSlot *slot = &seg->slots[3];
	if (atomic_load(&slot->state) != SLOT_STARTING)
		return 3;
	atomic_store(&slot->pid, (int32_t)getpid());
	atomic_store(&slot->accepted, 12345);
	atomic_store(&slot->busy_ns, UINT64_C(5000000000));
	atomic_store(&slot->cl_active, 7);
	atomic_store(&slot->state, SLOT_ACTIVE);
	return 0;
}

static void test_child_writes_parent_sees(void **state)
{
	ShmSegment *seg = map_segment();
	seg->magic = SHM_MAGIC;
	seg->version = SHM_VERSION;
	seg->n_slots = SHM_MAX_WORKERS;
	seg->slot_size = sizeof(WorkerSlot);
	atomic_store(&seg->slots[3].state, SLOT_STARTING);

	run_child(seg, child_publish);

	WorkerSlot *slot = &seg->slots[3];
	assert_int_equal(atomic_load(&slot->state), SLOT_ACTIVE);
	assert_true(atomic_load(&slot->pid) > 0);
	assert_true(atomic_load(&slot->pid) != getpid());
	assert_int_equal(atomic_load(&slot->accepted), 12345);
	assert_int_equal(atomic_load(&slot->busy_ns), UINT64_C(5000000000));
	assert_int_equal(atomic_load(&slot->cl_active), 7);
	/* the neighbours are untouched */
	assert_int_equal(atomic_load(&seg->slots[2].accepted), 0);
	assert_int_equal(atomic_load(&seg->slots[4].state), SLOT_FREE);
	assert_int_equal(munmap(seg, sizeof(ShmSegment)), 0);
}

static int child_add(ShmSegment *seg)
{
	for (int i = 0; i < ADDS; i++)
		atomic_fetch_add(&seg->slots[0].query_count, 1);
	return 0;
}

/* Both processes add to one counter at once: no increment is lost. */
static void test_atomic_adds_across_processes(void **state)
{
	ShmSegment *seg = map_segment();
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(child_add(seg));
	child_add(seg);
	int status = 0;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_int_equal(atomic_load(&seg->slots[0].query_count), 2 * ADDS);
	assert_int_equal(munmap(seg, sizeof(ShmSegment)), 0);
}

/* SHOW's id column is an int4: the ids go round within it, and a new tree's start stays apart from the old's */
static void test_socket_ids_fit_int4(void **state)
{
	(void)state;
	assert_int_equal(shm_socket_id(1), 1);
	assert_int_equal(shm_socket_id(2), 2);
	assert_int_equal(shm_socket_id(INT32_MAX), INT32_MAX);
	assert_int_equal(shm_socket_id((uint64_t)INT32_MAX + 1), 1);
	assert_int_equal(shm_socket_id((uint64_t)INT32_MAX + 2), 2);
	/* an old tree that gave out 2^32 + 5 ids; the new one starts 2^30 above it */
	uint64_t old_next = (UINT64_C(1) << 32) + 5;
	uint64_t new_first = old_next + (UINT64_C(1) << 30) + 1;
	for (uint64_t k = 0; k < 1000; k++) {
		uint64_t id = shm_socket_id(new_first + k);
		assert_true(id >= 1 && id <= INT32_MAX);
		assert_int_not_equal(id, shm_socket_id(old_next));
		assert_int_not_equal(id, shm_socket_id(old_next + 1000));
	}
	for (uint64_t n = UINT64_MAX - 3; n != 0; n++)
		assert_true(shm_socket_id(n) >= 1 && shm_socket_id(n) <= INT32_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_layout),
	    cmocka_unit_test(test_atomics_are_lock_free),
	    cmocka_unit_test(test_child_writes_parent_sees),
	    cmocka_unit_test(test_atomic_adds_across_processes),
	    cmocka_unit_test(test_socket_ids_fit_int4),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
