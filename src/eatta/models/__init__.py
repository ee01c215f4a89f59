"""Models to adapt: the digits-C source models shipped with the package and the paper's backbones.

- :mod:`eatta.models.digits_cnn`: the small BatchNorm CNN of the main job (weights shipped).
- :mod:`eatta.models.digits_vit`: a small LayerNorm vision transformer for digits-C (weights
  shipped).
- :mod:`eatta.models.backbones`: the paper's backbones with their input normalization, loaded
  from local weights.
"""
