"""The documents against what they describe: the plan-field reference is the models' (docs/plan-fields.md,
written by tools/plan_fields.py from autotune/plan.py), and every relative link between the documents leads to a
file that exists."""

import re
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from autotune import plan as plan_module
from autotune.config import TrainConfig
from autotune.planner import plan as make_plan
from autotune.profiles import load_profile

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import plan_fields  # noqa: E402

DOCUMENTS = sorted(ROOT.glob("*.md")) + sorted((ROOT / "docs").rglob("*.md"))


def test_the_plan_field_reference_is_what_the_models_write():
    assert (ROOT / "docs" / "plan-fields.md").read_text() == plan_fields.render(), \
        "docs/plan-fields.md is stale: run .venv/bin/python tools/plan_fields.py"


def _paths(model: type[BaseModel], prefix: str = ""):
    """Every field's dotted path, at every depth, walked here apart from the generator."""
    for name, info in model.model_fields.items():
        yield prefix + name
        inner = plan_fields._model_in(info.annotation)
        if inner is not None:
            yield from _paths(inner, f"{prefix}{name}.")


def test_the_reference_names_every_field_at_every_depth_and_every_key_of_plan_json():
    doc = (ROOT / "docs" / "plan-fields.md").read_text()
    tables = {m.group(1): m.group(2) for m in re.finditer(r"### `([\w.]+)`\n(.*?)(?=\n#|\Z)", doc, re.S)}
    paths = list(_paths(plan_module.TrainingPlan))
    assert len(paths) > 80
    for path in paths:
        section, _, name = path.rpartition(".")
        assert f"| `{name}` |" in (tables.get(section, "") if section else doc), f"{path} is not in its table"
    flat = doc.split("## `plan --json`", 1)[1].split("\n## ", 1)[0]
    keys = re.findall(r"^\| `(\w+)` \|", flat, re.M)
    real = plan_module.public_dict(make_plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True))
    assert keys == list(real), "the flat table's keys are not plan --json's, in its order"


class _Engine(plan_module.EngineSection):
    num_widgets: int = Field(2, ge=1)  # widgets per node, a field this test adds


class _Plan(plan_module.TrainingPlan):
    engine: _Engine


def test_a_field_added_to_a_model_reaches_the_reference_with_its_comment():
    text = plan_fields.render(_Plan, plan_module.PUBLIC_FIELDS + (("num_widgets", "engine", "num_widgets"),))
    assert "| `num_widgets` | integer, >= 1 | 2 | widgets per node, a field this test adds |" in text
    assert "| `num_widgets` | `engine.num_widgets` | integer |" in text
    assert text != plan_fields.render()
    # inherited fields keep the comments of the class that declares them
    assert "| `node_rank` | integer, >= 0 | 0 | this node's rank, 0 .. num_nodes - 1 |" in text


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def broken_links(path: Path, text: str) -> list[str]:
    """The relative links in a Markdown text that lead to no file (web links and same-page anchors aside)."""
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#", 1)[0]).exists():
            bad.append(f"{path.relative_to(ROOT)}: {target}")
    return bad


def test_every_relative_link_between_the_documents_leads_to_a_file():
    assert ROOT / "README.md" in DOCUMENTS and len(DOCUMENTS) >= 8
    assert [b for d in DOCUMENTS for b in broken_links(d, d.read_text())] == []


def test_the_link_check_is_not_vacuous():
    readme = ROOT / "README.md"
    text = "[plan](docs/plan-fields.md#knobs), [gone](docs/nothing.md), [web](https://pytorch.org), [here](#top)"
    assert broken_links(readme, text) == ["README.md: docs/nothing.md"]
    assert broken_links(ROOT / "docs" / "x.md", "[up](../README.md) [same](plan-fields.md)") == []
