"""PyTorch's scaled_dot_product_attention with one backend forced, as a draft_attention implementation
(sdpa.py), the key mask both third-party adapters build (mask.py, NumPy only) and the table
examples/third_party_check.sh prints over their reports (summary.py)."""
