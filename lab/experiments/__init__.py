"""Experiments with known answers, built from the analyzers: a model with induction heads
(:mod:`~lab.experiments.induction`), the circuit a relabelled fine-tune uses
(:mod:`~lab.experiments.relation_circuit`), grokking on modular addition
(:mod:`~lab.experiments.grokking`) and in-context regression on subspaces
(:mod:`~lab.experiments.icl`)."""
