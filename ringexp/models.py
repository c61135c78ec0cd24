"""Models: a small built-in CNN (the fast CPU default) and any timm model by name, never with weights."""

import torch
from torch import nn

from ringexp.errors import ConfigError


def small_cnn(num_labels: int, width: int = 32, drop_rate: float = 0.0, in_chans: int = 3) -> nn.Module:
    """Three conv stages, then global max pooling: a label is 'is this motif anywhere', so max, not mean."""
    def stage(cin, cout):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        )

    w = width
    return nn.Sequential(
        stage(in_chans, w), nn.MaxPool2d(2),
        stage(w, 2 * w), nn.MaxPool2d(2),
        stage(2 * w, 4 * w),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Dropout(drop_rate), nn.Linear(4 * w, num_labels),
    )


def check_model(name: str) -> None:
    if name == "small_cnn":
        return
    import timm

    if not timm.is_model(name):
        close = timm.list_models(f"*{name[:4]}*")[:5] if len(name) >= 4 else []
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise ConfigError(f"model.name={name} is neither small_cnn nor a timm model{hint}; "
                          "see timm.list_models() for the names")


def build_model(cfg, num_labels: int) -> nn.Module:
    if cfg.name == "small_cnn":
        model = small_cnn(num_labels, cfg.width, cfg.drop_rate)
    else:
        import timm

        # pretrained=False always: ringexp never downloads weights; the run must work offline.
        model = timm.create_model(cfg.name, pretrained=False, num_classes=num_labels, drop_rate=cfg.drop_rate)
    # channels_last: convolutions then run in NHWC (inputs are converted by the first one), as cuDNN prefers
    return model.to(memory_format=torch.channels_last) if cfg.channels_last else model


def param_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def grad_numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)

