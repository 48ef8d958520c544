"""The ``generated`` data set: graphs whose edge distances Hypothesis draws, by seed."""

from __future__ import annotations

from collections.abc import Mapping

from stability.core.environment import version
from stability.core.errors import DataError, StabilityError
from stability.data.registry import Dataset, dataset_key, key_call, register_dataset
from stability.data.strategies import generated_dataset


def drawn_by(arguments: Mapping[str, object]) -> dict[str, object]:
    """The key's ``hypothesis``: the version given, or else the installed one, which draws."""
    return {"hypothesis": arguments["hypothesis"] or version("hypothesis")}


@register_dataset(key_facts=drawn_by)
def generated(
    *,
    seed: int = 0,
    num_graphs: int = 200,
    min_nodes: int = 6,
    max_nodes: int = 15,
    min_edges: int = 0,
    max_edges: int = 60,
    self_loops: bool = False,
    duplicate_edges: bool = False,
    num_types: int = 4,
    attend: str = "nearest",
    distribution: str = "any",
    min_distance: float = 0.5,
    max_distance: float = 4.0,
    max_outlier: float = 40.0,
    val_fraction: float = 0.1,
    hypothesis: str = "",
) -> Dataset:
    """Graphs drawn by ``stability.data.strategies.graphs``, reproducibly from ``seed``.

    ``distribution`` is one of ``stability.data.strategies.DISTRIBUTIONS`` or "any". A draw
    depends on Hypothesis' version, so the key names the one that drew it (``hypothesis``;
    empty: the installed one, whose version the key writes), and a key drawn by another
    version is refused rather than redrawn into other graphs under the same name.
    """
    installed = version("hypothesis")
    if hypothesis and hypothesis != installed:
        raise DataError(
            f"data set generated: drawn with hypothesis {hypothesis}, and this machine has "
            f"hypothesis {installed}, whose draw may differ; install hypothesis=={hypothesis} "
            'or draw it anew (hypothesis = "")'
        )
    return generated_dataset(
        seed=seed,
        num_graphs=num_graphs,
        val_fraction=val_fraction,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        min_edges=min_edges,
        max_edges=max_edges,
        self_loops=self_loops,
        duplicate_edges=duplicate_edges,
        num_types=num_types,
        attend=attend,
        distribution=None if distribution == "any" else distribution,
        min_distance=min_distance,
        max_distance=max_distance,
        max_outlier=max_outlier,
    )


def drawn_with(key: str) -> str | None:
    """The Hypothesis version a ``generated`` key names (``hypothesis='6.170.17'``), or None
    for another data set's key or a key without one."""
    try:
        name, params = key_call(key)
    except StabilityError:  # a key not written as a call: not generated's
        return None
    return (str(params.get("hypothesis") or "") or None) if name == "generated" else None


def generated_key(params: Mapping[str, object]) -> str:
    """The key (the CSV ``dataset`` column) of ``generated(**params)``, without drawing it."""
    return dataset_key("generated", params)
