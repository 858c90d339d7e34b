"""The report's landing page (workflow/report/workflow.rst) as Snakemake renders it: Jinja with
trim_blocks and lstrip_blocks (snakemake.report), then docutils to HTML. The variants are a list,
one item per variant, and no report text cites an upstream issue number."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from docutils.core import publish_parts
from jinja2 import Environment

REPO = Path(__file__).resolve().parents[1]
REPORT = REPO / "workflow" / "report"


def render(config: dict) -> str:
    class Snakemake:  # what snakemake.report passes to the template
        pass

    Snakemake.config = config
    env = Environment(trim_blocks=True, lstrip_blocks=True)  # snakemake.report.auto_report's settings
    text = env.from_string((REPORT / "workflow.rst").read_text()).render(snakemake=Snakemake, categories={},
                                                                        files={})
    return publish_parts(text, writer="html", settings_overrides={"report_level": 5})["html_body"]


def test_variants_render_as_a_list_one_item_each():
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    page = render(config)
    first = page.index("Variants (overrides of")
    items = re.findall(r"<li>(.*?)</li>", page[first:], flags=re.S)[: len(config["variants"])]
    assert len(config["variants"]) >= 2
    for name, item in zip(config["variants"], items, strict=True):
        assert item.removeprefix("<p>").startswith(f"<strong>{name}</strong>:"), item
        assert "- <strong>" not in item and "</strong>: " in item  # no run-on: one variant per item
    assert re.search(r"<(tt|code)[^>]*>weight_sync.transport: rdt</(tt|code)>", page)  # settings as code


def test_no_report_text_cites_an_upstream_issue_number():
    for rst in sorted(REPORT.glob("*.rst")):
        assert not re.search(r"#\d{3,}|issues/\d+", rst.read_text()), rst.name
