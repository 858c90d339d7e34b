"""Written answers of the systems questions (seed 000 Problems 5-10, seed 002 Problem 11), the
experiment families (seeds 001/004), seed 003's toy sorting and seed 004's written-only question.

The systems answers are the main discussion's computed sections (``rlpipe.analysis.report_text``,
read back from ``summary/discussion.json``); the ``systems`` family's answer follows once, under
seed 000 Problem 7, introduced by what its seed count allows ("one seed per variant" below two).
The family answers are ``rlpipe.analysis.family_answer``'s, with how far each is scaled down from
the seeds' protocols (``rlpipe.analysis.scale_text``). Every answer says plainly what did not run
instead of being empty.

Departure from the seeds: seed 004's length-normalisation question is answered without an
experiment, as asked, but closes with what this run's response lengths imply for its own
comparison.
"""

from __future__ import annotations

from rlpipe.analysis.answers_math import not_run_note, track_name
from rlpipe.analysis.family_answer import answer as family_answer
from rlpipe.analysis.results_view import ResultsView
from rlpipe.analysis.scale_text import scale_sentence
from rlpipe.analysis.stats import seeds_phrase
from rlpipe.analysis.text_format import fnum


def _not_run(what: str) -> list[str]:
    return [f"Not run: {what} is not in these results."]


def sections_answer(view: ResultsView, *ids: str) -> list[str]:
    """The sentences of the main discussion's sections ``ids``."""
    out = [s for sid in ids for s in (view.section(sid) or {}).get("sentences", [])]
    return out or _not_run("the keyword track's runs (results/summary/discussion.json)")


def systems_family_sentences(view: ResultsView) -> list[str]:
    """The systems family's answer, once, introduced by what its seed count allows: "over N seeds"
    only when every variant has two or more, else "one seed per variant, not a replication"."""
    fam = view.families.get("systems")
    if not fam:
        return []
    ns = [v.get("val_reward_final_n") or v.get("replicates") or 0 for v in (fam.get("variants") or {}).values()]
    ns = [n for n in ns if n] or [fam.get("replicates") or 0]
    head = (f"The systems family over {min(ns)} seeds per variant:" if min(ns) >= 2 else
            "The systems family ran one seed per variant, so this is a measurement, not a replication:"
            if max(ns) < 2 else f"The systems family ({seeds_phrase(ns)}):")
    return [head + " " + " ".join(fam.get("answer") or family_answer(fam))]


def _sps_sentence(view: ResultsView, said: str = "") -> list[str]:
    """Seed 000 Problem 7's samples/s in words, unless the k-step section (``said``) states them all
    already: the reference and each colocated_k variant, each contended one marked "contended,
    indicative only"."""
    t = view.runs
    if not len(t) or not {"variant", "mode", "samples_per_s"} <= set(t.columns):
        return []
    ks = t[t["mode"] == "colocated_k"].sort_values("k") if "k" in t.columns else t[t["mode"] == "colocated_k"]
    sync = t[t["mode"] == "colocated_sync"]
    if "speedup_vs_ref" in t.columns and (sync["speedup_vs_ref"] == 1.0).any():
        sync = sync[sync["speedup_vs_ref"] == 1.0]
    rows = [*sync.head(1).to_dict("records"), *ks.to_dict("records")]
    if len(rows) < 2 or all(f"{fnum(r['samples_per_s'])} samples/s" in said for r in rows[1:]):
        return []  # the k-step section states them itself

    def one(r: dict) -> str:
        busy = bool(r.get("contended"))
        load = r.get("load_avg_max")
        mark = (f" (contended, indicative only: load average up to {load:.1f})" if busy and isinstance(load, float)
                and load == load else " (contended, indicative only)" if busy else "")
        return f"{r['variant']} {fnum(r['samples_per_s'])}{mark}"
    return ["Samples per second, one run each: " + "; ".join(one(r) for r in rows) + "."]


def kstep_answer(view: ResultsView) -> list[str]:
    """Seed 000 Problem 7 (and seed 002 Problem 9): the k-step section, the samples/s in words, and
    the systems family's answer (given here once, not under every systems question)."""
    out = sections_answer(view, "kstep")
    if out[0].startswith("Not run"):
        return out
    return out + _sps_sentence(view, " ".join(out)) + systems_family_sentences(view)


STRATEGY = {"uniform": "uniformly at random", "recency": "most recent first (recency-weighted)"}


def replay_answer(view: ResultsView) -> list[str]:
    """Seed 002 Problem 11: the aging and sampling strategy from the replay run's settings, then the
    comparison with the standard disaggregated run."""
    r = view.replay
    strategy = ([f"Aging and sampling in '{r.get('variant')}': the buffer holds up to {r.get('capacity_groups')} "
                 f"scored prompt groups, evicts the oldest first (FIFO) and drops any group generated more than "
                 f"{r.get('max_age')} policy versions ago; the learner samples its batches "
                 f"{STRATEGY.get(r.get('strategy'), r.get('strategy'))} from what remains."] if r else [])
    return strategy + sections_answer(view, "replay")


SPEED_PREFIXES = ("Samples/s relative to", "Share of the driver's step time")


def family(name: str, *, speed: bool = False, protocol=None, target_note: bool = False):
    """The answer function of family ``name``: its family.json ``answer`` (else computed from it),
    how far it is scaled down from the seeds (``rlpipe.analysis.scale_text``; ``protocol``: a
    function of family.json giving the seed protocol it scales down), and with ``speed`` the
    family page's samples/s and step-time-share sentences (for questions that ask about runtime);
    ``target_note``: say that Qwen2.5-Math on MATH did not run (once, where the seed sets its target)."""
    def answer(view: ResultsView) -> list[str]:
        fam = view.families.get(name)
        if fam is None:
            return _not_run(f"the {name} family (results/families/{name}, see workflow.families)")
        out = list(fam.get("answer") or family_answer(fam))
        if speed:
            out += [s for s in fam.get("sentences") or [] if s.startswith(SPEED_PREFIXES)]
        scale = (protocol or scale_sentence)(fam)
        out += [scale] if scale else []
        tasks = {(row.get("settings") or {}).get("task") for row in (fam.get("variants") or {}).values()}
        math_track = tasks == {"math"} if tasks - {None} else bool(view.evals or view.math)
        if math_track:  # say what it trained on
            out.insert(0, f"Trained on {track_name(view)}.")
            note = not_run_note(view) if target_note else ""
            out += [note] if note else []
        return out
    answer.__name__ = f"family_{name}"
    return answer


def toy_sort_answer(view: ResultsView) -> list[str]:
    tab = view.toy_sort
    if not len(tab):
        return _not_run("seed 003's toy-sorting grid (results/toy_sort, workflow.toy_sort_seeds)")
    best = tab.loc[tab["final_mean"].idxmax()]
    below = tab[tab["below_best"].astype(bool)]
    same = tab[~tab["below_best"].astype(bool) & ((tab["loss"] != best["loss"]) | (tab["delta"] != best["delta"]))]
    by_loss = tab.groupby("loss")["final_mean"].mean().sort_values(ascending=False)
    out = [f"Seed 003's toy sorting (non-autoregressive toy model, exact expected reward, maximum 5): the best cell is "
           f"{best['loss']} with {best['delta']} deltas ({best['final_mean']:.3f} ± {best['final_ci']:.3f}, "
           f"{int(best['seeds'])} seeds).",
           "Averaged over delta modes, the losses rank " + ", ".join(f"{k} {v:.3f}" for k, v in by_loss.items()) + "."]
    if len(below):
        out.append(f"{len(below)} of {len(tab)} cells end below the best beyond the Welch 95% interval (findings): "
                   + ", ".join(f"{r.loss}/{r.delta}" for r in below.itertuples()) + ".")
    if len(same):
        out.append(f"{len(same)} cells are within replicate noise of the best, so their differences from it are not "
                   "findings.")
    return out


def length_norm_written(view: ResultsView) -> list[str]:
    """Seed 004 think_about_length_normalization: pros and cons without an experiment."""
    short, long_, c = 4, 7, 7  # the seed's example: responses of 4 and 7 tokens, constant = max length
    out = [f"masked_mean averages each response's per-token losses, so every response carries the same total "
           f"weight and each token of a {short}-token response gets 1/{short} = {1 / short:.3f} of it against "
           f"1/{long_} = {1 / long_:.3f} in a {long_}-token one; masked_normalize sums and divides by a constant "
           f"(here {c}), so every token gets 1/{c} = {1 / c:.3f} whatever its response's length.",
           "Pros of masked_mean: the loss scale does not depend on how long responses are, so the step size is "
           "steady as lengths change. Cons: per token it pushes short responses harder, so with a negative "
           "advantage a long wrong response is penalised less per token than a short one, a bias towards long "
           "wrong answers (Liu et al.'s length bias), and a token's credit depends on its neighbours' count.",
           "Pros of masked_normalize: every token is weighted alike, so there is no length bias and long correct "
           "reasoning earns credit in proportion to its length. Cons: the gradient grows with response length, so "
           "long responses dominate a batch and the gradient norm moves with the length distribution; the constant "
           "rescales the learning rate and must be chosen.",
           "Where each is better: masked_normalize where lengths vary widely and the length itself is at stake "
           "(chain-of-thought on MATH); the two coincide up to a step size of L / C when every response has about "
           "the same length L."]
    health = (view.families.get("length_norm") or {}).get("health") or {}
    lengths = [v[1] for h in health.values() for k, v in h.items() if k == "response/length_mean"]
    if lengths:
        lo, hi = min(lengths), max(lengths)
        out.append(f"In this run the length_norm family's responses ended at {lo:.3g} to {hi:.3g} tokens on average"
                   + (", nearly one length, so its comparison can hardly separate the two." if
                      hi > 0 and (hi - lo) / hi < 0.1 else ", so the weighting differs between responses."))
    return out
