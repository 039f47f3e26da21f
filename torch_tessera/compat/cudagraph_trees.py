"""What the GPU timing tools do to reduce-overhead's cudagraph trees (``torch._inductor.cudagraph_trees``).

Checked on torch 2.11 (the GPU machine) and 2.13 (CPU CI: :func:`fresh_ro_replay` on a stand-in node). Each function
raises ``RuntimeError`` when the internals it reads have moved, never replays stale inputs.
"""

from __future__ import annotations

import torch


def ro_graph():
    """reduce-overhead's recorded graph (cudagraph trees internals: one root node for one compiled function)."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    nodes = [n for roots in manager.roots.values() for n in roots]
    if len(nodes) != 1:
        raise RuntimeError(f"{len(nodes)} cudagraph-tree roots, expected 1")
    return nodes[0].graph


def ro_node_and_inputs(ro, ids) -> tuple:
    """The cudagraph-trees node a call of ``ro`` replays and the inputs it was given (copied before the call clears
    them): what :func:`fresh_ro_replay` copies into the node's static input buffers."""
    from torch._inductor import cudagraph_trees

    seen: dict = {}
    orig = cudagraph_trees.CUDAGraphNode.run

    def spy(self, new_inputs):
        seen["node"], seen["inputs"] = self, list(new_inputs)
        return orig(self, new_inputs)

    cudagraph_trees.CUDAGraphNode.run = spy
    try:
        ro(ids)
    finally:
        cudagraph_trees.CUDAGraphNode.run = orig
    if "node" not in seen:
        raise RuntimeError("a call of reduce-overhead did not go through CUDAGraphNode.run (internals moved)")
    return seen["node"], seen["inputs"]


def fresh_ro_replay(node, inputs: list):
    """Replay of reduce-overhead's graph as its ``CUDAGraphNode.run`` does it, without output bookkeeping: this
    call's non-static inputs copied into the node's static input buffers, then the graph. Checked once here: after
    the copy, those buffers hold the inputs (replaying stale ones read freed pool memory as token ids)."""
    node._copy_inputs_and_remove_from_src(node.reconstructed_inputs, list(inputs))
    idx = [i for i in node.non_static_input_idx if isinstance(inputs[i], torch.Tensor)]
    if not all(torch.equal(node.reconstructed_inputs[i], inputs[i]) for i in idx):
        raise RuntimeError("reduce-overhead's static input buffers do not hold the copied inputs; not replaying")

    def replay():
        node._copy_inputs_and_remove_from_src(node.reconstructed_inputs, list(inputs))
        node.graph.replay()

    return replay, len(idx)
