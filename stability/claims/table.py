"""The seed's claims C1-C11: one table, and the judge that reads rows by it.

Each ``Claim`` of ``CLAIM_TABLE`` is declared once: its id, the seed's words, what the
harness tests, what its rule reads (``Reads``: a case, a variant, the seed's setting or the
setting the case varies), its rule (``claims.rules``), and where the rest of ``claims.md``
reads it, its role (``by_role``) and its words in the summary: no other module writes a
claim's id. ``judge`` computes every verdict from the rows of the claim cases
(``cases/seed.toml``, ``cases/batch_size.toml``, ``cases/learning_rate.toml``); the verdict
comes with the numbers it was computed from. Nothing here knows an expected answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import ascii_lowercase

from stability.claims import rules as rule
from stability.claims.rules import (
    Rule,
    Rules,
)
from stability.claims.stats import (
    REFERENCE,
    ClaimInputs,
    SeedReading,
    SweepReading,
    seed_reading,
    sweep_reading,
)

REPRODUCED, NOT_REPRODUCED, NOT_RUN = "reproduced", "not reproduced", "not run"


@dataclass(frozen=True)
class Reads:
    """What a claim's rule reads: the rows of claim case ``case``, and in them ``variant``
    against ``REFERENCE`` (or the reference alone), at the seed's batch size and learning
    rate; or, where ``varies`` names a setting (``batch_size``, ``learning_rate``), across
    the values the case gives it, each against the first."""

    case: str = "seed"
    variant: str = REFERENCE
    varies: str | None = None

    @property
    def variants(self) -> tuple[str, ...]:
        """The variants without whose rows the claim is *not run*."""
        return tuple(dict.fromkeys((REFERENCE, self.variant)))


@dataclass(frozen=True)
class Claim:
    """One of the seed's claims, declared once: the judge, the reports and the tests read it
    from ``CLAIM_TABLE``."""

    id: str
    #: The seed's words, verbatim (``[...]`` marks a cut; ``"; "`` joins two quotes);
    #: ``tests/test_claims.py`` checks every quoted piece against the seed's text.
    quote: str
    #: What the harness tests: its reading of the claim, kept outside the seed's quotes.
    tested: str
    reads: Reads
    rule: Rule
    #: What the rest of ``claims.md`` reads this claim for (one of ``ROLES``), if anything:
    #: the summary and the float64 section find a claim by its role, never by its id.
    role: str = ""
    #: The claim's own words in the summary of ``claims.md`` (``claims.report.summary``).
    summary: str = ""


#: The roles of the claims the rest of ``claims.md`` reads: where raw_e's first failure is,
#: its mechanism, and the optimizer-side remedies the seed tried in a sweep (in the order
#: the summary names them).
WHERE, MECHANISM, LOWER_RATE, LARGER_BATCH = "where", "mechanism", "lower rate", "larger batch"
ROLES = (WHERE, MECHANISM, LOWER_RATE, LARGER_BATCH)

#: What several claims read: the seed case's raw_e; raw_e across the batch sizes; across
#: the learning rates.
SEED = Reads()
BATCH = Reads("batch_size", varies="batch_size")
RATE = Reads("learning_rate", varies="learning_rate")

#: The claims, in the order of the report.
CLAIM_TABLE: tuple[Claim, ...] = (
    Claim(
        "C1a",
        '"the training loss suddenly jumps to NaN after about 30 epochs with a batch size of 32"',
        "every raw_e run at batch 32 hits a NaN",
        SEED,
        rule.hits_nan,
    ),
    Claim(
        "C1b",
        '"after about 30 epochs"',
        "raw_e's median first-NaN epoch is about the stated 30",
        SEED,
        rule.about_stated_epochs,
    ),
    Claim(
        "C2a",
        '"If the batch size is 128, still the gradients explode after about 200 epochs"; '
        '"Tried larger batch sizes (till 256, although delayed gradient explosion happens at '
        'some point)"',
        "raw_e at each larger batch delays the NaN (per epoch)",
        BATCH,
        rule.delays_across,
    ),
    Claim(
        "C2b",
        '"still the gradients explode"; "although delayed gradient explosion happens at some '
        'point"',
        "raw_e at each larger batch does not avoid the NaN",
        BATCH,
        rule.still_fails_across,
        role=LARGER_BATCH,
        summary="a larger batch",
    ),
    Claim(
        "C3",
        '"If I didn\u2019t concatenate neighbors_mean with e [...] there would be no gradient '
        'explosion."',
        "no_e avoids the NaN",
        Reads(variant="no_e"),
        rule.avoids_nan,
    ),
    Claim(
        "C4",
        '"I can avoid gradient explosion by sending e through a sigmoid function [...] But '
        'this degrades the performance (final MAE)"',
        "sigmoid_e avoids the NaN, with a worse MAE",
        Reads(variant="sigmoid_e"),
        rule.avoids_with_worse_mae,
    ),
    Claim(
        "C5",
        '"Note that Rectified Linear Unit (ReLU) instead of sigmoid didn\u2019t work."',
        "relu_e does not avoid the NaN",
        Reads(variant="relu_e"),
        rule.does_not_avoid,
    ),
    Claim(
        "C6",
        '"Applied gradient clipping \u2013 with Adam(lr, clipnorm=1, clipvalue=5) and also with '
        'tf.clip_by_global_norm(gradients, 1.0)"; "which is why it couldn\u2019t be solved with '
        'gradient clipping"',
        "grad_clip does not avoid the NaN",
        Reads(variant="grad_clip"),
        rule.does_not_avoid,
    ),
    Claim(
        "C7",
        "\"tried limiting 'sigma' with  sigma = tf.clip_by_value(sigma,-4,1.0) but the "
        'gradients still explode"',
        "sigma_clip does not avoid the NaN",
        Reads(variant="sigma_clip"),
        rule.does_not_avoid,
    ),
    Claim(
        "C8a",
        '"Tried with reduced learning rate"',
        "raw_e at each lower learning rate delays the NaN (per epoch)",
        RATE,
        rule.delays_across,
    ),
    Claim(
        "C8b",
        '"I basically tried everything suggested online to avoid gradient explosion."; '
        '"Tried with reduced learning rate"',
        "raw_e at each lower learning rate does not avoid the NaN",
        RATE,
        rule.still_fails_across,
        role=LOWER_RATE,
        summary="a lower learning rate",
    ),
    Claim(
        "C9",
        '"I applied kernel constraints [...] This resolved the problem without degrading the '
        'performance."',
        "weight_constrained avoids the NaN, with no worse MAE",
        Reads(variant="weight_constrained"),
        rule.avoids_without_worse_mae,
    ),
    Claim(
        "C10",
        '"Alternatively, one could use the numerically stable implementation of the softmax '
        'function."',
        "stable_softmax avoids the NaN",
        Reads(variant="stable_softmax"),
        rule.avoids_nan,
    ),
    Claim(
        "C11a",
        '"this is technically not a gradient exploding problem"',
        "where: raw_e's first non-finite value is in the forward softmax",
        SEED,
        rule.in_forward_softmax,
        role=WHERE,
        summary=", in the forward softmax and not in the gradients",
    ),
    Claim(
        "C11b",
        '"softmax calculates an exponential [...] This was producing inf values and '
        'eventually everything becoming nan"',
        "mechanism: it is an exp overflow",
        SEED,
        rule.exp_overflow,
        role=MECHANISM,
    ),
)

#: Views of the table, by id in its order.
BY_ID: dict[str, Claim] = {c.id: c for c in CLAIM_TABLE}
CLAIMS: dict[str, str] = {c.id: c.quote for c in CLAIM_TABLE}  # id -> the seed's words
TESTS: dict[str, str] = {c.id: c.tested for c in CLAIM_TABLE}  # id -> what is tested
#: The claims that read the seed case (at the seed's batch size and learning rate).
SEED_CLAIMS: tuple[str, ...] = tuple(c.id for c in CLAIM_TABLE if c.reads.case == "seed")


def by_role(role: str) -> Claim:
    """The claim of ``CLAIM_TABLE`` with role ``role`` (one of ``ROLES``)."""
    found = [c for c in CLAIM_TABLE if c.role == role]
    if len(found) != 1:
        raise ValueError(f"{len(found)} claims have role {role!r}; one of {ROLES} has one each")
    return found[0]


def family(claim: Claim) -> str:
    """The claim's number without its letter: ``C11`` of ``C11a`` and ``C11b``."""
    return claim.id.rstrip(ascii_lowercase)


#: The claims' ids as a range: the first's number to the last's.
ID_RANGE = f"{family(CLAIM_TABLE[0])}-{family(CLAIM_TABLE[-1])}"


@dataclass(frozen=True)
class Verdict:
    id: str
    claim: str
    verdict: str
    numbers: str
    why: str
    report: str


def judge(inputs: ClaimInputs, rules: Rules | None = None) -> list[Verdict]:
    """One ``Verdict`` per claim, in the order of ``CLAIM_TABLE``."""
    rules = rules or Rules()
    readings: dict[tuple, SeedReading | SweepReading | str] = {}
    return [_judge(claim, inputs, rules, readings) for claim in CLAIM_TABLE]


def _judge(claim: Claim, inputs: ClaimInputs, rules: Rules, readings: dict) -> Verdict:
    reads = claim.reads
    report = f"[{reads.case}]({reads.case}.md)"
    # One reading per case and setting, shared by the claims that read it.
    key = (reads.case, reads.varies, reads.variant if reads.varies else None)
    if key not in readings:
        readings[key] = (
            seed_reading(inputs, reads.case)
            if reads.varies is None
            else sweep_reading(inputs, reads.case, reads.varies, reads.variant)
        )
    reading = readings[key]
    if isinstance(reading, str):
        return Verdict(claim.id, claim.quote, NOT_RUN, "-", reading, report)
    if isinstance(reading, SeedReading):
        for variant in reads.variants:
            if reading.stats.get(variant) is None:
                return Verdict(claim.id, claim.quote, NOT_RUN, "-", f"no {variant} rows", report)
    outcome = claim.rule(reads.variant, reading, rules)
    word = NOT_RUN if outcome.holds is None else (REPRODUCED if outcome.holds else NOT_REPRODUCED)
    return Verdict(claim.id, claim.quote, word, outcome.numbers, outcome.why, report)
