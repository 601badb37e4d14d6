"""Memory beyond the batch: recomputation of activations."""
