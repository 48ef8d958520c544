"""TorchMD-Net's equivariant transformer (ET) weights only the attention of a message by the
cutoff function, not its value pathway: the energy jumps when an atom crosses the cutoff.

Source: torchmd/torchmd-net issue #254, https://github.com/torchmd/torchmd-net/issues/254,
"Discontinuity in the ET potential"; the fix is pull request #260, "Adding vector feature
cutoff to ET" (https://github.com/torchmd/torchmd-net/pull/260).

What the user saw: pulling two atoms apart with a SPICE model, the ET energy steps by about
3.6 kJ/mol at the 10 A cutoff (and at 5 A in their own models), with a step wherever an atom
crosses the cutoff in larger molecules; all values finite. The cause, as the maintainers
found it: the message ``m_ij`` of ``EquivariantMultiHeadAttention`` multiplies the scalar
pathway by ``attn = act(q_i k_j dk_ij) * cutoff(r_ij)``, but the vector pathway ``vec_j *
vec1 + vec2 * d_ij`` takes ``vec1, vec2`` from ``v_j * dv_ij`` with ``dv = dv_proj(rbf)``,
a linear layer with a bias: at the cutoff the radial basis is 0 but ``dv`` is the bias, so
the neighbour's message is not 0 just inside the cutoff and is 0 just outside. What the
maintainers changed (PR #260, merged; it invalidates old checkpoints, so it is an option): a
``vector_cutoff`` flag that multiplies ``v_j`` by the cutoff (``v_j = v_j *
cutoff.unsqueeze(2)``) instead of the attention, so the whole message vanishes at the cutoff.

The model is ET's attention layer with the data's scalar distances: the vector features are
replaced by one scalar channel per hidden unit and the unit vector ``d_ij`` by its norm 1,
which keeps the bug's path (``vec2`` from a biased ``dv`` reaching the energy with no cutoff
weight) intact. The radial basis is ET's ``ExpNormalSmearing`` (cutoff-weighted), the cutoff
``CosineCutoff(0, 4.0)``, the cutoff of the ``synthetic`` data (pairs closer than 4.0 A); the
energy is a sum over atoms.
"""

import math

import keras
import tensorflow as tf

from stability import Recipe, register_variant
from stability.zoo.bug import ZooBug

#: The model's cutoff: the ``synthetic`` data set's (every pair closer than it is an edge).
CUTOFF = 4.0


def cosine_cutoff(r):
    """ET's ``CosineCutoff(0, CUTOFF)``: ``0.5 (cos(pi r / c) + 1)`` inside, 0 outside."""
    inside = tf.cast(r < CUTOFF, r.dtype)
    return 0.5 * (tf.cos(r * math.pi / CUTOFF) + 1.0) * inside


class ExpNormalSmearing(keras.layers.Layer):
    """ET's radial basis ``cutoff(r) exp(-beta (exp(-r) - mu)^2)``: ``[num_edges, num_rbf]``."""

    def __init__(self, num_rbf: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.num_rbf = num_rbf

    def call(self, r):
        start = math.exp(-CUTOFF)
        means = tf.cast(tf.linspace(start, 1.0, self.num_rbf), r.dtype)
        beta = (2.0 / self.num_rbf * (1.0 - start)) ** -2
        return cosine_cutoff(r) * tf.exp(-beta * tf.square(tf.exp(-r) - means))


class EquivariantAttention(keras.layers.Layer):
    """One ET attention layer on node scalars ``x`` and vector stand-ins ``vec``, both
    ``[N, hidden]``; returns their updates ``dx``, ``dvec``."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        self.q, self.k = keras.layers.Dense(hidden), keras.layers.Dense(hidden)
        self.v = keras.layers.Dense(3 * hidden)
        self.dk = keras.layers.Dense(hidden, activation="silu")
        self.dv = keras.layers.Dense(3 * hidden)  # dv_proj: its bias survives at the cutoff
        self.o = keras.layers.Dense(3 * hidden)

    def weigh(self, attn, v_j, cutoff):
        """``attn`` ``[E, hidden]`` and ``v_j`` ``[E, 3 hidden]`` weighted by the cutoff
        ``[E, 1]``: the bug, ET's default, weights only the attention."""
        return attn * cutoff, v_j

    def call(self, x, vec, rbf, r, senders, receivers):
        q_i, k_j = tf.gather(self.q(x), receivers), tf.gather(self.k(x), senders)
        attn = tf.nn.silu(q_i * k_j * self.dk(rbf))  # [E, hidden]
        attn, v_j = self.weigh(attn, tf.gather(self.v(x), senders), cosine_cutoff(r))
        x_j, vec1, vec2 = tf.split(v_j * self.dv(rbf), 3, axis=-1)
        # vec_j * vec1 + vec2 * d_ij, with |d_ij| = 1 standing for the unit vector
        vec_msg = tf.gather(vec, senders) * vec1 + vec2
        n = tf.shape(x)[0]
        x_new = tf.math.unsorted_segment_sum(x_j * attn, receivers, n)
        vec_new = tf.math.unsorted_segment_sum(vec_msg, receivers, n)
        o1, o2, o3 = tf.split(self.o(x_new), 3, axis=-1)
        dx = vec_new * vec_new * o2 + o3  # ET: vec_dot * o2 + o3
        return dx, vec_new * o1 + vec


class EquivariantTransformer(keras.Model):
    """Embed, two ET layers, an energy that is the sum of per-atom outputs."""

    def __init__(self, hidden: int, **kwargs):
        super().__init__(**kwargs)
        self.hidden = hidden
        self.embed = keras.layers.Dense(hidden)
        self.rbf = ExpNormalSmearing()
        self.layers_ = [EquivariantAttention(hidden), EquivariantAttention(hidden)]
        self.norm = keras.layers.LayerNormalization()
        self.out = keras.layers.Dense(2)

    def call(self, inputs):
        r = inputs["edges"]  # [E, 1]
        rbf = self.rbf(r)
        x = self.embed(inputs["nodes"])
        vec = tf.zeros_like(x)
        for layer in self.layers_:
            dx, vec = layer(x, vec, rbf, r, inputs["senders"], inputs["receivers"])
            x = x + dx
        atoms = self.out(self.norm(x))
        return tf.math.unsorted_segment_sum(atoms, inputs["node_graph"], inputs["num_graphs"])


@register_variant
def zoo_s_torchmd_et_cutoff(ctx):
    """TorchMD-Net ET before vector_cutoff: the value pathway is not cutoff-weighted"""
    return Recipe(
        model=EquivariantTransformer(ctx.hidden),
        optimizer=keras.optimizers.Adam(ctx.learning_rate),
    )


BUG = ZooBug(
    name="s_torchmd_et_cutoff",
    source="torchmd/torchmd-net#254",
    url="https://github.com/torchmd/torchmd-net/issues/254",
    summary=(
        "ET multiplies only the attention by the cutoff function; the value pathway's dv_proj "
        "bias keeps a finite message at the cutoff, so the energy jumps when an atom crosses it"
    ),
    fix_class="architecture change",
    variant="zoo_s_torchmd_et_cutoff",
    stage="forward",
    op="cutoff",
    cause="none",
    fix=(
        "PR #260: a vector_cutoff option multiplies the values v_j by the cutoff instead of "
        "the attention, so the whole message vanishes at the cutoff"
    ),
    silent=True,
    invariant="edge_continuity",
)
