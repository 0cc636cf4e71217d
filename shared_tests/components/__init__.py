"""Each component alone (attention, norms, feed-forwards, embeddings, the modern decoder's parts,
the fused kernels) against the NumPy float64 reference, and the properties every attention must
have."""
