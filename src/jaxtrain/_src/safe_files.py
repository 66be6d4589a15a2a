"""Every file jaxtrain writes appears whole or not at all, and never through a symbolic link.

`atomic_write(path)` is the one writer: the bytes go to a new temporary file beside `path`, made
exclusively (`O_CREAT | O_EXCL | O_NOFOLLOW`, a name unique to the process and the call, so two
writers never share one and no planted name is followed), synced, then renamed over `path`
(`os.replace`, atomic on one filesystem). A `path` that is a symbolic link or a directory is
refused before anything is written. On any error, Ctrl-C or SIGTERM the temporary file is removed;
a SIGKILL can leave one (`.NAME.HOST-PID-XXXXXXXX.partial`) beside an intact `path`, which the first
write of `path` by a later process on that host removes once process PID no longer exists.

Writers that open the file themselves or write a folder (`data generate`: HDF5, .npy shards) use
`partial_file` and `partial_folder`: the same temporary names, the same refusal of links, the same
cleanup, with the disk's errors left for them to say.

Errors a user can cause (a full or read-only disk, a missing folder, a link in the way) are
`ConfigError`s of one line naming the file.

`read_json_object(path)` is the one reader of the JSON files a run keeps (config.json, summary.json,
...): whatever was put in their place (a JSON list, a FIFO, a folder, bytes that are not text) is one
`ConfigError` line, never a traceback and never a read that blocks.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import threading
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Sequence

from jaxtrain._src.errors import ConfigError

__all__ = ["atomic_write", "check_target", "open_nofollow", "partial_file", "partial_folder", "probe_writable",
           "read_json_object", "refuse_link", "refuse_same_file", "remove_partials", "write_bytes", "write_text"]

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
ADVICE = "write it elsewhere"  # what a message says to do instead; callers name their own option
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_PARTIALS: set[str] = set()  # temporary files and folders this process is writing now (removed on SIGTERM)
_handler_depth = 0  # nested writes in the main thread under our SIGTERM handler
_HOST = "".join(c for c in socket.gethostname() if c.isalnum())[:24] or "host"  # in temporary names: "-" splits


def remove_partials() -> None:
    """Removes the temporary files and folders this process is writing (a SIGTERM handler calls
    this before the process ends)."""
    for name in list(_PARTIALS):
        _remove(name)
        _PARTIALS.discard(name)


def _remove(name: str) -> None:
    """Removes the file or folder `name` if it is there (a link is removed, never followed)."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(name).st_mode):
            shutil.rmtree(name)
        else:
            os.unlink(name)


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM while a file is written and nobody else handles it: the temporary file goes, then
    the process ends by the signal as it would have."""
    remove_partials()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@contextlib.contextmanager
def _sigterm_cleans() -> Iterator[None]:
    """Installs `_on_sigterm` for the block where SIGTERM would otherwise end the process at once
    (its default handler, in the main thread); a handler someone else set (the command line's, a
    training run's) is left alone: the command line's calls `remove_partials` itself."""
    global _handler_depth
    main = threading.current_thread() is threading.main_thread()
    if not main or (_handler_depth == 0 and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    if _handler_depth == 0:
        signal.signal(signal.SIGTERM, _on_sigterm)
    _handler_depth += 1
    try:
        yield
    finally:
        _handler_depth -= 1
        if _handler_depth == 0 and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def write_error(path: Path, e: OSError, advice: str = ADVICE, what: str = "") -> ConfigError:
    """The one line for an OSError met writing `path`."""
    free = "free space, or " if e.errno in _FULL else ""
    return ConfigError(f"cannot write {_name(path, what)}: {e.strerror or e}; {free}{advice}", path=path)


def _name(path: Path, what: str) -> str:
    return f"{what} {path}" if what else str(path)


def refuse_link(path: str | os.PathLike, what: str = "", advice: str = ADVICE) -> Path:
    """Refuses a `path` that is a symbolic link: writing it would replace the link, not what it
    names, and a reader of the link would read something else. Returns it as a Path."""
    path = Path(path)
    if path.is_symlink():
        raise ConfigError(f"{_name(path, what)} is a symbolic link (to {os.readlink(path)}); jaxtrain writes only its "
                          f"own files, never through a link: remove the link, or {advice}", path=path)
    return path


def _refuse_long_name(path: Path, what: str, advice: str) -> None:
    """Refuses a `path` whose file name is longer than its folder's filesystem allows (255 bytes on most),
    which every look-up of it would otherwise meet as an OSError."""
    try:
        limit = os.pathconf(path.parent if path.parent.is_dir() else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    size = len(os.fsencode(path.name))
    if size > limit:
        raise ConfigError(f"cannot write {what or 'the file'} {path.name[:24]}…: its name is {size:,} bytes, and the "
                          f"filesystem allows {limit}: choose a shorter name, or {advice}", path=path)


def check_target(path: str | os.PathLike, what: str = "", advice: str = ADVICE) -> Path:
    """Refuses a `path` that cannot become a file of ours: a symbolic link (`refuse_link`), a
    directory, or one in a folder that does not exist. Returns it as a Path. `what` names it in the
    message (the command line passes its flag); `advice` says what to do instead."""
    _refuse_long_name(Path(path), what, advice)
    path = refuse_link(path, what, advice)
    name = _name(path, what)
    if path.is_dir():
        raise ConfigError(f"cannot write {name}: it is a directory; {advice}", path=path)
    if not path.parent.is_dir():
        reason = "is not a directory" if path.parent.exists() else "does not exist"
        raise ConfigError(f"cannot write {name}: its folder {path.parent} {reason}; create it, or {advice}",
                          path=path)
    return path


def refuse_same_file(output: str | os.PathLike, inputs: Sequence[str | os.PathLike], what: str = "") -> None:
    """Refuses an `output` that is one of `inputs` (the same file by device and inode, however it
    is named: another path, a hard link), which the write would replace."""
    try:
        out = os.stat(output)
    except OSError:
        return  # not there yet: it cannot be an input
    for source in inputs:
        with contextlib.suppress(OSError):
            s = os.stat(source)
            if (s.st_dev, s.st_ino) == (out.st_dev, out.st_ino):
                name = f"{what} {output}" if what else str(output)
                raise ConfigError(f"{name} is the input {source}; writing it would replace the inputs: choose "
                                  "another output file", path=Path(output))


def _temporary(path: Path, folder: bool = False) -> tuple[int, str]:
    """A new file (an open descriptor and its name) or, with `folder`, a new empty folder (-1 and
    its name) beside `path`, made exclusively with a name no other process or call uses."""
    _remove_stale(path)
    for _ in range(8):
        tmp = str(path.with_name(f"{_prefix(path)}{os.getpid()}-{secrets.token_hex(4)}.partial"))
        try:
            if folder:
                os.mkdir(tmp)  # exclusive: fails on anything there, a link included
                return -1, tmp
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def _prefix(path: Path) -> str:
    return f".{path.name[:180]}.{_HOST}-"


_SWEPT: set[tuple[str, str]] = set()  # (folder, prefix) whose stale temporaries this process removed


def _remove_stale(path: Path) -> None:
    """Removes the temporary files and folders of `path` that processes of this host left when
    killed (SIGKILL): regular files and folders (never links) whose writer's process no longer
    exists. Once per process and name: a folder's scan costs about 3 ms, and a run writes the same
    names again and again (a population of 16 scanned its folders 80 times)."""
    prefix = _prefix(path)
    if (str(path.parent), prefix) in _SWEPT:
        return
    _SWEPT.add((str(path.parent), prefix))
    with contextlib.suppress(OSError), os.scandir(path.parent) as entries:
        for entry in entries:
            if not (entry.name.startswith(prefix) and entry.name.endswith(".partial")):
                continue
            pid = entry.name[len(prefix):].split("-")[0]
            ours = entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False)
            if pid.isdigit() and ours and not _alive(int(pid)):
                _remove(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


@contextlib.contextmanager
def _partial(path: Path, folder: bool) -> Iterator[tuple[int, str]]:
    """A new temporary file or folder beside `path` (`_temporary`), registered for SIGTERM's cleanup
    while the block runs and removed if the block fails; the block renames it when done."""
    with _sigterm_cleans():
        fd, tmp = _temporary(path, folder) if folder else _temporary(path)
        _PARTIALS.add(tmp)
        try:
            yield fd, tmp
        except BaseException:
            _remove(tmp)
            raise
        finally:
            _PARTIALS.discard(tmp)


@contextlib.contextmanager
def partial_file(path: str | os.PathLike, what: str = "", advice: str = ADVICE) -> Iterator[BinaryIO]:
    """Yields a new binary file (readable too, for HDF5) whose bytes replace `path` when the block
    ends without an error: `atomic_write` without its check of the folder and its messages, for a
    writer that says the disk's errors itself (they pass as they are).

    Raises:
      ConfigError: `path` is a symbolic link, or became one while the block ran (`refuse_link`).
    """
    path = refuse_link(path, what, advice)
    with _partial(path, folder=False) as (fd, tmp):
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        refuse_link(path, what, advice)  # a link planted meanwhile is refused, not replaced
        os.replace(tmp, path)


@contextlib.contextmanager
def partial_folder(path: str | os.PathLike, what: str = "", advice: str = ADVICE) -> Iterator[Path]:
    """Yields a new empty folder that replaces `path` when the block ends without an error: the
    folder `path` names is first moved aside (a name of its own, then removed), so `path` names the
    old folder or the new one, whole, at every moment but for one rename. The disk's errors pass as
    they are, for the caller to say.

    Raises:
      ConfigError: `path` is a symbolic link, or became one while the block ran (`refuse_link`).
    """
    path = refuse_link(path, what, advice)
    with _partial(path, folder=True) as (_, tmp):
        yield Path(tmp)
        refuse_link(path, what, advice)
        old = None
        if path.is_dir():  # a file there is left for os.replace to refuse
            _, old = _temporary(path, folder=True)
            os.replace(path, old)  # onto our own empty folder
        try:
            os.replace(tmp, path)
        except BaseException:
            if old is not None:
                with contextlib.suppress(OSError):
                    os.replace(old, path)  # the old folder is back
            raise
        if old is not None:
            _remove(old)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, advice: str = ADVICE, what: str = "") -> Iterator[BinaryIO]:
    """Yields a binary file (readable too, for HDF5) whose bytes replace `path` when the block
    ends without an error; see the module's docstring.

    Args:
      path: the file to write.
      advice: what the user can do instead ("write it elsewhere", "choose another run_dir"); a full
        disk's message adds "free space, or".
      what: how messages name `path` (the command line passes its flag).

    Raises:
      ConfigError: `path` is a link or a directory, its folder is missing, or the disk refuses
        (full, read-only, no permission): one line; nothing is left behind.
    """
    path = check_target(path, what, advice)
    try:
        with partial_file(path, what, advice) as f:
            yield f
    except OSError as e:
        raise write_error(path, e, advice, what) from None


def write_bytes(path: str | os.PathLike, data: bytes, advice: str = ADVICE, what: str = "") -> Path:
    """Replaces `path` with `data` through `atomic_write`; returns the path."""
    with atomic_write(path, advice, what) as f:
        f.write(data)
    return Path(path)


def write_text(path: str | os.PathLike, text: str, advice: str = ADVICE, what: str = "") -> Path:
    """Replaces `path` with `text` (UTF-8) through `atomic_write`; returns the path."""
    return write_bytes(path, text.encode("utf-8"), advice, what)


def open_nofollow(path: str | os.PathLike, flags: int, mode: int = 0o644) -> int:
    """`os.open` that refuses a symbolic link at `path` (OSError ELOOP) instead of following it."""
    return os.open(path, flags | NOFOLLOW, mode)


def probe_writable(folder: str | os.PathLike) -> None:
    """Raises the OSError a write into `folder` meets (read-only, no permission, ...): a file of a
    fresh name is made exclusively and removed, so a planted name is never followed."""
    fd, tmp = _temporary(Path(folder) / ".write-test")
    os.close(fd)
    os.unlink(tmp)


def read_json_object(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON object in the file `path`, or None when there is no file there.

    Raises:
      ConfigError: `path` is not a regular file (a folder, a FIFO: never opened, so never blocks), cannot
        be read, is not JSON text, or holds another JSON value than an object; one line naming the file.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None  # a dangling link too
    except OSError as e:
        raise ConfigError(f"{path} cannot be read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"{path} is not a file; move it away, or give another run directory")
    try:
        value = json.loads(path.read_bytes())
    except OSError as e:
        raise ConfigError(f"{path} cannot be read ({e.strerror or e})") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        where = f" at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else ""
        raise ConfigError(f"{path} is not valid JSON ({getattr(e, 'msg', 'not text')}{where})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} holds a JSON {type(value).__name__}, not the object jaxtrain wrote; "
                          "it was changed or replaced: restore it, or give another run directory")
    return value
