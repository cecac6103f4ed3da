"""What a person reads on the terminal: warnings in one line, no leftovers of aborted reads.

``setup()``, called once by each command (``trip_jax.main``, ``cli.run``), makes every warning
one ``warning: ...`` line and sends the tracebacks an abandoned orbax checkpoint read leaves
(unraisable exceptions, asyncio errors; ``note_aborted_read``) to the log at debug level.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   line: str | None = None) -> str:
    """A warning as one line, without Python's source line: ``warning: MESSAGE`` for the
    project's own warnings (whose message names the file and the problem), ``warning:
    Category: MESSAGE (FILE:LINE)`` for others; line breaks in the message become spaces."""
    text = " ".join(str(message).split())
    if category.__module__.split(".")[0] == "trip_jax":
        return f"warning: {text}\n"
    return f"warning: {category.__name__}: {text} ({filename}:{lineno})\n"


# Set, transformers keeps its advisory warnings to itself (transformers.utils.logging).
TRANSFORMERS_NO_ADVICE = "TRANSFORMERS_NO_ADVISORY_WARNINGS"
# Orbax's files (a path segment) and the names of its functions that read a checkpoint.
_ORBAX_DIR = f"{os.sep}orbax{os.sep}"
_READING = re.compile(r"read|deserializ|restore", re.IGNORECASE)
# Checkpoint directories whose read was given up (``note_aborted_read``).
_ABORTED_READS: list[str] = []
# The functions below run while the interpreter shuts down, when module globals may already be
# None: what they use is bound as default arguments.


def note_aborted_read(directory: str | os.PathLike) -> None:
    """Records that reading the checkpoint at ``directory`` was given up on: the reads of its
    other arrays may fail after that, and their errors, which name the directory (TensorStore's
    messages) but no orbax function, are leftovers too."""
    for form in (os.fspath(directory), os.path.abspath(directory)):
        if form not in _ABORTED_READS:
            _ABORTED_READS.append(form)


def _names_aborted_read(text: str, aborted: list[str] = _ABORTED_READS) -> bool:
    """Whether ``text`` names a checkpoint directory ``note_aborted_read`` recorded."""
    return any(directory in text for directory in aborted)


def _in_orbax_read(code, orbax_dir: str = _ORBAX_DIR, reading: re.Pattern = _READING) -> bool:
    """Whether ``code`` (a code object) is one of orbax's checkpoint-reading functions."""
    return orbax_dir in code.co_filename and reading.search(code.co_name) is not None


def _raised_in_orbax_read(err: BaseException | None, in_read=_in_orbax_read) -> bool:
    """Whether ``err``, or an exception it was raised from, went through an orbax read."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        tb = err.__traceback__
        while tb is not None:
            if in_read(tb.tb_frame.f_code):
                return True
            tb = tb.tb_next
        err = err.__cause__ or err.__context__
    return False


def _from_aborted_read(err: BaseException | None, raised_in_read=_raised_in_orbax_read,
                       names_aborted=_names_aborted_read) -> bool:
    """Whether ``err`` went through an orbax read or names a checkpoint given up on."""
    return raised_in_read(err) or names_aborted(str(err))


def _is_aborted_read_leftover(unraisable, in_read=_in_orbax_read,
                              from_aborted_read=_from_aborted_read) -> bool:
    """An unraisable exception left by a checkpoint read that orbax gave up on (TensorStore's
    reads still under way, one per array): a callback arriving after its asyncio loop was
    closed, or an unfinished read coroutine failing as it is finalized (at the latest, as the
    interpreter shuts down), or an error naming the abandoned checkpoint."""
    if (unraisable.exc_type is RuntimeError
            and str(unraisable.exc_value) == "Event loop is closed"):
        return True
    code = getattr(unraisable.object, "cr_code", None)  # a coroutine's code
    return (code is not None and in_read(code)) or from_aborted_read(unraisable.exc_value)


def _is_aborted_read_record(record: logging.LogRecord, orbax_dir: str = _ORBAX_DIR,
                            reading: re.Pattern = _READING,
                            from_aborted_read=_from_aborted_read,
                            names_aborted=_names_aborted_read) -> bool:
    """An asyncio log record about the same leftovers: a read task destroyed while pending,
    or a read's exception never retrieved (one of orbax's reads, or TensorStore's own task
    that ``asyncio.gather`` wrapped, whose error names the abandoned checkpoint)."""
    if record.exc_info and from_aborted_read(record.exc_info[1]):
        return True
    message = str(record.msg)
    return (orbax_dir in message and reading.search(message) is not None) or names_aborted(
        message)


def _quiet_unraisable_hook(default_hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """An ``unraisablehook`` that logs ``_is_aborted_read_leftover`` cases at debug level and
    passes the others to ``default_hook``; it never raises."""
    is_leftover, debug = _is_aborted_read_leftover, logging.getLogger(__name__).debug

    def hook(unraisable) -> None:
        try:
            leftover = is_leftover(unraisable)
        except Exception:  # a half-finalized object: hand it on
            leftover = False
        if not leftover:
            default_hook(unraisable)
            return
        try:
            debug("ignored after an aborted checkpoint read: %s: %s",
                  getattr(unraisable.exc_type, "__name__", unraisable.exc_type),
                  " ".join(str(unraisable.exc_value).split()))
        except Exception:  # logging already shut down
            pass

    hook.quiets_aborted_reads = True
    return hook


def _quiet_record_filter() -> Callable[[logging.LogRecord], bool]:
    """A filter for the ``asyncio`` logger that turns ``_is_aborted_read_record`` records into
    one debug line of this module's logger; it never raises."""
    is_leftover, debug = _is_aborted_read_record, logging.getLogger(__name__).debug

    def keep(record: logging.LogRecord) -> bool:
        try:
            if not is_leftover(record):
                return True
            debug("ignored after an aborted checkpoint read: %s",
                  " ".join(record.getMessage().split()))
        except Exception:  # a half-finalized record or logging shut down: drop it quietly
            pass
        return False

    keep.quiets_aborted_reads = True
    return keep


def setup() -> None:
    """What a person reads on the terminal, set once by each entry point: every warning is
    ``format_warning``'s one line, and the leftovers of an aborted checkpoint read (a traceback
    per array after the run's own ``error:`` line, as unraisable exceptions or asyncio errors,
    possibly while the interpreter shuts down) go to the log at debug level. transformers'
    advisory lines (such as "PyTorch was not found" on the main install, which has no torch)
    are not shown."""
    warnings.formatwarning = format_warning
    os.environ.setdefault(TRANSFORMERS_NO_ADVICE, "1")  # read when transformers gives advice
    if getattr(sys.unraisablehook, "quiets_aborted_reads", False):
        return  # set already (a second command in the same process)
    sys.unraisablehook = _quiet_unraisable_hook(sys.unraisablehook)
    asyncio_logger = logging.getLogger("asyncio")
    if not any(getattr(f, "quiets_aborted_reads", False) for f in asyncio_logger.filters):
        asyncio_logger.addFilter(_quiet_record_filter())
