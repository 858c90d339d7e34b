"""The sampler driving a HuggingFace CausalLM (the Qwen 2.5 Math path), on a tiny randomly
initialised Qwen2 built here (no download) and a tokenizer trained here."""

import os
import warnings
from types import SimpleNamespace

import pytest
import torch

from rlpipe.grpo import get_response_log_probs
from rlpipe.lm.sampler import SamplingParams, generate
from rlpipe.lm.tokenizer import train_bpe

transformers = pytest.importorskip("transformers")

CORPUS = ["the cat sat on the mat. <answer>42</answer> the dog ate the bone.",
          "Once upon a time a girl found a red apple."] * 40
PROMPTS = ["the cat", "Once upon a time a girl found", "a", "the dog ate the bone and the cat sat"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_bpe(CORPUS, 300, tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def qwen(tok, tmp_path_factory):
    """Saved and reloaded with from_pretrained from a local folder, as Qwen 2.5 Math will be."""
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=tok.vocab_size + 12, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id)
    folder = tmp_path_factory.mktemp("qwen")
    Qwen2ForCausalLM(cfg).save_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _fresh_logprobs(model, prompt_ids, response_ids, temperature):
    """rlpipe.grpo.get_response_log_probs on a fresh forward pass, response positions only."""
    ids = torch.tensor(prompt_ids + response_ids)[None]
    with torch.no_grad():
        lp = get_response_log_probs(model, ids[:, :-1], ids[:, 1:], temperature=temperature)["log_probs"][0]
    return lp[len(prompt_ids) - 1:]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hf_logprobs_match_fresh_forward(qwen, tok, temperature):
    g = generate(qwen, tok, PROMPTS, SamplingParams(n=2, temperature=temperature, max_tokens=12, seed=0))
    assert len(g) == 8
    for i in range(len(g)):
        ref = _fresh_logprobs(qwen, g.prompt_ids[i], g.response_ids[i], temperature)
        assert (g.logprobs[i] - ref).abs().max().item() <= 1e-4


def _check_samples(decode_check, qwen, tok, g, p):
    """``g`` holds samples of ``qwen``'s sampling distribution under ``p``: recorded log-probs equal
    the teacher-forced ones of the same tokens (LOGPROB_TOL), rows well formed."""
    policy = SimpleNamespace(model=qwen, tokenizer=tok)
    decode_check.assert_well_formed(policy, g, p)
    assert decode_check.max_logprob_gap(policy, g, p.temperature, p.min_tokens, p.top_p) <= LOGPROB_TOL


# Largest |recorded - teacher-forced| log-prob of the tiny Qwen, cached and naive, over native AVX-512,
# avx2 and default kernels: within float32 rounding (about 2e-6); the bound is 1e-4, and another
# temperature's or another row's log-probs are off by 1e-2 or more.
LOGPROB_TOL = 1e-4


def test_hf_cached_and_naive_sample_the_model_and_rows_independent_of_batch(qwen, tok, decode_check):
    """Cached and naive decoding run different kernels: each is checked against the model's teacher-
    forced log-probs on its own tokens, not token for token against the other. A prompt alone and in
    a batch runs the same code path: the same samples."""
    p = SamplingParams(n=2, temperature=0.9, max_tokens=10, seed=4)
    batch = generate(qwen, tok, PROMPTS, p)
    for g in (batch, generate(qwen, tok, PROMPTS, p, use_kv_cache=False)):
        _check_samples(decode_check, qwen, tok, g, p)
    alone = generate(qwen, tok, [PROMPTS[1]], p)
    assert alone.response_ids == batch.response_ids[2:4]
    for a, b in zip(alone.logprobs, batch.logprobs[2:4], strict=True):
        assert (a - b).abs().max().item() <= 1e-4


def test_hf_greedy_matches_hf_generate(qwen, tok, decode_check):
    """Greedy decoding of left-padded mixed-length prompts agrees with HF's own generate
    (``DecodeCheck.assert_greedy_is_hf_generate``)."""
    g = generate(qwen, tok, PROMPTS, SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8))
    decode_check.assert_greedy_is_hf_generate(qwen, tok, g, 8, LOGPROB_TOL)


def test_hf_stop_string_and_eos_bookkeeping(qwen, tok, decode_check):
    p = SamplingParams(n=2, max_tokens=10, seed=1, stop=("e",))
    g = generate(qwen, tok, PROMPTS, p)
    _check_samples(decode_check, qwen, tok, g, p)  # compaction keeps each row's own tokens and log-probs
    for ids, text, reason in zip(g.response_ids, g.response_text, g.finish_reason, strict=True):
        assert "e" not in text and len(ids) <= 10
        if reason == "stop":
            assert "e" in tok.decode(ids) and "e" not in tok.decode(ids[:-1])
    assert "stop" in g.finish_reason


def test_bench_sampler_smoke(tmp_path, capsys, monkeypatch, tiny_base):
    """``rlpipe bench sampler`` runs end to end and writes the JSON line it prints (no timing is
    asserted). It lives here because it imports transformers, which this file needs anyway. It benches
    the trainer tests' base (``--checkpoint``), whose AOT decode package the suite builds once
    (``decode_cache``) for tests/test_decode_package.py and the trainer's AOT runs too."""
    import json

    from rlpipe.bench import sampler as bench_sampler

    shape_peak_devices, real_peak = [], bench_sampler.matmul_peak
    monkeypatch.setattr(bench_sampler, "matmul_peak", lambda *a, **kw: shape_peak_devices.append(
        kw.get("device")) or real_peak(*a, **kw))
    out = tmp_path / "bench.json"
    result = bench_sampler.main(["--batch", "2", "--new-tokens", "3", "--repeats", "1", "--no-compiled", "--device",
                                 "cpu", "--checkpoint", tiny_base[0], "--out", str(out)])
    assert result["checkpoint"] == os.path.abspath(tiny_base[0]) and result["preset"] is None
    assert result["aot_tokens_per_s"] > 0  # the AOT decode's row, on the checkpoint's model
    # the shape peak is measured on the bench's --device (with --device cuda, not on the host's CPU)
    assert shape_peak_devices and all(d == torch.device("cpu") for d in shape_peak_devices), shape_peak_devices
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == result == json.loads(out.read_text())
    for key in ("kv_tokens_per_s", "naive_tokens_per_s", "kv_over_naive", "hf_ours_tokens_per_s",
                "hf_generate_tokens_per_s", "ours_over_hf_generate", "best_over_hf_generate"):
        assert result[key] > 0
    assert "compiled_tokens_per_s" not in result  # --no-compiled
    assert set(result["goals"]) >= {"fraction_of_peak", "fraction_of_peak_met", "over_hf_generate"}
    # both yardsticks: the shape peak (small fp32 matmuls) and the device peak (a large one in the
    # model's dtype), the same decode FLOP/s over each
    assert result["kv_fraction_of_device_peak"] > 0 and result["device_peak_dtype"] == "float32"
    assert result["kv_fraction_of_device_peak"] == pytest.approx(
        result["kv_gflops"] * 1e9 / result["device_peak"]["flops_per_s"], rel=0.01)  # kv_gflops: 3 decimals
    best = max(("kv", "aot"), key=lambda k: result.get(f"{k}_tokens_per_s", 0))
    assert result["fraction_of_device_peak"] == pytest.approx(result[f"{best}_fraction_of_device_peak"], rel=1e-3)
    assert result["fraction_of_shape_peak"] / result["fraction_of_device_peak"] == pytest.approx(
        result["device_peak"]["flops_per_s"] / (result["shape_peak_gflops"] * 1e9), rel=2e-3)
    assert "fraction_of_device_peak" in result["peak_note"] and "fraction_of_shape_peak" in result["peak_note"]


@pytest.mark.parametrize("what", ["missing", "not a checkpoint"])
def test_bench_sampler_refuses_a_bad_checkpoint_naming_the_flag(tmp_path, capsys, what):
    from rlpipe.bench import sampler as bench_sampler

    path = tmp_path / "model.pt"
    if what != "missing":
        path.write_text("not a checkpoint")
    with pytest.raises(SystemExit) as e:
        bench_sampler.main(["--checkpoint", str(path), "--no-compiled", "--no-aot"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--checkpoint" in err and str(path) in err, err


def test_bench_sampler_refuses_an_hf_policy_checkpoint_naming_the_flag(tiny_qwen, tmp_path, capsys):
    """An rlpipe checkpoint of an HF policy opens (its tokenizer too) but is no TransformerLM: refused
    before any work, naming the flag, the file and what it holds."""
    from rlpipe.bench import sampler as bench_sampler
    from rlpipe.lm.policy import load_policy

    path = tmp_path / "hf.pt"
    load_policy(tiny_qwen).save(path)
    with pytest.raises(SystemExit) as e:
        bench_sampler.main(["--checkpoint", str(path), "--no-compiled", "--no-aot"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--checkpoint" in err and str(path) in err and "Qwen2ForCausalLM" in err, err
