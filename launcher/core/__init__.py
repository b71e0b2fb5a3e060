"""Training core: model, parallelisation, data, checkpoints and the torchrun entry point."""
