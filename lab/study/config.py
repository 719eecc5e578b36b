"""What a study is, apart from running it: its configuration (:class:`StudyConfig`) and its
specification (:class:`StudySpec`: the model, the relations, the configuration, the label
categories), which the checks (:mod:`lab.study.validate`) and the summary
(:mod:`lab.study.summary`) read. :class:`lab.study.study.Study` runs a specification's stages
into a folder.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from interp.models import Model
from interp.relations import Relation
from lab.stages import digest

from .design import Design, finetune_budget, make_design, per_answer
from .finetune import FinetuneConfig

#: ``field(metadata=SUMMARY_ONLY)``: a setting only the summary reads (resampling counts, how failed
#: fine-tunes are treated): not part of any stage's key, and a folder is not refused for it, so
#: that changing it recomputes the summary from the saved fine-tunes instead of refitting them
SUMMARY_ONLY = {"digest": False, "summary_only": True}


#: ``field(metadata=OWN_STAGE)``: a setting of one stage only (the readability baselines,
#: :mod:`lab.study.baselines`), keyed by that stage's own inputs: not part of the fine-tunes' keys,
#: and a folder is not refused for it (the stage is, if its inputs changed)
OWN_STAGE = {"digest": False, "summary_only": True}


def summary_only_fields() -> set[str]:
    """The settings a folder is not refused for (:data:`SUMMARY_ONLY` and :data:`OWN_STAGE`)."""
    return {f.name for f in fields(StudyConfig) if f.metadata.get("summary_only")}


@dataclass(frozen=True)
class StudyConfig:
    """Hyperparameters of a study (checked by :func:`lab.study.validate.validate_study`).

    ``finetune_budget``: range of each relation's number of fine-tuning subjects (drawn per
    relation, independent of its answers); ``n_finetune``: instead, a fixed number per answer
    (then the number of fine-tuning subjects is ``n_finetune x #answers``, the same variable as
    the number of answers). The default range, 150-300 of a world relation's 1,000 subjects, gives
    5-10 per answer to a 30-answer relation; with 40-120 (the previous default) many answers had
    2-3, too few for even a linear probe on the same subjects to generalize (the ablation row
    "budget 40-120" measures it). ``n_null``: simulated null studies for the calibration table.

    Failed fine-tunes (:mod:`lab.study.failures`): ``min_train_kappa``, the training-set kappa
    below which a fine-tune did not learn; ``keep_failed``, count failed fine-tunes in the
    statistics anyway; ``max_failed_share``, the share of failures above which the report warns
    first. These and the resampling counts (``n_boot``, ``n_perm``, ``n_null``) are read by the
    summary alone (:data:`SUMMARY_ONLY`). ``lr_check``: before the fine-tunes, pick each method's
    learning rate from a short grid on one relation (:mod:`lab.study.lr_check`); unset learning
    rates otherwise resolve per model (:meth:`lab.study.finetune.FinetuneConfig.for_model`).

    ``baselines``: measure each relation's readability from representations that hold no
    learned computation (input embeddings; the architecture with random weights,
    ``baseline_seeds``) and report readability above that baseline (:mod:`lab.study.baselines`);
    ``baseline_flag``: the baseline kappa above which a relation is flagged as readable from its
    tokens. ``nonlinear_probes``: also read each relation with nonlinear probes on the same states
    and folds (``"mlp"``, ``"knn"``: :mod:`probes.nonlinear`), reported beside readability and
    compared with it by Williams' test (is *linear* readability the better predictor?).
    """

    category: str = "animals"
    other_categories: tuple[str, ...] = ("colours", "fruits", "instruments")
    label_seeds: tuple[int, ...] = (0, 1, 2)
    finetune_seeds: tuple[int, ...] = (0, 1, 2)
    methods: tuple[str, ...] = ("full", "lora")
    n_finetune: int | None = None
    finetune_budget: tuple[int, int] = (150, 300)
    min_per_answer: int = 2
    split_seed: int = 0
    folds: int = 5
    probe_C: float = 1.0
    fixed_layer: int | None = None  # default: n_layers // 2
    top_k: int = 3
    n_boot: int = field(default=2000, metadata=SUMMARY_ONLY)
    n_perm: int = field(default=2000, metadata=SUMMARY_ONLY)
    n_null: int = field(default=2000, metadata=SUMMARY_ONLY)
    min_train_kappa: float = field(default=0.2, metadata=SUMMARY_ONLY)
    keep_failed: bool = field(default=False, metadata=SUMMARY_ONLY)
    max_failed_share: float = field(default=0.1, metadata=SUMMARY_ONLY)
    lr_check: bool = False
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    baselines: bool = field(default=True, metadata=OWN_STAGE)
    baseline_seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata=OWN_STAGE)
    baseline_flag: float = field(default=0.2, metadata=SUMMARY_ONLY)
    nonlinear_probes: tuple[str, ...] = field(default=("mlp", "knn"), metadata=OWN_STAGE)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))

    def digest(self) -> str:
        return digest(self.to_dict())

    def per_answer(self, relation: Relation) -> int:
        """Fine-tuning subjects per answer for ``relation`` (see :mod:`lab.study.design`)."""
        if self.n_finetune is not None:
            return self.n_finetune
        budget = finetune_budget(relation.name, *self.finetune_budget, seed=self.split_seed)
        counts = Counter(dict(zip(relation.subjects, relation.answers)).values())
        return per_answer(budget, len(counts), self.min_per_answer, cap=int(np.median(list(counts.values()))) // 2)


def design_for(relation: Relation, labels: dict, config: StudyConfig, category: str, label_seed: int) -> Design:
    """The relation's relabelling and split under ``config``; a label that is also one of the
    relation's answers (a colour relabelled with colours) is never used for it."""
    answers = {a.lower() for a in relation.answers}
    words = tuple(w for w in labels[category] if w.lower() not in answers)
    return make_design(relation, words, config.per_answer(relation), label_seed, config.split_seed, category)


@dataclass(frozen=True)
class StudySpec:
    """A study's inputs: ``model``, ``relations``, ``config``, the label categories ``labels``
    (name -> words), ``trained_tokens`` (token ids the model was trained on, or None) and where
    the subject-frequency covariate comes from (``frequency_source``, for the summary)."""

    model: Model
    relations: tuple[Relation, ...]
    config: StudyConfig
    labels: dict[str, tuple[str, ...]]
    trained_tokens: frozenset[int] | None = None
    frequency_source: str = "proxy"

    @property
    def by_name(self) -> dict[str, Relation]:
        return {r.name: r for r in self.relations}

    @property
    def fixed_layer(self) -> int:
        """The fixed read-out layer: ``config.fixed_layer``, or the model's middle layer."""
        return self.config.fixed_layer if self.config.fixed_layer is not None else self.model.n_layers // 2

    def design(self, relation: Relation, category: str, label_seed: int) -> Design:
        """The relation's relabelling and split (:func:`design_for`)."""
        return design_for(relation, self.labels, self.config, category, label_seed)
