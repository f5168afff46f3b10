"""The Transformer in PyTorch. Imports torch and `shared`, never TensorFlow or Keras."""
