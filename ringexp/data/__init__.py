"""Data sets: synthetic multi-label images (the default) and an image folder with a CSV of labels."""

from torch.utils.data import default_collate

from ringexp.data.image_folder import check_image_folder, image_folder_splits
from ringexp.data.synthetic import SyntheticMultiLabel
from ringexp.errors import ConfigError


def check_data(cfg, world_size: int) -> None:
    """What the data config needs beyond its own fields' ranges: files that exist, a batch for every worker."""
    if cfg.name == "synthetic":
        if cfg.motif_size > cfg.image_size:
            raise ConfigError(f"data.motif_size={cfg.motif_size} must be between 1 and "
                              f"data.image_size={cfg.image_size}")
        if cfg.train_size < cfg.batch_size * world_size:
            raise ConfigError(f"data.train_size={cfg.train_size} cannot fill one batch of {cfg.batch_size} "
                              f"on each of {world_size} workers; raise data.train_size or lower data.batch_size")
    elif cfg.name == "image_folder":
        check_image_folder(cfg, world_size)
    else:
        raise ConfigError(f"data.name={cfg.name} is unknown; use data=synthetic or data=image_folder")


def collate(cfg):
    """The loader's collate function: with data.skip_bad, unreadable images (None) are dropped from their batch,
    and a batch with nothing left is None (the loop takes the next); otherwise PyTorch's default."""
    return drop_bad if cfg.skip_bad else None


def drop_bad(samples):
    """Collate the readable samples (loader workers pickle this, so it lives at module level)."""
    good = [s for s in samples if s is not None]
    return default_collate(good) if good else None


def build_datasets(cfg):
    """(train, val, num_labels) for the data config."""
    if cfg.name == "synthetic":
        return (SyntheticMultiLabel(cfg, split="train"), SyntheticMultiLabel(cfg, split="val"), cfg.num_labels)
    return image_folder_splits(cfg)
