"""The run directory's files: a full disk while writing tensors says so, in the file system's own words."""

import errno
import subprocess

import pytest
import torch

from ringexp import records


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs."""
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(tmp_path)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    yield tmp_path
    subprocess.run(["umount", "-l", str(tmp_path)], check=False)


def test_tensors_on_a_full_disk_fail_with_no_space_left(full_disk):
    """torch.save alone reports a zip position mismatch ('unexpected pos'); the user must read what to fix."""
    with pytest.raises(OSError) as failed:
        records.save_tensors(full_disk / "model.pt", {"x": torch.randn(100_000)})
    assert failed.value.errno == errno.ENOSPC
