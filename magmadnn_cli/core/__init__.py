"""The tensor core: the array backend (numpy | cupy, the only place that imports cupy), BLAS helpers
and the compute graph with reverse-mode autodiff."""
