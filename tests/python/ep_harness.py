"""Runs a test's ranks as spawned processes (torch.multiprocessing), for the
expert-parallel tests: each rank's traceback is written to a file, so that a
failure shows every rank's; the join has a deadline, so a hang fails the test
instead of stalling the run."""

import os
import time

import pytest
import torch.multiprocessing as mp


def run_ranks(worker, world, tmp_path, timeout_s, *args):
    """worker(rank, store_path, failures_path, *args) in `world` spawned
    processes; a store path for init_process_group's file:// rendezvous. The
    worker writes its traceback to f"{failures_path}.{rank}" when it fails."""
    failures = str(tmp_path / "failure")
    context = mp.start_processes(worker, args=(str(tmp_path / "store"), failures, *args), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(0.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                pytest.fail(f"the {world} ranks did not finish within {timeout_s} s")
    except mp.ProcessRaisedException:
        reports = [open(f"{failures}.{r}").read() for r in range(world) if os.path.exists(f"{failures}.{r}")]
        pytest.fail("\n".join(reports) or "a rank failed")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()


def record_failure(failures_path, rank, traceback_text):
    with open(f"{failures_path}.{rank}", "w") as f:
        f.write(traceback_text)
