"""The store file this process opened stays the file at its path: replaced, deleted,
truncated or overwritten in place, it is found before the next write, and nothing more
is written to it (the journal keeps what was not folded)."""

from __future__ import annotations

import logging
import os
from typing import Any

from ...errors import StoreWriteError
from .connect import DUCKDB_HEADERS, DUCKDB_MAGIC, header_magic, stat_or_none

_log = logging.getLogger("kernelext")


class FileGuard:
    """For :class:`~.backend.DuckDBConnection`: what it saw of its file, checked again."""

    path: str
    read_only: bool
    lost: str | None
    con: Any
    hot_path: Any
    _identity: tuple[int, int] | None
    _header_fd: int | None
    _header_seen: bool
    _size_seen: int

    def _check_file(self) -> None:
        """Refuse to go on when the path no longer names the file this process opened.

        DuckDB keeps writing to the file it opened: after an ``os.replace`` over it (a
        restore, a sync tool) or its deletion, every commit would go to a file nobody can
        open again, and the run would report ``completed``. One ``stat`` per transaction
        (a group commit or a fold batch, which cost a millisecond) and per reconnect (a
        hand-over) finds it; from then on nothing is written here, and the journal keeps
        what was not folded yet (it is not deleted while records wait in it).
        """
        self._check_file_at(committed=False)

    def _check_file_at(self, *, committed: bool) -> None:
        """``_check_file``; ``committed``: just after this process's own COMMIT, whose
        checkpoint may have shrunk the file (the size it leaves is the new floor).

        Same inode but truncated or rewritten in place (``os.truncate``, ``> file``, a
        tool writing over it) is found too, cheaply: the size must not shrink below what
        this process saw after its own last commit while it held the file, and bytes 8-12
        must still be DuckDB's magic ``DUCK``. It cannot see a rewrite that keeps both (a
        valid DuckDB file of at least that size copied over it in place, or writes inside
        the file past its header): that would need a checksum of the whole file.
        """
        if self.lost is None and self._identity is not None and not self.read_only:
            st = stat_or_none(self.path)
            now = None if st is None else (st.st_dev, st.st_ino)
            what = None
            if now != self._identity:
                what = "deleted" if now is None else "replaced by another file"
            else:
                assert st is not None
                magic = header_magic(self._header_fd)  # None while not connected: not read then
                if magic == DUCKDB_MAGIC:
                    self._header_seen = True
                # Just after a commit the size may have shrunk (its checkpoint), never below
                # DuckDB's headers: shorter than them, the file was cut while it committed.
                floor = DUCKDB_HEADERS if committed and self._size_seen else self._size_seen
                if st.st_size < floor:
                    what = (
                        f"truncated ({st.st_size} bytes now, {self._size_seen} after this "
                        "process's last commit)"
                    )
                elif self._header_seen and magic is not None and magic != DUCKDB_MAGIC:
                    what = "overwritten in place (its header no longer reads DUCK)"
                elif committed and self.con is not None:
                    self._size_seen = st.st_size
            if what is None:
                return
            journal = self.hot_path.path if self.hot_path is not None else self.path + ".journal.*"
            kept = (
                f"the records not yet in its tables are kept in the journal {journal}, nothing "
                "acknowledged is lost"
                if os.path.exists(journal) or self.hot_path is None
                else f"its folder was removed too, with the journal {journal}"
            )
            self.lost = (
                f"The kernelext store file {self.path!r} was {what} while this process was using "
                "it (os.replace, a restore from a backup, a sync tool, rm?). kernelext writes "
                f"nothing more to it: {kept}. Put the original file back (or keep the new "
                "one), open it again with kx.open_store(path) (or restart the kernel), then "
                "call kx.resume(run_id) for the runs that were executing."
            )
            _log.error("kernelext: %s", self.lost)
        if self.lost is not None:
            raise StoreWriteError(self.lost)
