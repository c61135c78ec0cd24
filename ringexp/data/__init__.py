"""Data sets: synthetic multi-label images (the default) and an image folder with a CSV of labels."""

from ringexp.data.image_folder import check_image_folder, image_folder_splits
from ringexp.data.synthetic import SyntheticMultiLabel


def check_data(cfg) -> None:
    if cfg.name == "synthetic":
        if cfg.num_labels < 1 or cfg.train_size < 1 or cfg.val_size < 1:
            raise_config(f"data: num_labels, train_size and val_size must be >= 1 "
                         f"(got {cfg.num_labels}, {cfg.train_size}, {cfg.val_size})")
        if not 0 < cfg.motif_size <= cfg.image_size:
            raise_config(f"data.motif_size={cfg.motif_size} must be between 1 and data.image_size={cfg.image_size}")
        if not 0 <= cfg.label_prob <= 1:
            raise_config(f"data.label_prob={cfg.label_prob} must be in [0, 1]")
    elif cfg.name == "image_folder":
        check_image_folder(cfg)
    else:
        raise_config(f"data.name={cfg.name} is unknown; use data=synthetic or data=image_folder")


def raise_config(msg: str):
    from ringexp.config import ConfigError

    raise ConfigError(msg)


def collate(cfg):
    """The loader's collate function: with data.skip_bad, unreadable images (None) are dropped from their batch,
    and a batch with nothing left is None (the loop takes the next); otherwise PyTorch's default."""
    return drop_bad if cfg.get("skip_bad") else None


def drop_bad(samples):
    """Collate the readable samples (loader workers pickle this, so it lives at module level)."""
    from torch.utils.data import default_collate

    good = [s for s in samples if s is not None]
    return default_collate(good) if good else None


def build_datasets(cfg):
    """(train, val, num_labels) for the data config."""
    if cfg.name == "synthetic":
        return (SyntheticMultiLabel(cfg, split="train"), SyntheticMultiLabel(cfg, split="val"), cfg.num_labels)
    return image_folder_splits(cfg)
