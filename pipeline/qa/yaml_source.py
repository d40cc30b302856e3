"""Reading hand-written YAML (rules, scorecards) with the line of every value kept for error messages.

PyYAML's ``compose`` gives the node tree with start marks; validating on nodes rather than on the loaded
dicts is what lets every complaint name the file and line a person has to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_STR = "tag:yaml.org,2002:str"


class RulesError(ValueError):
    """A rules or scorecard file that cannot be used, with where and why."""

    def __init__(self, file: str | Path, line: int, reason: str) -> None:
        self.file = str(file)
        self.line = line
        self.reason = reason
        super().__init__(f"{self.file}:{line}: {reason}")


@dataclass(frozen=True)
class YamlNode:
    """A composed YAML node with the file it came from, and typed accessors that fail with a line."""

    node: yaml.Node
    file: str

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1

    def fail(self, reason: str) -> RulesError:
        return RulesError(self.file, self.line, reason)

    def mapping(self, what: str, required: set[str], optional: set[str]) -> dict[str, YamlNode]:
        if not isinstance(self.node, yaml.MappingNode):
            raise self.fail(f"{what} must be a mapping")
        out: dict[str, YamlNode] = {}
        for key_node, value_node in self.node.value:
            key = YamlNode(key_node, self.file)
            name = key.string(f"key of {what}")
            if name in out:
                raise key.fail(f"duplicate key {name!r} in {what}")
            if name not in required | optional:
                allowed = ", ".join(sorted(required | optional))
                raise key.fail(f"unknown key {name!r} in {what} (allowed: {allowed})")
            out[name] = YamlNode(value_node, self.file)
        missing = sorted(required - out.keys())
        if missing:
            raise self.fail(f"{what} lacks required key(s): {', '.join(missing)}")
        return out

    def sequence(self, what: str, non_empty: bool = True) -> list[YamlNode]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.fail(f"{what} must be a list")
        items = [YamlNode(n, self.file) for n in self.node.value]
        if non_empty and not items:
            raise self.fail(f"{what} must not be empty")
        return items

    def _scalar(self, what: str) -> yaml.ScalarNode:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.fail(f"{what} must be a single value")
        return self.node

    def string(self, what: str) -> str:
        node = self._scalar(what)
        if node.tag != _STR or not str(node.value).strip():
            raise self.fail(f"{what} must be a non-empty string, got {node.value!r}")
        return str(node.value)

    def choice(self, what: str, choices: tuple[str, ...]) -> str:
        value = self.string(what)
        if value not in choices:
            raise self.fail(f"{what} must be one of {', '.join(choices)}; got {value!r}")
        return value

    def number(self, what: str, low: float | None = None, high: float | None = None) -> float:
        node = self._scalar(what)
        if node.tag not in (_INT, _FLOAT):
            raise self.fail(f"{what} must be a number, got {node.value!r}")
        value = float(node.value)
        if (low is not None and value < low) or (high is not None and value > high):
            raise self.fail(f"{what} must be within [{low}, {high}], got {value:g}")
        return value

    def boolean(self, what: str) -> bool:
        node = self._scalar(what)
        if node.tag != _BOOL:
            raise self.fail(f"{what} must be true or false, got {node.value!r}")
        return str(node.value).lower() in ("true", "yes", "on")


def compose_file(path: Path) -> YamlNode:
    """The root node of a YAML file; syntax errors become RulesError with their line."""
    try:
        root = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = int(mark.line) + 1 if mark is not None else 1
        raise RulesError(path, line, f"invalid YAML: {err.problem or err.context}") from err
    except yaml.YAMLError as err:
        raise RulesError(path, 1, f"invalid YAML: {err}") from err
    if root is None:
        raise RulesError(path, 1, "file is empty")
    return YamlNode(root, str(path))
