"""A tiny MoE block made of kjit ops (fp8 dequant of the expert weights,
routing, two grouped GEMMs, the weighted combine) under torch.compile:
fullgraph=True fails on any graph break. Without a GPU the block is traced on
fake CUDA tensors (the ops' fake kernels); on a GPU it also runs, under
torch.compile and captured in a CUDA graph, and matches eager and plain torch."""

import pytest

torch = pytest.importorskip("torch")
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import kjit  # noqa: E402

TOKENS, HIDDEN, INTER, EXPERTS, TOP_K = 32, 256, 128, 8, 2


def moe_block(x, router, w_up_fp8, up_scales, w_down, top_k=TOP_K):
    """x [tokens, hidden] bf16 -> [tokens, hidden] bf16; every expert local, so
    every routed row is in the sorted order and no shape depends on data."""
    tokens = x.shape[0]
    experts = router.shape[0]
    topk_weights, topk_ids = torch.topk(torch.softmax(x.float() @ router.float().t(), dim=-1), top_k, dim=-1)
    _, ends, sorted_to_flat, flat_to_sorted = kjit.moe_routing(topk_ids.int(), experts,
                                                               offsets_convention="cumulative_end")
    a = x[sorted_to_flat.long() // top_k]
    w_up = kjit.dequant_fp8(w_up_fp8, up_scales, scale="block", block=(128, 128), convention="multiply")
    gate_up = kjit.grouped_gemm(a, w_up, ends, weights="e_n_k", offsets_convention="cumulative_end")
    gate, up = gate_up.chunk(2, dim=-1)
    h = (torch.nn.functional.silu(gate.float()) * up.float()).to(torch.bfloat16)
    y = kjit.grouped_gemm(h, w_down, ends, weights="e_n_k", offsets_convention="cumulative_end")
    return kjit.moe_combine(y, topk_weights.contiguous(), flat_to_sorted.view(tokens, top_k))


def block_inputs(device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16)
    router = torch.randn(EXPERTS, HIDDEN, generator=g).to(torch.bfloat16)
    w_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g) / HIDDEN ** 0.5)
    up_scales = w_up.abs().amax(dim=(1, 2), keepdim=True).expand(EXPERTS, 2 * INTER // 128, HIDDEN // 128) / 448
    w_up_fp8 = (w_up / up_scales.repeat_interleave(128, 1).repeat_interleave(128, 2)).to(torch.float8_e4m3fn)
    w_down = (torch.randn(EXPERTS, HIDDEN, INTER, generator=g) / INTER ** 0.5).to(torch.bfloat16)
    return [t.contiguous().to(device) for t in (x, router, w_up_fp8, up_scales, w_down)]


def reference(x, router, w_up_fp8, up_scales, w_down, top_k=TOP_K):
    """The block in plain torch, fp32."""
    topk_weights, topk_ids = torch.topk(torch.softmax(x.float() @ router.float().t(), dim=-1), top_k, dim=-1)
    w_up = w_up_fp8.float() * up_scales.repeat_interleave(128, 1).repeat_interleave(128, 2)
    out = torch.zeros(x.shape[0], x.shape[1], device=x.device)
    for j in range(top_k):
        e = topk_ids[:, j]
        gate, up = torch.einsum("th,tnh->tn", x.float(), w_up[e]).chunk(2, dim=-1)
        h = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).float()
        out += topk_weights[:, j:j + 1] * torch.einsum("ti,thi->th", h, w_down[e].float())
    return out


def test_the_moe_block_compiles_with_no_graph_break_and_its_kjit_ops_in_the_graph():
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward  # runs the graph on the fake tensors: the fake kernels

    torch._dynamo.reset()
    with FakeTensorMode():
        inputs = block_inputs("cuda")
        out = torch.compile(moe_block, backend=recording_backend, fullgraph=True)(*inputs)
        assert (out.shape, out.dtype, out.device.type) == ((TOKENS, HIDDEN), torch.bfloat16, "cuda")
    assert len(graphs) == 1
    called = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    for op in ("kjit.moe_routing_", "kjit.dequant_fp8_", "kjit.grouped_gemm_", "kjit.moe_combine_"):
        assert any(op in c for c in called), f"{op} is not in the graph: {called}"


def test_the_moe_block_traces_through_aot_autograd_on_the_fake_kernels():
    torch._dynamo.reset()
    with FakeTensorMode():
        out = torch.compile(moe_block, backend="aot_eager", fullgraph=True)(*block_inputs("cuda"))
        assert (out.shape, out.dtype) == ((TOKENS, HIDDEN), torch.bfloat16)


def test_arguments_libkjit_refuses_fail_the_trace_with_its_message():
    """The ops' fake kernels are libkjit's checks (kjit_*_check): a trace refuses what the launch would, in the
    launch's words, with no GPU."""
    def gemm(a, w, offsets):
        return kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end")

    torch._dynamo.reset()
    with FakeTensorMode():
        a, offsets = torch.empty(8, 64, dtype=torch.bfloat16, device="cuda"), torch.empty(2, dtype=torch.int32,
                                                                                           device="cuda")
        w = torch.empty(2, 36, 64, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(Exception, match="grouped_gemm: N must be a positive multiple of 8 up to .*, got 36"):
            torch.compile(gemm, backend="eager", fullgraph=True)(a, w, offsets)


def test_a_dynamic_row_count_traces_one_graph_the_checks_guard_nothing():
    """The fake kernels read a symbolic size as the value it was traced with, without a guard: a new token
    count does not recompile."""
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def gemm_and_quantize(a, w, offsets):
        return kjit.quantize_fp8(kjit.grouped_gemm(a, w, offsets, offsets_convention="cumulative_end"))

    torch._dynamo.reset()
    with FakeTensorMode():
        w = torch.empty(2, 256, 128, dtype=torch.bfloat16, device="cuda")
        offsets = torch.empty(2, dtype=torch.int32, device="cuda")
        compiled = torch.compile(gemm_and_quantize, backend=recording_backend, fullgraph=True, dynamic=True)
        for rows in (8, 20, 300):
            codes, scales = compiled(torch.empty(rows, 128, dtype=torch.bfloat16, device="cuda"), w, offsets)
            assert (codes.shape, scales.shape) == ((rows, 256), (rows, 2))
    assert len(graphs) == 1


@pytest.mark.gpu
def test_the_compiled_moe_block_runs_and_matches_eager_and_plain_torch():
    torch._dynamo.reset()
    inputs = block_inputs("cuda")
    eager = moe_block(*inputs)
    compiled = torch.compile(moe_block, fullgraph=True)(*inputs)
    kjit.check_device_errors(0)
    ref = reference(*inputs)
    assert torch.allclose(compiled.float(), eager.float(), rtol=2e-2, atol=2e-2)
    err = ((eager.float() - ref).norm() / ref.norm()).item()
    assert err <= 2e-2, err


@pytest.mark.gpu
def test_the_moe_block_is_captured_in_a_cuda_graph_after_prepare_and_replays_like_eager():
    inputs = block_inputs("cuda", seed=1)
    eager = moe_block(*inputs)  # compiles and loads every kernel (prepare_* would too)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_block(*inputs)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


@pytest.mark.gpu
def test_a_launch_that_would_compile_while_capturing_fails_with_capturing():
    x = torch.randn(8, 8 * 128, device="cuda").to(torch.float8_e5m2)  # a shape no other test launches
    scales = torch.ones(1, 1, device="cuda")
    with pytest.raises(kjit.KjitError, match="KJIT_ERROR_CAPTURING"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            kjit.dequant_fp8(x, scales, scale="tensor", convention="divide", out_dtype=torch.float16)
    out = torch.empty(8, 8 * 128, device="cuda", dtype=torch.float16)
    kjit.prepare_dequant_fp8(x, scales, out, scale="tensor", convention="divide")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kjit.dequant_fp8(x, scales, out=out, scale="tensor", convention="divide")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, (x.float() / 1.0).to(torch.float16))


@pytest.mark.gpu
def test_the_compiled_moe_block_runs_under_cuda_graphs_mode_reduce_overhead():
    torch._dynamo.reset()
    inputs = block_inputs("cuda", seed=2)
    eager = moe_block(*inputs)
    block = torch.compile(moe_block, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up runs, then recorded and replayed
        out = block(*inputs)
    assert torch.allclose(out.float(), eager.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_eager_calls_launch_directly_with_the_ops_effects_and_a_dispatch_mode_sees_the_ops():
    """Eager kjit calls skip torch's dispatcher (host time), yet bump the version counter of the tensor they
    write as the op does, and give the op's bytes; where a dispatch mode is active, the op itself runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.called = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.called.append(str(func))
            return func(*args, **(kwargs or {}))

    x, router, w_up_fp8, up_scales, w_down = block_inputs("cuda")
    w_up = kjit.dequant_fp8(w_up_fp8, up_scales, scale="block", block=(128, 128), convention="multiply")
    ends = torch.tensor([TOKENS // 2, TOKENS], dtype=torch.int32, device="cuda")
    out = torch.full((TOKENS, 2 * INTER), float("nan"), dtype=torch.bfloat16, device="cuda")
    version = out._version
    kjit.grouped_gemm(x, w_up[:2], ends, offsets_convention="cumulative_end", out=out)
    assert out._version == version + 1
    eager = out.clone()
    recorder = Recorder()
    with recorder:
        kjit.grouped_gemm(x, w_up[:2], ends, offsets_convention="cumulative_end", out=out)
    assert any(name.startswith("kjit.grouped_gemm_") for name in recorder.called), recorder.called
    assert torch.equal(out, eager)
    expected = torch.cat([x[:TOKENS // 2].float() @ w_up[0].float().t(), x[TOKENS // 2:].float() @ w_up[1].float().t()])
    assert torch.allclose(eager.float(), expected, rtol=2e-2, atol=2e-2)
