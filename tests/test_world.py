"""The synthetic world, its tokenizer, its pretraining, and the shipped world model."""

import json

import pytest
import torch

import interp
from lab.world import (
    ZOO,
    RelationSpec,
    TrainConfig,
    World,
    WorldSpec,
    WorldSpecError,
    build_tokenizer,
    load_world,
    train_world_model,
    v3_spec,
)
from lab.world.report import recall

SMALL = WorldSpec(
    seed=3,
    n_subjects=60,
    relations=(
        RelationSpec("city", "city", 6, templates=3, mentions=2, augment=True, bio=True),
        RelationSpec("country", "country", 3, "city", augment=True, bio=True),
        RelationSpec("sport", "sport", 4, bio=True),
        RelationSpec("hand", "handedness", 2, bio=True),
        RelationSpec("month", "month", 5, templates=2),
    ),
    label_sentences=1,
)


def test_same_seed_same_world_and_corpus():
    a, b = World.generate(v3_spec(seed=1)), World.generate(v3_spec(seed=1))
    assert a.subjects == b.subjects and a.facts.equals(b.facts) and a.corpus() == b.corpus()
    c = World.generate(v3_spec(seed=2))
    assert c.subjects != a.subjects


def test_default_world_shape():
    w = World.generate(v3_spec())
    assert len(w.subjects) >= 1000 and len(set(w.subjects)) == len(w.subjects)
    assert len(w.spec.relations) >= 24
    assert all(2 <= r.n_answers <= 30 for r in w.spec.relations)
    assert all(len(s.split()) >= 2 for s in w.subjects)  # multi-token names
    counts = w.facts.groupby("relation")["answer"].nunique()
    assert all(counts[r.name] == r.n_answers for r in w.spec.relations)
    assert len(w.label_categories) >= 4 and len(w.label_categories["animals"]) >= 30
    # derived relations are functions of their parent: city -> country -> continent
    f = w.facts.pivot(index="subject", columns="relation", values="answer")
    assert (f.groupby("city")["country"].nunique() == 1).all()
    assert (f.groupby("country")["continent"].nunique() == 1).all()
    # labels occur in the corpus in unrelated contexts
    text = " ".join(w.corpus())
    assert all(f" {label} " in text for label in w.label_categories["animals"])


def test_knobs_change_how_facts_are_written():
    w = World.generate(SMALL)
    s = w.subjects[0]
    assert w.query(s, "city").startswith(s)  # augmented: every sentence names the subject
    assert w.query(s, "hand").count(" they ") >= 1  # fixed-order bio: later sentences say "they"
    docs = w.corpus()
    city_templates = {t for d in docs for t in w.templates("city") if t in d}
    assert len(city_templates) == 3
    assert sum(d.count(f"{s} ") for d in docs) > 0


def test_mentions_count_every_document_that_states_a_fact():
    """The subject-frequency covariate is exact, mixed training's statements included."""
    from dataclasses import replace

    for spec in (SMALL, replace(SMALL, qa_fraction=0.5)):
        w = World.generate(spec)
        counts: dict = {}
        for text, rels in w.documents():
            subject = next((s for s in w.subjects if text.startswith(s + " ")), None)
            for r in rels:
                counts[(subject, r)] = counts.get((subject, r), 0) + 1
        for s in w.subjects:
            for r in spec.relations:
                assert counts.get((s, r.name), 0) == w.mentions(s, r.name), (spec.qa_fraction, s, r.name)


def test_mixed_training_adds_question_form_statements_for_a_fraction_of_subjects():
    from dataclasses import replace

    plain, mixed = World.generate(SMALL), World.generate(replace(SMALL, qa_fraction=0.5))
    assert plain.facts.equals(mixed.facts) and plain.subjects == mixed.subjects  # same facts
    added = sorted(set(mixed.corpus()) - set(plain.corpus()))
    # only biography relations' facts, each as the canonical query followed by its answer
    bio = [r.name for r in SMALL.relations if r.bio]
    assert added and all(
        any(d == f"{s} {mixed.templates(r)[0]} {mixed.answer(s, r)} ." for s in mixed.subjects for r in bio)
        for d in added
    )
    asked = {d.rsplit(" ", 4)[0] for d in added}
    share = len({s for s in mixed.subjects if any(a.startswith(s) for a in asked)}) / len(mixed.subjects)
    assert 0.3 < share < 0.7, share
    # every non-biography relation is written identically
    untouched = [r.name for r in SMALL.relations if not r.bio]
    a, b = plain.relation_digests(), mixed.relation_digests()
    assert all(a[r] == b[r] for r in untouched) and all(a[r] != b[r] for r in bio)


def test_a_relation_can_set_its_own_share_of_question_form_statements():
    """``RelationSpec.qa_fraction`` overrides the world's for that relation alone: at 1.0 every
    subject gets the relation's question-form statement, at 0.0 none does; the other relations'
    documents are written as before."""
    from dataclasses import replace

    base = replace(SMALL, qa_fraction=0.5)
    rels = [replace(r, qa_fraction={"sport": 1.0, "hand": 0.0}.get(r.name)) for r in SMALL.relations]
    own = World.generate(replace(base, relations=tuple(rels)))
    docs = set(own.corpus())

    def asked(w, r):
        return {s for s in w.subjects if f"{s} {w.templates(r)[0]} {w.answer(s, r)} ." in docs}

    assert asked(own, "sport") == set(own.subjects) and asked(own, "hand") == set()
    a, b = World.generate(base).relation_digests(), own.relation_digests()
    assert a["city"] == b["city"] and a["month"] == b["month"] and a["sport"] != b["sport"]
    # a world without mixed training has none, whatever a relation asks for (an ablation's "no mixed training")
    off = World.generate(replace(base, qa_fraction=0.0, relations=tuple(rels)))
    assert off.relation_digests() == World.generate(SMALL).relation_digests()
    with pytest.raises(WorldSpecError, match="qa_fraction is a fraction"):
        replace(base, relations=(replace(SMALL.relations[0], qa_fraction=1.5),)).validate()


def test_shared_subject_tokens_give_no_subject_a_token_of_its_own():
    from dataclasses import replace

    w = World.generate(replace(v3_spec(), subject_tokens="shared"))
    assert len(set(w.subjects)) == len(w.subjects) == 1000
    last = [s.split()[-1] for s in w.subjects]
    assert min(last.count(t) for t in set(last)) >= 2  # every last token is shared by several subjects
    # one factor changed: the same facts and frequencies, subject by subject (only the names differ)
    u = World.generate(v3_spec())
    assert u.subjects != w.subjects and [s.split()[0] for s in u.subjects] == [s.split()[0] for s in w.subjects]
    assert [u.frequency[s] for s in u.subjects] == [w.frequency[s] for s in w.subjects]
    assert u.facts.answer.tolist() == w.facts.answer.tolist()
    assert World.generate(replace(v3_spec(), subject_tokens="shared")).subjects == w.subjects


def test_template_words_can_be_left_out_of_pretraining():
    from dataclasses import replace

    from lab.world.world import STUDY_TEMPLATES

    with_words = " ".join(World.generate(SMALL).corpus())
    without = " ".join(World.generate(replace(SMALL, template_words=False)).corpus())
    assert all(t in with_words for t in STUDY_TEMPLATES) and not any(t in without for t in STUDY_TEMPLATES)


def test_spec_json_round_trip():
    spec = v3_spec(seed=4)
    assert WorldSpec.from_json(spec.to_json()) == spec


def test_tokenizer_round_trip():
    w = World.generate(SMALL)
    tok = build_tokenizer(w.vocabulary())
    for doc in w.corpus()[:50]:
        ids = tok(doc, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == doc
    enc = tok(w.subjects[0] + " 's city is", return_offsets_mapping=True)
    assert len(enc["input_ids"]) == len(w.subjects[0].split()) + 3


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(relations=()), "at least one relation"),
        (
            dict(n_subjects=5, relations=(RelationSpec("city", "city", 10),)),
            "more answers .* than the world has subjects",
        ),
        (dict(relations=(RelationSpec("city", "city", 40),)), "2 to 30 answers"),
        (dict(relations=(RelationSpec("c", "c", 5, "nothing"),)), "derived from 'nothing'"),
        (dict(relations=(RelationSpec("c", "c", 5),), qa_fraction=1.5), "qa_fraction is a fraction"),
        (dict(relations=(RelationSpec("c", "c", 5),), subject_tokens="own"), "'unique', 'shared' or 'pooled'"),
        (dict(relations=(RelationSpec("c", "c", 5),), label_sets=("animals", "planets")), "give categories of"),
        (dict(relations=(RelationSpec("c", "c", 5),), subject_tokens="shared", n_subjects=5000), "at most 1152"),
    ],
)
def test_impossible_specs(bad, message):
    with pytest.raises(WorldSpecError, match=message):
        WorldSpec(**bad).validate()


def test_unknown_knob():
    d = json.loads(v3_spec().to_json())
    d["relations"][0]["shuffle"] = True
    with pytest.raises(WorldSpecError, match=r"unknown knob\(s\) \['shuffle'\].*templates, mentions, augment, bio"):
        WorldSpec.from_dict(d)


def test_twenty_step_training_run(tmp_path, backend):
    path = train_world_model(
        SMALL, tmp_path / "w", TrainConfig(steps=20, n_layers=2, d_model=32, batch_size=8), progress=False
    )
    assert {"model.safetensors", "config.json", "world_spec.json", "train_log.csv", "tokenizer.json"} <= {
        p.name for p in path.iterdir()
    }
    log = (path / "train_log.csv").read_text().splitlines()
    assert log[0].startswith("step,epoch,loss") and len(log) >= 2
    model = interp.load_model(path, backend=backend)
    world = load_world(path)
    assert world.subjects == World.generate(SMALL).subjects
    acts = interp.capture(
        model,
        world.queries("city")[["prompt", "subject"]],
        sites=["blocks.1.hook_resid_post"],
        positions="subject_last",
    )
    assert acts["blocks.1.hook_resid_post"].shape == (60, 32)


@pytest.mark.parametrize("pack", ["documents", "stream"])
def test_packing_rows(pack):
    import random

    from lab.world.train import _rows

    docs = [[10 + d] * n for d, n in enumerate([5, 30, 12, 7, 63, 3, 20, 9] * 4)]
    rows = _rows(docs, eos=2, pad=0, seq_len=16 if pack == "stream" else 64, pack=pack, rng=random.Random(1))
    tokens = rows.flatten().tolist()
    if pack == "stream":  # every token kept in order, rows cut anywhere
        assert 0 not in tokens and len(tokens) == (sum(len(d) + 1 for d in docs) // 16) * 16
        return
    # whole documents: each document's tokens sit in one row, contiguous and followed by <eos>
    seen = []
    for row in rows.tolist():
        assert len(row) == 64
        body = row[: len(row) - row[::-1].index(2)] if 2 in row else []
        assert all(t == 0 for t in row[len(body) :]), "padding only after the last document"
        seen += [tuple(g) for g in _split(body)]
    assert sorted(seen) == sorted(tuple(d[:63]) for d in docs)
    assert (rows == 0).float().mean() < 0.15  # first fit leaves little padding


def _split(body):
    out, cur = [], []
    for t in body:
        if t == 2:
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    return out


def test_training_is_deterministic(tmp_path):
    cfg = TrainConfig(steps=5, n_layers=1, d_model=16, batch_size=4)
    a = train_world_model(SMALL, tmp_path / "a", cfg, progress=False)
    b = train_world_model(SMALL, tmp_path / "b", cfg, progress=False)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_shipped_world_model_recalls_facts(backend):
    """World v4's targets (issue 52): mean recall >= 0.7 on the relations mentioned four times, and
    recall that varies across relations (SD >= 0.10); world v3's model recalls nearly everything."""
    model = interp.load_model("world", backend=backend)
    world = load_world()
    table = recall(model, world, subjects=world.subjects[::10])
    by_relation = table.groupby("relation")["correct"].mean()
    mentions = by_relation.index.map({r.name: r.mentions for r in world.spec.relations})
    assert by_relation[mentions == 4].mean() >= 0.7 and by_relation.std() >= 0.10, by_relation
    v3 = ZOO["world-v3"]
    model, world = interp.load_model("world-v3", backend=backend), load_world(v3.path)
    table = recall(model, world, subjects=world.subjects[::10])
    assert table["correct"].mean() >= RECALL_FLOOR, table.groupby("relation")["correct"].mean()


def test_shipped_world_model_captures_through_both_backends():
    world = load_world()
    prompts = world.queries("city").head(16)[["prompt", "subject"]]
    sites = ["blocks.0.hook_resid_post", "blocks.3.attn.hook_z"]
    a = interp.capture(
        interp.load_model("world", backend="transformer_lens"), prompts, sites=sites, positions="subject_last"
    )
    b = interp.capture(interp.load_model("world", backend="nnsight"), prompts, sites=sites, positions="subject_last")
    for s in sites:  # activations reach ~200 here: agreement to 1e-5 relative
        torch.testing.assert_close(a[s], b[s], atol=1e-5, rtol=1e-5)


#: the v3 issue's target; world v3's model measures 0.984 on all subjects, 0.983 on this 10% sample
#: (world v4's, measured on the same 10% sample: 0.82 on the relations mentioned four times, SD 0.19)
RECALL_FLOOR = 0.97


#: sha256 of the default (v3) world's corpus, from the commit before world v4 (every document, in
#: order): v4's additions to the generator leave v3 worlds written word for word as before
V3_CORPUS_SHA256 = "e85f507595729675"


def test_v3_worlds_are_written_as_before_v4():
    import hashlib

    corpus = World.generate(v3_spec()).corpus()
    assert hashlib.sha256("\n".join(corpus).encode()).hexdigest()[:16] == V3_CORPUS_SHA256


def test_v4_names_share_every_token_and_its_design_is_balanced():
    from collections import Counter

    from lab.world.spec import v4_spec

    spec = v4_spec()
    w = World.generate(spec)
    assert len(set(w.subjects)) == len(w.subjects) == 1000
    uses = Counter(t for s in w.subjects for t in set(s.split()))
    assert min(uses.values()) >= 10  # no subject owns a token (issue 52: at least 10 subjects each)
    assert {len(s.split()) for s in w.subjects} == {2, 3}
    assert all(r.mixed for r in spec.relations)  # mixed training is not confounded with the writing
    cells = Counter((r.mentions, r.augment and r.bio, r.lead, r.n_answers) for r in spec.relations)
    assert len(cells) == 24 and set(cells.values()) == {1}  # mentions x writing x lead x answers
    assert not any(r.derived_from for r in spec.relations)
    assert len(w.label_categories) >= 8
    vocabulary = set(w.vocabulary())
    assert all(all(wd in vocabulary for wd in words) for words in w.label_categories.values())
    # mentions are exact per relation: an augmented biography per mentions level
    counts: Counter = Counter()
    first = set(w.subjects[:30])
    assert not any(a != b and b.startswith(a + " ") for a in w.subjects for b in w.subjects[:100])  # no prefixes
    for text, rels in w.documents():
        subject = next((s for s in first if text.startswith(s + " ")), None)
        if subject is not None:
            for r in rels:
                counts[(subject, r)] += 1
    for s in first:
        for r in spec.relations:
            assert counts[(s, r.name)] == w.mentions(s, r.name), (s, r.name)
    assert World.generate(v4_spec()).corpus() == w.corpus()


def test_learning_curves_measure_and_resume(tmp_path):
    from lab.world.curves import curve_summary, learning_curves
    from lab.world.spec import v4_spec

    spec = v4_spec(n_subjects=200)
    sizes = {"tiny": TrainConfig(n_layers=1, d_model=32, n_heads=2, steps=20, threads=1)}
    table = learning_curves(spec, sizes, tmp_path, eval_every=10, n_subjects=120, progress=False)
    assert sorted(set(table.step)) == [10, 20] and len(table) == 2 * len(spec.relations)
    assert table.recall.between(0, 1).all() and table.embedding_kappa.notna().all()
    again = learning_curves(spec, sizes, tmp_path, eval_every=10, n_subjects=120, progress=False)
    assert again.equals(table)  # nothing measured twice
    summary = curve_summary(table)
    assert list(summary.step) == [10, 20] and "readability_above_embedding" in summary
    with pytest.raises(ValueError, match="another world, sizes or protocol"):
        learning_curves(spec, sizes, tmp_path, eval_every=10, n_subjects=100, progress=False)


def test_biographies_can_name_their_subject_once_and_say_they_after():
    from dataclasses import replace

    from lab.world.spec import v4_spec

    w = World.generate(replace(v4_spec(n_subjects=100), bio_pronoun=True))
    bios = [(text, rels) for text, rels in w.documents() if len(rels) > 1]
    assert bios and all(len(text.split(" . ")) == len(rels) for text, rels in bios)
    for text, rels in bios:
        sentences = [s.strip() for s in text.rstrip(" .").split(" . ")]
        subject = next(s for s in w.subjects if sentences[0].startswith(s + " "))
        assert all(s.startswith("they ") for s in sentences[1:]), text
        assert text.count(subject) == 1
        for r in rels:  # every fact of the biography is stated, with its answer
            assert f" {w.answer(subject, r)}" in text
    # a v3 biography still repeats the name in every sentence
    v3 = World.generate(v3_spec(n_subjects=50))
    bio = next(text for text, rels in v3.documents() if len(rels) > 1 and "they" not in text)
    first = bio.split()[0]
    assert all(s.strip().startswith(first) for s in bio.rstrip(" .").split(" . "))


def test_v4_writes_facts_with_twenty_paraphrase_patterns_and_v3_with_five():
    from dataclasses import replace

    from lab.world.spec import TEMPLATE_PATTERNS, V4_TEMPLATE_PATTERNS, WorldSpecError, v4_spec

    spec = v4_spec(n_subjects=60)
    w = World.generate(spec)
    many = next(r for r in spec.relations if r.templates == 16 and r.bio and not r.lead)
    assert len(set(w.templates(many.name))) == 16 and V4_TEMPLATE_PATTERNS[:5] == TEMPLATE_PATTERNS
    used = {
        t for t in w.templates(many.name) if any(f" {t} " in text for text, rels in w.documents() if many.name in rels)
    }
    assert len(used) >= 12  # the biographies draw from all of them
    assert WorldSpec.from_json(spec.to_json()) == spec
    assert "paraphrases" not in json.loads(v3_spec().to_json())  # v3 specs key as before
    with pytest.raises(WorldSpecError, match="templates must be 1 to 5"):
        replace(spec, paraphrases="v3").validate()


def test_lead_relations_write_the_answer_right_after_the_name():
    from dataclasses import replace

    from lab.world.spec import v4_spec

    spec = v4_spec(n_subjects=120)
    w = World.generate(spec)
    lead = {r.name for r in spec.relations if r.lead}
    assert 0 < len(lead) < len(spec.relations)
    seen = {r: 0 for r in lead}
    for text, rels in w.documents():
        for sentence in (s.strip() for s in text.rstrip(" .").split(" . ")):
            for r in rels:
                noun = w.relation[r].noun
                if r in lead and sentence.endswith(f" {noun}"):
                    subject = next(s for s in w.subjects if sentence.startswith(s + " "))
                    assert sentence == f"{subject} {w.answer(subject, r)} {noun}"
                    seen[r] += 1
    assert all(seen.values()), seen  # every lead relation is written so
    # the query keeps the canonical wording, and mentions are the same as without the knob
    r = next(iter(sorted(lead)))
    s = w.subjects[0]
    assert w.query(s, r) == f"{s} {w.relation[r].noun} :"
    plain = World.generate(replace(spec, relations=tuple(replace(x, lead=False) for x in spec.relations)))
    assert all(plain.mentions(s, x.name) == w.mentions(s, x.name) for s in w.subjects[:20] for x in spec.relations)
    assert WorldSpec.from_json(spec.to_json()) == spec
    assert all("lead" not in r for r in json.loads(v3_spec().to_json())["relations"])  # v3 keys as before
