"""FlashInfer 0.5.3's kernels as a conformance implementation (adapter.py) and its JIT warm-up
(warmup.py); README.md says how to install FlashInfer where no package index is reachable."""
