"""vLLM loader plugin: ``--load-format weightd`` maps a weightd daemon's ``vllm`` layout into the
model, and loads from disk, with one log line naming why, whenever it cannot.

Installed with this package, vLLM finds it through the ``vllm.general_plugins`` entry point
(pyproject.toml), in every process that builds a model. Options go in
``--model-loader-extra-config`` (all optional):

- ``socket_dir``: the daemon's ``--weight-cache-socket-dir`` (else env ``WEIGHTD_SOCKET_DIR``,
  else the daemon's default private dir);
- ``mode``: ``map`` (default; parameters are the daemon's memory, zero-copy) or ``copy``
  (parameters are the engine's own storage, filled from the daemon, and no lease is kept);
- ``plan_file``: the daemon's ``--plan-file``, if it runs with one.

The weights are put in place before vLLM's ``process_weights_after_loading``, where vLLM's own
weight loaders would have left them, so kernel-specific repacking (the CPU backend's GEMM
prepack, quantization) runs on them as on a disk load. The parameters that post-processing
writes into in place (per-tensor FP8's requantized weights; anything of a quantization method
the plugin does not know) get private copies instead of views (vllm_rules.py); the rest stay
the daemon's memory, mapped read-only (host backend; cuda with ``--cuda-handles fd`` where the
driver allows it). Parameters vLLM creates that no checkpoint holds (attention ``k_scale``,
``v_scale``, ``q_scale``, ``prob_scale``) keep vLLM's defaults. A vLLM version the plugin's
table does not know loads from disk.

Layers whose processing the plugin knows by method and selected kernel (vllm_processed.py) are
processed once: the first engine publishes what their processing computed to the daemon, and
the next start with the same key (docs/spec/processed-key.md) maps it and skips that processing.

A model loaded in map mode keeps what a switch to another version needs (``Mapped``): vLLM's
weight-transfer backend ``weightd`` (vllm_transfer.py, registered here) follows a new version in
place through it (vllm_follow.py).
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.logger import init_logger
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from .client import WeightdClient, find_socket
from .fingerprint import expected_fingerprint
from .processed import Processed, lookup
from .protocol import WeightdError
from .vllm_processed import Plan, adopt, misfits, plan_for, publish_plan
from .vllm_rules import UnknownVersion, VersionRules, engine_owned, layout_name, private_params, rules_for

LOAD_FORMAT = "weightd"
MODES = ("map", "copy")
OPTIONS = ("socket_dir", "mode", "plan_file")

# Under vLLM's logger tree, so the lines come out with vLLM's own.
logger = init_logger("vllm.weightd")


def register() -> None:
    """The ``vllm.general_plugins`` entry point: makes ``load_format="weightd"`` known, and the
    weight-transfer backend ``weightd`` (vllm_transfer.py; its trainer side, vllm_trainer.py),
    where this vLLM has that interface."""
    register_model_loader(LOAD_FORMAT)(WeightdModelLoader)
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError:  # a vLLM before weight transfer: collective_rpc(vllm_follow.switch_worker) still works
        return
    try:
        WeightTransferEngineFactory.register_engine(LOAD_FORMAT, "weightd_client.vllm_transfer", "WeightdWeightTransferEngine")
    except ValueError:  # vLLM may run the entry points more than once in a process
        pass
    _register_trainer()


def _register_trainer() -> None:
    """The trainer-side engine (vllm_trainer.py), where the trainer factory picks engines by the
    init info's ``backend`` (0.32). 0.26's takes a backend name and a config instead, and its
    trainer side is the worker engine's static ``trainer_send_weights``."""
    import inspect

    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    except ImportError:
        return
    if "backend" in inspect.signature(WeightTransferTrainerFactory.trainer_init).parameters:
        return
    try:
        WeightTransferTrainerFactory.register_engine(LOAD_FORMAT, "weightd_client.vllm_trainer", "WeightdTrainerWeightTransferEngine")
    except ValueError:  # registered by an earlier run of the entry points
        pass


class Fallback(Exception):
    """Why the cache cannot be used; the loader logs it and loads from disk."""


def _ranks() -> Tuple[int, int]:
    from vllm.distributed import get_pp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    if get_pp_group().world_size > 1:
        raise Fallback(f"pipeline parallelism ({get_pp_group().world_size} stages) is not served by weightd; it shards by tensor-parallel rank only")
    return get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()


def _model_dir(model_config: ModelConfig) -> str:
    if os.path.isdir(model_config.model):
        return model_config.model
    try:  # a hub id: the snapshot already on this node, which is what a daemon can serve
        from huggingface_hub import snapshot_download

        return snapshot_download(model_config.model, revision=model_config.revision, local_files_only=True)
    except Exception as err:
        raise Fallback(f"model {model_config.model!r} is not a local checkpoint directory ({err})") from err


def check_views(params: Dict[str, nn.Parameter], views: Dict[str, Any], rules: VersionRules) -> Tuple[List[str], List[str]]:
    """Every difference between the model's parameters and the served views, by name; and the
    parameters left to vLLM (ENGINE_OWNED ones the daemon does not serve: they keep vLLM's defaults)."""
    problems = []
    wanted = {layout_name(n, rules): n for n in params}
    own = sorted(wanted[n] for n in wanted if n not in views and engine_owned(n))
    missing = sorted(n for n in wanted if n not in views and not engine_owned(n))
    extra = sorted(n for n in views if n not in wanted)
    if missing:
        problems.append(f"parameters the daemon does not serve: {', '.join(missing)}")
    if extra:
        problems.append(f"tensors the model has no parameter for: {', '.join(extra)}")
    for name in sorted(set(wanted) & set(views)):
        p, v = params[wanted[name]], views[name]
        if tuple(p.shape) != tuple(v.shape) or p.dtype != v.dtype:
            problems.append(f"{wanted[name]}: model {list(p.shape)} {p.dtype}, daemon {list(v.shape)} {v.dtype}")
        elif p.device != v.device:
            problems.append(f"{wanted[name]}: model on {p.device}, daemon's memory on {v.device}")
    return problems, own


def _version_rules() -> VersionRules:
    import vllm

    try:
        return rules_for(vllm.__version__)
    except UnknownVersion as err:
        raise Fallback(str(err)) from err


def _fnuz() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_fp8_fnuz())


def _end_lease(socket_path: str, lease: List[str]) -> None:
    """Drops a lease once its model is gone, so a release of the rank is not refused for it.
    ``lease`` holds the id of the version mapped now (a switch changes it)."""
    try:
        client = WeightdClient(socket_path, timeout=5.0)
        try:
            client.detach(lease[0])
        finally:
            client.close()
    except Exception as err:  # a stopped daemon has no lease left to drop
        logger.debug("weightd: could not drop lease %s at %s: %s", lease[0], socket_path, err)


@dataclasses.dataclass
class Mapped:
    """What a model loaded in map mode keeps (``model._weightd``): the mapping, the rank's socket,
    the lease of the version mapped now, each served parameter with its view and whether it got
    a private copy, every (module, attribute) that held a served parameter when loaded, and the
    processed layout mapped in place of some layers' processing, if any, with the parameters made
    of it (read-only, like the views)."""

    mapping: Any
    socket_path: str
    lease: List[str]
    params: List[Tuple[nn.Parameter, torch.Tensor, bool]]
    holders: List[Tuple[nn.Module, str, nn.Parameter]]
    processed: Optional[Processed] = None
    published: List[nn.Parameter] = dataclasses.field(default_factory=list)
    #: The next switch prepared while the engine computes (switch_ahead.py), once the
    #: weight-transfer backend started it.
    ahead: Optional[Any] = None


class WeightdModelLoader(BaseModelLoader):
    """Maps the daemon's ``vllm`` layout; vLLM's default loader is the fallback."""

    def __init__(self, load_config: LoadConfig):
        super().__init__(load_config)
        extra = dict(load_config.model_loader_extra_config or {})
        unknown = sorted(set(extra) - set(OPTIONS))
        if unknown:
            raise ValueError(f"model_loader_extra_config for load format {LOAD_FORMAT!r} has unknown keys {unknown}; the options are {list(OPTIONS)}")
        self.socket_dir: Optional[str] = extra.get("socket_dir") or os.environ.get("WEIGHTD_SOCKET_DIR") or None
        self.mode: str = extra.get("mode", "map")
        if self.mode not in MODES:
            raise ValueError(f"model_loader_extra_config mode {self.mode!r} is not one of {list(MODES)}")
        self.plan_file: Optional[str] = extra.get("plan_file")
        # DefaultModelLoader picks its file patterns by load format and refuses our options.
        self.disk = DefaultModelLoader(dataclasses.replace(load_config, load_format="auto", model_loader_extra_config={}))
        #: What the last load_weights did: "weightd" or "disk", and why (for logs and tests).
        self.source: Optional[str] = None
        self.reason: Optional[str] = None

    def download_model(self, model_config: ModelConfig) -> None:
        self.disk.download_model(model_config)

    def get_external_weight_memory(self, vllm_config: VllmConfig) -> int:
        """Bytes the daemon holds on this device for this rank, which vLLM subtracts from its
        memory budget (it asks before loading). 0 when the weights will be loaded from disk or
        copied in, and on the host backend, whose shared memory is not device memory."""
        if self.mode != "map":
            return 0
        try:
            state, client = self._state(vllm_config.model_config, "copy")
        except Fallback:
            return 0
        try:
            if state["backend"] != "cuda":
                return 0
            return sum(int(s["bytes"]) for s in state["segments"])
        finally:
            client.detach(state["leaseId"])
            client.close()

    def _state(self, model_config: ModelConfig, mode: str) -> Tuple[Dict[str, Any], WeightdClient]:
        """The daemon's matching state for this rank, with a lease, or Fallback."""
        tp_size, tp_rank = _ranks()
        model_dir = _model_dir(model_config)
        try:
            expected = expected_fingerprint(model_dir, tp_size, tp_rank, plan_file=self.plan_file)
        except ValueError as err:  # FingerprintError included
            raise Fallback(f"cannot fingerprint {model_dir}: {err}") from err
        try:
            path = find_socket(global_rank=tp_rank, socket_dir=self.socket_dir)
            client = WeightdClient(path)
        except Exception as err:
            raise Fallback(f"no daemon: {err}") from err
        try:
            reply = client.get_state(expected.fingerprint, mode, expected.fields, layout="vllm")
        except Exception as err:
            client.close()
            raise Fallback(f"daemon at {path} refused rank {tp_rank}: {err}") from err
        if reply.get("status") == "mismatch":
            client.close()
            raise Fallback(f"daemon at {path} holds other weights: fingerprint fields differ: {', '.join(reply['fields'])}")
        return reply, client

    def _attach(self, model: nn.Module, model_config: ModelConfig) -> str:
        rules = _version_rules()
        state, client = self._state(model_config, self.mode)
        try:
            device = torch.accelerator.current_device_index() if state["backend"] == "cuda" else None
            mapping = client._open(state, device, "torch")
        except Exception as err:
            client.detach(state["leaseId"])
            client.close()
            raise Fallback(f"cannot map the daemon's memory: {err}") from err
        views = mapping.tensors
        params = dict(model.named_parameters())  # a tied weight is listed once, as in the layout
        problems, own = check_views(params, views, rules)
        if problems:
            del views  # the last reference to them: the handles close now (see CudaMapping)
            mapping.close()
            client.detach(state["leaseId"])
            client.close()
            raise Fallback("layout mismatch: " + "; ".join(problems))
        # What vLLM's post-processing writes into in place gets storage of the engine's own: a
        # shared write would change every other engine's weights, and the next restart would
        # process already-processed bytes.
        private = private_params(model, _fnuz(), dict(os.environ)) if self.mode == "map" else {}
        plan = plan_for(model, state["fingerprint"], *reversed(_ranks())) if self.mode == "map" else None
        found, processed = self._find_processed(plan, client, state) if plan is not None else (None, "")
        # A layer whose processed parameters are mapped needs none of its loaded ones: a switch to
        # another version gives them a private copy and processes them again (vllm_follow.py).
        adopted = set(plan.params) if found is not None else set()
        private.update({n: "processing (published)" for n in adopted})
        served = {n: p for n, p in params.items() if n not in own}
        with torch.no_grad():
            for name, p in served.items():
                view = views[layout_name(name, rules)]
                if name in adopted:
                    p.data = torch.empty(0, dtype=p.dtype, device=p.device)
                elif self.mode == "map" and name not in private:
                    p.data = view
                elif self.mode == "map":
                    p.data = view.clone()
                else:
                    p.data.copy_(view)
        nbytes = sum(int(t["bytes"]) for t in state["tensors"])
        copied = sorted(n for n in served if n in private and n not in adopted)
        if self.mode == "map":
            # The parameters are the daemon's memory: the mapping lives with the model, and so
            # does the lease (it follows this process, so no connection needs to stay open).
            lease = [state["leaseId"]]  # the version mapped now: vllm_follow.py moves it
            served_params = {id(p): (p, views[layout_name(n, rules)], n in private) for n, p in served.items()}
            # Who holds each served parameter (a tied one: every module), before post-processing
            # replaces any: what a switch to another version restores and processes again.
            holders = [(m, attr, p) for m in model.modules() for attr, p in m._parameters.items() if p is not None and id(p) in served_params]
            model._weightd = Mapped(mapping, client.socket_path, lease, list(served_params.values()), holders)
            ending = weakref.finalize(model, _end_lease, client.socket_path, lease)
            ending.atexit = False  # the daemon ends a gone process's leases itself
        if state["backend"] == "cuda" and (self.mode == "copy" or copied):
            torch.accelerator.synchronize()  # the copies must finish before anything is unmapped
        if self.mode == "copy":
            views = view = None  # the last references to them: the handles close now
            mapping.close()
            client.detach(state["leaseId"])
        if found is not None:
            processed = f"; mapped {adopt(plan, found)} processed parameters of {len(plan.layers)} layers ({plan.processing}; {found.bytes} bytes, key {plan.key}): their processing skipped"
            # The mapping lives with the model (or until a switch processes those layers again).
            model._weightd.processed = found
            model._weightd.published = [p for m, _, _ in plan.layers.values() for p in m._parameters.values() if p is not None]
            weakref.finalize(model, _end_lease, client.socket_path, [found.lease]).atexit = False
        elif plan is not None:
            model._weightd_publish = (plan, client.socket_path)
        client.close()
        ro = "read-only" if getattr(mapping, "read_only", False) else "read-write"
        why = sorted({private[n] for n in copied})
        return (
            f"{'mapped' if self.mode == 'map' else 'copied'} {len(served) - len(copied) - len(adopted)} parameters"
            + (f" ({ro})" if self.mode == "map" else "")
            + (f", copied {len(copied)} that {', '.join(why)} rewrites after loading" if copied else "")
            + (f", left {len(own)} to vLLM ({', '.join(sorted({n.rsplit('.', 1)[-1] for n in own}))})" if own else "")
            + f" ({nbytes} bytes, layout vllm, vLLM {rules.label} rules, {state['backend']} backend) from {client.socket_path}, lease {state['leaseId']}"
            + processed
        )

    def _find_processed(self, plan: Plan, client: WeightdClient, state: Dict[str, Any]) -> Tuple[Optional[Processed], str]:
        """The processed layout of ``plan``'s key, mapped, when the daemon has one that fits (its
        layers then skip their processing); else None, and they process and are published once
        processed (load_model). With what the log line says of it."""
        try:
            device = torch.accelerator.current_device_index() if state["backend"] == "cuda" else None
            found = lookup(client.socket_path, state["fingerprint"], plan.key, device=device)
        except (WeightdError, OSError) as err:
            return None, f"; {len(plan.layers)} layers ({plan.processing}) process as usual: no processed layout ({err})"
        if not isinstance(found, Processed):
            return None, f"; {len(plan.layers)} layers ({plan.processing}) process, then publish: {found.why(plan.fields)}"
        problems = misfits(plan, found)
        if problems:
            del found.tensors
            found.mapping.close()
            _end_lease(client.socket_path, [found.lease])
            return None, f"; {len(plan.layers)} layers ({plan.processing}) process: the processed layout of key {plan.key} does not fit: {'; '.join(problems)}"
        return found, ""

    def load_model(self, vllm_config: VllmConfig, model_config: ModelConfig, *args: Any, **kwargs: Any) -> nn.Module:
        """vLLM's load, then the publish of what the processing computed, when it is to be published."""
        model = super().load_model(vllm_config, model_config, *args, **kwargs)
        pending = model.__dict__.pop("_weightd_publish", None)
        if pending is not None:
            plan, socket_path = pending
            try:
                client = WeightdClient(socket_path)
                try:
                    name = next(m["name"] for m in client.ping()["models"] if m["fingerprint"] == plan.fields["base"])
                finally:
                    client.close()
                logger.info("weightd: %s", publish_plan(plan, socket_path, name))
            except (WeightdError, OSError, ValueError, StopIteration) as err:
                logger.info("weightd: processed parameters not published (the next start processes them again): %s %s", getattr(err, "code", type(err).__name__), err)
        return model

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        try:
            done = self._attach(model, model_config)
        except Fallback as why:
            self.source, self.reason = "disk", str(why)
            logger.warning("weightd: loading from disk: %s", why)
            self.disk.load_weights(model, model_config)
            return
        self.source, self.reason = "weightd", done
        logger.info("weightd: %s", done)
