"""nvio.offload.offload_model (placeholder until parameter offload lands)."""


def _owner(params):
    return None
