/*
 * tunept.c - the steps of `nvio tune` and how a point is labelled: what
 * the descent (tune.c) and its plot (svg.c) both name.
 */
#include "tool.h"

#include <stdio.h>

const char *const tune_step_names[] = {
	"default", "block size", "queue depth", "parallelism",
	"single_submit, overlap_events", "engine", "cross-check"
};

const char *tune_point_label(const nvio_config_t *c, int step, char *buf,
			     size_t len)
{
	switch (step) {
	case ST_BLOCK:
		if (c->block_size % (1u << 20) == 0)
			snprintf(buf, len, "%lluM",
				 (unsigned long long)c->block_size >> 20);
		else
			snprintf(buf, len, "%lluK",
				 (unsigned long long)c->block_size >> 10);
		break;
	case ST_QD:
		snprintf(buf, len, "%u", c->queue_depth);
		break;
	case ST_PAR:
		snprintf(buf, len, "%u", c->intra_op_parallelism);
		break;
	case ST_MODES:
		snprintf(buf, len, "ss%u ov%u", c->single_submit,
			 c->overlap_events);
		break;
	case ST_ENGINE:
		snprintf(buf, len, "%s", nvio_engine_name(c->engine));
		break;
	default:
		snprintf(buf, len, "%s", tune_step_names[step]);
	}
	return buf;
}
