"""Label categories for studies on pretrained models of real language.

A relabelling study maps each answer of a relation to a word of one category (Europe -> crab).
The world model's categories (:data:`lab.world.vocab.LABELS`) are words of its own corpus; a
pretrained model gets common English words instead, chosen to be one word piece in BERT's
uncased vocabulary (all-MiniLM-L6-v2) so that every label of a category is scored through the
same one-slot read-out (:mod:`interp.scoring`; multi-piece labels work but pay for each piece).
``animals`` holds 40 words, enough for the study's largest relation (``max_answers`` in
:mod:`lab.study.relations`); the others serve the robustness runs, which skip a relation with
more answers than the category has words. A label that is also one of a relation's answers is
never used for that relation (:meth:`lab.study.Study.design`).
"""

from __future__ import annotations

REAL_LABELS: dict[str, tuple[str, ...]] = {
    "animals": tuple(
        "cat dog horse cow pig sheep goat lion tiger bear wolf fox deer rabbit mouse rat monkey elephant "
        "zebra camel frog snake whale shark eagle owl duck goose chicken bee ant spider crab turtle snail "
        "donkey dolphin penguin parrot squirrel".split()
    ),
    "vehicles": tuple(
        "car bus train truck bicycle boat ship plane taxi tram van jeep tractor yacht canoe rocket "
        "helicopter motorcycle subway wagon".split()
    ),
    "tools": tuple(
        "hammer saw drill knife axe shovel rake ladder rope needle scissors brush broom bucket hose spoon "
        "fork nail screw".split()
    ),
    "colours": tuple(
        "red blue green yellow orange purple pink brown black white grey silver gold violet crimson "
        "scarlet beige maroon navy ivory".split()
    ),
}
