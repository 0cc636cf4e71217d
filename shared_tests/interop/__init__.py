"""Other formats' weights: the converters (torch, Hugging Face) and the weights files."""
