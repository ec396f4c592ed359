"""Launch side of the suite: vLLM servers from profiles (serve.sh), the sweep, manifests, the tiny model."""
