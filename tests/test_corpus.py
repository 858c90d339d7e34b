"""rlpipe.tasks.keyword.corpus: keyword list, story generator, TinyStories reader, prompt-formatted mixing."""

from __future__ import annotations

import random
import re
from importlib import resources

import pytest

from rlpipe.config import ConfigError, DataConfig, PipelineConfig
from rlpipe.lm.documents import DOC_SEPARATOR, iter_tinystories
from rlpipe.tasks.keyword.corpus import StoryGenerator, build_corpus, iter_documents, main, split_sentences
from rlpipe.tasks.keyword.prompt import format_keyword_prompt, load_templates
from rlpipe.tasks.keyword.vocabulary import load_keywords, mentions, with_article


def _cfg(**data) -> PipelineConfig:
    return PipelineConfig(data=DataConfig(**data))


# --------------------------------------------------------------------------- keyword list


def test_keyword_list_has_300_unique_lowercase_single_words():
    raw = resources.files("rlpipe").joinpath("tasks/keyword/data/keywords.txt").read_text(encoding="utf-8")
    lines = raw.splitlines()
    assert all(line == line.strip() and line for line in lines), "blank or padded lines"
    assert all(re.fullmatch(r"[a-z]+", w) for w in lines), [w for w in lines if not re.fullmatch(r"[a-z]+", w)]
    assert len(lines) == len(set(lines)), "duplicates"
    assert len(lines) >= 300
    assert load_keywords() == lines


def test_load_keywords_custom_file_and_errors(tmp_path):
    p = tmp_path / "kw.txt"
    p.write_text("# animals\nCat\n\ndog\ncat\n")
    assert load_keywords(p) == ["cat", "dog"]
    p.write_text("ice cream\n")
    with pytest.raises(ConfigError, match="single word"):
        load_keywords(p)
    with pytest.raises(ConfigError, match="data.keywords_path"):
        load_keywords(tmp_path / "missing.txt")


def test_mentions_whole_word_and_simple_plurals():
    assert mentions("Two Apples fell.", "apple")
    assert mentions("She packed the boxes.", "box")
    assert mentions("A CAT sat.", "cat")
    assert not mentions("a pineapple", "apple")
    assert not mentions("the category", "cat")


def test_fast_keyword_scan_matches_mentions():
    from rlpipe.tasks.keyword.corpus import _present

    keywords = load_keywords() + ["teddy-bear", "o'clock"]
    gen = StoryGenerator(load_keywords(), random.Random(2))
    texts = [gen.story() for _ in range(50)] + ["Apples, BOXES and a teddy-bear at one o'clock; pineapple."]
    for text in texts:
        assert _present(text, keywords) == {w for w in keywords if mentions(text, w)}


def test_with_article():
    assert with_article("apple") == "an apple"
    assert with_article("dog") == "a dog"
    assert with_article("unicorn") == "a unicorn"


# --------------------------------------------------------------------------- generator


def test_corpus_is_deterministic_per_seed(tmp_path):
    a, b, c = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt"
    build_corpus(_cfg(num_stories=200, seed=3), a)
    build_corpus(_cfg(num_stories=200, seed=3), b)
    build_corpus(_cfg(num_stories=200, seed=4), c)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert a.read_text().count("<|endoftext|>") == 200


def test_generated_stories_have_3_to_8_sentences_and_vary():
    gen = StoryGenerator(load_keywords(), random.Random(0))
    stories = [gen.story() for _ in range(300)]
    counts = {len(split_sentences(s)) for s in stories}
    assert min(counts) >= 3 and max(counts) <= 8, counts
    assert len(counts) >= 5  # the length really varies
    assert len(set(stories)) == len(stories)


def test_required_keywords_come_early_and_avoided_ones_never():
    gen = StoryGenerator(load_keywords(), random.Random(1))
    for kw in ("apple", "umbrella", "dragon", "cat"):
        story = gen.story(required=[kw])
        assert any(mentions(s, kw) for s in split_sentences(story)[:2]), story
        assert not mentions(gen.story(avoid=[kw], keyword_slot=True), kw)


def test_prompt_documents_hit_rate_and_format():
    cfg = _cfg(num_stories=4000, keyword_prompt_fraction=0.5, keyword_hit_rate=0.3, seed=5)
    docs = list(iter_documents(cfg))
    prompt_docs = [d for d in docs if d.keywords]
    assert abs(len(prompt_docs) / len(docs) - 0.5) < 0.04
    templates = load_templates()
    hits = 0
    for d in prompt_docs:
        assert d.text.startswith(d.prompt)
        assert d.prompt in {format_keyword_prompt(t, list(d.keywords)) for t in templates}  # the GRPO prompt, exactly
        story = d.text[len(d.prompt):]
        assert "\n" not in story
        early = " ".join(split_sentences(story)[:2])
        if d.hit:
            assert all(mentions(early, k) for k in d.keywords), d.text
        else:
            assert not any(mentions(story, k) for k in d.keywords), d.text
        hits += d.hit
    # 2000 Bernoulli(0.3) draws: std 0.010, so 0.035 is a 3.4-sigma band.
    assert abs(hits / len(prompt_docs) - 0.3) < 0.035


def test_hit_rate_extremes():
    docs = [d for d in iter_documents(_cfg(num_stories=300, keyword_prompt_fraction=1.0, keyword_hit_rate=0.0))]
    assert all(d.keywords and not d.hit for d in docs)
    docs = [d for d in iter_documents(_cfg(num_stories=300, keyword_prompt_fraction=1.0, keyword_hit_rate=1.0,
                                           max_keywords_per_prompt=2))]
    assert all(d.hit and all(mentions(d.text[len(d.prompt):], k) for k in d.keywords) for d in docs)
    assert {len(d.keywords) for d in docs} == {1, 2}


# --------------------------------------------------------------------------- TinyStories reader


def test_tinystories_reader_streams_across_chunk_boundaries(tmp_path):
    stories = ["Once upon a time, there was a cat.", "Tom had a red ball.\nHe liked it.", "The end came."]
    p = tmp_path / "ts.txt"
    p.write_text("\n<|endoftext|>\n".join(stories) + "\n<|endoftext|>\n\n<|endoftext|>\n")
    for chunk in (3, 7, 13, 1 << 20):  # separators cut at every position
        assert list(iter_tinystories(p, chunk_chars=chunk)) == stories
    assert list(iter_tinystories(p, limit=2, chunk_chars=5)) == stories[:2]
    with pytest.raises(FileNotFoundError):
        list(iter_tinystories(tmp_path / "none.txt"))


def test_tinystories_source_mixes_prompts(tmp_path):
    src = tmp_path / "ts.txt"
    rng = random.Random(0)
    stories = [f"Lily saw a {rng.choice(['dog', 'cat', 'kite'])} in the park. She smiled. It was fun."
               for _ in range(120)]
    src.write_text(DOC_SEPARATOR.join(stories))
    cfg = _cfg(corpus_source="tinystories", corpus_path=str(src), num_stories=100,
               keyword_prompt_fraction=0.5, keyword_hit_rate=0.5)
    docs = list(iter_documents(cfg))
    assert len(docs) == 100
    prompt_docs = [d for d in docs if d.keywords]
    assert prompt_docs and any(d.hit for d in prompt_docs) and any(not d.hit for d in prompt_docs)
    for d in prompt_docs:
        story = d.text[len(d.prompt):]
        early = " ".join(split_sentences(story)[:2])
        assert all(mentions(early, k) for k in d.keywords) if d.hit else not any(mentions(story, k) for k in d.keywords)
    untitled = [d.text.split("\n", 1)[1] if d.text.startswith("Title: ") else d.text for d in docs if not d.keywords]
    assert untitled == [s for s, d in zip(stories[: len(docs)], docs, strict=True) if not d.keywords]
    assert any(d.text.startswith("Title: ") for d in docs if not d.keywords)


# --------------------------------------------------------------------------- config errors and CLI


@pytest.mark.parametrize("data, key", [
    ({"val_fraction": 1.5}, "data.val_fraction"),
    ({"keyword_hit_rate": -0.1}, "data.keyword_hit_rate"),
    ({"keyword_prompt_fraction": 2.0}, "data.keyword_prompt_fraction"),
    ({"num_stories": 0}, "data.num_stories"),
    ({"corpus_source": "tinystories"}, "data.corpus_path"),
    ({"corpus_source": "tinystories", "corpus_path": "/nonexistent/ts.txt"}, "data.corpus_path"),
    ({"max_keywords_per_prompt": 1000}, "data.max_keywords_per_prompt"),
])
def test_bad_data_config_fails_before_writing(tmp_path, data, key):
    out = tmp_path / "sub" / "corpus.txt"
    with pytest.raises(ConfigError, match=re.escape(key)):  # from the config itself or from build_corpus
        build_corpus(_cfg(**data), out)
    assert not out.exists()


def test_cli_main(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  num_stories: 50\n")
    assert main(["--config", str(cfg), "--out", str(tmp_path / "corpus.txt")]) == 0
    assert len(list(iter_tinystories(tmp_path / "corpus.txt"))) == 50
    assert "50 documents" in capsys.readouterr().out


def test_titled_plain_documents_record_their_title():
    docs = list(iter_documents(_cfg(num_stories=200, keyword_prompt_fraction=0.5, keyword_hit_rate=0.3)))
    titled = [d for d in docs if d.title]
    assert titled and all(not d.keywords for d in titled)
    for d in titled:
        head, story = d.text.split("\n", 1)
        assert head == f"Title: {d.title}"
        assert mentions(" ".join(split_sentences(story)[:2]), d.title)
