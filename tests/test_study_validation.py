"""Every bad input of a study fails before any work, with a message that says what to do."""

import json
from dataclasses import replace

import pytest

from interp.relations import Relation, RelationError, load_relations
from lab.study import FinetuneConfig, Study, StudyConfig, StudyConfigError, run_study

RELATIONS = ["continent", "hand", "season", "diet"]
CFG = StudyConfig(
    finetune_budget=(9, 16),
    methods=("full",),
    label_seeds=(0,),
    finetune_seeds=(0,),
    other_categories=(),
    folds=3,
    n_boot=100,
    n_perm=100,
    n_null=200,
)


def _no_work_done(out):
    """Nothing was computed: no readability table, no fine-tune."""
    return (
        not (out / "readability.csv").exists() and not list((out / "runs").glob("*.json"))
        if (out / "runs").exists()
        else True
    )


def test_fixed_layer_beyond_the_model_fails_before_any_work(tmp_path):
    with pytest.raises(StudyConfigError, match=r"fixed_layer=9: model .* has layers 0 to 3"):
        run_study("world", RELATIONS, out=tmp_path, config=replace(CFG, fixed_layer=9), progress=False)
    assert _no_work_done(tmp_path) and not (tmp_path / "study.json").exists()


def test_too_few_relations_fail_before_any_work(tmp_path):
    with pytest.raises(StudyConfigError, match="3 relation\\(s\\) given; .* need at least 4"):
        run_study("world", RELATIONS[:3], out=tmp_path, config=CFG, progress=False)
    assert _no_work_done(tmp_path)


def test_a_template_without_a_subject_slot_is_refused(tmp_path):
    cfg = replace(CFG, finetune=FinetuneConfig(template="is associated with the word"))
    with pytest.raises(StudyConfigError, match="must contain '\\{\\}' exactly once"):
        run_study("world", RELATIONS, out=tmp_path, config=cfg, progress=False)
    cfg = replace(CFG, finetune=FinetuneConfig(template="{} and {} go with"))
    with pytest.raises(StudyConfigError, match="found 2 replacement field"):
        run_study("world", RELATIONS, out=tmp_path, config=cfg, progress=False)


def test_every_problem_is_listed_at_once(tmp_path):
    cfg = replace(CFG, category="birds", folds=1, methods=("full", "qlora"), finetune_budget=(30, 10))
    with pytest.raises(StudyConfigError) as err:
        run_study("world", RELATIONS, out=tmp_path, config=cfg, progress=False)
    msg = str(err.value)
    assert len(err.value.problems) == 4
    for part in (
        "category 'birds' is not a label category; valid: animals",
        "folds=1",
        "'qlora'",
        "finetune_budget=(30, 10)",
    ):
        assert part in msg
    with pytest.raises(StudyConfigError, match="unknown StudyConfig field"):
        run_study("world", RELATIONS, out=tmp_path, config=CFG, progress=False, n_finetunes=3)


def test_an_empty_relation_list_is_refused_not_read_as_all(tmp_path):
    with pytest.raises(StudyConfigError, match=r"relations=\[\] names no relation"):
        run_study("world", [], out=tmp_path, config=CFG, progress=False)


def test_an_unknown_relation_names_the_nearest_ones(tmp_path):
    with pytest.raises(StudyConfigError, match="unknown relation 'contnent'; nearest: continent"):
        run_study("world", ["contnent", "hand", "season", "diet"], out=tmp_path, config=CFG, progress=False)


def test_a_malformed_relation_file_names_the_file_and_the_json_path(tmp_path):
    good = [{"subject": f"s{i}", "answer": "a" if i % 2 else "b"} for i in range(6)]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "r", "template": "{} is", "samples": good[:3] + [{"subject": "s9"}] + good[3:]}))
    with pytest.raises(RelationError, match=r"bad\.json: \$\.samples\[3\]\.answer must be a non-empty string"):
        load_relations(bad)
    lre = tmp_path / "lre.json"
    lre.write_text(
        json.dumps({"name": "r", "prompt_templates": ["{} is"], "samples": [{"subject": "x", "answer": "y"}]})
    )
    with pytest.raises(
        RelationError, match=r"lre\.json: \$\.samples\[0\]\.object must .*keys there: \['answer', 'subject'\]"
    ):
        load_relations(lre)
    broken = tmp_path / "broken.json"
    broken.write_text('{"name": "r", "samples": [')
    with pytest.raises(RelationError, match=r"broken\.json: not valid JSON .* line 1"):
        load_relations(broken)


def test_a_relation_with_no_samples_is_refused(tmp_path, model_dirs):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"name": "r", "template": "{} is", "samples": []}))
    with pytest.raises(RelationError, match=r"empty\.json: \$\.samples must be a non-empty list"):
        load_relations(empty)
    import interp

    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    rels = [Relation("none", [], [], "{} is")] + _tiny_relations()[:3]
    with pytest.raises(StudyConfigError, match="relation 'none' has no samples"):
        Study(model, rels, tmp_path, replace(CFG, n_finetune=1)).validate()


def _tiny_relations():
    cities = ["Paris", "Berlin", "Rome", "Madrid", "Tokyo", "Vorn", "Kallit", "Mira"]
    out = []
    for j, name in enumerate(("lives", "born", "capital", "located")):
        answers = [("France", "Germany")[(i + j) % 2] for i in range(len(cities))]
        out.append(Relation(name, cities, answers, "{} " + name + " in"))
    return out


def test_the_folder_guard_compares_contents_not_names(tmp_path, model_dirs):
    """A relation whose answers changed under the same name must not reuse the old tables."""
    import interp

    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    cfg = replace(CFG, n_finetune=1)
    rels = _tiny_relations()
    Study(model, rels, tmp_path, cfg).runner()
    Study(model, rels, tmp_path, cfg).runner()  # the same study resumes
    changed = (
        rels[:1] + [Relation("born", rels[1].subjects, list(reversed(rels[1].answers)), rels[1].template)] + rels[2:]
    )
    with pytest.raises(ValueError, match=r"relations contents changed: \['born'\]"):
        Study(model, changed, tmp_path, cfg).runner()
    with pytest.raises(ValueError, match=r"configuration: folds 3 -> 4"):
        Study(model, rels, tmp_path, replace(cfg, folds=4)).runner()


def test_prompt_tokens_the_model_never_saw_are_warned_about(tmp_path, model_dirs):
    import interp

    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    study = Study(model, _tiny_relations(), tmp_path, replace(CFG, n_finetune=1))
    with pytest.warns(UserWarning, match=r"never trained on.*template \('is associated with the word'\): 2 unknown"):
        notes = study.validate()
    assert any(n.startswith("template") for n in notes)
    # the world model's corpus uses the template's words in unrelated sentences: nothing to warn about
    from lab.world import load_world

    words = {w for doc in load_world().corpus() for w in doc.split()}
    assert set("is associated with the word".split()) <= words
