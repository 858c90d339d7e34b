"""The deliverables manifest: every seed question the report answers, declared once.

``DELIVERABLES`` maps each seed question (seed, problem, what is asked; ``also`` the same question
in another seed, answered once) to its report section
(``anchor``), its figure (a file under ``results/``, named through ``rlpipe.contract``; None
for a written-only question) and the function that writes its answer from the run's results
(``answer(view) -> list[str]``, ``view`` a ``rlpipe.analysis.results_view.ResultsView``).
``render_markdown`` opens the results page with the manifest as a table of contents followed by
every answer; ``render_html`` is the same for the Snakemake report. A question whose stage did not
run is answered with one sentence saying so, never left empty (``tests/test_deliverables.py``).

``seed_questions.yaml`` lists the seeds' problems, extracted once from the seed documents; every
one that asks to answer, plot or discuss has an entry here or says there why it is not answered
(``uncovered``, ``tests/test_seed_questions.py``).

Departure from the seeds: they list deliverables in prose across five documents; one table makes
"is every question answered" a test.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

import yaml

from rlpipe import contract
from rlpipe.analysis import shared_caveats
from rlpipe.analysis.answers_math import train_loop_answer, zero_shot_answer, zero_shot_metrics_answer
from rlpipe.analysis.answers_systems import (
    family,
    kstep_answer,
    length_norm_written,
    replay_answer,
    sections_answer,
    toy_sort_answer,
)
from rlpipe.analysis.results_view import ResultsView
from rlpipe.analysis.scale_text import offpolicy_protocol_sentence

SEED_QUESTIONS = "seed_questions.yaml"

Answer = Callable[[ResultsView], list[str]]


@dataclass(frozen=True)
class Deliverable:
    seed: str
    problem: str
    asked: str
    anchor: str
    figure: str | None
    answer: Answer
    also: tuple[tuple[str, str], ...] = ()  # the same question in another seed, answered here once


def _fig(kind: str) -> str:
    return f"figures/{contract.figure_file(kind)}"


def _fam(name: str) -> str:
    return f"families/{name}/{contract.FAMILY_REPORT_DIR}/{contract.FAMILY_REPORT_FILES['curves']}"


def _math(key: str) -> str:
    return f"math/report/{contract.MATH_REPORT_FILES[key]}"


def _sections(*ids: str) -> Answer:
    def answer(view: ResultsView) -> list[str]:
        return sections_answer(view, *ids)
    answer.__name__ = "sections_" + "_".join(ids)
    return answer


Question = tuple[str, str]  # (seed, problem), as seed_questions.yaml names it


DELIVERABLES = (
    Deliverable("000", "Problem 5", "profile generation, learning and weight sync; which stage dominates and why; "
                "example rollouts", "s000-p5", _fig("phase_breakdown"), _sections("profiling", "rollouts"),
                also=(("002", "Problem 7"), ("001", "Problem 16"))),
    Deliverable("000", "Problem 6", "KL to the reference and to the previous step: its growth shape and its relation "
                "to validation reward", "s000-p6", _fig("kl"), _sections("kl"), also=(("002", "Problem 8"),)),
    Deliverable("000", "Problem 7", "k steps per rollout batch: samples/s and the speedup, explained", "s000-p7",
                _fig("throughput"), kstep_answer, also=(("002", "Problem 9"),)),
    Deliverable("000", "Problem 8", "colocated vs disaggregated: wall time and GPU-hours, explained; version "
                "changes", "s000-p8", _fig("timeline"), _sections("disagg", "versions"),
                also=(("002", "Problem 10"),)),
    Deliverable("000", "Problem 9", "weight-transfer latency with RDT on and off", "s000-p9", _fig("weight_sync"),
                _sections("rdt"), also=(("002", "Problem 12"),)),
    Deliverable("000", "Problem 10", "one optimisation to add next: idea, justification, design", "s000-p10",
                _fig("phase_breakdown"), _sections("optimization")),
    Deliverable("001", "Problem 1(b)", "zero-shot categories, >= 10 examples each: model or parser at fault?",
                "s001-p1b", _math("eval_html"), zero_shot_answer),
    Deliverable("001", "Problem 1(c)", "zero-shot performance in 1-2 sentences with metrics", "s001-p1c",
                _math("eval_html"), zero_shot_metrics_answer),
    Deliverable("001", "Problem 8", "a GRPO train loop whose validation reward rises", "s001-p8",
                _math("learning_png"), train_loop_answer),
    Deliverable("001", "Problem 9", "learning-rate sweep: curves and 2 sentences on other metrics", "s001-p9",
                _fam("lr_sweep"), family("lr_sweep", target_note=True), also=(("004", "grpo_learning_rate"),)),
    Deliverable("001", "Problem 10", "no_baseline vs reinforce_with_baseline: curves and trends", "s001-p10",
                _fam("baselines"), family("baselines"), also=(("004", "grpo_baselines"),)),
    Deliverable("001", "Problem 13", "one step vs several epochs per rollout batch: convergence, stability, "
                "runtime", "s001-p13", _fam("epochs_per_batch"), family("epochs_per_batch", speed=True)),
    Deliverable("001", "Problem 14", "one-version-behind and replay-buffer training: stability, convergence, "
                "time breakdown", "s001-p14", _fam("offpolicyness"), family("offpolicyness", speed=True)),
    Deliverable("001", "Problem 15", "KL to a frozen reference with and without a KL penalty: growth and its "
                "relation to reward", "s001-p15", _fam("kl_drift"), family("kl_drift")),
    Deliverable("002", "Problem 11", "replay buffer: aging and sampling, against the standard run", "s002-p11",
                _fig("replay"), replay_answer),
    Deliverable("003", "toy sorting", "delta modes x losses on the toy sorting task", "s003-sort",
                f"toy_sort/{contract.TOY_SORT_FILES['curves']}", toy_sort_answer),
    Deliverable("004", "think_about_length_normalization", "masked_mean vs masked_normalize: pros, cons, where "
                "each is better (no experiment)", "s004-lenthink", None, length_norm_written),
    Deliverable("004", "grpo_length_normalization", "masked_mean vs masked_normalize end to end", "s004-len",
                _fam("length_norm"), family("length_norm"), also=(("001", "Problem 11"),)),
    Deliverable("004", "grpo_group_standard_deviation", "std normalisation on and off", "s004-std",
                _fam("std_norm"), family("std_norm"), also=(("001", "Problem 12"),)),
    Deliverable("004", "grpo_off_policy_sweep", "epochs per rollout batch x train batch size", "s004-offpolicy",
                _fam("offpolicy_sweep"), family("offpolicy_sweep", protocol=offpolicy_protocol_sentence)),
    Deliverable("004", "grpo_off_policy_clip_ablation", "GRPO-Clip vs GRPO-No-Clip off-policy", "s004-clip",
                _fam("clip_ablation"), family("clip_ablation")),
    Deliverable("004", "grpo_prompt_ablation", "r1_zero vs question_only prompt, explained", "s004-prompt",
                _fam("prompt_ablation"), family("prompt_ablation")),
)


def seed_questions() -> list[dict]:
    """The seeds' problems (``seed_questions.yaml``, extracted once from the seed documents)."""
    text = resources.files("rlpipe.analysis").joinpath(SEED_QUESTIONS).read_text()
    return yaml.safe_load(text)


def covered() -> dict[Question, Deliverable]:
    """Each seed question the manifest answers -> the entry that answers it."""
    out = {}
    for d in DELIVERABLES:
        for q in ((d.seed, d.problem), *d.also):
            out[q] = d
    return out


def uncovered(questions: list[dict] | None = None) -> list[str]:
    """The seed questions that ask to answer, plot or discuss and have no manifest entry, unless
    their seed_questions.yaml entry says ``not_answered_here`` and why; [] when all are covered."""
    have = covered()
    out = []
    for q in seed_questions() if questions is None else questions:
        key = (str(q["seed"]), str(q["problem"]))
        if not q.get("report") or key in have:
            continue
        if str(q.get("not_answered_here") or "").strip():
            continue
        out.append(f"seed {key[0]} {key[1]} ({q.get('title')}): no entry in the manifest")
    return out


def not_answered_here(questions: list[dict] | None = None) -> list[dict]:
    """The seed questions that say why they are not answered here."""
    have = covered()
    return [q for q in (seed_questions() if questions is None else questions)
            if q.get("report") and (str(q["seed"]), str(q["problem"])) not in have and q.get("not_answered_here")]


def answers(view: ResultsView) -> list[tuple[Deliverable, list[str]]]:
    """Every deliverable with its written answer."""
    return [(d, d.answer(view)) for d in DELIVERABLES]


def problems(done: list[tuple[Deliverable, list[str]]], page: str) -> list[str]:
    """What is wrong with a rendered answers page: a deliverable with an empty answer, or whose
    section (its anchor) the page lacks; [] when every deliverable is answered."""
    out = [f"{d.anchor}: empty answer" for d, text in done if not text or not all(t.strip() for t in text)]
    return out + [f"{d.anchor}: no section" for d, _ in done if f'id="{d.anchor}"' not in page
                  and f"id='{d.anchor}'" not in page]


def _title(d: Deliverable) -> str:
    also = "; ".join(f"seed {seed} {problem}" for seed, problem in d.also)
    return f"Seed {d.seed} {d.problem}: {d.asked}" + (f" (also {also})" if also else "")


def _rows(done: list[tuple[Deliverable, list[str]]]) -> list[tuple[str, str, str | None, str, str]]:
    """Table-of-contents rows (seed, problem, anchor or None, asked, figure): every manifest entry, each
    question it answers for another seed, and each seed question not answered here with why."""
    rows = []
    for d, _ in done:
        rows.append((d.seed, d.problem, d.anchor, d.asked, d.figure or "written"))
        rows += [(seed, problem, d.anchor, f"the same question as seed {d.seed} {d.problem}, answered there",
                  d.figure or "written") for seed, problem in d.also]
    rows += [(str(q["seed"]), str(q["problem"]), None, f"not answered here: {q['not_answered_here']}", "none")
             for q in not_answered_here()]
    return rows


def render_markdown(view: ResultsView, done: list[tuple[Deliverable, list[str]]] | None = None) -> list[str]:
    """The manifest as a table of contents, then each answer under its anchor (``done``: the answers
    when the caller has them already)."""
    done = answers(view) if done is None else done
    lines = ["## Answers to the seed questions", "", "| seed | problem | asked | figure |", "| --- | --- | --- | --- |"]
    lines += [f"| {seed} | {f'[{problem}](#{anchor})' if anchor else problem} | {asked} | "
              f"{f'`{fig}`' if fig not in ('written', 'none') else fig} |"
              for seed, problem, anchor, asked, fig in _rows(done)]
    lines.append("")
    caveats, texts = shared_caveats.hoist([text for _, text in done], shared_caveats.markdown_link)
    lines += shared_caveats.markdown_block(caveats)  # said once, where the answers begin
    for (d, _), text in zip(done, texts, strict=True):
        lines += [f'<a id="{d.anchor}"></a>', f"### {_title(d)}", "", " ".join(text), ""]
    return lines


def render_html(view: ResultsView) -> str:
    done = answers(view)
    rows = "".join(f"<tr><td>{seed}</td><td>"
                   + (f"<a href='#{anchor}'>{html.escape(problem)}</a>" if anchor else html.escape(problem))
                   + f"</td><td>{html.escape(asked)}</td><td>{html.escape(fig)}</td></tr>"
                   for seed, problem, anchor, asked, fig in _rows(done))
    marker = "\x00{}\x00"  # a link's place, kept through html.escape
    caveats, texts = shared_caveats.hoist([text for _, text in done], lambda c: marker.format(c.anchor))
    body = "".join(f"<p id='{c.anchor}'><b>Applies to every answer that links here.</b> {html.escape(c.text)}</p>"
                   for c in caveats)
    body += "".join(f"<h3 id='{d.anchor}'>{html.escape(_title(d))}</h3><p>{html.escape(' '.join(text))}</p>"
                    for (d, _), text in zip(done, texts, strict=True))
    for c in caveats:
        body = body.replace(marker.format(c.anchor), f"{html.escape(c.label)}: see <a href='#{c.anchor}'>the note "
                            "where the answers begin</a>.")
    return ("<!doctype html><html><head><meta charset='utf-8'><style>body{font:14px sans-serif;max-width:60em}"
            "td,th{border:1px solid #ccc;padding:3px 6px}table{border-collapse:collapse}</style></head><body>"
            "<h2>Answers to the seed questions</h2><p><i>Every sentence is computed from this run's results "
            "(rlpipe.analysis.deliverables); a gap is a finding only when replicated, beyond its 95% interval "
            "and not contended.</i></p><table><tr><th>seed</th><th>problem</th><th>asked</th><th>figure</th></tr>"
            f"{rows}</table>{body}</body></html>\n")
