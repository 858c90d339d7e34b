"""Tokenizers: a byte-level BPE we train, a user's HuggingFace ``tokenizer.json``, or tiktoken.

HW1 trains its own byte-level BPE with ``<|endoftext|>``; seed 000's skeleton uses GPT-2's
vocabulary (50257). rlpipe trains the BPE with the ``tokenizers`` library (fast, deterministic,
saved as a standard ``tokenizer.json``) instead of a hand-written trainer, and wraps every kind of
tokenizer in one ``Tokenizer`` interface:

- ``train_bpe(texts, vocab_size, out_path)``: GPT-2 style byte-level BPE (regex pre-split, byte
  alphabet, ``<|endoftext|>`` as the only special token, id 0). Byte-level, so any unicode string
  round-trips through ``encode``/``decode``.
- ``load_tokenizer(spec)``: ``spec`` is a ``tokenizer.json`` file, a directory holding one (a
  ``tokenizer_config.json`` beside it may name ``eos_token``/``pad_token``, as HF model folders
  such as Qwen 2.5 Math do), or ``"tiktoken:gpt2"``. tiktoken is imported lazily and only used when
  its encoding files are already in tiktoken's cache: rlpipe never downloads anything, so a
  missing package or cache is a clear error, not a network call.

Conventions: ``encode`` adds no special tokens (templates are plain text) but special-token text
such as ``"<|endoftext|>"`` inside the input maps to its id; ``decode`` keeps special tokens, so
``decode(encode(s)) == s``. ``eos_token_id`` is ``<|endoftext|>`` unless tokenizer_config.json
names another; ``pad_token_id`` is the tokenizer's pad token if it has one, else ``eos_token_id``
(padding is always masked out, so sharing the id with EOS is harmless).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from rlpipe.config import load_config
from rlpipe.io import atomic_path
from rlpipe.lm.documents import read_documents

EOS_TOKEN = "<|endoftext|>"
TIKTOKEN_PREFIX = "tiktoken:"


class Tokenizer:
    """Wraps a ``tokenizers.Tokenizer``. ``spec`` is the string that ``load_tokenizer`` reloads it from."""

    def __init__(self, backend, *, spec: str, eos_token: str = EOS_TOKEN, pad_token: str | None = None):
        self._tok = backend
        self.spec = spec
        self.eos_token_id = self._token_id(eos_token, "eos_token")
        self.pad_token_id = self.eos_token_id if pad_token is None else self._token_id(pad_token, "pad_token")
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    def _token_id(self, token: str, role: str) -> int:
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise ValueError(f"tokenizer {self.spec!r} has no {role} {token!r} in its vocabulary")
        return tid

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self._tok.decode(_as_list(ids), skip_special_tokens=False)

    def decode_batch(self, batch: Sequence) -> list[str]:
        return self._tok.decode_batch([_as_list(ids) for ids in batch], skip_special_tokens=False)

    def save(self, path: str | os.PathLike) -> None:
        with atomic_path(path) as tmp:
            self._tok.save(str(tmp))

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(spec={self.spec!r}, vocab_size={self.vocab_size}, eos={self.eos_token_id})"


class TiktokenTokenizer(Tokenizer):
    """The same interface over a ``tiktoken.Encoding`` (e.g. GPT-2's 50257-token vocabulary)."""

    def __init__(self, encoding, *, spec: str):
        self._tok = encoding
        self.spec = spec
        self.eos_token_id = encoding.eot_token
        self.pad_token_id = self.eos_token_id
        self.vocab_size = encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, allowed_special="all")

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._tok.encode_batch(list(texts), allowed_special="all")

    def decode(self, ids) -> str:
        return self._tok.decode(_as_list(ids))

    def decode_batch(self, batch: Sequence) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def save(self, path) -> None:
        raise NotImplementedError("tiktoken encodings are referenced by name ('tiktoken:gpt2'), not saved")


def _as_list(ids) -> list[int]:
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def train_bpe(texts: Iterable[str], vocab_size: int, out_path: str | os.PathLike) -> Tokenizer:
    """Train a byte-level BPE with ``<|endoftext|>`` (id 0); write ``out_path`` atomically.

    ``vocab_size`` counts the 256 byte tokens and the special token; the trainer stops earlier
    if the corpus offers fewer merges, so read ``.vocab_size`` off the result.
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 257:
        raise ValueError(f"vocab_size must be >= 257 (256 bytes + <|endoftext|>), got {vocab_size}")
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out = Tokenizer(tok, spec=str(out_path))
    out.save(out_path)
    return out


def load_tokenizer(spec: str | os.PathLike) -> Tokenizer:
    """Load a ``tokenizer.json`` file, a directory holding one, or ``"tiktoken:<encoding>"``."""
    if isinstance(spec, Tokenizer):
        return spec
    text = str(spec)
    if text.startswith(TIKTOKEN_PREFIX):
        return _load_tiktoken(text[len(TIKTOKEN_PREFIX) :])
    path = Path(text)
    if path.is_dir():
        folder, path = path, path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer directory {folder} holds no tokenizer.json")
    elif not path.is_file():
        raise FileNotFoundError(
            f"tokenizer file {path} does not exist (expected tokenizer.json, a dir, or 'tiktoken:gpt2')"
        )
    from tokenizers import Tokenizer as HFTokenizer

    try:
        backend = HFTokenizer.from_file(str(path))
    except Exception as e:  # the Rust error says what is wrong in the JSON; name the file too
        raise ValueError(f"cannot read tokenizer file {path}: {e}") from e
    eos, pad = _special_tokens_from_config(path.parent / "tokenizer_config.json")
    return Tokenizer(backend, spec=text, eos_token=eos or EOS_TOKEN, pad_token=pad)


def _special_tokens_from_config(config_path: Path) -> tuple[str | None, str | None]:
    """eos/pad token strings from an HF ``tokenizer_config.json`` beside tokenizer.json, if any."""
    if not config_path.is_file():
        return None, None
    cfg = json.loads(config_path.read_text(encoding="utf-8"))

    def content(v):
        return v.get("content") if isinstance(v, dict) else v

    return content(cfg.get("eos_token")), content(cfg.get("pad_token"))


_TIKTOKEN_BLOB = "https://openaipublic.blob.core.windows.net"


def _tiktoken_files(name: str) -> list[str]:
    """The files tiktoken would fetch for ``name`` (we only check its cache for them)."""
    if name == "gpt2":
        base = f"{_TIKTOKEN_BLOB}/gpt-2/encodings/main"
        return [f"{base}/vocab.bpe", f"{base}/encoder.json"]
    return [f"{_TIKTOKEN_BLOB}/encodings/{name}.tiktoken"]


def _load_tiktoken(name: str) -> Tokenizer:
    try:
        import tiktoken
    except ImportError as e:
        raise RuntimeError(
            f"load_tokenizer('tiktoken:{name}') needs the 'tiktoken' package, which is not installed; "
            "install it and place the encoding in its cache (TIKTOKEN_CACHE_DIR) on a machine with network, "
            "or pass a tokenizer.json instead (rlpipe never downloads tokenizers)"
        ) from e
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    cached = [os.path.join(cache_dir, hashlib.sha1(u.encode()).hexdigest()) for u in _tiktoken_files(name)]
    missing = [u for u, f in zip(_tiktoken_files(name), cached, strict=True) if not os.path.isfile(f)]
    if missing:
        raise RuntimeError(
            f"tiktoken encoding {name!r} is not in the local cache {cache_dir} (missing {missing}); "
            "rlpipe never downloads: fill the cache offline (set TIKTOKEN_CACHE_DIR) or use a tokenizer.json"
        )
    return TiktokenTokenizer(tiktoken.get_encoding(name), spec=f"{TIKTOKEN_PREFIX}{name}")


def train_tokenizer_main(argv: list[str] | None = None) -> int:
    """``rlpipe train-tokenizer``: byte-level BPE of ``tokenizer.vocab_size`` on the corpus (here, not
    beside the pretraining: this command needs no torch)."""
    ap = argparse.ArgumentParser(prog="rlpipe train-tokenizer", description=train_tokenizer_main.__doc__)
    ap.add_argument("--config", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True, help="tokenizer.json to write")
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    if not Path(args.corpus).is_file():
        raise FileNotFoundError(f"--corpus: {args.corpus} not found (build it with `rlpipe build-corpus`)")
    tok = train_bpe(read_documents(args.corpus), cfg.tokenizer.vocab_size, args.out)
    print(f"train-tokenizer: vocab {tok.vocab_size} -> {args.out}")
    return 0
