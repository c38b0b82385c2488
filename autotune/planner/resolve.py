"""One place where a user's value meets the planner's: ``Resolver.resolve``.

Every knob is decided by a small function returning a ``Decision(value, reason)``;
``resolve`` then applies the user's value if there is one and records
"auto would choose X, you set Y". ``--no_auto_optimize`` is a mode of the same
resolution: the config's value is taken verbatim, a value left ``auto`` either gets
its documented verbatim default or is a problem, and every problem is listed at once.
A value you set comes from the config (a flag is the config's value) or from a variable
you exported that the ranks run with (``sources``); its reason names where.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from autotune.config import AUTO
from autotune.errors import UserError
from autotune.plan import Knob, Override

VERBATIM = "--no_auto_optimize: taken from the config verbatim"

# Where a value came from: the planner's own, the config, a flag you passed, or a variable you exported (the launch
# leaves it in the ranks' environment, so the plan is what they run with). EXPORTED_AS: the variable of each knob one
# can set.
Source = Literal["planner", "config", "environment", "flag"]
EXPORTED_AS: dict[Knob, str] = {"omp_num_threads": "OMP_NUM_THREADS"}


@dataclass(frozen=True)
class Decision:
    value: Any
    reason: str


class _Required:
    """Marker: with --no_auto_optimize this knob must be set in the config."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


def is_set(value: Any) -> bool:
    return value is not AUTO and value != AUTO


@dataclass
class Resolver:
    auto_optimize: bool = True
    # the source of each value you set that the config holds for another (the environment); the rest: the config
    sources: Mapping[Knob, Source] = field(default_factory=dict)
    reasons: dict[Knob, str] = field(default_factory=dict)
    overrides: dict[Knob, Override] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def explain(self, knob: Knob, reason: str) -> None:
        """A derived value's reason (nothing for the user to override)."""
        self.reasons[knob] = reason

    def resolve(self, knob: Knob, user: Any, auto: Callable[[], Decision], *, path: str | None = None,
                verbatim: Any = REQUIRED, verbatim_reason: str | None = None) -> Any:
        """The user's value if set, else the planner's (or, verbatim, the default or a problem). ``path``
        (the config field) names a value that --no_auto_optimize requires (no ``verbatim`` default)."""
        if not self.auto_optimize:
            if is_set(user):
                mine = self.source(knob, user) == "config"
                flag = self.source(knob, user) == "flag"
                self.reasons[knob] = VERBATIM if mine else f"--no_auto_optimize: you set {user} (a flag), taken " \
                    "verbatim" if flag else f"--no_auto_optimize: {self.yours(knob, user)}"
                return user
            if verbatim is REQUIRED:
                self.problems.append(f"{path}: required with --no_auto_optimize (it is 'auto')")
                return None
            self.reasons[knob] = verbatim_reason or "--no_auto_optimize: 'auto' means off/0 here"
            return verbatim
        decision = auto()
        if is_set(user):
            self.overrides[knob] = Override(auto=decision.value, chosen=user)
            self.reasons[knob] = f"{self.yours(knob, user)} (auto would choose {decision.value}: {decision.reason})"
            return user
        self.reasons[knob] = decision.reason
        return decision.value

    def source(self, knob: Knob, user: Any) -> Source:
        """Where ``knob``'s value comes from: the planner (``user`` is auto), the config, or your environment."""
        if not is_set(user):
            return "planner"
        return self.sources.get(knob, "config")

    def yours(self, knob: Knob, user: Any) -> str:
        """A value you set, named by its source: "you set 3", or "OMP_NUM_THREADS=3 in your environment"."""
        if self.source(knob, user) == "environment":
            return f"{EXPORTED_AS[knob]}={user} in your environment (the ranks run with it)"
        return f"you set {user}"

    def raise_problems(self) -> None:
        if self.problems:
            raise UserError("--no_auto_optimize uses the config verbatim, but values are missing", self.problems)
