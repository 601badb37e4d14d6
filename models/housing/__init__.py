"""Housing-price regression: a linear model trained with accumulation."""
