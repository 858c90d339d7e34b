"""The CUDA-graph decode (``rlpipe.lm.cuda_graph_decode``) on a machine without a GPU: its static
buffers (copy-in, step, copy-out; the written position advanced on the device) run the eager static
step, which is exactly what a graph records; the capture and replay themselves need CUDA and are
checked by the GPU check. Also ``train.decode``'s ``auto`` / ``cudagraph`` resolution and refusal,
and the static decodes' early stop without a host read every step."""

from __future__ import annotations

import contextlib
import gc
import math
import weakref

import pytest
import torch

from rlpipe.config import ConfigError
from rlpipe.config.train import TrainConfig
from rlpipe.lm import cuda_graph_decode as cgd
from rlpipe.lm.decode_loop import ACTIVE_CHECK_EVERY
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.policy import load_policy
from rlpipe.lm.sampler import SamplingParams, _left_pad, generate
from rlpipe.lm.static_decode import StaticDecodeAdapter

# Largest |recorded - teacher-forced| log-prob of the cudagraph decode's samples (the eager static
# step through the runner's buffers): measured on the conftest micro model over sampling seeds 0-3,
# with and without stop strings / min_tokens and as the bench samples, under ATEN_CPU_CAPABILITY=
# native (AVX-512) / avx2 / default: 1.9e-6 at most (RoPE through real cos/sin instead of the full
# forward's complex64 product, and a one-token step against a full-sequence forward); 50x below.
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def policy(tiny_base):
    return load_policy(tiny_base[0])


@pytest.fixture
def warn_again(monkeypatch):
    monkeypatch.setattr(cgd, "_WARNED", set())  # the fallback warns once per device and process


def test_cudagraph_decode_samples_the_models_distribution_and_warns_without_cuda(policy, decode_check, warn_again):
    with pytest.warns(RuntimeWarning, match="needs a CUDA device.*eagerly over the same buffers"):
        decode_check.against_eager(policy, "cudagraph", LOGPROB_TOL)


def test_cudagraph_decode_with_stop_strings_and_min_tokens(policy, decode_check, warn_again):
    with pytest.warns(RuntimeWarning):
        decode_check.against_eager(policy, "cudagraph", LOGPROB_TOL, stop=("was",),
                                   include_stop_str_in_output=True, min_tokens=2)


def _prefilled(adapter, policy, prompts, n: int, new_tokens: int):
    ids, mask, pos = _left_pad(policy.tokenizer.encode_batch(prompts), policy.tokenizer.pad_token_id, "cpu")
    with torch.inference_mode():
        logits = adapter.prefill(ids, mask, pos, ids.shape[1] + new_tokens - 1, n)  # (N, V)
    return logits, mask.sum(-1).repeat_interleave(n)  # (N,) next RoPE positions


def test_runner_buffers_step_exactly_like_the_static_adapter(policy, decode_check, warn_again):
    """Same kernels, so bit-for-bit: the copy-in, the device-side position and key-mask updates and
    the copy-out add nothing to the static step."""
    static, graph = StaticDecodeAdapter(policy.model, compiled=False), cgd.CudaGraphDecodeAdapter(policy.model)
    a, pos = _prefilled(static, policy, decode_check.PROMPTS, 2, 8)
    with pytest.warns(RuntimeWarning):
        b, _ = _prefilled(graph, policy, decode_check.PROMPTS, 2, 8)
    L = static.L
    with torch.inference_mode():
        for k in range(6):
            assert torch.equal(a, b)
            tok = a.argmax(-1)  # (N,)
            a, b = static.step(tok, pos + k), graph.step(tok, pos + k).clone()
    assert torch.equal(a, b)
    assert int(graph.runner.at) == L + 6 == static.L
    assert torch.equal(graph.runner.keys, static.keys)
    for mine, theirs in zip(graph.runner.ks, static.cache.k, strict=True):
        assert torch.equal(mine, theirs)


def _micro_model(seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(ModelConfig(vocab_size=64, context_length=64, num_layers=2, d_model=32, num_heads=4,
                                     d_ff=64))


def _runner(model, batch: int, prompt_len: int = 5, new_tokens: int = 8):
    adapter = cgd.CudaGraphDecodeAdapter(model)
    ids = torch.ones(batch, prompt_len, dtype=torch.long)
    mask = torch.ones(batch, prompt_len, dtype=torch.bool)
    with torch.inference_mode():
        adapter.prefill(ids, mask, torch.arange(prompt_len).expand(batch, prompt_len), prompt_len + new_tokens, 1)
    return adapter.runner


@pytest.mark.filterwarnings("ignore:decode 'cudagraph'")
def test_one_runner_per_shape_reused_and_rebuilt_when_the_parameters_move():
    model = _micro_model()
    first = _runner(model, 3)
    assert _runner(model, 3) is first  # same (N, S): the same buffers (on CUDA: the same graph)
    assert _runner(model, 4) is not first  # another batch shape
    k0 = first.ks[0].data_ptr()
    assert _runner(model, 3).ks[0].data_ptr() == k0  # buffers at fixed addresses
    with torch.no_grad():  # a weight sync copies in place: the graph still reads the right memory
        for p in model.parameters():
            p.mul_(0.5)
    assert _runner(model, 3) is first
    model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)  # moved
    assert _runner(model, 3) is not first


def _fake_cuda_capture(monkeypatch, events: list):
    """torch.cuda's stream and graph calls replaced by recorders (on CPU the steps then run eagerly):
    returns the side and the current stream."""

    class Stream:
        def wait_stream(self, other):
            events.append(("wait", self, other))

    class Graph:
        def replay(self):
            events.append("replay")

    @contextlib.contextmanager
    def on(stream):
        events.append(("on", stream))
        yield
        events.append(("off", stream))

    @contextlib.contextmanager
    def graph(cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        assert isinstance(cuda_graph, Graph)
        events.append(("capture", pool, capture_error_mode))
        yield
        events.append("captured")

    side, current = Stream(), Stream()
    for name, fake in (("Stream", lambda device=None: side), ("current_stream", lambda device=None: current),
                       ("stream", on), ("CUDAGraph", Graph), ("graph", graph)):
        monkeypatch.setattr(torch.cuda, name, fake)
    return side, current


@pytest.mark.filterwarnings("ignore:decode 'cudagraph'")
def test_capture_warms_up_on_a_side_stream_then_records_once_in_thread_local_mode(monkeypatch):
    """``StaticBuffers._capture``'s sequence on CPU, torch.cuda's stream and graph calls recorded (the
    steps run eagerly): ``WARMUP_STEPS`` steps on a side stream that waited for the current one, the
    current stream waiting for it, then one step recorded into the model's pool in ``thread_local``
    error mode (Ray runs an actor's RDT receives on another thread; torch's default, ``global``, fails
    a capture when any thread makes an unsafe CUDA call); a replay returns the captured logits buffer."""
    events: list = []
    side, current = _fake_cuda_capture(monkeypatch, events)
    model = _micro_model()  # the runner holds it weakly
    runner = _runner(model, 2)  # on CPU: built, not captured
    real_run = runner.run
    runner.run = lambda: events.append("step") or real_run()
    with torch.inference_mode():
        runner._capture("the model's pool", None)
        assert events == [("wait", side, current), ("on", side), *["step"] * cgd.WARMUP_STEPS, ("off", side),
                          ("wait", current, side), ("capture", "the model's pool", "thread_local"), "step", "captured"]
        out = runner.step(torch.zeros(2, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    assert events[-1] == "replay" and out is runner.logits


@pytest.mark.filterwarnings("ignore:decode 'cudagraph'")
def test_capture_under_bf16_autocast_records_the_weight_casts(monkeypatch):
    """Under the caller's bf16 autocast, the warm-up and the captured step run under bf16 autocast with
    its weight cache off: a cast cached at capture would be replayed as it was, so the graph would
    read the capture's weights after every later weight sync. The caller's cache setting is back after."""
    seen: list = []
    _fake_cuda_capture(monkeypatch, [])
    model = _micro_model()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        runner = _runner(model, 2)
        real_run = runner.run
        runner.run = lambda: seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                                          torch.is_autocast_cache_enabled())) or real_run()
        with torch.inference_mode():
            runner._capture(None, cgd.autocast_dtype(torch.device("cpu")))
        assert torch.is_autocast_cache_enabled()
    assert seen == [(True, torch.bfloat16, False)] * (cgd.WARMUP_STEPS + 1)


@pytest.mark.filterwarnings("ignore:decode 'cudagraph'")
def test_runners_do_not_keep_their_model_alive():
    model = _micro_model()
    _runner(model, 2)
    alive = weakref.ref(model)
    del model
    gc.collect()
    assert alive() is None


def test_auto_decode_resolves_per_device():
    cpu = torch.device("cpu")
    assert not cgd.graphs_available(cpu)
    assert cgd.resolve_decode("auto", cpu) == "eager"
    assert cgd.resolve_decode("static", cpu) == "static"
    want = "cudagraph" if torch.cuda.is_available() else "eager"
    assert cgd.resolve_decode("auto", torch.device("cuda")) == want


def test_train_decode_defaults_to_auto_and_refuses_cudagraph_on_cpu():
    assert TrainConfig().decode == "auto"
    assert TrainConfig(decode="cudagraph", device="cuda").decode == "cudagraph"
    assert TrainConfig(decode="cudagraph", device="auto").decode == "cudagraph"
    with pytest.raises(ConfigError, match=r"train\.decode: cudagraph needs a CUDA device.*train\.device is cpu"):
        TrainConfig(decode="cudagraph", device="cpu")


def test_static_decode_stops_soon_after_every_row_finished_without_a_host_read_per_step(policy, monkeypatch):
    """A fixed-shape decode reads the active count every ``ACTIVE_CHECK_EVERY`` steps: it runs at
    most that many steps past the last row's end, and samples the same rows as when it looks every
    step."""
    steps = []
    real_step = StaticDecodeAdapter.step
    monkeypatch.setattr(StaticDecodeAdapter, "step",
                        lambda self, tok, pos: steps.append(1) or real_step(self, tok, pos))
    params = SamplingParams(n=4, temperature=0.9, max_tokens=60, seed=3)
    prompts = ["Write a story that includes the word: cat\n", "Write a story that includes the word: dog\n"]
    lazy = generate(policy.model, policy.tokenizer, prompts, params, decode="static")
    last = max(len(r) for r in lazy.response_ids)
    assert set(lazy.finish_reason) == {"eos"} and last < params.max_tokens  # the early stop is exercised
    assert len(steps) + 1 == min(math.ceil(last / ACTIVE_CHECK_EVERY) * ACTIVE_CHECK_EVERY, params.max_tokens)
    monkeypatch.setattr("rlpipe.lm.decode_loop.ACTIVE_CHECK_EVERY", 1)
    steps.clear()
    eager_look = generate(policy.model, policy.tokenizer, prompts, params, decode="static")
    assert len(steps) + 1 == last
    assert eager_look.response_ids == lazy.response_ids and eager_look.finish_reason == lazy.finish_reason
    for x, y in zip(eager_look.logprobs, lazy.logprobs, strict=True):
        assert torch.equal(x, y)


def test_bench_sampler_cudagraph_rows_run_the_decode_under_the_asked_precision():
    """``rlpipe bench sampler --device cuda``'s CUDA-graph rows, on CPU (their timing is not checked):
    the bf16 row runs its decode under bf16 autocast, the fp32 one without, and both fill their keys."""
    from rlpipe.bench.sampler import _cudagraph_rows, _under

    cpu, seen = torch.device("cpu"), []

    def decode():
        seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))

    out = {"batch": 4, "new_tokens": 8}
    for key, dtype in (("cudagraph", "float32"), ("cudagraph_bf16", "bfloat16")):
        seconds = _cudagraph_rows(out, key, lambda: None, _under(dtype, cpu, decode), flops=1e6, peak=1e9,
                                  repeats=2, hf_gen_s=1.0)
        assert seconds > 0
        assert {f"{key}_{k}" for k in ("tokens_per_s", "over_eager", "over_hf_generate", "fraction_of_peak",
                                       "capture_s")} <= set(out)
    assert seen == [False] * 3 + [torch.bfloat16] * 3  # the capture call, then two repeats each


def test_bench_teacher_forced_gap_is_rounding_for_the_graph_decode_and_large_for_a_wrong_one(policy, decode_check,
                                                                                               warn_again):
    """The bench's on-GPU correctness number (``cudagraph_logprob_gap``), checked on CPU where the
    graph decode runs its buffers eagerly."""
    from rlpipe.bench.sampler import teacher_forced_gap

    params = SamplingParams(n=2, temperature=0.8, max_tokens=10, min_tokens=10, seed=1)  # as the bench samples
    with pytest.warns(RuntimeWarning):
        g = generate(policy.model, policy.tokenizer, decode_check.PROMPTS, params, decode="cudagraph")
    eos = policy.tokenizer.eos_token_id
    assert teacher_forced_gap(policy.model, g, eos) <= LOGPROB_TOL
    g.logprobs = [lp.roll(1) for lp in g.logprobs]  # each token scored one position off
    assert teacher_forced_gap(policy.model, g, eos) > 100 * LOGPROB_TOL
