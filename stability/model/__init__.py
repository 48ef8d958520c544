"""The model layer: segment softmaxes, the seed's layers and network, losses and variants."""

# The doctor's model remedies resolve the variant names ``base+remedy`` wherever variants
# are looked up (``stability.model.variants.get_variant``), a worker process included.
from stability.model import remedies  # noqa: F401  (registration)
