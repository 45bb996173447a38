"""ImageNet-style training from TFRecord shards read by index (towerlib.TFRecords).

records.py: the layout tf_cnn_benchmarks reads, generated shards, decoding and a
stateless random crop and flip; resnet.py: ResNet-50 (v1.5) and its smaller kin;
train.py: the script. docs/imagenet.md walks through it.
"""

# First, before TensorFlow loads: the CIFAR-10 package's quieting of TensorFlow's
# start-up lines (examples/cifar10/quiet_tensorflow.py) serves this example too.
import examples.cifar10  # noqa: E402, F401
