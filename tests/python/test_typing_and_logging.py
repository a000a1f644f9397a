"""The Python module as a typed package that logs through Python's logging:
py.typed ships next to kjit/__init__.py, every public function's signature is
annotated (each parameter and the return), and kjit's log messages reach
logging.getLogger("kjit") with their level instead of stderr, unless KJIT_LOG
asks for kjit's own stderr lines. Needs neither torch nor a GPU: a bad
KJIT_CACHE_MAX_BYTES makes libkjit log a warning when it first reads its
configuration (kjit_device_count), in a new process."""

import inspect
import os
import pathlib
import subprocess
import sys
import textwrap

import kjit


def test_py_typed_ships_with_the_package():
    assert (pathlib.Path(kjit.__file__).parent / "py.typed").is_file()


def test_every_public_function_is_annotated():
    unannotated = []
    for name in kjit.__all__:
        f = getattr(kjit, name)
        if not inspect.isfunction(f):
            continue
        signature = inspect.signature(f)
        missing = [p for p in signature.parameters.values() if p.annotation is inspect.Parameter.empty]
        if missing or signature.return_annotation is inspect.Signature.empty:
            unannotated.append(f"{name}({', '.join(p.name for p in missing)})"
                               + ("" if missing else " (the return)"))
    assert not unannotated, f"public functions without annotations: {unannotated}"


_PROBE = textwrap.dedent("""
    import ctypes, logging, sys
    import kjit
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append((record.name, record.levelname, record.getMessage()))
    logging.getLogger("kjit").addHandler(Keep())
    count = ctypes.c_int(0)
    kjit.library().kjit_device_count(ctypes.byref(count))  # reads the cache's configuration: warns
    for name, level, message in records:
        print(name, level, message)
""")


def _probe(extra_env):
    env = {name: value for name, value in os.environ.items() if name != "KJIT_LOG"}
    env.update(KJIT_CACHE_MAX_BYTES="lots", **extra_env)
    return subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60,
                          check=True)


def test_log_messages_go_to_pythons_logging():
    run = _probe({})
    assert "kjit WARNING KJIT_CACHE_MAX_BYTES=lots is not a positive size" in run.stdout, (run.stdout, run.stderr)
    assert "kjit: warning:" not in run.stderr, run.stderr


def test_kjit_log_keeps_kjits_own_stderr_lines():
    run = _probe({"KJIT_LOG": "warn"})
    assert "kjit: warning: KJIT_CACHE_MAX_BYTES=lots is not a positive size" in run.stderr, run.stderr
    assert "KJIT_CACHE_MAX_BYTES" not in run.stdout, run.stdout
