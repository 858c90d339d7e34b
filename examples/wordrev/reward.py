"""Reward of the word-list reversal example (``train.text.reward: examples/wordrev/reward.py:reward``).

- ``format_reward`` 1: the response is one or more lowercase words separated by single spaces and
  ends with the stop ``.`` (the config keeps the stop in the response), e.g. `` road gold fish.``;
  whitespace around it is ignored.
- ``answer_reward`` 1: well formed, and the words are exactly the reversed list (the ground truth,
  the JSONL ``answer`` field).
- ``reward`` = ``answer_reward``: no partial credit, so the curve reads as "fraction of lists
  reversed exactly".
"""

from __future__ import annotations

import re

WELL_FORMED = re.compile(r"[a-z]+(?: [a-z]+)*\.")


def reward(response: str, ground_truth: str) -> dict[str, float]:
    text = response.strip()
    well_formed = WELL_FORMED.fullmatch(text) is not None
    right = well_formed and text[:-1].split() == ground_truth.split()
    return {"reward": float(right), "format_reward": float(well_formed), "answer_reward": float(right)}
