"""Every registered variant builds, trains for 2 epochs and survives a save/load round trip."""

import keras
import numpy as np
import pytest

from stability import BuildContext, NameNotFound, StabilityError, get_variant, list_variants
from stability.data.graphs import batch_graphs
from stability.model.variants import create_recipe, register_variant
from stability.train.config import TrainConfig
from stability.train.trainer import Trainer

BUILT_IN = [
    "raw_e",
    "sigmoid_e",
    "normalized_e",
    "weight_constrained",
    "stable_softmax",
    "no_e",
    "relu_e",
    "grad_clip",
    "sigma_clip",
]


def test_all_built_in_variants_are_registered_with_descriptions():
    names = {v.name for v in list_variants()}
    assert set(BUILT_IN) <= names
    for name in BUILT_IN:
        assert get_variant(name).description, f"{name} has no description"


@pytest.mark.parametrize("name", BUILT_IN)
def test_variant_trains_and_reloads(name, tiny_dataset, tmp_path):
    config = TrainConfig(seed=0, batch_size=16, learning_rate=1e-2, epochs=2, hidden=8)
    trainer = Trainer(get_variant(name), tiny_dataset, config)
    result = trainer.run()
    assert len(result.history) == 2
    assert not result.hit_nan, f"{name} hit a NaN in 2 small epochs: {result}"
    assert np.isfinite(result.final_mae), "final MAE included NaNs"

    model = trainer.recipe.model
    inputs = batch_graphs(tiny_dataset.val).as_inputs()
    path = tmp_path / f"{name}.keras"
    model.save(path)
    reloaded = keras.models.load_model(path)
    np.testing.assert_allclose(reloaded(inputs), model(inputs), rtol=1e-6, atol=1e-6)
    assert reloaded.get_config() == model.get_config()


def test_unknown_variant_suggests_a_name():
    with pytest.raises(NameNotFound, match="Did you mean 'raw_e'"):
        get_variant("raw_ee")


def test_list_variants_filters():
    """The filter keeps the names that contain it, sorted. (Other tests in this process may
    have registered variants of their own, so the built-in names are checked among them.)"""
    names = [v.name for v in list_variants("_e")]
    assert names == sorted(names) and all("_e" in name for name in names)
    built_in = {"raw_e", "sigmoid_e", "normalized_e", "no_e", "relu_e", "stable_softmax"}
    assert built_in & set(names) == {"raw_e", "sigmoid_e", "normalized_e", "no_e", "relu_e"}


def test_register_variant_from_user_code(isolated_registries):
    @register_variant(description="a test-only variant")
    def test_only_tanh_free(ctx: BuildContext):
        return create_recipe(ctx, softmax="stable", edge_mode="sigmoid")

    variant = get_variant("test_only_tanh_free")
    assert variant.description == "a test-only variant"
    recipe = variant.build(
        BuildContext(
            num_features=4, hidden=8, num_layers=1, learning_rate=1e-3, edge_mean=2.0, edge_std=1.0
        )
    )
    assert recipe.model.get_config()["softmax"] == "stable"


def test_a_second_variant_of_the_same_name_is_refused():
    def raw_e(ctx):  # same name as a built-in, different function
        raise AssertionError("never built")

    with pytest.raises(StabilityError, match="already registered"):
        register_variant(raw_e)


def test_a_registered_softmax_and_logit_transform_are_one_decorated_function_each(
    isolated_registries, tiny_dataset
):
    import tensorflow as tf

    from stability import register_logit_transform, register_softmax

    calls = []

    @register_logit_transform
    def squash_to_one(logits):
        return tf.tanh(logits)

    @register_softmax
    def counted(logits, receivers, num_nodes):
        calls.append(int(logits.shape[0]))
        exp = tf.exp(logits)
        return exp / tf.gather(tf.math.unsorted_segment_sum(exp, receivers, num_nodes), receivers)

    ctx = BuildContext(
        num_features=tiny_dataset.num_features,
        hidden=8,
        num_layers=1,
        learning_rate=1e-3,
        edge_mean=0.0,
        edge_std=1.0,
    )
    recipe = create_recipe(ctx, softmax="counted", logit_transform="squash_to_one")
    # A large edge value makes Net's raw logits large; the transform bounds them by 1.
    batch = batch_graphs(tiny_dataset.train[:4])
    inputs = {**batch.as_inputs(), "edges": batch.edges * 1e4}
    out = recipe.model.forward(inputs)
    assert calls == [batch.num_edges]
    assert float(tf.reduce_max(tf.abs(out["logits"][0]))) <= 1.0
    assert recipe.model.get_config()["logit_transform"] == "squash_to_one"
    with pytest.raises(NameNotFound, match="unknown logit transform 'tanh'"):
        create_recipe(ctx, logit_transform="tanh")
    with pytest.raises(StabilityError, match="already registered"):
        register_softmax(name="counted")(lambda logits, receivers, num_nodes: logits)
