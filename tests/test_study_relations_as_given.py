"""A study on a world model uses the relations it is given, as given (issue 54: a user's relation
named like a world relation was silently replaced by the world's true facts; under any other name it
was refused)."""

from __future__ import annotations

import random
import tempfile

from interp.relations import Relation
from lab.study import StudyConfig
from lab.study.run import make_study
from lab.world import from_world, load_world

CONFIG = StudyConfig(label_seeds=(0,), finetune_seeds=(0,), other_categories=())


def _study(relations):
    study, _ = make_study("world", relations, tempfile.mkdtemp(), CONFIG, "nnsight", False, min_relations=1)
    return study


def test_a_users_shuffled_facts_are_kept_not_replaced_by_the_worlds():
    (city,) = from_world(load_world(), ["city"])
    shuffled = list(city.answers)
    random.Random(0).shuffle(shuffled)
    null = Relation("city", city.subjects, shuffled, city.template, None, {"source": "shuffled"})
    mine = Relation("my city", city.subjects, city.answers, city.template)
    study = _study([null, mine, "continent"])
    assert study.relations["city"].answers == shuffled != city.answers
    assert study.relations["my city"].answers == city.answers
    assert study.relations["continent"].properties["source"] == "world"


def test_a_relation_with_exactly_the_worlds_facts_is_the_worlds():
    (city,) = from_world(load_world(), ["city"])
    copy = Relation("city", list(city.subjects), list(city.answers), city.template, [p.text for p in city.prompts()])
    assert _study([copy]).relations["city"].properties == city.properties
