"""The generalization study: readability before fine-tuning vs generalization after it.

>>> from lab.study import run_study
>>> result = run_study("world", out="results/study")        # the main job, ~15 min on 2 cores
>>> result.summary["headline"]
"""

from __future__ import annotations

from .compare import compare_studies
from .config import StudyConfig, StudySpec
from .design import Design, finetune_budget, make_design, per_answer, relabel, split
from .finetune import FinetuneConfig, finetune
from .run import run_study
from .study import Job, Study, StudyResult
from .validate import StudyConfigError

__all__ = [
    "Design",
    "FinetuneConfig",
    "Job",
    "Study",
    "StudyConfig",
    "StudyConfigError",
    "StudyResult",
    "StudySpec",
    "compare_studies",
    "finetune",
    "finetune_budget",
    "make_design",
    "per_answer",
    "relabel",
    "run_study",
    "split",
]
