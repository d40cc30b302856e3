"""Property-based fuzzing of the rules YAML a QA lead writes: any file either loads or is refused with a
``RulesError`` naming the file, the line and why; never another exception, never a hang."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from pipeline.qa.rules import load_rules_file
from pipeline.qa.yaml_source import RulesError

scalars = st.none() | st.booleans() | st.integers(-(2**66), 2**66) | st.floats() | st.text(max_size=30)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=10)
window = st.fixed_dictionaries({}, optional={k: st.floats() | st.integers(-5, 10**9) | values
                                             for k in ("first_s", "last_s", "from_s", "to_s")})
sentiment = st.fixed_dictionaries({}, optional={k: values | st.floats(-2, 2) for k in
                                                ("below", "above", "over_s", "for_s", "trend", "leg")})
rule = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=20) | values, "category": st.text(max_size=12) | values,
    "type": st.sampled_from(["must", "must_not", "alert", "x"]) | values,
    "leg": st.sampled_from(["agent", "customer", "any", "both"]) | values,
    "match": st.sampled_from(["fuzzy", "exact", "regex"]) | values,
    "window": window | values, "threshold": st.floats() | values,
    "severity": st.sampled_from(["critical", "major", "minor", "info"]) | values,
    "phrases": st.lists(st.text(max_size=40), max_size=5) | values, "sentiment": sentiment | values,
    "description": values,
})
document = st.fixed_dictionaries({"rules": st.lists(rule, max_size=4) | values},
                                 optional={"version": st.sampled_from([1, 2, "1"]) | values})


def load(text: str) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "rules.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            return load_rules_file(path)
        except RulesError as exc:
            assert exc.reason and exc.file == str(path) and exc.line >= 0
            return None


@given(document.map(lambda d: yaml.safe_dump(d, allow_unicode=True)))
def test_any_rules_document_loads_or_is_refused_with_file_line_and_reason(text: str) -> None:
    load(text)


@given(st.text(max_size=400))
def test_any_text_as_a_rules_file_loads_or_is_refused_with_file_line_and_reason(text: str) -> None:
    load(text)
