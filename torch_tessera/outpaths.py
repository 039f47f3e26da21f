"""One check for every output path the package writes (the backend's ``dump_dir``, the CLI's ``--out``,
``--gantt``, ``--json``...): a path that cannot be written fails before any work, with one plain message."""

from __future__ import annotations

import os

from torch_tessera.errors import ConfigError

#: The directory every CLI command writes its results to unless ``--out`` names another (relative to the working
#: directory); each command's files have their own names in it (``bench.json``, ``census.json``, ``serve_bench.json``).
DEFAULT_OUT_DIR = "tessera_out"


def check_output_dir(path: str | os.PathLike, option: str) -> str:
    """Create directory ``path`` (and its parents) if needed and check that it can be written.

    Args:
        path: the directory.
        option: the option that named it, for the message (``"dump_dir"``, ``"--out"``).

    Returns:
        ``path`` as a string.

    Raises:
        ConfigError: the directory cannot be created or written ("option --out=/proc/x: cannot create ...").
    """
    path = os.fspath(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"option {option}={path!r}: cannot create the directory ({e.strerror or e}); "
                          "give a directory you can write") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"option {option}={path!r}: the directory is not writable; give a directory you can write")
    return path


def check_output_file(path: str | os.PathLike, option: str) -> str:
    """Check that file ``path`` can be written: its directory is created if needed and must be writable, and the path
    must not be a directory.

    Args:
        path: the file.
        option: the option that named it, for the message (``"--gantt"``, ``"--json"``).

    Returns:
        ``path`` as a string.

    Raises:
        ConfigError: as :func:`check_output_dir` for its directory, or ``path`` is a directory.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ConfigError(f"option {option}={path!r} is a directory; give a file name")
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"option {option}={path!r}: cannot create its directory {parent!r} ({e.strerror or e}); "
                          "give a path you can write") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"option {option}={path!r}: its directory {parent!r} is not writable; "
                          "give a path you can write")
    return path
