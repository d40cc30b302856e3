"""Call categories (rules/categories/*.yaml): a call's kind, as QA supervisors filter and count calls by it.

A category is a combination of rules (rules/*.yaml), so everything a rule can test — phrases exact or
ASR-tolerant, a leg, a time window ("within the first 30 s"), absence (a ``must`` rule missing), a
sentiment threshold or drop — a category can use, and the rule's evidence is the category's:

    categories:
      - name: cancellation
        description: The customer wants to cancel or close the policy.
        any: [cancellation_intent]             # one of these rules held
      - name: escalation_unresolved
        all: [escalation_request]              # each of these held
        none: [closing]                        # and none of these

A rule *held* on a call when it produced a ``match`` (a ``must`` rule said), a ``violation`` (a ``must_not``
rule said) or an ``alert`` (a ``detect`` rule, a sentiment drop); a ``must`` rule that is ``missing`` did
not hold, so ``none: [recording_disclosure]`` is "the disclosure was missing". A category holds when all of
``all`` held, at least one of ``any`` (when given) held, and none of ``none`` held. A rule name that no
rules file defines is an error naming the file and line, at load.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.qa.rules import QaEvent, RuleSet, notify_targets
from pipeline.qa.yaml_source import RulesError, YamlNode, compose_file

HELD = ("match", "violation", "alert")
FOLDER = "categories"  # under the rules folder


@dataclass(frozen=True)
class Category:
    name: str
    description: str
    any: tuple[str, ...] = ()
    all: tuple[str, ...] = ()
    none: tuple[str, ...] = ()
    notify: tuple[str, ...] = ()  # webhooks the live alerts of its any/all rules go to (pipeline/notify/)

    def holds(self, held: set[str]) -> bool:
        return (all(r in held for r in self.all) and (not self.any or any(r in held for r in self.any))
                and not any(r in held for r in self.none))


def categorize(events: Iterable[QaEvent], categories: Iterable[Category]) -> list[str]:
    """The categories a call is in, given its QA events (the complete evaluation at call end)."""
    held = {e.rule for e in events if e.kind in HELD}
    return [c.name for c in categories if c.holds(held)]


def load_categories(rules_dir: str | Path, rule_set: RuleSet) -> tuple[Category, ...]:
    """Every category of ``<rules_dir>/categories/*.yaml`` (none when the folder is absent)."""
    folder = Path(rules_dir) / FOLDER
    found: dict[str, tuple[Category, Path, int]] = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        root = compose_file(path).mapping("categories file", {"categories"}, {"version"})
        for node in root["categories"].sequence("categories"):
            category = _parse(node, rule_set)
            if category.name in found:
                _, first, line = found[category.name]
                raise RulesError(path, node.line, f"category {category.name!r} already defined at {first}:{line}")
            found[category.name] = (category, path, node.line)
    return tuple(c for c, _, _ in found.values())


def _parse(node: YamlNode, rule_set: RuleSet) -> Category:
    keys = node.mapping("category", {"name"}, {"description", "any", "all", "none", "notify"})
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("any", "all", "none"):
        names = tuple(n.string(f"rule name in {key}") for n in keys[key].sequence(key)) if key in keys else ()
        unknown = [n for n in names if rule_set.by_name(n) is None]
        if unknown:
            raise keys[key].fail(f"no rule named {', '.join(map(repr, unknown))} (rules: "
                                 f"{', '.join(sorted(rule_set.names))})")
        lists[key] = names
    if not any(lists.values()):
        raise node.fail("a category needs rules: any, all or none")
    return Category(keys["name"].string("name"), keys["description"].string("description") if "description" in keys
                    else "", lists["any"], lists["all"], lists["none"],
                    notify_targets(keys["notify"]) if "notify" in keys else ())
