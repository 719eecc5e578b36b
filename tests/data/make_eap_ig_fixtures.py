"""How ``eap_ig_sequential.json`` and ``eap_ig_parallel.json`` were written: by EAP-IG's own code
(github.com/hannamw/EAP-IG, commit 795f560, ``eap.graph.Graph``), not by this toolkit.

    python tests/data/make_eap_ig_fixtures.py /path/to/EAP-IG/src

EAP-IG imports ``HookedTransformer`` and ``HookedTransformerConfig`` from TransformerLens, which
TransformerLens 4 removed; a graph built from a config dictionary uses them only for
``isinstance`` checks, so two empty stand-ins are enough. It also needs pygraphviz and matplotlib.
Each graph gets distinct, exactly representable scores (their absolute values tie in pairs, and
the ``top_n`` given falls between two distinct absolute values, so the selection does not depend
on how ties are broken), then ``apply_topn`` (which prunes, as MIB's evaluation does) and
``to_json``.
"""

import sys
import types

sys.path.insert(0, sys.argv[1])
stub = types.ModuleType("transformer_lens")
stub.HookedTransformer = type("HookedTransformer", (), {})
stub.HookedTransformerConfig = type("HookedTransformerConfig", (), {})
sys.modules["transformer_lens"] = stub

from eap.graph import Graph  # noqa: E402

CONFIGS = {  # the shipped world model's shape; the tiny GPT-NeoX test model's (parallel blocks)
    "sequential": ({"n_layers": 4, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 128}, 150),
    "parallel": ({"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": True, "d_model": 32}, 60),
}
for name, (cfg, top_n) in CONFIGS.items():
    g = Graph.from_model(cfg)
    for i, edge in enumerate(g.edges.values()):
        edge.score = ((i * 37) % 1009 - 504) / 1024.0
    g.apply_topn(top_n, absolute=True)
    g.to_json(f"eap_ig_{name}.json")
