"""libkjit itself: where it is found and loaded, its log messages routed to
Python's logging, its statuses turned into kjit's errors, and the error for
an op called where torch is not installed. Needs no torch (importing kjit
imports torch where it is installed: kjit/_ops.py registers the ops).

The one rule for errors: a wrong argument, whether kjit's Python checks find it
or libkjit does (KJIT_ERROR_INVALID_ARGUMENT), raises ArgumentError, which is a
KjitError and a ValueError; any other failed call raises KjitError.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import pathlib
from typing import Optional

from . import _abi

_LIBRARY_NAME = "libkjit.so.0"
_INVALID = _abi.Status.ERROR_INVALID_ARGUMENT


class KjitError(RuntimeError):
    """A kjit call failed; .status is the kjit_status name."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status


class ArgumentError(KjitError, ValueError):
    """A wrong argument (status KJIT_ERROR_INVALID_ARGUMENT): a KjitError, and a ValueError."""

    def __init__(self, message: str):
        super().__init__(f"KJIT_{_INVALID.name}", message)


MxArgumentError = ArgumentError  # its name before every argument error was one (quantize_mx's)


def invalid(message: str) -> ArgumentError:
    """The error every argument check raises (`raise invalid(...)`)."""
    return ArgumentError(message)


def _library_candidates() -> list[str]:
    """Where libkjit is looked for, in order (kjit's docstring)."""
    here = pathlib.Path(__file__).resolve().parent
    candidates = [str(here / "lib" / "libkjit.so")]  # the wheel's: one file, no soname links (runtime/CMakeLists.txt)
    if os.environ.get("KJIT_LIBRARY"):
        candidates.append(os.environ["KJIT_LIBRARY"])
    candidates += [str(parent / "build" / "runtime" / "libkjit.so") for parent in here.parents]
    return candidates


def _find_library() -> str:
    for candidate in _library_candidates():
        if os.path.exists(candidate):
            return candidate
    return _LIBRARY_NAME  # the loader's search path


class _Library(ctypes.CDLL):
    """libkjit, each entry point declared (_abi.signature) when it is first looked up: a new process's first
    call resolves the few it uses, not every one (tools/bench/first_call.py)."""

    def __getattr__(self, name: str):
        function = super().__getattr__(name)  # (cached on the instance: this runs once per name)
        declared = _abi.signature(name)
        if declared is not None:
            function.argtypes, function.restype = declared
        return function


_lib = None


def library() -> ctypes.CDLL:
    """The loaded libkjit, its entry points declared as they are first used."""
    global _lib
    if _lib is None:
        path = _find_library()
        try:
            lib = _Library(path)
        except OSError as e:
            raise OSError(f"libkjit could not be loaded ({e}); looked for {', '.join(_library_candidates())} and "
                          f"{_LIBRARY_NAME} on the loader path: install kjit with `pip install .` in a kjit "
                          f"checkout (or `pip install kjit-*.whl`, a wheel built there), or set KJIT_LIBRARY "
                          f"to a libkjit.so") from None
        _route_log(lib)
        _lib = lib
    return _lib


_logger = logging.getLogger("kjit")
_LOG_LEVELS = {_abi.LogLevel.ERROR: logging.ERROR, _abi.LogLevel.WARN: logging.WARNING,
               _abi.LogLevel.INFO: logging.INFO, _abi.LogLevel.DEBUG: logging.DEBUG}


def _log_to_python(level: int, message: bytes, _user_data: Optional[int]) -> None:
    python_level = _LOG_LEVELS.get(level, logging.WARNING)
    if _logger.isEnabledFor(python_level):
        _logger.log(python_level, "%s", message.decode("utf-8", "replace"))


_log_callback = _abi.LogCallback(_log_to_python)  # referenced here for as long as libkjit may call it


def _route_log(lib: ctypes.CDLL) -> None:
    """kjit's messages to logging.getLogger("kjit"), every level (logging
    filters them), unless KJIT_LOG asks for kjit's own stderr lines; back to
    stderr at exit, before the interpreter that runs the callback is gone."""
    if os.environ.get("KJIT_LOG") or not hasattr(lib, "kjit_set_log_callback"):  # (an older libkjit: none)
        return
    lib.kjit_set_log_callback.argtypes = [_abi.LogCallback, ctypes.c_void_p, ctypes.c_int]
    lib.kjit_set_log_callback.restype = None
    lib.kjit_set_log_callback(_log_callback, None, max(_abi.LogLevel))
    atexit.register(lib.kjit_set_log_callback, _abi.LogCallback(), None, 0)


def check(status: int) -> None:
    """Raises the error a failed call's status and message make (the module's rule)."""
    if status != _abi.Status.OK:
        lib = library()
        message = lib.kjit_last_error_message().decode()
        if status == _INVALID:
            raise ArgumentError(message)
        raise KjitError(lib.kjit_status_name(status).decode(), message)


def check_device_errors(device: int = 0) -> None:
    """Raises KjitError if a kernel on `device` recorded bad data (e.g. an
    expert id out of range). Synchronises the device."""
    check(library().kjit_device_errors(device))


_TORCH = None


def require_torch():
    """torch; an op called where torch is not installed gets an error that
    says what to install instead of a bare ModuleNotFoundError."""
    global _TORCH
    if _TORCH is None:
        try:
            import torch
        except ModuleNotFoundError as e:
            if e.name != "torch":  # torch is there but broken: its own error says more
                raise
            raise ModuleNotFoundError(
                "kjit's ops take torch tensors and need PyTorch, which is not installed: install the torch "
                "build for your CUDA set-up (https://pytorch.org/get-started/locally/), e.g. `pip install torch` "
                "(in a kjit checkout, `pip install '.[torch]'` installs both). kjit.library() and the ctypes "
                "descriptors (kjit.h's C ABI) work without torch.", name="torch") from None
        _TORCH = torch
    return _TORCH
