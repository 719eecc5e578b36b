"""An on-disk activation store: safetensors shards plus a manifest.

Layout of a store directory::

    manifest.json            key (model fingerprint, data hash, sites, dtype), row count,
                             shard size, and the shards finished so far
    shard_00000.safetensors  rows [0, shard_size) of every site
    shard_00001.safetensors  ...

Each shard is written to a temporary file and renamed into place, then the manifest is
rewritten the same way, so a store killed at any moment holds only whole shards, and reopening
it (same key) continues with the first missing one. Shards are read back memory-mapped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .results import atomic_path, write_json

MANIFEST = "manifest.json"


class StoreMismatchError(ValueError):
    pass


class ActivationStore:
    """A directory of activation shards. Open an existing one with ``ActivationStore(path)``."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.manifest: dict | None = None
        if (self.root / MANIFEST).exists():
            self.manifest = json.loads((self.root / MANIFEST).read_text())

    # writing -----------------------------------------------------------------------------------
    def prepare(self, key: dict, n_rows: int, shard_size: int) -> None:
        """Create the store, or check that the existing one was made for the same ``key``."""
        if shard_size < 1:
            raise ValueError(f"shard_size must be at least 1, got {shard_size}")
        if self.manifest is not None:
            old = {k: self.manifest[k] for k in ("key", "n_rows", "shard_size")}
            new = {"key": key, "n_rows": n_rows, "shard_size": shard_size}
            if old != new:
                diff = [k for k in ("model", "data", "sites", "dtype") if old["key"].get(k) != key.get(k)]
                diff += [k for k in ("n_rows", "shard_size") if old[k] != new[k]]
                raise StoreMismatchError(
                    f"the store at {self.root} was made for a different capture (differs in: "
                    f"{', '.join(diff)}); use a new directory, or delete this one to start over"
                )
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self.manifest = {"format": 1, "key": key, "n_rows": n_rows, "shard_size": shard_size, "shards": {}}
        self._save_manifest()

    def write_shard(self, index: int, tensors: dict[str, torch.Tensor]) -> None:
        path = self.root / f"shard_{index:05d}.safetensors"
        with atomic_path(path) as tmp:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
        self.manifest["shards"][str(index)] = {"file": path.name, "rows": self.shard_rows(index)}
        self._save_manifest()

    def _save_manifest(self) -> None:
        write_json(self.manifest, self.root / MANIFEST, sort_keys=True)

    # layout ------------------------------------------------------------------------------------
    def _require(self) -> dict:
        if self.manifest is None:
            raise FileNotFoundError(f"no activation store at {self.root} (no {MANIFEST})")
        return self.manifest

    @property
    def n_rows(self) -> int:
        return self._require()["n_rows"]

    @property
    def n_shards(self) -> int:
        m = self._require()
        return -(-m["n_rows"] // m["shard_size"])

    @property
    def sites(self) -> list[str]:
        return list(self._require()["key"]["sites"])

    @property
    def key(self) -> dict:
        return dict(self._require()["key"])

    def shard_range(self, index: int) -> tuple[int, int]:
        size = self._require()["shard_size"]
        return index * size, min((index + 1) * size, self.n_rows)

    def shard_rows(self, index: int) -> int:
        start, stop = self.shard_range(index)
        return stop - start

    def missing_shards(self) -> list[int]:
        done = self._require()["shards"]
        return [i for i in range(self.n_shards) if str(i) not in done]

    @property
    def complete(self) -> bool:
        return self.manifest is not None and not self.missing_shards()

    # reading -----------------------------------------------------------------------------------
    def shard(self, index: int, sites: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
        """One shard's tensors, memory-mapped from disk."""
        entry = self._require()["shards"].get(str(index))
        if entry is None:
            raise KeyError(f"shard {index} of {self.root} is not written yet; finish the capture first")
        with safe_open(self.root / entry["file"], framework="pt") as f:
            names = list(f.keys()) if sites is None else list(sites)
            return {name: f.get_tensor(name) for name in names}

    def iter_shards(self, sites: Sequence[str] | None = None) -> Iterator[dict[str, torch.Tensor]]:
        for i in range(self.n_shards):
            yield self.shard(i, sites)

    def keys(self) -> list[str]:
        """The sites this store holds (so a store can stand where a ``{site: tensor}`` mapping is expected)."""
        return self.sites

    def __contains__(self, site: object) -> bool:
        return site in self.sites

    def __getitem__(self, site: str) -> torch.Tensor:
        """All rows of one site, concatenated in prompt order."""
        if site not in self.sites and site != "__mask__":
            raise KeyError(f"site {site!r} is not in this store; it holds {', '.join(self.sites)}")
        if not self.complete:
            raise RuntimeError(
                f"the store at {self.root} is incomplete (missing shards {self.missing_shards()}); "
                "rerun the capture to finish it"
            )
        return torch.cat([s[site] for s in self.iter_shards([site])])

    def __repr__(self) -> str:
        if self.manifest is None:
            return f"ActivationStore({str(self.root)!r}, empty)"
        return (
            f"ActivationStore({str(self.root)!r}, rows={self.n_rows}, shards={self.n_shards}, "
            f"sites={len(self.sites)}, complete={self.complete})"
        )


def synthetic_store(root: str | Path, n: int = 12000, d: int = 256, n_sites: int = 24, seed: int = 0) -> Path:
    """A planted activation store for benchmarks and tests (as scikit-learn's ``make_classification``):
    ``n`` rows of ``n_sites`` sites (``blocks.{i}.hook_resid_post``), ``d`` wide, in shards of 2,000;
    each row is its answer's mean (4 answers) scaled by ``0.05 (i + 1)`` at site ``i`` plus unit
    Gaussian noise, so readability rises with the layer. ``labels.json`` beside it holds the subjects
    and answers. Returns ``root``."""
    root = Path(root)
    gen = torch.Generator().manual_seed(seed)
    answers = torch.randint(0, 4, (n,), generator=gen)
    means = torch.randn(4, d, generator=gen)
    store = ActivationStore(root)
    sites = [f"blocks.{i}.hook_resid_post" for i in range(n_sites)]
    shard = 2000
    store.prepare({"model": "synthetic", "data": "synthetic", "sites": sites, "dtype": "float32"}, n, shard)
    for k in range(-(-n // shard)):
        rows = slice(k * shard, min(n, (k + 1) * shard))
        store.write_shard(
            k,
            {
                s: (means[answers[rows]] * (0.05 * (i + 1)) + torch.randn(rows.stop - rows.start, d, generator=gen))
                for i, s in enumerate(sites)
            },
        )
    write_json(
        {"subjects": [f"s{i}" for i in range(n)], "answers": [f"a{int(a)}" for a in answers]}, root / "labels.json"
    )
    return root
