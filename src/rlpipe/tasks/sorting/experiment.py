"""Seed 003's lecture experiment as a replicated grid (``rlpipe toy-sort``; the table and the
figure are ``rlpipe.analysis.toy_sort``'s).

Seed 003 compares delta (advantage) modes and loss modes on its toy sorting model; the lecture shows
single runs. ``run_grid`` runs every delta mode x loss mode on several seeds (each seed changes the
model's initialisation and the sampling stream, ``SortTrainConfig.seed``) and returns the reward
per epoch and the final exact expected reward (``expected_reward``, every response enumerated, so
no sampling noise) of every run.

Departure from seed 003: its loss modes ``naive`` / ``unclipped`` / ``clipped`` run as our loss
types (``toy_model``'s docstring gives the mapping); ``no_baseline`` is added, since it ignores the
delta mode it is run once per seed (its row says so).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from rlpipe import io
from rlpipe.tasks.sorting.toy_model import SortTrainConfig, default_reward_fn, expected_reward, train_sorting

DELTA_MODES = ("rewards", "centered_rewards", "normalized_rewards", "max_rewards")
LOSS_MODES = ("no_baseline", "reinforce_with_baseline", "grpo_no_clip", "grpo_clip")


def cells() -> list[tuple[str, str]]:
    """(loss, delta) pairs; no_baseline uses raw rewards whatever the delta mode, so it runs once."""
    return [("no_baseline", "rewards")] + [(lo, d) for lo in LOSS_MODES[1:] for d in DELTA_MODES]


def run_grid(seeds: list[int], num_epochs: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every cell on every seed: (per-epoch curves, per-run final expected reward)."""
    curves, finals = [], []
    for loss, delta in cells():
        for seed in seeds:
            kw = {"num_epochs": num_epochs} if num_epochs else {}
            cfg = SortTrainConfig(advantage_mode=delta, loss_type=loss, seed=seed, **kw)
            res = train_sorting(cfg)
            curves += [{"loss": loss, "delta": delta, "seed": seed, "epoch": r.epoch, "reward": r.mean_reward}
                       for r in res.records]
            final = expected_reward(res.model, cfg.prompts, default_reward_fn())
            finals.append({"loss": loss, "delta": delta, "seed": seed, "expected_reward": final})
    return pd.DataFrame(curves), pd.DataFrame(finals)


def main(argv: list[str] | None = None) -> int:
    """``rlpipe toy-sort --curves F --finals F``: the grid's data (the workflow names the files after
    ``rlpipe.contract.TOY_SORT_DATA``); ``rlpipe toy-sort-report`` draws the table and the
    figure from them."""
    ap = argparse.ArgumentParser(prog="rlpipe toy-sort", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 6, 7])
    ap.add_argument("--epochs", type=int, default=None, help="epochs per run (default: seed 003's 100)")
    ap.add_argument("--curves", required=True, help="parquet: loss, delta, seed, epoch, reward")
    ap.add_argument("--finals", required=True, help="parquet: loss, delta, seed, expected_reward")
    a = ap.parse_args(argv)
    if any(s < 0 for s in a.seeds) or (a.epochs is not None and a.epochs < 1):
        ap.error("--seeds must be >= 0 and --epochs >= 1")
    curves, finals = run_grid(a.seeds, a.epochs)
    io.write_parquet(Path(a.curves), curves)
    io.write_parquet(Path(a.finals), finals)
    print(finals.groupby(["loss", "delta"], sort=False)["expected_reward"].mean().to_string())
    return 0
