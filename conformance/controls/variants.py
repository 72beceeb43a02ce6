"""The legitimate variants (CONTRACTS C2 v2, "Calibration"; the conv's forms as amended by v3): each
an Engine with one production choice changed, and the reason citing the C2 list item that makes it
legitimate.

The suite must give every variant no FAIL over every vector. A variant that FAILs is a defect of
the suite (the bound or the case), or a variant that rounds somewhere C2 v2 does not allow: then
the variant is fixed, with the reason, never dropped to make the run green.
"""

from __future__ import annotations

from conformance.controls.engine import Engine

# everything an eager Hugging Face BF16 model does at once (the torch engine's NumPy twin)
HF_EAGER = dict(
    norm_style="hf", bf16_branch_norm=True, bf16_headnorm_out=True, rope_table="bf16_hf", fp32_angles=True,
    attn_scores_bf16=True, softmax_mode="normalize_first", bf16_silu=True, conv_eager_bf16=True,
)

# no BF16 between kernels at all (the FP32 engine; the conv variants below also run on it)
FP32 = dict(gemm_bf16=False, bf16_norm_out=False, bf16_qk=False, bf16_probs=False, bf16_attn_out=False,
            bf16_residual=False, bf16_act=False, bf16_delta=False, bf16_conv_out=False)

VARIANTS = [
    Engine("fp32_everywhere", "FP32 instead of BF16 intermediates anywhere: no BF16 between kernels at all",
           **FP32),
    Engine("fp32_blas_accumulation", "any accumulation order: FP32 GEMMs by the local BLAS (OpenBLAS sgemm "
           "blocking), NumPy's float32 einsum and matmul", accum="blas"),
    Engine("numpy_float32_libm", "exp/tanh from a different libm: NumPy's float32 SIMD exp and tanh",
           exp="libm", tanh="libm"),
    Engine("sequential_accumulation", "any accumulation order: every dot product and reduction left to right",
           accum="sequential"),
    Engine("pairwise_accumulation", "any accumulation order: pairwise (tree) sums", accum="pairwise"),
    Engine("split_k", "any accumulation order: split-K, chunks of 8 reduced by the library, partials in sequence",
           accum="split_k", split=8),
    Engine("tensor_core_tiles", "any accumulation order: tensor-core tiles of 16, exact products, aligned and "
           "truncated accumulation (Fasi et al. 2021)", accum="tc_tiles"),
    Engine("rmsnorm_bf16_before_weight", "extra BF16 rounding at a kernel boundary: RMSNorm output before the "
           "weight multiply (HF: weight * hidden.to(bf16), rsqrt)", norm_style="hf"),
    Engine("headnorm_bf16_before_rope", "extra BF16 rounding at a kernel boundary: head-norm output before RoPE",
           bf16_headnorm_out=True),
    Engine("silu_bf16_before_mul", "extra BF16 rounding at a kernel boundary: SiLU(gate) before the multiply",
           bf16_silu=True),
    Engine("conv_coef_bf16_first", "extra BF16 rounding at a kernel boundary: the conv's (base + delta) before "
           "the product", bf16_conv_coef=True),
    Engine("conv_eager_bf16", "extra BF16 roundings at kernel boundaries: eager model-dtype conv with "
           "(base + delta) formed first, then each tap product and the tap sum in BF16", conv_eager_bf16=True),
    Engine("branch_norm_bf16_before_conv", "extra BF16 rounding at a kernel boundary: the branch norm output "
           "before the conv prepare (DFlash2, unfused norm kernel)", bf16_branch_norm=True),
    Engine("bf16_cos_sin_hf_rotation", "BF16 cos/sin tables: HF style, cos/sin in FP32 cast to BF16, the "
           "rotation in BF16", rope_table="bf16_hf"),
    Engine("fp32_cos_sin", "FP32 cos/sin tables: computed by a float32 libm from the (range-reduced) angle",
           rope_table="fp32_libm"),
    Engine("fp32_angles_below_2p24", "FP32 angles from FP32 positions below 2^24 (HF inv_freq and "
           "pos.float() * inv_freq); exact integer positions at and above 2^24", fp32_angles=True),
    Engine("fast_exp_intrinsics", "exp/tanh from fast-math intrinsics within their documented error: CUDA "
           "__expf (ex2.approx of x*log2e) and a rational FP32 tanh", exp="fast", tanh="rational"),
    Engine("fast_math_ftz", "fast-math intrinsics within their documented error, as --use_fast_math compiles "
           "them: __expf as ex2.approx.ftz (subnormal results flushed to zero) and a rational FP32 tanh",
           exp="fast", ftz=True, tanh="rational"),
    Engine("residual_fp32", "FP32 instead of BF16 intermediates: the residual stream kept FP32 between "
           "kernels and layers", bf16_residual=False),
    Engine("flash_online_softmax", "any accumulation order: flash attention's online softmax over key blocks "
           "of 4 (running max, rescaled accumulators), P in BF16", softmax_mode="online", attn_block=4),
    Engine("softmax_normalized_before_pv", "extra BF16 rounding at a kernel boundary: HF eager softmax, the "
           "normalized probabilities stored BF16 before the PV product", softmax_mode="normalize_first"),
    Engine("attention_scores_bf16", "GEMM outputs stored BF16 between kernels: HF eager QK^T scores in BF16 "
           "before the FP32 softmax", attn_scores_bf16=True),
    Engine("hf_eager_bf16", "everything HF eager BF16 does at once: RMSNorm and head-norm outputs BF16, BF16 "
           "cos/sin and rotation with FP32 angles below 2^24, BF16 scores and normalized probabilities, SiLU "
           "BF16, eager BF16 conv", **HF_EAGER),
    Engine("hf_eager_bf16_fast_math_tiles", "HF eager BF16 on tensor cores with fast-math intrinsics: the "
           "choices above combined with tensor-core accumulation and __expf/rational tanh",
           accum="tc_tiles", exp="fast", tanh="rational", **HF_EAGER),
    # CONTRACTS C2 v3: the conv's products rounded separately and a finish with the FP32 delta are
    # reformulations of (base + delta) x, as z-lab's public drafter computes it
    Engine("conv_separate_products", "C2 v3, the conv's products rounded separately: base*x and delta*x each "
           "rounded BF16, their sum and the tap sum BF16 (z-lab's drafter in the BF16 model dtype)",
           conv_products="separate_bf16"),
    Engine("conv_separate_products_fp32", "C2 v3, the conv's products rounded separately, on the FP32 engine: "
           "base*x and delta*x each FP32, no BF16 between kernels", conv_products="separate_fp32", **FP32),
    Engine("conv_fp32_finish_delta", "C2 v3, the FP32 finish delta: the conv's finish side uses the unrounded "
           "delta (its BF16 copy is still the finish_delta output)", fp32_finish_delta=True),
    Engine("conv_fp32_finish_delta_fp32", "C2 v3 on the FP32 engine, as z-lab's FP32 model computes the conv: "
           "products separately in FP32 and the finish with the unrounded FP32 delta, no BF16 between kernels",
           conv_products="separate_fp32", fp32_finish_delta=True, **FP32),
]

BY_NAME = {v.key: v for v in VARIANTS}
