"""pytest set-up for kjit's Python tests (tests/python).

Tests marked `gpu` are skipped, visibly, where torch sees no CUDA GPU; tests
that need torch skip themselves without it (pytest.importorskip). kjit is the
one on sys.path: the installed package, or runtime/python with KJIT_LIBRARY
(as ctest runs them, tests/CMakeLists.txt).

ctest counts only exit codes: when KJIT_PYTEST_SKIPPED_EXIT is set and all
that pytest did was skip (tests, or whole modules without torch), the run exits
with that code, which ctest reports as skipped; pytest itself would say 0 (as
if they had passed) or 5 (no test collected, which otherwise stays a failure).
"""

import os

import pytest

_outcomes = {"passed": 0, "failed": 0, "skipped": 0}


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (torch.cuda.is_available() is False, or no torch)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        _outcomes[report.outcome] = _outcomes.get(report.outcome, 0) + 1


def pytest_collectreport(report):
    if report.skipped:  # a module's pytest.importorskip
        _outcomes["skipped"] += 1


def pytest_sessionfinish(session, exitstatus):
    code = os.environ.get("KJIT_PYTEST_SKIPPED_EXIT")
    nothing_but_skips = _outcomes["skipped"] and not _outcomes["passed"] and not _outcomes["failed"]
    if code and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) and nothing_but_skips:
        session.exitstatus = int(code)
