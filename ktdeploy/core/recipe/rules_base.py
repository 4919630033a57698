"""What every rule module shares: the context a rule reports through (``Ctx``), a module's own list of rules
(``RuleSet``) and the small value helpers. The rule modules import only this; ``rules.py`` puts their lists in the
one order `check` runs them (so no rule module imports another to register itself)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from ktdeploy.core.recipe import catalog as cat
from ktdeploy.core.recipe.document import Recipe
from ktdeploy.core.recipe.finding import Finding, Severity
from ktdeploy.core.safeio import inside as _inside
from ktdeploy.core.safeio import norm_path

RuleFn = Callable[["Ctx"], None]


class RuleSet:
    """One module's rules, in the order it defines them: ``rule = RuleSet(); @rule("id")``."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, RuleFn]] = []

    def __call__(self, rule_id: str) -> Callable[[RuleFn], RuleFn]:
        def deco(fn: RuleFn) -> RuleFn:
            self.rules.append((rule_id, fn))
            return fn
        return deco


@dataclass
class Ctx:
    recipe: Recipe
    findings: list[Finding] = field(default_factory=list)
    current: str = ""

    @property
    def t(self) -> dict[str, Any]:
        return self.recipe.train

    @property
    def a(self) -> dict[str, Any]:
        return self.recipe.accelerate

    @property
    def k(self) -> dict[str, Any]:
        return self.recipe.kt_config

    @property
    def use_kt(self) -> bool:
        return self.t.get("use_kt") is True

    def _add(self, sev: Severity, path: str, message: str, fix: str) -> None:
        file, line = self.recipe.raw.source.where(path)
        self.findings.append(Finding(sev, path, message, fix, self.current, file, line))

    guesses_left: int = 50  # "did you mean" costs ~3 ms a key: a recipe of 20,000 unknown keys gets 50 of them

    def guess(self, key: str, candidates: Iterable[str]) -> str | None:
        if self.guesses_left <= 0 or len(key) > 80:
            return None
        self.guesses_left -= 1
        return cat.did_you_mean(key, candidates)

    def error(self, path: str, message: str, fix: str = "") -> None:
        self._add("error", path, message, fix)

    def warn(self, path: str, message: str, fix: str = "") -> None:
        self._add("warning", path, message, fix)


# ---------------------------------------------------------------- helpers

def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def _norm(p: Any) -> str | None:
    if not isinstance(p, str) or not p.startswith("/") or "\x00" in p:
        return None
    return norm_path(p)


def inside(path: str, root: str) -> bool:
    """The one containment test of recipe paths (ktdeploy.core.safeio.inside: '//', '/./', '/' and '..' collapse)."""
    return _inside(path, root)


def _truthy(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.lower() in ("true", "1", "yes"))


