"""A folder of images plus a CSV of multi-hot labels: `path` column (relative to root) and 0/1 columns."""

import csv
import errno
import io
import os
import stat
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from ringexp import records
from ringexp.errors import DataError

CSV_LIMIT = 256 << 20  # bytes: a million rows of a few hundred labels
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def csv_path(cfg) -> Path:
    root = Path(cfg.root)
    if not cfg.csv:
        return root / "labels.csv"
    p = Path(cfg.csv)
    return p if p.is_absolute() else root / p


def read_labels(cfg):
    """Parse and check the CSV; returns (paths, label_names, label rows). Errors name the file and line."""
    path = csv_path(cfg)
    rows = csv_rows(path)
    if not rows:
        raise DataError(f"{path}:1: the CSV is empty; it needs a header row")
    header = [h.strip() for h in rows[0]]
    twice = next((h for i, h in enumerate(header) if h in header[:i]), None)
    if twice is not None:  # a label read from another column of the same name would be silently wrong
        raise DataError(f"{path}:1: column {twice!r} appears twice in the header; give every column its own name")
    wanted = list(cfg.label_columns) or [h for h in header if h != cfg.path_column]
    missing = [c for c in [cfg.path_column, *wanted] if c not in header]
    if missing:
        raise DataError(f"{path}:1: header lacks column(s) {', '.join(missing)} (has: {', '.join(header)}); "
                          "fix the CSV or set data.path_column / data.label_columns")
    if not wanted:
        raise DataError(f"{path}:1: no label columns besides '{cfg.path_column}'")
    pi, li = header.index(cfg.path_column), [header.index(c) for c in wanted]
    paths, labels, seen = [], [], {}
    root = Path(cfg.root).resolve()
    for lineno, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise DataError(f"{path}:{lineno}: {len(row)} fields, header has {len(header)}")
        rel = inside(root, row[pi].strip(), f"{path}:{lineno}")
        if rel in seen:
            raise DataError(f"{path}:{lineno}: duplicate path {row[pi].strip()} (first on line {seen[rel]})")
        seen[rel] = lineno
        if not (root / rel).is_file():
            raise DataError(f"{path}:{lineno}: image {row[pi].strip()} not found under {cfg.root}")
        values = [row[i].strip() for i in li]
        bad = [v for v in values if v not in ("0", "1")]
        if bad:
            raise DataError(f"{path}:{lineno}: label values must be 0 or 1, got {bad[0]!r}")
        paths.append(rel)
        labels.append([float(v) for v in values])
    if not paths:
        raise DataError(f"{path}: no image rows; add one line per image")
    return paths, wanted, labels


def csv_rows(path: Path) -> list:
    """The CSV's rows: a regular file (a FIFO is refused, not waited on) of at most CSV_LIMIT bytes, UTF-8 (a
    spreadsheet's byte-order mark before the header is not part of its first name), every field within csv's
    limit; DataError naming the file and line otherwise."""
    try:
        text = records.read_bytes(path, CSV_LIMIT, follow=True).decode("utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"{path}: labels CSV not found; set data.csv=FILE (path, then one 0/1 column per label)"
                        ) from None
    except OSError as e:
        raise DataError(f"{path}: cannot read the labels CSV ({e.strerror or e}); give a CSV file") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save the CSV as UTF-8") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        return list(reader)
    except csv.Error as e:  # e.g. a field over csv's field_size_limit
        raise DataError(f"{path}:{reader.line_num}: not a CSV row ({e}); fix the CSV") from None


def inside(root: Path, rel: str, where: str) -> str:
    """`rel` as a normalised path relative to `root` (resolved, so `./a//b.png` and `a/b.png` are one image), or
    DataError if it leads outside the root: `..`, an absolute path, or a symlink out of it."""
    if "\0" in rel:
        raise DataError(f"{where}: image path {rel!r} holds a NUL byte; no file name can")
    target = (root / rel).resolve()
    if not target.is_relative_to(root):
        raise DataError(f"{where}: image {rel} lies outside data.root {root}; every path must stay inside it")
    return str(target.relative_to(root))


def check_image_folder(cfg, world_size: int) -> None:
    """The folder, its CSV, and enough training images for one batch on every worker (DataError otherwise)."""
    if not cfg.root:
        raise DataError("data=image_folder needs data.root=FOLDER (images plus labels.csv)")
    root = Path(cfg.root)
    if not root.is_dir():
        raise DataError(f"{root}: image folder not found; set data.root to a folder of images")
    if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in root.rglob("*")):
        raise DataError(f"{root}: the folder holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    n = len(read_labels(cfg)[0])
    n_train = n - val_count(n, cfg.val_fraction)
    if n_train < cfg.batch_size * world_size:
        raise DataError(f"{csv_path(cfg)}: {n_train} training images (after data.val_fraction={cfg.val_fraction}) "
                        f"cannot fill one batch of {cfg.batch_size} on each of {world_size} workers; lower "
                        "data.batch_size or add images")


def val_count(n: int, val_fraction: float) -> int:
    """Images held out for validation: at least one."""
    return max(1, int(round(n * val_fraction)))


class ImageFolderMultiLabel(Dataset):
    """The images of `paths` (relative to `root`, as read_labels gives them: normalised, no link in them). Each is
    opened one folder at a time from the root without following a link (`open_inside`): the paths were checked to
    stay inside the root before launch, and a folder swapped for a link to elsewhere during the run is then an
    unreadable image, never a read of what the link points to."""

    def __init__(self, root: str, paths, labels, image_size: int, skip_bad: bool = False):
        from torchvision import transforms

        self.root, self.paths, self.skip_bad = Path(root), paths, skip_bad
        self.real_root = self.root.resolve()  # (data.root itself may be a link the user made)
        self.labels = torch.tensor(labels, dtype=torch.float32)
        self.transform = transforms.Compose([
            transforms.Resize((image_size, image_size)),
            transforms.ToTensor(),
            transforms.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]),
        ])

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, idx: int):
        from PIL import Image

        path = self.root / self.paths[idx]
        try:
            with open_inside(self.real_root, self.paths[idx]) as f, Image.open(f) as im:
                return self.transform(rgb(im)), self.labels[idx]
        # PIL's unreadable / truncated / corrupt images, and images so large that decoding them could exhaust
        # memory (a decompression bomb: over twice PIL's MAX_IMAGE_PIXELS)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
            if self.skip_bad:
                return None  # dropped by the loader's collate and counted (data/skipped_bad)
            raise DataError(f"{path}: cannot read image ({type(e).__name__}: {e}); fix or remove it, or set "
                              "data.skip_bad=true to skip unreadable images") from None


def open_inside(root: Path, rel: str):
    """The regular file `rel` under the folder `root`, opened for reading in binary one component at a time, none
    of them followed if it is a link (OSError otherwise: a link, a FIFO, a device, a file gone). A check of the path
    before the run cannot stop a folder from being swapped for a link later; opening it this way can."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    *folders, name = Path(rel).parts
    fd = os.open(root, flags | os.O_DIRECTORY)
    try:
        for part in folders:
            inner = step(fd, part, flags | os.O_DIRECTORY, root / rel)
            os.close(fd)
            fd = inner
        file_fd = step(fd, name, flags | os.O_NONBLOCK, root / rel)  # (a FIFO must not block the open)
    finally:
        os.close(fd)
    f = os.fdopen(file_fd, "rb")
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        f.close()
        raise OSError(errno.EINVAL, "not a regular file", str(root / rel))
    return f


def step(fd: int, part: str, flags: int, path: Path) -> int:
    """os.open of `part` in the folder `fd`; a link there (ELOOP, or ENOTDIR where a folder was asked for) is an
    OSError that says so, naming the image."""
    try:
        return os.open(part, flags, dir_fd=fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
            raise OSError(e.errno, f"{part!r} on its path is now a symbolic link, which ringexp does not follow "
                          "(the folder was checked before the run started)", str(path)) from None
        raise


def rgb(im):
    """An image as 8-bit RGB. 16-bit greyscale (PNG, TIFF) is scaled, not clipped: PIL's own convert('RGB') cuts
    every value above 255 to white, which turns a 16-bit image into a near-binary one."""
    from PIL import Image

    if im.mode.startswith("I;16") or im.mode == "I":  # ("I": how some PIL versions read 16-bit PNGs)
        a = np.asarray(im)
        if a.size and (a.min() < 0 or a.max() > 65535):
            raise ValueError(f"mode {im.mode} image with values outside 0-65535; save it as 8- or 16-bit")
        im = Image.fromarray((a.astype(np.uint32) >> 8).astype(np.uint8), "L")
    elif im.mode == "F":  # floating point: no fixed range to scale from
        raise ValueError("32-bit floating-point images are not supported; save it as 8- or 16-bit")
    return im.convert("RGB")


def image_folder_splits(cfg):
    paths, names, labels = read_labels(cfg)
    ds = ImageFolderMultiLabel(cfg.root, paths, labels, cfg.image_size, cfg.skip_bad)
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    n_val = val_count(len(ds), cfg.val_fraction)
    return Subset(ds, order[n_val:]), Subset(ds, order[:n_val]), len(names)
