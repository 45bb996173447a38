"""A tf_keras model as the tower function: the Keras front end, above the step it builds on.

    tower = towerlib.KerasTower(model_fn, loss="sparse_categorical_crossentropy")
    train = towerlib.build_train_graph(tower, (images, labels), optimizer, num_towers=4)

The package, one job per module:

  tower.py      KerasTower: a tf_keras model as the tower function
  model_checks.py  what KerasTower refuses of a model: Keras 3, another precision, all frozen
  objective.py  its loss and metrics per tower, as model.compile forms them
  weights.py    its weights as towerlib's variables: routed, copied, frozen
  export.py     its checkpoint as a SavedModel or Keras' weights file

Keras' batch-norm layers are routed to towerlib's batch norm by
towerlib.batchnorm.keras_layers, below the step: every tower enters that router, a
tower of your own that calls a Keras model included, so it cannot live here.
"""
