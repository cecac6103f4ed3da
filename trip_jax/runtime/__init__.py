"""Runtime: process-wide JAX settings, processes, meshes, paths, the workdir lock."""
