"""Where recordings are kept: a folder (``<state_dir>/recordings`` by default) or any URL fsspec opens
(``s3://bucket/prefix`` with s3fs installed, ``memory://`` in tests). One object per call, named by its id,
so whoever erases a call finds its recording without a lookup, even one whose row was never written."""

from __future__ import annotations

import urllib.parse
from typing import Any

import fsspec

from pipeline.recordings.encode import SUFFIX


class RecordingStore:
    """Put, read (whole or a byte range), size and delete a call's recording."""

    def __init__(self, location: str) -> None:
        self.location = location
        fs, root = fsspec.core.url_to_fs(location)
        self._fs: Any = fs
        self._root = root.rstrip("/")

    def path_for(self, call_id: str) -> str:
        # Call ids come from telephony systems: a "/" or ".." in one must not name another place.
        return f"{self._root}/{urllib.parse.quote(call_id, safe='')}{SUFFIX}"

    def url_for(self, call_id: str) -> str:
        return self._fs.unstrip_protocol(self.path_for(call_id))  # type: ignore[no-any-return]

    def put(self, call_id: str, data: bytes) -> str:
        """Write the call's recording (replacing one written before: a job redone); its URL."""
        path = self.path_for(call_id)
        self._fs.makedirs(self._root, exist_ok=True)
        partial = f"{path}.partial"
        self._fs.pipe_file(partial, data)
        self._fs.mv(partial, path)  # a reader never sees half a file (a rename on a local disk)
        return self.url_for(call_id)

    def exists(self, call_id: str) -> bool:
        return bool(self._fs.exists(self.path_for(call_id)))

    def size(self, call_id: str) -> int:
        return int(self._fs.size(self.path_for(call_id)))

    def read(self, call_id: str, start: int | None = None, end: int | None = None) -> bytes:
        """The recording's bytes [start, end) (all of them by default); FileNotFoundError when none."""
        return bytes(self._fs.cat_file(self.path_for(call_id), start=start, end=end))

    def delete(self, call_id: str) -> bool:
        """Remove the call's recording; whether there was one."""
        path = self.path_for(call_id)
        if not self._fs.exists(path):
            return False
        self._fs.rm_file(path)
        return True
