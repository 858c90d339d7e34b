"""The seeds' problems (src/rlpipe/analysis/seed_questions.yaml) against the deliverables manifest:
every question that asks to answer, plot or discuss has an entry, or says why it is not answered."""

import re
from pathlib import Path

import pytest

from rlpipe.analysis import deliverables
from rlpipe.analysis.results_view import ResultsView

SEEDS = Path("/work/shared/seeds")  # the seed documents, where this checkout has them
QUESTIONS = deliverables.seed_questions()


def test_list_is_well_formed():
    keys = [(q["seed"], q["problem"]) for q in QUESTIONS]
    assert len(set(keys)) == len(keys)
    ids = [q["id"] for q in QUESTIONS]
    assert len(set(ids)) == len(ids)
    for q in QUESTIONS:
        assert set(q) >= {"id", "seed", "problem", "title", "asks", "report"}, q
        assert isinstance(q["report"], bool) and str(q["asks"]).strip(), q
        number = re.fullmatch(r"Problem (\d+)(?:\(([a-z])\))?", q["problem"])
        want = f"P{number[1]}{number[2] or ''}" if number else q["problem"].replace(" ", "_")
        assert q["id"] == f"{q['seed']}-{want}", q


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seed documents are not in this checkout")
def test_list_matches_the_seed_documents():
    """Every numbered or named problem of the seed texts is in the list, under its own title."""
    texts = {p.name[:3]: p.read_text().replace("\\_", "_") for p in SEEDS.glob("0*.txt")}
    listed = {(q["seed"], q["problem"]) for q in QUESTIONS}
    for seed, text in texts.items():
        for number, title in re.findall(r"Problem-(\d+) \(`?([a-z_]+)`?\)", text):
            assert any(k[0] == seed and re.fullmatch(rf"Problem {number}(\([a-z]\))?", k[1]) for k in listed), \
                (seed, number)
            assert any(q["seed"] == seed and q["title"] == title and q["problem"].startswith(f"Problem {number}")
                       for q in QUESTIONS), (seed, number, title)
        for name in re.findall(r"### Problem \(([a-z_]+)\)", text):
            assert (seed, name) in listed, (seed, name)


def test_every_question_to_answer_has_an_entry():
    assert deliverables.uncovered() == []
    have = deliverables.covered()
    for q in [("001", "Problem 13"), ("001", "Problem 14"), ("001", "Problem 15"), ("002", "Problem 9"),
              ("002", "Problem 10")]:
        assert q in have, q
    listed = {(q["seed"], q["problem"]) for q in QUESTIONS}
    assert set(have) <= listed  # no entry answers a question the seeds do not ask


def test_a_missing_question_fails_unless_it_says_why():
    extra = {"seed": "001", "problem": "Problem 99", "title": "new", "asks": "a plot", "report": True}
    assert deliverables.uncovered([*QUESTIONS, extra]) == ["seed 001 Problem 99 (new): no entry in the manifest"]
    assert deliverables.uncovered([*QUESTIONS, {**extra, "not_answered_here": "  "}]) != []
    why = {**extra, "not_answered_here": "needs a GPU cluster"}
    assert deliverables.uncovered([*QUESTIONS, why]) == []
    assert deliverables.uncovered([*QUESTIONS, {**extra, "report": False}]) == []  # code only


def test_the_table_of_contents_lists_every_question(tmp_path, monkeypatch):
    (tmp_path / "r").mkdir()
    why = {"seed": "001", "problem": "Problem 99", "title": "new", "asks": "x", "report": True,
           "not_answered_here": "needs a GPU cluster"}
    monkeypatch.setattr(deliverables, "seed_questions", lambda: [*QUESTIONS, why])
    view = ResultsView.load(tmp_path / "r")
    page = "\n".join(deliverables.render_markdown(view))
    for q in QUESTIONS:
        if q["report"]:
            assert re.search(rf"\| {q['seed']} \| \[{re.escape(q['problem'])}\]\(#s\d{{3}}-[a-z0-9]+\)", page), q
    assert "| 002 | [Problem 9](#s000-p7) | the same question as seed 000 Problem 7, answered there |" in page
    assert "| 001 | Problem 99 | not answered here: needs a GPU cluster | none |" in page
    assert "not answered here: needs a GPU cluster" in deliverables.render_html(view)
