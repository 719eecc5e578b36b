"""The world's relations as :class:`interp.relations.Relation` objects, for every analyzer."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from interp.relations import Relation

from .world import World


def check_relation_names(world: World, relations: Iterable[str]) -> list[str]:
    """``relations``, each a relation of ``world`` (an unknown name raises, with the nearest ones)."""
    names = [r.name for r in world.spec.relations]
    relations = list(relations)
    unknown = [n for n in relations if n not in world.relation]
    if unknown:
        near = difflib.get_close_matches(unknown[0], names, n=3, cutoff=0.5)
        raise ValueError(
            f"the world has no relation {unknown[0]!r}"
            + (f" (did you mean {' or '.join(map(repr, near))}?)" if near else "")
            + f"; its relations: {', '.join(names)}"
        )
    return relations


def from_world(world: World, relations: Iterable[str] | None = None) -> list[Relation]:
    """The world's relations, prompted exactly as the world's corpus writes each fact."""
    out = []
    for name in check_relation_names(world, relations) if relations else [r.name for r in world.spec.relations]:
        q = world.queries(name)
        r = world.relation[name]
        out.append(
            Relation(
                name,
                list(q.subject),
                list(q.answer),
                "{} " + world.templates(name)[0],
                list(q.prompt),
                {
                    "source": "world",
                    "n_answers": r.n_answers,
                    "templates": r.templates,
                    "mentions": r.mentions,
                    "augment": r.augment,
                    "bio": r.bio,
                    "derived_from": r.derived_from,
                },
            )
        )
    return out
