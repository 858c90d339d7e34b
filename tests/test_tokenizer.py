"""Tokenizer: trained byte-level BPE, save/load, HF tokenizer.json wrapping, tiktoken error."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpipe.lm.tokenizer import EOS_TOKEN, load_tokenizer, train_bpe

CORPUS = ["the cat sat on the mat. the dog ate the bone.", "Once upon a time the girl saw the sun.",
          "Grüße aus Köln! 日本語のテキスト。", "the the the answer is <answer>42</answer>"] * 50


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_bpe(CORPUS, 300, tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_trained_bpe_special_token_and_merges(tok):
    assert tok.eos_token_id == 0 == tok._tok.token_to_id(EOS_TOKEN)
    assert tok.pad_token_id == tok.eos_token_id
    assert 257 < tok.vocab_size <= 300
    assert len(tok.encode(" the")) == 1  # the most frequent word was merged into one token
    assert tok.encode("a" + EOS_TOKEN + "b")[1] == tok.eos_token_id  # special text maps to its id
    assert tok.decode([tok.eos_token_id]) == EOS_TOKEN


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_round_trip_arbitrary_unicode(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_encode_batch_and_decode_batch_agree_with_single(tok):
    texts = ["the cat", "", "Köln 日本"]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.decode_batch(tok.encode_batch(texts)) == texts


def test_save_and_load_file_or_directory(tok, tmp_path):
    file_tok = load_tokenizer(tok.spec)
    tok.save(tmp_path / "copy" / "tokenizer.json")
    dir_tok = load_tokenizer(tmp_path / "copy")
    for t in (file_tok, dir_tok):
        assert t.vocab_size == tok.vocab_size and t.eos_token_id == tok.eos_token_id
        assert t.encode("the dog ate Grüße") == tok.encode("the dog ate Grüße")
    assert dir_tok.spec == str(tmp_path / "copy")


def test_training_is_deterministic(tok, tmp_path):
    again = train_bpe(CORPUS, 300, tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads(open(tok.spec).read())
    assert again.encode("the girl saw the bone") == tok.encode("the girl saw the bone")


def test_wraps_a_users_hf_tokenizer_json_with_config(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<pad>": 1, "</s>": 2, "hello": 3, "world": 4}
    hf = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.add_special_tokens(["<pad>", "</s>"])
    hf.save(str(tmp_path / "tokenizer.json"))
    special = {"eos_token": "</s>", "pad_token": {"content": "<pad>"}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(special))
    t = load_tokenizer(tmp_path)
    assert (t.eos_token_id, t.pad_token_id, t.vocab_size) == (2, 1, 5)
    assert t.encode("hello world") == [3, 4]


def test_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.json"):
        load_tokenizer(tmp_path / "nothere.json")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "t.json"))
    with pytest.raises(ValueError, match="eos_token"):
        load_tokenizer(tmp_path / "t.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="bad.json"):
        load_tokenizer(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="257"):
        train_bpe(["x"], 100, tmp_path / "small.json")


def test_tiktoken_never_downloads_and_fails_clearly(tmp_path, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # empty cache even where tiktoken is installed
    with pytest.raises(RuntimeError, match="tiktoken") as err:
        load_tokenizer("tiktoken:gpt2")
    assert "download" in str(err.value)
