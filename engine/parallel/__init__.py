"""Tensor and pipeline parallelism inside one worker: one model over N ranks (processes), each holding a shard of the
weights and of the KV cache (with pipeline stages, of its stage's layers only). Rank 0 runs the engine (scheduler,
block tables, prefix cache, hidden-state store) and drives the other ranks over the process group; no Ray here
(workers/ranks.py places the ranks on a Ray cluster).

    group.py     the process group (gloo on CPU, NCCL on CUDA) and the bytes its collectives moved
    shard.py     which families and shapes split over N, and the split itself (column / row parallel)
    vocab.py     the LM head's vocabulary split: exact distributed log-softmax, target logits, top-k, gather
    pipeline.py  the layers cut into stages, and the stage-to-stage hops of a step's hidden states
    messages.py  what rank 0 broadcasts each step
    driver.py    rank 0's side: sends each step's inputs, runs the vocab-parallel head
    follower.py  ranks 1..N-1: the loop that receives and runs them
    engine/loading/sharded.py  one rank's shard of the checkpoint on its device
    local.py     N ranks as processes on one machine, without Ray (tests, `python -m bench tp`)
"""
