"""Reading and writing the files users name, so that every mistake is one SpecError line and nothing the
user had is lost.

Reading: only regular files, at most ``MAX_YAML_BYTES``, UTF-8. Writing (``write_atomic``): into a
temporary file beside the target, fsync, then rename over it, so a crash never leaves half a file; a
symlink is written through (the link stays, its target is replaced), a device, FIFO or folder is
refused, a missing folder is not created (a typo should not make directories), and a read-only target
is refused rather than replaced. ``check_writable`` runs the same checks before long work starts.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from autoplan.errors import SpecError
from autoplan.schema.limits import MAX_YAML_BYTES


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__


def regular_file(path: str | os.PathLike, label: str, expected: str) -> os.stat_result:
    """``path``'s stat when it is a regular file; otherwise one SpecError line that starts with ``label``
    (the path, or the option and the path) and says what was ``expected``."""
    try:
        st = Path(path).stat()
    except FileNotFoundError:
        raise SpecError(f"{label}: no such file ({expected})") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise SpecError(f"{label}: cannot read ({_reason(err) if isinstance(err, OSError) else err})") from None
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"{label}: is {_kind(st.st_mode)}, expected {expected}")
    return st


def read_bytes(path: str | os.PathLike, limit_bytes: int, expected: str, what: str) -> bytes:
    """The bytes of a regular file of at most ``limit_bytes`` (``what``: the kind of input, for the message)."""
    p = Path(path)
    st = regular_file(p, str(p), expected)
    if st.st_size > limit_bytes:
        raise SpecError(f"{p}: {st.st_size / 2**20:.1f} MiB is larger than the {limit_bytes / 2**20:.0f} MiB "
                        f"{what} may have")
    try:
        with p.open("rb") as f:
            raw = f.read(limit_bytes + 1)
    except OSError as err:
        raise SpecError(f"{p}: cannot read ({_reason(err)})") from None
    if len(raw) > limit_bytes:  # grew while we looked
        raise SpecError(f"{p}: larger than the {limit_bytes / 2**20:.0f} MiB {what} may have")
    return raw


def read_text(path: str | os.PathLike, limit_bytes: int = MAX_YAML_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit_bytes``."""
    p = Path(path)
    return decode_utf8(read_bytes(p, limit_bytes, "a YAML file", "a YAML input"), str(p))


def decode_utf8(raw: bytes, label: str, fix: str = "save it as UTF-8") -> str:
    """``raw`` as UTF-8 text (a leading byte-order mark dropped); otherwise one SpecError line starting with
    ``label`` that names the first bad byte and its offset, then ``fix``."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise SpecError(f"{label}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); {fix}") from None


def _target(path: str | os.PathLike, what: str) -> Path:
    """The file a write to ``path`` replaces (a symlink's target), after checking that it may be replaced."""
    p = Path(path)
    if str(path) == "":
        raise SpecError(f"{what}: empty path; give a file name")
    target = Path(os.path.realpath(p)) if p.is_symlink() else p
    try:
        st = target.stat()
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise SpecError(f"{what} {p}: cannot write ({_reason(err)})") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            hint = "; give a file name inside it" if stat.S_ISDIR(st.st_mode) else ""
            raise SpecError(f"{what} {p}: is {_kind(st.st_mode)}, not a file autoplan may replace{hint}")
        if not os.access(target, os.W_OK):
            raise SpecError(f"{what} {p}: is read-only; make it writable or choose another file")
    parent = target.parent
    if not parent.is_dir():
        problem = "does not exist" if not parent.exists() else "is not a folder"
        raise SpecError(f"{what} {p}: folder {parent} {problem}; create it first or choose another path")
    return target


def check_writable(path: str | os.PathLike, what: str = "output") -> None:
    """Fail now, with one line, if ``write_atomic(path, ...)`` would fail later: probes the folder."""
    target = _target(path, what)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".probe")
    except OSError as err:
        raise SpecError(f"{what} {path}: cannot write in {target.parent} ({_reason(err)})") from None
    os.close(fd)
    os.unlink(tmp)


def check_folder(path: str | os.PathLike, what: str) -> None:
    """Fail now, with one line, unless ``path`` is a folder autoplan may write in, or a new folder it may
    create (its parent exists and is writable): for outputs that are folders (``run --trace``, checkpoints)."""
    p = Path(path)
    if str(path) == "":
        raise SpecError(f"{what}: empty path; give a folder")
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise SpecError(f"{what} {p}: cannot use it ({_reason(err)})") from None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        kind = "a file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
        raise SpecError(f"{what} {p}: is {kind}, not a folder; give a folder (it is created if missing)")
    folder = p if st is not None else p.parent
    if not folder.is_dir():
        raise SpecError(f"{what} {p}: its parent {folder} does not exist; create it first or choose another folder")
    probe_folder(folder, f"{what} {p}")


def probe_folder(folder: Path, label: str) -> None:
    """Create and remove a file in ``folder``: one SpecError line starting with ``label`` if that fails."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".autoplan-probe-")
    except OSError as err:
        raise SpecError(f"{label}: cannot write in {folder} ({_reason(err)})") from None
    os.close(fd)
    os.unlink(tmp)


def _new_file_mode(target: Path) -> int:
    try:
        return stat.S_IMODE(target.stat().st_mode)  # keep the mode of the file we replace
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def write_atomic(path: str | os.PathLike, text: str | bytes, what: str = "output") -> None:
    """Write via a temporary file and rename, so a crash never leaves a half-written file behind. ``text``
    is UTF-8 text or, for a picture, bytes; a new file gets the umask's mode, a replaced one keeps its own."""
    target = _target(path, what)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as err:
        raise SpecError(f"{what} {path}: cannot write in {target.parent} ({_reason(err)})") from None
    try:
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", encoding="utf-8")) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _new_file_mode(target))
        os.replace(tmp, target)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise SpecError(f"{what} {path}: cannot write ({_reason(err)}); the old file, if any, is unchanged") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
