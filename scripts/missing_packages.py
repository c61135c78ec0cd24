"""The pip packages scripts/gpu_check.sh needs besides torch that this Python cannot import, on one line separated
by spaces (an empty line when none is missing). The standard library only: it runs before anything is installed.

    python3 scripts/missing_packages.py
"""

import importlib.util

NEED = {"hydra": "hydra-core", "omegaconf": "omegaconf", "timm": "timm", "torchmetrics": "torchmetrics",
        "pytest": "pytest", "matplotlib": "matplotlib"}  # module: the package that installs it


def missing() -> list:
    return [pkg for mod, pkg in NEED.items() if importlib.util.find_spec(mod) is None]


if __name__ == "__main__":
    print(" ".join(missing()))
