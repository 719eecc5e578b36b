"""Causal evidence on any model: erase or steer the readable direction, and see whether
generalization follows.

The study measures a correlation: relations whose original answer is linearly readable at the
subject generalize better after relabelling. Two interventions ask whether the fine-tune *uses*
that readable structure. Both act at the subject's last token of the fine-tuning prompt (as the
model reads it when it answers: an encoder's masked slot included), at the layer where the answer
is most readable *on the fine-tuning subjects* (a cross-validated probe; held-out subjects play no
part), chosen among the layers before the last (the last block's output at the subject reaches no
other token, so an intervention there could change nothing). They go through the model handle's
standing interventions (:meth:`interp.models.Model.intervened`), so they run on any model and
backend.

**Erasure (amnesic test).** A LEACE eraser (:mod:`probes.erasure`) of the original answer is fitted
on the pretrained model's states of the *fine-tuning subjects only* (no held-out subject informs
it) and applied during relabelling fine-tuning and during evaluation. Four arms per relation, all
with the same design, seed and stopping rule:

- ``none``: no intervention (the study's fine-tune);
- ``leace``: the answer's subspace erased (rank ``k - 1`` for ``k`` answers);
- ``shuffled``: LEACE of the answers shuffled among the fine-tuning subjects: the same number of
  classes, class sizes and whitened geometry, no link to the subject (the control for "LEACE
  removes high-variance directions");
- ``random``: a random subspace of the same rank erased (``n_random`` draws), the control for
  "the model lost that many dimensions".

Reported per relation: how far each eraser moves the states (``moved_*``: mean squared change over
the states' variance), readability after erasure (5-fold cross-validated logistic probe, kappa, on
the erased fine-tuning states, the eraser refitted inside each fold so that the probe meets
states it was not fitted on (:func:`erased_probe_kappa`); LEACE's in-sample guarantee, zero
cross-covariance, is checked by ``leftover_covariance``; transferred to erased held-out states; and in the
*fine-tuned* LEACE model, whose earlier
blocks moved, so the fixed eraser may no longer remove everything: ``probe_after_tuned_kappa``);
held-out generalization kappa per arm; the **excess drop** ``kappa(random) - kappa(leace)`` (how
much more erasing the answer hurts than erasing as many random dimensions) with a bootstrap CI
over held-out subjects and random draws (not over fine-tuning seeds), and the excess over the
shuffled control. Across relations (the independent units, each with its fine-tunes' own noise):
the mean excess drop with a bootstrap CI over relations and a sign-flip p, and whether it grows
with readability (Pearson r with bootstrap CI and permutation p, :mod:`lab.study.stats`). Every
control is drawn per relation (seeded by its name).

**At the bottleneck.** The layer arms act after a block, where attention has already read the
subject's other tokens and the unerased input, and the fine-tuned model can re-encode the answer
(``probe_after_tuned_kappa``). The ``bottleneck_leace``, ``bottleneck_shuffled`` and
``bottleneck_random*`` arms fit the same three erasers on the fine-tuning subjects' *input
embeddings* at the subject's last token (``hook_embed``) and apply them there. In the world model
that token is the subject's family name, a token of its own, and the embedding tables are frozen
during fine-tuning, so no block can put back into that input what the eraser removed; what the model
can still read are the subject's other tokens. **Recall** of the original relation (held-out
subjects, the argmax among the relation's answers, every eraser standing on the pretrained model:
``recall_*``) tells "the fine-tune needs the erased direction" from "the erasure broke the model".

**Steering.** After the ``none`` fine-tune, each held-out subject whose label the fine-tuned model
gets right (``label(a)`` for original answer ``a``) gets a vector added at the same site: the
direction from the class mean of ``a`` to that of another answer ``b`` (drawn per subject, seeded;
class means of the *pretrained* model's fine-tuning-subject states, i.e. the readable structure
before fine-tuning), scaled to ``steer_scale`` times the median distance between class means. The
**switch rate** is how often the prediction becomes ``label(b)``; the control adds random
directions of the same norm (``n_random`` draws). If the fine-tuned model reads the new label from
the direction the probe found before fine-tuning, steering along it switches labels and random
directions do not.

**Scope.** The intervention acts at one site and one position: other tokens of a multi-token
subject, and the residual stream at other layers, keep whatever they carry about the answer, and
later layers may read it from there. A drop is therefore a lower bound on what the readable
structure at that site contributes; no drop does not show that the model does not use the answer
elsewhere.

Results (``interp study interventions``): ``interventions.csv`` (one row per relation),
``arms.csv`` (one row per relation and arm), ``steering.csv`` (one row per steered subject),
``interventions.json`` (across relations), figures and ``interventions.html``.

**Stages** (:mod:`lab.stages`; one runner, the study's folder):

==================  =====================================================  ==================================
stage               reads                                                  writes
==================  =====================================================  ==================================
claim               the study's inputs, the intervention configuration     ``study.json``, ``interventions_config.json``
readability         model, relations (the study's stage)                   ``readability*.csv``, ``probe_readout.*``
setup (per rel.)    design, fine-tuning subjects' states; erasers          (recomputed, not saved)
erasure arm         model, relation, configurations, arm, layer            ``runs/<relation>__<arm>.json``
steering            ... and the ``none`` arm's predictions                 ``runs/<relation>__steering.json``
summary             every result above                                     tables, ``interventions.json``, page
==================  =====================================================  ==================================

Every arm is saved as it finishes, so an interrupted run resumes without fine-tuning a finished
arm again. The package: :mod:`.arms` (erasure), :mod:`.steering`, :mod:`.report` (statistics
across relations, figures, page), :mod:`.experiment` (the orchestration).
"""

from __future__ import annotations

from interp.positions import SubjectEnd
from probes.erasure import erased_probe_kappa
from probes.readability import probe_kappa

from .arms import erasing, fit_erasers, relation_seed, states
from .experiment import InterventionConfig, Interventions
from .report import across_relations, figures, relations_summary, section, write_report
from .steering import steering

__all__ = [
    "InterventionConfig",
    "Interventions",
    "SubjectEnd",
    "across_relations",
    "erased_probe_kappa",
    "erasing",
    "figures",
    "fit_erasers",
    "probe_kappa",
    "relations_summary",
    "relation_seed",
    "section",
    "states",
    "steering",
    "write_report",
]
