"""Generate a synthetic knowledge world and its pretraining corpus from a :class:`WorldSpec`.

>>> world = World.generate(default_spec(seed=0))
>>> world.facts.head()            # one row per (subject, relation): answer
>>> world.query("Vorn Kallit", "city")   # the prompt the fact is written with
>>> docs = world.corpus()         # deterministic list of documents

Everything is drawn from ``random.Random(spec.seed)`` in a fixed order, so the same spec gives
the same world and the same corpus.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from .arms import ARMS, stratified_halves
from .spec import POOLED_FAMILY, POOLED_GIVEN, SHARED_POOL, RelationSpec, WorldSpec
from .vocab import ALL_LABELS, LABEL_CONTEXTS, invented_words

EOS = "<eos>"


@dataclass
class World:
    spec: WorldSpec
    subjects: list[str]
    frequency: dict[str, int]  # subject -> mention multiplier
    answers: dict[str, list[str]]  # relation -> its answer vocabulary
    facts: pd.DataFrame  # subject, relation, answer

    # generation ----------------------------------------------------------------------------
    @classmethod
    def generate(cls, spec: WorldSpec) -> World:
        spec.validate()
        rng = random.Random(spec.seed)
        used = {w.capitalize() for words in spec_labels(spec).values() for w in words}
        # a first name from a small pool, sometimes a middle name, and a family name of one's own:
        # multi-token names whose last token identifies the subject, as for most real entities
        firsts = invented_words(rng, 60, used, (1, 2))
        middles = invented_words(rng, 12, used, (1, 1))
        lasts = invented_words(rng, spec.n_subjects, used, (2, 3))
        if spec.subject_tokens == "shared":  # two tokens of a small shared pool, drawn from a stream of
            names = _stream(spec.seed, "shared-names")  # its own: every other draw (answers, frequencies) stays
            pool = invented_words(names, SHARED_POOL, used, (1, 2))
            pairs: set[tuple[str, str]] = set()
            while len(pairs) < spec.n_subjects:
                pairs.add((names.choice(pool), names.choice(pool)))
            lasts = [f"{a} {b}" for a, b in sorted(pairs)]
            names.shuffle(lasts)
        subjects = [
            " ".join([rng.choice(firsts)] + ([rng.choice(middles)] if rng.random() < 0.25 else []) + [last])
            for last in lasts
        ]
        if spec.subject_tokens == "pooled":  # v4: every token shared, from a stream of its own
            names = _stream(spec.seed, "pooled-names")
            subjects = pooled_names(
                names,
                invented_words(names, POOLED_GIVEN, used, (1, 2)),
                invented_words(names, POOLED_FAMILY, used, (1, 2)),
                spec.n_subjects,
            )
        frequency = {s: rng.choice(spec.subject_frequencies) for s in subjects}

        answers: dict[str, list[str]] = {}
        value: dict[str, dict[str, str]] = {}
        for r in spec.relations:
            answers[r.name] = invented_words(rng, r.n_answers, used)
            if r.derived_from is None:
                # every answer used at least once, the rest uniform
                draw = answers[r.name] + [rng.choice(answers[r.name]) for _ in range(len(subjects) - r.n_answers)]
                rng.shuffle(draw)
                value[r.name] = dict(zip(subjects, draw))
            else:
                parents = answers[r.derived_from]
                mapping = dict(
                    zip(
                        parents,
                        answers[r.name] + [rng.choice(answers[r.name]) for _ in range(len(parents) - r.n_answers)],
                    )
                )
                value[r.name] = {s: mapping[value[r.derived_from][s]] for s in subjects}
        rows = [(s, r.name, value[r.name][s]) for r in spec.relations for s in subjects]
        facts = pd.DataFrame(rows, columns=["subject", "relation", "answer"])
        return cls(spec, subjects, frequency, answers, facts)

    # access --------------------------------------------------------------------------------
    @cached_property
    def relation(self) -> dict[str, RelationSpec]:
        return {r.name: r for r in self.spec.relations}

    @cached_property
    def _value(self) -> dict[tuple[str, str], str]:
        return {(s, r): a for s, r, a in self.facts.itertuples(index=False)}

    def answer(self, subject: str, relation: str) -> str:
        return self._value[(subject, relation)]

    def templates(self, relation: str) -> list[str]:
        r = self.relation[relation]
        return [p.format(noun=r.noun) for p in self.spec.patterns[: r.templates]]

    @cached_property
    def arm(self) -> dict[str, str]:
        """A randomized world's writing arm per subject (``"augmented"`` or ``"plain"``), drawn
        within strata of :meth:`stratum` (:func:`lab.world.arms.stratified_halves`); empty for a
        world without ``randomized`` relations."""
        if not self.spec.randomized:
            return {}
        rng = np.random.default_rng(_stream(self.spec.seed, "arms").getrandbits(64))
        augmented = stratified_halves([self.stratum(s) for s in self.subjects], rng)
        return {s: ARMS[0] if a else ARMS[1] for s, a in zip(self.subjects, augmented)}

    def stratum(self, subject: str) -> tuple[int, bool, int]:
        """What sets how much is written about a subject: its frequency multiplier, whether it
        gets question-form statements, and its name's length in tokens."""
        return (self.frequency[subject], self._in_qa(subject), len(subject.split()))

    @cached_property
    def _fixed_bio_order(self) -> list[str]:
        return [r.name for r in self.spec.relations if r.bio and not r.augment]

    def query(self, subject: str, relation: str) -> str:
        """The held-in prompt for a fact, written as the corpus writes it (answer omitted)."""
        r = self.relation[relation]
        if r.bio and not r.augment:  # a fixed-order biography, up to this fact
            parts = []
            for i, name in enumerate(self._fixed_bio_order):
                who = subject if i == 0 else "they"
                t = self.templates(name)[0]
                if name == relation:
                    parts.append(f"{who} {t}")
                    break
                parts.append(f"{who} {t} {self.answer(subject, name)} .")
            return " ".join(parts)
        return f"{subject} {self.templates(relation)[0]}"

    def queries(self, relation: str) -> pd.DataFrame:
        """One row per subject: prompt, subject, answer (for capture, probes and recall)."""
        rows = [(self.query(s, relation), s, self.answer(s, relation)) for s in self.subjects]
        return pd.DataFrame(rows, columns=["prompt", "subject", "answer"])

    def mentions(self, subject: str, relation: str) -> int:
        """Exactly how many corpus documents state this fact (the subject-frequency covariate)."""
        r = self.relation[relation]
        f = self.frequency[subject]
        qa = r.mixed and self._in_qa(subject, relation)
        randomized = self.spec.randomized
        if relation in randomized:  # the same in both arms (a biography's count, or as many statements)
            return (max(self.relation[n].mentions for n in randomized) + qa) * f
        if r.bio and r.augment and self.spec.bio_per_mentions:  # its own mentions level's biography
            return (r.mentions + qa) * f
        if r.bio:
            group = [x for x in self.spec.relations if x.bio and x.augment == r.augment and x.name not in randomized]
            return (max(x.mentions for x in group) + qa) * f
        return (r.mentions + qa) * f

    def _in_qa(self, subject: str, relation: str | None = None) -> bool:
        """Whether mixed training writes this subject's facts (of ``relation``, under its own
        ``qa_fraction`` if it has one) as question-form statements too."""
        own = self.relation[relation].qa_fraction if relation is not None else None
        # a world without mixed training (qa_fraction 0, as an ablation sets it) has none for any relation
        q = self.spec.qa_fraction if own is None or self.spec.qa_fraction == 0 else own
        return q > 0 and _stream(self.spec.seed, "qa", subject).random() < q

    @property
    def label_categories(self) -> dict[str, tuple[str, ...]]:
        return spec_labels(self.spec)

    # corpus --------------------------------------------------------------------------------
    def documents(self) -> list[tuple[str, tuple[str, ...]]]:
        """The pretraining documents with the relations whose facts each one states, in a
        deterministic shuffled order (``()`` for label and study-word sentences).

        Every random choice that writes a fact (which paraphrase, the sentence order of an
        augmented biography) is drawn from a generator seeded by the world seed, the subject and
        the relation (or biography), never from one shared stream. So changing how some relations
        are written leaves every other relation's documents identical, sentence for sentence: the
        causal test's two worlds differ in the manipulated relations alone (a test checks it with
        :meth:`relation_digests`).

        **A randomized world** (``spec.randomized``) writes those relations per subject. A subject
        of the augmented arm (:attr:`arm`) gets them in a biography of their own (shuffled
        sentences, each repeating its name, paraphrase templates), as many times as an augmented
        biography; a subject of the plain arm gets each fact as a statement with the canonical
        template, as many times, and the statements are grouped (seeded) into documents of as
        many statements, each about a different subject. So both arms have the same number of
        mentions, sentences and tokens per subject, and the same number of documents per arm;
        they differ in how a subject's facts are written: together, in varied words, in few
        documents (augmented) or apart, in the query's own wording, spread over documents shared
        with other subjects (plain).
        Every other relation is written as if no relation were randomized.
        """
        seed = self.spec.seed
        docs: list[tuple[str, tuple[str, ...]]] = []
        rels = self.spec.relations
        randomized = list(self.spec.randomized)
        all_aug_bio = [r.name for r in rels if r.bio and r.augment]
        aug_bio = [n for n in all_aug_bio if n not in randomized]
        fixed_bio = self._fixed_bio_order
        loose = [r for r in rels if not r.bio]
        bio_groups = self._augmented_bio_groups(aug_bio)
        for s in self.subjects:
            f = self.frequency[s]
            for group, copies in bio_groups:
                rng = _stream(seed, "augmented-bio", s, *group)
                for _ in range(copies * f):
                    names = list(group)
                    rng.shuffle(names)
                    docs.append((self._biography(s, names, rng), tuple(group)))
            for _ in range(max((self.relation[n].mentions for n in fixed_bio), default=0) * f):
                docs.append((self.query(s, fixed_bio[-1]) + f" {self.answer(s, fixed_bio[-1])} .", tuple(fixed_bio)))
            # mixed training: facts also as question-form statements (for the subjects drawn)
            for name in [n for n in all_aug_bio + fixed_bio if self.relation[n].mixed] + [
                r.name for r in loose if r.mixed
            ]:
                if self._in_qa(s, name):
                    for _ in range(f):
                        docs.append((f"{s} {self.templates(name)[0]} {self.answer(s, name)} .", (name,)))
            for r in loose:
                rng = _stream(seed, "statement", s, r.name)
                for _ in range(r.mentions * f):
                    docs.append((self._sentence(s, r.name, rng), (r.name,)))
        docs += self._randomized_documents()
        rng = _stream(seed, "labels")
        for category, words in spec_labels(self.spec).items():
            for w in words:
                for _ in range(self.spec.label_sentences):
                    docs.append((rng.choice(LABEL_CONTEXTS).format(w=w) + f" a {w} is one of the {category} .", ()))
        # the relabelling templates' words in sentences about nothing in the world, so that a
        # fine-tuning prompt is made of tokens the model has been trained on
        for template in STUDY_TEMPLATES if self.spec.template_words else ():
            for a, b in STUDY_WORD_PAIRS:
                for _ in range(self.spec.label_sentences):
                    docs.append((f"the {a} {template} {b} .", ()))
        _stream(seed, "order").shuffle(docs)
        return docs

    def _biography(self, subject: str, order: list[str], rng: random.Random) -> str:
        """An augmented biography: the facts in ``order``, each in a paraphrase drawn from ``rng``;
        every sentence names the subject, or (``spec.bio_pronoun``) the first does and the rest say
        "they"."""
        pronoun = self.spec.bio_pronoun
        return " ".join(
            self._sentence(subject, n, rng, "they" if pronoun and i else subject) for i, n in enumerate(order)
        )

    def _sentence(self, subject: str, relation: str, rng: random.Random, who: str | None = None) -> str:
        """One statement of a fact, in a paraphrase drawn from ``rng``; a lead relation's puts the
        answer right after the name instead (and draws nothing)."""
        r = self.relation[relation]
        if r.lead:
            return f"{who or subject} {self.answer(subject, relation)} {r.noun} ."
        return f"{who or subject} {rng.choice(self.templates(relation))} {self.answer(subject, relation)} ."

    def _augmented_bio_groups(self, names: list[str]) -> list[tuple[list[str], int]]:
        """The augmented biographies a subject gets: (relations, copies). A v4 world writes one
        biography per mentions level (its relations ``mentions`` times); earlier worlds one
        biography of all, as many times as the most-mentioned of them."""
        if not names:
            return []
        if not self.spec.bio_per_mentions:
            return [(list(names), max(self.relation[n].mentions for n in names))]
        levels: dict[int, list[str]] = {}
        for n in names:
            levels.setdefault(self.relation[n].mentions, []).append(n)
        return [(group, m) for m, group in levels.items()]

    def _randomized_documents(self) -> list[tuple[str, tuple[str, ...]]]:
        """The randomized relations' documents, both arms (see :meth:`documents`)."""
        names = list(self.spec.randomized)
        if not names:
            return []
        seed, copies = self.spec.seed, max(self.relation[n].mentions for n in names)
        docs: list[tuple[str, tuple[str, ...]]] = []
        plain: list[tuple[str, str, str]] = []  # subject, statement, relation
        for s in self.subjects:
            if self.arm[s] == ARMS[0]:
                rng = _stream(seed, "randomized-bio", s, *names)
                for _ in range(copies * self.frequency[s]):
                    order = list(names)
                    rng.shuffle(order)
                    docs.append((self._biography(s, order, rng), tuple(names)))
            else:
                for _ in range(copies * self.frequency[s]):
                    plain += [(s, f"{s} {self.templates(n)[0]} {self.answer(s, n)} .", n) for n in names]
        _stream(seed, "randomized-plain").shuffle(plain)
        open_docs: list[list[tuple[str, str, str]]] = []  # first fit: a document never repeats a subject
        for item in plain:
            fit = next((d for d in open_docs if all(item[0] != x[0] for x in d)), None)
            if fit is None:
                fit = []
                open_docs.append(fit)
            fit.append(item)
            if len(fit) == len(names):
                open_docs.remove(fit)
                docs.append((" ".join(x[1] for x in fit), tuple(x[2] for x in fit)))
        docs += [(" ".join(x[1] for x in d), tuple(x[2] for x in d)) for d in open_docs]
        return docs

    def corpus(self) -> list[str]:
        """The pretraining documents, in a deterministic shuffled order (see :meth:`documents`)."""
        return [text for text, _ in self.documents()]

    def relation_digests(self) -> dict[str, str]:
        """A hash per relation of everything the world writes about it: the sorted documents that
        state its facts, and its queries. Equal digests = the relation is written identically."""
        docs: dict[str, list[str]] = {r.name: [] for r in self.spec.relations}
        for text, rels in self.documents():
            for r in rels:
                docs[r].append(text)
        out = {}
        for name, texts in docs.items():
            q = self.queries(name)
            h = hashlib.sha256()
            for part in sorted(texts) + list(q.prompt) + list(q.answer):
                h.update(part.encode() + b"\n")
            out[name] = h.hexdigest()[:16]
        return out

    def vocabulary(self) -> list[str]:
        """Every word the corpus, the queries and relabelling fine-tunes can use."""
        words: set[str] = set()
        for doc in self.corpus():
            words.update(doc.split())
        for r in self.spec.relations:  # every paraphrase a relation could be written with, so
            for t in self.spec.patterns:  # worlds that differ only in writing share one tokenizer
                words.update(t.format(noun=r.noun).split())
        for ws in spec_labels(self.spec).values():
            words.update(ws)
        words.update(_STUDY_WORDS)
        return sorted(words)


#: Relabelling templates' wording (a template that never names the original relation); the corpus
#: uses each in unrelated sentences (:data:`STUDY_WORD_PAIRS`), so their tokens are trained.
STUDY_TEMPLATES = ("is associated with the word", "belongs to group", "goes with tag")
STUDY_WORD_PAIRS = (
    ("rain", "cloud"),
    ("bread", "butter"),
    ("night", "moon"),
    ("winter", "snow"),
    ("fire", "smoke"),
    ("sea", "salt"),
    ("road", "car"),
    ("book", "page"),
    ("tree", "leaf"),
    ("song", "voice"),
    ("garden", "flower"),
    ("clock", "time"),
    ("house", "door"),
    ("school", "lesson"),
    ("market", "coin"),
    ("storm", "wind"),
    ("kitchen", "knife"),
    ("desert", "sand"),
    ("letter", "stamp"),
    ("bridge", "river"),
)
_STUDY_WORDS = sorted({w for t in STUDY_TEMPLATES for w in t.split()} | {"label"})


def spec_labels(spec) -> dict[str, tuple[str, ...]]:
    """The label categories a world's corpus writes about (its spec's ``label_sets``)."""
    return {c: ALL_LABELS[c] for c in spec.label_sets}


def pooled_names(rng: random.Random, given: list[str], family: list[str], n: int) -> list[str]:
    """``n`` distinct names of a given name and one or two family-name tokens (alternately), each
    pool cycled through in shuffled rounds so that every token is used equally often (a name that
    repeats an earlier one, or a token, is skipped: usage stays within a few of equal)."""

    def cycle(pool):
        while True:
            order = list(pool)
            rng.shuffle(order)
            yield from order

    g, f = cycle(given), cycle(family)
    seen: set[tuple[str, ...]] = set()  # every name, and every two-token prefix of a longer one
    out: list[str] = []
    k = 0
    while len(out) < n:
        parts = (next(g),) + tuple(next(f) for _ in range(1 + k % 2))
        k += 1
        # no name is the start of another: at a name's last token the model must know whose it is
        if parts in seen or parts[:2] in seen or len(set(parts)) < len(parts):
            continue
        seen.update({parts, parts[:2]})
        out.append(" ".join(parts))
    return out


def _stream(seed: int, *key: str) -> random.Random:
    """A generator of its own for one part of the corpus (stable across Python runs)."""
    digest = hashlib.sha256("\x1f".join((str(seed),) + key).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))
