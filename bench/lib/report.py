"""Result rows, the printed table, and the JSON + Markdown files under bench/results/."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True)
class Goal:
    """A target from the issue. on="ratio": rayscore / baseline; on="value": the rayscore figure itself."""

    op: Literal[">=", "<="]
    target: float
    on: Literal["ratio", "value"] = "ratio"

    def met(self, value: float | None) -> bool | None:
        if value is None:
            return None
        return value >= self.target if self.op == ">=" else value <= self.target

    def text(self, unit: str = "") -> str:
        sign = "≥" if self.op == ">=" else "≤"
        suffix = "×" if self.on == "ratio" else f" {unit}" if unit else ""
        return f"{sign} {self.target:g}{suffix}"

    def __str__(self) -> str:
        return self.text()


@dataclass
class Row:
    workload: str
    measure: str
    unit: str
    rayscore: float | None
    baseline_name: str = ""
    baseline: float | None = None
    goal: Goal | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.rayscore is None or not self.baseline:
            return None
        return self.rayscore / self.baseline

    @property
    def met(self) -> bool | None:
        if self.goal is None:
            return None
        return self.goal.met(self.ratio if self.goal.on == "ratio" else self.rayscore)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["goal"] = self.goal.text(self.unit) if self.goal else None
        d["goal_spec"] = asdict(self.goal) if self.goal else None
        d["ratio"], d["met"] = self.ratio, self.met
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Row:
        """A row as to_json wrote it (a child process's results)."""
        goal = Goal(**d["goal_spec"]) if d.get("goal_spec") else None
        return cls(d["workload"], d["measure"], d["unit"], d["rayscore"], d.get("baseline_name", ""),
                   d.get("baseline"), goal, d.get("note", ""))


def fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "–"
    if unit == "%":
        return f"{x:.1f} %"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    if abs(x) >= 1e-3:
        return f"{x:.4f}"
    return f"{x:.1e}"


def _cells(r: Row) -> list[str]:
    unit = f" {r.unit}" if r.unit and r.unit != "%" else ""
    met = {True: "yes", False: "NO", None: ""}[r.met]
    return [r.workload, r.measure, fmt(r.rayscore, r.unit) + unit, r.baseline_name,
            (fmt(r.baseline, r.unit) + unit) if r.baseline is not None else "",
            f"{r.ratio:.2f}" if r.ratio is not None else "",
            f"{r.goal.text(r.unit)} {met}".strip() if r.goal else ""]


HEADER = ["workload", "measure", "rayscore", "baseline", "baseline figure", "ratio", "goal"]


def table_text(rows: list[Row]) -> str:
    cells = [HEADER] + [_cells(r) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(len(HEADER))).rstrip() for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  [{r.workload} / {r.measure}] {r.note}" for r in rows if r.note]
    return "\n".join(lines + (["", "notes:"] + notes if notes else []))


def table_markdown(rows: list[Row]) -> str:
    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in _cells(r)) + " |")
    notes = [f"- *{r.workload}, {r.measure}*: {r.note}" for r in rows if r.note]
    return "\n".join(out + ([""] + notes if notes else [])) + "\n"


# The instruction sets that decide the figures: float32 matmul width (AVX2 vs AVX-512) and bfloat16 units.
# A VM's model name ("Intel(R) Xeon(R) Processor") often says neither, and the same project runs on both kinds.
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), None)
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    isa = [f for f in ISA_FLAGS if f in flags]
    name = name or platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} cores" + (f" ({', '.join(isa)})" if isa else "")


def environment(settings: Any) -> dict[str, Any]:
    import torch
    import transformers

    return {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu_name(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "settings": asdict(settings),
            "command": "python -m bench " + " ".join(sys.argv[1:])}


def write(rows: list[Row], details: dict[str, Any], env: dict[str, Any], out_dir: Path,
          stem: str | None = None) -> tuple[Path, Path]:
    """<out_dir>/<stem>.json and .md; stem defaults to the current time (pass it again to rewrite)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = stem or time.strftime("%Y%m%d-%H%M%S")
    js, md = out_dir / f"{stamp}.json", out_dir / f"{stamp}.md"
    js.write_text(json.dumps({"environment": env, "rows": [r.to_json() for r in rows], "details": details},
                             indent=2, default=str) + "\n")
    mode = env["settings"]["mode"]
    head = (f"Measured {env['date']} on {env['cpu']}, torch {env['torch']}, transformers {env['transformers']}, "
            f"{env['settings']['threads']} threads, float32 unless a row says otherwise ({mode} run, median of "
            f"{env['settings']['reps']} alternating repetitions).\nReproduce: `{env['command']}`\n\n")
    md.write_text(head + table_markdown(rows))
    return js, md
