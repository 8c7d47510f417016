/*
 * fork.c - the fork generation that tells a handle it was inherited
 * (nvio__forked in internal.h). Its own file so that everything that
 * asks (file.c, track.c, submit.c, ...) does not depend on handle.c.
 */
#include <pthread.h>

#include "internal.h"

/* Forks since the library was loaded, counted in the child (atfork). */
atomic_uint nvio__fork_gen;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void count_fork(void)
{
	atomic_fetch_add(&nvio__fork_gen, 1);
}

static void watch_forks(void)
{
	pthread_atfork(NULL, NULL, count_fork);
}

unsigned nvio__fork_watch(void)
{
	pthread_once(&atfork_once, watch_forks);
	return atomic_load(&nvio__fork_gen);
}
