"""Sessions: a client's ops executed in order, its tensors and kernels, and the resident store."""
