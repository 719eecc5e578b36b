"""Relations: (subject, answer) facts plus the prompt that asks for the answer.

One type serves every source: the synthetic world (:func:`lab.world.from_world`), the LRE JSON format of
Hernandez et al. 2024 (:func:`load_lre`: ``{name, prompt_templates, samples: [{subject, object}],
properties}``), and the project's own JSON format (:meth:`Relation.save` / :func:`load_relations`:
``{name, template, samples: [{subject, answer}], properties}``), where ``template`` contains
``{}`` for the subject (or a per-sample ``prompt`` overrides it). The LRE relations ship with
the package: ``load_relations(lre_dir() / "factual")``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .prompts import Prompt
from .results import write_json


class RelationError(ValueError):
    pass


@dataclass
class Relation:
    name: str
    subjects: list[str]
    answers: list[str]
    template: str = "{}"
    prompts_override: list[str] | None = None
    properties: dict = field(default_factory=dict)

    def __post_init__(self):
        if len(self.subjects) != len(self.answers):
            raise RelationError(
                f"relation {self.name!r}: {len(self.subjects)} subjects but {len(self.answers)} answers"
            )
        if self.prompts_override is None and "{}" not in self.template:
            raise RelationError(
                f"relation {self.name!r}: template {self.template!r} has no '{{}}' where the subject goes"
            )

    def __len__(self) -> int:
        return len(self.subjects)

    def prompts(self) -> list[Prompt]:
        if self.prompts_override is not None:
            return [Prompt(p, s) for p, s in zip(self.prompts_override, self.subjects)]
        return [Prompt(self.template.format(s), s) for s in self.subjects]

    def content_digest(self) -> str:
        """A hash of the relation's contents: its name (a study seeds its design with it), subjects,
        answers, prompts and properties."""
        key = {
            "name": self.name,
            "subjects": self.subjects,
            "answers": self.answers,
            "prompts": [p.text for p in self.prompts()],
            "properties": self.properties,
        }
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def answer_set(self) -> list[str]:
        return sorted(set(self.answers))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "relation": self.name,
                "subject": self.subjects,
                "answer": self.answers,
                "prompt": [p.text for p in self.prompts()],
            }
        )

    def save(self, path: str | Path) -> None:
        samples = [{"subject": s, "answer": a} for s, a in zip(self.subjects, self.answers)]
        if self.prompts_override is not None:
            for d, p in zip(samples, self.prompts_override):
                d["prompt"] = p
        write_json(
            {"name": self.name, "template": self.template, "samples": samples, "properties": self.properties}, path
        )


def _from_dict(d: dict, source: str) -> Relation:
    """A relation from a parsed JSON object; every error names ``source`` and the JSON path."""
    if not isinstance(d, dict):
        raise RelationError(f"{source}: a relation file holds one JSON object, found {type(d).__name__}")
    missing = [k for k in ("name", "samples") if k not in d]
    if missing:
        raise RelationError(f"{source}: a relation file needs 'name' and 'samples'; missing {missing}")
    samples = d["samples"]
    if not isinstance(samples, list) or not samples:
        raise RelationError(
            f"{source}: $.samples must be a non-empty list of {{subject, answer}} objects "
            f"(found {type(samples).__name__} of length {len(samples) if hasattr(samples, '__len__') else '?'})"
        )
    lre = "prompt_templates" in d
    answer_key = "object" if lre else "answer"
    for i, smp in enumerate(samples):
        if not isinstance(smp, dict):
            raise RelationError(
                f"{source}: $.samples[{i}] must be an object with 'subject' and {answer_key!r}, found {smp!r}"
            )
        for key in ("subject", answer_key):
            if not isinstance(smp.get(key), str) or not smp.get(key).strip():
                raise RelationError(
                    f"{source}: $.samples[{i}].{key} must be a non-empty string, found {smp.get(key)!r}"
                    + (f" (keys there: {sorted(smp)})" if key not in smp else "")
                )
    if lre:  # LRE format
        templates = d["prompt_templates"] or d.get("prompt_templates_zs") or []
        if not templates:
            raise RelationError(f"{source}: $.prompt_templates of LRE relation {d['name']!r} is empty")
        return Relation(
            d["name"],
            [s["subject"] for s in samples],
            [s["object"] for s in samples],
            templates[0],
            None,
            dict(d.get("properties", {}), source="lre"),
        )
    template = d.get("template", "{}")
    prompts = [s.get("prompt") for s in samples]
    if any(p is not None for p in prompts):  # a sample's own prompt overrides the template, for that sample only
        if "{}" not in template and not all(p is not None for p in prompts):
            raise RelationError(
                f"{source}: some samples have their own 'prompt' and others none, and $.template "
                f"{template!r} has no '{{}}' to write the others from"
            )
        prompts = [template.format(s["subject"]) if p is None else p for p, s in zip(prompts, samples)]
        for i, (p, s) in enumerate(zip(prompts, samples)):
            if s["subject"] not in p:
                raise RelationError(f"{source}: $.samples[{i}].prompt {p!r} does not contain its subject")
    try:
        return Relation(
            d["name"],
            [s["subject"] for s in samples],
            [s["answer"] for s in samples],
            template,
            prompts if all(p is not None for p in prompts) else None,
            d.get("properties", {}),
        )
    except RelationError as err:
        raise RelationError(f"{source}: {err}") from None


def lre_dir() -> Path:
    """The 47 LRE relations of Hernandez et al. (MIT license), shipped with the package."""
    return Path(__file__).resolve().parent / "data" / "lre"


def load_relations(paths: str | Path | Iterable[str | Path]) -> list[Relation]:
    """Relations from JSON files or directories of them (searched recursively), LRE or project format."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("*.json"))
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"no relation file or directory at {p}")
    if not files:
        raise RelationError(f"no .json relation files under {list(map(str, paths))}")
    out = []
    for f in files:
        try:
            d = json.loads(f.read_text())
        except json.JSONDecodeError as err:
            raise RelationError(f"{f}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
        out.append(_from_dict(d, str(f)))
    return out


load_lre = load_relations
