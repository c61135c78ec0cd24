"""The labels CSV of an image folder, read as a careless or hostile user writes it: paths stay inside data.root,
one image has one spelling, a byte-order mark is accepted, other encodings are one line naming the file."""

import os
from types import SimpleNamespace

import pytest
from helpers.runs import make_image_folder

from ringexp.data.image_folder import read_labels
from ringexp.errors import DataError


def cfg(root):
    return SimpleNamespace(root=str(root), csv=None, path_column="path", label_columns=[])


def write(root, text: str | bytes):
    f = root / "labels.csv"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())


@pytest.mark.parametrize("path", ["../outside.png", "/etc/passwd", "sub/../../outside.png", "escape.png"])
def test_paths_must_stay_inside_the_root(tmp_path, path):
    root = make_image_folder(tmp_path / "images", n=2)
    (tmp_path / "outside.png").write_bytes((root / "img0.png").read_bytes())
    os.symlink(tmp_path / "outside.png", root / "escape.png")  # a symlink out of the root counts as outside
    write(root, f"path,cat\n{path},1\n")
    with pytest.raises(DataError) as e:
        read_labels(cfg(root))
    assert str(e.value) == (f"{root}/labels.csv:2: image {path} lies outside data.root {root.resolve()}; every "
                            "path must stay inside it")


def test_one_image_has_one_spelling(tmp_path):
    root = make_image_folder(tmp_path / "images", n=2)
    write(root, "path,cat\nimg0.png,1\n././/img0.png,0\n")
    with pytest.raises(DataError, match=r"labels.csv:3: duplicate path \./\.//img0.png \(first on line 2\)"):
        read_labels(cfg(root))
    write(root, "path,cat\n./img0.png,1\nimg1.png,0\n")
    assert read_labels(cfg(root))[0] == ["img0.png", "img1.png"]  # normalised


def test_a_byte_order_mark_is_accepted_and_other_encodings_are_named(tmp_path):
    root = make_image_folder(tmp_path / "images", n=2)
    write(root, "\ufeffpath,cat\nimg0.png,1\n")
    assert read_labels(cfg(root)) == (["img0.png"], ["cat"], [[1.0]])
    write(root, "path,cat\nimg\xe90.png,1\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"labels.csv: not UTF-8 text \(byte 12: invalid continuation byte\); save"):
        read_labels(cfg(root))


BROKEN = {  # labels.csv -> the one line it gives
    "a field over csv's limit": ("path,cat\nimg0.png," + "1" * 200_000 + "\n",
                                 "labels.csv:2: not a CSV row (field larger than field limit"),
    "a NUL byte in a path": ("path,cat\nimg0\0.png,1\n", "labels.csv:2: image path 'img0\\x00.png' holds a NUL byte"),
    "a label column twice": ("path,cat,cat\nimg0.png,1,0\n",
                             "labels.csv:1: column 'cat' appears twice in the header"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_csv_is_one_line_naming_file_and_line(tmp_path, case):
    root = make_image_folder(tmp_path / "images", n=2)
    text, words = BROKEN[case]
    write(root, text)
    with pytest.raises(DataError) as e:
        read_labels(cfg(root))
    assert words in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 300, str(e.value)


def test_a_csv_that_is_a_fifo_is_refused_not_waited_on(tmp_path):
    root = make_image_folder(tmp_path / "images", n=2)
    (root / "labels.csv").unlink()
    os.mkfifo(root / "labels.csv")  # opening it for reading would wait for a writer forever
    with pytest.raises(DataError, match="labels.csv: cannot read the labels CSV \\(not a regular file\\)"):
        read_labels(cfg(root))
