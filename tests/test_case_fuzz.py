"""Fuzzing the case loader: any TOML document gives a valid ``Case`` or a ``CaseError``."""

import math

import tomli_w
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stability.core.errors import CaseError
from stability.data import dataset_parameters
from stability.model.variants import list_variants
from stability.sweep.cases import Case, parse_case
from stability.train.config import DTYPES

# Not `plugins`: a plugin is imported, and random text must not import random modules
# (tests/test_user_files.py checks the key).
TOP_KEYS = [f.name for f in Case.__dataclass_fields__.values() if f.name != "plugins"]
DATASET_KEYS = ["name", *dataset_parameters("synthetic")]

# Huge numbers on purpose: TOML integers past 64 bits, floats near overflow, nan and inf.
scalars = st.one_of(
    st.integers(),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12),
    st.sampled_from(["synthetic", "raw_e", "float32", "nearest", *DTYPES]),
    st.dates(),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
keys = st.sampled_from(TOP_KEYS) | st.text(max_size=10)
# Mostly the data set's real parameters, so that their checks are reached.
dataset_tables = st.dictionaries(
    st.sampled_from(DATASET_KEYS) | st.sampled_from(DATASET_KEYS) | st.text(max_size=8),
    scalars | values,
    max_size=5,
)
documents = st.dictionaries(keys, values, max_size=6).flatmap(
    lambda doc: st.one_of(
        st.just(doc),
        dataset_tables.map(lambda table: {**doc, "dataset": table}),
        st.dictionaries(st.sampled_from(["hidden", "num_layers", "x"]), values).map(
            lambda table: {**doc, "model": table}
        ),
    )
)


def assert_valid(case: Case) -> None:
    assert case.name.isidentifier()
    assert case.variants and set(case.variants) <= {v.name for v in list_variants()}
    assert case.seeds and all(isinstance(s, int) and s >= 0 for s in case.seeds)
    assert case.batch_sizes and all(isinstance(b, int) and b > 0 for b in case.batch_sizes)
    assert all(isinstance(x, float) and math.isfinite(x) and x > 0 for x in case.learning_rates)
    assert isinstance(case.epochs, int) and case.epochs > 0
    assert case.dtype in DTYPES
    assert isinstance(case.hidden, int) and case.hidden > 0
    for key, value in case.dataset_params.items():
        default = dataset_parameters(case.dataset)[key]
        assert type(value) is type(default), (key, value)
        if isinstance(value, float):
            assert math.isfinite(value), (key, value)


def check(text: str) -> None:
    try:
        case = parse_case(text, source="fuzz.toml")
    except CaseError as exc:
        message = str(exc)
        assert message.startswith("fuzz.toml: ") and "\n" not in message, message
    else:
        assert_valid(case)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
@example({"dataset": {"box": 10**400}})  # once an OverflowError
def test_generated_documents_give_a_case_or_a_case_error(doc):
    check(tomli_w.dumps(doc))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from('[]{}="\n.,#0123456789abe_ -+:tfrusin'), max_size=60))
def test_arbitrary_text_gives_a_case_or_a_case_error(text):
    check(text)
