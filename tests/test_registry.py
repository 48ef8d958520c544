"""The one registry type behind variants, data sets, softmaxes and logit transforms."""

from __future__ import annotations

import pytest

from stability.core.errors import NameNotFound, StabilityError
from stability.core.registry import Registry
from stability.data import registry as datasets
from stability.model import logit_transforms, softmax, variants


def first(x):
    return x


def second(x):
    return x


def test_register_get_names():
    things: Registry = Registry("thing")
    assert things.register(first) is first
    things.register(name="other")(second)
    assert things.get("first") is first and things.get("other") is second
    assert things.names() == ["first", "other"] and things.names("oth") == ["other"]
    assert "first" in things and "second" not in things


def test_an_unknown_name_suggests_the_closest():
    things: Registry = Registry("thing", {"first": first})
    with pytest.raises(NameNotFound) as caught:
        things.get("frist")
    assert str(caught.value) == "unknown thing 'frist'. Did you mean 'first'? Known: first."


def test_a_taken_name_belongs_to_its_first_function():
    things: Registry = Registry("thing", {"first": first})
    things.register(first)  # the same function again, as a re-imported plugin registers it
    with pytest.raises(StabilityError, match=r"^thing 'first' is already registered by "):
        things.register(second, name="first")
    assert things.get("first") is first


def test_a_copy_is_independent():
    things: Registry = Registry("thing", {"first": first})
    twin = things.copy()
    twin.register(second)
    assert things.names() == ["first"] and twin.names() == ["first", "second"]


@pytest.mark.parametrize(
    ("module", "attribute", "kind"),
    [
        (variants, "_variants", "variant"),
        (datasets, "_datasets", "data set"),
        (softmax, "_softmaxes", "softmax"),
        (logit_transforms, "_transforms", "logit transform"),
    ],
)
def test_every_registry_is_one(module, attribute, kind):
    registry = getattr(module, attribute)
    assert isinstance(registry, Registry) and registry.kind == kind


def test_a_data_set_name_is_refused_to_a_second_function(isolated_registries):
    def synthetic(*, seed: int = 0):
        raise AssertionError("never built")

    with pytest.raises(StabilityError, match="data set 'synthetic' is already registered"):
        datasets.register_dataset(synthetic)
