"""``rlpipe train`` rejects every bad input before Ray starts, naming the key or the file.

Each case runs ``rlpipe.trainer.run.main([...])`` and checks the message (exit status 2, the
usage error) and that no Ray instance and no actor was started and the run directory was not
created. This module does not use the ``ray_session`` fixture: Ray must be down here. When other
modules of the session started Ray before this one, ``ray.is_initialized()`` cannot tell, so the
``no_ray`` fixture also makes starting Ray or driving a run fail loudly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlpipe.lm.checkpoint import save_payload
from rlpipe.trainer import run as run_module


def _base_with(tmp: Path, base: str, **changes) -> Path:
    payload = torch.load(base, weights_only=True)
    payload.update(changes)
    out = tmp / "variant_base.pt"
    save_payload(out, payload)
    return out


def _poisoned(tmp: Path, base: str) -> Path:
    payload = torch.load(base, weights_only=True)
    key = next(iter(payload["model"]))
    payload["model"][key][0] = float("nan")
    save_payload(tmp / "poisoned.pt", payload)
    return tmp / "poisoned.pt"


def _dataset(tmp: Path, good: str, split: str, lines: list[str]) -> Path:
    d = tmp / "dataset"
    shutil.copytree(good, d)
    (d / f"{split}.jsonl").write_text("".join(line + "\n" for line in lines))
    return d


GOOD = json.dumps({"prompt": "Write a story that includes the word: cat\n", "keywords": ["cat"]})

# case: (how to break the inputs -> (config overrides, variant, base, dataset), expected message parts)
CASES = {
    "bad config value": (lambda t, b, d, w: (w(t / "c.yaml", train={"learning_rate": -1.0}), "onpolicy", b, d),
                         ["c.yaml", "train.learning_rate", "must be > 0", "-1.0"]),
    "unknown key": (lambda t, b, d, w: (w(t / "c.yaml", train={"lerning_rate": 1.0}), "onpolicy", b, d),
                    ["train.lerning_rate"]),
    "unknown variant": (lambda t, b, d, w: (w(t / "c.yaml"), "nope", b, d), ["unknown variant 'nope'", "onpolicy"]),
    "missing base": (lambda t, b, d, w: (w(t / "c.yaml"), "onpolicy", str(t / "none.pt"), d),
                     ["--base", "none.pt", "not found"]),
    "broken base file": (lambda t, b, d, w: (w(t / "c.yaml"), "onpolicy", _text(t / "bad.pt", "not a checkpoint"), d),
                         ["bad.pt", "not a torch checkpoint file", "not a checkpoint"]),
    "poisoned base": (lambda t, b, d, w: (w(t / "c.yaml"), "onpolicy", str(_poisoned(t, b)), d),
                      ["poisoned.pt", "non-finite", "token_embeddings.weight"]),
    "tokenizer missing": (lambda t, b, d, w: (w(t / "c.yaml"), "onpolicy",
                                              str(_base_with(t, b, tokenizer=str(t / "gone" / "tokenizer.json"))), d),
                          ["variant_base.pt", "gone/tokenizer.json", "does not exist"]),
    "missing dataset": (lambda t, b, d, w: (w(t / "c.yaml"), "onpolicy", b, str(t / "nodata")),
                        ["--dataset", "nodata/train.jsonl", "not found"]),
    "malformed dataset line": (lambda t, b, d, w: (w(t / "c.yaml"), "onpolicy", b,
                                                   str(_dataset(t, d, "train", [GOOD, "{\"prompt\": \"x\", "]))),
                               ["dataset/train.jsonl:2", "not JSON"]),
    "record without keywords": (lambda t, b, d, w: (w(t / "c.yaml"), "onpolicy", b,
                                                    str(_dataset(t, d, "val", [GOOD, GOOD, '{"prompt": "x"}']))),
                                ["dataset/val.jsonl:3", "'keywords'"]),
    "keyword of a million digits": (lambda t, b, d, w: (w(t / "c.yaml"), "onpolicy", b, str(_dataset(
        t, d, "train", [GOOD, json.dumps({"prompt": "x\n", "keywords": ["cat", "7" * 10**6]})]))),
                                    ["dataset/train.jsonl:2", "'7777777", "has 1000000 characters", "at most 100"]),
    "validation prompt longer than the context": (lambda t, b, d, w: (w(t / "c.yaml"), "onpolicy", b, str(_dataset(
        t, d, "val", [GOOD, json.dumps({"prompt": "cat " * 10**5, "keywords": ["cat"]})]))),
        ["dataset/val.jsonl:2", "400000 characters", "does not fit the model's context length",
         "train.sampling_max_tokens"]),
    "math record without a problem": (lambda t, b, d, w: (w(t / "c.yaml", train={"task": "math"}), "onpolicy", b,
                                                          _math_dataset(t, ['{"question": "1+1?", "answer": "2"}'])),
                                      ["train.jsonl:1", "problem"]),
}


FIXTURE = Path(__file__).parent / "data" / "math_fixture.jsonl"


def _math_dataset(tmp: Path, train_lines: list[str]) -> str:
    d = tmp / "math"
    d.mkdir()
    (d / "train.jsonl").write_text("".join(line + "\n" for line in train_lines))
    shutil.copy(FIXTURE, d / "val.jsonl")
    return str(d)


def _text(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_before_ray_naming_the_key_or_file(case, tmp_path, tiny_base, write_config, no_ray, capsys):
    make, expected = CASES[case]
    cfg, variant, base, dataset = make(tmp_path, tiny_base[0], tiny_base[1], write_config)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        run_module.main(["--config", str(cfg), "--variant", variant, "--out", str(out), "--base", base,
                         "--dataset", dataset])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    for part in expected:
        assert part in err, (part, err)
    assert "Traceback" not in err and "ActorDiedError" not in err
    assert not out.exists()  # nothing was written: the lock and the resume decision come after the checks
