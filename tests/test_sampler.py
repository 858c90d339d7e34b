"""Sampler on our TransformerLM: cache vs naive, log-probs vs a fresh forward pass, per-row seeding,
max/min tokens, EOS, stop strings, greedy, seeds."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rlpipe.grpo import get_response_log_probs
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.sampler import Generation, SamplingParams, generate
from rlpipe.lm.tokenizer import train_bpe

CORPUS = ["the cat sat on the mat. <answer>42</answer> the dog ate the bone.", "Grüße aus Köln, süße Grüße!",
          "Once upon a time a girl found a red apple. </answer>"] * 40
PROMPTS = ["the cat", "Once upon a time a girl found", "Köln", "the dog ate the bone and the cat sat"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_bpe(CORPUS, 320, tmp_path_factory.mktemp("tok") / "tokenizer.json")


def _cfg(tok):
    return ModelConfig(vocab_size=tok.vocab_size, context_length=128, num_layers=2, d_model=64, num_heads=4, d_ff=128)


@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(0)
    return TransformerLM(_cfg(tok)).eval()


class BiasedLM(TransformerLM):
    """Adds a fixed bias to the logits (e.g. to make EOS likely)."""

    def __init__(self, cfg, bias):
        super().__init__(cfg)
        self.bias = bias

    def forward(self, input_ids, **kw):
        return super().forward(input_ids, **kw) + self.bias


class ScriptedLM(TransformerLM):
    """Strongly prefers ``script[p]`` at absolute position p: the response to a prompt of length L
    is script[L-1], script[L], ... (deterministic text for stop-string tests)."""

    def __init__(self, cfg, script):
        super().__init__(cfg)
        self.script = torch.tensor(script + [0] * (cfg.context_length - len(script)))

    def forward(self, input_ids, *, positions=None, kv_cache=None, **kw):
        B, T = input_ids.shape
        past = 0 if kv_cache is None else kv_cache.length
        logits = super().forward(input_ids, positions=positions, kv_cache=kv_cache, **kw)
        if positions is None:
            positions = torch.arange(past, past + T)[None].expand(B, T)
        pos = positions[:, -logits.shape[1]:]
        return logits + 50.0 * F.one_hot(self.script[pos], logits.shape[-1])


def reference_logprobs(model, prompt_ids, response_ids, temperature=1.0):
    """rlpipe.grpo.get_response_log_probs on a fresh forward pass over prompt + response
    (``log_softmax(logits / T)`` at the labels), for the response positions."""
    ids = torch.tensor(prompt_ids + response_ids)[None]
    with torch.no_grad():
        lp = get_response_log_probs(model, ids[:, :-1], ids[:, 1:], temperature=temperature)["log_probs"][0]
    return lp[len(prompt_ids) - 1:]


def _same(a: Generation, b: Generation, atol=1e-4):
    assert a.response_ids == b.response_ids and a.finish_reason == b.finish_reason
    assert a.response_text == b.response_text
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        assert (x - y).abs().max().item() <= atol if len(x) else len(y) == 0


# Largest |recorded - teacher-forced| log-prob of this module's model, KV-cache and naive sampler
# alike, 4 parametrisations x native AVX-512, avx2 and default kernels: 1.9e-6 (float32 rounding of
# log-probs near -16); the bound is 50x that, and a wrong distribution (another temperature, another
# row's tokens) is off by 1e-2 or more.
LOGPROB_TOL = 1e-4


def _check_samples(decode_check, model, tok, g, p):
    """``g`` holds samples of ``model``'s sampling distribution under ``p``, rows well formed."""
    policy = SimpleNamespace(model=model, tokenizer=tok)
    decode_check.assert_well_formed(policy, g, p)
    gap = decode_check.max_logprob_gap(policy, g, p.temperature, p.min_tokens, p.top_p)
    assert gap <= LOGPROB_TOL, gap


@pytest.mark.parametrize("temperature,top_p,stop", [(1.0, 1.0, ()), (0.7, 0.9, ()), (0.0, 1.0, ()), (1.0, 1.0, ("e",))])
def test_kv_cache_sampler_and_naive_recompute_sample_the_model(model, tok, decode_check, temperature, top_p, stop):
    """Naive vs optimised. The KV-cache step and the full recomputation run different kernels, so
    each is checked against the model's teacher-forced distribution on its own tokens, never token for
    token against the other (a draw within rounding of a CDF step may differ on another CPU). With a
    common stop string rows finish at different steps, so the batch-compaction path is covered too."""
    p = SamplingParams(n=2, temperature=temperature, top_p=top_p, max_tokens=12, seed=3, stop=stop)
    for use_kv_cache in (True, False):
        g = generate(model, tok, PROMPTS, p, use_kv_cache=use_kv_cache)
        _check_samples(decode_check, model, tok, g, p)
        if stop:
            assert g.finish_reason.count("stop") >= 5


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_fresh_forward_pass(model, tok, temperature):
    g = generate(model, tok, PROMPTS, SamplingParams(n=2, temperature=temperature, max_tokens=15, seed=0))
    assert len(g) == 8 and all(len(r) == 15 for r in g.response_ids)
    for i in range(len(g)):
        assert g.prompt_ids[i] == tok.encode(PROMPTS[i // 2])
        ref = reference_logprobs(model, g.prompt_ids[i], g.response_ids[i], temperature)
        assert g.logprobs[i].dtype == torch.float32 and not g.logprobs[i].is_inference()
        assert (g.logprobs[i] - ref).abs().max().item() <= 1e-4
    # and the tempered log-probs are not the untempered ones (the test can tell them apart)
    if temperature != 1.0:
        ref1 = reference_logprobs(model, g.prompt_ids[0], g.response_ids[0], 1.0)
        assert (g.logprobs[0] - ref1).abs().max().item() > 1e-2


def test_top_p_logprobs_are_of_the_renormalised_nucleus(model, tok):
    top_p = 0.5
    g = generate(model, tok, PROMPTS[:2], SamplingParams(temperature=1.0, top_p=top_p, max_tokens=10, seed=1))
    for i in range(len(g)):
        ids = torch.tensor(g.prompt_ids[i] + g.response_ids[i])[None]
        with torch.no_grad():
            probs = torch.softmax(model(ids)[0, :-1].float(), -1)[len(g.prompt_ids[i]) - 1:]
        for t, tok_id in enumerate(g.response_ids[i]):
            sp, order = probs[t].sort(descending=True)
            keep = sp.cumsum(0) - sp < top_p
            nucleus = order[keep].tolist()
            assert tok_id in nucleus
            expected = torch.log(probs[t, tok_id] / sp[keep].sum())
            assert abs(g.logprobs[i][t].item() - expected.item()) <= 1e-4


def test_rows_do_not_depend_on_the_rest_of_the_batch(tok, decode_check):
    """Per-row generators seeded from (seed, prompt, occurrence, j): each prompt sampled alone
    gives the same samples as inside a mixed-length batch, in any order. EOS is made likely so
    rows finish at different times (exercising the compaction path)."""
    torch.manual_seed(1)
    bias = torch.zeros(tok.vocab_size)
    bias[tok.eos_token_id] = 2.5
    m = BiasedLM(_cfg(tok), bias).eval()
    p = SamplingParams(n=3, temperature=0.9, max_tokens=20, seed=11)
    batch = generate(m, tok, PROMPTS, p)
    assert {"eos", "length"} <= set(batch.finish_reason)
    _check_samples(decode_check, m, tok, batch, p)  # the compaction path samples the model
    for i, prompt in enumerate(PROMPTS):
        alone = generate(m, tok, [prompt], p)
        for j in range(3):
            assert alone.response_ids[j] == batch.response_ids[i * 3 + j]
            assert (alone.logprobs[j] - batch.logprobs[i * 3 + j]).abs().max().item() <= 1e-4
    rev = generate(m, tok, PROMPTS[::-1], p)
    assert rev.response_ids[:3] == batch.response_ids[-3:]
    assert len({tuple(r) for r in batch.response_ids}) > 6  # samples within a group differ


def test_duplicate_prompts_get_distinct_samples(model, tok):
    g = generate(model, tok, ["the cat", "the cat"], SamplingParams(max_tokens=10, seed=5))
    assert g.response_ids[0] != g.response_ids[1]


def test_seed_reproducible_and_global_rng_untouched(model, tok):
    p = SamplingParams(n=2, max_tokens=10, seed=42)
    state = torch.get_rng_state()
    a, b = generate(model, tok, PROMPTS, p), generate(model, tok, PROMPTS, p)
    assert torch.equal(state, torch.get_rng_state())
    _same(a, b, atol=0.0)
    c = generate(model, tok, PROMPTS, SamplingParams(n=2, max_tokens=10, seed=43))
    assert c.response_ids != a.response_ids
    torch.manual_seed(7)
    d = generate(model, tok, PROMPTS, SamplingParams(max_tokens=10))
    torch.manual_seed(7)
    assert generate(model, tok, PROMPTS, SamplingParams(max_tokens=10)).response_ids == d.response_ids


def test_temperature_zero_is_argmax(model, tok):
    g = generate(model, tok, PROMPTS, SamplingParams(n=2, temperature=0.0, max_tokens=8, seed=1))
    g2 = generate(model, tok, PROMPTS, SamplingParams(n=2, temperature=0.0, max_tokens=8, seed=2))
    assert g.response_ids == g2.response_ids and g.response_ids[0] == g.response_ids[1]
    for i in range(0, len(g), 2):
        ids = torch.tensor(g.prompt_ids[i] + g.response_ids[i])[None]
        with torch.no_grad():
            logits = model(ids)[0, len(g.prompt_ids[i]) - 1: -1]  # (T, V)
        # the full forward's top logit, up to the rounding between its kernels and the KV-cache step's
        chosen = logits.gather(-1, torch.tensor(g.response_ids[i])[:, None])[:, 0]  # (T,)
        assert (logits.max(-1).values - chosen).max().item() <= LOGPROB_TOL
        ref = reference_logprobs(model, g.prompt_ids[i], g.response_ids[i], 1.0)
        assert (g.logprobs[i] - ref).abs().max().item() <= 1e-4  # greedy reports T=1 log-probs


def test_max_tokens_eos_and_min_tokens(tok):
    torch.manual_seed(2)
    bias = torch.zeros(tok.vocab_size)
    bias[tok.eos_token_id] = 30.0  # EOS almost surely first
    m = BiasedLM(_cfg(tok), bias).eval()
    g = generate(m, tok, PROMPTS, SamplingParams(max_tokens=9, seed=0))
    assert g.response_ids == [[tok.eos_token_id]] * 4 and g.finish_reason == ["eos"] * 4
    assert g.response_text == [""] * 4 and all(len(lp) == 1 for lp in g.logprobs)

    g = generate(m, tok, PROMPTS, SamplingParams(max_tokens=9, min_tokens=5, seed=0))
    for i in range(4):
        ids = g.response_ids[i]
        assert len(ids) == 6 and ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1]
        assert g.finish_reason[i] == "eos" and g.response_text[i] == tok.decode(ids[:-1])
        # inside the min_tokens window the sampling distribution has EOS masked out
        ids_t = torch.tensor(g.prompt_ids[i] + ids)[None]
        with torch.no_grad():
            logits = m(ids_t)[0, len(g.prompt_ids[i]) - 1: -1].float()
        logits[:5, tok.eos_token_id] = float("-inf")
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        assert (g.logprobs[i] - ref).abs().max().item() <= 1e-4

    g = generate(m, tok, PROMPTS, SamplingParams(max_tokens=7, min_tokens=7, seed=0))
    assert all(len(r) == 7 and tok.eos_token_id not in r for r in g.response_ids)
    assert g.finish_reason == ["length"] * 4


def _scripted(tok, prompt, text):
    """A model whose greedy response to ``prompt`` is exactly ``text`` then EOS."""
    p_ids, r_ids = tok.encode(prompt), tok.encode(text) + [tok.eos_token_id]
    torch.manual_seed(3)
    return ScriptedLM(_cfg(tok), [0] * (len(p_ids) - 1) + r_ids).eval(), r_ids


@pytest.mark.parametrize("use_kv_cache", [True, False])
def test_stop_strings(tok, use_kv_cache):
    prompt, text = "the cat", " sat on the mat <answer>42</answer> the dog ate"
    m, r_ids = _scripted(tok, prompt, text)

    def run(**kw):
        kw.setdefault("max_tokens", 40)
        return generate(m, tok, [prompt], SamplingParams(temperature=0.0, **kw), use_kv_cache=use_kv_cache)

    full = run()
    assert full.response_ids[0] == r_ids and full.response_text[0] == text and full.finish_reason == ["eos"]
    k = next(k for k in range(1, len(r_ids)) if "</answer>" in tok.decode(r_ids[:k]))
    for include, expected in [(False, " sat on the mat <answer>42"), (True, " sat on the mat <answer>42</answer>")]:
        g = run(stop=("</answer>",), include_stop_str_in_output=include)
        assert g.finish_reason == ["stop"] and g.response_ids[0] == r_ids[:k]
        assert g.response_text[0] == expected and len(g.logprobs[0]) == k
    g = run(stop=["</answer>", "42"])  # the first stop string to complete wins
    assert g.response_text[0] == " sat on the mat <answer>" and g.finish_reason == ["stop"]
    g = run(stop=("</answer>",), min_tokens=k + 1)  # stop strings are ignored inside min_tokens
    assert g.finish_reason == ["eos"] and g.response_text[0] == text
    g = run(stop=("</answer>",), max_tokens=4)
    assert g.finish_reason == ["length"] and len(g.response_ids[0]) == 4


def test_multibyte_stop_string(tok):
    prompt, text = "Köln", " süße Grüße aus Köln"
    m, r_ids = _scripted(tok, prompt, text)
    g = generate(m, tok, [prompt], SamplingParams(temperature=0.0, max_tokens=30, stop=("üße",)))
    assert g.finish_reason == ["stop"] and g.response_text == [" s"]
    assert "üße" in tok.decode(g.response_ids[0]) and "üße" not in tok.decode(g.response_ids[0][:-1])
    # "€" never occurs in the corpus: its 3 bytes are 3 tokens, each alone an incomplete UTF-8 char
    prompt, text = "Köln", " costs 5€ today"
    m, r_ids = _scripted(tok, prompt, text)
    assert len(tok.encode("€")) == 3
    g = generate(m, tok, [prompt], SamplingParams(temperature=0.0, max_tokens=30, stop=("€",)))
    assert g.finish_reason == ["stop"] and g.response_text == [" costs 5"]
    assert g.response_ids[0] == r_ids[: len(tok.encode(" costs 5€"))]


def test_token_id_prompts_and_response_helpers(model, tok):
    p = SamplingParams(n=2, max_tokens=6, seed=9)
    a = generate(model, tok, PROMPTS[:2], p)
    b = generate(model, tok, [tok.encode(x) for x in PROMPTS[:2]], p)
    _same(a, b, atol=0.0)
    g = Generation([[1], [2]], [[5, 6, 7], [8]], ["", ""], [torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-4.0])],
                   ["length", "eos"])
    assert g.response_mask().tolist() == [[True, True, True], [True, False, False]]
    assert g.padded_response_ids(0).tolist() == [[5, 6, 7], [8, 0, 0]]
    assert g.padded_logprobs(4).tolist() == [[-1.0, -2.0, -3.0, 0.0], [-4.0, 0.0, 0.0, 0.0]]


def test_bad_inputs_fail_clearly(model, tok):
    with pytest.raises(ValueError, match="context length"):
        generate(model, tok, ["the cat"], SamplingParams(max_tokens=200))
    with pytest.raises(ValueError, match="prompt 1"):
        generate(model, tok, ["the cat", []], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=3, min_tokens=4)
    assert SamplingParams(stop=["a"]).stop == ("a",)


def test_bf16_autocast_sampling_runs(model, tok):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        g = generate(model, tok, PROMPTS, SamplingParams(n=2, max_tokens=6, seed=0))
    assert all(torch.isfinite(lp).all() and (lp <= 0).all() for lp in g.logprobs)

