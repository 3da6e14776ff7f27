"""The inspector's report: one :class:`Verdict` per finding, gathered in a :class:`Report`."""

from __future__ import annotations

from dataclasses import dataclass, field

#: The ``schema`` field of ``spectrace inspect-draft --format json``.
SCHEMA = "spectrace.inspect-draft/1"
#: Verdict levels, mildest first.
LEVELS = ("ok", "info", "warn", "error")


@dataclass
class Verdict:
    """One line of the report: a check name, a level (one of :data:`LEVELS`) and a sentence."""

    check: str
    level: str
    message: str

    def to_json(self) -> dict:
        """``{"check", "level", "message"}``."""
        return {"check": self.check, "level": self.level, "message": self.message}


@dataclass
class Report:
    """All verdicts for one checkpoint, in the order the checks ran.

    Attributes:
        checkpoint: the checkpoint folder as given; target: the target folder used, or None.
    """

    checkpoint: str
    target: str | None
    verdicts: list[Verdict] = field(default_factory=list)

    def add(self, check: str, level: str, message: str) -> None:
        """Append one verdict (``level`` must be one of :data:`LEVELS`)."""
        assert level in LEVELS, level
        self.verdicts.append(Verdict(check, level, message))

    @property
    def errors(self) -> int:
        """The number of ``error`` verdicts."""
        return sum(v.level == "error" for v in self.verdicts)

    @property
    def warnings(self) -> int:
        """The number of ``warn`` verdicts."""
        return sum(v.level == "warn" for v in self.verdicts)

    def to_json(self) -> dict:
        """The ``spectrace.inspect-draft/1`` document."""
        return {
            "schema": SCHEMA,
            "checkpoint": self.checkpoint,
            "target": self.target,
            "errors": self.errors,
            "warnings": self.warnings,
            "verdicts": [v.to_json() for v in self.verdicts],
        }

    def text(self) -> str:
        """The human report: a header line, one line per verdict, a verdict line."""
        head = f"checkpoint {self.checkpoint}"
        lines = [head + (f"  (target {self.target})" if self.target else "")]
        for v in self.verdicts:
            level = v.level.upper() if v.level == "error" else v.level
            lines.append(f"  {level:<5}  {v.check:<13} {v.message}")
        lines.append(
            f"verdict: {self.errors} error{'s' * (self.errors != 1)}, "
            f"{self.warnings} warning{'s' * (self.warnings != 1)}"
        )
        return "\n".join(lines)
