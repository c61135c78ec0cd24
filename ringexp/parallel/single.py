"""One process, no communication: the baseline that scaling is measured against."""


def apply(model, cfg, env, timer=None, example=None):
    return model.to(env.device)


def wire_bytes(cfg, shapes: list, world_size: int) -> int:
    return 0
