"""Library versions recorded with every run, so numbers can be traced to what produced them."""

import platform
from importlib import metadata

PACKAGES = ("ringexp", "torch", "torchvision", "hydra-core", "omegaconf", "wandb", "timm", "torchmetrics")


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
