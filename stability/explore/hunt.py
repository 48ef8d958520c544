"""The hunt: find data on which a variant fails, in few trainings, by climbing its headroom.

GRIST (FSE 2021) follows the gradient of a failing op's argument back to the program's
inputs. The hunt does the same on the harness's own statistics (``stability.explore.headroom``):

1. train the variant on the current data, an ordinary guarded run of the case's settings;
2. if the run failed, that data is found (with ``soonest``, go on for an earlier failure);
3. else read the limit it came closest to (the smallest margin), and, under the model it
   trained, the gradient of that limit's quantity with respect to each edge's log distance;
4. move the data along it: every distance the limit depends on by ``step`` in log space,
   the gradient's sign giving the way, clipped into the case's bounds; at the exp
   underflow line also drop, at the nodes nearest the line, the incoming edge with the
   largest logit (a node whose every edge is far has the lowest max logit);
5. the limits are climbed in the order their moves are predicted to close in on them (the
   margin under the same model state after the move, one forward pass per move);
6. a move that does not bring the next run closer to a limit (or, once failing, to an
   earlier failure) is undone; the next move of the plan is tried (the next limit's), and
   when none is left, all of them again at half the step.

Every training is counted: the search has no inner trainings, and its moves cost one
forward and backward pass each. ``plain`` draws data sets of the same space with Hypothesis
instead (``HuntSpace.plain``), one training each: the undirected baseline.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from stability.core.errors import StabilityError
from stability.core.results import RunResult
from stability.data.graphs import Graph, batch_graphs
from stability.explore.headroom import (
    FORWARD_LIMITS,
    LIMITS,
    Margin,
    direction,
    history_margins,
    model_margins,
    run_margin,
)
from stability.explore.hunt_space import HuntSpace, graph_statistics
from stability.model.recipe import Recipe
from stability.model.variants import get_variant
from stability.sweep.cases import Case
from stability.sweep.runner import build_variants, run_configs
from stability.train.config import TrainConfig, storage_dtype
from stability.train.forward import forward
from stability.train.threads import pin
from stability.train.trainer import Trainer

STRATEGIES = ("directed", "plain")
#: The first step, as a share of the bounds' log range (a quarter: 0.52 in the seed's [0.5, 4)).
FIRST_STEP = 0.25
#: Share of the nodes with an incoming edge, nearest the underflow line, that lose an edge.
DROP_SHARE = 0.1


@dataclass
class Training:
    """One training of a hunt: the move that made its data, the run, and the data's look."""

    index: int
    move: str
    result: RunResult
    margin: Margin
    statistics: dict[str, float]
    seconds: float

    @property
    def failed(self) -> bool:
        return self.result.hit_nan

    def score(self) -> tuple[float, float, float]:
        """Lower is closer to failing: a failed run by its first failure, else its margin."""
        r = self.result
        if self.failed:
            return (0.0, float(r.first_nan_epoch or 0), float(r.first_nan_step or 0))
        return (1.0, self.margin.margin, 0.0)


@dataclass
class Hunt:
    """A hunt's trainings in order, and the closest to failing (the found data if failed)."""

    case: Case
    variant: str
    strategy: str
    space: HuntSpace
    config: TrainConfig
    trainings: list[Training] = field(default_factory=list)
    best: Training | None = None
    best_graphs: list[Graph] = field(default_factory=list)
    #: Why the search ended: ``failed``, ``budget`` or ``stuck`` (no move changes the data).
    stopped: str = "budget"

    @property
    def found(self) -> bool:
        return self.best is not None and self.best.failed

    def trainings_to_failure(self) -> int | None:
        """How many trainings it took to the first failing one (None: none failed)."""
        for training in self.trainings:
            if training.failed:
                return training.index
        return None

    def seconds_to_failure(self) -> float | None:
        first = self.trainings_to_failure()
        if first is None:
            return None
        return sum(t.seconds for t in self.trainings[:first])


def hunt_config(case: Case, seed: int | None = None) -> TrainConfig:
    """The settings of the case's first run (its first learning rate, batch size, variant
    and seed, as ``run_configs`` orders them), with ``seed`` if given; a hunt's runs stop at
    their first failure."""
    _, first = next(run_configs(case))
    return replace(first, seed=first.seed if seed is None else seed, stop_at_nan=True)


def hunt(
    case: Case,
    variant: str,
    *,
    budget: int = 10,
    num_graphs: int | None = None,
    strategy: str = "directed",
    seed: int | None = None,
    soonest: bool = False,
    on_training: Callable[[Training], None] | None = None,
) -> Hunt:
    """Search ``case``'s data space for data on which ``variant`` fails, in at most
    ``budget`` trainings. ``strategy`` is ``directed`` (the climb) or ``plain`` (Hypothesis'
    generation, the baseline); ``seed`` is the runs' seed and, for ``plain``, the draws'.
    With ``soonest`` the directed hunt spends the whole budget on an earlier failure."""
    if strategy not in STRATEGIES:
        raise StabilityError(f"strategy {strategy!r} must be one of {', '.join(STRATEGIES)}")
    if budget < 1:
        raise StabilityError(f"--budget {budget}: give at least 1 training")
    get_variant(variant)  # an unknown name fails before any training
    space = HuntSpace.of_case(case, num_graphs)
    config = hunt_config(case, seed)
    pin(config.threads)
    state = Hunt(case, variant, strategy, space, config)
    # A variant that cannot be built fails here, in one line, before any training.
    build_variants(replace(case, variants=(variant,)), space.dataset_of(space.start(), "check"))
    if strategy == "plain":
        _plain(state, budget, on_training)
    else:
        _directed(state, budget, soonest, on_training)
    return state


def _plain(state: Hunt, budget: int, on_training: Callable | None) -> None:
    for index in range(budget):
        graphs = state.space.plain(state.config.seed, index)
        training, _ = _train(state, graphs, f"plain draw {index}", step=None)
        _keep(state, training, graphs, on_training)
        if training.failed:
            state.stopped = "failed"
            return


def _directed(state: Hunt, budget: int, soonest: bool, on_training: Callable | None) -> None:
    space = state.space
    step = FIRST_STEP * space.log_range
    graphs, move = space.start(), "the case's data"
    tried: list[tuple[list[Graph], str]] = []
    plan: Plan | None = None
    for _ in range(budget):
        training, new_plan = _train(state, graphs, move, step)
        improved = state.best is None or training.score() < state.best.score()
        _keep(state, training, graphs, on_training)
        if training.failed and (not soonest or training.result.first_nan_step == 1):
            state.stopped = "failed"  # (a failure at the first step cannot come sooner)
            return
        if improved:
            # Keep the step while it pays (a line search); halve it when a move does not.
            plan = new_plan
            tried = plan.moves(step)
        elif not tried:
            step /= 2
            tried = plan.moves(step) if plan is not None else []
        if not tried:
            state.stopped = "stuck"
            return
        graphs, move = tried.pop(0)


def _train(
    state: Hunt, graphs: list[Graph], move: str, step: float | None
) -> tuple[Training, Plan]:
    """Train ``graphs`` as the case would; plan the next moves, each limit's from the model
    state (before training or after it) that came closest to that limit, the limits in the
    order their moves at ``step`` are predicted to close in on them. ``step=None`` (plain
    generation) plans nothing: the margins alone, no gradient and no prediction."""
    index = len(state.trainings) + 1
    dtype = state.config.dtype
    data = state.space.dataset_of(graphs, f"hunt({state.case.name},{index})")
    scale = (data.target_mean, data.target_std)
    trainer = Trainer(get_variant(state.variant), data, state.config)
    tick = time.perf_counter()
    # The same build as the run's own (one seed, one init): the model before its first step.
    initial = trainer.build()
    # Before training only the level counts (no lookahead): no training drives it yet.
    pushes = {
        limit: _way(state, initial, graphs, Margin(limit, margin, 0), scale, step, False)
        for limit, margin in model_margins(initial, graphs, dtype).items()
    }
    result = trainer.run()
    after = history_margins(result)
    last = result.history[-1].epoch if result.history else None
    for limit, margin in model_margins(trainer.recipe, graphs, dtype).items():
        if limit not in after or margin < after[limit].margin:
            after[limit] = Margin(limit, margin, last)
    for limit, margin in after.items():
        if limit not in pushes or margin.margin < pushes[limit].margin or result.hit_nan:
            pushes[limit] = _way(state, trainer.recipe, graphs, margin, scale, step)
    closest = min(pushes, key=lambda name: (pushes[name].margin, LIMITS.index(name)))
    margin = Margin(closest, pushes[closest].margin, pushes[closest].epoch)
    if result.hit_nan:
        margin = run_margin(result)
    seconds = time.perf_counter() - tick
    training = Training(index, move, result, margin, graph_statistics(graphs, state.space), seconds)
    ranked = _ranked(pushes, margin.limit)
    if result.hit_nan:
        # Sooner, it can only fail the way it failed: climb the limit it crossed alone.
        ranked = [(name, push) for name, push in ranked if name == margin.limit] or ranked
    return training, Plan(graphs, state.space, ranked)


def _way(
    state: Hunt,
    recipe: Recipe,
    graphs: list[Graph],
    margin: Margin,
    scale: tuple[float, float],
    step: float | None,
    lookahead: bool = True,
) -> Push:
    """The push towards ``margin``'s limit under ``recipe``'s model as it is now, with its
    predicted margin; ``step=None`` (plain generation) only records the margin."""
    if step is None:
        return Push(margin.margin, margin.epoch, np.zeros(0), np.zeros(0))
    dtype = state.config.dtype
    signs, logits = _push(recipe, graphs, margin.limit, dtype, scale, lookahead)
    push = Push(margin.margin, margin.epoch, signs, logits)
    return _predicted(push, margin.limit, recipe, graphs, state, step)


def _predicted(
    push: Push, limit: str, recipe: Recipe, graphs: list[Graph], state: Hunt, step: float
) -> Push:
    """``push`` with the margin its moves at ``step`` leave under the same model state: one
    forward pass per move, no training. Limits the forward pass does not show (the gradient
    square) keep their own margin as the prediction."""
    if limit not in FORWARD_LIMITS or not np.abs(push.signs).any():
        return push
    moves = Plan(graphs, state.space, [(limit, push)]).moves(step)
    predicted = min(
        (model_margins(recipe, moved, state.config.dtype)[limit] for moved, _ in moves),
        default=push.margin,
    )
    return replace(push, predicted=predicted)


def _push(
    recipe: Recipe, graphs: list[Graph], limit: str, dtype: str, scale, lookahead: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(signed step per edge, each edge's first-layer logit) towards ``limit``."""
    push = direction(recipe, graphs, limit, dtype, scale, lookahead)
    # A signed step (as FGSM takes) on every edge the limit depends on: a step scaled by
    # the gradient would move only the few edges at the extreme, and the next training
    # from scratch sees the data as a whole.
    largest = np.abs(push).max(initial=0.0)
    signs = np.where(np.abs(push) > 1e-3 * largest, np.sign(push), 0.0)
    return signs, _first_logits(recipe, graphs, dtype)


def _ranked(pushes: dict[str, Push], first: str) -> list[tuple[str, Push]]:
    """The limits to climb, nearest by their predicted margin first (``first``, the run's
    own, on a tie); only limits the run came within a finite margin of."""
    order = sorted(pushes, key=lambda name: (pushes[name].expected, name != first))
    return [(name, pushes[name]) for name in order if math.isfinite(pushes[name].margin)]


def _keep(state: Hunt, training: Training, graphs: list[Graph], on_training) -> None:
    state.trainings.append(training)
    if state.best is None or training.score() < state.best.score():
        state.best, state.best_graphs = training, graphs
    if on_training is not None:
        on_training(training)


@dataclass(frozen=True)
class Push:
    """One limit's way: its margin, the epoch of it (0: before training), the signed step
    per edge (``[num_edges_total]``, 0 where the limit does not depend on the edge) and
    each edge's first-layer logit under the same model state."""

    margin: float
    epoch: int | None
    signs: np.ndarray
    logits: np.ndarray
    #: The margin the push's moves are predicted to leave (``_predicted``); None: unknown.
    predicted: float | None = None

    @property
    def expected(self) -> float:
        return self.margin if self.predicted is None else min(self.margin, self.predicted)


@dataclass
class Plan:
    """Where to move the best data so far: per limit, nearest first, the way to push."""

    graphs: list[Graph]
    space: HuntSpace
    pushes: list[tuple[str, Push]]

    def moves(self, step: float) -> list[tuple[list[Graph], str]]:
        """The moves to try, most directed first: for each limit in turn, the step with the
        structural move that limit calls for, then the step alone."""
        out = []
        for limit, push in self.pushes:
            if not np.abs(push.signs).any():
                continue
            label = f"{limit}: log-distance step {step:.3g}"
            moved = self._stepped(push, step)
            if limit == "exp underflow":
                nodes = _nodes_near_underflow(self.graphs, push.logits)
                count = max(1, int(DROP_SHARE * len(nodes)))
                if nodes:
                    dropped = self._dropped(moved, nodes[:count], push.logits)
                    out.append((dropped, f"{label}, drop {count} nearest edges"))
            else:
                connected, count = self._connected(moved, push)
                if count:
                    out.append((connected, f"{label}, connect {count} isolated nodes"))
            out.append((moved, label))
        return out

    def _stepped(self, push: Push, step: float) -> list[Graph]:
        out, start = [], 0
        for g in self.graphs:
            signs = push.signs[start : start + g.num_edges]
            start += g.num_edges
            distances = np.exp(np.log(g.edges.reshape(-1)) + step * signs)
            out.append(self.space.relabel(g, distances))
        return out

    def _dropped(
        self, graphs: list[Graph], nodes: list[tuple[int, int]], logits: np.ndarray
    ) -> list[Graph]:
        """Drop, at ``nodes`` (nearest the underflow line), the incoming edge with the
        largest logit, where the node keeps another: its max logit falls to the next one."""
        offsets = np.cumsum([0] + [g.num_edges for g in graphs])
        drops: dict[int, list[int]] = {}
        for graph_index, node in nodes:
            g = graphs[graph_index]
            incoming = np.flatnonzero(g.receivers == node)
            if incoming.size < 2:
                continue
            own = logits[offsets[graph_index] + incoming]
            drops.setdefault(graph_index, []).append(int(incoming[np.argmax(own)]))
        out = list(graphs)
        for graph_index, edges in drops.items():
            g = graphs[graph_index]
            keep = np.ones(g.num_edges, bool)
            keep[edges] = False
            out[graph_index] = self.space.relabel(g, g.edges.reshape(-1), keep)
        return out

    def _connected(self, graphs: list[Graph], push: Push) -> tuple[list[Graph], int]:
        """Give every node without an incoming edge one, from another node of its graph, at
        the distance bound the step pushes towards: more nodes then carry a message into
        the readout, whose sum is what the seed's head turns into log sigma."""
        bound = self.space.max_distance if push.signs.sum() >= 0 else self.space.min_distance
        out, count = [], 0
        for g in graphs:
            counts = np.bincount(g.receivers, minlength=g.num_nodes)
            lonely = np.flatnonzero(counts == 0)
            if g.num_nodes < 2 or lonely.size == 0:
                out.append(g)
                continue
            senders = np.where(lonely == 0, 1, 0).astype(g.senders.dtype)
            count += lonely.size
            grown = Graph(
                nodes=g.nodes,
                edges=np.concatenate([g.edges.reshape(-1), np.full(lonely.size, bound)]),
                senders=np.concatenate([g.senders, senders]),
                receivers=np.concatenate([g.receivers, lonely.astype(g.receivers.dtype)]),
                target=g.target,
            )
            out.append(self.space.relabel(grown, grown.edges.reshape(-1)))
        return out, count


def _first_logits(recipe: Recipe | None, graphs: list[Graph], dtype: str) -> np.ndarray:
    total = sum(g.num_edges for g in graphs)
    if recipe is None or total == 0:
        return np.zeros(total)
    batch = batch_graphs(graphs, dtype=storage_dtype(dtype))
    out = forward(recipe.model, batch.as_inputs(), training=False)
    if not out["logits"]:
        return np.zeros(total)
    return np.asarray(out["logits"][0], dtype=np.float64).reshape(-1)


def _nodes_near_underflow(graphs: list[Graph], logits: np.ndarray) -> list[tuple[int, int]]:
    """(graph, node) of every node with an incoming edge, lowest max logit first."""
    rows, start = [], 0
    for graph_index, g in enumerate(graphs):
        own = logits[start : start + g.num_edges]
        start += g.num_edges
        for node in np.unique(g.receivers):
            rows.append((float(own[g.receivers == node].max()), graph_index, int(node)))
    rows.sort()
    return [(graph_index, node) for value, graph_index, node in rows if math.isfinite(value)]
