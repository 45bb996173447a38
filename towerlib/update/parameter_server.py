"""One copy of every variable; the towers' gradients summed where it lives.

    update = towerlib.ParameterServer()                # variables on the host CPU
    update = towerlib.ParameterServer(device="gpu")    # spread over the tower GPUs
    train = towerlib.build_train_graph(model, batch, optimizer, update=update)

Every tower reads every variable and sends its gradient to the variable's
device, where the towers' gradients are summed (towerlib.update.aggregation)
and applied once. `device` is 'cpu' (all variables on the towers' host CPU),
'gpu' (spread over the tower GPUs by byte size, in creation order) or a device
function (e.g. a cluster's ps placer).
"""

import dataclasses
import inspect
from typing import Any, Callable, Union

from towerlib.update import aggregation
from towerlib.update.base import CombinedGradients, UpdateChoice, VariableUpdate

# Where ParameterServer(device=...) may put the variables, besides a device function.
PARAM_DEVICES = ("cpu", "gpu")

__all__ = ["ParameterServer", "ParameterServerUpdate"]


@dataclasses.dataclass(frozen=True)
class ParameterServer(UpdateChoice):
    """Variables in one place; gradients summed there, applied once.

    Attributes:
      device: 'cpu', 'gpu', or a device function taking an op.
    """

    device: Union[str, Callable[[Any], str]] = "cpu"
    name = "parameter_server"

    def __post_init__(self):
        if callable(self.device):
            _check_device_function(self.device)
            return
        if not isinstance(self.device, str) or self.device.lower() not in PARAM_DEVICES:
            raise ValueError(
                f"ParameterServer(device={self.device!r}) is not a placement. Fix: use "
                "'cpu' (variables on the host CPU), 'gpu' (spread over the tower GPUs by "
                "size) or a device function.")
        object.__setattr__(self, "device", self.device.lower())

    @property
    def exchanges_gradients(self):
        return False

    def build(self, num_towers, reducer):
        del num_towers, reducer  # the gradients meet on the variables' devices
        return ParameterServerUpdate(self.device)


def _check_device_function(device):
    """A device function takes one argument, the op (tf.compat.v1.device's contract)."""
    try:
        inspect.signature(device).bind(None)
    except TypeError:
        raise TypeError(
            f"ParameterServer(device={device!r}) does not take one argument: a device "
            "function is called with each op and returns its device. Fix: e.g. "
            "device=lambda op: '/cpu:0', or device='cpu'.") from None
    except ValueError:
        pass  # no signature to read (a builtin): TensorFlow will call it


class ParameterServerUpdate(VariableUpdate):
    """The parameter server's hooks for one build (towerlib.update.base)."""

    name = "parameter_server"

    def __init__(self, param_device):
        self.param_device = param_device

    def tower_variables(self, var_list, tower_index):
        del tower_index
        return var_list

    def combine(self, tower_grads_and_vars, riders=None):
        if riders is not None:  # the sums stay on one machine: no exchange to ride
            raise ValueError("ParameterServer.combine takes no riders.")
        return CombinedGradients([aggregation.aggregate_gradients(tower_grads_and_vars)])

    def apply(self, optimizer, pairs, global_step):
        return optimizer.apply_gradients(pairs, global_step=global_step)
