"""A disk that fills: ``small_disk``, a 16 MiB tmpfs of the test's own (a fixture, offered
to tests/crash by its conftest), and ``fill``, which writes a file until the disk is full."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of its own (root only): filling it fills nothing else."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to mount a small tmpfs")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path, leave: int | None = None) -> None:
    """Write to ``path`` until the disk is full (ENOSPC), or, with ``leave``, until at most
    that many bytes are free."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    chunk = b"\0" * (64 << 10)
    try:
        while True:
            size = len(chunk)
            if leave is not None:
                free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
                if free <= leave:
                    break
                size = max(1, min(len(chunk), free - leave))
            try:
                os.write(fd, chunk[:size])
            except OSError:
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)
