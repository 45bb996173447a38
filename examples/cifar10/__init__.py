"""The bundled CIFAR-10 example: data, models, and the train/eval/export/main scripts."""
