"""Hand-built StepStats for the trace tests: known intervals, known answers."""

from tensorflow.core.framework import step_stats_pb2

BASE = 1_700_000_000_000_000  # all_start_micros of the step's first op
LOCAL = "/job:localhost/replica:0/task:0/device:"


def step_stats(lanes):
    """{lane name: [(node_name, op_type or None, start, duration)]} -> StepStats.

    start is relative to BASE; op_type None leaves timeline_label empty (as on
    GPU stream lanes, whose node names carry ':Type').
    """
    stats = step_stats_pb2.StepStats()
    for lane, ops in lanes.items():
        device = stats.dev_stats.add(device=lane)
        for name, op_type, start, duration in ops:
            node = device.node_stats.add(node_name=name, all_start_micros=BASE + start,
                                         all_end_rel_micros=duration)
            if op_type is not None:
                node.timeline_label = f"{name} = {op_type}(x)"
    return stats


def two_tower_cpu_step():
    """Towers 0 and 1 on CPU:0 and CPU:1, unattributable ops on CPU:2.

    Times (relative to BASE):
      CPU:0  split_global_batch [0,10) input; tower_0 forward [10,50) and
             backward [50,90) compute; the exchange hub [90,100); the
             optimizer's apply [120,130)
      CPU:1  tower_1's cross-tower packing [20,25) exchange; forward
             [30,70) and backward [70,110) compute
      CPU:2  IteratorGetNext [0,5) input; losses/loss [110,115) other;
             _SOURCE at 0 for no time
    """
    return step_stats({
        LOCAL + "CPU:0": [
            ("split_global_batch/split", "Split", 0, 10),
            ("tower_0/conv1/Conv2D", "Conv2D", 10, 40),
            ("tower_0/gradients/tower_0/conv1/Conv2D_grad/Conv2DBackpropFilter",
             "Conv2DBackpropFilter", 50, 40),
            ("cross_tower_exchange/bn1/gather", "ConcatV2", 90, 10),
            ("GradientDescent/update_conv1/weights/ResourceApplyGradientDescent",
             "ResourceApplyGradientDescent", 120, 10),
        ],
        LOCAL + "CPU:1": [
            ("tower_1/bn1/sync_batch_norm/bn1_cross_tower_gather_unordered/strided_slice",
             "StridedSlice", 20, 5),
            ("tower_1/conv1/Conv2D", "Conv2D", 30, 40),
            ("tower_1/gradients/tower_1/conv1/Conv2D_grad/Conv2DBackpropFilter",
             "Conv2DBackpropFilter", 70, 40),
        ],
        LOCAL + "CPU:2": [
            ("IteratorGetNext", "IteratorGetNext", 0, 5),
            ("losses/loss", "AddN", 110, 5),
            ("_SOURCE", "NoOp", 0, 0),
        ],
    })


def gpu_step():
    """Two GPUs as a GPU tracer records them: each kernel and copy on two lanes.

    GPU:0 has 'stream:all', per-stream lanes, 'memcpy' and a per-stream copy
    lane; its executor lane holds the Conv2D's launch [0,5) (it has a
    kernel) and a Shape [5,6) (no kernel). GPU:1 has per-stream lanes only,
    named with the full task prefix. A '/host:CPU' lane repeats an op.
    Kernels: tower_0 Conv2D [10,40), Relu [40,50); the copy [2,8);
    tower_1 Conv2D [12,42), Relu [42,52); on CPU:0 IteratorGetNext [0,2).
    """
    conv0, relu0 = "tower_0/conv/Conv2D", "tower_0/relu/Relu"
    conv1, relu1 = "tower_1/conv/Conv2D", "tower_1/relu/Relu"
    copy = ("edge_7_IteratorGetNext", None, 2, 6)
    stats = step_stats({
        LOCAL + "GPU:0": [(conv0, "Conv2D", 0, 5), ("tower_0/shape/Shape", "Shape", 5, 1)],
        "/device:GPU:0/stream:all": [(conv0 + ":Conv2D", None, 10, 30),
                                     (relu0 + ":Relu", None, 40, 10)],
        "/device:GPU:0/stream:7": [(conv0 + ":Conv2D", None, 10, 30)],
        "/device:GPU:0/stream:8": [(relu0 + ":Relu", None, 40, 10)],
        "/device:GPU:0/memcpy": [copy],
        "/device:GPU:0/stream:9<MemcpyH2D>": [copy],
        LOCAL + "GPU:1": [(conv1, "Conv2D", 0, 4)],
        LOCAL + "GPU:1/stream:3": [(conv1 + ":Conv2D", None, 12, 30)],
        "/device:GPU:1/stream:4": [(relu1 + ":Relu", None, 42, 10)],
        LOCAL + "CPU:0": [("IteratorGetNext", "IteratorGetNext", 0, 2)],
        "/host:CPU": [(conv0, "Conv2D", 0, 5)],
    })
    for lane in stats.dev_stats:
        if lane.device.endswith("memcpy") or "<Memcpy" in lane.device:
            lane.node_stats[0].timeline_label = "MemcpyH2D 1024 bytes"
    return stats
