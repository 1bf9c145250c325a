"""Network pieces built on the graph: layers, losses, optimizers, initializers, and the
network that assembles them (one registry per kind, keyed by the config's `type` tags)."""
