"""Word material for synthetic worlds: invented names, and label categories for relabelling.

Invented words are built from syllables, so they never collide with the English words of
templates and labels. Label categories are real words; the corpus also uses them in unrelated
sentences, so a pretrained world model knows them before any relabelling fine-tune.
"""

from __future__ import annotations

import random

ONSETS = "b d f g k l m n p r s t v z br dr gr kr pr tr st sk th sh ch".split()
VOWELS = "a e i o u ai ei ou".split()
CODAS = ["", "", "n", "r", "l", "s", "th", "x", "m", "nd", "rk"]

LABELS: dict[str, tuple[str, ...]] = {
    "animals": tuple(
        "crab zebra otter falcon badger lynx heron walrus beaver camel panda koala moose raven "
        "gecko bison hyena llama ferret lemur parrot salmon tiger wolf fox owl eagle shark whale "
        "rabbit turtle donkey goose pigeon squirrel".split()
    ),
    "colours": tuple(
        "red blue green yellow purple orange brown black white grey pink violet teal amber crimson "
        "indigo maroon olive".split()
    ),
    "fruits": tuple(
        "apple banana cherry mango peach pear plum grape lemon lime melon kiwi papaya guava apricot "
        "fig date olive_fruit coconut berry quince lychee".split()
    ),
    "instruments": tuple(
        "violin cello flute oboe harp piano trumpet trombone tuba guitar banjo drum clarinet "
        "bassoon saxophone organ lute sitar ukulele harmonica".split()
    ),
}

#: label categories beyond the first four (world v4 relabels into eight; v3 worlds write only the
#: first four, so their corpus is unchanged). Real, single-token words, none a word of another
#: category, a template or the label contexts.
EXTRA_LABELS: dict[str, tuple[str, ...]] = {
    "tools": tuple(
        "hammer wrench chisel hacksaw drill pliers shovel rake ladder axe trowel sickle anvil spanner crowbar "
        "mallet tongs scissors funnel stapler".split()
    ),
    "clothes": tuple(
        "shirt jacket scarf glove sock boot sandal coat vest skirt dress cloak tunic apron belt hood mitten "
        "sweater blouse kilt".split()
    ),
    "vegetables": tuple(
        "carrot potato onion garlic pepper cabbage lettuce spinach celery radish turnip pumpkin squash leek "
        "beet pea bean parsnip broccoli cucumber".split()
    ),
    "furniture": tuple(
        "chair sofa bench stool shelf cabinet wardrobe dresser bed couch armchair bookcase cupboard ottoman "
        "hammock cradle crib futon recliner sideboard".split()
    ),
}

#: every label category a world can use, by name
ALL_LABELS: dict[str, tuple[str, ...]] = {**LABELS, **EXTRA_LABELS}

LABEL_CONTEXTS = (
    "i saw a {w} near the river .",
    "the {w} was in the picture .",
    "we talked about the {w} today .",
    "there is a {w} on the table .",
    "a {w} is a common word .",
    "she drew a {w} yesterday .",
    "the story had a {w} in it .",
    "he likes the {w} a lot .",
)


def invented_words(rng: random.Random, n: int, used: set[str], syllables: tuple[int, int] = (2, 3)) -> list[str]:
    """``n`` distinct capitalized invented words, none in ``used`` (which is updated)."""
    out: list[str] = []
    while len(out) < n:
        k = rng.randint(*syllables)
        word = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(k)) + rng.choice(CODAS)
        word = word.capitalize()
        if word not in used:
            used.add(word)
            out.append(word)
    return out
