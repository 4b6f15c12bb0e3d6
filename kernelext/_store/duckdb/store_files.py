"""The one door for every file and folder kernelext keeps beside an embedded store.

``<store>.lock``, ``.want``, ``.wal``, ``.undo``, ``.journal.*``, ``.fence/``, ``.blobs/`` and
``.quarantine/`` are opened and created here only, so that nothing else on the machine
can bend them:

- nothing is opened through a symbolic link (``O_NOFOLLOW``; a file kernelext makes is
  created with ``O_CREAT | O_EXCL`` where its name is new); a file is never truncated on
  open, only after it was checked;
- a file must be a regular file, a folder a folder: a named pipe, socket or device is
  refused at once (opened with ``O_NONBLOCK``, so that nothing waits on it);
- like ssh's ``StrictModes``, a store whose folder or files another user owns (other
  than root) or may write is refused, with the ``chmod``/``chown`` that fixes it. A
  group-writable one is accepted only when the group is the user's own private group;
- files are created 0600 and folders 0700 (an existing folder of the user's own, like
  the ``.fence`` folder of an earlier release, is made 0700).

A read-only store (``kx.open_store(path, read_only=True)``, or a folder of someone
else's) writes and creates nothing: its files may belong to another user, and are still
never opened through a link or when they are not regular files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import stat
from typing import BinaryIO

from ...errors import StoreError

__all__ = [
    "check_owner",
    "check_store_owner",
    "check_store_path",
    "open_folder",
    "open_store_file",
    "own_folder",
    "private_dirs",
    "read_store_file",
    "refuse_special",
    "store_file_reader",
]

# POSIX only, like the embedded store (``platform.py``): ``getattr`` keeps the import working.
_NOFOLLOW = 0
for _flag in ("O_NOFOLLOW", "O_CLOEXEC", "O_NONBLOCK"):
    _NOFOLLOW |= getattr(os, _flag, 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a folder"),
)


def _kind(st: os.stat_result) -> str:
    return next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")


def refuse_special(path: str, st: os.stat_result, *, folder: bool = False) -> None:
    """Refuse anything but a regular file (a folder where ``folder``), before it is used."""
    if (stat.S_ISDIR if folder else stat.S_ISREG)(st.st_mode):
        return
    wanted = "a folder" if folder else "a regular file"
    raise StoreError(
        f"{path!r} beside the kernelext store is {_kind(st)}, not {wanted}; kernelext does "
        f"not use it. Remove it (rm {shlex.quote(path)}) if it is not yours to keep, or "
        "point KERNELEXT_STORE (or kx.open_store) at another path."
    )


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _private_group(gid: int) -> bool:
    """The group is this user's private group (their primary group, named after them,
    with no other member listed): group-writable is then as private as owner-writable
    (user private groups with a umask of 002). A shared primary group (``users``) is not."""
    import grp

    if gid != os.getegid():
        return False
    try:
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    me = _user_name(os.geteuid())
    return group.gr_name == me and all(member == me for member in group.gr_mem)


def check_owner(path: str, st: os.stat_result, *, mode_fixed: bool = False) -> None:
    """Refuse a file or folder another user owns or may write (ssh's ``StrictModes``;
    ``mode_fixed``: the caller makes it 0600 next, only the owner is checked)."""
    me = os.geteuid()
    quoted = shlex.quote(path)
    if st.st_uid not in (me, 0):
        raise StoreError(
            f"{path!r} of the kernelext store belongs to {_user_name(st.st_uid)} (uid "
            f"{st.st_uid}), not to you ({_user_name(me)}): another user could change what "
            "the store records. If it is yours, take it back (sudo chown "
            f"{shlex.quote(_user_name(me))} {quoted}); otherwise point KERNELEXT_STORE at a "
            "folder of your own, or read it with kx.open_store(path, read_only=True)."
        )
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if mode_fixed or (writable == stat.S_IWGRP and _private_group(st.st_gid)):
        return
    if writable and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX:
        own = os.path.join(path, f"kernelext-{_user_name(me)}", "store.duckdb")
        raise StoreError(
            f"The kernelext store cannot live directly in {path!r}: every user may create "
            "files there (like /tmp), and could plant links where the store's files go. "
            f"Use a folder of your own in it, e.g. KERNELEXT_STORE={shlex.quote(own)} "
            "(kernelext creates the folder, private to you)."
        )
    if writable:
        who = "every user" if st.st_mode & stat.S_IWOTH else "its group"
        raise StoreError(
            f"{path!r} of the kernelext store can be written by {who}: another user could "
            "plant links or files there that change what the store records. Make it yours "
            f"alone (chmod go-w {quoted}), or point KERNELEXT_STORE at a private folder."
        )


def _check(path: str, st: os.stat_result, *, folder: bool, shared: bool) -> None:
    refuse_special(path, st, folder=folder)
    if not shared:
        check_owner(path, st)


def _refuse_link(path: str, exc: OSError) -> StoreError | None:
    if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENOTDIR):
        return StoreError(
            f"{path!r} beside the kernelext store is a symbolic link (or not what it should "
            "be); kernelext never opens its files through a link. Remove it (rm "
            f"{shlex.quote(path)}) and open the store again."
        )
    if exc.errno == errno.ENXIO:  # a FIFO nobody reads, opened for writing
        return StoreError(
            f"{path!r} beside the kernelext store is a named pipe, socket or device, not a "
            f"file; kernelext does not use it. Remove it (rm {shlex.quote(path)})."
        )
    return None


def open_store_file(
    path: str,
    flags: int,
    *,
    dir_fd: int | None = None,
    shown: str | None = None,
    shared: bool = False,
    make_private: bool = False,
) -> int:
    """Open ``path`` (relative to ``dir_fd`` when given) never through a link; created
    0600 with ``os.O_CREAT`` (add ``os.O_EXCL`` for a new name). The file is checked on
    its descriptor: a regular file of this user's, not writable by others (``shared``: a
    read-only store's file may be another user's). Never pass ``O_TRUNC``: truncate after.
    ``shown`` names the file in errors (its full path, when ``dir_fd`` is given);
    ``make_private``: a file of this user's that others may write (DuckDB's WAL, made
    with the process umask) is made 0600 instead of refused."""
    if flags & os.O_TRUNC:
        raise ValueError("open_store_file never truncates on open: ftruncate the checked file")
    shown = shown or path
    try:
        fd = os.open(path, flags | _NOFOLLOW, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        refused = _refuse_link(shown, exc)
        if refused is not None:
            raise refused from None
        raise
    try:
        st = os.fstat(fd)
        refuse_special(shown, st)
        if not shared:
            check_owner(shown, st, mode_fixed=make_private)
        if make_private and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def store_file_reader(path: str, *, shared: bool = False) -> BinaryIO:
    """A file beside the store opened for reading (as ``open_store_file`` opens it)."""
    return os.fdopen(open_store_file(path, os.O_RDONLY, shared=shared), "rb")


def read_store_file(path: str, *, shared: bool = False) -> bytes:
    """The whole content of a file beside the store (opened as ``open_store_file`` does)."""
    with store_file_reader(path, shared=shared) as handle:
        return handle.read()


def open_folder(path: str) -> int:
    """A descriptor of kernelext's own folder ``path`` beside the store (made 0700, never
    a link; an existing one of this user's is made 0700), for ``dir_fd=`` opens in it."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)
    except OSError as exc:
        refused = _refuse_link(path, exc)
        if refused is not None:
            raise refused from None
        raise
    try:
        st = os.fstat(fd)
        _check(path, st, folder=True, shared=False)
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def own_folder(path: str) -> None:
    """Make (0700) or check kernelext's own folder ``path`` beside the store."""
    os.close(open_folder(path))


def private_dirs(path: str) -> None:
    """Create folder ``path`` and each missing parent with mode 0700 (``os.makedirs`` gives
    the parents the umask's mode, often 0755: other users could list the store's files)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        private_dirs(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)


def check_store_path(path: str) -> None:
    """Refuse a store path that is not a regular file (a FIFO would hang DuckDB), before
    anything is created beside it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise StoreError(
            f"The kernelext store {path!r} is a folder; the store is a file. Point "
            f"KERNELEXT_STORE (or kx.open_store) at a file in it, e.g. "
            f"{os.path.join(path, 'store.duckdb')!r}."
        )
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise StoreError(
            f"The kernelext store {path!r} is {_kind(st)}, not a file: DuckDB would wait on "
            "it forever. Point KERNELEXT_STORE (or kx.open_store) at a file path (e.g. "
            f"{os.path.join(os.path.dirname(path), 'store.duckdb')!r})."
        )


LINK_HOPS = 40  # as the kernel's own limit on links followed in one path (ELOOP)


def check_store_owner(path: str) -> None:
    """Refuse a store (to be written) whose folder or file another user owns or may write:
    they could plant links to files of yours, or change what it records. A store path that
    is a link is followed hop by hop, and the folder of every hop is checked too (a link of
    yours into a folder another user may write lets them point it anywhere)."""
    current = os.path.abspath(path)
    for _hop in range(LINK_HOPS):
        folder = os.path.dirname(current)
        check_owner(folder, os.stat(folder))
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return
        if not stat.S_ISLNK(st.st_mode):
            check_owner(current, os.stat(current))
            return
        current = os.path.join(folder, os.readlink(current))
    raise StoreError(f"The store path {path!r} goes through more than {LINK_HOPS} links.")
