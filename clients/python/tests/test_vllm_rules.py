"""The vLLM plugin's rules (weightd_client/vllm_rules.py) without an engine: the version table,
the names the layout gives FusedMoE's parameters, the parameters the engine owns, and which
parameters get private storage because vLLM's post-processing writes into them.

The modules below are stand-ins named like vLLM's classes, with the attributes the rules read
(``quant_method``, its ``block_quant`` and selected kernel ``fp8_linear`` / ``fp8_backend``):
what vLLM 0.26's fp8.py sets on them.
"""

from __future__ import annotations

import unittest

from weightd_client.vllm_rules import ALL, UnknownVersion, engine_owned, layout_name, layout_namer, private_params, rewritten_in_place, rules_for

try:
    import torch
    from torch import nn
except ImportError:  # pragma: no cover
    torch = None


def method(kind: str, **attrs):
    return type(kind, (), attrs)()


class VersionTableTest(unittest.TestCase):
    def test_known_versions_and_their_moe_names(self):
        for version in ("0.26.0", "0.32.0", "0.32.0+cpu", "0.29.1rc2"):
            with self.subTest(version=version):
                rules = rules_for(version)
                self.assertEqual(layout_name("model.layers.0.mlp.experts.routed_experts.w13_weight", rules), "model.layers.0.mlp.experts.w13_weight")
                self.assertEqual(layout_name("model.layers.0.self_attn.qkv_proj.weight", rules), "model.layers.0.self_attn.qkv_proj.weight")

    def test_an_unknown_version_says_which_and_what_to_do(self):
        for version in ("0.25.2", "0.33.0", "1.0.0"):
            with self.subTest(version=version):
                with self.assertRaises(UnknownVersion) as caught:
                    rules_for(version)
                self.assertIn(f"vLLM {version} is not in the plugin's version table", str(caught.exception))
                self.assertIn("0.26 to 0.32", str(caught.exception))
                self.assertIn("add its range to weightd_client/vllm_rules.py", str(caught.exception))
        with self.assertRaises(UnknownVersion):
            rules_for("dev")

    def test_a_trainers_namer_looks_its_version_up_only_when_a_name_is_renamed(self):
        """write_version's ``rename``: a trainer on a vLLM the table lacks that sends checkpoint
        names never renames one, so it must not be refused for the version."""
        self.assertEqual(layout_namer("0.32.0")("model.layers.1.mlp.experts.routed_experts.w2_weight"), "model.layers.1.mlp.experts.w2_weight")
        unknown = layout_namer("0.40.0")
        with self.assertRaises(UnknownVersion):
            unknown("model.layers.1.mlp.experts.routed_experts.w2_weight")

    def test_engine_owned_parameters(self):
        for name in ("model.layers.0.self_attn.attn.k_scale", "model.layers.3.self_attn.attn.v_scale", "x.attn.q_scale", "x.attn.prob_scale"):
            self.assertTrue(engine_owned(name), name)
        for name in ("model.layers.0.self_attn.qkv_proj.weight_scale", "model.layers.0.self_attn.qkv_proj.input_scale", "k_scale_extra"):
            self.assertFalse(engine_owned(name), name)


class RewrittenTest(unittest.TestCase):
    def rewritten(self, m, fnuz=False, env=None):
        return rewritten_in_place(type("Layer", (), {"quant_method": m})(), fnuz, env or {})[0]

    def test_per_quantization_method_and_kernel(self):
        cutlass_block, triton_block = type("CutlassFp8BlockScaledMMKernel", (), {})(), type("TritonFp8BlockScaledMMKernel", (), {})()
        cutlass_tensor = type("CutlassFP8ScaledMMLinearKernel", (), {})()
        deep_gemm = lambda e8m0: type("DeepGemmFp8BlockScaledMMKernel", (), {"use_deep_gemm_e8m0": e8m0})()
        backend = lambda name: type("Fp8MoeBackend", (), {"name": name})()
        cases = [
            (method("UnquantizedLinearMethod"), set()),
            (method("UnquantizedEmbeddingMethod"), set()),
            (method("UnquantizedFusedMoEMethod"), set()),
            # Block FP8: new tensors only, except DeepGEMM's E8M0 requantization (in place).
            (method("Fp8LinearMethod", block_quant=True, fp8_linear=cutlass_block), set()),
            (method("Fp8LinearMethod", block_quant=True, fp8_linear=triton_block), set()),
            (method("Fp8LinearMethod", block_quant=True, fp8_linear=deep_gemm(False)), set()),
            (method("Fp8LinearMethod", block_quant=True, fp8_linear=deep_gemm(True)), ALL),
            # Per-tensor FP8: requantized into the weight.
            (method("Fp8LinearMethod", block_quant=False, fp8_linear=cutlass_tensor), {"weight"}),
            (method("Fp8MoEMethod", block_quant=True, fp8_backend=backend("TRITON")), set()),
            (method("Fp8MoEMethod", block_quant=False, fp8_backend=backend("TRITON")), {"w13_weight"}),
            # Unknown: a kernel, a backend or a method the table has not read, or attributes it cannot read.
            (method("Fp8LinearMethod", block_quant=False, fp8_linear=type("NewKernel", (), {})()), ALL),
            (method("Fp8MoEMethod", block_quant=True, fp8_backend=backend("FLASHINFER_TRTLLM")), ALL),
            (method("AWQMarlinLinearMethod"), ALL),
            (method("Fp8LinearMethod"), ALL),
        ]
        for m, want in cases:
            with self.subTest(method=type(m).__name__, kernel=type(getattr(m, "fp8_linear", None)).__name__, backend=getattr(getattr(m, "fp8_backend", None), "name", None), block=getattr(m, "block_quant", None)):
                self.assertEqual(self.rewritten(m), want)

    def test_fnuz_platforms_rewrite_every_fp8_weight(self):
        m = method("Fp8LinearMethod", block_quant=True, fp8_linear=type("TritonFp8BlockScaledMMKernel", (), {})())
        self.assertEqual(self.rewritten(m), set())
        self.assertIs(self.rewritten(m, fnuz=True), ALL)

    def test_cpu_sgl_kernel_packs_experts_in_place(self):
        self.assertEqual(self.rewritten(method("UnquantizedFusedMoEMethod"), env={"VLLM_CPU_SGL_KERNEL": "1"}), {"w13_weight", "w2_weight"})

    def test_modules_without_a_method(self):
        plain = type("RMSNorm", (), {})()
        self.assertEqual(rewritten_in_place(plain, False, {})[0], set())
        own = type("MLAAttention", (), {"process_weights_after_loading": lambda self: None})()
        self.assertIs(rewritten_in_place(own, False, {})[0], ALL)

    @unittest.skipIf(torch is None, "needs torch")
    def test_private_params_of_a_per_tensor_fp8_model(self):
        def linear(kind: str, block, kernel):
            m = nn.Module()
            m.weight = nn.Parameter(torch.zeros(2, 2), requires_grad=False)
            m.weight_scale = nn.Parameter(torch.zeros(1), requires_grad=False)
            m.quant_method = method(kind, block_quant=block, fp8_linear=type(kernel, (), {})()) if block is not None else method(kind)
            return m

        model = nn.Module()
        model.qkv_proj = linear("Fp8LinearMethod", False, "CutlassFP8ScaledMMLinearKernel")
        model.o_proj = linear("Fp8LinearMethod", True, "CutlassFp8BlockScaledMMKernel")
        model.other = linear("GPTQMarlinLinearMethod", None, None)
        model.norm = nn.Module()
        model.norm.weight = nn.Parameter(torch.zeros(2), requires_grad=False)
        self.assertEqual(
            private_params(model, False, {}),
            {
                "qkv_proj.weight": "Fp8LinearMethod with CutlassFP8ScaledMMLinearKernel",
                "other.weight": "GPTQMarlinLinearMethod (not known to the plugin)",
                "other.weight_scale": "GPTQMarlinLinearMethod (not known to the plugin)",
            },
        )


if __name__ == "__main__":
    unittest.main()


class PublishableTest(unittest.TestCase):
    """Which layers' processing the plugin publishes and maps back (vllm_rules.PUBLISHABLE): by
    method and the kernel selected, never by the method alone; and what adopting restores."""

    def layer(self, kind: str, kernel: str, **attrs):
        from types import SimpleNamespace

        m = method(kind, fp8_linear=type(kernel, (), {})(), act_q_static=False)
        return SimpleNamespace(quant_method=m, logical_widths=[128, 64, 64], **attrs)

    def test_by_method_and_kernel(self):
        from weightd_client.vllm_rules import publishable

        for kernel in ("CutlassFP8ScaledMMLinearKernel", "CPUFp8BlockScaledMMKernel"):
            with self.subTest(kernel=kernel):
                self.assertEqual(publishable(self.layer("Fp8LinearMethod", kernel))[0], f"Fp8LinearMethod with {kernel}")
        # The same method with a kernel the table does not know (Marlin's keeps state on the
        # kernel it would not restore) processes at every start; so does a layer without a method.
        self.assertIsNone(publishable(self.layer("Fp8LinearMethod", "MarlinFP8ScaledMMLinearKernel")))
        self.assertIsNone(publishable(self.layer("Fp8LinearMethod", "CPUFp8PerTensorScaledMMLinearKernel")))
        self.assertIsNone(publishable(type("Layer", (), {})()))

    def test_adopting_restores_what_processing_leaves_outside_the_parameters(self):
        from weightd_client.vllm_rules import publishable

        layer = self.layer("Fp8LinearMethod", "CutlassFP8ScaledMMLinearKernel")
        publishable(layer)[1](layer, layer.quant_method)
        self.assertIsNone(layer.input_scale, "dynamic activation scales: input_scale is None, as processing leaves it")
        self.assertFalse(hasattr(layer.quant_method.fp8_linear, "logical_output_size"), "a CUTLASS kernel that does not pad keeps no width")
        padded = type("CutlassFP8ScaledMMLinearKernel", (), {"padded_weight_loader": staticmethod(lambda p, w: None)})()
        layer.quant_method.fp8_linear = padded
        publishable(layer)[1](layer, layer.quant_method)
        self.assertEqual(padded.logical_output_size, 256, "vLLM 0.32's keeps the logical width, the padding sliced away at run time")
