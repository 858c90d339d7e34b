"""The deliverables manifest (rlpipe.analysis.deliverables) and the written answers behind it: every
listed seed question has a section and a non-empty answer computed from a synthetic results
directory; the zero-shot commentary reads >= 10 examples per category and names the task and model
truthfully; Problem 10 follows the measured overlap, not its estimate."""

from __future__ import annotations

import html
import json

import pandas as pd
import pytest
import yaml

from rlpipe import contract
from rlpipe.analysis import (
    aggregate,
    answers_math,
    deliverables,
    family_answer,
    results_page,
    shared_caveats,
)
from rlpipe.analysis.optimization_text import optimization_section
from rlpipe.analysis.results_view import ResultsView

FAMILIES = ("lr_sweep", "baselines", "length_norm", "std_norm", "offpolicy_sweep", "clip_ablation",
            "prompt_ablation", "epochs_per_batch", "offpolicyness", "kl_drift")
CLIP_CHECK = ("Mechanism check: the clip bound on few response tokens (loss/clip_frac, mean over steps and seeds: "
              "clip 0.3%; at most 1% in any step), below the 1% at which it would change the update noticeably. "
              "What would: more epochs.")


def family_numbers(name: str, replicates: int = 1, diverged: int = 0) -> dict:
    """A family.json: reference 'a' (grad norm 0.10 at the end), 'b' (grad norm 0.24, and a collapse when
    ``diverged``), one seed each unless ``replicates``."""
    def row(mean, ci):
        return {"x": None, "replicates": replicates, "diverged": 0, "contended": 0, "val_reward_final_mean": mean,
                "val_reward_final_ci": ci, "val_reward_final_n": replicates}
    b = row(0.0 if diverged else 0.78, None if replicates < 2 else 0.02) | {"diverged": diverged}
    verdict = "unreplicated" if replicates < 2 else "exceeds the 95% interval"
    return {"family": name, "question": "q", "reference": "a", "x": None, "replicates": replicates,
            "variants": {"a": row(0.81, None if replicates < 2 else 0.02), "b": b},
            "comparisons": [{"variant": "b", "reward_diff": b["val_reward_final_mean"] - 0.81,
                             "reward_ci": None if replicates < 2 else 0.02, "reward_verdict": verdict,
                             "val_noise": 0.05}],
            "sentences": [CLIP_CHECK], "notes": [],
            "health": {"a": {"optim/grad_norm": [0.2, 0.10], "policy/entropy": [0.59, 0.5],
                             "response/length_mean": [26.0, 26.2]},
                       "b": {"optim/grad_norm": [0.3, 0.24], "policy/entropy": [0.59, 2.62],
                             "response/length_mean": [26.0, 26.5]}}}


def examples() -> pd.DataFrame:
    rows = []
    for i in range(12):  # 12 per category: the commentary reads 10
        rows.append(("format1_answer1", "<think>x</think> <answer>4</answer>", "4", "stop"))
        # 8 of the format-0 cases ran out of tokens (model), 4 put a newline where the grader wants a space
        resp = "<think>2+2 is" if i < 8 else "<think>x</think>\n<answer>4</answer>"
        rows.append(("format0_answer0", resp, "4", "length" if i < 8 else "stop"))
        # format 1, answer 0: 3 say the right answer in \\boxed{} with spaces (grader), the rest are wrong
        rows.append(("format1_answer0", "<think>x</think> <answer>$\\boxed{ 4 }$</answer>" if i < 3
                     else "<think>x</think> <answer>5</answer>", "4", "stop"))
    return pd.DataFrame([{"index": i, "prompt": "p", "response": r, "ground_truth": g, "format_reward": 0.0,
                          "answer_reward": 0.0, "reward": 0.0, "category": c, "finish_reason": f}
                         for i, (c, r, g, f) in enumerate(rows)])


def write_math(root, math_cfg: dict | None = None) -> None:
    ev = root / "math" / "eval" / "base"
    ev.mkdir(parents=True)
    (ev / contract.EVAL_FILES["summary"]).write_text(json.dumps(
        {"n": 36, "accuracy": 0.333, "format_rate": 0.667,
         "categories": {"format1_answer1": 12, "format1_answer0": 12, "format0_answer0": 12, "format0_answer1": 0}}))
    examples().to_parquet(ev / contract.EVAL_FILES["examples"], index=False)
    rep = root / "math" / "report"
    rep.mkdir(parents=True)
    (rep / contract.MATH_REPORT_FILES["math_json"]).write_text(json.dumps({"runs": {"onpolicy": {
        "initial_val_answer": 0.1, "final_val_answer": 0.4, "best_val_answer": 0.45, "best_step": 40,
        "final_step": 48}}}))
    run = root / "math" / "runs" / "onpolicy"
    run.mkdir(parents=True)
    (run / contract.RUN_CONFIG_FILE).write_text(yaml.safe_dump(
        {"math": math_cfg or {"dataset_dir": None, "base_model_dir": None}}))
    (root / "math" / "base").mkdir(parents=True)
    (root / "math" / "base" / "model.log.json").write_text(json.dumps({"parameters": 1259904}))


@pytest.fixture
def results(tmp_path, make_runs):
    root = tmp_path / "results"
    runs = make_runs(root / "runs", ("onpolicy", "k2", "disagg"))
    aggregate.main(["--runs", str(runs), "--out", str(root / "summary")])
    for name in FAMILIES:
        d = root / "families" / name / contract.FAMILY_REPORT_DIR
        d.mkdir(parents=True)
        (d / contract.FAMILY_REPORT_FILES["numbers"]).write_text(json.dumps(family_numbers(name, diverged=1)))
    write_math(root)
    (root / "toy_sort").mkdir()
    pd.DataFrame([{"loss": "grpo_clip", "delta": "normalized", "seeds": 3, "final_mean": 4.6, "final_ci": 0.1,
                   "vs_best": 0.0, "below_best": False},
                  {"loss": "no_baseline", "delta": "rewards", "seeds": 3, "final_mean": 3.1, "final_ci": 0.2,
                   "vs_best": 1.5, "below_best": True}]).to_csv(root / "toy_sort" / "table.csv", index=False)
    return root


def test_manifest_covers_every_question_the_report_must_answer():
    asked = {(d.seed, d.problem) for d in deliverables.DELIVERABLES}
    for seed, problem in [("000", f"Problem {n}") for n in range(5, 11)] + [
            ("001", "Problem 1(b)"), ("001", "Problem 1(c)"), ("001", "Problem 8"), ("001", "Problem 9"),
            ("001", "Problem 10"), ("002", "Problem 11"), ("003", "toy sorting"),
            ("004", "think_about_length_normalization"), ("004", "grpo_length_normalization"),
            ("004", "grpo_off_policy_clip_ablation"), ("004", "grpo_group_standard_deviation")]:
        assert (seed, problem) in asked
    anchors = [d.anchor for d in deliverables.DELIVERABLES]
    assert len(set(anchors)) == len(anchors)
    for d in deliverables.DELIVERABLES:  # a figure is a contract file
        if d.figure and d.figure.startswith("figures/"):
            assert d.figure.removeprefix("figures/") in {contract.figure_file(k) for k in contract.FIGURES}


def test_every_deliverable_has_a_section_and_an_answer(results):
    view = ResultsView.load(results)
    done = deliverables.answers(view)
    page = "\n".join(deliverables.render_markdown(view))
    assert deliverables.problems(done, page) == []
    assert deliverables.problems(done, deliverables.render_html(view)) == []
    assert not any(t.startswith("Not run") for _, text in done for t in text)  # every stage's data was read
    # the check itself fails on an empty answer and on a missing section
    first = deliverables.DELIVERABLES[0]
    assert deliverables.problems([(first, [])], page) == [f"{first.anchor}: empty answer"]
    assert deliverables.problems([(first, ["x"])], "") == [f"{first.anchor}: no section"]


def test_results_page_opens_with_the_manifest(results, tmp_path):
    page = results_page.render(results, date="d")
    assert page.index("## Answers to the seed questions") < page.index("## Machine and software")
    assert "[Problem 10](#s000-p10)" in page
    out = tmp_path / "answers.html"
    assert results_page.main(["--results", str(results), "--answers-html", str(out), "--date", "d"]) == 0
    assert "id='s004-lenthink'" in out.read_text()


def test_an_empty_results_directory_answers_not_run(tmp_path):
    (tmp_path / "r").mkdir()
    view = ResultsView.load(tmp_path / "r")
    for d, text in deliverables.answers(view):
        assert text and all(t.strip() for t in text), d.anchor
        if d.figure:
            assert text[0].startswith("Not run"), d.anchor


def test_zero_shot_reads_ten_examples_and_attributes_faults(results):
    text = answers_math.zero_shot_answer(ResultsView.load(results))
    assert "(1) 12, (2) 12, (3) 12" in text[0]
    assert "Of 10 format-0 examples read, 8 are the model's fault and 2 the parser's, so the issue is mostly " \
           "the model." in text[1]
    assert "Of 10 format-1, answer-0 examples read, 7 are the model's fault and 3 the parser's" in text[2]


def test_track_is_named_truthfully(results, tmp_path):
    text = " ".join(answers_math.zero_shot_metrics_answer(ResultsView.load(results)))
    assert "synthetic arithmetic task with a ~1.3M-parameter model of our own" in text
    assert "Qwen2.5-Math-1.5B on MATH was not run" in text and "on MATH:" not in text
    real = tmp_path / "real"
    write_math(real, {"dataset_dir": "/data/MATH", "base_model_dir": "/models/qwen"})
    text = " ".join(answers_math.zero_shot_metrics_answer(ResultsView.load(real)))
    assert "MATH-format data from math.dataset_dir with the local HuggingFace model in /models/qwen" in text
    assert "was not run" not in text


def test_family_answer_one_seed_collapse_is_no_finding_and_names_the_mechanism():
    text = " ".join(family_answer.answer(family_numbers("lr_sweep", diverged=1)))
    assert "b diverged in 1 of 1 seeds (final reward 0.000, one seed, entropy 0.59 → 2.62)" in text
    assert "not a finding" in text and "a finding (replicated" not in text
    assert "entropy (nats/token): b 2.62 vs a 0.5 (5.2x)" in text
    assert "cannot fully answer its question at this scale, because the clip bound on few response tokens" in text


def test_family_answer_replicated_gap_states_its_interval():
    text = " ".join(family_answer.answer(family_numbers("baselines", replicates=3)))
    assert "b's -0.030 [-0.050, -0.010], a finding (replicated" in text
    assert "grad norm (before clipping): b 0.24 vs a 0.1" in text


def test_problem_10_follows_the_measurement(tmp_path, make_runs):
    runs = aggregate.load_runs(make_runs(tmp_path / "runs"))
    table = aggregate.summarize(runs, "onpolicy")
    sec = optimization_section(table, "onpolicy")  # disagg measured 1.60x against an estimate of 1.33x
    assert sec["numbers"]["recommended"].startswith("overlap") and sec["numbers"]["basis"] == "measured"
    assert "Design: a Generator and a Learner actor" in sec["sentences"][-1]
    slow = table.copy()
    slow.loc[slow["variant"] == "disagg", "speedup_vs_ref"] = 0.96
    sec = optimization_section(slow, "onpolicy")
    text = " ".join(sec["sentences"])
    assert "measured 0.96x" in text and "The measurement contradicts the estimate" in text
    assert sec["numbers"]["recommended"].startswith("a 2x faster sampler") and sec["numbers"]["basis"] == "estimated"


def test_length_normalisation_pros_and_cons(results):
    text = " ".join(deliverables.length_norm_written(ResultsView.load(results)))
    assert "Pros of masked_mean" in text and "Cons:" in text and "Pros of masked_normalize" in text
    assert "1/4 = 0.250" in text and "1/7 = 0.143" in text
    assert "26.2 to 26.5 tokens" in text and "hardly separate" in text


def test_replay_answer_describes_aging_and_sampling(results):
    (results / "runs" / "replay").mkdir()
    (results / "runs" / "replay" / contract.RUN_CONFIG_FILE).write_text(yaml.safe_dump({"train": {
        "variant": "replay", "replay": {"enabled": True, "capacity_groups": 16, "max_age": 2, "strategy": "recency"}}}))
    text = " ".join(deliverables.replay_answer(ResultsView.load(results)))
    assert "Aging and sampling in 'replay': the buffer holds up to 16 scored prompt groups" in text
    assert "more than 2 policy versions ago" in text and "most recent first" in text
    assert "No data: no variant with train.replay.enabled ran." in text  # the fixture's runs have no replay run


def test_family_answer_reads_a_sweep_along_its_axis():
    numbers = family_numbers("lr_sweep", replicates=3)
    numbers["x"] = "learning_rate"
    numbers["variants"]["a"]["x"], numbers["variants"]["b"]["x"] = 1e-4, 1e-2
    text = family_answer.trend_sentence(numbers)
    assert text == ("Along learning_rate, the final validation reward is 0.0001: 0.810 ± 0.020, 0.01: 0.780 ± 0.020; "
                    "it peaks at the smallest (learning_rate = 0.0001).")


def _tied(finals: dict[str, float], x: dict[str, float] | None = None) -> dict:
    numbers = family_numbers("async", replicates=1)
    row = numbers["variants"]["a"]
    numbers["variants"] = {v: row | {"val_reward_final_mean": f, "x": (x or {}).get(v)} for v, f in finals.items()}
    numbers["x"] = "learning_rate" if x else None
    return numbers


def test_ties_are_named_as_ties_not_as_a_ranking():
    # three variants end at the same printed value: they tie highest, none "ends highest" or "lowest" alone
    text = family_answer.trend_sentence(_tied({"onpolicy": 0.797, "k2_batches": 0.7971, "e2_epochs": 0.797,
                                               "disagg": 0.75}))
    assert text.startswith("onpolicy, k2_batches and e2_epochs tie highest (0.797 each) and disagg ends lowest "
                           "(0.750, one seed)"), text
    text = family_answer.trend_sentence(_tied({"a": 0.797, "b": 0.797, "c": 0.797}))
    assert text.startswith("All 3 variants end tied (0.797)") and "highest" not in text and "lowest" not in text
    text = family_answer.trend_sentence(_tied({"a": 0.9, "b": 0.797, "c": 0.797}))
    assert "a ends highest (0.900, one seed) and b and c tie lowest (0.797 each)" in text
    # along a sweep axis: a tied peak names every setting at it, not the first one found
    text = family_answer.trend_sentence(_tied({"lo": 0.797, "mid": 0.797, "hi": 0.5},
                                              {"lo": 1e-4, "mid": 1e-3, "hi": 1e-2}))
    assert text.endswith("; 2 settings tie at its highest (learning_rate = 0.0001, 0.001)."), text


# --------------------------------------------------------------------------- replication wording


def _with_systems(results, replicates: int) -> ResultsView:
    d = results / "families" / "systems" / contract.FAMILY_REPORT_DIR
    d.mkdir(parents=True, exist_ok=True)
    numbers = json.loads(json.dumps(family_numbers("systems", replicates=replicates)).replace('"a"', '"sysA"')
                         .replace('"b"', '"sysB"'))  # variant names no other family uses
    numbers["answer"] = family_answer.answer(numbers)
    (d / contract.FAMILY_REPORT_FILES["numbers"]).write_text(json.dumps(numbers))
    return ResultsView.load(results)


def test_the_not_run_note_is_said_once_per_question_that_needs_it(results):
    done = deliverables.answers(ResultsView.load(results))
    with_note = [d.anchor for d, t in done if any("Qwen2.5-Math-1.5B on MATH was not run" in s for s in t)]
    assert with_note == ["s001-p1c", "s001-p9"]


@pytest.mark.parametrize("n", [1, 2])
def test_replication_is_claimed_only_with_two_seeds_and_said_once(results, n):
    done = deliverables.answers(_with_systems(results, n))
    text = {d.anchor: " ".join(t) for d, t in done}
    systems = [a for a, t in text.items() if "sysA" in t]
    assert systems == ["s000-p7"]  # once, not under every systems question
    p7 = text["s000-p7"]
    if n == 1:
        assert "The systems family ran one seed per variant, so this is a measurement, not a replication:" in p7
        assert "one seed each, no interval" in p7
        for t in text.values():
            assert "Replicated" not in t and "95% CI over" not in t and "over seeds" not in t
    else:
        assert "The systems family over 2 seeds per variant:" in p7 and "mean ± 95% CI over 2 seeds" in p7
        assert "one seed" not in p7


def test_interval_and_seed_phrases_follow_n():
    from rlpipe.analysis.stats import interval_phrase, seeds_phrase
    assert interval_phrase([1, 1]) == "one seed each, no interval"
    assert interval_phrase([2, 2]) == "mean ± 95% CI over 2 seeds"
    assert interval_phrase([3, 2]) == "mean ± 95% CI over 2 to 3 seeds"
    assert "one seed" in interval_phrase([1, 3]) and "two or more" in interval_phrase([1, 3])
    assert seeds_phrase([1]) == "one seed each, so not replicated" and seeds_phrase([2, 2]) == "seed means over 2 seeds"
    text = family_answer.trend_sentence(family_numbers("baselines", replicates=1))
    assert text.endswith("(one seed each, no interval).") and "95%" not in text
    text = family_answer.trend_sentence(family_numbers("baselines", replicates=2))
    assert text.endswith("(mean ± 95% CI over 2 seeds).")


def test_train_loop_says_replicated_only_when_a_family_is(results):
    assert "the families repeat it" not in " ".join(answers_math.train_loop_answer(ResultsView.load(results)))
    view = _with_systems(results, 3)
    assert "(the families repeat it over 3 seeds)" in " ".join(answers_math.train_loop_answer(view))


# --------------------------------------------------------------------------- scaled-down protocols


def _sweep(results) -> ResultsView:
    numbers = family_numbers("offpolicy_sweep")
    settings = {"a": (1, 32), "b": (2, 16)}
    for v, (epochs, tb) in settings.items():
        numbers["variants"][v]["settings"] = {"task": "math", "n_grpo_steps": 20, "rollout_batch_size": 32,
                                              "epochs_per_rollout_batch": epochs, "train_batch_size": tb}
    path = results / "families" / "offpolicy_sweep" / contract.FAMILY_REPORT_DIR / contract.FAMILY_REPORT_FILES[
        "numbers"]
    path.write_text(json.dumps(numbers))
    return ResultsView.load(results)


def test_offpolicy_sweep_says_how_far_it_is_scaled_down(results):
    d = next(d for d in deliverables.DELIVERABLES if d.problem == "grpo_off_policy_sweep")
    text = " ".join(d.answer(_sweep(results)))
    assert ("this run made one sweep of 2 variants (epochs_per_rollout_batch 1 to 2 x train_batch_size 16 to 32) "
            "of 20 GRPO steps (within the seed's broad-sweep length) with rollout_batch_size 32 (12.5% of 256), "
            "and no focused second stage") in text
    numbers = family_numbers("epochs_per_batch")
    for row in numbers["variants"].values():
        row["settings"] = {"task": "keyword_inclusion", "n_grpo_steps": 16, "rollout_batch_size": 32}
    (results / "families" / "epochs_per_batch" / contract.FAMILY_REPORT_DIR / contract.FAMILY_REPORT_FILES[
        "numbers"]).write_text(json.dumps(numbers))
    keyword = " ".join(deliverables.family("epochs_per_batch")(ResultsView.load(results)))
    assert "Trained on" not in keyword and "Scaled down" not in keyword  # a keyword-track family
    assert text.startswith("Trained on the synthetic arithmetic task")
    lr = deliverables.family("lr_sweep")(_sweep(results))  # another math family: the generic scale
    assert not any(s.startswith("Scaled down") for s in lr)  # its family.json has no settings
    numbers = json.loads((results / "families" / "offpolicy_sweep" / contract.FAMILY_REPORT_DIR
                          / contract.FAMILY_REPORT_FILES["numbers"]).read_text())
    from rlpipe.analysis.scale_text import scale_sentence
    assert scale_sentence(numbers) == ("Scaled down: each run took 20 GRPO steps of 32 rollouts, against seed 001's "
                                       "200 steps of 256: at most 10% of its steps and 1.2% of its rollouts, so what "
                                       "holds here may not hold at the seed's scale.")


def test_a_caveat_every_family_shares_is_said_once_and_each_answer_links_to_it(results):
    for name in ("lr_sweep", "baselines", "offpolicy_sweep"):
        numbers = family_numbers(name)
        for row in numbers["variants"].values():
            row["settings"] = {"task": "math", "n_grpo_steps": 20, "rollout_batch_size": 32}
        d = results / "families" / name / contract.FAMILY_REPORT_DIR
        d.mkdir(parents=True, exist_ok=True)
        (d / contract.FAMILY_REPORT_FILES["numbers"]).write_text(json.dumps(numbers))
    view = ResultsView.load(results)
    from rlpipe.analysis.scale_text import scale_sentence
    caveat = scale_sentence(numbers)
    done = deliverables.answers(view)
    sharing = [d.anchor for d, text in done if caveat in text]
    assert len(sharing) >= 2  # the answers still carry it: the page says it once
    page = "\n".join(deliverables.render_markdown(view, done))
    assert page.count(caveat) == 1
    top = page.index(caveat)
    assert top < min(page.index(f'<a id="{a}"></a>') for a in sharing)  # where the answers begin
    assert page[:top].rstrip().endswith("**Applies to every answer that links here.**")
    anchor = page[:top].rsplit('<a id="', 1)[1].split('"')[0]
    for a in sharing:
        section = page.split(f'<a id="{a}"></a>', 1)[1].split("<a id=", 1)[0]
        assert f"Scaled down: see [the note where the answers begin](#{anchor})." in section
    assert not deliverables.problems(done, page)
    html_page = deliverables.render_html(view)
    assert html_page.count(html.escape(caveat)) == 1 and f"<p id='{anchor}'>" in html_page
    assert html_page.count(f"<a href='#{anchor}'>the note where the answers begin</a>") == len(sharing)
    assert "\x00" not in html_page
    # a caveat one answer alone says stays in that answer
    only = "Scaled down: once."
    caveats, texts = shared_caveats.hoist([["x", only], ["y"]], shared_caveats.markdown_link)
    assert caveats == [] and texts == [["x", only], ["y"]]


def test_problem_7_states_samples_per_second_in_words(results):
    path = results / "summary" / contract.SUMMARY_FILES["runs"]
    runs = pd.read_parquet(path)
    text = " ".join(deliverables.kstep_answer(ResultsView.load(results)))
    sps = runs.set_index("variant")["samples_per_s"]
    assert f"{sps['k2']:.3g} samples/s" in text  # the k-step section says it; the answer does not repeat it
    assert "Samples per second" not in text
    runs["contended"] = runs["variant"] == "k2"  # a contended run: the section withholds it, the answer says it
    runs["load_avg_max"] = 5.7
    runs.to_parquet(path)
    disc = results / "summary" / contract.SUMMARY_FILES["discussion_json"]
    data = json.loads(disc.read_text())
    for sec in data["sections"]:
        if sec["id"] == "kstep":
            sec["sentences"] = ["k2 vs 'onpolicy' throughput: measured under contention; no conclusion is drawn."]
    disc.write_text(json.dumps(data))
    text = " ".join(deliverables.kstep_answer(ResultsView.load(results)))
    assert (f"Samples per second, one run each: onpolicy {sps['onpolicy']:.3g}; k2 {sps['k2']:.3g} (contended, "
            "indicative only: load average up to 5.7).") in text
