"""kjit compiles into its own cache only: NVRTC 12.9+ would also keep every cubin in the driver's compute cache
(CUDA_CACHE_PATH, shared with other programs' JIT under one size cap) and serve later compiles from there unverified.
Each case runs in a new process, since the driver reads CUDA_CACHE_PATH once, at initialisation."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

# Both processes run the same torch ops (whatever the driver caches for torch itself is in both); only one calls kjit.
_FIRST_CALL = textwrap.dedent("""
    import torch
    import kjit
    dev = "cuda"
    a = torch.randn(64, 256, device=dev).bfloat16()
    w = torch.randn(2, 384, 256, device=dev).bfloat16()
    offsets = torch.tensor([32, 64], device=dev, dtype=torch.int32)
    if {compile}:
        kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end")
    torch.cuda.synchronize()
""")


def _bytes_under(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _run(tmp_path, name, compile):
    env = dict(os.environ, CUDA_CACHE_PATH=str(tmp_path / name / "driver"), KJIT_CACHE_DIR=str(tmp_path / name / "kjit"))
    run = subprocess.run([sys.executable, "-c", _FIRST_CALL.format(compile=compile)], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    kjit_entries = sum(f.endswith(".kjit") for _, _, files in os.walk(tmp_path / name / "kjit") for f in files)
    return _bytes_under(tmp_path / name / "driver"), kjit_entries


@pytest.mark.gpu
def test_a_compile_adds_nothing_to_the_driver_compute_cache(tmp_path):
    if os.environ.get("CUDA_CACHE_DISABLE") == "1":
        pytest.skip("CUDA_CACHE_DISABLE=1: the driver's compute cache is off, so there is nothing to check")
    baseline, _ = _run(tmp_path, "torch_only", compile=False)
    after, kjit_entries = _run(tmp_path, "kjit", compile=True)
    assert kjit_entries == 1  # the GEMM was compiled (and published) in this process
    assert after == baseline, f"the driver's compute cache grew by {after - baseline} bytes during a kjit compile"
