"""A family's written answer: 2-5 sentences of trend, size, mechanism and caveat, from family.json.

``answer(numbers)`` reads the numbers ``rlpipe.analysis.families`` writes (``family.json``: the
per-variant table, the comparisons with their verdicts, the health signals' first- and last-fifth
means, the mechanism checks) and writes the prose seeds 001/004 ask for ("comment on the findings,
including any other metrics that have a noticeable trend"):

1. the trend: which variant ends highest and lowest (along the sweep axis when there is one), variants
   that read the same at the printed precision named as a tie, never ranked;
2. the size: the largest gap to the reference with its 95% interval, and its verdict from the one
   honesty rule (``rlpipe.analysis.findings``: replicated, beyond the interval, not contended);
3. collapses: a variant that diverged, with its entropy before and after;
4. the mechanism: the health signal that differs most between variants at the end of training
   (at least ``SIGNAL_GAP`` times), then each expected effect of the varied setting, stated as
   shown only when the runs show its direction (``rlpipe.analysis.expectations``), and a grad
   norm that collapsed to about 0 (below ``STALLED`` of its start) with its cause;
5. the caveat: the mechanism checks that fired (the comparison cannot answer its question here),
   and the number of seeds.

Departure from the seeds: a human writes this judgement from the curves; ours is computed, so each
claim is one the numbers carry, and a difference the rule calls noise is never called an effect.
"""

from __future__ import annotations

import math

from rlpipe.analysis.expectations import PREFIX_NOT_SHOWN, PREFIX_SHOWN
from rlpipe.analysis.findings import FINDING, UNREPLICATED, Verdict
from rlpipe.analysis.kl_text import KL_GROWTH
from rlpipe.analysis.stats import interval_phrase
from rlpipe.contract import HEALTH_COLUMNS

SIGNAL_GAP = 1.5  # largest / smallest end value of a health signal before it is named
SIGNALS = ("optim/grad_norm", "policy/entropy", "response/length_mean", "loss/clip_frac")
STALLED = 0.01  # a grad norm whose last fifth is below this fraction of its first fifth has collapsed
ALL_TIED = 0.99  # zero-std group fraction at which every group gave one reward to all its responses


def _fmt(x, spec: str = ".3f") -> str:
    return "n/a" if not isinstance(x, (int, float)) or not math.isfinite(x) else format(x, spec)


def _final(v: dict) -> str:
    ci = v.get("val_reward_final_ci")
    tail = f" ± {_fmt(ci)}" if isinstance(ci, (int, float)) and math.isfinite(ci) else ", one seed"
    return _fmt(v.get("val_reward_final_mean")) + tail


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def tied_with(vs: dict, key: str) -> list[str]:
    """The variants whose final reward reads the same as ``key``'s at the precision printed: a tie."""
    shown = _fmt(vs[key]["val_reward_final_mean"])
    return [k for k in vs if _fmt(vs[k]["val_reward_final_mean"]) == shown]


def _ranking(vs: dict) -> str:
    """Highest and lowest, with ties named as ties (at the printed precision); a variant's name
    opens the sentence as it is spelt."""
    ranked = sorted(vs, key=lambda k: -vs[k]["val_reward_final_mean"])
    top, bottom = tied_with(vs, ranked[0]), tied_with(vs, ranked[-1])
    if len(top) == len(vs):
        return f"All {len(vs)} variants end tied ({_fmt(vs[ranked[0]]['val_reward_final_mean'])})"

    def end(group: list[str], which: str) -> str:
        value = _final(vs[group[0]]) if len(group) == 1 else _fmt(vs[group[0]]["val_reward_final_mean"])
        return (f"{group[0]} ends {which} ({value})" if len(group) == 1
                else f"{_names(group)} tie {which} ({value} each)")
    return f"{end(top, 'highest')} and {end(bottom, 'lowest')}"


def trend_sentence(numbers: dict) -> str | None:
    vs = {k: v for k, v in (numbers.get("variants") or {}).items()
          if isinstance(v.get("val_reward_final_mean"), (int, float)) and math.isfinite(v["val_reward_final_mean"])}
    if len(vs) < 2:
        return None
    x = numbers.get("x")
    if x and all(isinstance(v.get("x"), (int, float)) for v in vs.values()):
        order = sorted(vs, key=lambda k: vs[k]["x"])
        best = max(order, key=lambda k: vs[k]["val_reward_final_mean"])
        tied = [k for k in order if k in tied_with(vs, best)]
        where = ("at the smallest" if best == order[0] else "at the largest" if best == order[-1]
                 else "in the middle of the range")
        peak = (f"it peaks {where} ({x} = {vs[best]['x']:g})" if len(tied) == 1 else
                f"{len(tied)} settings tie at its highest ({x} = "
                + ", ".join(f"{vs[k]['x']:g}" for k in tied) + ")")
        return (f"Along {x}, the final validation reward is "
                + ", ".join(f"{vs[k]['x']:g}: {_final(vs[k])}" for k in order) + f"; {peak}.")
    ns = [vs[k].get("val_reward_final_n") or vs[k].get("replicates") for k in vs]
    return f"{_ranking(vs)} in final validation reward ({interval_phrase(ns)})."


def size_sentence(numbers: dict) -> str | None:
    comps = [c for c in numbers.get("comparisons") or [] if isinstance(c.get("reward_diff"), (int, float))
             and math.isfinite(c["reward_diff"])]
    if not comps:
        return None
    ref = numbers.get("reference")
    c = max(comps, key=lambda c: abs(c["reward_diff"]))
    verdict = Verdict(c["reward_verdict"] == FINDING, c["reward_verdict"])
    ci = c.get("reward_ci")
    interval = (f" [{c['reward_diff'] - ci:+.3f}, {c['reward_diff'] + ci:+.3f}]"
                if isinstance(ci, (int, float)) and math.isfinite(ci) and c["reward_verdict"] != UNREPLICATED else "")
    found = [k["variant"] for k in comps if k["reward_verdict"] == FINDING]
    tail = (f" Findings against {ref}: {', '.join(found)}." if found else
            f" No variant's final reward differs from {ref} as a finding, so the ranking above is not one.")
    return (f"The largest gap to the reference {ref} is {c['variant']}'s {c['reward_diff']:+.3f}{interval}, "
            f"{verdict.clause()}." + tail)


def collapse_sentence(numbers: dict) -> str | None:
    health, parts, single = numbers.get("health") or {}, [], False
    for v, row in (numbers.get("variants") or {}).items():
        if not row.get("diverged"):
            continue
        ent = (health.get(v) or {}).get("policy/entropy")
        ent_txt = f", entropy {_fmt(ent[0], '.3g')} → {_fmt(ent[1], '.3g')}" if ent else ""
        parts.append(f"{v} diverged in {row['diverged']} of {row.get('replicates')} seeds (final reward "
                     f"{_final(row)}{ent_txt})")
        single = single or (row.get("replicates") or 0) < 2
    if not parts:
        return None
    return "; ".join(parts) + "." + (" With one seed this is an observation of that run, not a finding."
                                     if single else "")


def signal_sentence(numbers: dict) -> str | None:
    health, found = numbers.get("health") or {}, []
    for column in SIGNALS:
        ends = {v: h[column][1] for v, h in health.items() if column in h and h[column][1] > 0}
        if len(ends) >= 2:
            hi, lo = max(ends, key=ends.get), min(ends, key=ends.get)
            if ends[hi] / ends[lo] >= SIGNAL_GAP:
                found.append((ends[hi] / ends[lo], column, hi, lo, ends))
    if not found:
        return ("No health signal (grad norm, entropy, response length, clip fraction) differs by "
                f"{SIGNAL_GAP}x or more between variants at the end of training." if health else None)
    parts = [f"{HEALTH_COLUMNS[c]}: {hi} {_fmt(e[hi], '.3g')} vs {lo} {_fmt(e[lo], '.3g')} ({g:.1f}x)"
             for g, c, hi, lo, e in sorted(found, key=lambda t: -t[0])[:2]]
    return ("The health signals that differ most between variants over the last fifth of steps (seed means, no "
            "interval) are " + "; and ".join(parts) + ".")


def expected_sentences(numbers: dict) -> list[str]:
    """The family page's expected-effect sentences (``rlpipe.analysis.expectations``): each names a
    direction and says whether the runs show it; and, where the family varies the KL penalty, each
    variant's KL growth (``rlpipe.analysis.kl_text.kl_growth_sentence``)."""
    return [s for s in numbers.get("sentences") or [] if s.startswith((PREFIX_SHOWN, PREFIX_NOT_SHOWN, KL_GROWTH))]


def stalled_sentence(numbers: dict) -> str | None:
    """A grad norm that collapsed to about 0, with what the zero-std group fraction says about why."""
    parts = []
    for v, h in (numbers.get("health") or {}).items():
        first, last = (h.get("optim/grad_norm") or [math.nan, math.nan])[:2]
        if not (isinstance(first, (int, float)) and first > 0 and isinstance(last, (int, float))
                and last < STALLED * first):
            continue
        tied = (h.get("reward/zero_std_frac") or [math.nan, math.nan])[1]
        why = ("its zero-std group fraction ended at " + _fmt(tied, ".2f") + ": every group gave one reward to all "
               "its responses, so every advantage and hence the gradient was 0 and learning stopped"
               if isinstance(tied, (int, float)) and tied >= ALL_TIED else
               "a gradient near 0 needs advantages near 0, that is groups whose responses all got the same reward"
               + (f"; its zero-std group fraction ended at {_fmt(tied, '.2f')}, so that explains only part of it"
                  if isinstance(tied, (int, float)) and math.isfinite(tied) else
                  " (the zero-std group fraction was not logged, so this is not checked)"))
        parts.append(f"{v}'s grad norm collapsed from {_fmt(first, '.3g')} to {_fmt(last, '.3g')} (first vs last "
                     f"fifth of steps): {why}")
    return "; ".join(parts) + "." if parts else None


def caveat_sentence(numbers: dict) -> str:
    checks = [s.split(". ")[0].removeprefix("Mechanism check: ") for s in numbers.get("sentences") or []
              if s.startswith("Mechanism check:")]
    n = numbers.get("replicates")
    seeds = ("Each variant ran on one seed, so nothing here is replicated." if n == 1 else
             f"Each variant ran on {n} seeds.")
    if not checks:
        return seeds
    return (seeds + " Caveat: this comparison cannot fully answer its question at this scale, because "
            + "; and ".join(checks) + " (the family page names the settings that would).")


def answer(numbers: dict) -> list[str]:
    """The family's written answer (see the module docstring); never empty."""
    out = [s for s in (trend_sentence(numbers), size_sentence(numbers), collapse_sentence(numbers),
                       signal_sentence(numbers), *expected_sentences(numbers), stalled_sentence(numbers)) if s]
    if not out:
        out = [f"No data: no variant of {numbers.get('family')} logged a final validation reward."]
    return out + [caveat_sentence(numbers)]
