"""The ``interp`` command line.

interp study --out DIR           the generalization study on the embedded world model (main job)
interp study --model minilm      the same study on a pretrained encoder and the LRE relations that qualify
interp study interventions       erase (LEACE) or steer the readable direction: does generalization follow?
interp study figures DIR         redraw every figure and the report of a results folder
interp study null DIR            null calibration: false-positive rates with no generalization
interp study findings            the findings page (docs/study.md) from saved tables
interp study causal --out DIR    writing randomized per subject: does causing readability cause generalization?
interp figures DIR               redraw every figure of every result under DIR from saved data
interp demo                      capture + probe demo on the embedded world model
interp probe --model M --relations FILE...  linear probes at every layer of your own model
interp patch --model M --pairs FILE    activation patching (residual stream, heads) on your own pairs
interp world train --out DIR     pretrain a world model (the embedded default's recipe)
interp world report [--model DIR]  recall and readability per relation
interp world ablate --out DIR    which ingredient makes knowledge active (one row per factor)
interp circuits induction --out DIR   patching analyses on the induction-head model
interp circuits relation NAME --out DIR  which components carry a relation, before/after fine-tuning
interp circuits figures DIR          redraw the figures of a circuits results folder
interp circuits findings             the circuits findings page (docs/circuit_findings.md)
interp circuits train-induction --out DIR  retrain the induction-head model
interp jacobians grok --out DIR      grokking on modular addition: weight decay vs GrokAlign
interp study predictors DIR          LRE faithfulness and Jacobian alignment as predictors
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import transformers
import typer

import interp
from circuits.figures import write_figures
from interp.plots import export
from interp.results import save_table, write_json, write_table, write_text
from jacobians.dynamics import from_log, trajectory_plot
from lab.experiments.circuit_findings import write_circuit_findings
from lab.experiments.grokking import CPU_CONFIG, grokking_experiment, load_logs
from lab.experiments.induction import InductionConfig, analyze_induction, train_induction_model
from lab.experiments.own_model import patch_own_model, probe_own_model, read_pairs_file
from lab.experiments.relation_circuit import relation_circuit, relation_faithfulness, relation_stages
from lab.figures import regenerate
from lab.inputs import (
    InputError,
    check_backend,
    check_choice,
    check_executor,
    check_methods,
    check_model,
    check_out,
    check_relation_files,
    check_world_relations,
)
from lab.study import StudyConfigError, run_study
from lab.study.ablation import ablate
from lab.study.causal import causal_test
from lab.study.compare import CompareError, compare_studies
from lab.study.findings import write_findings, write_surface_control
from lab.study.interventions import InterventionConfig, Interventions
from lab.study.interventions import section as intervention_section
from lab.study.pooled import pool_over_seeds
from lab.study.predictors import compare_predictors
from lab.study.randomized import randomized_causal_test
from lab.study.report import write_report
from lab.study.run import default_config, is_world
from lab.study.seeds_page import design_knobs, seeds_page
from lab.study.summary import calibrate_folder
from lab.world import from_world, load_world, train_world_model, world_checkpoint_of
from lab.world.curves import curve_summary, learning_curves
from lab.world.report import knowledge_report, readability
from lab.world.spec import DEFAULT_RECIPE, RECIPES
from lab.world.train import ARCHS, TrainConfig, check_config, recipe, trained_on
from lab.world.zoo import ZOO, zoo_model
from probes import best_layer_readability

# The command line works offline and quietly unless told otherwise; set in the environment so that
# worker processes inherit it. interp.models.resolve_path reads HF_HUB_OFFLINE when it resolves a
# name; transformers read its verbosity when first imported, which `import lab` may already have
# done, so it is applied here too.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
if os.environ["TRANSFORMERS_VERBOSITY"] == "error":
    transformers.logging.set_verbosity_error()

app = typer.Typer(help="Activation capture, probes and generalization studies.", no_args_is_help=True)

#: the world recipes ``interp world train|curves --world`` takes
WORLD_SPECS = RECIPES


@app.callback()
def _setup() -> None:
    """Progress in a log: when stderr is not a terminal (``interp study > run.log 2>&1``), long
    stages report through logging (see :mod:`interp.progress`) instead of redrawing bars."""
    if not sys.stderr.isatty() and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


world_app = typer.Typer(help="Synthetic knowledge worlds and the embedded world model.", no_args_is_help=True)
app.add_typer(world_app, name="world")
study_app = typer.Typer(help="The generalization study (the main job).", invoke_without_command=True)
app.add_typer(study_app, name="study")
jacobians_app = typer.Typer(help="Jacobians, GrokAlign and linear relational embeddings.", no_args_is_help=True)
app.add_typer(jacobians_app, name="jacobians")
circuits_app = typer.Typer(help="Activation, path and attribution patching.", no_args_is_help=True)
app.add_typer(circuits_app, name="circuits")


@app.command()
def demo(
    backend: str = typer.Option(interp.DEFAULT_BACKEND, help="nnsight or transformer_lens"),
    out: Path = typer.Option(Path("results/demo"), help="folder for the result table"),
):
    """Capture the world model's subject states at every layer and probe each relation's answer."""
    check_out(out)
    model = interp.load_model("world", backend=backend)
    world = load_world()
    typer.echo(f"{model}\nworld: {len(world.subjects)} subjects, {len(world.spec.relations)} relations")
    table = readability(model, world)
    out.mkdir(parents=True, exist_ok=True)
    write_table(table, out / "readability.csv")
    best = best_layer_readability(table).sort_values("kappa", ascending=False)
    typer.echo(
        "\neach relation's readability at its best layer "
        "(probe accuracy and kappa of its answer at the subject's last token):"
    )
    typer.echo(best.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"\nwrote {out / 'readability.csv'}")


def _formats(formats: str) -> tuple[str, ...]:
    out = tuple(f.strip() for f in formats.split(",") if f.strip())
    bad = [f for f in out if f not in ("html", "png", "svg", "pdf")]
    if bad or not out:
        raise ValueError(f"--formats {formats!r}: give a comma-separated list of html, png, svg, pdf")
    return out


@app.command()
def probe(
    model: str = typer.Option(..., help="a model directory, a hub name in the local cache, or a registered name"),
    relations: list[Path] = typer.Option(..., help="relation JSON files or folders (format: docs/probes.md)"),
    out: Path = typer.Option(Path("results/probe"), help="folder for the tables and figure"),
    backend: str = typer.Option(interp.DEFAULT_BACKEND, help="nnsight or transformer_lens"),
    folds: int = typer.Option(5, help="cross-validation folds (subjects)"),
    formats: str = typer.Option("html,png", help="figure formats: html, png, svg, pdf"),
):
    """Linear probes for each relation's answer at the subject's last token, at every layer of your
    own model: per-fold table, readability (Cohen's kappa) per layer, each relation's best layer."""
    check_out(out)
    check_backend(backend)
    check_model(model)
    check_relation_files(relations)
    kinds = _formats(formats)
    if folds < 2:
        raise ValueError(f"--folds {folds}: cross-validation needs at least 2 folds")
    best = probe_own_model(interp.load_model(model, backend=backend), relations, out, folds, kinds)
    cols = ["relation", "layer", "accuracy", "kappa", "selectivity"]
    typer.echo("each relation's best layer (probe accuracy, Cohen's kappa over chance, selectivity):")
    typer.echo(best[[c for c in cols if c in best]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"wrote {out / 'probes.csv'}, {out / 'readability.csv'}, {out / 'best_layers.csv'}, {out / 'figures'}")


@app.command()
def patch(
    model: str = typer.Option(..., help="a model directory, a hub name in the local cache, or a registered name"),
    pairs: Path | None = typer.Option(None, help="a CSV or JSON file of clean, corrupted, answer, wrong"),
    relation: Path | None = typer.Option(None, help="or one relation JSON file to build matched pairs from"),
    n: int = typer.Option(32, help="pairs built from --relation"),
    out: Path = typer.Option(Path("results/patch"), help="folder for the tables and figures"),
    backend: str = typer.Option(interp.DEFAULT_BACKEND, help="nnsight or transformer_lens"),
    formats: str = typer.Option("html,png", help="figure formats: html, png, svg, pdf"),
):
    """Activation patching, clean into corrupted, of the residual stream at every layer and position
    and of every attention head, with per-pair 95% intervals."""
    check_out(out)
    check_backend(backend)
    check_model(model)
    kinds = _formats(formats)
    if (pairs is None) == (relation is None):
        raise ValueError("give either --pairs FILE (clean, corrupted, answer, wrong) or --relation FILE")
    if pairs is not None:
        read_pairs_file(pairs)
    else:
        check_relation_files([relation])
    table = patch_own_model(interp.load_model(model, backend=backend), out, pairs, relation, n, kinds)
    top = table.reindex(table.effect.abs().sort_values(ascending=False).index).head(8)
    typer.echo(
        f"metric {table.attrs['metric']} (clean {table.attrs['clean_score']:.3f}, corrupted "
        f"{table.attrs['corrupted_score']:.3f}); the 8 largest effects of patching the clean activation into the "
        "corrupted run (effect: the metric's change, mean over pairs, with its 95% interval; normalized: 1 = clean):"
    )
    cols = ["site", "layer", "head", "position", "effect", "ci_low", "ci_high", "p_value", "normalized"]
    typer.echo(top[[c for c in cols if c in top]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"wrote {out / 'pairs.csv'}, {out / 'patching.csv'}, {out / 'figures'}")


@study_app.callback()
def study(
    ctx: typer.Context,
    out: Path = typer.Option(Path("results/study"), help="results folder (resumed if it exists)"),
    model: str = typer.Option(
        "world",
        help="'world' (or a world checkpoint), 'minilm', or any model spec: a directory or hub "
        "name (studied on the shipped LRE relations that qualify, unless --relations)",
    ),
    relations: list[str] | None = typer.Option(
        None, help="relation names (world) or relation JSON files/dirs (other models)"
    ),
    backend: str = typer.Option(interp.DEFAULT_BACKEND, help="nnsight or transformer_lens"),
    n_finetune: int | None = typer.Option(
        None,
        help="fixed fine-tuning subjects per answer (default: a per-relation "
        "budget drawn independently of the number of answers)",
    ),
    methods: str = typer.Option("full,lora", help="comma-separated: full, lora"),
    quick: bool = typer.Option(False, help="one seed, one method, no other categories (a few minutes)"),
    executor: str = typer.Option(
        "serial",
        help="serial; processes (2 local processes, 1 thread each: the world's fine-tuning stage 1.1x faster on 2 "
        "cores, benchmarks/finetunes.py --stage); grouped (fine-tunes trained in groups of up to 16, one forward "
        "pass per step for the group: 1.1-1.2x there, and meant for GPUs; models without dropout); or ray (a local "
        "Ray cluster, or RAY_ADDRESS's)",
    ),
):
    """Run (or resume) the generalization study; writes tables, figures and report.html."""
    if ctx.invoked_subcommand is not None:
        return
    check_out(out)
    check_backend(backend)
    check_executor(executor)
    method_names = check_methods(methods)
    check_model(model)
    if relations:
        files = [r for r in relations if r.endswith(".json") or Path(r).exists()]
        check_relation_files(files)
        if is_world(model):
            check_world_relations([r for r in relations if r not in files])
        elif len(files) < len(relations):
            check_relation_files([r for r in relations if r not in files])  # names only exist on the world

    cfg = replace(default_config(model), n_finetune=n_finetune, methods=method_names)
    if quick:
        cfg = replace(
            cfg,
            methods=cfg.methods[:1],
            label_seeds=(0,),
            finetune_seeds=(0,),
            other_categories=(),
            n_boot=500,
            n_perm=500,
            n_null=500,
        )
    try:
        result = run_study(model, relations or None, out=out, config=cfg, backend=backend, executor=executor)
    except StudyConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from err
    s = result.summary
    nan2 = [float("nan")] * 2
    p = s["headline"].get("pearson", {})
    typer.echo(f"\n{s['n_relations']} relations, model {s['model']}")
    typer.echo(
        f"Pearson r(readability kappa, generalization kappa) = {p.get('r', float('nan')):.3f} "
        f"[{p.get('ci', nan2)[0]:.3f}, {p.get('ci', nan2)[1]:.3f}], "
        f"Monte-Carlo p = {p.get('p_monte_carlo', float('nan')):.3g} "
        f"(permutation p = {p.get('p_value', float('nan')):.3g})"
    )
    for k, v in s["headline"].items():
        if isinstance(v, dict) and k != "pearson" and "r" in v:
            typer.echo(
                f"  {k:<32} r = {v['r']:.3f}  Monte-Carlo p = {v.get('p_monte_carlo', float('nan')):.3g}  "
                f"p = {v['p_value']:.3g}"
            )
    for key, what in (("above_surface", "above random weights"), ("above_baseline", "above max(random, embeddings)")):
        if key in s:
            q = s[key].get("pearson", {})
            typer.echo(
                f"readability {what:<30} r = {q.get('r', float('nan')):.3f}  "
                f"Monte-Carlo p = {q.get('p_monte_carlo', float('nan')):.3g}"
            )
    if "above_baseline" in s:
        flagged = s["above_baseline"]["surface_flagged_relations"]
        typer.echo(f"readable from their tokens (random-weight kappa > {s['above_baseline']['flag_threshold']}): "
                   f"{', '.join(flagged) or 'none'}")  # fmt: skip
    nc = s["null_calibration"]
    typer.echo(
        f"null calibration ({nc['n_sim']} studies with no generalization): false-positive rate of the headline test "
        f"{nc['headline_false_positive_rate']:.3f} (Monte-Carlo), {nc['headline_permutation_false_positive_rate']:.3f} "
        f"(permutation); raw r {nc['raw_false_positive_rate']:.3f}; alpha {nc['alpha']}"
    )
    typer.echo(f"raw accuracies (inflated by chance levels): r = {s['raw']['pearson']['r']:.3f}")
    typer.echo(
        f"robustness: r from {s['robustness']['r_min']:.3f} to {s['robustness']['r_max']:.3f} "
        f"over {s['robustness']['n_settings']} settings"
    )
    for m, b in s["backmap"].items():
        typer.echo(
            f"error back-mapping ({m}): {b['n_errors']} errors, {b['n_relations']} informative relations; "
            "observed/expected "
            f"probe {b['probe_ratio']:.2f}, model {b['model_ratio']:.2f} (paired Wilcoxon p = {b['wilcoxon_p']:.3g})"
        )
    typer.echo(f"mean generalization kappa {s['generalization_kappa']}; mean train accuracy {s['train_accuracy']}")
    typer.echo(f"report: {out / 'report.html'}")


@study_app.command("findings")
def study_findings(
    study: Path = typer.Option(Path("results/study"), help="a finished study's results folder"),
    causal: Path | None = typer.Option(None, help="a finished two-world causal test's folder (optional)"),
    randomized: Path | None = typer.Option(None, help="a finished randomized causal test's folder (optional)"),
    world: Path | None = typer.Option(None, help="a saved `interp world report --out FILE` table (optional)"),
    ablation: Path | None = typer.Option(None, help="a finished `interp world ablate` folder (optional)"),
    real: Path | None = typer.Option(
        None, help="a finished study on a pretrained model, e.g. `interp study --model minilm` (optional)"
    ),
    interventions: Path | None = typer.Option(None, help="a finished `interp study interventions` folder (optional)"),
    compare: Path | None = typer.Option(None, help="an `interp study compare` folder (optional)"),
    interventions_real: Path | None = typer.Option(
        None, help="a finished `interp study interventions --model minilm` folder (optional)"
    ),
    out: Path = typer.Option(Path("docs/study.md"), help="the Markdown page to write"),
):
    """Write the findings page (Markdown) from saved study, causal-test, world, ablation, interventions and real-model
    tables."""
    page = write_findings(
        study,
        out,
        causal,
        world=world,
        ablation=ablation,
        real=real,
        interventions=interventions,
        randomized=randomized,
        compare=compare,
        interventions_real=interventions_real,
    )
    typer.echo(f"wrote {page}")


@study_app.command("compare")
def study_compare(
    folders: list[Path] = typer.Argument(..., help="finished study folders, one per model"),
    name: list[str] | None = typer.Option(
        None, help="the models' labels, one per folder (default: each study's model)"
    ),
    out: Path = typer.Option(Path("results/compare"), help="folder for the table and figures"),
):
    """The study across models: one table in the shape of the paper's (model, family, parameters,
    relations, r with CI and Monte-Carlo p, partial r, mean kappas), small-multiple scatters, a
    forest plot of r against the paper's band, and whether models rank relations alike (Kendall's W)."""
    check_out(out)
    try:
        table = compare_studies(folders, out, names=name or None)
    except CompareError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from err
    cols = ["model", "family", "parameters", "relations", "r", "ci_low", "ci_high", "p_monte_carlo", "partial_r_all",
            "mean_generalization_kappa", "mean_readability_kappa", "failed_finetunes"]  # fmt: skip
    typer.echo(table[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"wrote {out / 'compare.csv'} and {out / 'figures'}")


@study_app.command("pool")
def study_pool(
    folders: list[Path] = typer.Argument(..., help="finished studies of one recipe's pretraining seeds"),
    out: Path = typer.Option(Path("results/pooled"), help="folder for pooled.json and pooled_seeds.csv"),
    page: Path | None = typer.Option(None, help="also write a findings page (Markdown) here (lab.study.seeds_page)"),
    recipe: str | None = typer.Option(
        None, help=f"the world recipe the seeds were trained on ({', '.join(WORLD_SPECS)}): the page adds its knobs"
    ),
    title: str = typer.Option("", help="the page's title"),
):
    """One headline over pretraining seeds: the pooled r (Fisher z averaged over seeds) with an
    interval that resamples seeds and relations, beside each seed's own r and Monte-Carlo p
    (lab.study.pooled)."""
    check_out(out)
    try:
        pooled, seeds = pool_over_seeds(folders)
    except CompareError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from err
    out.mkdir(parents=True, exist_ok=True)
    write_json(pooled, out / "pooled.json")
    write_table(seeds, out / "pooled_seeds.csv")
    typer.echo(seeds.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(
        f"pooled r = {pooled['r_pooled']:.3f} (95% CI {pooled['ci_low']:.3f} to {pooled['ci_high']:.3f}; "
        f"seed-to-seed SD {pooled['seed_sd']:.3f}, {pooled['n_seeds']} seeds, {pooled['n_relations']} relations)"
    )
    if page is not None:
        knobs = None
        if recipe is not None:
            check_choice(recipe, WORLD_SPECS, "--recipe")
            knobs = design_knobs(WORLD_SPECS[recipe]())
        write_text(seeds_page(folders, knobs, title), page)
        typer.echo(f"wrote {page}")


@study_app.command("surface-control")
def study_surface_control(
    folders: list[Path] = typer.Argument(..., help="saved study folders (relations.csv and summary.json)"),
    out: Path = typer.Option(Path("docs/surface_control.md"), help="the page to write"),
):
    """The surface-form control two ways (subtraction and regression), with leave-one-out influence,
    for each saved study (lab.study.stats.control_two_ways)."""
    for f in folders:
        missing = [n for n in ("relations.csv", "summary.json") if not (f / n).exists()]
        if missing:
            raise InputError(f"{f} is not a saved study folder: it has no {' or '.join(missing)}")
    typer.echo(f"wrote {write_surface_control(folders, out)}")


@study_app.command("null")
def study_null(
    out: Path = typer.Argument(..., help="a finished study's results folder"),
    n_sim: int | None = typer.Option(None, help="simulated studies (default: the study's n_null)"),
):
    """Null calibration: false-positive rate of every statistic on simulated studies with no
    generalization beyond chance (same relations, test sizes, readability, label preferences)."""
    table = calibrate_folder(out, n_sim)
    typer.echo(
        table[
            [
                "method",
                "outcome",
                "analysis",
                "false_positive_rate",
                "false_positive_rate_monte_carlo",
                "observed_r",
                "p_monte_carlo",
            ]
        ].to_string(index=False, float_format=lambda v: f"{v:.3f}")
    )
    typer.echo(f"wrote {out / 'null_calibration.csv'} and {out / 'recall_null.csv'}")


@app.command("figures")
def figures(
    out: Path = typer.Argument(..., help="a results folder (searched recursively)"),
    formats: str = typer.Option("html,png,svg,pdf", help="comma-separated: html, png, svg, pdf"),
):
    """Redraw every figure of every result under a folder from its saved tables."""
    for folder, files in regenerate(out, formats.split(",")).items():
        typer.echo(f"{folder}: {len(files)} files")


@study_app.command("figures")
def study_figures(out: Path = typer.Argument(..., help="a finished study's results folder")):
    """Regenerate every figure (HTML, PNG, SVG, PDF) and report.html from the saved tables."""
    typer.echo(f"wrote {write_report(out)}")


@study_app.command("causal")
def study_causal(
    out: Path = typer.Option(Path("results/causal"), help="results folder (resumed if it exists)"),
    design: str = typer.Option(
        "randomized",
        help="randomized: subjects assigned to writing arms inside one pretraining run (pre-registered, "
        "docs/protocol.md); two-worlds: augmented vs plain worlds, one pretraining run each",
    ),
    steps: int = typer.Option(TrainConfig.steps, help="pretraining steps for each world"),
    relations: list[str] | None = typer.Option(
        None, help="two-worlds: relations to manipulate (default: the augmented ones)"
    ),
    retrain: bool = typer.Option(False, help="pretrain even where a shipped checkpoint is the same world"),
    executor: str = typer.Option("serial", help="serial or processes (randomized design's fine-tunes)"),
):
    """Does causing readability cause generalization? With the defaults the world models are
    shipped (randomized: about 9 minutes on 2 cores with --executor processes; two-worlds: about
    5); --retrain pretrains (about 25-35 minutes per world)."""
    check_out(out)
    if design == "randomized":
        df = randomized_causal_test(out, train=TrainConfig(steps=steps), retrain=retrain, executor=executor)
        typer.echo(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        typer.echo((out / "randomized.json").read_text())
        return
    if design != "two-worlds":
        raise typer.BadParameter(f"--design must be 'randomized' or 'two-worlds', got {design!r}")
    df = causal_test(out, relations or None, train=TrainConfig(steps=steps), retrain=retrain)
    typer.echo(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo((out / "causal.json").read_text())


@study_app.command("interventions")
def study_interventions(
    out: Path = typer.Option(Path("results/interventions"), help="results folder (resumed if it exists)"),
    model: str = typer.Option("world", help="'world', 'minilm', or any model spec (as `interp study --model`)"),
    relations: list[str] | None = typer.Option(None, help="relation names (world) or relation JSON files/dirs"),
    backend: str = typer.Option(interp.DEFAULT_BACKEND, help="nnsight or transformer_lens"),
    method: str = typer.Option("full", help="fine-tuning method of every arm: full or lora"),
    n_random: int = typer.Option(
        InterventionConfig.n_random, help="random-subspace erasures and random steering directions per relation"
    ),
    steer_scale: float = typer.Option(
        InterventionConfig.steer_scale, help="steering norm, in median distances between class means"
    ),
    bottleneck: bool = typer.Option(
        InterventionConfig.bottleneck,
        help="the bottleneck arms: erase at the input embedding of the subject's last token",
    ),
    all_tokens: bool = typer.Option(
        InterventionConfig.all_tokens,
        help="the all-token arms: erase at every subject token, at the input and after every block but the last",
    ),
    layer: bool = typer.Option(
        InterventionConfig.layer, help="the arms at the most readable layer, at the subject's last token"
    ),
):
    """Causal evidence: erase the original answer's readable subspace (LEACE) during fine-tuning and
    evaluation, against random subspaces of the same rank and LEACE of shuffled answers (at the
    most readable layer, at the input embedding, and at every subject token of every layer); steer
    held-out subjects along the pretrained class-mean direction, against random directions and
    class-mean directions of shuffled answers and of another relation. Writes tables, figures and
    interventions.html."""
    check_out(out)
    cfg = InterventionConfig(
        method=method,
        n_random=n_random,
        steer_scale=steer_scale,
        bottleneck=bottleneck,
        all_tokens=all_tokens,
        layer=layer,
    )
    try:
        Interventions(model, relations or None, out, cfg, backend=backend).run()
    except StudyConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from err
    typer.echo(intervention_section(out))
    typer.echo(f"report: {out / 'interventions.html'}")


@world_app.command("train")
def world_train(
    out: Path | None = typer.Option(None, help="output checkpoint directory (default: the zoo model's shipped folder)"),
    zoo: str | None = typer.Option(None, help=f"train a zoo model's recipe ({', '.join(ZOO)})"),
    arch: str | None = typer.Option(None, help=f"architecture family ({', '.join(ARCHS)}); default gpt2"),
    layers: int | None = typer.Option(None, help="layers"),
    d_model: int | None = typer.Option(None, help="residual width"),
    heads: int | None = typer.Option(None, help="attention heads"),
    kv_heads: int | None = typer.Option(None, help="key/value heads (llama's grouped-query attention)"),
    steps: int | None = typer.Option(None, help="optimizer steps"),
    seed: int = typer.Option(0, help="seed of the world and of training"),
    subjects: int = typer.Option(1000, help="number of subjects"),
    force: bool = typer.Option(False, help="retrain a folder that already holds this recipe; allow --zoo world"),
    world: str | None = typer.Option(
        None, help=f"the world's recipe: {', '.join(WORLD_SPECS)} (default: the zoo model's, else the default world's)"
    ),
    threads: int = typer.Option(2, help="torch threads (one per free core; more make torch crawl)"),
):
    """Generate a world and pretrain a small LM on it (the default world and recipe unless --zoo or
    --world say otherwise; world v4's 12,000 steps took 38 minutes for the 4-layer GPT-2 model on
    one core of a 2-core AMD EPYC). Resumable: run the same command again after an interruption."""
    if out is not None:
        check_out(out)
    if zoo is None and out is None:
        typer.echo("pass --out DIR (a new checkpoint) or --zoo NAME (a zoo model, into its shipped folder)", err=True)
        raise typer.Exit(2)
    overrides = {"arch": arch, "n_layers": layers, "d_model": d_model, "n_heads": heads, "n_kv_heads": kv_heads}
    changed = [f"--{k}" for k, v in {**overrides, "steps": steps}.items() if v is not None]
    changed += ["--seed"] * (seed != 0) + ["--subjects"] * (subjects != 1000)
    try:
        entry = zoo_model(zoo) if zoo else None
        if entry is not None and out is None and changed:
            raise ValueError(
                f"--zoo {zoo} without --out trains into the zoo's shipped folder, which holds its recipe only; "
                f"pass --out DIR to train a variant ({', '.join(changed)} given)"
            )
        if zoo == "world" and out is None and not force:
            raise ValueError(
                "--zoo world would overwrite the embedded model (lab/checkpoints/world), whose weights key every "
                "saved result; pass --out DIR, or --force"
            )
        base = (entry or ZOO["world"]).train
        if arch is not None and arch != base.arch:
            base = replace(base, n_kv_heads=None)  # grouped-query heads belong to the llama recipe
        config = replace(base, seed=seed, threads=threads, **{k: v for k, v in overrides.items() if v is not None})
        config = replace(config, steps=steps) if steps is not None else config
        check_config(config)
    except ValueError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from err
    world = world or (entry or ZOO["world"]).world
    check_choice(world, WORLD_SPECS, "--world")
    spec, target = WORLD_SPECS[world](seed=seed, n_subjects=subjects), out or entry.path
    if not force and trained_on(target) == (spec, recipe(asdict(config))):
        typer.echo(f"{target} already holds this world and recipe (pass --force to train it again)")
        return
    path = train_world_model(spec, target, config)
    typer.echo(f"saved {path}")


@world_app.command("report")
def world_report(
    model: Path | None = typer.Option(None, help="checkpoint directory (default: the embedded model)"),
    out: Path | None = typer.Option(None, help="write the table as CSV here"),
):
    """Recall and best-layer readability per relation."""
    m = interp.load_model(str(model) if model else "world", backend=interp.DEFAULT_BACKEND)
    table = knowledge_report(m, load_world(model))
    typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(
        f"\nmean recall {table.recall.mean():.3f} (SD across relations {table.recall.std():.3f}); "
        f"readability from {table.readability.min():.3f} to {table.readability.max():.3f}; "
        f"r(recall, readability kappa) = {table.recall.corr(table.readability_kappa):.3f}"
    )
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_table(table, out)


@world_app.command("curves")
def world_curves(
    out: Path = typer.Option(Path("results/curves"), help="results folder (resumed if it exists)"),
    world: str = typer.Option(DEFAULT_RECIPE, help=f"the world's recipe: {', '.join(WORLD_SPECS)}"),
    sizes: str = typer.Option("4x128,6x256", help="model sizes, LAYERSxD_MODEL, comma-separated"),
    steps: int = typer.Option(12000, help="pretraining steps of each size"),
    every: int = typer.Option(2000, help="steps between measurements"),
    threads: int = typer.Option(2, help="torch threads"),
):
    """Learning curves: recall, readability and the embedding-row baseline per relation against
    pretraining steps, for each model size (what a recipe is chosen by; lab.world.curves)."""
    check_out(out)
    check_choice(world, WORLD_SPECS, "--world")
    configs = {}
    for size in sizes.split(","):
        try:
            layers, width = (int(x) for x in size.lower().split("x"))
        except ValueError:
            raise ValueError(f"--sizes {sizes!r}: give sizes as LAYERSxD_MODEL, e.g. 4x128,6x256") from None
        configs[size] = TrainConfig(n_layers=layers, d_model=width, steps=steps, threads=threads)
        check_config(configs[size])
    table = learning_curves(WORLD_SPECS[world](), configs, out, eval_every=every)
    typer.echo(curve_summary(table).to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"wrote {out / 'curves.csv'}")


@world_app.command("ablate")
def world_ablate(
    out: Path = typer.Option(Path("results/ablation"), help="results folder (resumed if it exists)"),
    steps: int = typer.Option(1500, help="pretraining steps of every world variant (the baseline row too)"),
    only: list[str] | None = typer.Option(None, help="run only these variants (by name; the baseline always runs)"),
):
    """Which ingredient makes knowledge active? Train variants of the recipe, one factor each, and
    measure recall, readability and generalization with a reduced study (about an hour on 2 cores
    at the default steps)."""
    check_out(out)
    df = ablate(out, steps=steps, only=only or None)
    typer.echo(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


@circuits_app.command("induction")
def circuits_induction(
    out: Path = typer.Option(Path("results/induction"), help="results folder"),
    model: str = typer.Option("induction", help="'induction' (shipped) or a trained induction model directory"),
    backend: str = typer.Option(interp.DEFAULT_BACKEND, help="nnsight or transformer_lens"),
    pairs: int = typer.Option(32, help="clean/corrupted pairs"),
    n_random: int = typer.Option(99, help="random circuits for the faithfulness baseline"),
    formats: str = typer.Option("html,png,svg,pdf", help="figure formats, comma-separated"),
):
    """Activation, path and attribution patching on the induction-head model (with per-pair
    intervals and p-values), and the faithfulness of the circuits AtP, EAP and EAP-IG rank."""
    check_out(out)
    import json

    summary = analyze_induction(interp.load_model(model, backend=backend), out, n_pairs=pairs, n_random=n_random)
    write_figures(out, tuple(formats.split(",")))
    typer.echo(json.dumps(summary, indent=1))
    typer.echo(f"tables and figures in {out}")


@circuits_app.command("relation")
def circuits_relation(
    relation: str = typer.Argument(..., help="a world relation name, e.g. 'continent'"),
    out: Path = typer.Option(Path("results/relation_circuit"), help="results folder"),
    method: str = typer.Option("full", help="full or lora"),
    category: str = typer.Option("animals", help="label category for relabelling"),
    backend: str = typer.Option(interp.DEFAULT_BACKEND, help="nnsight or transformer_lens"),
    pairs: int = typer.Option(32, help="clean/corrupted pairs"),
    faithfulness: bool = typer.Option(True, help="also test EAP-IG-inputs' circuits against random ones (CPR/CMD)"),
    n_random: int = typer.Option(99, help="random circuits for the faithfulness baseline"),
    model: str = typer.Option("world", help="a world model: 'world', a zoo name (world-v3, ...) or a world checkpoint"),
):
    """Components carrying a world relation's answer before and after relabelling fine-tuning,
    with per-pair intervals, and the faithfulness of the circuits EAP-IG-inputs ranks."""
    root = world_checkpoint_of(model)
    if root is None:
        raise InputError(f"{model!r} is not a world model: give 'world', a zoo name ({', '.join(ZOO)}) or a checkpoint")
    world = load_world(root)
    check_world_relations([relation], world)
    check_out(out)
    check_backend(backend)
    check_choice(method, ("full", "lora"), "--method")
    m = interp.load_model(model, backend=backend)
    (rel,) = from_world(world, [relation])
    stages = relation_stages(m, rel, n_pairs=pairs, category=category, method=method)
    df = relation_circuit(m, rel, n_pairs=pairs, category=category, method=method, stages=stages)
    df.attrs["model"] = model
    save_table(df, out, "relation_circuit")
    if faithfulness:
        curve, summary = relation_faithfulness(stages[0], n_random=n_random)
        curve.attrs["relation"] = relation
        save_table(curve, out, "faithfulness")
        save_table(summary, out, "faithfulness_summary")
    write_figures(out)
    top = df.sort_values("normalized", ascending=False).groupby("stage").head(5)
    typer.echo(
        top[["stage", "component", "normalized", "ci_low", "ci_high", "p_value"]].to_string(
            index=False, float_format=lambda v: f"{v:.3f}"
        )
    )
    if faithfulness:
        typer.echo(
            summary[["stage", "method", "cpr", "cmd", "random_cpr_mean", "random_cmd_mean", "p_random_cpr"]].to_string(
                index=False, float_format=lambda v: f"{v:.3f}"
            )
        )


@circuits_app.command("findings")
def circuits_findings(
    induction: Path = typer.Option(Path("results/induction"), help="an `interp circuits induction` results folder"),
    relation: Path | None = typer.Option(
        Path("results/relation_circuit"), help="an `interp circuits relation` results folder (skipped if absent)"
    ),
    out: Path = typer.Option(Path("docs/circuit_findings.md"), help="the page to write"),
):
    """Write the circuits findings page (Markdown) from saved induction and relation results."""
    rel = relation if relation is not None and (relation / "relation_circuit.csv").exists() else None
    typer.echo(f"wrote {write_circuit_findings(induction, rel, out)}")


@circuits_app.command("figures")
def circuits_figures(out: Path = typer.Argument(..., help="a circuits results folder")):
    """Redraw every figure of a circuits results folder from its saved tables."""
    for path in write_figures(out):
        typer.echo(f"wrote {path}")


@circuits_app.command("train-induction")
def circuits_train_induction(
    out: Path = typer.Option(..., help="output checkpoint directory"),
    steps: int = typer.Option(1500, help="optimizer steps"),
    seed: int = typer.Option(0, help="seed"),
):
    """Train the two-layer attention-only induction-head model (under a minute on 2 cores)."""
    check_out(out)
    typer.echo(f"saved {train_induction_model(out, InductionConfig(steps=steps, seed=seed))}")


@jacobians_app.command("grok")
def jacobians_grok(
    out: Path = typer.Option(Path("results/grokking"), help="results folder (finished runs are reused)"),
    seeds: int = typer.Option(3, help="seeds per condition"),
    lam: float = typer.Option(1e-3, help="GrokAlign lambda"),
    p: int | None = typer.Option(None, help="modulus (default: the CPU configuration's)"),
    steps: int | None = typer.Option(None, help="maximum steps per run"),
    workers: int = typer.Option(2, help="trainings run at once (processes, one thread each)"),
):
    """Steps to grok modular addition with weight decay alone and with the GrokAlign regularizer."""
    check_out(out)
    from dataclasses import replace

    config = replace(CPU_CONFIG, **{k: v for k, v in {"p": p, "steps": steps}.items() if v is not None})
    table = grokking_experiment(out, config, lam=lam, seeds=tuple(range(seeds)), workers=workers)
    typer.echo(table.to_string(index=False))
    by = table.groupby("condition").grok_step
    typer.echo(
        f"\nmean steps to {config.target:.0%} test accuracy: "
        + ", ".join(f"{c} {v:.0f} (grokked {by.count()[c]}/{by.size()[c]})" for c, v in by.mean().items())
    )
    if by.count().get("grokalign", 0) and by.count().get("weight_decay", 0):
        typer.echo(f"ratio weight decay / GrokAlign: {by.mean()['weight_decay'] / by.mean()['grokalign']:.2f}x")
    logs = load_logs(out)
    first = logs[logs.seed == logs.seed.min()]
    for condition, part in first.groupby("condition"):
        fig = trajectory_plot(
            from_log(part.drop(columns=["condition", "seed"])), title=f"modular addition, {condition}"
        )
        export(fig, out / "figures" / f"dynamics_{condition}", ("html", "png"))


@study_app.command("predictors")
def study_predictors(
    out: Path = typer.Argument(..., help="a finished study's results folder (world model)"),
    layer: int | None = typer.Option(None, help="LRE subject layer (default: n_layers // 2 - 1)"),
    beta: float = typer.Option(1.0, help="LRE beta"),
):
    """LRE faithfulness/causality and Jacobian alignment per relation, correlated with generalization
    (on the world model the study ran on: its ``summary.json`` names it)."""
    summary = out / "summary.json"
    if not summary.exists():
        raise InputError(f"{out} is not a finished study folder: it has no summary.json")
    name = json.loads(summary.read_text())["model"]
    root = world_checkpoint_of(name)
    if root is None:
        raise InputError(f"the study in {out} ran on {name!r}, not a world model: predictors need a world's relations")
    model = interp.load_model(str(root) if name not in ZOO else name, backend=interp.DEFAULT_BACKEND)
    claim = out / "study.json"
    ran_on = json.loads(claim.read_text()).get("fingerprint") if claim.exists() else None
    if ran_on is not None and ran_on != model.fingerprint():
        raise InputError(
            f"the study in {out} ran on other weights than {name!r} has now (fingerprint {ran_on} vs "
            f"{model.fingerprint()}; world v3's model is 'world-v3' since world v4 became 'world'): "
            "rerun the study, or its predictors on the model it ran on"
        )
    table = compare_predictors(out, model, from_world(load_world(root)), layer=layer, beta=beta)
    typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


#: the errors an ordinary mistake raises (a typo, a missing file, a bad value): printed as one
#: paragraph without a traceback when our own code raised them (a check that says what to do).
#: Raised inside another library they may be a bug: one paragraph with the error's type and
#: place, exit code 1. Anything else keeps its traceback.
USER_ERRORS = (ValueError, LookupError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError)
OUR_PACKAGES = ("interp", "probes", "circuits", "jacobians", "lab")


def _raised_by_us(err: BaseException) -> tuple[bool, str]:
    """Whether the frame that raised ``err`` is in one of our packages, and where it is."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return True, ""
    last = frames[-1]
    parts = Path(last.filename).parts
    ours = "site-packages" not in parts and any(p in parts for p in OUR_PACKAGES)
    return ours, f"{last.filename}:{last.lineno}"


def main(argv: list[str] | None = None) -> int:
    """The ``interp`` command: ``app`` with ordinary mistakes printed as one paragraph, exit code 2.
    ``--debug`` (anywhere on the command line) shows the traceback instead."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    command = typer.main.get_command(app)
    try:
        code = command.main(args=args, prog_name="interp", standalone_mode=False)
    except typer.TyperException as err:  # usage errors: the parser's own message and usage line
        if not hasattr(err, "show"):
            raise
        err.show()
        return err.exit_code
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 1
    except USER_ERRORS as err:
        if debug:
            raise
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        ours, where = _raised_by_us(err)
        if ours or isinstance(err, (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError)):
            typer.echo(f"error: {message}\n(run with --debug for the traceback)", err=True)
            return 2
        typer.echo(
            f"error: {type(err).__name__} raised in {where}: {message}\nThis may be a bug: run the command again "
            "with --debug and report the traceback.",
            err=True,
        )
        return 1
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
