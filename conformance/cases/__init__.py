"""Case generators, one module per Op; each registers its OpSpec on import."""
