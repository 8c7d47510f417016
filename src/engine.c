/*
 * engine.c - the engine registry: every engine behind the one table of
 * engine.h, found by its nvio_engine_t id.
 */
#include "nvio.h"
#include "engine.h"

const struct nvio__engine_ops *nvio__engine(int id)
{
	switch (id) {
	case NVIO_ENGINE_URING:
		return &nvio__engine_uring;
	case NVIO_ENGINE_AIO:
		return &nvio__engine_aio;
	case NVIO_ENGINE_PSYNC:
		return &nvio__engine_psync;
	}
	return NULL;
}
