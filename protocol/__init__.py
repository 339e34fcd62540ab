"""The shared floor: the canonical request (SamplingParams with its PoolingParams and AdapterRef), the answers
(RequestOutput: the engine's deltas, carried to the ingress as they are; FinishReason), what a worker says of itself
(ModelInfo, TokenizerInfo), the typed control operations and the compact codec. It imports nothing of ours; the
engine, the workers, the rulebook and the ingress import it (vLLM's sampling_params.py / outputs.py, SGLang's
io_struct.py)."""

from protocol.carriers import GenerateRequest, error_chunk, until_finished
from protocol.control import WeightUpdate, WeightUpdateResult
from protocol.images import ImageData, expand_runs
from protocol.info import ChatPrompt, ModelInfo, TokenizerInfo, WorkerStats
from protocol.outputs import DEFAULT_WEIGHT_VERSION, FinishReason, FinishType, RequestOutput, merge_outputs
from protocol.sampling import AdapterRef, PoolingParams, SamplingParams

__all__ = [
    "DEFAULT_WEIGHT_VERSION", "AdapterRef", "ChatPrompt", "FinishReason", "FinishType", "GenerateRequest",
    "ImageData", "ModelInfo", "PoolingParams", "RequestOutput", "SamplingParams", "TokenizerInfo", "WeightUpdate",
    "WeightUpdateResult", "WorkerStats", "error_chunk", "expand_runs", "merge_outputs", "until_finished",
]
