"""vLLM 0.32's trainer-side engine of the weight-transfer backend ``weightd``: the trainer's
``WeightSource`` becomes a new version of the model through the daemon (write_version.py), and
``send_weights`` then has every engine follow it in place (start, update, finish through the
``client``). The plugin registers it with ``WeightTransferTrainerFactory`` (vllm_plugin.py); a
trainer process that builds no engine runs the plugins first (``vllm.plugins.load_general_plugins()``)
or calls this class's ``trainer_init`` itself. vLLM 0.26 has another trainer interface: the static
``WeightdWeightTransferEngine.trainer_send_weights`` (vllm_transfer.py) is its trainer side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Optional

import vllm
from vllm.distributed.weight_transfer.base import TrainerInitInfo, TrainerWeightTransferEngine, VLLMWeightSyncClient, WeightSource

from .vllm_rules import layout_namer
from .write_version import WriteTarget, write_version


@dataclass
class WeightdTrainerInitInfo(TrainerInitInfo):
    """``WriteTarget``'s fields (``model``, ``socket_dir`` or ``sockets``, ``base``), and vLLM's
    keyword-only ``rank`` (rank 0 writes; the others only iterate the source with it)."""

    backend: ClassVar[str] = "weightd"
    model: str
    socket_dir: Optional[str] = None
    sockets: Optional[List[str]] = None
    base: Optional[int] = None


class WeightdTrainerWeightTransferEngine(TrainerWeightTransferEngine[WeightdTrainerInitInfo]):
    """``WeightTransferTrainerFactory.trainer_init(WeightdTrainerInitInfo(model=..., rank=r),
    client=..., source=ModuleSource(model))``, then ``send_weights()`` each round."""

    init_info_cls = WeightdTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource, target: WriteTarget, is_sender: bool = True) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.target = target

    @classmethod
    def trainer_init(cls, init_info: WeightdTrainerInitInfo, *, client: VLLMWeightSyncClient, source: Optional[WeightSource] = None) -> "WeightdTrainerWeightTransferEngine":
        if source is None:
            raise ValueError("the weightd trainer engine writes the trainer's weights from a WeightSource (vllm ModuleSource(model), say); pass source=")
        target = WriteTarget(init_info.model, init_info.socket_dir, init_info.sockets, init_info.base)
        engine = cls(client=client, source=source, target=target, is_sender=init_info.is_sender)
        if engine.is_sender:
            engine.client.init_weight_transfer_engine({})  # the workers refuse now if their weights are not mapped
        return engine

    def send_weights(self) -> None:
        """Writes and commits the source's tensors as a new version (the engines serve the old
        one meanwhile), then switches every engine to it. Only the tensors the source yields are
        copied; the rest of the model is shared with the version written over. Names are the
        checkpoint's or the engine's (``named_parameters()`` of this vLLM: fused parameters are
        split into their checkpoint tensors, write_version.py)."""
        if not self.is_sender:
            for _ in self.source:  # the collectives of a sharded source (FSDP gathers) run on every rank
                pass
            return
        metadata = [(m.name, m.dtype, m.shape) for m in self.source.metadata()]
        info = write_version(self.source, self.target, metadata, rename=layout_namer(vllm.__version__))
        self.client.start_weight_update()
        self.client.update_weights(info)
        self.client.finish_weight_update()

