"""The training layer: the guarded trainer, its finite checks, the replay and NanSentinel."""
