"""The HF generation engine (``rlpipe.lm.hf_decode``: static KV arena, batch buckets, CUDA graphs) on
tiny randomly initialised Qwen2 and Llama models, on CPU in fp32: against HF's own ``generate`` and
against the model's own distribution (teacher-forced log-probs), with EOS, stop strings, per-row caps
and bucket compaction; the capture logic with a stand-in for CUDA's graph recorder."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlpipe.lm import hf_decode
from rlpipe.lm.sampler import SamplingParams, generate
from rlpipe.lm.tokenizer import train_bpe

transformers = pytest.importorskip("transformers")

CORPUS = ["the cat sat on the mat. <answer>42</answer> the dog ate the bone.",
          "Once upon a time a girl found a red apple."] * 40
PROMPTS = ["the cat", "Once upon a time a girl found", "a", "the dog ate the bone and the cat sat"]
# Largest |recorded - teacher-forced| log-prob of the engine on these models in fp32: float32 rounding
# (about 1e-6, as the eager HF path's; tests/test_sampler_hf.py measured its own over kernel levels);
# another temperature's or row's log-probs are off by 1e-2 or more.
LOGPROB_TOL = 1e-4

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_bpe(CORPUS, 300, tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _tiny(kind: str, tok, **extra):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cfg_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[kind]
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=tok.vocab_size + 12, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id, **extra)
    return model_cls(cfg).eval()


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tok):
    return _tiny(request.param, tok)


def _peaked(model, tok, scale: float):
    """A fresh copy of ``model``'s architecture whose LM head is ``scale`` times sharper."""
    model = _tiny(model.config.model_type, tok)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def _policy(model, tok):
    return SimpleNamespace(model=model, tokenizer=tok)


def test_greedy_matches_hf_generate(model, tok, decode_check):
    """Greedy decoding of left-padded mixed-length prompts in fp32 gives HF ``generate``'s tokens
    (``DecodeCheck.assert_greedy_is_hf_generate``)."""
    g = generate(model, tok, PROMPTS, SamplingParams(temperature=0.0, max_tokens=16, min_tokens=16), decode="static")
    decode_check.assert_greedy_is_hf_generate(model, tok, g, 16, LOGPROB_TOL)


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_samples_the_models_distribution(model, tok, decode_check, top_p):
    """Sampled decoding draws from the model's own distribution: the recorded log-probs are the
    teacher-forced ones of the same tokens (temperature, nucleus); a rerun gives the same samples."""
    p = SamplingParams(n=3, temperature=0.9, top_p=top_p, max_tokens=12, seed=7)
    g = generate(model, tok, PROMPTS, p, decode="static")
    decode_check.assert_well_formed(_policy(model, tok), g, p)
    assert decode_check.max_logprob_gap(_policy(model, tok), g, p.temperature, top_p=top_p) <= LOGPROB_TOL
    decode_check.assert_same(generate(model, tok, PROMPTS, p, decode="static"), g, 0.0)


def test_first_token_frequencies_follow_the_softmax(model, tok):
    """The distribution itself: 4000 samples of a prompt's first token against the model's softmax
    (a chi-square test over the tokens expected at least 20 times, the rest pooled). With a fixed seed
    the statistic is deterministic up to rounding; the bound is the 1e-4 tail of its distribution, and
    drawing from the wrong temperature (checked) lands far beyond it."""
    prompt, n, T = "the dog", 4000, 0.8
    model = _peaked(model, tok, 30.0)  # many tokens expected often enough to test
    g = generate(model, tok, [prompt], SamplingParams(n=n, temperature=T, max_tokens=1, seed=3), decode="static")
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode(prompt)])).logits[0, -1].float()
    for temp, should_pass in ((T, True), (T * 1.6, False)):
        probs = torch.softmax(logits / temp, -1)
        counts = torch.bincount(torch.tensor([r[0] for r in g.response_ids]), minlength=probs.shape[0]).float()
        big = probs * n >= 20
        exp = torch.cat(((probs * n)[big], (probs * n)[~big].sum()[None]))
        obs = torch.cat((counts[big], counts[~big].sum()[None]))
        chi2, dof = ((obs - exp) ** 2 / exp).sum().item(), exp.numel() - 1
        bound = dof + 3.72 * math.sqrt(2 * dof) + 8  # beyond the 1e-4 tail for these dof (normal approx. + slack)
        assert dof >= 5 and (chi2 <= bound) == should_pass, (temp, chi2, bound, dof)


def _likely_eos(model, eos: int, bonus: float):
    """``model`` with ``bonus`` added to the EOS logit (a forward hook on the LM head: every path,
    teacher forcing included, sees the same model), so random-weight rows end by EOS often."""
    def hook(module, args, out):
        out[..., eos] += bonus
        return out

    model.lm_head.register_forward_hook(hook)
    return model


@pytest.mark.parametrize("window", [256, 8])
def test_eos_stop_strings_caps_and_buckets(model, tok, decode_check, monkeypatch, window):
    """Rows end on their own (EOS, a stop string, their own cap) and the batch shrinks to power-of-two
    buckets as they do; every row still holds samples of the model's distribution, and the engine
    finishes each row exactly where the eager HF path does (same uniforms, kernels within rounding)."""
    model = _likely_eos(_tiny(model.config.model_type, tok), tok.eos_token_id, 2.5)  # ~4% a step
    eos_tok = tok
    monkeypatch.setattr(hf_decode, "S_WINDOW", window)  # 8: attention windows grow during the call
    caps = [20 - (i % 5) * 4 for i in range(16)]
    p = SamplingParams(n=4, max_tokens=20, seed=1, stop=("e",))
    sizes = []
    real_select = hf_decode.HFArena.select
    monkeypatch.setattr(hf_decode.HFArena, "select", lambda self, idx: sizes.append(len(idx)) or real_select(self, idx))
    g = generate(model, eos_tok, PROMPTS, p, decode="static", row_max_tokens=caps)
    assert {"eos", "stop", "length"} <= set(g.finish_reason), g.finish_reason
    assert sizes and all(s & (s - 1) == 0 for s in sizes) and sizes == sorted(sizes, reverse=True), sizes
    for ids, reason, cap, text in zip(g.response_ids, g.finish_reason, caps, g.response_text, strict=True):
        assert len(ids) <= cap and eos_tok.eos_token_id not in ids[:-1] and "e" not in text
        if reason == "length":
            assert len(ids) == cap
        if reason == "stop":
            assert "e" in tok.decode(ids) and "e" not in tok.decode(ids[:-1])
    assert decode_check.max_logprob_gap(_policy(model, eos_tok), g, p.temperature) <= LOGPROB_TOL
    eager = generate(model, eos_tok, PROMPTS, p, decode="eager", row_max_tokens=caps)
    same = [a == b for a, b in zip(g.response_ids, eager.response_ids, strict=True)]
    assert sum(same) >= len(same) - 1  # a draw within rounding of a CDF step may flip one row
    assert [r for r, s in zip(g.finish_reason, same, strict=True) if s] == \
        [r for r, s in zip(eager.finish_reason, same, strict=True) if s]


@pytest.mark.parametrize("window", [256, 8])
def test_capture_leaves_the_arena_as_it_was(model, tok, monkeypatch, window):
    """A graph's capture runs warm-up steps that write the cache and advance its position; with a
    stand-in recorder (runs the warm-ups, records the step as a replayable call) the captured decode
    gives the eager decode's samples exactly: the warm-ups' writes were undone. With a small attention
    window a call crosses several windows, each its own graph."""
    monkeypatch.setattr(hf_decode, "S_WINDOW", window)
    def fake_capture(fn, pool, amp, device):
        for _ in range(hf_decode.WARMUP_STEPS):
            fn()
        return SimpleNamespace(replay=lambda: out.copy_(fn())), (out := fn().clone())

    def reset():
        monkeypatch.setattr(hf_decode, "_ARENAS", hf_decode.weakref.WeakKeyDictionary())

    p = SamplingParams(n=3, max_tokens=18, seed=5, stop=("e",))
    reset()
    eager = generate(model, tok, PROMPTS, p, decode="static")
    reset()
    monkeypatch.setattr(hf_decode, "graphs_available", lambda device: True)
    monkeypatch.setattr(hf_decode, "capture", fake_capture)
    monkeypatch.setattr(hf_decode.torch.cuda, "graph_pool_handle", lambda: "pool")
    graphed = generate(model, tok, PROMPTS, p, decode="cudagraph")
    assert graphed.response_ids == eager.response_ids and graphed.finish_reason == eager.finish_reason
    arena = next(iter(hf_decode._ARENAS[model].values()))
    assert arena.use_graphs and arena.steps, "the graph path was not taken"
    assert (len({w for _, w, _ in arena.steps}) > 1) == (window == 8)


def test_arena_is_reused_and_bounded(model, tok):
    p = SamplingParams(n=2, max_tokens=8, seed=0)
    generate(model, tok, PROMPTS, p, decode="static")
    first = dict(hf_decode._ARENAS[model])
    generate(model, tok, PROMPTS[::-1], p, decode="static")
    assert dict(hf_decode._ARENAS[model]) == first  # same bucket of rows and positions: the same buffers
    for n in (1, 3, 5):
        generate(model, tok, PROMPTS, SamplingParams(n=n, max_tokens=8, seed=0), decode="static")
    assert len(hf_decode._ARENAS[model]) <= hf_decode.MAX_ARENAS


def test_unsupported_models_and_bad_caps_are_refused(tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=tok.vocab_size + 12, n_embd=32, n_layer=1, n_head=2,
                                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)).eval()
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        generate(gpt2, tok, PROMPTS, SamplingParams(max_tokens=4), decode="static")
    assert len(generate(gpt2, tok, PROMPTS, SamplingParams(max_tokens=4), decode="auto")) == 4  # eager there
    qwen = _tiny("qwen2", tok)
    with pytest.raises(ValueError, match="decode 'compiled' runs our TransformerLM only"):
        generate(qwen, tok, PROMPTS, SamplingParams(max_tokens=4), decode="compiled")
    with pytest.raises(ValueError, match="row_max_tokens has 3 entries"):
        generate(qwen, tok, PROMPTS, SamplingParams(max_tokens=4), decode="static", row_max_tokens=[1, 2, 3])
    with pytest.raises(ValueError, match=r"row_max_tokens must lie in \[1, max_tokens=4\], got 5"):
        generate(qwen, tok, PROMPTS, SamplingParams(max_tokens=4), decode="static", row_max_tokens=[5, 1, 1, 1])
