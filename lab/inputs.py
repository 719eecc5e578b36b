"""A command's inputs, checked before any work: each check raises :class:`InputError` with one
paragraph that says what was wrong and what to give instead (the ``interp`` command line prints it
without a traceback; ``--debug`` shows one).

The checks are cheap (no model is loaded, nothing is captured) so that a typo in the last option of
a long command fails in a second, not after an hour of capture and probes.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import interp
from interp.models import ModelNotFoundError, registered_models, resolve_path
from lab.world import load_world
from lab.world.relations import check_relation_names

#: the executors ``interp study --executor`` takes (:func:`lab.executors.executor_for`)
EXECUTORS = ("serial", "processes", "grouped", "ray")


class InputError(ValueError):
    """An input a command cannot run with."""


def _did_you_mean(word: str, choices, cutoff: float = 0.5) -> str:
    near = difflib.get_close_matches(word, list(choices), n=3, cutoff=cutoff)
    return f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""


def check_out(out: Path, option: str = "--out") -> Path:
    """A results folder: it may be missing (it is created) or a folder (resumed), not a file."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(
            f"{option} {out} is a file, but it must name a folder for the results (created if missing, resumed "
            f"if it holds an earlier run); give a folder path, e.g. {option} results/{out.stem or 'run'}"
        )
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{option} {out}: {parent} is a file, so no folder can be made under it")
            break
    return out


def check_model(spec: str) -> str:
    """A registered name (``world``, ``minilm``...), a model directory, or a hub name in the local cache."""
    try:
        resolve_path(spec)
    except ModelNotFoundError as err:
        raise InputError(f"--model {spec}: {err}") from err
    return spec


def check_backend(name: str) -> str:
    if name not in interp.BACKENDS:
        raise InputError(
            f"--backend {name!r} is not a backend{_did_you_mean(name, interp.BACKENDS, 0.3)}; "
            f"choose one of {', '.join(interp.BACKENDS)}"
        )
    return name


def check_executor(name: str) -> str:
    if name not in EXECUTORS:
        raise InputError(
            f"--executor {name!r} is not an executor{_did_you_mean(name, EXECUTORS)}; choose one of "
            f"{', '.join(EXECUTORS)}"
        )
    return name


def check_methods(methods: str) -> tuple[str, ...]:
    out = tuple(m.strip() for m in methods.split(",") if m.strip())
    bad = [m for m in out if m not in ("full", "lora")]
    if bad or not out:
        raise InputError(f"--methods {methods!r}: give a comma-separated list of full and lora, e.g. full,lora")
    return out


def check_world_relations(names, world=None) -> list[str]:
    """Relation names of the (default) world, each checked against its list."""
    try:
        return check_relation_names(world if world is not None else load_world(), names)
    except ValueError as err:
        raise InputError(str(err)) from None


def check_relation_files(paths) -> list[Path]:
    """Relation JSON files or folders of them (``docs/probes.md`` documents the format)."""
    out = []
    for p in map(Path, paths):
        if not p.exists():
            raise InputError(
                f"no relation file or folder at {p}; give relation JSON files or folders of them "
                "(the format: docs/probes.md#your-own-relations)"
            )
        out.append(p)
    return out


def check_choice(value: str, choices, what: str) -> str:
    if value not in choices:
        raise InputError(f"{what} {value!r} is not one of {', '.join(choices)}{_did_you_mean(value, choices)}")
    return value


__all__ = [
    "InputError",
    "EXECUTORS",
    "check_out",
    "check_model",
    "check_backend",
    "check_executor",
    "check_methods",
    "check_world_relations",
    "check_relation_files",
    "check_choice",
    "registered_models",
]
