"""Distributed runs: the master-worker channel, who is a worker, rows on their way to the master, the build gate."""
