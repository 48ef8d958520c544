"""One custom fix: the seed's model with every attention logit squashed into (-20, 20)."""

import tensorflow as tf

from stability import create_recipe, register_logit_transform, register_variant


@register_logit_transform
def tanh_squash(logits):
    # |20 tanh(a / 20)| < 20, so exp stays within (2e-9, 5e8): no overflow, no 0 / 0.
    return 20.0 * tf.tanh(logits / 20.0)


@register_variant
def tanh_logit(ctx):
    """raw e and the naive softmax, with logits squashed to 20 tanh(a / 20)"""
    return create_recipe(ctx, logit_transform="tanh_squash")
