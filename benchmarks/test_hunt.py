"""The hunt against undirected generation: trainings to the first failure (issue 30).

On ``cases/hunt.toml`` (edge distances in [0.5, 64], where the map sees its variants fail
only on distances clustered near the top), for every variant and seed of the case:

- the directed hunt (``stability.explore.hunt``, strategy ``directed``), from the case's data;
- Hypothesis' plain generation of the same space (strategy ``plain``): a new data set per
  training, drawn by ``strategies.graphs`` over the same bounds and structure.

Each counts its trainings (and seconds) up to and including the first that fails; a search
that finds none within its budget counts its whole budget, marked censored (a lower bound).
Goal: the plain generation takes at least 5 times the trainings of the hunt, over all
(variant, seed) pairs together.
"""

from pathlib import Path

from conftest import MEASURED, NOTES, check_goal

from stability.explore.hunt import hunt
from stability.sweep.cases import load_case

SECTION = "The hunt: trainings to the first failure, directed against plain generation"
CASE = Path(__file__).parent.parent / "cases" / "hunt.toml"
DIRECTED_BUDGET = 10
PLAIN_BUDGET = 60
GOAL = 5.0


def searches(case, variant: str, seed: int) -> dict[str, tuple[int, float, bool]]:
    """strategy -> (trainings to the first failure, seconds, censored)."""
    out = {}
    for strategy, budget in (("plain", PLAIN_BUDGET), ("directed", DIRECTED_BUDGET)):
        found = hunt(case, variant, budget=budget, strategy=strategy, seed=seed)
        first = found.trainings_to_failure()
        seconds = found.seconds_to_failure()
        if first is None:
            out[strategy] = (len(found.trainings), sum(t.seconds for t in found.trainings), True)
        else:
            out[strategy] = (first, seconds, False)
    return out


def test_the_hunt_needs_five_times_fewer_trainings():
    case = load_case(CASE)
    rows, totals = [], {"plain": [0, 0.0, 0], "directed": [0, 0.0, 0]}
    for variant in case.variants:
        for seed in case.seeds:
            result = searches(case, variant, seed)
            rows.append((variant, seed, result))
            for strategy, (count, seconds, censored) in result.items():
                totals[strategy][0] += count
                totals[strategy][1] += seconds
                totals[strategy][2] += int(censored)
    pairs = len(rows)
    detail = [
        "| variant | seed | plain: trainings | plain: s | hunt: trainings | hunt: s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for variant, seed, result in rows:
        cells = []
        for strategy in ("plain", "directed"):
            count, seconds, censored = result[strategy]
            cells += [f"{'>' if censored else ''}{count}", f"{seconds:.1f}"]
        detail.append(f"| {variant} | {seed} | " + " | ".join(cells) + " |")
    NOTES[SECTION] = (
        f"`{CASE.name}`: {', '.join(case.variants)}, seeds {', '.join(map(str, case.seeds))}; "
        f"each search counts its trainings up to and including the first that fails (budgets: "
        f"plain {PLAIN_BUDGET}, hunt {DIRECTED_BUDGET}; '>' marks a search that found none, "
        "counted at its budget). One process, searches one after the other.\n\n" + "\n".join(detail)
    )
    for strategy, way in (("plain", "plain generation (Hypothesis)"), ("directed", "hunt")):
        count, seconds, censored = totals[strategy]
        MEASURED.setdefault(SECTION, []).append(
            {
                "way": way,
                "median trainings per search": sorted(r[2][strategy][0] for r in rows)[pairs // 2],
                "total trainings": count,
                "total s": seconds,
                "searches without a failure": censored,
                "searches": pairs,
            }
        )
    ratio = totals["plain"][0] / totals["directed"][0]
    check_goal(SECTION, "plain trainings / hunt trainings (totals)", ratio, ">=", GOAL)
