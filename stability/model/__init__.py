"""The model layer: segment softmaxes, the seed's layers and network, losses and variants."""
