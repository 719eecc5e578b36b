"""The ``interp`` command line.

    interp demo                      capture + probe demo on the embedded world model
    interp world train --out DIR     pretrain a world model (the embedded default's recipe)
    interp world report [--model DIR]  recall and readability per relation
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

app = typer.Typer(help="Activation capture, probes and generalization studies.", no_args_is_help=True)
world_app = typer.Typer(help="Synthetic knowledge worlds and the embedded world model.", no_args_is_help=True)
app.add_typer(world_app, name="world")


@app.command()
def demo(
    backend: str = typer.Option("transformer_lens", help="transformer_lens or nnsight"),
    out: Path = typer.Option(Path("results/demo"), help="folder for the result table"),
):
    """Capture the world model's subject states at every layer and probe each relation's answer."""
    import interp
    from interp.world import load_world
    from interp.world.report import readability

    model = interp.load_model("world", backend=backend)
    world = load_world()
    typer.echo(f"{model}\nworld: {len(world.subjects)} subjects, {len(world.spec.relations)} relations")
    table = readability(model, world)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "readability.csv", index=False)
    best = table.loc[table.groupby("relation")["accuracy"].idxmax()].sort_values("accuracy", ascending=False)
    typer.echo("\nbest-layer probe accuracy of each relation's answer at the subject's last token:")
    typer.echo(best.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"\nwrote {out / 'readability.csv'}")


@world_app.command("train")
def world_train(
    out: Path = typer.Option(..., help="output checkpoint directory"),
    steps: int = typer.Option(4800, help="optimizer steps"),
    seed: int = typer.Option(0, help="seed of the world and of training"),
    subjects: int = typer.Option(1000, help="number of subjects"),
):
    """Generate the default world and pretrain the small LM on it (about 12 minutes on 2 cores)."""
    from interp.world import TrainConfig, default_spec, train_world_model

    path = train_world_model(default_spec(seed=seed, n_subjects=subjects), out, TrainConfig(steps=steps, seed=seed))
    typer.echo(f"saved {path}")


@world_app.command("report")
def world_report(
    model: Optional[Path] = typer.Option(None, help="checkpoint directory (default: the embedded model)"),
    out: Optional[Path] = typer.Option(None, help="write the table as CSV here"),
):
    """Recall and best-layer readability per relation."""
    import interp
    from interp.world import load_world
    from interp.world.report import knowledge_report

    m = interp.load_model(str(model) if model else "world", backend="nnsight")
    table = knowledge_report(m, load_world(model))
    typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    typer.echo(f"\nmean recall {table.recall.mean():.3f}; readability from {table.readability.min():.3f} to {table.readability.max():.3f}")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(out, index=False)


if __name__ == "__main__":  # pragma: no cover
    app()
