"""``rlpipe.lm.hf_export``: our TransformerLM as a HuggingFace LlamaForCausalLM folder.

A small random TransformerLM and a BPE tokenizer trained here are saved as an rlpipe checkpoint,
exported, and loaded back with ``LlamaForCausalLM.from_pretrained`` / ``AutoTokenizer`` (offline).
The exported model must give our logits (max abs difference <= 1e-4), and each model's samples through
``rlpipe.lm.sampler.generate`` must be samples of the other's distribution (teacher-forced log-probs).
"""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch

from rlpipe.lm.checkpoint import save_checkpoint
from rlpipe.lm.hf_export import export_hf, hf_state_dict, interleaved_to_half, main
from rlpipe.lm.model import ModelConfig, TransformerLM
from rlpipe.lm.sampler import SamplingParams, _left_pad, generate
from rlpipe.lm.tokenizer import load_tokenizer, train_bpe

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CORPUS = ["the cat sat on the mat. $1+2=3$ so <answer>3</answer>",
          "Once upon a time a girl found a red apple and \\frac{1}{2} of a pie."] * 30
PROMPTS = ["the cat", "Once upon a time a girl found", "a", "so <answer>"]
CONFIG = dict(context_length=96, num_layers=2, d_model=64, num_heads=4, d_ff=96, rope_theta=500.0)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(our model, our tokenizer, export folder)."""
    d = tmp_path_factory.mktemp("hf_export")
    tok = train_bpe(CORPUS, 320, d / "tokenizer.json")
    torch.manual_seed(0)
    model = TransformerLM(ModelConfig(vocab_size=tok.vocab_size + 5, **CONFIG)).eval()  # a few unused ids
    with torch.no_grad():  # non-trivial norm gains, so a mis-mapped RMSNorm weight would show
        for name, p in model.named_parameters():
            if name.endswith(("ln1.weight", "ln2.weight", "ln_final.weight")):
                p.uniform_(0.5, 1.5)
    save_checkpoint(d / "model.pt", model, tokenizer=str(d / "tokenizer.json"))
    out = export_hf(d / "model.pt", d / "hf")
    return model, tok, out


def _load_hf(folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()


def test_export_writes_a_llama_folder(exported):
    model, tok, out = exported
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".hf.")]  # no temporary left behind
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["intermediate_size"], cfg["vocab_size"], cfg["max_position_embeddings"]) == (64, 2, 4, 4, 96,
                                                                                            tok.vocab_size + 5, 96)
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["tie_word_embeddings"] is False
    assert cfg["eos_token_id"] == tok.eos_token_id


@pytest.mark.parametrize("shape", [(1, 1), (2, 17), (3, 96)])
def test_logits_match_ours(exported, shape):
    model, _, out = exported
    hf = _load_hf(out)
    g = torch.Generator().manual_seed(shape[1])
    ids = torch.randint(0, model.config.vocab_size, shape, generator=g)
    with torch.no_grad():
        ours, theirs = model(ids), hf(input_ids=ids).logits  # (B, T, V) each
    assert theirs.shape == ours.shape
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert ours.abs().max().item() > 1.0  # the comparison is not between near-zero logits


def test_logits_match_with_left_padding_and_positions(exported):
    model, tok, out = exported
    hf = _load_hf(out)
    prompt_ids = tok.encode_batch(PROMPTS)
    ids, mask, pos = _left_pad(prompt_ids, tok.pad_token_id, "cpu")  # (B, P) each
    with torch.no_grad():
        ours = model(ids, positions=pos, attention_mask=mask)
        theirs = hf(input_ids=ids, attention_mask=mask.long(), position_ids=pos).logits
    assert (ours - theirs)[mask].abs().max().item() <= 1e-4  # real tokens only: pad rows are garbage by design


def test_rope_permutation_is_needed():
    """Without the q/k row permutation the HF model computes something else: the check above can fail."""
    torch.manual_seed(1)
    cfg = ModelConfig(vocab_size=300, **CONFIG)
    model = TransformerLM(cfg).eval()
    weights = hf_state_dict(model)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=96, rms_norm_eps=1e-5, rope_theta=500.0,
        tie_word_embeddings=False)).eval()
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    hf.load_state_dict(weights)
    with torch.no_grad():
        assert (model(ids) - hf(input_ids=ids).logits).abs().max().item() <= 1e-4
        for i in range(2):
            for p in ("q_proj", "k_proj"):
                w = model.state_dict()[f"layers.{i}.attn.{p}.weight"]
                hf.state_dict()[f"model.layers.{i}.self_attn.{p}.weight"].copy_(w)  # unpermuted
        assert (model(ids) - hf(input_ids=ids).logits).abs().max().item() > 1e-2


def test_permutation_by_hand():
    # one head, Dh = 4: ours rotates pairs (0,1), (2,3); HF rotates (0,2), (1,3) -> rows 0,2,1,3
    w = torch.arange(8.0).reshape(4, 2)
    assert interleaved_to_half(w, 1).tolist() == [[0, 1], [4, 5], [2, 3], [6, 7]]
    # two heads: the permutation stays inside each head
    w = torch.arange(8.0)[:, None]
    assert interleaved_to_half(w, 2)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_tokenizer_loads_offline_with_auto_tokenizer(exported):
    _, tok, out = exported
    auto = transformers.AutoTokenizer.from_pretrained(out)
    text = "the cat sat on a red mat. <|endoftext|>"
    assert auto(text, add_special_tokens=True)["input_ids"] == tok.encode(text)  # no BOS/EOS added
    assert auto.eos_token == "<|endoftext|>" and auto.eos_token_id == tok.eos_token_id
    assert auto.pad_token_id == tok.pad_token_id
    assert auto.decode(tok.encode("Once upon a time")) == "Once upon a time"
    ours = load_tokenizer(out)  # rlpipe reads the same folder
    assert (ours.eos_token_id, ours.pad_token_id, ours.vocab_size) == (tok.eos_token_id, tok.pad_token_id,
                                                                      tok.vocab_size)


# Largest |ours - theirs| teacher-forced log-prob of the exported model, over native AVX-512, avx2 and
# default kernels: float32 rounding (logits agree within 1e-4, test_logits_match_ours); bound 1e-4.
LOGPROB_TOL = 1e-4


@pytest.mark.parametrize("params", [
    SamplingParams(n=1, temperature=0.0, max_tokens=20, min_tokens=20),
    SamplingParams(n=3, temperature=1.0, max_tokens=16, seed=7),
])
def test_each_samples_the_others_distribution(exported, decode_check, params):
    """Our model and the exported Llama run other kernels, so their samples are not compared token for
    token: each one's recorded log-probs equal the *other* model's teacher-forced log-probs of the same
    tokens, and each is well formed."""
    model, tok, out = exported
    hf = _load_hf(out)
    hf_tok = load_tokenizer(out)
    ours = generate(model, tok, PROMPTS, params)
    theirs = generate(hf, hf_tok, PROMPTS, params)
    for g, other, t in ((ours, hf, tok), (theirs, model, hf_tok)):
        policy = SimpleNamespace(model=other, tokenizer=t)
        decode_check.assert_well_formed(policy, g, params)
        gap = decode_check.max_logprob_gap(policy, g, params.temperature, params.min_tokens, params.top_p)
        assert gap <= LOGPROB_TOL, gap


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        export_hf(tmp_path / "nope.pt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_tokenizer_names_it_and_the_override(exported, tmp_path):
    model, tok, _ = exported
    save_checkpoint(tmp_path / "m.pt", model, tokenizer=str(tmp_path / "gone" / "tokenizer.json"))
    with pytest.raises(FileNotFoundError, match=r"gone/tokenizer.json.*--tokenizer"):
        export_hf(tmp_path / "m.pt", tmp_path / "out")
    save_checkpoint(tmp_path / "t.pt", model, tokenizer="tiktoken:gpt2")
    with pytest.raises(ValueError, match="tiktoken:gpt2"):
        export_hf(tmp_path / "t.pt", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    tok.save(tmp_path / "tok.json")
    assert export_hf(tmp_path / "m.pt", tmp_path / "out", tokenizer=tmp_path / "tok.json").is_dir()


def test_cli_replaces_a_previous_export_but_not_other_folders(exported, tmp_path, capsys):
    model, tok, _ = exported
    tok.save(tmp_path / "tokenizer.json")
    save_checkpoint(tmp_path / "m.pt", model, tokenizer=str(tmp_path / "tokenizer.json"))
    out = tmp_path / "export"
    assert main([str(tmp_path / "m.pt"), str(out)]) == 0
    (out / "stale.txt").write_text("from the previous export")
    assert main([str(tmp_path / "m.pt"), str(out)]) == 0
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert str(out) in capsys.readouterr().out
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="notes"):
        main([str(tmp_path / "m.pt"), str(other)])
    assert (other / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_trained_hf_policy_checkpoint_exports_as_its_own_architecture(tiny_qwen, tmp_path):
    """`rlpipe export-hf last.pt` of a run whose base was an HF directory: the trained weights, saved
    with save_pretrained, plus the base directory's tokenizer files."""
    from transformers import AutoModelForCausalLM

    from rlpipe.lm.hf_export import export_hf
    from rlpipe.lm.policy import load_policy

    policy = load_policy(tiny_qwen)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.01)  # "trained": differs from the base directory
    ckpt = tmp_path / "last.pt"
    policy.save(ckpt)
    out = export_hf(ckpt, tmp_path / "exported")
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen, local_files_only=True).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        want = policy.model.eval()(ids).logits
        got = reloaded(ids).logits
        assert torch.allclose(got, want, atol=1e-5)
        assert not torch.allclose(base(ids).logits, want, atol=1e-3)  # the export is not the base
