"""The parity suite: NumPy oracle vs PyTorch vs TensorFlow on identical weights."""
