"""Output files of the long-running subcommands (calibrate, eval, bench): checked before the run."""

from __future__ import annotations

import os

from kvpack.config import KVPackError


def prepare_output(path: str | None, flag: str, prefix: bool = False) -> None:
    """Before a long run: make the folder of the output file `path`, or fail now naming the flag, rather than
    after the run has been computed. prefix: `path` begins file names (--step-log PREFIX), so it may name a
    folder's entry that exists."""
    if not path or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    up = folder
    while not os.path.exists(up):  # the nearest existing ancestor: a file there blocks the folder
        up = os.path.dirname(up)
    if not os.path.isdir(up):
        raise KVPackError(f"{flag} {path}: {up} is a file, not a folder")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise KVPackError(f"{flag} {path}: cannot make its folder {folder}: {e.strerror or e}") from None
    if not prefix and os.path.isdir(path):
        raise KVPackError(f"{flag} {path} is a folder; give a file name")
    if not os.access(folder, os.W_OK):
        raise KVPackError(f"{flag} {path}: folder {folder} is not writable")
