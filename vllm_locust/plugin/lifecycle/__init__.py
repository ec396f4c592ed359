"""A run's life: the checks before it starts, its labels, how it fails or completes, the client's self-audit."""
