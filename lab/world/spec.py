"""What a synthetic world is made of: relations, their answers, and how their facts are written.

A :class:`WorldSpec` is a complete, serializable recipe: with the same spec (and seed) the
generator returns the same subjects, facts and pretraining corpus, token for token.

Each :class:`RelationSpec` carries the *readability knobs* (Allen-Zhu & Li, Physics of Language
Models 3.1: how facts are written decides whether they become linearly extractable at the
subject):

- ``templates``: number of paraphrase templates the facts are written with;
- ``mentions``: how many times each fact is written (times the subject's own frequency);
- ``augment``: permutation / position augmentation. In biographies, sentences are shuffled and
  each repeats the subject's full name; without it, a biography has a fixed sentence order and
  later sentences refer to the subject as "they";
- ``bio``: facts are written inside per-subject biographies (with the subject's other bio
  facts) rather than as isolated statements.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace

from lab.stages import ADDED

from .vocab import ALL_LABELS

KNOBS = ("templates", "mentions", "augment", "bio", "lead")


class WorldSpecError(ValueError):
    pass


@dataclass(frozen=True)
class RelationSpec:
    name: str
    noun: str  # the word templates use to name the relation ("city", "employer", ...)
    n_answers: int = 10
    derived_from: str | None = None  # answers are a function of this relation's answers
    templates: int = 1
    mentions: int = 1
    augment: bool = False
    bio: bool = False
    #: under mixed training (``WorldSpec.qa_fraction``), whether this relation's facts also get
    #: question-form statements; ``None``: exactly when it is a biography relation
    qa: bool | None = None
    #: a *lead* relation's facts are written with the answer right after the name
    #: (``"{subject} {answer} {noun} ."``, as a lead sentence's apposition does: "Ada Berg (Paris)"),
    #: in every sentence that would have used a paraphrase template; its question-form statements
    #: (mixed training) keep the query's wording. The next token after the name then depends on the
    #: subject's facts, so the model must assemble them at the name (world v4)
    lead: bool = field(default=False, metadata=ADDED)
    #: under mixed training (a world ``qa_fraction`` above 0), this relation's own fraction of
    #: subjects with question-form statements (``None``: the world's); the same subjects' draw
    #: decides, so a relation at 0.9 gives them to every subject a relation at 0.5 does, and more
    qa_fraction: float | None = field(default=None, metadata=ADDED)

    @property
    def mixed(self) -> bool:
        return self.bio if self.qa is None else self.qa

    def validate(self, n_subjects: int, known: set[str], n_patterns: int | None = None) -> None:
        n_patterns = n_patterns or len(TEMPLATE_PATTERNS)
        if not 2 <= self.n_answers <= 30:
            raise WorldSpecError(
                f"relation {self.name!r}: n_answers={self.n_answers}; a relation needs 2 to 30 answers"
            )
        if self.n_answers > n_subjects:
            raise WorldSpecError(
                f"relation {self.name!r} has more answers ({self.n_answers}) than the world has subjects "
                f"({n_subjects}); lower n_answers or raise n_subjects"
            )
        if not 1 <= self.templates <= n_patterns:
            raise WorldSpecError(f"relation {self.name!r}: templates must be 1 to {n_patterns}, got {self.templates}")
        if self.mentions < 1:
            raise WorldSpecError(f"relation {self.name!r}: mentions must be at least 1, got {self.mentions}")
        if self.qa_fraction is not None and not 0.0 <= self.qa_fraction <= 1.0:
            raise WorldSpecError(f"relation {self.name!r}: qa_fraction is a fraction, 0 to 1; got {self.qa_fraction}")
        if self.derived_from is not None and self.derived_from not in known:
            raise WorldSpecError(
                f"relation {self.name!r} is derived from {self.derived_from!r}, which is not defined before it"
            )


#: Size of the token pool that shared family names are built from (``subject_tokens="shared"``).
SHARED_POOL = 48
#: ``subject_tokens="pooled"`` (world v4): a given name from a pool of this many tokens, and one or
#: two family-name tokens from a pool of :data:`POOLED_FAMILY`, each token used equally often
POOLED_GIVEN = 40
POOLED_FAMILY = 60
#: the label categories of a v3 world (its corpus writes these four)
V3_LABEL_SETS = ("animals", "colours", "fruits", "instruments")

#: Paraphrase patterns; ``{noun}`` is the relation's noun. Pattern 0 is the canonical query.
TEMPLATE_PATTERNS = (
    "{noun} :",
    "'s {noun}",
    "has {noun}",
    "with {noun}",
    "{noun} is",
)
#: world v4's paraphrase patterns: v3's five, then fifteen more, so that a fact written with many
#: templates is written in words that vary as a real corpus's do (Allen-Zhu & Li 3.1 draw from
#: dozens of templates per attribute; with few, a model can key each fact on the query's own words)
V4_TEMPLATE_PATTERNS = TEMPLATE_PATTERNS + (
    "'s {noun} is",
    "has the {noun}",
    "whose {noun} is",
    "and the {noun}",
    "lists {noun}",
    "{noun} =",
    "records the {noun}",
    "'s known {noun}",
    "gives {noun} as",
    "with the {noun} of",
    "noted {noun}",
    "{noun} was",
    "'s listed {noun} is",
    "reports {noun}",
    "named the {noun}",
)
#: the paraphrase pattern sets a world can write with (``WorldSpec.paraphrases``)
PARAPHRASES = {"v3": TEMPLATE_PATTERNS, "v4": V4_TEMPLATE_PATTERNS}


@dataclass(frozen=True)
class WorldSpec:
    seed: int = 0
    n_subjects: int = 1000
    relations: tuple[RelationSpec, ...] = ()
    subject_frequencies: tuple[int, ...] = (1, 1, 2)  # each subject's multiplier, drawn uniformly
    label_sentences: int = 4  # unrelated sentences per label word
    #: mixed training (Allen-Zhu & Li 3.1): this fraction of subjects also gets each biography
    #: fact as an isolated question-form statement (``"{subject} {noun} : {answer} ."``)
    qa_fraction: float = 0.0
    #: the relabelling templates' words appear in unrelated pretraining sentences
    template_words: bool = True
    #: ``"unique"``: a subject's family name is a token of its own; ``"shared"``: it is two tokens
    #: from a pool of 48, so no subject has a token (and an embedding row) of its own; ``"pooled"``
    #: (v4): a given name and one or two family tokens, every token of a pool used equally often
    #: (by n_subjects / 40 subjects for given names, 1.5 n_subjects / 60 for family tokens)
    subject_tokens: str = "unique"
    #: the label categories the corpus writes sentences about and a study relabels into
    #: (:data:`lab.world.vocab.ALL_LABELS`)
    label_sets: tuple[str, ...] = field(default=V3_LABEL_SETS, metadata=ADDED)
    #: augmented biographies: one per mentions level, its relations written ``mentions`` times (v4);
    #: or one of all, as many times as the most-mentioned of them (v3)
    bio_per_mentions: bool = field(default=False, metadata=ADDED)
    #: augmented biographies name the subject once, in their first (shuffled) sentence, and call
    #: them "they" after (v4): a later fact must be read back from the name through the pronoun, as
    #: in real text; v3 repeats the full name in every sentence
    bio_pronoun: bool = field(default=False, metadata=ADDED)
    #: the paraphrase patterns relations draw their ``templates`` from (:data:`PARAPHRASES`): v3's
    #: five, or v4's twenty (the first five the same)
    paraphrases: str = field(default="v3", metadata=ADDED)

    @property
    def patterns(self) -> tuple[str, ...]:
        return PARAPHRASES[self.paraphrases]

    #: a randomized world (the causal test's design): these relations, all written augmented in
    #: the spec, are written per *subject*: half the subjects (a stratified coin, :mod:`lab.world.arms`)
    #: get them in an augmented biography of their own, the other half as plain statements (one
    #: template), with the same mentions and tokens per arm (see :meth:`World.documents`)
    randomized: tuple[str, ...] = ()

    def validate(self) -> WorldSpec:
        if not self.relations:
            raise WorldSpecError("a world needs at least one relation (zero given)")
        if self.n_subjects < 2:
            raise WorldSpecError(f"a world needs at least 2 subjects, got {self.n_subjects}")
        if not 0.0 <= self.qa_fraction <= 1.0:
            raise WorldSpecError(f"qa_fraction is a fraction of subjects, 0 to 1; got {self.qa_fraction}")
        if self.subject_tokens not in ("unique", "shared", "pooled"):
            raise WorldSpecError(f"subject_tokens must be 'unique', 'shared' or 'pooled', got {self.subject_tokens!r}")
        if self.subject_tokens == "pooled" and self.n_subjects > POOLED_GIVEN * POOLED_FAMILY:
            raise WorldSpecError(
                f"subject_tokens='pooled' builds names from {POOLED_GIVEN} x {POOLED_FAMILY} tokens; "
                f"n_subjects={self.n_subjects} is too many for two-token names (at most {POOLED_GIVEN * POOLED_FAMILY})"
            )
        unknown_sets = [c for c in self.label_sets if c not in ALL_LABELS]
        if unknown_sets or not self.label_sets:
            raise WorldSpecError(f"label_sets {list(self.label_sets)}: give categories of {', '.join(ALL_LABELS)}")
        if self.subject_tokens == "shared" and self.n_subjects > SHARED_POOL**2 // 2:
            raise WorldSpecError(
                f"subject_tokens='shared' builds at most {SHARED_POOL**2 // 2} distinct names; "
                f"n_subjects={self.n_subjects}"
            )
        if self.paraphrases not in PARAPHRASES:
            raise WorldSpecError(f"paraphrases must be one of {', '.join(PARAPHRASES)}, got {self.paraphrases!r}")
        known: set[str] = set()
        for r in self.relations:
            if r.name in known:
                raise WorldSpecError(f"relation {r.name!r} is defined twice")
            r.validate(self.n_subjects, known, len(self.patterns))
            if r.derived_from is not None:
                parent = next(p for p in self.relations if p.name == r.derived_from)
                if r.n_answers > parent.n_answers:
                    raise WorldSpecError(
                        f"relation {r.name!r} is derived from {parent.name!r} but has more answers "
                        f"({r.n_answers} > {parent.n_answers})"
                    )
            known.add(r.name)
        by_name = {r.name: r for r in self.relations}
        unknown = [n for n in self.randomized if n not in by_name]
        if unknown:
            raise WorldSpecError(f"randomized relations {unknown} are not relations of the world")
        if len(set(self.randomized)) != len(self.randomized):
            raise WorldSpecError(f"randomized lists a relation twice: {list(self.randomized)}")
        not_aug = [n for n in self.randomized if not (by_name[n].augment and by_name[n].bio)]
        if not_aug:
            raise WorldSpecError(
                f"randomized relations {not_aug} are not written in augmented biographies (augment=True, bio=True); "
                "a randomized relation's augmented arm is its spec's writing, so give them augment=True and bio=True"
            )
        return self

    def to_json(self) -> str:
        """The spec as JSON; a field added after worlds were saved (``ADDED``) is written only when
        it is not its default, so a v3 spec reads and keys as it did before the field existed."""
        d = _without_defaults(self)
        d["relations"] = [_without_defaults(r) for r in self.relations]
        return json.dumps(d, indent=1)

    @classmethod
    def from_dict(cls, d: dict) -> WorldSpec:
        d = dict(d)
        rels = []
        allowed = {f.name for f in fields(RelationSpec)}
        for r in d.pop("relations", []):
            unknown = set(r) - allowed
            if unknown:
                raise WorldSpecError(
                    f"unknown knob(s) {sorted(unknown)} in relation {r.get('name')!r}; "
                    f"the knobs are {', '.join(KNOBS)} (fields: {', '.join(sorted(allowed))})"
                )
            rels.append(RelationSpec(**r))
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise WorldSpecError(f"unknown world field(s) {sorted(unknown)}")
        for name in ("subject_frequencies", "randomized", "label_sets"):
            if name in d:
                d[name] = tuple(d[name])
        return cls(relations=tuple(rels), **d).validate()

    @classmethod
    def from_json(cls, text: str) -> WorldSpec:
        return cls.from_dict(json.loads(text))


def _without_defaults(obj) -> dict:
    """``asdict(obj)`` less the ``ADDED`` fields at their default."""
    d = asdict(obj)
    for f in fields(obj):
        if f.metadata.get("digest") == ADDED["digest"] and getattr(obj, f.name) == f.default:
            del d[f.name]
    return d


# World v3 (the default until world v4; ``world-v3``): 24 relations whose writing styles span the
# readability range. Styles:
_AUG = dict(templates=4, mentions=3, augment=True, bio=True)  # shuffled bios + paraphrases
_PLAIN = dict(templates=1, mentions=2, augment=False, bio=False)  # one fixed statement
_BIO = dict(templates=1, mentions=2, augment=False, bio=True)  # fixed-order bio, "they"
_RARE = dict(templates=2, mentions=1, augment=False, bio=False)  # seen once per subject


def randomized_spec(seed: int = 0, n_subjects: int = 1000) -> WorldSpec:
    """The causal test's world: world v3 with its nine augmented relations randomized per subject
    (half the subjects get them in augmented biographies, half as plain statements); every other
    relation is written exactly as in world v3."""
    spec = v3_spec(seed, n_subjects)
    return replace(spec, randomized=tuple(r.name for r in spec.relations if r.augment and r.bio)).validate()


def v3_spec(seed: int = 0, n_subjects: int = 1000) -> WorldSpec:
    """World v3, the embedded default before world v4 (the ``world-v3`` zoo models; the causal
    tests' worlds are built on it). Every subject owns a family-name token.

    Nine relations are written in augmented biographies (four per subject on average), three
    more are derived from augmented ones (continent from country from city, industry from
    employer, league from team), the rest are written in fixed-order biographies, as one fixed
    statement, or rarely. Half the subjects also get their biography facts as question-form
    statements (mixed training, ``qa_fraction=0.5``). ``interp world ablate`` measures what each
    ingredient does; v2 (the previous default) had six augmented relations with up to 30 answers,
    two mentions each and no mixed training, and its knowledge barely transferred.
    """
    rel = RelationSpec
    relations = (
        rel("city", "city", 20, **_AUG),
        rel("country", "country", 8, "city", **_AUG),
        rel("continent", "continent", 4, "country", **_PLAIN),
        rel("birth_city", "birthplace", 24, **_BIO),
        rel("birth_country", "homeland", 8, "birth_city", **_BIO),
        rel("employer", "employer", 12, **_AUG),
        rel("industry", "industry", 4, "employer", **_RARE),
        rel("occupation", "occupation", 15, **_PLAIN),
        rel("university", "university", 20, **_BIO),
        rel("major", "major", 8, **_AUG),
        rel("language", "language", 10, **_PLAIN),
        rel("sport", "sport", 6, **_AUG),
        rel("team", "team", 10, **_AUG),
        rel("league", "league", 4, "team", **_RARE),
        rel("hobby", "hobby", 15, **_RARE),
        rel("month", "month", 12, **_PLAIN),
        rel("party", "party", 4, **_AUG),
        rel("car", "car", 10, **_RARE),
        rel("diet", "diet", 5, **_AUG),
        rel("sign", "sign", 12, **_PLAIN),
        rel("blood", "bloodtype", 8, **_RARE),
        rel("hand", "handedness", 2, **_AUG),
        rel("season", "season", 4, **_PLAIN),
        rel("mentor_city", "mentorcity", 30, **_RARE),
    )
    return WorldSpec(seed=seed, n_subjects=n_subjects, relations=relations, qa_fraction=0.5).validate()


#: world v4's relation names and nouns (v3's 24; their facts and writing are v4's own)
V4_RELATIONS = (
    ("city", "city"), ("country", "country"), ("continent", "continent"), ("birth_city", "birthplace"),
    ("birth_country", "homeland"), ("employer", "employer"), ("industry", "industry"), ("occupation", "occupation"),
    ("university", "university"), ("major", "major"), ("language", "language"), ("sport", "sport"),
    ("team", "team"), ("league", "league"), ("hobby", "hobby"), ("month", "month"), ("party", "party"),
    ("car", "car"), ("diet", "diet"), ("sign", "sign"), ("blood", "bloodtype"), ("hand", "handedness"),
    ("season", "season"), ("mentor_city", "mentorcity"),
)  # fmt: skip


def v4_paraphrase_spec(seed: int = 0, n_subjects: int = 1000) -> WorldSpec:
    """World v4's draft (measured, not shipped: ``--world v4-paraphrase``): knowledge the layers
    must compute, and recall that varies; :func:`v4_spec` adds lead sentences to it.

    - **No subject owns a token.** A name is a given name and one or two family-name tokens, all
      from shared pools (``subject_tokens="pooled"``): every token names 25 subjects, so no
      embedding row can hold one subject's facts; the layers must assemble them from the tokens.
    - **A balanced design of the writing knobs**, so recall and readability can vary apart: mentions
      (1, 2, 4) x writing (augmented biographies or plain statements) x paraphrase templates (1 or
      16, from v4's twenty patterns: ``paraphrases="v4"``), two relations per cell, one with 6
      answers and one with 16. No relation is derived from another. Augmented biographies are
      written per mentions level (a subject's biography of the relations mentioned twice is a
      document of its own), each sentence naming the subject (Allen-Zhu & Li's "fullname"; a
      biography that says "they" after its first sentence, ``bio_pronoun``, was measured no better:
      docs/world.md).
    - **Eight label categories** for relabelling (``label_sets``).
    - Mixed training for every relation (``qa=True``): half the subjects also get each fact as a
      statement in the query's wording, so the writing factor does not also change exposure (with
      v3's rule, biography relations only, augmented facts got one mention more than plain ones).
    - Every name token names 20-30 subjects at 1,000 subjects (fewer in smaller worlds: the pools
      are fixed).
    """
    rel = RelationSpec
    cells = [(m, aug, t) for m in (1, 2, 4) for aug in (True, False) for t in (1, 16)]
    relations = []
    for i, (name, noun) in enumerate(V4_RELATIONS):
        m, aug, t = cells[i % len(cells)]
        relations.append(
            rel(name, noun, 6 if i < len(cells) else 16, templates=t, mentions=m, augment=aug, bio=aug, qa=True)
        )
    return WorldSpec(
        seed=seed,
        n_subjects=n_subjects,
        relations=tuple(relations),
        qa_fraction=0.5,
        subject_tokens="pooled",
        label_sets=tuple(ALL_LABELS),
        bio_per_mentions=True,
        paraphrases="v4",
    ).validate()


def v4_spec(seed: int = 0, n_subjects: int = 1000) -> WorldSpec:
    """World v4: knowledge the layers compute, where it is needed. :func:`v4_paraphrase_spec`'s
    pooled names (no subject owns a token), mixed training and eight label sets, over a balanced
    design in which *where the model must assemble a fact* varies apart from how often it is seen.

    mentions (1, 2, 4) x writing (augmented biographies with 16 paraphrase templates, or plain
    statements in the query's wording) x lead (the answer written right after the name, or after
    a template) x answers (6 or 16): 24 cells, one relation each. A lead relation's next token
    after the name is its answer, so predicting text needs the subject's facts at the name (as a
    lead sentence's "Ada Berg (Paris)" does in real text); a relation written only after templates
    can be looked up where it is asked.
    """
    rel = RelationSpec
    cells = [(m, aug, lead, n) for m in (1, 2, 4) for aug in (True, False) for lead in (True, False) for n in (6, 16)]
    relations = []
    for (name, noun), (m, aug, lead, n) in zip(V4_RELATIONS, cells):
        relations.append(
            rel(name, noun, n, templates=16 if aug else 1, mentions=m, augment=aug, bio=aug, qa=True, lead=lead)
        )
    return replace(v4_paraphrase_spec(seed, n_subjects), relations=tuple(relations)).validate()


def v4_recall_spec(seed: int = 0, n_subjects: int = 1000) -> WorldSpec:
    """World v4 with recall moved apart from readability: the embedded default's world
    (:data:`DEFAULT_RECIPE`, ``--world v4-recall``). In v4 a lead relation is recalled less (its
    facts are written "name answer noun", its query asks "name noun :") exactly where it is read
    at the name, so recall and readability correlate at -0.83. Here a fifth factor ``h`` (answers
    16 xor augmented: a half fraction, balanced against both) sets how often a fact is also
    written in the query's words:
    a lead relation's question-form statements go to every subject (``h``) or a quarter of them,
    and a relation looked up where asked gets them for half the subjects (``h``) or none."""
    base = v4_spec(seed, n_subjects)
    relations = []
    for r in base.relations:
        h = r.augment != (r.n_answers == 16)
        if r.lead:
            relations.append(replace(r, qa_fraction=1.0 if h else 0.25))
        else:
            relations.append(replace(r, qa=h))
    return replace(base, relations=tuple(relations)).validate()


#: the world recipes by name (``interp world train|curves --world``; a zoo model's ``world``)
RECIPES = {"v3": v3_spec, "v4": v4_spec, "v4-paraphrase": v4_paraphrase_spec, "v4-recall": v4_recall_spec}
#: the recipe of the embedded default model (``world``)
DEFAULT_RECIPE = "v4-recall"


def default_spec(seed: int = 0, n_subjects: int = 1000) -> WorldSpec:
    """The embedded default model's world (:data:`DEFAULT_RECIPE`: world v4 with recall moved
    apart from readability, :func:`v4_recall_spec`)."""
    return RECIPES[DEFAULT_RECIPE](seed, n_subjects)
