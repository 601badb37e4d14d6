"""MNIST digits: a tf-slim CNN trained with accumulation."""
