"""ringexp: a Hydra-configured bench for the communication side of data-parallel training."""
