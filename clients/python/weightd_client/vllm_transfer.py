"""vLLM's weight-transfer backend ``weightd`` (``weight_transfer_config={"backend": "weightd"}``,
registered by the plugin's entry point): the weight-update calls RL frameworks already make
(``init_weight_transfer_engine``, ``start_weight_update``, ``update_weights``,
``finish_weight_update``) switch each rank's mapped weights to another version the daemon serves,
in place (vllm_follow.py). ``update_info``: ``{"model": NAME}`` (each rank asks its socket which
version of NAME serves now; ``"version": N`` picks version N of it) or ``{"fingerprint": HEX}``, or
a list of those by global rank.

The trainer writes the new version through the daemon (write_version.py): vLLM 0.26's static
``trainer_send_weights(iterator, trainer_args)`` here, 0.32's trainer engine in vllm_trainer.py.

KV and prefix caches computed with the old weights are the caller's to drop, as with every vLLM
weight-transfer backend (workers cannot reach the scheduler's caches):
``pause_generation(clear_cache=True)`` before and ``resume_generation()`` after (AsyncLLM, the
HTTP RL routes), or ``LLM.reset_prefix_cache()`` after ``finish_weight_update`` offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator

import vllm
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo

from .vllm_follow import Target, mapped_model, prepare_ahead, stop_ahead, switch
from .vllm_plugin import logger
from .vllm_rules import layout_namer
from .write_version import WriteTarget, write_version


@dataclass
class WeightdInitInfo(WeightTransferInitInfo):
    """Nothing to set up: the daemon is the transport, and the plugin found it when loading."""


class WeightdWeightTransferEngine(WeightTransferEngine[WeightdInitInfo, Target]):
    """``weight_transfer_config={"backend": "weightd"}``: init starts preparing each version the
    daemon makes ready (``prepare_ahead``), shutdown stops it; start and finish have nothing to
    do; ``update_weights`` switches this rank to the named version (``switch``)."""

    init_info_cls = WeightdInitInfo
    update_info_cls = Target

    def init_transfer_engine(self, init_info: WeightdInitInfo) -> None:
        # Refused now, not at the first update. Each version the daemon makes ready is prepared
        # from here on, while the engine computes: update_weights gives no moment ahead.
        prepare_ahead(self.model)
        self._prepared_model = self.model

    def start_weight_update(self) -> None:
        mapped_model(self.model)

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        # Not the base class's: it synchronizes torch.accelerator, which a CPU-only torch with CUDA
        # support refuses; the remap synchronizes the device it maps on itself.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: Target) -> None:
        logger.info("weightd: %s", switch(self.model, update_info))

    def finish_weight_update(self) -> None:
        pass

    def shutdown(self) -> None:
        model = getattr(self, "_prepared_model", None)
        if model is not None:
            self._prepared_model = None
            stop_ahead(model)

    @staticmethod
    def trainer_send_weights(iterator: Iterator[Any], trainer_args: Dict[str, Any] | Any) -> Dict[str, Any]:
        """vLLM 0.26's trainer side (abstract there, so the class needs it to instantiate; 0.32
        has vllm_trainer.py instead): writes the (name, tensor) pairs as a new version of
        ``trainer_args["model"]`` (``WriteTarget``: ``socket_dir`` or ``sockets``, ``base``) and
        commits it. Names are the checkpoint's or the engine's (fused parameters are split into
        their checkpoint tensors, write_version.py). Returns the ``update_info`` every engine
        follows it with, between ``start_weight_update`` and ``finish_weight_update``; the
        iterator is read whole first."""
        return write_version(iterator, WriteTarget.of(trainer_args), rename=layout_namer(vllm.__version__))
