"""Settings variants named on the command line: ``--variant beam_size=5,context_tokens=64``.

A piece without ``=`` goes on the previous setting's value, so a value may hold commas:
``--variant "hot_words=Harbor Mutual,Linda Carter"``.

A benchmark runs ours at the current settings and, beside it, at each variant; the variant's label names
it in tables and its changed settings go into the result document.
"""

from __future__ import annotations

from typing import Any

import pydantic

from pipeline.config import Settings


class BadVariant(ValueError):
    """A --variant that is not setting=value pairs of known settings with valid values; one line why."""


def _pairs(spec: str) -> list[tuple[str, str]]:
    """``"a=1,b=x,y"`` -> [("a", "1"), ("b", "x,y")]: a piece without ``=`` continues the value before it."""
    pairs: list[tuple[str, str]] = []
    for item in spec.split(","):
        name, sep, value = (part.strip() for part in item.partition("="))
        if sep and name in Settings.model_fields:
            pairs.append((name, value))
        elif not sep and pairs:
            pairs[-1] = (pairs[-1][0], f"{pairs[-1][1]},{item.strip()}")
        else:
            raise BadVariant(f"--variant {spec!r}: expected setting=value pairs, {item!r} is not one")
    return pairs


def settings_variant(settings: Settings, spec: str) -> tuple[str, Settings]:
    """``"beam_size=5,context_tokens=64"`` -> its label and the settings with those values (validated)."""
    merged = settings.model_copy()
    for name, value in _pairs(spec):
        try:  # the field's own type and bounds, as an environment variable would be checked
            Settings.__pydantic_validator__.validate_assignment(merged, name, value)
        except pydantic.ValidationError as exc:
            raise BadVariant(f"--variant {spec!r}: {name}: {exc.errors()[0]['msg']}") from exc
    return spec.replace("_", " ").replace("=", " "), merged


def changed_settings(base: Settings, variant: Settings) -> dict[str, Any]:
    """The settings ``variant`` gives other values than ``base``, with the variant's values (JSON-ready)."""
    names = {name for name in Settings.model_fields if getattr(base, name) != getattr(variant, name)}
    return variant.model_dump(mode="json", include=names)


def worker_overrides(spec: str) -> dict[str, str]:
    """``"max_batch=8,beam_size=5"`` -> the settings as a worker's environment takes them (name -> the value
    as written), after checking each as ``settings_variant`` does: a worker started with them gets exactly
    the variant, whatever else the environment sets."""
    settings_variant(Settings(), spec)  # raises BadVariant: unknown setting, bad value
    return dict(_pairs(spec))
