/*
 * retry.c - the one retry policy for the result of a request.
 *
 * Every path that moves bytes (the workers, the inline path of small
 * sync ops, the helpers that finish short transfers, cuFile) asks here
 * whether an error is worth another try. A request the kernel keeps
 * answering EINTR, EAGAIN or EBUSY fails with that error after
 * NVIO__MAX_RETRIES tries instead of spinning forever.
 */
#include <errno.h>

#include "internal.h"

int nvio__retryable(int err)
{
	return err == -EINTR || err == -EAGAIN || err == -EBUSY;
}

/* 1: try again (and count it in *tries); 0: err is final. */
int nvio__retry(unsigned *tries, int err)
{
	if (!nvio__retryable(err) || *tries >= NVIO__MAX_RETRIES)
		return 0;
	(*tries)++;
	return 1;
}
