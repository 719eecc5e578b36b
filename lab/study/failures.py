"""Fine-tunes that did not learn: failed jobs, not measurements.

A study's outcome is how well a fine-tune generalizes to held-out subjects. That number means
something only for a fine-tune that learned its fine-tuning set: one whose loss became NaN, or
that predicts its training set no better than its own chance, generalizes at kappa ~0 because
it learned nothing, and counting it would put "the learning rate was wrong" into the
correlation as "this relation does not generalize". A fine-tune **fails** when

- its loss became NaN or infinite (``nonfinite_loss_step``; training stops there), or
- its training predictions agree with the training labels no better than chance: Cohen's kappa
  on the fine-tuning set below ``min_train_kappa`` (default 0.2; one label predicted for every
  fine-tuning subject has kappa 0); the reason says "diverged" too when its loss ended at more
  than 1.5 times where it started (minibatch noise aside).

Every criterion looks at **training only**, never at a held-out prediction. A fine-tune that
learned its set and then predicts one label for every held-out subject is *not* failed: that is
the outcome being measured (no generalization), and leaving it out would select relations on the
dependent variable and bias the correlation upwards. It is flagged (``heldout_one_label``) and
counted in the report. Exclusion is still not free of selection: how well a fine-tune fits its
set may itself depend on the relation (readable answers may be easier to fit), so when a main
fine-tune fails the summary also reports the headline r with the failed ones counted
(``headline.with_failed_kept``), and each statistic says on how many relations it stands (``n``).

Failed fine-tunes are recorded with their reason (``finetunes.csv``: ``status`` "failed",
``reason``), listed in ``summary.json`` and the report, and left out of the statistics unless
``StudyConfig(keep_failed=True)``. When more than ``max_failed_share`` of a study's fine-tunes
fail, the summary and the report say so first and name the likely cause (:func:`likely_cause`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def failure_reason(record: dict, min_train_kappa: float) -> str | None:
    """Why the fine-tune of ``record`` (a job's result) failed, or None if it learned."""
    reasons = []
    step = record.get("nonfinite_loss_step")
    if step is not None:
        reasons.append(f"diverged: the loss became NaN or infinite at step {step} (lr {record.get('lr')})")
    k = record.get("train_kappa")
    if step is None and k is not None and not k >= min_train_kappa:  # NaN (undefined) is not learned either
        first, final = record.get("first_loss"), record.get("final_loss")
        if first is not None and final is not None and math.isfinite(first) and final > 1.5 * first:
            reasons.append(f"diverged: the loss rose from {first:.3g} to {final:.3g} (lr {record.get('lr')})")
        reasons.append(
            f"did not learn: training accuracy {record.get('train_accuracy', float('nan')):.2f} is kappa {k:.2f} "
            f"over the fine-tuning set's chance (< {min_train_kappa}) after {record.get('steps')} steps"
        )
    return "; ".join(reasons) or None


def likely_cause(failed: Sequence[dict], config) -> str:
    """What most likely made these fine-tunes fail (``config``: the study's configuration)."""
    f = config.finetune
    check = (
        "the learning-rate check chose these rates on one relation; set them by hand (finetune.lr, lora_lr)"
        if config.lr_check
        else "let the learning-rate check pick them (StudyConfig(lr_check=True))"
    )
    diverged = sum("diverged" in r["reason"] for r in failed)
    if diverged >= len(failed) / 2:
        return f"most diverged: the learning rate is too high for this model (full {f.lr}, LoRA {f.lora_lr}); {check}"
    return (
        f"most did not learn their fine-tuning set in {f.max_steps} steps: the learning rate (full {f.lr}, LoRA "
        f"{f.lora_lr}) is likely too high for this model (a collapse to one label) or too low; {check}, or "
        "give more steps (finetune.max_steps)"
    )


def failure_summary(records: Sequence[dict], config) -> dict:
    """The ``failed_jobs`` block of ``summary.json``: which failed and why, their share, whether
    the study warns first, and the held-out one-label flags."""
    done = [r for r in records if r["status"] in ("done", "failed")]
    failed = [r for r in done if r["status"] == "failed"]
    share = len(failed) / len(done) if done else 0.0
    return {
        "n_failed": len(failed),
        "n_finetunes": len(done),
        "share": share,
        "excluded_from_statistics": not config.keep_failed,
        "warning": (
            f"{len(failed)} of {len(done)} fine-tunes failed ({share:.0%}, more than {config.max_failed_share:.0%}): "
            + likely_cause(failed, config)
        )
        if failed and share > config.max_failed_share
        else None,
        "jobs": [{"job": r["job"], "reason": r["reason"]} for r in failed],
        "heldout_one_label": sorted(r["job"] for r in done if r.get("heldout_one_label")),
    }
