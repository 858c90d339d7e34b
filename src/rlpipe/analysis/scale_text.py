"""How far a family's runs are scaled down from the seeds' protocols, computed from the config.

The seeds size their MATH experiments for H100s: seed 001's default hyperparameters are 200 GRPO
steps (rollout batches) of 256 rollouts, and seed 004's off-policy sweep fixes
``rollout_batch_size = 256`` and asks for a broad sweep of fewer than 50 GRPO steps, then a
focused sweep of 200 steps. The families run far smaller versions on 2 CPU cores; every answer
of a math-track family says so, with the ratio computed from the settings its runs resolved
(``family.json`` ``variants.<v>.settings``), never typed.
"""

from __future__ import annotations

SEED_STEPS = 200  # seed 001 n_grpo_steps (and seed 004's focused sweep)
SEED_ROLLOUT_BATCH = 256  # seed 001 rollout_batch_size (fixed in seed 004's sweep)
SEED_BROAD_STEPS = 50  # seed 004: the broad sweep runs fewer than this many GRPO steps


def _settings(numbers: dict) -> dict[str, dict]:
    return {v: row.get("settings") or {} for v, row in (numbers.get("variants") or {}).items()}


def _span(values: list) -> str:
    vals = sorted({v for v in values if isinstance(v, (int, float))})
    if not vals:
        return "n/a"
    return f"{vals[0]:g}" if len(vals) == 1 else f"{vals[0]:g} to {vals[-1]:g}"


def scale_sentence(numbers: dict) -> str | None:
    """'Scaled down from seed 001's hyperparameters: ...' for a math-task family (None otherwise)."""
    s = _settings(numbers)
    if not s or not all(x.get("task") == "math" for x in s.values()):
        return None
    steps = [x.get("n_grpo_steps") for x in s.values()]
    batch = [x.get("rollout_batch_size") for x in s.values()]
    if not all(isinstance(v, int) for v in steps + batch):
        return None
    frac_steps = max(steps) / SEED_STEPS
    frac_rollouts = max(a * b for a, b in zip(steps, batch, strict=True)) / (SEED_STEPS * SEED_ROLLOUT_BATCH)
    return (f"Scaled down: each run took {_span(steps)} GRPO steps of {_span(batch)} rollouts, against seed 001's "
            f"{SEED_STEPS} steps of {SEED_ROLLOUT_BATCH}: at most {100 * frac_steps:.0f}% of its steps and "
            f"{100 * frac_rollouts:.1f}% of its rollouts, so what holds here may not hold at the seed's scale.")


def offpolicy_protocol_sentence(numbers: dict) -> str | None:
    """Seed 004's broad-then-focused off-policy sweep against the one sweep this run made."""
    s = _settings(numbers)
    if not s:
        return None
    steps = [x.get("n_grpo_steps") for x in s.values()]
    batch = [x.get("rollout_batch_size") for x in s.values()]
    if not all(isinstance(v, int) for v in steps + batch):
        return None
    epochs = _span([x.get("epochs_per_rollout_batch") for x in s.values()])
    tb = _span([x.get("train_batch_size") for x in s.values()])
    n = max(steps)
    stage = ("within the seed's broad-sweep length" if n < SEED_BROAD_STEPS else
             f"{100 * n / SEED_STEPS:.0f}% of the focused sweep's length")
    return (f"Scaled-down protocol: seed 004 fixes rollout_batch_size = {SEED_ROLLOUT_BATCH} and asks for a broad "
            f"sweep of fewer than {SEED_BROAD_STEPS} GRPO steps, then a focused sweep of {SEED_STEPS} steps around "
            f"the best; this run made one sweep of {len(s)} variants (epochs_per_rollout_batch {epochs} x "
            f"train_batch_size {tb}) of {_span(steps)} GRPO steps ({stage}) with rollout_batch_size {_span(batch)} "
            f"({100 * max(batch) / SEED_ROLLOUT_BATCH:.1f}% of {SEED_ROLLOUT_BATCH}), and no focused second stage. "
            "The ranges were chosen so that every variant fits the default run's budget on 2 CPU cores "
            "(config/config.yaml, families.offpolicy_sweep).")
